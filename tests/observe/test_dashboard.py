"""``tangram dashboard``: the view as plain data, the auth rules, and the server over HTTP on a
real Redis (the browser test is in test_dashboard_chromium.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
import redis

from tangram_celery.cli import main
from tangram_celery.credentials import basic_authorization
from tangram_celery.errors import ConfigError
from tangram_celery.observe.dashboard import ViewConfig, act_rows, dashboard_view, timeline
from tangram_celery.observe.dashboard_server import DashboardConfig, dashboard, resolve_auth
from tangram_celery.pools.inventory import GpuPoolView, Inventory, QueueDepth, Resident
from tangram_celery.pools.registry import NodeView
from tangram_celery.settings import Settings
from tangram_celery.tasks import actlog
from tangram_celery.tasks.actlog import ActRecord

NOW = 1000.0


def record(kind: str, total: float, at: float, status: str = "ok", pool: str = "cpu",
           action: str = "a") -> ActRecord:
    return ActRecord(kind, pool, "tangram.cpu.n", "n", status, total / 2, total / 4, total / 4,
                     total, at, action)


def test_act_rows_group_by_kind_and_pool_with_mean_parts() -> None:
    rows = act_rows([record("exec", 1.0, 990), record("exec", 3.0, 991, "error"),
                     record("test_run", 8.0, 992), record("exec", 2.0, 993, pool="gpu/x")])
    assert [(r["kind"], r["pool"], r["count"], r["errors"]) for r in rows] == [
        ("exec", "cpu", 2, 1), ("exec", "gpu/x", 1, 0), ("test_run", "cpu", 1, 0)]
    assert rows[0]["total_s"] == 2.0 and rows[0]["queue_s"] == 1.0
    assert rows[0]["exec_s"] == rows[0]["overhead_s"] == 0.5


@pytest.mark.parametrize("at,bucket", [(400.0, 0), (429.9, 0), (430.0, 1), (999.0, 19),
                                       (399.0, None), (1001.0, None)])
def test_timeline_buckets_by_finish_time(at: float, bucket: int | None) -> None:
    buckets = timeline([record("exec", 1.0, at)], NOW, ViewConfig(window_s=600, buckets=20))
    assert len(buckets) == 20 and buckets[0]["start"] == 400.0
    assert [i for i, b in enumerate(buckets) if b["count"]] == ([] if bucket is None
                                                                else [bucket])


def test_view_lists_the_slowest_and_skips_old_records() -> None:
    records = [record("exec", t, NOW - 5, action=f"a{t:g}") for t in (1.0, 5.0, 3.0)]
    records.append(record("exec", 99.0, NOW - 700, action="old"))
    view = dashboard_view(records, None, NOW, ViewConfig(window_s=600, slowest=2))
    assert view["actions"] == 3 and not view["redis_up"]
    assert [s["action_id"] for s in view["slowest"]] == ["a5", "a3"]
    assert view["queues"] == view["pools"] == view["residents"] == []
    json.dumps(view)


def test_view_shows_units_in_use_and_resident_models() -> None:
    inventory = Inventory(
        NOW, (NodeView("n", 4, 1, 8192, 0, True),),
        (GpuPoolView("default", 4, 2, True, "w", ("rm",), (Resident("rm", (0, 1)),)),), (),
        (QueueDepth("tangram.cpu.n", "cpu", ((0, 3),), 2),))
    view = dashboard_view([], inventory, NOW)
    pools = {p["pool"]: p for p in view["pools"]}
    assert (pools["cpu"]["in_use"], pools["cpu"]["units"]) == (3, 4)
    assert (pools["gpu/default"]["in_use"], pools["gpu/default"]["units"]) == (2, 4)
    assert view["residents"] == [{"pool": "gpu/default", "model": "rm", "gpus": [0, 1]}]
    assert view["queues"] == [{"queue": "tangram.cpu.n", "pool": "cpu", "ready": 3,
                               "unacked": 2}]


@pytest.mark.parametrize("config,error", [
    (DashboardConfig(address="0.0.0.0", unauthenticated=True), "without authentication"),
    (DashboardConfig(address="10.1.2.3", unauthenticated=True), "without authentication"),
    (DashboardConfig(user="a:b"), "TANGRAM_DASHBOARD_USER"),
    (DashboardConfig(user=""), "TANGRAM_DASHBOARD_USER"),
])
def test_auth_rules_refuse(config: DashboardConfig, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        resolve_auth(config)


def test_auth_rules_generate_a_password_or_keep_the_given_one() -> None:
    assert resolve_auth(DashboardConfig(address="0.0.0.0"), lambda: "tok") == (
        DashboardConfig(address="0.0.0.0", password="tok"), True)
    given = DashboardConfig(address="0.0.0.0", password="pw")
    assert resolve_auth(given) == (given, False)
    loopback = DashboardConfig(unauthenticated=True)
    assert resolve_auth(loopback) == (loopback, False)


def fetch(url: str, header: str | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Authorization": header} if header else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # nosec B310 # loopback URL
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_server_requires_basic_auth_and_serves_the_batch_json(
    settings: Settings, redis_client: redis.Redis
) -> None:
    result: dict[str, Any] = {"action_id": "x1", "kind": "exec", "status": "ok",
                              "act": {"queue": 0.5, "exec": 1.0, "overhead": 0.1,
                                      "total": 1.6}, "timings": {"stored": 0.0}}
    with dashboard(settings, DashboardConfig(port=0, password="pw")) as server:
        result["timings"]["stored"] = server.clock()
        actlog.append(redis_client, actlog.act_record(result, "tangram.cpu.n"))
        url = server.config.url
        good = basic_authorization("tangram", "pw")
        assert fetch(url)[0] == 401
        assert fetch(url, basic_authorization("tangram", "wrong"))[0] == 401
        assert 'Basic realm="tangram dashboard"' in fetch(url)[1]["WWW-Authenticate"]
        assert fetch(url + "healthz")[0] == 200
        status, headers, page = fetch(url, good)
        assert status == 200 and b"api/dashboard" in page
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        assert b"<script src" not in page and b"<link" not in page, "nothing from elsewhere"
        status, _, body = fetch(url + "api/dashboard", good)
        assert fetch(url + "nothing", good)[0] == 404
    view = json.loads(body)
    assert status == 200 and view["redis_up"] and view["actions"] == 1
    assert view["slowest"][0]["action_id"] == "x1"
    assert view["act"][0]["total_s"] == pytest.approx(1.6)


def test_server_reports_redis_down(settings: Settings) -> None:
    dead = settings.with_(redis_url="redis://127.0.0.1:1/0")
    with dashboard(dead, DashboardConfig(port=0, unauthenticated=True)) as server:
        status, _, body = fetch(server.config.url + "api/dashboard")
    assert status == 200 and json.loads(body)["redis_up"] is False


def test_cli_refuses_an_open_dashboard_off_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", "--no-auth", "--address", "0.0.0.0", "--port", "0"]) == 2
    assert "refusing to serve the dashboard without authentication" in capsys.readouterr().err
