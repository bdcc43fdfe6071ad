"""No measured figure is typed by hand into the README or ``docs/*.md``: every number with a
unit (``1.5x``, ``12 ms``, ``3.2 s``, ``40%``) lies in a page or block a named command writes,
or is an input, not a measurement (a setting's default, a test's parameter, a third party's
documented limit), listed below with why. A measured figure belongs in a section that a
``tangram bench ... --out docs`` command writes, linked from the prose."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERATED_PAGES = {
    "docs/results.md": "python -m tangram_bench.report (from docs/bench/*.md)",
    "docs/settings.md": "the command tests/test_settings_doc.py names",
}
"""Pages written whole by a command: exempt."""
GENERATED_BLOCKS = (("<!-- results:begin -->", "<!-- results:end -->"),)
"""Blocks a command writes inside a hand-written page (README's results block:
``python -m tangram_bench.report``): exempt."""
FIGURE = re.compile(
    r"(?<![\w.+-])\d+(?:[.,]\d+)*(?:-\d+(?:[.,]\d+)*)?\s?"
    r"(?:x|ms|µs|us|s|min|%|GB/s|GB|MB|req/s|/s)(?![\w/])")
"""A number with a unit (a range such as ``1.1-2.3x`` counts once)."""
CODE = re.compile(r"`[^`]*`")

INPUTS: tuple[tuple[str, str, str], ...] = (
    ("docs/gateway.md", "(900 s) without a request", "TANGRAM_GATEWAY_TRAJECTORY_IDLE_S's default"),
    ("docs/gateway.md", "compile + run + 10 s", "verl's client time-out, its own setting"),
    ("docs/gateway.md", "about 10 s and about 1 GB, with a 10 s run",
     "verl's test's program and time-out, as its test file sets them"),
    ("docs/gateway.md", "time-out and verl's 30 s client time-out", "verl's test's setting"),
    ("docs/gateway.md", "100 need about 500 s of the node's 2 cores",
     "arithmetic on verl's test's inputs (100 x 10 s over 2 cores)"),
    ("docs/hosts.md", "A +0.2 s, B +0.35 s, C -0.3 s", "the test's injected clock skews"),
    ("docs/hosts.md", "D +0.25 s", "the test's injected clock skew"),
    ("docs/hosts.md", "with 3 x 256 MB reserved", "the test's reservations"),
    ("docs/hosts.md", "(4 s here)", "the test's setting of TANGRAM_STRANDED_AFTER_S"),
    ("docs/hosts.md", "(600 s by default)", "a setting's default"),
    ("docs/hosts.md", "a worker 0.4 s ahead", "the plain-data test's injected skew"),
    ("docs/hosts.md", "a worker 0.35 s ahead", "the system test's injected skew (host B)"),
    ("docs/operations.md", "(1000 ms)", "a setting's default"),
    ("docs/operations.md", ", 30 s) only when", "TANGRAM_REDIS_RETRY_S's default"),
    ("docs/operations.md", "uses a TTL of 20 s", "the failover test's parameter"),
    ("docs/operations.md", "refreshes itself every 2 s", "the dashboard page's refresh period"),
)
"""(page, the words around the figure, why it is an input): each a figure that is not a
measurement. A new entry needs a reason a reviewer accepts."""


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of ``text`` outside generated blocks and fenced code, with inline
    code removed."""
    lines, inside, fenced = [], False, False
    for number, line in enumerate(text.splitlines(), 1):
        if any(line.strip() == begin for begin, _ in GENERATED_BLOCKS):
            inside = True
        elif any(line.strip() == end for _, end in GENERATED_BLOCKS):
            inside = False
        elif line.lstrip().startswith("```"):
            fenced = not fenced
        elif not inside and not fenced and not line.startswith("    "):
            lines.append((number, CODE.sub("``", line)))
    return lines


def typed_figures(page: str, text: str,
                  inputs: tuple[tuple[str, str, str], ...] = INPUTS) -> list[str]:
    """``page:line: figure`` for every number with a unit in ``text``'s prose that no entry of
    ``inputs`` for ``page`` covers."""
    allowed = [words for where, words, _ in inputs if where == page]
    found = []
    for number, line in prose(text):
        for match in FIGURE.finditer(line):
            if not any(match[0] in words and words in line for words in allowed):
                found.append(f"{page}:{number}: {match[0]!r} in {line.strip()[:120]!r}")
    return found


def pages() -> list[str]:
    """README.md and docs/*.md, less the generated pages."""
    names = ["README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]
    return [name for name in names if name not in GENERATED_PAGES]


def test_no_measured_figure_is_typed_into_the_docs() -> None:
    found = [hit for page in pages() for hit in typed_figures(page, (ROOT / page).read_text())]
    assert found == [], (
        "figures typed by hand (have a `tangram bench ... --out docs` command write them into "
        "a section and link it, or, for an input that is not a measurement, add it to INPUTS "
        "with why):\n" + "\n".join(found))


def test_every_allowed_input_is_still_in_its_page() -> None:
    stale = [(page, words) for page, words, _ in INPUTS
             if words not in (ROOT / page).read_text()]
    assert stale == []


def test_the_check_fails_on_a_typed_figure() -> None:
    page = "docs/benchmarks.md"
    text = (ROOT / page).read_text()
    assert typed_figures(page, text) == []
    for typed in ("batching at 1.1-2.3x the throughput", "a step of 3.46 s", "p90 8,580 ms",
                  "about 20% slower", "22 req/s"):
        assert typed_figures(page, text + f"\nMeasured: {typed}.\n"), typed


def test_generated_pages_blocks_and_code_are_exempt() -> None:
    block = "\n".join(["intro", GENERATED_BLOCKS[0][0], "| 0.94x |", GENERATED_BLOCKS[0][1]])
    assert typed_figures("README.md", block) == []
    assert typed_figures("README.md", "```\nsleep 30s\n```\nrun `--timeout 5s` once") == []
    assert typed_figures("README.md", "outside: 0.94x") != []
    assert typed_figures("README.md", "k8s and 3 steps and v1.2") == []
    assert set(GENERATED_PAGES) <= {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
