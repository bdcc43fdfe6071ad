"""The languages the gateway runs: where each one's source goes and how it is compiled and run.

Pure table and lookups. The commands follow SandboxFusion's runners (``python FILE``,
``pytest FILE``, ``/bin/bash FILE``, ``g++ -std=c++17 FILE -o test`` then ``./test``, ...). A
language is offered when its tools are present (:func:`available`, given the set of tools
found), or when ``TANGRAM_GATEWAY_LANGUAGES`` names it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tangram_celery.errors import ConfigError

JVM = ("-Xmx$((TANGRAM_MEMORY_MB/2))m -Xss8m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 "
       "-XX:ReservedCodeCacheSize=48m -XX:CompressedClassSpaceSize=64m -Xshare:auto")
"""The JVM's memory sized from the action's own limit (its reservations otherwise exceed the
address-space limit of a sandboxed process)."""
SANDBOX_FUSION_LANGUAGES = frozenset({
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript",
    "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest",
    "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket",
})
"""Every language SandboxFusion's ``/run_code`` names; another name is a bad request there."""


@dataclass(frozen=True)
class Language:
    """One language: its tools, its source file name and its commands.

    ``source`` and the commands hold ``{src}`` (the source file) where needed; ``compile`` is
    None for interpreted languages. ``elastic`` languages run as test runs over a range of
    cores (``pytest`` gets ``-n k``). ``env`` is what its toolchain needs in the sandbox
    (caches in ``/tmp``); ``prelude`` starts the source when the code lacks it."""

    name: str
    tools: tuple[str, ...]
    source: str
    run: str
    compile: str | None = None
    elastic: bool = False
    env: tuple[tuple[str, str], ...] = ()
    prelude: str = ""
    extra: tuple[tuple[str, str], ...] = ()
    """Files the toolchain needs beside the source (path, text)."""

    def source_name(self, action_id: str) -> str:
        """The source file's name in the work dir for one request."""
        return self.source.format(id=action_id)

    def source_text(self, code: str) -> str:
        """The source file's text: the code, after the prelude when it lacks it."""
        if self.prelude and self.prelude not in code:
            return f"{self.prelude}\n{code}"
        return code


NODE_GLOBALS = ("declare var require: any; declare var process: any; declare var module: any;\n"
                "declare var Buffer: any; declare var __dirname: string;\n")
"""Node's globals for the type checker (Debian packages no ``@types/node``)."""
GO_ENV = (("GOCACHE", "/tmp/go-cache"), ("GOPATH", "/tmp/go"), ("GO111MODULE", "off"),  # nosec B108 # the sandbox's private tmpfs
          ("GOTOOLCHAIN", "local"), ("CGO_ENABLED", "0"))
LANGUAGES: dict[str, Language] = {lang.name: lang for lang in (
    Language("python", ("python3",), ".tangram-{id}.py", "python3 {src}"),
    Language("pytest", ("python3",), "test_tangram_{id}.py",
             "python3 -m pytest -q -p no:cacheprovider {src}", elastic=True),
    Language("bash", ("bash",), ".tangram-{id}.sh", "/bin/bash {src}"),
    Language("cpp", ("g++",), ".tangram-{id}.cpp", "./test",
             compile="g++ -std=c++17 {src} -o test -lssl -lcrypto -lpthread"),
    Language("c", ("gcc",), ".tangram-{id}.c", "./test",
             compile="gcc -std=gnu17 -O2 {src} -o test -lm -lpthread"),
    Language("java", ("javac", "java"), "Main.java", f"java {JVM} -cp . -ea Main",
             compile=f"javac -J{JVM.replace(' ', ' -J')} -cp . {{src}}"),
    Language("go", ("go",), "tangram_{id}.go", "./out", compile="go build -o out {src}",
             env=GO_ENV),
    Language("nodejs", ("node",), ".tangram-{id}.js", "node {src}"),
    Language("typescript", ("tsc", "node"), "main.ts", "node main.js",
             compile="tsc --target es2020 --module commonjs --lib es2020,dom "
                     "--skipLibCheck main.ts tangram-node.d.ts",
             extra=(("tangram-node.d.ts", NODE_GLOBALS),)),
    Language("rust", ("rustc",), "tangram_{id}.rs", "./test",
             compile="rustc -O --edition 2021 {src} -o test"),
    Language("ruby", ("ruby",), ".tangram-{id}.rb", "ruby {src}"),
    Language("php", ("php",), ".tangram-{id}.php", "php -f {src}", prelude="<?php"),
    Language("lua", ("lua5.4",), ".tangram-{id}.lua", "lua5.4 {src}"),
    Language("perl", ("perl",), ".tangram-{id}.pl", "perl {src}"),
    Language("R", ("Rscript",), ".tangram-{id}.R", "Rscript {src}"),
    Language("sql", ("sqlite3",), ".tangram-{id}.sql",
             "sqlite3 -batch -bail -init {src} :memory:"),
)}
"""Every language the gateway knows how to run; which of them it offers depends on the tools."""


def available(tools_found: Callable[[str], bool], wanted: Iterable[str] = ()) -> tuple[str, ...]:
    """The languages offered: those named in ``wanted`` (each must be known), else every known
    language whose tools ``tools_found`` reports present. Raises :class:`ConfigError` for an
    unknown name."""
    names = tuple(wanted)
    unknown = sorted(set(names) - set(LANGUAGES))
    if unknown:
        raise ConfigError(f"TANGRAM_GATEWAY_LANGUAGES: unknown language(s) {', '.join(unknown)}; "
                          f"known: {', '.join(LANGUAGES)}")
    if names:
        return names
    return tuple(n for n, lang in LANGUAGES.items() if all(tools_found(t) for t in lang.tools))


def on_path(tool: str) -> bool:
    """Whether ``tool`` is on this host's ``PATH`` (the sandbox binds the host's ``/usr``)."""
    return shutil.which(tool) is not None


def unsupported(language: str, offered: Iterable[str]) -> str:
    """The message of a request in a language the gateway does not run."""
    return (f"language {language[:40]!r} is not supported by this tangram gateway; supported: "
            f"{', '.join(offered)} (SandboxFusion's other languages need their toolchains on the "
            "CPU nodes: install them, or name them in TANGRAM_GATEWAY_LANGUAGES)")
