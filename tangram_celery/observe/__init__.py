"""Looking at a running system: the Prometheus exporter, ``tangram status``, Flower, the live
``tangram dashboard`` page, ACT reports and progress bars.

May import: the ground floor, tasks and pools; never the client, the stack or the benchmarks.
"""
