"""Why the paper's allocator, called at every scheduling point as the paper says, gives the
median test run one or two cores under load (issue 20): a plain-data case.

A node's cores are busy with short exec actions; one frees, and a test run heads the queue.
The scheduling point sees one free core and one elastic candidate. Greedy eviction never
evicts the first candidate, and the estimate only places *waiting* jobs, so the test run
starts now on the one free core: the allocator cannot trade a short wait for more cores. The
same test run offered the node idle gets every core it may use.
"""

from __future__ import annotations

from tangram_celery.scheduling import Core, CpuPool, Job, RunningJob, Snapshot, decide

CORES = 8


def elastic_test_run(submitted: float = 0.0) -> Job:
    t1, p = 20.0, 0.9
    options = tuple((m, t1 * ((1 - p) + p / m)) for m in range(1, CORES + 1))
    return Job("test", "node", options, submitted)


def snapshot(free: int) -> Snapshot:
    busy = [RunningJob(f"exec-{i}", "node", 1, 0.3) for i in range(CORES - free)]
    pool = CpuPool("node", tuple(Core(i) for i in range(free)), CORES)
    return Snapshot(0.0, (elastic_test_run(),), (pool,), tuple(busy))


def test_one_free_core_the_head_test_run_takes_it_although_seven_free_in_0_3_s() -> None:
    decision = decide(snapshot(free=1))
    assert [start.count for start in decision.starts] == [1]


def test_an_idle_node_gives_the_same_test_run_every_core() -> None:
    decision = decide(snapshot(free=CORES))
    assert [start.count for start in decision.starts] == [CORES]


def test_two_free_cores_two_cores() -> None:
    assert [start.count for start in decide(snapshot(free=2)).starts] == [2]
