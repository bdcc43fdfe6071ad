"""The dashboard in a real browser: a real batch (code actions and elastic test runs on a real
CPU node worker, reward actions on a real GPU pool worker over the session's tritonserver, with
simulated GPU ids) is run, then headless Chromium opens the page with basic-auth credentials in
the URL. The DOM after the page's script ran must show that batch's numbers, and the screenshot
must hold the drawn bars, not an empty frame.

``UPDATE_DASHBOARD_SCREENSHOT=1`` also copies the screenshot to docs/dashboard.png."""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from chromium import dump_dom, screenshot
from PIL import Image

from tangram_celery.action import Action
from tangram_celery.client import TangramClient, code_action, test_run_action
from tangram_celery.observe.dashboard import ViewConfig
from tangram_celery.observe.dashboard_server import DashboardConfig, DashboardServer, dashboard
from tangram_celery.pools.gpu_pool import reward_action, worker_name
from tangram_celery.pools.launch import spawn_gpu_worker, wait_for_worker
from tangram_celery.processes import stop_process
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import make_app

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DOCS_PNG = ROOT / "docs" / "dashboard.png"
SIZE = (1280, 1000)
QUEUE_RGB, EXEC_RGB = (0x4C, 0x78, 0xA8), (0x54, 0xA2, 0x4B)
CpuWorkers = Callable[..., list[str]]


class Rows(HTMLParser):
    """The ``data-*`` attributes of every element with a class, and the text of ids."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str]] = []
        self.texts: dict[str, str] = {}
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if "class" in found:
            self.rows.append(found)
        self._open = found.get("id")

    def handle_data(self, data: str) -> None:
        if self._open:
            self.texts[self._open] = self.texts.get(self._open, "") + data

    def of(self, kind: str) -> list[dict[str, str]]:
        return [r for r in self.rows if r["class"] == kind]


@pytest.fixture()
def gpu_pool(settings: Settings, triton_server: Any, tmp_path: Path) -> Iterator[str]:
    """A real GPU pool worker (pool ``default``, 2 simulated GPUs) over the session's Triton."""
    env = {"TANGRAM_REDIS_URL": settings.broker.redis_url,
           "TANGRAM_TRITON_URL": triton_server.http_url,
           "TANGRAM_TRITON_REPOSITORY": str(ROOT / "triton_models")}
    process = spawn_gpu_worker(env, "default", 2, tmp_path / "gpu.log")
    try:
        wait_for_worker(make_app(settings), worker_name("default", process.pid), process)
        yield "default"
    finally:
        stop_process(process, timeout=30)


def batch() -> list[Action]:
    tests = "".join(f"def test_{i}():\n    assert {i} >= 0\n" for i in range(4))
    actions = []
    for t in range(3):
        actions += [code_action(f"dash-{t}", f"import time\ntime.sleep({0.1 * (t + c):.1f})\n"
                                             f"print({t} + {c})") for c in range(2)]
        actions.append(test_run_action(f"dash-{t}", "python3 -m pytest -q -p no:cacheprovider",
                                       cpu=(1, 2), files={"test_x.py": tests}))
    actions += [reward_action(f"dash-{t}", "answer_match", {"response": str(t),
                                                            "reference": "1"}) for t in range(3)]
    return actions


def wait_for_records(server: DashboardServer, count: int) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while (view := server.view())["actions"] < count:
        assert time.monotonic() < deadline, f"{view['actions']} of {count} ACT records"
        time.sleep(0.2)
    return view


def test_dashboard_shows_a_real_batch_in_chromium(
    settings: Settings, cpu_workers: CpuWorkers, gpu_pool: str, tmp_path: Path
) -> None:
    cpu_workers({"dash-node": 2})
    with TangramClient(settings) as client:
        results = [h.result(180) for h in client.submit_many(batch())]
        for t in range(3):
            client.end_trajectory(f"dash-{t}")
    assert all(r.ok for r in results), [(r.kind, r.status, r.error) for r in results]
    kinds = Counter(r.kind for r in results)
    password = secrets.token_urlsafe(12)
    config = DashboardConfig(port=0, password=password, view=ViewConfig(window_s=60.0))
    with dashboard(settings, config) as server:
        view = wait_for_records(server, len(results))
        url = f"http://tangram:{password}@127.0.0.1:{server.config.port}/"
        parsed = Rows()
        parsed.feed(dump_dom(url))
        png = screenshot(url, tmp_path / "dashboard.png", SIZE)
    assert parsed.texts.get("actions") == str(len(results)), parsed.texts
    shown = {(r["data-kind"], r["data-pool"]): int(r["data-count"]) for r in parsed.of("act-row")}
    assert shown == {("exec", "cpu"): kinds["exec"], ("test_run", "cpu"): kinds["test_run"],
                     ("reward", "gpu/default"): kinds["reward"]}
    for row in parsed.of("act-row"):
        execs = [r.act["exec"] for r in results if r.kind == row["data-kind"]]
        assert float(row["data-exec"]) == pytest.approx(sum(execs) / len(execs), abs=1e-3)
    ids = {r.action_id for r in results}
    slow = [r["data-action"] for r in parsed.of("slow-row")]
    assert slow and set(slow) <= ids and slow[0] == view["slowest"][0]["action_id"]
    pools = {r["data-pool"] for r in parsed.of("pool-row")}
    assert {"cpu", "gpu/default"} <= pools
    assert parsed.of("resident-row"), "answer_match stays resident on the GPU pool"
    check_not_blank(png)
    if os.environ.get("UPDATE_DASHBOARD_SCREENSHOT") == "1":
        shutil.copyfile(png, DOCS_PNG)


def check_not_blank(png: Path) -> None:
    image = Image.open(png).convert("RGB")
    assert image.size == SIZE
    pixels = SIZE[0] * SIZE[1]
    colors = Counter({rgb: n for n, rgb in image.getcolors(maxcolors=pixels) or ()})
    assert len(colors) > 50, "a flat frame"
    assert colors.most_common(1)[0][1] < 0.8 * pixels, "mostly one colour: nothing drawn"
    assert colors[QUEUE_RGB] > 200 and colors[EXEC_RGB] > 200, "the ACT bars are not drawn"
