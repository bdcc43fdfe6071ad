"""The MOPD-like workload: multi-teacher distillation rewards on pooled GPUs.

Each RL step rolls out ``batch`` samples; a sample's reward is one call to the teacher of its
domain (teacher log-probs of the sample). The domain mix of each step is a symmetric Dirichlet
draw with a small concentration ``alpha``, so a teacher's invocation count swings by orders of
magnitude between steps (the design brief: up to three orders of magnitude, 12 teachers
averaging under 3% SM activity under static services). Every teacher allows tensor-parallel
degrees from its memory minimum up to 8; a call's duration follows Amdahl's law with the
teacher's parallel fraction. A sample's think time is its generation time, long-tailed, so
reward calls arrive spread over the step. The teacher roster below is an assumption: sizes span
1.5B to 235B (MoE) parameters, weights in bf16.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tangram_bench.workloads.distributions import (
    clipped_lognormal,
    dirichlet,
    trajectory_rng,
)
from tangram_bench.workloads.model import ActionSpec, GpuService, Trajectory, Workload

NAME = "mopd"


@dataclass(frozen=True)
class Teacher:
    """A teacher service and the one-GPU-equivalent time of one reward call (median)."""

    service: GpuService
    t1_median_s: float
    parallel: float = 0.9


TEACHERS = (
    Teacher(GpuService("code-1.5b", (1, 2, 4, 8), 3.0), 0.4),
    Teacher(GpuService("math-7b", (1, 2, 4, 8), 15.0), 1.2),
    Teacher(GpuService("chat-8b", (1, 2, 4, 8), 16.0), 1.3),
    Teacher(GpuService("science-14b", (1, 2, 4, 8), 28.0), 2.2),
    Teacher(GpuService("agent-32b", (2, 4, 8), 64.0), 5.0),
    Teacher(GpuService("moe-30b-a3b", (2, 4, 8), 60.0), 1.0, 0.8),
    Teacher(GpuService("dense-70b", (4, 8), 140.0), 10.0),
    Teacher(GpuService("moe-235b-a22b", (8,), 470.0), 6.0, 0.8),
)


@dataclass(frozen=True)
class MopdParams:
    """Knobs of the MOPD-like generator."""

    steps: int = 4
    alpha: float = 0.3
    generation_median_s: float = 20.0
    generation_sigma: float = 0.8
    call_sigma: float = 0.5
    step_gap_s: float = 0.0


def domain_mix(seed: int, step: int, teachers: int, alpha: float) -> list[float]:
    """The share of samples of each teacher's domain in ``step``."""
    return dirichlet(random.Random(f"{NAME}:{seed}:mix:{step}"), alpha, teachers)


def mopd(batch: int, seed: int, params: MopdParams | None = None,
         teachers: tuple[Teacher, ...] = TEACHERS) -> Workload:
    """``params.steps`` steps of ``batch`` samples each, one teacher call per sample."""
    params = params or MopdParams()
    trajectories = []
    for step in range(params.steps):
        shares = domain_mix(seed, step, len(teachers), params.alpha)
        cumulative = [sum(shares[: i + 1]) for i in range(len(shares))]
        for i in range(batch):
            rng = trajectory_rng(seed, f"{NAME}:{step}", i)
            draw = rng.random()
            teacher = teachers[next((k for k, c in enumerate(cumulative) if draw < c),
                                    len(teachers) - 1)]
            think = clipped_lognormal(rng, params.generation_median_s,
                                      params.generation_sigma, 0.5, 600.0)
            t1 = clipped_lognormal(rng, teacher.t1_median_s, params.call_sigma, 0.01, 600.0)
            action = ActionSpec("reward", round(t1, 6), round(think, 6),
                                teacher.service.dops, teacher.parallel, teacher.service.name)
            trajectories.append(Trajectory(f"{NAME}-{step}-{i}", (action,), 0.0, step))
    return Workload(NAME, tuple(trajectories), tuple(t.service for t in teachers),
                    step_gap_s=params.step_gap_s)
