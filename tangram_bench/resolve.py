"""Argument resolution of ``tangram bench``: the plan of an invocation (its points, systems,
presets and workload per point), checked against the cluster each point describes."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

from tangram_bench import mopd_real
from tangram_bench.elastic import real_workload
from tangram_bench.mopd_real import RealGpuConfig
from tangram_bench.mopd_real import config as mopd_config
from tangram_bench.plan import Point, points, workload_at
from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import PRESETS
from tangram_bench.sim.durations import DEFAULT_DURATIONS, parse_durations
from tangram_bench.sim.systems import DEFAULT_SYSTEMS, system
from tangram_bench.workloads import Workload, read_trace

REAL_SYSTEMS = ("tangram", "tangram:ersa", "fixed-dop-4", "fcfs-min", "celery",
                "tangram:malleable", "tangram:malleable-fixed")
REAL_ONLY_SYSTEMS = ("tangram:malleable", "tangram:malleable-fixed")
"""Real-stack systems the simulator may not know (its ``sim`` run is then skipped)."""
REAL_GPU_SYSTEMS = mopd_config.SYSTEMS
"""The systems of ``mopd --mode real`` (:data:`tangram_bench.mopd_real.config.SYSTEMS`)."""
REAL_WORKLOADS = ("coding", "mopd")


@dataclass(frozen=True)
class Plan:
    """What to run: the points (and the base they vary), the systems, the cost presets, the
    seeds; ``workload`` gives the workload of a point and seed."""

    points: list[Point]
    base: Point
    systems: list[str]
    presets: list[str]
    workload: Callable[[Point, int], Workload]
    seeds: list[int] = field(default_factory=lambda: [1])


def resolve(args: argparse.Namespace) -> Plan:
    """The plan of an invocation; ValueError names what is wrong with the arguments."""
    real = args.mode == "real"
    if real and args.workload not in REAL_WORKLOADS:
        raise ValueError(f"the real-stack mode runs the {' and '.join(REAL_WORKLOADS)} "
                         "workloads")
    gpu_real = real and args.workload == "mopd"
    if (args.time_scale is not None or args.think_scale is not None) and not gpu_real:
        raise ValueError("--time-scale and --think-scale apply to mopd --mode real only")
    if gpu_real and args.sweep in ("cores", "parallel"):
        raise ValueError(f"mopd --mode real sweeps batch or gpus, not {args.sweep}")
    batch, gpus = (8 if real else 1280), 40
    if gpu_real:
        batch, gpus = mopd_config.DEFAULT_BATCH, mopd_config.DEFAULT_GPUS
    for flag in ("batch", "cores", "gpus"):
        given = getattr(args, flag)
        if given is not None and given <= 0:
            raise ValueError(f"--{flag} must be a positive integer, not {given}")
    group = getattr(args, "group", None)
    if group is not None and (group < 1 or real):
        raise ValueError(f"--group must be a positive integer (sim only), not {group}"
                         if group < 1 else "--group applies to the simulated coding workload")
    base = Point(batch=args.batch or batch, cores=args.cores or (8 if real else 1280),
                 gpus=args.gpus or gpus, group=group)
    planned = points(base, args.sweep, sweep_values(args.points, args.sweep))
    for point in planned:  # ValueError names a point the cluster cannot have
        if gpu_real:
            gpu_config(args, point)
        elif not real:
            point.cluster(physics(args))
    default = REAL_GPU_SYSTEMS if gpu_real else REAL_SYSTEMS if real else DEFAULT_SYSTEMS
    systems = [name.strip() for name in args.systems.split(",")] if args.systems else list(
        default)
    for name in systems:
        if not (real and name in REAL_ONLY_SYSTEMS):
            system(name, args.policy)  # ValueError names an unknown system or policy
    parse_durations(getattr(args, "durations", DEFAULT_DURATIONS))  # ValueError names it
    presets = ["real", "sim"] if real else args.costs.split(",")
    unknown = [p for p in presets if p not in PRESETS and not real]
    if unknown:
        raise ValueError(f"unknown cost presets {unknown}; use {', '.join(PRESETS)}")
    if args.workload == "trace" and args.trace is None:
        raise ValueError("give --trace FILE for the trace workload")
    if args.workload == "trace" and args.sweep in ("batch", "parallel"):
        raise ValueError(f"a trace's size and shape are fixed: --sweep {args.sweep} does not "
                         "apply; sweep cores or gpus")
    trace = read_trace(args.trace) if args.workload == "trace" else None
    seeds = seed_list(getattr(args, "seeds", None), args.seed)
    if gpu_real and len(seeds) > 1:
        raise ValueError("--seeds applies to the simulated mode and to the real AI-coding "
                         "stack; run the real MOPD stack once per --seed")

    def workload(point: Point, seed: int) -> Workload:
        if gpu_real:
            config = gpu_config(args, point)
            return mopd_real.real_workload(point.batch, seed, config.time_scale,
                                           config.think_scale)
        if real:
            return real_workload(point.batch, seed, point.cores)
        return workload_at(args.workload, point, seed, trace)

    return Plan(planned, base, systems, presets, workload, seeds)


def seed_list(text: str | None, seed: int) -> list[int]:
    """The seeds of ``--seeds`` (comma-separated, distinct), else ``[seed]``; ValueError
    names a bad one."""
    if not text:
        return [seed]
    seeds = []
    for part in text.split(","):
        try:
            seeds.append(int(part))
        except ValueError:
            raise ValueError(f"--seeds: {part.strip()!r} is not an integer") from None
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds: each seed once, not {text}")
    return seeds


def sweep_values(text: str | None, sweep: str | None) -> tuple[float, ...] | None:
    """The values of ``--points`` (None: the sweep's own); ValueError names a bad one."""
    if not text:
        return None
    if sweep is None:
        raise ValueError("--points gives the values of a sweep: add --sweep")
    values = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"--points: {part.strip()!r} is not a number") from None
        if sweep == "parallel" and not 0 <= value <= 1:
            raise ValueError(f"--points: parallel fractions lie in [0, 1], not {part.strip()}")
        if sweep != "parallel" and (value <= 0 or not value.is_integer()):
            raise ValueError(f"--points: {sweep} values are positive integers, not "
                             f"{part.strip()}")
        values.append(value)
    return tuple(values)


def gpu_config(args: argparse.Namespace, point: Point) -> RealGpuConfig:
    """The emulated hardware of ``mopd --mode real`` at ``point``."""
    given = physics(args)
    scale = mopd_config.DEFAULT_TIME_SCALE if args.time_scale is None else args.time_scale
    think = mopd_config.DEFAULT_THINK_SCALE if args.think_scale is None else args.think_scale
    return mopd_real.RealGpuConfig(
        gpus=point.gpus, time_scale=scale, think_scale=think,
        load_init_s=given.get("load_init_s", Cluster.load_init_s),
        restore_gbps=given.get("restore_gbps", Cluster.restore_gbps),
        durations=getattr(args, "durations", DEFAULT_DURATIONS))


def physics(args: argparse.Namespace) -> dict[str, float]:
    """The physical-cost flags given on the command line."""
    given = {"load_init_s": args.load_init_s, "restore_gbps": args.restore_gbps}
    return {k: v for k, v in given.items() if v is not None}
