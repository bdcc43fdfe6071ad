"""The routing decision as plain-data tables: placement, queues and what is refused."""

from __future__ import annotations

import pytest

from tangram_celery.action import Action, ActionLimits, parse_action
from tangram_celery.client.routing import (
    MemoryWait,
    Pin,
    Route,
    RoutingInputs,
    choose_node,
    memory_wait_error,
    place_now,
    queue_for,
    route,
    trajectory_memory_mb,
)
from tangram_celery.errors import NoCapacityError, RoutingError, ValidationError
from tangram_celery.managers.basic import parse_api_limits
from tangram_celery.pools.inventory import GpuPoolView
from tangram_celery.pools.registry import NodeView


def node(name: str, free: int, reserved: float, cores: int = 4, memory: float = 1000,
         alive: bool = True, trajectories: int = 0) -> NodeView:
    return NodeView(name, cores, free, memory, reserved, alive, trajectories)


CASES = [
    ("lowest memory load wins", [node("a", 4, 500), node("b", 4, 100)], 1, 100, "b"),
    ("free cores beat memory balance", [node("a", 0, 0), node("b", 2, 800)], 2, 100, "b"),
    ("not enough memory skipped", [node("a", 4, 950), node("b", 0, 500)], 1, 100, "b"),
    ("dead node skipped", [node("a", 4, 0, alive=False), node("b", 1, 900)], 1, 50, "b"),
    ("ties broken by name", [node("b", 4, 0), node("a", 4, 0)], 1, 10, "a"),
    ("balance is relative", [node("a", 4, 400, memory=1000), node("b", 4, 400, memory=4000)],
     1, 100, "b"),
    ("fewest trajectories per core beats a stale free-core count",
     [node("a", 4, 0, trajectories=6), node("b", 0, 0, trajectories=2)], 1, 10, "b"),
    ("trajectory load is per core",
     [node("a", 2, 0, cores=2, trajectories=2), node("b", 0, 0, cores=8, trajectories=4)], 1, 10,
     "b"),
    ("too many cores for a node", [node("a", 2, 0, cores=2), node("b", 0, 0, cores=8)], 4, 10,
     "b"),
]


@pytest.mark.parametrize(("name", "nodes", "cores", "memory", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_choose_node(name: str, nodes: list[NodeView], cores: int, memory: float,
                     expected: str) -> None:
    assert choose_node(nodes, cores, memory) == expected


@pytest.mark.parametrize("nodes", [[], [node("a", 4, 990)], [node("a", 4, 0, alive=False)]])
def test_no_capacity(nodes: list[NodeView]) -> None:
    with pytest.raises(NoCapacityError, match="tangram worker cpu"):
        choose_node(nodes, 1, 100)


def test_queues() -> None:
    cpu = parse_action({"trajectory_id": "t", "kind": "exec", "payload": {"cmd": "ls"}})
    assert queue_for(cpu, "n1") == "tangram.cpu.n1"
    with pytest.raises(RoutingError):
        queue_for(cpu, None)
    reward = parse_action({"trajectory_id": "t", "kind": "reward",
                           "payload": {"model": "m", "pool": "big"}, "cost": {"gpu": 1}})
    assert queue_for(reward, None) == "tangram.gpu.big"


def test_trajectory_memory() -> None:
    hint = parse_action({"trajectory_id": "t", "kind": "exec", "payload": {"cmd": "ls"},
                         "trajectory_memory_mb": 64})
    assert trajectory_memory_mb(hint, 512) == 64
    big = parse_action({"trajectory_id": "t", "kind": "exec", "payload": {"cmd": "ls"},
                        "cost": {"memory_mb": 2048}})
    assert trajectory_memory_mb(big, 512) == 2048


def cpu(trajectory: str = "t", cores: int | list[int] = 1, memory: float = 100) -> Action:
    return parse_action({"trajectory_id": trajectory, "kind": "exec", "payload": {"cmd": "ls"},
                         "cost": {"cpu": cores}, "trajectory_memory_mb": memory})


LIVE = (node("a", 4, 0), node("b", 4, 500))
ROUTES = [
    ("a live pin is kept, nothing to store", cpu(), RoutingInputs(LIVE, pin="b"),
     Route("tangram.cpu.b", "b")),
    ("no pin: placed on the least loaded node, pin to store", cpu(), RoutingInputs(LIVE),
     Route("tangram.cpu.a", "a", Pin("a", 100))),
    ("a pin on a dead node moves, the stale pin named",
     cpu(), RoutingInputs((node("a", 4, 0, alive=False), node("b", 4, 0)), pin="a"),
     Route("tangram.cpu.b", "b", Pin("b", 100, stale="a"))),
    ("a pin on a node missing from the views moves", cpu(), RoutingInputs(LIVE, pin="gone"),
     Route("tangram.cpu.a", "a", Pin("a", 100, stale="gone"))),
    ("the memory hint defaults to the setting",
     parse_action({"trajectory_id": "t", "kind": "exec", "payload": {"cmd": "ls"}}),
     RoutingInputs(LIVE, default_memory_mb=300), Route("tangram.cpu.a", "a", Pin("a", 300))),
    ("an elastic minimum is what must fit", cpu(cores=[2, 64]), RoutingInputs(LIVE, pin="a"),
     Route("tangram.cpu.a", "a")),
    ("a reward goes to its pool's queue",
     parse_action({"trajectory_id": "t", "kind": "reward", "payload": {"model": "m"},
                   "cost": {"gpu": 1}}),
     RoutingInputs(gpu_pool=GpuPoolView("default", 4, 4, True, models=("m",))),
     Route("tangram.gpu.default")),
    ("a reward is not checked against a pool that publishes nothing",
     parse_action({"trajectory_id": "t", "kind": "reward", "payload": {"model": "x"},
                   "cost": {"gpu": 8}}),
     RoutingInputs(), Route("tangram.gpu.default")),
    ("an API call goes to its API's queue",
     parse_action({"trajectory_id": "t", "kind": "api", "payload": {"path": "/q"},
                   "cost": {"api:search": 1}}, ActionLimits(apis=frozenset({"search"}))),
     RoutingInputs(apis=parse_api_limits("search=url:http://127.0.0.1:9,concurrency:2")),
     Route("tangram.api.search")),
]


@pytest.mark.parametrize(("name", "action", "inputs", "expected"), ROUTES,
                         ids=[r[0] for r in ROUTES])
def test_route(name: str, action: Action, inputs: RoutingInputs, expected: Route) -> None:
    assert route(action, inputs) == expected


REFUSED = [
    ("more cores than the pinned node has", cpu(cores=8), RoutingInputs(LIVE, pin="a"),
     NoCapacityError, "node a, which has 4"),
    ("more memory than any live node has in all", cpu(memory=5000), RoutingInputs(LIVE),
     NoCapacityError, "asks for 5000 MB and 1 cores, and the largest live node has 1000 MB"),
    ("a dead big node does not count",
     cpu(memory=5000), RoutingInputs((node("big", 4, 0, memory=9000, alive=False), *LIVE)),
     NoCapacityError, "can ever hold trajectory t"),
    ("more cores than any live node has", cpu(cores=8), RoutingInputs(LIVE),
     NoCapacityError, "8 cores, and the largest live node has 1000 MB and 4 cores"),
    ("no live node at all", cpu(), RoutingInputs((node("a", 4, 0, alive=False),)),
     NoCapacityError, "start a node with `tangram worker cpu`"),
    ("never fits even with others waiting ahead", cpu(memory=5000), RoutingInputs(LIVE, ahead=3),
     NoCapacityError, "can ever hold"),
    ("a model the pool does not serve",
     parse_action({"trajectory_id": "t", "kind": "reward", "payload": {"model": "x"},
                   "cost": {"gpu": 1}}),
     RoutingInputs(gpu_pool=GpuPoolView("default", 4, 4, True, models=("m",))),
     ValidationError, "unknown reward model"),
    ("more GPUs than the pool has",
     parse_action({"trajectory_id": "t", "kind": "reward", "payload": {"model": "m"},
                   "cost": {"gpu": 8}}),
     RoutingInputs(gpu_pool=GpuPoolView("default", 4, 4, True, models=("m",))),
     NoCapacityError, "GPU pool 'default' has 4"),
    ("more of an API than it grants at once",
     parse_action({"trajectory_id": "t", "kind": "api", "payload": {"path": "/q"},
                   "cost": {"api:search": 3}}, ActionLimits(apis=frozenset({"search"}))),
     RoutingInputs(apis=parse_api_limits("search=url:http://127.0.0.1:9,concurrency:2")),
     ValidationError, "at once"),
]


@pytest.mark.parametrize(("name", "action", "inputs", "error", "match"), REFUSED,
                         ids=[r[0] for r in REFUSED])
def test_route_refuses_what_no_pool_can_run(name: str, action: Action, inputs: RoutingInputs,
                                            error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        route(action, inputs)


FULL = (node("a", 4, 800), node("b", 4, 900))
WAITS = [
    ("no live node has the memory now: it waits", cpu(memory=600), RoutingInputs(FULL),
     Route("", wait=MemoryWait(600, 1, 0))),
    ("others wait ahead: it waits although it fits (strict FCFS, no backfill)", cpu(memory=50),
     RoutingInputs(FULL, ahead=2), Route("", wait=MemoryWait(50, 1, 2))),
    ("first in line and memory is back: placed", cpu(memory=150), RoutingInputs(FULL, ahead=0),
     Route("tangram.cpu.a", "a", Pin("a", 150))),
    ("a live pin ignores the line", cpu(), RoutingInputs(FULL, pin="b", ahead=5),
     Route("tangram.cpu.b", "b")),
    ("a stale pin with memory short: it waits",
     cpu(memory=300), RoutingInputs((node("gone", 4, 0, alive=False), *FULL), pin="gone"),
     Route("", wait=MemoryWait(300, 1, 0))),
    ("free memory on a dead node does not count",
     cpu(memory=300), RoutingInputs((node("z", 4, 0, alive=False), node("b", 4, 900))),
     Route("", wait=MemoryWait(300, 1, 0))),
    ("the cores must fit on the node with the memory",
     cpu(memory=100, cores=4), RoutingInputs((node("a", 4, 950), node("b", 4, 0, cores=2))),
     Route("", wait=MemoryWait(100, 4, 0))),
]


@pytest.mark.parametrize(("name", "action", "inputs", "expected"), WAITS,
                         ids=[w[0] for w in WAITS])
def test_route_waits_for_memory(name: str, action: Action, inputs: RoutingInputs,
                                expected: Route) -> None:
    assert route(action, inputs) == expected


def test_a_small_trajectory_never_passes_a_big_one_waiting() -> None:
    """FCFS over a replay: trajectories arrive while memory frees up one by one; each new one
    sees how many wait before it, and the placement order is the arrival order."""
    sizes = [600, 100, 100, 700, 50]
    nodes = [node("a", 4, 900)]
    line: list[int] = []
    placed: list[int] = []
    for arrival, size in enumerate(sizes):
        if route(cpu(f"t{arrival}", memory=size), RoutingInputs(tuple(nodes),
                                                                 ahead=len(line))).wait:
            line.append(arrival)
    for freed in (100, 400, 300, 200, 1000):
        nodes = [node("a", 4, max(nodes[0].reserved_mb - freed, 0))]
        while line:
            head = line[0]
            decided = route(cpu(f"t{head}", memory=sizes[head]), RoutingInputs(tuple(nodes)))
            if decided.pin is None:
                break
            nodes = [node("a", 4, nodes[0].reserved_mb + sizes[head])]
            placed.append(line.pop(0))
    assert placed == [0, 1, 2, 3, 4]


def test_place_now_and_choose_node_agree() -> None:
    assert place_now(FULL, 1, 150) == choose_node(FULL, 1, 150) == "a"
    assert place_now(FULL, 1, 600) is None


def test_the_timeout_error_names_the_memory_figures() -> None:
    nodes = (node("a", 4, 800), node("b", 4, 900, memory=2000), node("c", 4, 0, alive=False))
    text = memory_wait_error(cpu(memory=1500), MemoryWait(1500, 1, 0), 12.34, nodes)
    assert text.startswith("no_capacity: trajectory t waited 12.3 s")
    assert "for 1500 MB of memory and 1 cores" in text
    assert "2 live node(s) with 3000 MB in all, 1300 MB unreserved, at most 1100 MB on one" in text
