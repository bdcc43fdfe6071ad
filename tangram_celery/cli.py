"""The ``tangram`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from tangram_celery.errors import TangramError
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

    demo = commands.add_parser("demo", help="run a small agentic-coding batch and print ACT")
    demo.add_argument("--trajectories", type=int, default=4)
    demo.add_argument("--code-actions", type=int, default=3)
    demo.add_argument("--nodes", type=int, default=2)
    demo.add_argument("--cores", type=int, default=2, help="cores per node")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tangram`` command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        settings = Settings.from_env()
        if args.command == "worker":
            from tangram_celery.worker import run_cpu_worker

            run_cpu_worker(settings, args.node, args.cores, args.memory_mb, args.concurrency,
                           args.loglevel)
            return 0
        from tangram_celery.demo import DemoConfig
        from tangram_celery.demo import main as demo_main

        config = DemoConfig(trajectories=args.trajectories, code_actions=args.code_actions,
                            nodes=args.nodes, cores_per_node=args.cores)
        return demo_main(settings, config)
    except TangramError as exc:
        print(f"tangram: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
