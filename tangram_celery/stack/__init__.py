"""The local stack: the compose file as data, ``tangram up`` / ``tangram down`` as local
processes, the broker as a service, the stack's Docker images, and ``tangram demo``.

May import: the ground floor, sandbox, pools, observe and client; never the autoscaler or the
benchmarks.
"""
