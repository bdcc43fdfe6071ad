"""The AI-coding workload: many short exec actions, then an elastic test-run reward.

Each trajectory has ``turns`` exec actions (uniform in the range), each after an LLM think time,
and ends with one test run. Sources of the shapes (the values are assumptions, all flags):

* exec actions are inelastic (1 core), long-tailed from about 1 ms to tens of seconds, median
  about 0.3 s (issue 11; issue 12 quotes "about 0.3 s, many per trajectory"): a log-normal with
  median ``exec_median_s`` and log-sigma ``exec_sigma``, clipped to ``exec_range_s``;
* think time (LLM generation between actions) is chosen so that the environment is busy about
  half of a trajectory's lifetime (the design brief quotes ~47%);
* the final test run is elastic over 1..``max_units`` cores (32, as in issue 12), its one-core
  time long-tailed (log-normal, median ``test_median_s``), with Amdahl's law over a per-task
  parallel fraction drawn uniformly from ``parallel_range`` (or fixed by ``parallel``, for the
  sensitivity sweep);
* GRPO groups: the ``group`` rollouts of one prompt (consecutive trajectories) run the same
  test suite, so their test runs share one signature (``coding-p<group>``), one parallel
  fraction and one single-core time up to a per-rollout log-normal jitter of log-sigma
  ``group_jitter`` (rollouts that fail early, or add tests, change it a little). The default
  G = 8 is TRL's default ``num_generations`` (GRPOConfig) and lies within the 5-16 that
  verl's GRPO examples use; ``group=1`` gives every rollout its own suite.
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram_bench.workloads.distributions import clipped_lognormal, trajectory_rng
from tangram_bench.workloads.model import ActionSpec, Trajectory, Workload

NAME = "coding"


@dataclass(frozen=True)
class CodingParams:
    """Knobs of the AI-coding generator (see the module docstring for their sources)."""

    turns: tuple[int, int] = (8, 24)
    think_median_s: float = 2.0
    think_sigma: float = 0.6
    exec_median_s: float = 0.3
    exec_sigma: float = 1.6
    exec_range_s: tuple[float, float] = (0.001, 60.0)
    test_median_s: float = 20.0
    test_sigma: float = 0.8
    test_range_s: tuple[float, float] = (1.0, 600.0)
    parallel_range: tuple[float, float] = (0.5, 0.99)
    parallel: float | None = None
    max_units: int = 32
    start_spread_s: float = 0.0
    group: int = 8
    group_jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.group < 1 or self.group_jitter < 0:
            raise ValueError("group must be >= 1 and group_jitter >= 0")


def coding_trajectory(params: CodingParams, seed: int, index: int) -> Trajectory:
    """Trajectory ``index`` of the seeded batch."""
    rng = trajectory_rng(seed, NAME, index)
    p = params
    actions = []
    for _ in range(rng.randint(*p.turns)):
        think = clipped_lognormal(rng, p.think_median_s, p.think_sigma, 0.0, 600.0)
        t1 = clipped_lognormal(rng, p.exec_median_s, p.exec_sigma, *p.exec_range_s)
        actions.append(ActionSpec("exec", round(t1, 6), round(think, 6)))
    think = clipped_lognormal(rng, p.think_median_s, p.think_sigma, 0.0, 600.0)
    group = index // p.group
    suite = trajectory_rng(seed, f"{NAME}-suite", group)
    t1 = clipped_lognormal(suite, p.test_median_s, p.test_sigma, *p.test_range_s)
    parallel = p.parallel if p.parallel is not None else suite.uniform(*p.parallel_range)
    if p.group_jitter > 0:
        t1 = min(max(t1 * rng.lognormvariate(0.0, p.group_jitter), p.test_range_s[0]),
                 p.test_range_s[1])
    actions.append(ActionSpec("test_run", round(t1, 6), round(think, 6),
                              tuple(range(1, p.max_units + 1)), round(parallel, 4),
                              signature=f"{NAME}-p{group}"))
    start = rng.uniform(0.0, p.start_spread_s) if p.start_spread_s > 0 else 0.0
    return Trajectory(f"{NAME}-{index}", tuple(actions), round(start, 6))


def coding(batch: int, seed: int, params: CodingParams | None = None) -> Workload:
    """A batch of ``batch`` AI-coding trajectories, all in one RL step."""
    params = params or CodingParams()
    trajectories = tuple(coding_trajectory(params, seed, i) for i in range(batch))
    return Workload(NAME, trajectories)
