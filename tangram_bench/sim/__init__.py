"""Discrete-event simulation of the compared systems at paper scale.

:func:`~tangram_bench.sim.systems.simulate` runs one system on one workload and returns a
:class:`~tangram_bench.sim.record.RunResult`. Pooled systems call the project's scheduler
(:func:`tangram_celery.scheduling.decide`) through a pluggable :class:`~.policy.Policy`; the
static baselines are modelled in :mod:`.pods`, :mod:`.services` and :mod:`.quota`; every
control-plane cost is a flag in :mod:`.costs`.

May import: the ground floor, scheduling and workloads; never bench, so the simulator runs the same
schedulers the pools run and nothing of the benchmark commands.
"""
