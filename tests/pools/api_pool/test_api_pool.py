"""API pool workers: call validation (no SSRF), the runtime on a real HTTP API and Redis, real
worker processes, and the traffic-control comparison against trajectories calling the API."""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tangram_bench import api as bench
from tangram_bench.ratelimited import RateLimitedService, ServiceLimits
from tangram_celery import keys
from tangram_celery.action import Action, ActionLimits, ActionResult, parse_action
from tangram_celery.client import TangramClient
from tangram_celery.errors import ConfigError, ValidationError
from tangram_celery.managers.basic import ApiGate, QuotaStore, parse_api_limits
from tangram_celery.pools.api_pool import (
    ApiCall,
    ApiPool,
    api_action,
    call_url,
    default_window,
    parse_calls,
    spawn_api_worker,
    wait_for_worker,
    worker_name,
)
from tangram_celery.processes import stop_process
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import make_app

SPECS = parse_api_limits("search=url:http://search.test/v1,concurrency:2;"
                         "judge=url:https://judge.test,rate:5/1s")
LIMITS = ActionLimits(apis=frozenset(SPECS))


def action(payload: dict[str, object], cost: dict[str, object] | None = None) -> Action:
    return parse_action({"trajectory_id": "t", "kind": "api", "payload": payload,
                         "cost": cost or {"api:search": 1}}, LIMITS)


# ----------------------------------------------------------------------------- calls (pure)


def test_one_call_defaults() -> None:
    (call,) = parse_calls(action({"path": "/find", "params": {"q": "a b", "n": 3,
                                                               "x": [True, "y"]}}))
    assert call == ApiCall("search", "GET", "/find",
                           (("q", "a b"), ("n", "3"), ("x", "true"), ("x", "y")))
    assert call_url(SPECS["search"], call) == "http://search.test/v1/find?q=a+b&n=3&x=true&x=y"


def test_several_calls_over_several_apis() -> None:
    both = {"api:search": 1, "api:judge": 1}
    calls = parse_calls(action({"calls": [
        {"api": "search", "path": "/s"},
        {"api": "judge", "method": "POST", "path": "/score", "json": {"t": 1},
         "headers": {"X-Trace": "7"}},
    ]}, both))
    assert [c.api for c in calls] == ["search", "judge"]
    assert calls[1].body == b'{"t":1}'
    assert calls[1].headers == (("X-Trace", "7"), ("Content-Type", "application/json"))
    assert call_url(SPECS["judge"], calls[1]) == "https://judge.test/score"


BAD_CALLS = [
    ("absolute URL", {"path": "http://evil.test/x"}, "payload.path"),
    ("scheme-relative URL", {"path": "//evil.test/x"}, "payload.path"),
    ("relative path", {"path": "find"}, "payload.path"),
    ("dot-dot", {"path": "/v1/../admin"}, "payload.path"),
    ("encoded dot-dot", {"path": "/%2e%2e/admin"}, "payload.path"),
    ("encoded backslash", {"path": "/a%5c..%5cb"}, "payload.path"),
    ("query in path", {"path": "/a?b=1"}, "payload.path"),
    ("fragment", {"path": "/a#b"}, "payload.path"),
    ("userinfo trick", {"path": "@evil.test/x"}, "payload.path"),
    ("whitespace", {"path": "/a b"}, "payload.path"),
    ("missing path", {"method": "GET"}, "payload.path"),
    ("bad method", {"path": "/", "method": "CONNECT"}, "payload.method"),
    ("Host header", {"path": "/", "headers": {"Host": "evil.test"}}, "payload.headers.Host"),
    ("header injection", {"path": "/", "headers": {"X-A": "1\r\nHost: e"}},
     "payload.headers.X-A"),
    ("unknown field", {"path": "/", "url": "http://evil.test"}, "payload.url"),
    ("API not in cost", {"api": "judge", "path": "/"}, "payload.api"),
    ("nested param", {"path": "/", "params": {"q": {"a": 1}}}, "payload.params.q"),
    ("empty calls", {"calls": []}, "payload.calls"),
    ("calls and a call", {"calls": [{"path": "/"}], "path": "/"}, "payload"),
]


@pytest.mark.parametrize(("name", "payload", "where"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_are_refused(name: str, payload: dict[str, object], where: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_calls(action(payload))
    assert info.value.field == where


def test_several_apis_need_an_explicit_api() -> None:
    with pytest.raises(ValidationError, match=r"payload\.api"):
        parse_calls(action({"path": "/"}, {"api:search": 1, "api:judge": 1}))


def test_call_url_never_leaves_the_base() -> None:
    spec = SPECS["search"]
    with pytest.raises(ValidationError, match="leaves"):
        call_url(spec, ApiCall("search", path="@evil.test/"))
    assert call_url(spec, ApiCall("search", path="/")) == "http://search.test/v1/"


def test_api_action_builder_and_window() -> None:
    built = api_action("t", "search", "/s", params={"q": "x"}, timeout_s=5)
    assert built.kind == "api" and built.apis() == ("search",) and built.timeout_s == 5
    assert parse_calls(built)[0].params == (("q", "x"),)
    assert default_window(SPECS["search"]) == 6 and default_window(SPECS["judge"]) == 16
    slow = parse_api_limits("slow=url:http://s,rate:6/1h,burst:3")["slow"]
    assert default_window(slow) == 3, "at most about a minute of quota is held"


# ----------------------------------------------------------------------------- runtime in-process


@pytest.fixture()
def service() -> Iterator[RateLimitedService]:
    with RateLimitedService(ServiceLimits(rate_per_s=1000, burst=1000, concurrency=8,
                                          lifetime_s=60)) as running:
        yield running


def runtime(settings: Settings, redis_client: redis.Redis, url: str,
            extra: str = "") -> ApiPool:
    limits = f"svc=url:{url},concurrency:2;{extra}"
    live = settings.with_(api_limits=limits)
    return ApiPool(live, "svc", ApiGate(QuotaStore(redis_client, parse_api_limits(limits))))


def svc_action(path: str = "/search", **params: object) -> dict[str, object]:
    return api_action("traj", "svc", path, params=params or None, timeout_s=2).to_json()


def test_runtime_calls_the_api_and_stamps_act(settings: Settings, redis_client: redis.Redis,
                                              service: RateLimitedService) -> None:
    pool = runtime(settings, redis_client, service.url + "/", "other=url:http://o,rate:1")
    try:
        result = ActionResult.from_json(pool.execute(svc_action(q="tangram"), time.time()))
    finally:
        pool.stop()
    assert result.ok, result.error
    response = result.output["responses"][0]
    assert response["status_code"] == 200 and response["json"]["query"] == {"q": "tangram"}
    t = result.timings
    assert t.received <= t.admitted <= t.exec_started <= t.exec_finished <= t.stored
    assert 0 < t.exec_s <= t.exec_finished - t.exec_started + 1e-3
    assert redis_client.zcard(keys.api_leases("svc")) == 0, "slot given back"


def test_runtime_results_for_errors(settings: Settings, redis_client: redis.Redis,
                                    service: RateLimitedService) -> None:
    pool = runtime(settings, redis_client, service.url)
    try:
        error = ActionResult.from_json(pool.execute(svc_action(status=503), time.time()))
        slow = ActionResult.from_json(pool.execute(svc_action(delay=5), time.time()))
        bad = pool.execute({**svc_action(), "payload": {"path": "//evil.test/"}}, time.time())
        cpu = pool.execute({"trajectory_id": "t", "kind": "exec", "payload": {"cmd": "ls"}},
                           time.time())
    finally:
        pool.stop()
    assert error.status == "failed" and "HTTP 503" in error.error
    assert error.output["status_code"] == 503
    assert slow.status == "timeout" and slow.act["exec"] < 4
    assert bad["status"] == "rejected" and "payload.path" in bad["error"]
    assert cpu["status"] == "rejected" and "do not run on API pools" in cpu["error"]
    assert redis_client.zcard(keys.api_leases("svc")) == 0


def test_an_undeclared_api_is_a_config_error(settings: Settings,
                                             redis_client: redis.Redis) -> None:
    store = QuotaStore(redis_client, SPECS)
    with pytest.raises(ConfigError, match="not declared in TANGRAM_API_LIMITS"):
        ApiPool(settings, "maps", ApiGate(store))


# ----------------------------------------------------------------------------- real workers


@dataclass
class Cluster:
    settings: Settings
    service: RateLimitedService


@pytest.fixture(scope="module")
def cluster(redis_url: str) -> Iterator[Cluster]:
    """A rate-limited API and real worker processes: two for ``search``, one for ``judge``."""
    limits = ServiceLimits(rate_per_s=40, burst=40, concurrency=16, base_s=0.005, work_s=0.005,
                           lifetime_s=240)
    with RateLimitedService(limits) as service, RateLimitedService(limits) as judge, \
            tempfile.TemporaryDirectory(prefix="tangram-api-") as logs:
        declared = (f"search=url:{service.url},concurrency:3,rate:40/1s;"
                    f"judge=url:{judge.url}/judge,concurrency:1")
        settings = Settings.from_env({}, redis_url=redis_url, api_limits=declared)
        env = {"TANGRAM_REDIS_URL": redis_url, "TANGRAM_API_LIMITS": declared}
        started = [(api, spawn_api_worker(env, api, log_path=Path(logs) / f"{api}-{k}.log"))
                   for k, api in enumerate(["search", "search", "judge"])]
        app = make_app(settings)
        try:
            for api, process in started:
                wait_for_worker(app, worker_name(api, process.pid), process)
            yield Cluster(settings, service)
        finally:
            for _, process in started:
                stop_process(process)
            for log in sorted(Path(logs).glob("*.log")):
                text = log.read_text(errors="replace")
                if "Traceback" in text:
                    print(f"--- {log.name} ---\n{text[-4000:]}")


@pytest.mark.slow
def test_a_burst_through_real_workers_meets_every_limit(cluster: Cluster) -> None:
    before = cluster.service.stats()
    actions = [api_action(f"t{k % 5}", "search", "/search", params={"q": str(k)})
               for k in range(60)]
    with TangramClient(cluster.settings) as client:
        results = client.run_batch(actions, timeout=60)
    after = cluster.service.stats()
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert after.rejected == before.rejected, "no 429 ever reaches the API"
    assert after.max_in_flight <= 3
    assert len({r.node for r in results}) == 2, "both search workers served"
    for result in results:
        act = result.act
        assert act["queue"] + act["exec"] + act["overhead"] == pytest.approx(act["total"])
        assert act["exec"] > 0
    starts = sorted(r.timings.exec_started for r in results)
    assert starts[-1] - starts[0] >= (60 - 39) / 40 - 0.05, "the quota paced the burst"


@pytest.mark.slow
def test_an_action_on_two_apis_holds_both(cluster: Cluster) -> None:
    body = {
        "trajectory_id": "multi", "kind": "api", "cost": {"api:search": 1, "api:judge": 1},
        "payload": {"calls": [{"api": "search", "path": "/search", "params": {"q": "x"}},
                              {"api": "judge", "method": "POST", "path": "/score",
                               "json": {"answer": "x"}}]},
    }
    with TangramClient(cluster.settings) as client:
        handles = [client.submit(body) for _ in range(3)]
        results = [h.result(30) for h in handles]
    for result in results:
        assert result.ok, result.error
        assert result.node.startswith("api-judge-"), "routed to the first API's pool"
        paths = [r["json"]["path"] for r in result.output["responses"]]
        assert paths == ["/search", "/judge/score"]
    spans = sorted((r.timings.exec_started, r.timings.exec_finished) for r in results)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 1e-3, "judge's concurrency 1 held over the whole action"


@pytest.mark.slow
def test_bad_messages_are_answered_and_workers_survive(cluster: Cluster) -> None:
    with TangramClient(cluster.settings) as client:
        evil = api_action("t", "search", "/search").to_json()
        evil["payload"] = {"path": "//169.254.169.254/latest/meta-data"}
        stored = client.submit(evil).result(30)
        raw = client.app.send_task(keys.task_name("api"), args=[{"kind": "api"}],
                                   queue=keys.api_queue("search"), task_id="raw-bad-api")
        assert raw.get(timeout=30)["status"] == "rejected"
        after = client.submit(api_action("t", "search", "/search")).result(30)
    assert stored.status == "rejected" and "payload.path" in stored.error
    assert after.ok


# ----------------------------------------------------------------------------- traffic control


@pytest.mark.slow
def test_traffic_control_against_trajectories_calling_the_api(settings: Settings) -> None:
    """The benchmark's workload, two steps: waves of 40 calls against 20 calls/s."""
    workload = bench.Workload(steps=2)
    direct, tangram, fcfs = bench.run(settings, workload, ServiceLimits(lifetime_s=120),
                                      concurrency=4, workers=1)
    assert direct.http_429 > 0, "uncontrolled, the workload overruns the API"
    for controlled in (tangram, fcfs):
        assert controlled.http_429 == 0 and controlled.failed == 0
        assert len(controlled.acts) == len(direct.acts) == 80
        assert controlled.max_in_flight <= 4
        assert controlled.average_act_s < direct.average_act_s, (direct.summary(),
                                                                 controlled.summary())
