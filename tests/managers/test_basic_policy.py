"""Basic manager policy as plain-data tables, and the Lua script checked against it case by case."""

from __future__ import annotations

import re
import uuid

import pytest
import redis

from tangram_celery.action import Action, ActionLimits, parse_action
from tangram_celery.errors import ConfigError, ValidationError
from tangram_celery.managers.basic import (
    ApiSpec,
    ApiState,
    Decision,
    Need,
    Quota,
    QuotaStore,
    decide,
    needs_of,
    parse_api_limits,
    parse_duration,
    pause_for,
    refill,
)
from tangram_celery.managers.basic.policy import LEASES, LOST, ORDER, TOKENS
from tangram_celery.pools.conversion import api_names
from tangram_celery.scheduling.ordering import trajectory_order_key

# ----------------------------------------------------------------------------- declarations

PARSED = [
    ("rate and concurrency", "search=url:http://127.0.0.1:8080,concurrency:4,rate:10/1s",
     ApiSpec("search", "http://127.0.0.1:8080", 4, Quota(10, 1.0, 10))),
    ("rate per minute with burst and lease",
     " judge = url:https://j.example/v1/ , rate:600/1m , burst:20 , lease:3s ",
     ApiSpec("judge", "https://j.example/v1", None, Quota(600, 60.0, 20), 3.0)),
    ("concurrency only", "pdf=url:http://pdf.local,concurrency:3",
     ApiSpec("pdf", "http://pdf.local", 3)),
    ("rate without period means per second", "x=url:http://h,rate:5",
     ApiSpec("x", "http://h", None, Quota(5, 1.0, 5))),
    ("milliseconds", "x=url:http://h,rate:1/250ms", ApiSpec("x", "http://h", None,
                                                            Quota(1, 0.25, 1))),
]


@pytest.mark.parametrize(("name", "text", "expected"), PARSED, ids=[c[0] for c in PARSED])
def test_parse_api_limits(name: str, text: str, expected: ApiSpec) -> None:
    assert parse_api_limits(text) == {expected.name: expected}


def test_several_apis_and_node_api_names() -> None:
    text = "b=url:http://b,concurrency:1; a=url:http://a,rate:2/1s;;"
    assert list(parse_api_limits(text)) == ["b", "a"]
    assert api_names(text) == ["b", "a"]
    assert api_names("") == []


BAD = [
    ("no limit at all", "x=url:http://h", "concurrency:N, rate:N/PERIOD or both"),
    ("no url", "x=concurrency:1", "url:<base URL> is required"),
    ("bad scheme", "x=url:ftp://h,concurrency:1", "http(s)://"),
    ("credentials", "x=url:http://u:p@h,concurrency:1", "credentials"),
    ("query in base", "x=url:http://h/?k=1,concurrency:1", "no query"),
    ("bad port", "x=url:http://h:99999,concurrency:1", "bad port"),
    ("zero concurrency", "x=url:http://h,concurrency:0", "at least 1"),
    ("bad rate", "x=url:http://h,rate:ten/1s", "whole number"),
    ("bad period", "x=url:http://h,rate:10/1day", "duration"),
    ("zero period", "x=url:http://h,rate:10/0s", "longer than zero"),
    ("burst without rate", "x=url:http://h,concurrency:1,burst:3", "burst needs a rate"),
    ("unknown field", "x=url:http://h,concurrency:1,color:red", "bad or repeated field"),
    ("repeated field", "x=url:http://h,concurrency:1,concurrency:2", "bad or repeated field"),
    ("bad name", "X Y=url:http://h,concurrency:1", "name=field:value"),
    ("no equals", "url:http://h", "name=field:value"),
    ("declared twice", "x=url:http://h,concurrency:1;x=url:http://h,rate:1", "declared twice"),
]


@pytest.mark.parametrize(("name", "text", "message"), BAD, ids=[c[0] for c in BAD])
def test_bad_api_limits(name: str, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="TANGRAM_API_LIMITS") as info:
        parse_api_limits(text)
    assert message in str(info.value)


@pytest.mark.parametrize(("raw", "seconds"), [("1s", 1.0), ("250ms", 0.25), ("2m", 120.0),
                                              ("1h", 3600.0), ("1.5", 1.5)])
def test_parse_duration(raw: str, seconds: float) -> None:
    assert parse_duration(raw) == seconds


def test_bucket_keeps_one_token_of_headroom() -> None:
    assert Quota(10, 1.0, 10).capacity == 9
    assert Quota(1, 1.0, 1).capacity == 1
    assert Quota(600, 60.0, 20).rate_per_s == 10.0


# ----------------------------------------------------------------------------- needs

SPECS = parse_api_limits(
    "a=url:http://a.test,concurrency:2,rate:4/1s,burst:5;"
    "b=url:http://b.test,rate:2/1s,burst:3;"
    "c=url:http://c.test,concurrency:1"
)
LIMITS = ActionLimits(apis=frozenset(SPECS) | {"undeclared"})


def api_action(cost: dict[str, object]) -> Action:
    return parse_action({"trajectory_id": "t", "kind": "api", "payload": {"path": "/"},
                         "cost": cost}, LIMITS)


def test_needs_are_sorted_and_zero_amounts_dropped() -> None:
    action = api_action({"api:c": 1, "api:a": 2, "api:b": 0})
    assert needs_of(action, SPECS) == (Need("a", 2), Need("c", 1))


@pytest.mark.parametrize(("cost", "message"), [
    ({"api:undeclared": 1}, "not declared"),
    ({"api:a": 3}, "can ever grant at once (2)"),
    ({"api:b": 3}, "can ever grant at once (2)"),
    ({"api:c": 2}, "can ever grant at once (1)"),
])
def test_impossible_needs_are_refused(cost: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        needs_of(api_action(cost), SPECS)


# ----------------------------------------------------------------------------- decide

A, B, C = Need("a", 1), Need("b", 1), Need("c", 1)
NOW = 1000.0
LIVE = NOW + 5
GONE = NOW - 1


def head(*others: str) -> tuple[tuple[str, float], ...]:
    """Ticket ``me`` first, then ``others``, all live."""
    return (("me", LIVE), *((o, LIVE) for o in others))


DECIDE = [
    ("fresh API grants", (A,), {"a": ApiState(tickets=head())}, Decision(True)),
    ("an older live ticket goes first", (A,),
     {"a": ApiState(tickets=(("older", LIVE), ("me", LIVE)))}, Decision(False, ORDER, "a")),
    ("an expired older ticket is skipped", (A,),
     {"a": ApiState(tickets=(("dead", GONE), ("me", LIVE)))}, Decision(True)),
    ("a missing ticket is lost", (A,), {"a": ApiState(tickets=(("other", LIVE),))},
     Decision(False, LOST, "a")),
    ("an expired own ticket is lost", (A,), {"a": ApiState(tickets=(("me", GONE),))},
     Decision(False, LOST, "a")),
    ("empty bucket waits for one token", (A,),
     {"a": ApiState(tokens=0.0, refilled_at=NOW, tickets=head())},
     Decision(False, TOKENS, "a", 0.25)),
    ("bucket refills with time", (A,),
     {"a": ApiState(tokens=0.0, refilled_at=NOW - 0.5, tickets=head())}, Decision(True)),
    ("refill stops at capacity", (Need("a", 2),),
     {"a": ApiState(tokens=3.5, refilled_at=NOW - 100, tickets=head())}, Decision(True)),
    ("amount above level waits for the shortfall", (Need("a", 2),),
     {"a": ApiState(tokens=1.0, refilled_at=NOW, tickets=head())},
     Decision(False, TOKENS, "a", 0.25)),
    ("concurrency cap reached", (A,),
     {"a": ApiState(leases=(LIVE, LIVE), tickets=head())}, Decision(False, LEASES, "a")),
    ("expired leases are reclaimed", (A,),
     {"a": ApiState(leases=(GONE, GONE), tickets=head())}, Decision(True)),
    ("amount counts against the cap", (Need("a", 2),),
     {"a": ApiState(leases=(LIVE,), tickets=head())}, Decision(False, LEASES, "a")),
    ("all or nothing: second API blocks", (A, B),
     {"a": ApiState(tickets=head()), "b": ApiState(tokens=0.5, refilled_at=NOW, tickets=head())},
     Decision(False, TOKENS, "b", 0.25)),
    ("first blocker named, longest token wait kept", (A, B),
     {"a": ApiState(tickets=(("older", LIVE), ("me", LIVE))),
      "b": ApiState(tokens=0.0, refilled_at=NOW, tickets=head())},
     Decision(False, ORDER, "a", 0.5)),
    ("concurrency-only API", (A, C),
     {"a": ApiState(tickets=head()), "c": ApiState(leases=(LIVE,), tickets=head())},
     Decision(False, LEASES, "c")),
    ("both free", (A, C),
     {"a": ApiState(tickets=head("x")), "c": ApiState(leases=(GONE,), tickets=head("y"))},
     Decision(True)),
]


@pytest.mark.parametrize(("name", "needs", "states", "expected"), DECIDE,
                         ids=[c[0] for c in DECIDE])
def test_decide(name: str, needs: tuple[Need, ...], states: dict[str, ApiState],
                expected: Decision) -> None:
    assert _close(decide("me", needs, SPECS, states, NOW), expected)


@pytest.mark.parametrize(("name", "needs", "states", "expected"), DECIDE,
                         ids=[c[0] for c in DECIDE])
def test_lua_script_agrees_with_decide(name: str, needs: tuple[Need, ...],
                                       states: dict[str, ApiState], expected: Decision,
                                       redis_client: redis.Redis) -> None:
    store = QuotaStore(redis_client, SPECS)
    for api, state in states.items():
        store.load(api, state)
    before = {api: store.state(api) for api in states}
    got = store.try_acquire("me", needs, now=NOW)
    assert _close(got, expected), got
    for need in needs:
        after = store.state(need.api)
        spec = SPECS[need.api]
        if got.granted:
            assert "me" not in dict(after.tickets), "a granted ticket leaves the queue"
            if spec.quota is not None:
                level = refill(before[need.api].tokens, before[need.api].refilled_at, NOW,
                               spec.quota)
                assert after.tokens == pytest.approx(level - need.amount)
            if spec.concurrency is not None:
                live = [e for e in after.leases if e > NOW]
                assert live.count(NOW + spec.lease_s) == need.amount
        else:
            assert after.tokens == before[need.api].tokens, "nothing taken on refusal"


def _close(got: Decision, expected: Decision) -> bool:
    return (got.granted, got.reason, got.api) == (expected.granted, expected.reason,
                                                  expected.api) \
        and got.wait_s == pytest.approx(expected.wait_s, abs=1e-6)


@pytest.mark.parametrize(("decision", "pause"), [
    (Decision(True), 0.0),
    (Decision(False, LOST, "a"), 0.0),
    (Decision(False, TOKENS, "a", 0.04), 0.04),
    (Decision(False, TOKENS, "a", 5.0), 0.25),
    (Decision(False, TOKENS, "a", 0.0), 0.0005),
    (Decision(False, ORDER, "a"), 0.005),
    (Decision(False, ORDER, "a", 0.1), 0.1),
    (Decision(False, LEASES, "a"), 0.005),
])
def test_pause_for(decision: Decision, pause: float) -> None:
    assert pause_for(decision, poll_s=0.005, max_pause_s=0.25) == pytest.approx(pause)


# ----------------------------------------------------------------------------- order

REGISTER = [
    # (case, bypass_s, [(ticket, trajectory, now)], the order expected in API "a")
    ("an older trajectory's later call goes first", 60.0,
     [("old-1", "old", 100.0), ("new-1", "new", 105.0), ("old-2", "old", 106.0)],
     ["old-1", "old-2", "new-1"]),
    ("past the bypass bound a call ranks by arrival", 60.0,
     [("old-1", "old", 100.0), ("new-1", "new", 105.0), ("old-2", "old", 170.0)],
     ["old-1", "new-1", "old-2"]),
    ("bypass 0 is FCFS by arrival", 0.0,
     [("old-1", "old", 100.0), ("new-1", "new", 105.0), ("old-2", "old", 106.0)],
     ["old-1", "new-1", "old-2"]),
    ("calls without a trajectory are FCFS", 60.0,
     [("x", None, 100.0), ("y", None, 105.0), ("z", None, 106.0)], ["x", "y", "z"]),
]


@pytest.mark.parametrize(("case", "bypass", "calls", "order"), REGISTER,
                         ids=[c[0] for c in REGISTER])
def test_lua_register_agrees_with_trajectory_order_key(
        case: str, bypass: float, calls: list[tuple[str, str | None, float]], order: list[str],
        redis_client: redis.Redis) -> None:
    store = QuotaStore(redis_client, SPECS, bypass_s=bypass)
    suffix = uuid.uuid4().hex[:8]
    first: dict[str, float] = {}
    for ticket, trajectory, now in calls:
        traj = None if trajectory is None else f"{trajectory}-{suffix}"
        score = store.register(ticket, (Need("a", 1), Need("b", 1)), now=now, trajectory=traj)
        seen = first.setdefault(traj or ticket, now)
        assert score == pytest.approx(trajectory_order_key(seen, now, bypass), abs=1e-6)
    for api in ("a", "b"):
        assert [t for t, _ in store.state(api).tickets] == order, "the same order in every API"


def test_a_negative_bypass_is_a_config_error(redis_client: redis.Redis) -> None:
    with pytest.raises(ConfigError, match="TANGRAM_API_BYPASS_S"):
        QuotaStore(redis_client, SPECS, bypass_s=-1.0)
