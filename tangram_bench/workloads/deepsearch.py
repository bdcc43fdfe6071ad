"""The DeepSearch-like workload: quota-limited API calls, then a GPU judge.

Each trajectory makes ``calls`` search-API calls (uniform in the range), each after LLM think
time, then one judge call on GPUs (a reward model with tensor-parallel degree 1, 2 or 4). The API
allows ``concurrency`` calls in flight and ``qps`` call starts per second across all
trajectories (a provider quota); the defaults make the quota bind at batch sizes from a few
hundred. All durations are log-normal; the values are assumptions, all flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram_bench.workloads.distributions import clipped_lognormal, trajectory_rng
from tangram_bench.workloads.model import (
    ActionSpec,
    ApiLimit,
    GpuService,
    Trajectory,
    Workload,
)

NAME = "deepsearch"


@dataclass(frozen=True)
class DeepSearchParams:
    """Knobs of the DeepSearch-like generator."""

    calls: tuple[int, int] = (3, 12)
    think_median_s: float = 3.0
    think_sigma: float = 0.6
    call_median_s: float = 0.8
    call_sigma: float = 0.7
    api_concurrency: int = 128
    api_qps: float = 64.0
    judge_median_s: float = 2.0
    judge_sigma: float = 0.5
    judge_parallel: float = 0.85
    judge_weights_gb: float = 16.0


def deepsearch(batch: int, seed: int, params: DeepSearchParams | None = None) -> Workload:
    """A batch of ``batch`` DeepSearch-like trajectories, in one RL step."""
    p = params or DeepSearchParams()
    api = ApiLimit("search", p.api_concurrency, p.api_qps)
    judge = GpuService("judge-8b", (1, 2, 4), p.judge_weights_gb)
    trajectories = []
    for i in range(batch):
        rng = trajectory_rng(seed, NAME, i)
        actions = []
        for _ in range(rng.randint(*p.calls)):
            think = clipped_lognormal(rng, p.think_median_s, p.think_sigma, 0.0, 600.0)
            t1 = clipped_lognormal(rng, p.call_median_s, p.call_sigma, 0.01, 60.0)
            actions.append(ActionSpec("api", round(t1, 6), round(think, 6), service=api.name))
        think = clipped_lognormal(rng, p.think_median_s, p.think_sigma, 0.0, 600.0)
        t1 = clipped_lognormal(rng, p.judge_median_s, p.judge_sigma, 0.05, 600.0)
        actions.append(ActionSpec("reward", round(t1, 6), round(think, 6), judge.dops,
                                  p.judge_parallel, judge.name))
        trajectories.append(Trajectory(f"{NAME}-{i}", tuple(actions)))
    return Workload(NAME, tuple(trajectories), (judge,), (api,))
