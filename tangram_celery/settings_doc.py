"""The settings reference, generated from :class:`~tangram_celery.settings.Settings`.

``python -m tangram_celery.settings_doc`` prints the table; ``--write`` rewrites
``docs/settings.md`` and, when README.md holds the markers ``<!-- settings:begin -->`` and
``<!-- settings:end -->``, the table between them; ``--check`` exits 1 when either is stale.
Every variable needs a description in :data:`DESCRIPTIONS`, keyed by its name without the
prefix in lower case (a test enforces it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import MISSING, Field
from pathlib import Path
from typing import Any

from tangram_celery.settings import PREFIX, SECTIONS, VARIABLES, Settings, section_fields

BEGIN = "<!-- settings:begin -->"
END = "<!-- settings:end -->"
ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "settings.md"
README = ROOT / "README.md"

DESCRIPTIONS: dict[str, str] = {
    "redis_url": "Redis DSN of the Celery broker, the node registry, pins and quotas: "
                 "`redis://[:PASSWORD@]HOST:PORT/DB`, or a Sentinel-managed Redis as "
                 "`sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/DB` (the Sentinels; the "
                 "password is the data nodes').",
    "redis_master_name": "The master name the Sentinels monitor (with a `sentinel://` URL).",
    "redis_sentinel_password": "Password of the Sentinels themselves (with a `sentinel://` "
                               "URL); empty: they take none.",
    "redis_wait_replicas": "With a `sentinel://` URL: replicas that must hold a write that has "
                           "to survive a failover (results, pins, tickets, quota grants) before "
                           "it counts as done (Redis `WAIT`); 0: never wait.",
    "redis_wait_ms": "Longest `WAIT` for those replicas (ms); past it the write counts as done "
                     "but not covered (logged and counted).",
    "redis_retry_s": "How long a command that is safe to repeat is retried while Redis "
                     "fails over or reconnects (s); 0: never.",
    "redis_timeout_s": "Socket timeout of tangram's Redis connections (s): how soon a dead "
                       "primary is noticed.",
    "fence_running": "What a CPU node or GPU pool fenced off from Redis (no heartbeat for "
                     "`NODE_TTL_S`) does with its running actions: `finish` them or `kill` "
                     "them (CPU sandboxes; a reward call in Triton always finishes).",
    "result_url": "Redis DSN of the result backend; empty: the broker's.",
    "sandbox_backend": "Sandbox of CPU actions: `bwrap` (embedded bubblewrap) or `docker`.",
    "sandbox_docker_url": "Docker engine of the `docker` sandbox backend.",
    "sandbox_docker_image": "Image of the `docker` backend's sandbox containers.",
    "sandbox_idle_ttl_s": "A trajectory idle this long loses its container (`docker`) (s).",
    "sandbox_warm_pool_min": "Fewest ready containers a `docker` node keeps for new trajectories.",
    "sandbox_warm_pool_max": "Most ready containers a `docker` node keeps for new trajectories.",
    "sandbox_recycle": "Wiped sandboxes a `bwrap` node keeps for one-request trajectories (a "
                       "gateway request without a trajectory name): each is wiped after its "
                       "request (processes killed, work dir, /tmp and /dev/shm emptied) and "
                       "reused; 0 starts and removes one per request.",
    "sandbox_ready": "Sandboxes a `bwrap` node keeps started ahead (uid, work dir, warm executor) "
                     "for new trajectories' first actions; 0 starts each on demand.",
    "sandbox_root": "Directory holding each node's per-trajectory work dirs.",
    "sandbox_uid_base": "First uid of sandboxes (bwrap and docker: one host uid per trajectory); "
    "each node takes its own 65,536 uids from here.",
    "sandbox_memory_mb": "Memory cap of one sandboxed command (MB).",
    "sandbox_pids": "Process cap of one sandbox.",
    "sandbox_file_size_mb": "Largest file a sandboxed command may write (MB).",
    "sandbox_workdir_mb": "Quota of a trajectory's work dir (MB); a `bwrap` node running as "
                          "root makes it a tmpfs of this size, counted as memory.",
    "sandbox_tmp_mb": "Size of the sandbox's private /tmp (MB).",
    "sandbox_enforce": "`strict`: a node that cannot enforce cores and memory (no cgroups it "
                       "can use) refuses to start and says what to do; `best-effort`: it runs "
                       "and reports what is not enforced (log, `tangram status`, dashboard, "
                       "every result).",
    "output_cap_bytes": "Bytes of stdout and of stderr kept per command: its head and its tail.",
    "default_timeout_s": "Timeout of an action that gives none (s).",
    "max_timeout_s": "Largest timeout an action may ask for (s).",
    "visibility_margin_s": "Added to the max timeout to form Redis' visibility timeout (s).",
    "autoscale_interval_s": "Seconds between `tangram autoscaler` ticks.",
    "autoscale_node_cores": "Cores of each CPU node the autoscaler starts.",
    "autoscale_node_memory_mb": "Memory (MB) of each CPU node the autoscaler starts.",
    "autoscale_min_nodes": "CPU nodes the autoscaler always keeps.",
    "autoscale_max_nodes": "CPU nodes the autoscaler never exceeds.",
    "autoscale_budget_cores": "Cores all autoscaled pools share (0: no global budget).",
    "autoscale_target_wait_s": "Seconds in which the queued predicted work should clear; "
    "the autoscaler grows a pool that cannot meet it.",
    "autoscale_down_hold_s": "Seconds after a pool's last change before it may shrink.",
    "autoscale_drain_timeout_s": "Longest wait for a drained node's trajectories to end before "
    "it is stopped anyway (s).",
    "stranded_after_s": "After this long without a heartbeat from a CPU node, a waiting client "
    "takes the actions still queued for it out of the broker and answers them `node_lost` "
    "(the trajectory's environment died with the node) instead of waiting forever (s; 0: off).",
    "recovery_audit_s": "How often a waiting client checks that its unfinished actions are "
    "still queued, held by a worker or done; one missing twice this far apart was lost by the "
    "broker and is published again (s; 0 turns the audit off).",
    "max_payload_bytes": "Largest JSON payload of one action (bytes).",
    "trajectory_memory_mb": "Memory a trajectory reserves on its node unless it says (MB).",
    "node_heartbeat_s": "Heartbeat period of node and pool workers (s).",
    "node_ttl_s": "A node or pool without a heartbeat this long counts as dead (s).",
    "result_ttl_s": "How long results and idempotency records are kept (s).",
    "trajectory_ttl_s": "An idle trajectory's pin to its node expires after this (s).",
    "admission_window": "Messages a worker holds at once; 0: max(2N, N+4) for N units.",
    "scheduler": "Placement policy: `robust` (the paper's DP steered by predicted demand: "
    "DoP cap, short-action reserve, backfilling), `elastic` (the paper's DP alone) or "
    "`fcfs-min`; on GPU pools `robust` is the service-aware scheduler (cache affinity, "
    "replica scaling, backfilling) and `elastic` the paper's DP.",
    "scheduler_depth": "Units the elastic scheduler's estimate lets the first waiter try.",
    "durations_sync_s": "How often (seconds) a CPU node (a GPU pool) reads the actions other "
                        "nodes (GPU pools) finished into its duration model, through one Redis "
                        "stream per pool type; 0: each learns alone.",
    "malleable_resize": "Whether a CPU node runs elastic pytest actions as malleable test runs "
                        "and grows and shrinks them while they run (bwrap with a writable "
                        "cpuset, or Docker): idle cores join them, a waiting action takes cores "
                        "back at once. An action opts out with `\"malleable\": false`.",
    "malleable_tick_s": "How often (seconds) a CPU node reads its malleable runs' progress and "
                        "resizes them, besides at each action's arrival and end.",
    "malleable_start_s": "A malleable run's worker start and collection cost (seconds) that the "
                         "resize decision counts against the gain of a new worker.",
    "malleable_weighting": "Which malleable run gets a free core first: `equi` (the fewest "
                           "workers; chosen by `tangram bench robustness --weightings`), "
                           "`absolute` (the most seconds saved), `shortest` (the least "
                           "remaining time) or `relative` (the largest share saved).",
    "triton_url": "Triton Inference Server address of the GPU pools.",
    "triton_protocol": "Triton client protocol: `http` or `grpc`.",
    "triton_repository": "Model repository the GPU pools load reward models from.",
    "triton_retry_s": "How long reward actions wait for an unavailable or restarted Triton.",
    "triton_key": "Key of Triton's control APIs (model repository, shared memory, trace, "
    "logging): `tangram triton` restricts them to requests carrying it and the GPU pools send "
    "it; required off loopback. Letters, digits and `-_.~`.",
    "reward_max_batch": "Reward actions that may join a running batch of their service.",
    "gpu_simulated": "GPU ids are simulated (no GPU needed; Triton runs models on CPU).",
    "gpu_memory_mb": "Memory of each GPU available to model weights (MB).",
    "gpu_restore_s": "Seconds a GPU pool's scheduler expects a reward service to take to load "
    "until it has timed one (then it uses the measured times).",
    "api_limits": "Quota-limited APIs: `name=url:U,concurrency:N,rate:C/P,burst:B;...`.",
    "api_bypass_s": "API calls are served oldest trajectory first; a call is overtaken only by "
    "calls that arrived at most this many seconds after it (0: plain FCFS by arrival).",
    "extra_resources": "Additional resource names an action's cost vector may use.",
    "clock_skew_s": "Test only: seconds added to this process's wall-clock readings, as on a "
    "host whose clock is off; the broker clock cancels it (docs/hosts.md). Leave 0.",
    "flower_address": "Address `tangram flower` listens on (non-loopback needs auth).",
    "flower_port": "Port of `tangram flower`.",
    "flower_user": "Basic-auth user of `tangram flower`.",
    "flower_password": "Basic-auth password of `tangram flower`; empty: one is generated.",  # nosec B105 # help text, not a password
    "exporter_address": "Address `tangram exporter` serves /metrics on (non-loopback needs "
    "a password).",
    "exporter_port": "Port of `tangram exporter`.",
    "exporter_user": "Basic-auth user of `tangram exporter`.",
    "exporter_password": "Basic-auth password of `tangram exporter` (the scraper's); empty: "  # nosec B105 # help text, not a password
    "no authentication, allowed on loopback only.",
    "autoscale_actuator": "What `tangram autoscaler` scales: `local` (node-worker processes "
    "on its machine) or `kubernetes` (the CPU node workload's `scale` subresource).",
    "kubernetes_namespace": "Namespace of the workloads the Kubernetes actuator scales.",
    "kubernetes_cpu_workload": "The CPU node workload the Kubernetes actuator scales, "
    "`statefulset/NAME` (drained before it shrinks) or `deployment/NAME`.",
    "dashboard_address": "Address `tangram dashboard` listens on (non-loopback needs auth).",
    "dashboard_port": "Port of `tangram dashboard`.",
    "dashboard_user": "Basic-auth user of `tangram dashboard`.",
    "dashboard_password": "Basic-auth password of `tangram dashboard`; empty: one is "  # nosec B105 # help text, not a password
    "generated.",
    "gateway_address": "Address `tangram gateway` (the SandboxFusion API) listens on; off "
    "loopback it needs `TANGRAM_GATEWAY_TOKEN`.",
    "gateway_port": "Port of `tangram gateway`.",
    "gateway_token": "Bearer token `tangram gateway` requires (`Authorization: Bearer ...`); "
    "empty: none, allowed on loopback only.",
    "gateway_wait_s": "Longest a gateway request waits for its actions, queueing included, "
    "before it answers `SandboxError` (s).",
    "gateway_trajectory_idle_s": "A trajectory named with `X-Tangram-Trajectory` is ended after "
    "this long without a request (s).",
    "gateway_pytest_max_cores": "Most cores a gateway `pytest` request's elastic test run may "
    "get.",
    "gateway_reward_model": "Reward model (in the Triton repository) that answers the gateway's "
                            "`POST /get_reward`, OpenRLHF's remote reward API: each `query` "
                            "is its `response` and each `label` its `reference`.",
    "gateway_languages": "Languages `tangram gateway` offers (comma-separated); empty: every "
    "known one whose toolchain is on the PATH.",
}


def setting_rows(section: str) -> list[tuple[str, ...]]:
    """(variable, field, type, default, description) of every field of one section."""
    return [(f"`{PREFIX}{f.metadata['env']}`", f"`{f.name}`", f"`{f.type}`", _default(f),
             DESCRIPTIONS.get(str(f.metadata["env"]).lower(), ""))
            for f in section_fields(section)]


def settings_table() -> str:
    """The Markdown tables of every setting, one per section of :class:`Settings`."""
    lines: list[str] = []
    for section in SECTIONS:
        doc = (type(getattr(Settings(), section)).__doc__ or "").strip().splitlines()[0]
        lines += [f"## `settings.{section}`", "", doc, "",
                  "| variable | field | type | default | meaning |",
                  "| --- | --- | --- | --- | --- |"]
        lines += ["| " + " | ".join(row) + " |" for row in setting_rows(section)]
        lines.append("")
    return "\n".join(lines)


def settings_doc() -> str:
    """The whole of ``docs/settings.md``."""
    return (
        "# Settings\n\n"
        "Every setting is read from its `TANGRAM_` environment variable into one frozen\n"
        "`Settings` object (`Settings.from_env()`); an unknown `TANGRAM_` variable is an error.\n"
        "The settings come in sections, and each component is handed the section it needs:\n"
        "`TANGRAM_SANDBOX_MEMORY_MB` is `settings.sandbox.memory_mb`. In code,\n"
        "`Settings.from_env(env, **overrides)` and `settings.with_(**changes)` name a variable\n"
        "without its prefix, in lower case (`settings.with_(sandbox_memory_mb=1024)`).\n"
        "Generated by `python -m tangram_celery.settings_doc --write`: do not edit by hand.\n\n"
        + settings_table()
    )


def with_readme_table(readme: str) -> str:
    """``readme`` with the table between the markers replaced (unchanged without markers)."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        return readme
    return readme[: start + len(BEGIN)] + "\n" + settings_table() + readme[end:]


def missing_descriptions() -> list[str]:
    """Variables (without the prefix, lower case) that have no description."""
    return [key for key in VARIABLES if not DESCRIPTIONS.get(key)]


def stale_files() -> list[Path]:
    """The generated files that differ from what the current fields give."""
    stale = [] if DOC.is_file() and DOC.read_text() == settings_doc() else [DOC]
    if README.is_file():
        text = README.read_text()
        if with_readme_table(text) != text:
            stale.append(README)
    return stale


def write() -> list[Path]:
    """Rewrite the stale generated files; returns them."""
    stale = stale_files()
    for path in stale:
        if path == DOC:
            DOC.parent.mkdir(parents=True, exist_ok=True)
            DOC.write_text(settings_doc())
        else:
            path.write_text(with_readme_table(path.read_text()))
    return stale


def _default(f: Field[Any]) -> str:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if isinstance(value, tuple):
        value = ",".join(value)
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return f"`{text}`" if text else "(empty)"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tangram_celery.settings_doc [--write | --check]``."""
    parser = argparse.ArgumentParser(prog="python -m tangram_celery.settings_doc")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="rewrite stale generated files")
    group.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    args = parser.parse_args(argv)
    if args.write:
        for path in write():
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    if args.check:
        stale = stale_files()
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)}; run python -m tangram_celery.settings_doc "
                  "--write", file=sys.stderr)
        return 1 if stale else 0
    print(settings_table(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
