"""Every language the gateway serves, through a real gateway and CPU node in the bubblewrap
sandbox: a program that reads stdin and writes stdout, a runtime error, and a compile error
where the language has a compile step. The toolchains come from Debian (scripts/run.sh)."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
from conftest import StartGateway, run_code

from tangram_celery.gateway.languages import LANGUAGES

pytestmark = pytest.mark.slow

PROGRAMS: dict[str, tuple[str, str, str | None]] = {
    "python": ('print("hello", input())', "1 / 0", None),
    "bash": ("read x; echo hello $x", "exit 3", None),
    "cpp": ('#include <iostream>\n#include <string>\n#include <openssl/sha.h>\n'
            'int main() { std::string s; std::cin >> s; unsigned char d[20];\n'
            'SHA1((const unsigned char*)"", 0, d);\n'
            'std::cout << "hello " << s << std::endl; }\n',
            "int main() { return 3; }", "int main() { return x; }"),
    "c": ('#include <stdio.h>\nint main(void) { char s[64]; scanf("%63s", s); '
          'printf("hello %s\\n", s); return 0; }\n',
          "int main(void) { return 3; }", "int main(void) { return x; }"),
    "java": ("import java.util.*;\npublic class Main { public static void main(String[] a) "
             '{ System.out.println("hello " + new Scanner(System.in).next()); } }\n',
             "public class Main { public static void main(String[] a) "
             '{ throw new RuntimeException("boom"); } }\n',
             "public class Main { int x = y; }\n"),
    "go": ('package main\nimport "fmt"\nfunc main() { var s string; fmt.Scan(&s); '
           'fmt.Println("hello", s) }\n',
           'package main\nimport "os"\nfunc main() { os.Exit(3) }\n',
           "package main\nfunc main() { x }\n"),
    "nodejs": ("const s = require('fs').readFileSync(0, 'utf8').trim();\n"
               "console.log('hello ' + s);\n", "throw new Error('boom');", None),
    "typescript": ("const s: string = require('fs').readFileSync(0, 'utf8').trim();\n"
                   "console.log('hello ' + s);\n", "throw new Error('boom');",
                   "const x: number = 'text';\n"),
    "rust": ('use std::io::*;\nfn main() { let mut s = String::new(); '
             'stdin().read_line(&mut s).unwrap(); println!("hello {}", s.trim()); }\n',
             "fn main() { std::process::exit(3); }", 'fn main() { let x: i32 = "s"; }'),
    "ruby": ('puts "hello #{gets.strip}"', 'raise "boom"', None),
    "php": ('$s = trim(fgets(STDIN)); echo "hello $s\\n";', "exit(3);", None),
    "lua": ('print("hello " .. io.read())', 'error("boom")', None),
    "perl": ('my $s = <STDIN>; chomp $s; print "hello $s\\n";', 'die "boom"', None),
    "R": ('s <- readLines(file("stdin"), n = 1)\ncat(paste0("hello ", s), "\\n", sep = "")',
          'stop("boom")', None),
    "sql": ("SELECT 'hello ' || 'world';", "SELECT * FROM missing;", None),
}


def test_the_table_covers_every_language_served() -> None:
    assert set(PROGRAMS) | {"pytest"} == set(LANGUAGES)


def test_every_language_reads_stdin_fails_at_run_time_and_at_compile_time(
        gateway: StartGateway) -> None:
    url = gateway()
    requests: list[tuple[str, str, dict[str, Any]]] = []
    for name, (good, crash, broken) in PROGRAMS.items():
        base = {"language": name, "compile_timeout": 120, "run_timeout": 60,
                "memory_limit_MB": 1024}
        stdin = "" if name == "sql" else "world\n"
        requests.append((name, "ok", {**base, "code": good, "stdin": stdin}))
        requests.append((name, "crash", {**base, "code": crash}))
        if broken is not None:
            requests.append((name, "broken", {**base, "code": broken}))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda r: run_code(url, **r[2]), requests))
    problems = []
    for (name, case, _), answer in zip(requests, answers, strict=True):
        compiled = LANGUAGES[name].compile is not None
        ran = answer["run_result"] or {}
        built = answer["compile_result"] or {}
        if case == "ok":
            good = answer["status"] == "Success" and ran.get("stdout", "").strip() == \
                "hello world"
        elif case == "crash":
            good = answer["status"] == "Failed" and ran.get("return_code") not in (0, None)
        else:
            good = answer["status"] == "Failed" and not ran \
                and built.get("return_code") not in (0, None)
        if compiled and case != "broken":
            good = good and built.get("return_code") == 0
        if not good:
            problems.append(f"{name} {case}: {answer['status']} compile={built} run={ran}")
    assert not problems, "\n".join(problems)


def test_pytest_runs_tests_and_reports_failures(gateway: StartGateway) -> None:
    url = gateway()
    passing = run_code(url, code="def test_a():\n    assert input is not None\n",
                       language="pytest")
    assert passing["status"] == "Success" and "1 passed" in passing["run_result"]["stdout"]
    failing = run_code(url, code="def test_a():\n    assert 0\n", language="pytest")
    assert failing["status"] == "Failed" and "1 failed" in failing["run_result"]["stdout"]
