"""Routing policy as plain-data tables."""

from __future__ import annotations

import pytest

from tangram_celery.action import parse_action
from tangram_celery.errors import NoCapacityError, RoutingError
from tangram_celery.pools.routing import NodeView, choose_node, queue_for, trajectory_memory_mb


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
