"""The local stack: the compose file as data, ``tangram up`` / ``tangram down`` as local
processes, the broker as a service, the stack's Docker images, and ``tangram demo``.

May import every runtime package below it (``pools``, ``client``, ``observe``, ``reward``,
``sandbox``); never the autoscaler's internals or the benchmarks.
"""
