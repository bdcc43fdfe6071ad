"""Pool autoscaling: a pure sizing policy, the work predicted for queued actions, actuators that
apply the policy, and the controller loop.

May import: the ground floor, tasks and pools; never the client, the stack or the benchmarks.
"""
