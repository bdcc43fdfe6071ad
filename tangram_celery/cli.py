"""The ``tangram`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from tangram_celery.command_line import run_command
from tangram_celery.settings import Settings


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every ``tangram`` subcommand."""
    parser = argparse.ArgumentParser(prog="tangram", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    worker = commands.add_parser("worker", help="run a worker")
    pools = worker.add_subparsers(dest="pool", required=True)
    cpu = pools.add_parser("cpu", help="a CPU node worker (sandboxed code and test runs)")
    cpu.add_argument("--node", required=True, help="node name; its queue is tangram.cpu.NAME")
    cpu.add_argument("--cores", type=int, required=True, help="cores this node schedules")
    cpu.add_argument("--memory-mb", type=float, default=8192.0,
                     help="memory for trajectory environments (default 8192)")
    cpu.add_argument("--concurrency", type=int, default=None,
                     help="admission window: messages held at once (default max(2N, N+4))")
    cpu.add_argument("--loglevel", default="INFO")

    api = pools.add_parser("api", help="a basic pool worker for one quota-limited API")
    api.add_argument("--api", required=True, help="API name declared in TANGRAM_API_LIMITS")
    api.add_argument("--concurrency", type=int, default=None,
                     help="messages held at once (default from the API's limits)")
    api.add_argument("--loglevel", default="INFO")

    from tangram_celery.pools.gpu_pool.worker import add_worker_arguments

    add_worker_arguments(pools.add_parser(
        "gpu", help="a GPU reward pool worker (Triton reward models; simulated GPU ids on CPU)"
    ))

    from tangram_celery.observe import flower, metrics, status

    flower.add_arguments(commands.add_parser(
        "flower", help="Flower on the configured broker, basic auth by default"))
    metrics.add_arguments(commands.add_parser(
        "exporter", help="Prometheus exporter: ACT per kind and pool, queue depths, pool units"))
    status.add_arguments(commands.add_parser(
        "status", help="pools, workers, queue depths, units and resident reward models"))
    from tangram_celery.observe import dashboard_server

    dashboard_server.add_arguments(commands.add_parser(
        "dashboard", help="live page: ACT parts, queues, pool units, resident models, "
                          "slowest actions (basic auth)"))
    from tangram_celery.autoscale import controller

    controller.add_arguments(commands.add_parser(
        "autoscaler", help="size the CPU pool to predicted demand within a budget"))

    from tangram_celery.reward.server import command as triton
    from tangram_celery.stack import broker, sentinel, up

    broker.add_arguments(commands.add_parser(
        "redis", help="the broker: redis-server on TANGRAM_REDIS_URL's port, append-only file"))
    sentinel.add_arguments(commands.add_parser(
        "sentinel", help="a Redis Sentinel watching the broker's primary (failover)"))
    triton.add_arguments(commands.add_parser(
        "triton", help="Triton Inference Server (pytriton's binary) on the model repository"))
    up.add_up_arguments(commands.add_parser(
        "up", help="the compose stack (compose/docker-compose.yml) as local processes"))
    up.add_down_arguments(commands.add_parser("down", help="stop what `tangram up` started"))
    from tangram_celery.gateway import command as gateway

    gateway.add_arguments(commands.add_parser(
        "gateway", help="SandboxFusion's /run_code (verl's code sandbox) on the CPU pool"))

    commands.add_parser("bench", add_help=False,
                        help="benchmarks: `tangram bench <workload> --mode sim|real ...` "
                             "(see `tangram bench --help`)")

    demo = commands.add_parser(
        "demo", help="bring up the local stack (as `tangram up`), run a small agentic-coding "
                     "batch with rewards, print its ACT table, stop the stack")
    demo.add_argument("--trajectories", type=int, default=4,
                      help="trajectories run concurrently (default 4)")
    demo.add_argument("--code-actions", type=int, default=3,
                      help="code actions per trajectory before its test run and its reward "
                           "(default 3)")
    demo.add_argument("--nodes", type=int, default=2,
                      help="CPU nodes: copies of the compose file's cpu-node service, named "
                           "demo-node-0, demo-node-1, ... (default 2)")
    demo.add_argument("--cores", type=int, default=2, help="cores per CPU node (default 2)")
    demo.add_argument("--timeout", type=float, default=600.0,
                      help="seconds the batch may take once the stack is up (default 600)")
    return parser


PLUGIN_GROUP = "tangram.commands"
PLUGIN_HINTS = {"bench": "pip install 'tangram-celery[bench]'"}
"""Verbs that packages beside the product provide, and how to install each."""


def run_plugin(verb: str, argv: Sequence[str]) -> int:
    """Run ``tangram <verb>`` from the package that registers it in the ``tangram.commands``
    entry-point group; when none does, or it cannot load, say what to install."""
    found = [ep for ep in entry_points(group=PLUGIN_GROUP) if ep.name == verb]
    try:
        if not found:
            raise ModuleNotFoundError(f"no {PLUGIN_GROUP!r} entry point named {verb!r}")
        command: Callable[[Sequence[str]], int] = found[0].load()
    except ImportError as exc:
        print(f"tangram: error: `tangram {verb}` is not installed ({exc}): "
              f"{PLUGIN_HINTS[verb]}", file=sys.stderr)
        return 2
    return command(argv)


def run_worker(settings: Settings, args: argparse.Namespace) -> int:
    """Run the worker of the pool type named on the command line until it is stopped."""
    if args.pool == "cpu":
        from tangram_celery.pools.cpu_pool import run_cpu_worker

        run_cpu_worker(settings, args.node, args.cores, args.memory_mb, args.concurrency,
                       args.loglevel)
    elif args.pool == "api":
        from tangram_celery.pools.api_pool.worker import run_api_worker

        run_api_worker(settings, args.api, args.concurrency, args.loglevel)
    elif args.pool == "gpu":
        from tangram_celery.pools.gpu_pool.worker import run_from_args

        run_from_args(settings, args)
    return 0


def run_tool(settings: Settings, args: argparse.Namespace) -> int:
    """``tangram flower``, ``tangram exporter``, ``tangram status``, ``tangram dashboard`` or
    ``tangram autoscaler``."""
    from tangram_celery.autoscale import controller
    from tangram_celery.observe import dashboard_server, flower, metrics, status

    runners = {"flower": flower.run_from_args, "exporter": metrics.run_from_args,
               "status": status.run_from_args, "autoscaler": controller.run_from_args,
               "dashboard": dashboard_server.run_from_args}
    return runners[args.command](settings, args)


def run_stack_command(settings: Settings, args: argparse.Namespace) -> int:
    """``tangram redis``, ``tangram sentinel``, ``tangram triton``, ``tangram up`` or
    ``tangram down``."""
    from tangram_celery.reward.server import command as triton
    from tangram_celery.stack import broker, sentinel, up

    if args.command == "redis":
        return broker.run_from_args(settings, args)
    if args.command == "sentinel":
        return sentinel.run_from_args(settings, args)
    if args.command == "triton":
        return triton.run_from_args(settings.triton, args)
    if args.command == "up":
        return up.run_up(args)
    return up.run_down(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tangram`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in PLUGIN_HINTS:
        return run_plugin(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    return run_command("tangram", lambda: dispatch(Settings.from_env(), args))


def dispatch(settings: Settings, args: argparse.Namespace) -> int:
    """Run the parsed ``tangram`` command."""
    if args.command == "worker":
        return run_worker(settings, args)
    if args.command in {"flower", "exporter", "status", "autoscaler", "dashboard"}:
        return run_tool(settings, args)
    if args.command in {"redis", "sentinel", "triton", "up", "down"}:
        return run_stack_command(settings, args)
    if args.command == "gateway":
        from tangram_celery.gateway.command import run_from_args as run_gateway

        return run_gateway(settings, args)
    from tangram_celery.stack.demo import DemoConfig
    from tangram_celery.stack.demo import main as demo_main

    config = DemoConfig(trajectories=args.trajectories, code_actions=args.code_actions,
                        nodes=args.nodes, cores_per_node=args.cores, timeout_s=args.timeout)
    return demo_main(settings, config)

if __name__ == "__main__":
    sys.exit(main())
