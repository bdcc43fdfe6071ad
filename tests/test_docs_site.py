"""The documentation: ``docs/`` builds as an mkdocs site in strict mode (a broken link or anchor
fails the build), no Markdown file links outside the repository, and the README stays short."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_BYTES = 8192
PAGES = ("index.html", "architecture/index.html", "operations/index.html",
         "benchmarks/index.html", "results/index.html", "settings/index.html",
         "gateway/index.html", "hosts/index.html", "integration/index.html",
         "traces/index.html", "layout/index.html", "malleable/index.html", "dashboard.png")
_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+[\"'(][^)]*)?\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
_AUTOLINK = re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]*)>")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        cwd=config.parent, capture_output=True, text=True, timeout=120, check=False)


def link_targets(text: str) -> list[str]:
    """Every link and image target of a Markdown text (inline, reference definitions and
    autolinks), outside code blocks and code spans."""
    prose = _CODE_SPAN.sub("", _FENCE.sub("", text))
    found = [*_INLINE.findall(prose), *_REFERENCE.findall(prose), *_AUTOLINK.findall(prose)]
    return [t[1:-1] if t.startswith("<") and t.endswith(">") else t for t in found]


def link_problems(source: Path, root: Path) -> list[str]:
    """What is wrong with the links of the Markdown file ``source``: a target with a scheme
    (``https:``, ``mailto:``) or ``//``, an absolute path, one that leaves ``root``, or one that
    does not exist. A target that is only an anchor (``#part``) is fine."""
    base = source.parent
    problems = []
    for target in link_targets(source.read_text()):
        if target.startswith("#"):
            continue
        where = f"{source.relative_to(root).as_posix()}: {target}"
        if _SCHEME.match(target) or target.startswith("//"):
            problems.append(f"{where}: links outside the repository (cite it as plain text)")
            continue
        if target.startswith("/"):
            problems.append(f"{where}: an absolute path, not a relative link")
            continue
        path = unquote(target.split("#", 1)[0].split("?", 1)[0])
        resolved = (base / path).resolve()
        if not resolved.is_relative_to(root.resolve()):
            problems.append(f"{where}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{where}: no such file")
    return problems


def markdown_files() -> list[Path]:
    """The repository's Markdown files: tracked, and new ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted({ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()})


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = mkdocs_build(ROOT / "mkdocs.yml", site)
    assert done.returncode == 0, done.stdout + done.stderr
    missing = [page for page in PAGES if not (site / page).is_file()]
    assert missing == []
    assert list((site / "bench").glob("*.png")), "the benchmark plots are in the site"
    assert not (site / "bench" / "coding-sim-batch").exists(), "sections are not pages"
    assert 'href="../settings/"' in (site / "architecture" / "index.html").read_text()


@pytest.mark.parametrize("broken", ["[gone](no-such-page.md)",
                                    "[gone](hosts.md#no-such-heading)"])
def test_a_broken_link_fails_the_strict_build(tmp_path: Path, broken: str) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "operations.md"
    page.write_text(page.read_text() + f"\n{broken}\n")
    done = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert broken.split("(")[1].rstrip(")") in done.stdout + done.stderr


def test_the_link_checker_flags_links_that_leave_the_repository(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs" / "bench").mkdir(parents=True)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "DESIGN.md").write_text("# outside\n")
    (root / "docs" / "a.md").write_text("# a\n")
    (root / "docs" / "bench" / "plot.png").write_bytes(b"png")
    (root / "README.md").write_text(
        "[design](../shared/DESIGN.md) [web](https://example.com) [gone](docs/missing.md)\n"
        "[ok](docs/a.md) [here](#part) [there](docs/a.md#part) ![img](<docs/a.md>)\n"
        "[ref]: //example.org/x\n\n`[code](https://in-a-code-span.example)`\n\n"
        "```\n[block](https://in-a-fence.example)\n```\n\n<http://auto.example>\n"
        "[abs](/etc/passwd) [mail](mailto:x@example.com)\n")
    (root / "docs" / "bench" / "s.md").write_text(
        "![p](plot.png) [top](../../README.md) [up](../../../README.md) ![q](bench/plot.png)\n")
    problems = link_problems(root / "README.md", root)
    assert problems == [
        "README.md: ../shared/DESIGN.md: outside the repository",
        "README.md: https://example.com: links outside the repository (cite it as plain text)",
        "README.md: docs/missing.md: no such file",
        "README.md: /etc/passwd: an absolute path, not a relative link",
        "README.md: mailto:x@example.com: links outside the repository (cite it as plain text)",
        "README.md: //example.org/x: links outside the repository (cite it as plain text)",
        "README.md: http://auto.example: links outside the repository (cite it as plain text)",
    ]
    assert link_problems(root / "docs" / "bench" / "s.md", root) == [
        "docs/bench/s.md: ../../../README.md: outside the repository",
        "docs/bench/s.md: bench/plot.png: no such file"]


def test_no_markdown_file_links_outside_the_repository() -> None:
    files = markdown_files()
    assert ROOT / "README.md" in files and ROOT / "docs" / "index.md" in files
    assert [p for source in files for p in link_problems(source, ROOT)] == []


def test_the_readme_is_short() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes: move detail into docs/"
