"""Benchmarks: each module runs as ``python -m tangram_celery.bench.<name>``.

May import: the ground floor, scheduling, workloads, sim, sandbox, reward, tasks, pools, client,
gateway, autoscale and stack; nothing imports the benchmarks but the command line.
"""
