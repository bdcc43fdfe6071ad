"""The routing decision as plain-data tables: placement, queues and what is refused."""

from __future__ import annotations

import pytest

from tangram_celery.action import Action, ActionLimits, parse_action
from tangram_celery.client.routing import (
    Pin,
    Route,
    RoutingInputs,
    choose_node,
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
    ("no live node has the memory", cpu(memory=5000), RoutingInputs(LIVE),
     NoCapacityError, "5000 MB free"),
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
