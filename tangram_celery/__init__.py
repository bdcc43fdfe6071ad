"""tangram-celery: per-action elastic resource scheduling for agentic RL on Celery."""

__version__ = "0.1.0"
