"""Replaying your own traces: the JSON Lines trace format, its parser and its writer.

One JSON object a line; blank lines and lines starting with ``#`` are skipped. A line's
``type`` says what it is (it can be left out for trajectory and action lines):

* ``{"type": "workload", "name": "mine", "step_gap_s": 0}``: optional, names the workload;
* ``{"type": "service", "name": "rm-8b", "dops": [1, 2, 4, 8], "weights_gb": 16}``: a GPU
  service (optional ``kv_fraction``, default 0.2);
* ``{"type": "api", "name": "search", "concurrency": 64, "qps": 50}``: a quota-limited API;
* ``{"type": "trajectory", "id": "t1", "start_s": 0, "step": 0, "actions": [ACTION, ...]}``:
  one trajectory a line, its actions in order;
* ``{"type": "action", "trajectory": "t1", "index": 0, ...ACTION fields}``: or one action a
  line; the actions of a trajectory are ordered by ``index`` and may come in any order and be
  interleaved with other trajectories' (``start_s`` and ``step`` may ride on any of them).

An ACTION is ``{"kind": "exec" | "test_run" | "reward" | "api", "t1": seconds at one unit,
"think_s": LLM seconds before it is submitted, "units": 1 | [min, max] | {"set": [1, 2, 4]},
"parallel": Amdahl parallel fraction in [0, 1], "service": GPU model or API name}``; only
``kind`` and ``t1`` are required (``units`` defaults to 1, ``parallel`` to 0). ``units`` reads
like an action's cost vector entry. Reward and API actions name a service declared in the trace.

:func:`parse_trace` / :func:`format_trace` are pure; :func:`read_trace` / :func:`write_trace`
touch the file system.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tangram_bench.workloads.model import (
    ActionSpec,
    ApiLimit,
    GpuService,
    Trajectory,
    Workload,
)
from tangram_celery.action import parse_amount
from tangram_celery.errors import ValidationError

ACTION_FIELDS = ("kind", "t1", "think_s", "units", "parallel", "service")


FORMAT_HELP = "the trace format is in docs/traces.md"


class TraceError(ValueError):
    """A trace line that cannot be read; the message names the line and the field."""


def parse_trace(lines: Iterable[str], name: str = "trace") -> Workload:
    """A workload from JSON Lines text (see the module docstring for the format)."""
    header: dict[str, Any] = {"name": name, "step_gap_s": 0.0}
    services: list[GpuService] = []
    apis: list[ApiLimit] = []
    whole: dict[str, Trajectory] = {}
    parts: dict[str, dict[int, ActionSpec]] = {}
    placement: dict[str, dict[str, float]] = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            record = json.loads(text)
        except ValueError as exc:
            raise TraceError(f"trace line {number}: not a JSON object ({exc}); {FORMAT_HELP}"
                             ) from None
        try:
            _read_line(record, header, services, apis, whole, parts, placement)
        except KeyError as exc:
            raise TraceError(f"trace line {number}: the required field {exc.args[0]!r} is "
                             f"missing; {FORMAT_HELP}") from None
        except (ValueError, TypeError, ValidationError) as exc:
            raise TraceError(f"trace line {number}: {exc}") from None
    trajectories = list(whole.values()) + [
        Trajectory(tid, tuple(actions[i] for i in sorted(actions)),
                   placement.get(tid, {}).get("start_s", 0.0),
                   int(placement.get(tid, {}).get("step", 0)))
        for tid, actions in parts.items()
    ]
    if not trajectories:
        raise TraceError(f"the trace has no trajectory or action lines; {FORMAT_HELP}")
    try:
        return Workload(str(header["name"]), tuple(trajectories), tuple(services), tuple(apis),
                        float(header["step_gap_s"]))
    except ValueError as exc:
        raise TraceError(f"trace: {exc}") from None


def _read_line(
    record: Any,
    header: dict[str, Any],
    services: list[GpuService],
    apis: list[ApiLimit],
    whole: dict[str, Trajectory],
    parts: dict[str, dict[int, ActionSpec]],
    placement: dict[str, dict[str, float]],
) -> None:
    if not isinstance(record, Mapping):
        raise TraceError("expected a JSON object")
    kind = record.get("type") or ("trajectory" if "actions" in record else "action")
    if kind == "workload":
        header.update({k: record[k] for k in ("name", "step_gap_s") if k in record})
    elif kind == "service":
        services.append(GpuService(str(record["name"]), tuple(int(d) for d in record["dops"]),
                                   float(record["weights_gb"]),
                                   float(record.get("kv_fraction", 0.2))))
    elif kind == "api":
        apis.append(ApiLimit(str(record["name"]), int(record["concurrency"]),
                             float(record["qps"])))
    elif kind == "trajectory":
        tid = str(record["id"])
        if tid in whole or tid in parts:
            raise TraceError(f"trajectory {tid!r} appears twice; give each trajectory one "
                             "line, or all its actions as action lines")
        actions = tuple(parse_action_spec(a) for a in record["actions"])
        whole[tid] = Trajectory(tid, actions, float(record.get("start_s", 0.0)),
                                int(record.get("step", 0)))
    elif kind == "action":
        tid = str(record["trajectory"])
        index = int(record["index"])
        if tid in whole or index in parts.get(tid, {}):
            where = "has a trajectory line" if tid in whole else f"has an action {index}"
            raise TraceError(f"trajectory {tid!r} already {where}; each action of a trajectory "
                             "needs its own index")
        parts.setdefault(tid, {})[index] = parse_action_spec(record)
        for key in ("start_s", "step"):
            if key in record:
                placement.setdefault(tid, {})[key] = float(record[key])
    else:
        raise TraceError(f"unknown line type {kind!r}")


def parse_action_spec(record: Mapping[str, Any]) -> ActionSpec:
    """One ACTION object of a trace."""
    units = parse_amount("units", record.get("units", 1), integral=True).allowed_units()
    return ActionSpec(
        kind=str(record["kind"]),
        t1=float(record["t1"]),
        think_s=float(record.get("think_s", 0.0)),
        units=units,
        parallel=float(record.get("parallel", 0.0)),
        service=str(record.get("service", "")),
        signature=str(record.get("signature", "")),
    )


def action_record(spec: ActionSpec) -> dict[str, Any]:
    """The ACTION object of ``spec`` (ranges written as [min, max], other sets as {set})."""
    units: Any = spec.units[0] if len(spec.units) == 1 else {"set": list(spec.units)}
    if len(spec.units) > 1 and list(spec.units) == list(range(spec.units[0],
                                                               spec.units[-1] + 1)):
        units = [spec.units[0], spec.units[-1]]
    record: dict[str, Any] = {"kind": spec.kind, "t1": spec.t1, "think_s": spec.think_s,
                              "units": units}
    if spec.parallel:
        record["parallel"] = spec.parallel
    if spec.service:
        record["service"] = spec.service
    if spec.signature:
        record["signature"] = spec.signature
    return record


def format_trace(workload: Workload) -> Iterator[str]:
    """The workload as JSON Lines, one trajectory a line (``parse_trace`` reads it back)."""
    yield json.dumps({"type": "workload", "name": workload.name,
                      "step_gap_s": workload.step_gap_s})
    for service in workload.services:
        yield json.dumps({"type": "service", "name": service.name, "dops": list(service.dops),
                          "weights_gb": service.weights_gb,
                          "kv_fraction": service.kv_fraction})
    for api in workload.apis:
        yield json.dumps({"type": "api", "name": api.name, "concurrency": api.concurrency,
                          "qps": api.qps})
    for trajectory in workload.trajectories:
        yield json.dumps({"type": "trajectory", "id": trajectory.id,
                          "start_s": trajectory.start_s, "step": trajectory.step,
                          "actions": [action_record(a) for a in trajectory.actions]})


def read_trace(path: Path) -> Workload:
    """Load a JSON Lines trace file; TraceError names what is wrong with it."""
    try:
        with path.open(encoding="utf-8") as handle:
            return parse_trace(handle, path.stem)
    except OSError as exc:
        raise TraceError(f"cannot read the trace file {str(path)!r}: "
                         f"{exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"the trace file {str(path)!r} is not UTF-8 text ({exc.reason} at "
                         f"byte {exc.start}); {FORMAT_HELP}") from None


def write_trace(path: Path, workload: Workload) -> None:
    """Write ``workload`` as a JSON Lines trace file."""
    path.write_text("".join(line + "\n" for line in format_trace(workload)), encoding="utf-8")
