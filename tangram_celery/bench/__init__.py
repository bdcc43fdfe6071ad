"""Benchmarks: each module runs as ``python -m tangram_celery.bench.<name>``."""
