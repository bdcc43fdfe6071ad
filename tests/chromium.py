"""Headless Chromium (Debian's ``chromium``, from scripts/run.sh's packages) for page tests: the
DOM after the page's scripts ran, and a PNG screenshot, each from a fresh empty profile with
everything that would reach the network turned off."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--hide-scrollbars", "--mute-audio")
"""``--no-sandbox``: the tests run as root, where Chromium's own sandbox refuses to start."""


def chromium_path() -> str | None:
    """The Chromium binary, if installed."""
    return CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium")


def _run(url: str, extra: list[str], budget_ms: int, timeout: float) -> str:
    binary = chromium_path()
    assert binary, "chromium is not installed: run scripts/run.sh setup (DEBIAN_PACKAGES)"
    with tempfile.TemporaryDirectory(prefix="tangram-chromium-") as profile:
        argv = [binary, *FLAGS, f"--user-data-dir={profile}",
                f"--virtual-time-budget={budget_ms}", *extra, url]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False)
    assert done.returncode == 0, f"chromium exited {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout


def dump_dom(url: str, budget_ms: int = 4000, timeout: float = 90.0) -> str:
    """The serialized DOM once ``budget_ms`` of virtual time passed (scripts and fetches ran)."""
    return _run(url, ["--dump-dom"], budget_ms, timeout)


def screenshot(url: str, path: Path, size: tuple[int, int] = (1280, 900),
               budget_ms: int = 4000, timeout: float = 90.0) -> Path:
    """A PNG of the page at ``size`` once ``budget_ms`` of virtual time passed."""
    _run(url, [f"--screenshot={path}", f"--window-size={size[0]},{size[1]}"], budget_ms,
         timeout)
    assert path.is_file() and path.stat().st_size > 0, "chromium wrote no screenshot"
    return path
