"""What training scripts import: submit actions, wait for results, end trajectories.

    from tangram_celery.client import TangramClient, code_action, test_run_action

The client validates, stamps, routes and publishes actions (:mod:`.client`; the common ones are
built by :mod:`.actions`), waits for their results without polling (:mod:`.waiter`), and
publishes again what the broker lost (:mod:`.inflight`, with the pure rules in
:mod:`.recovery`). Routing is one pure decision (:mod:`.routing`) behind its Redis edge
(:mod:`.router`). A new trajectory that no node has the memory for waits, FCFS across clients, in
a line kept in Redis (:mod:`.tickets`), parked by the client without blocking (:mod:`.waitlist`).

May import: the ground floor, managers, tasks, pools and observe; never the stack, the autoscaler or
the benchmarks.
"""

from tangram_celery.client.actions import code_action, command_action, test_run_action
from tangram_celery.client.client import ActionHandle, TangramClient, broker_error

__all__ = [
    "ActionHandle",
    "TangramClient",
    "broker_error",
    "code_action",
    "command_action",
    "test_run_action",
]
