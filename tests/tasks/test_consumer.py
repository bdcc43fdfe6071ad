"""The worker's consumer on a real Redis: what it counts as a lost connection."""

from __future__ import annotations

import logging

import pytest
from kombu import Connection

from tangram_celery.settings import Settings
from tangram_celery.tasks.app import consumer_connection_errors


def test_worker_consumer_logs_an_ack_over_a_connection_a_restart_broke(
    settings: Settings, caplog: pytest.LogCaptureFixture,
) -> None:
    """A task that finishes after a broker restart acks over its old channel, whose connection
    kombu has dropped (and with it the channel's pool): kombu raises AttributeError there, which
    ended the worker (seen in the broker-restart chaos test). Tangram's consumer counts it as a
    connection error, so Celery's ack logs it instead."""
    with Connection(settings.broker.redis_url) as connection:
        errors = consumer_connection_errors(connection.connection_errors)
        queue = connection.SimpleQueue("tangram.test.stale-channel")
        queue.put({"n": 1})
        message = queue.get(timeout=5)
        connection.release()
        message.channel._pool = None  # what kombu's disconnect handler leaves behind
        with pytest.raises(AttributeError):
            message.ack()
        message._state = "RECEIVED"
        message.ack_log_error(logging.getLogger("test"), errors)
    assert "Couldn't ack" in caplog.text
