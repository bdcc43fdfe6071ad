"""The report section of ``mopd --mode real``: its setup paragraph, the table of ACT parts per
run, and the notes comparing the real runs with the simulations beside them."""

from __future__ import annotations

from collections.abc import Sequence

from tangram_bench.mopd_real.config import (
    DISPATCH_S,
    GPU_MEMORY_MB,
    MEASURED,
    RealGpuConfig,
)
from tangram_bench.mopd_real.measured import RealGpuRun, restore_fit
from tangram_bench.plan import Point
from tangram_bench.sim.record import RunResult
from tangram_bench.summary import Summary, ratio

DURATIONS_NOTE = {
    "learned": "calls go without their duration and Amdahl fraction (an elastic call says "
               "only that it may run at any of its GPU counts); the pools learn each "
               "teacher's time per DoP from the calls they served, and so does the simulator; "
               "the static replicas' warm-up calls state no duration either",
    "oracle": "an ablation: every call declares its true t1 and Amdahl fraction, and the "
              "simulator's policies are told the same",
}
"""What each durations mode of the real MOPD bench means, for its setup paragraph."""


def setup_text(config: RealGpuConfig, points: Sequence[Point], seed: int,
               results: Sequence[RunResult]) -> str:
    """The setup paragraph of a ``mopd --mode real`` report section."""
    wall = sum(r.wall_s for r in results)
    return (
        f"Real stack on this machine: GPU pool workers over {config.gpus} simulated GPUs "
        f"(nodes of {config.node_size}, {GPU_MEMORY_MB // 1000} GB each for the GPU manager's "
        "bookkeeping), real Celery + Redis, and the real tritonserver (nvidia-pytriton) "
        "loading and unloading every (teacher, chunk) service through its repository API. "
        "The teachers are emulated (`tangram_bench/teachers/model.py`): a load sleeps "
        "the restore time of the chunk it was really placed on, a call its Amdahl time on "
        f"that chunk. Every duration is at time scale {config.time_scale:g} and the LLM's "
        f"generation (think) times at {config.think_scale:g} on top (figures are wall seconds "
        "of the run); "
        f"restore physics load_init_s {config.load_init_s:g}, restore_gbps "
        f"{config.restore_gbps:g} (unscaled). Cross-request batching is off in every pool "
        "(`--no-batching`: the simulator models none). Each system gets a fresh Redis and a "
        f"fresh Triton. Workload `mopd` at points {[p.as_dict() for p in points]} (batch = "
        f"samples per RL step), seed {seed}; durations told to the policies: "
        f"`{config.durations}` ({DURATIONS_NOTE[config.durations]}); {len(results)} runs in "
        f"{wall:.0f} s.\n\n"
        "Mean ACT and its parts per system (seconds; restores: calls that loaded their "
        "teacher; wall: the timed run):\n\n" + "\n".join(parts_table(results, len(points) > 1)))


def parts_table(results: Sequence[RunResult], with_point: bool = False) -> list[str]:
    """One Markdown row per run: mean ACT, queue, exec, overhead, restores, wall seconds."""
    head = ["system", "preset", "mean ACT", "queue", "exec", "overhead", "restores", "wall"]
    rows = []
    for run in results:
        records = run.records
        n = max(len(records), 1)
        means = [sum(getattr(r, part) for r in records) / n
                 for part in ("total", "queue", "exec", "overhead")]
        wall = f"{run.wall_s:.0f}" if isinstance(run, RealGpuRun) else ""
        cells = [run.system, run.costs, *(f"{m:.2f}" for m in means),
                 str(sum(r.loaded for r in records)), wall]
        rows.append(([str(run.point)] if with_point else []) + cells)
    head = (["point"] if with_point else []) + head
    return ["| " + " | ".join(row) + " |" for row in (head, ["---"] * len(head), *rows)]


PRESET_NAMES = {"real": "real", "sim": "simulated", MEASURED: "simulated with measured restores"}


def _order(summaries: Sequence[Summary]) -> str:
    ranked = sorted(summaries, key=lambda s: s.mean_act)
    return " < ".join(f"{s.system} {s.mean_act:.2f} s" for s in ranked)


def _ranking(summaries: Sequence[Summary]) -> list[str]:
    return [s.system for s in sorted(summaries, key=lambda s: s.mean_act)]


def report_notes(config: RealGpuConfig, summaries: Sequence[Summary],
                 results: Sequence[RunResult]) -> tuple[str, ...]:
    """The notes of a ``mopd --mode real`` report section: how the simulations beside it were
    run, the orderings and ratios real against simulated, what Triton did per system."""
    notes = [
        "*simulated, same workload and node* (`sim`): the simulator on the same GPUs (80 GB "
        "each), the same seeded workload at the same time scale, the same restore physics, "
        f"with a per-action dispatch cost of {DISPATCH_S * 1000:.1f} ms charged to the pooled "
        "systems (measured on this stack by `tangram bench costs`); the simulator's static "
        "services pay no dispatch, the real ones pay the same Celery path as everyone.",
        "Memory: the GPU manager keeps one memory figure per model, so each teacher declares "
        "its memory per GPU at its smallest parallelism (`tangram_memory_mb`); the simulator "
        "charges weights / dop x 1.2 per GPU at each parallelism. On the real stack a teacher "
        "on a larger chunk therefore reserves more memory per GPU than simulated (more "
        "evictions for the systems that scale teachers up; exact for celery and static).",
        "Estimates: a granted call that triggers a restore is expected to hold its chunk for "
        "the restore too (`Admission.postpone` by the pool's restore estimate), as the "
        "simulator's running jobs are. The pool's scheduler starts from "
        "one restore estimate for every teacher (`TANGRAM_GPU_RESTORE_S`, here the mean "
        "restore at the smallest parallelism) until it has measured each (teacher, chunk "
        "size); the simulator's knows them all from the start.",
        "The pool workers talk to Triton over gRPC: over HTTP each load holds one of Triton's "
        "HTTP threads and stalls the inference requests it serves (triton-inference-server/"
        "server#8958). The server runs one model-load thread per GPU "
        f"(`--model-load-thread-count={max(4, config.gpus)}`; Triton's default of 4 queues "
        "concurrent restores).",
    ]
    points = list(dict.fromkeys(str(s.point) for s in summaries))
    for point in points:
        here = [s for s in summaries if str(s.point) == point]
        where = "" if len(points) == 1 else f" at {point}"
        fit = restore_fit(r for r in results if str(r.point) == point)
        notes.append(
            f"*{MEASURED}*{where}: the same simulation, each restore charged what the real "
            f"runs' restores measured beyond the emulated time, {fit.fixed_s:.2f} s + "
            f"{fit.per_gpu_s:.2f} s per simulated GPU of the chunk (least squares over "
            f"{fit.samples} restores: the python-backend stub processes Triton starts, one per "
            "simulated GPU of the chunk, competing with the other loads and requests for this "
            "machine's 2 cores).")
        by_preset = {p: [s for s in here if s.costs == p] for p in PRESET_NAMES}
        real = by_preset["real"]
        if not real:
            continue
        orders = "; ".join(f"{PRESET_NAMES[p]} {_order(group)}"
                           for p, group in by_preset.items() if group)
        verdicts = ", ".join(
            f"real and {PRESET_NAMES[p]} "
            f"{'agree' if _ranking(group) == _ranking(real) else 'differ'}"
            for p, group in by_preset.items() if group and p != "real")
        notes.append(f"Order by mean ACT{where}: {orders}. Orderings: {verdicts}.")
        mine = {s.costs: s for s in here if s.system == "tangram"}
        for base in (s.system for s in real if s.system != "tangram"):
            pair = {s.costs: s for s in here if s.system == base}
            cells = [f"{PRESET_NAMES[p]} {ratio(pair[p].mean_act, mine[p].mean_act):.2f}x"
                     for p in PRESET_NAMES if p in pair and p in mine]
            notes.append(f"{base} / tangram mean ACT{where}: {', '.join(cells)}.")
    for result in results:
        if not isinstance(result, RealGpuRun):
            continue
        loads = sum(r.loaded for r in result.records)
        line = (f"{result.system} (real): {loads} calls restored their teacher in the timed "
                f"run; Triton's log: {result.triton_loads} loads, {result.triton_unloads} "
                "unloads")
        if result.system == "static":
            line += f"; {result.warmup_loads} replica loads before the timed run"
        if result.restores:
            measured = sum(m for _, m, _ in result.restores) / len(result.restores)
            emulated = sum(e for _, _, e in result.restores) / len(result.restores)
            line += f"; a restore took {measured:.2f} s on average ({emulated:.2f} s emulated)"
        if result.triton_crashes:
            line += (f"; tritonserver aborted {result.triton_crashes} time(s) "
                     "(`boost::interprocess::lock_exception`, triton-inference-server/server"
                     "#8882) and the run was started again from scratch")
        notes.append(line + ".")
    return tuple(notes)
