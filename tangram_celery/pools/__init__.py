"""The pool runtimes: what a CPU node, a GPU pool and an API pool worker do with each action.

Admission gates and their placement policies, the runtimes, the worker entry points and the
Redis state they publish (the node registry, the pools' inventory).

May import: the ground floor, scheduling, sandbox, managers, reward and tasks; never the client, the
stack, the autoscaler or the benchmarks.
"""
