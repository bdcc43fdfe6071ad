"""Reading a real Flower's HTTP API in tests, shared by the Flower and the security tests.

Flower answers HTTP before its event receiver has subscribed, and Celery's events are not
stored: a task that ends in that gap never reaches Flower. :func:`watching_events` closes the gap
by running probe actions until Flower has seen one of them finish."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from tangram_celery.client import TangramClient, command_action
from tangram_celery.observe.flower import FlowerHandle


def flower_json(flower: FlowerHandle, path: str, auth: bool = True) -> Any:
    """``path`` of Flower's API, with its basic auth unless ``auth`` is false."""
    headers = {"Authorization": flower.authorization()} if auth else {}
    request = urllib.request.Request(flower.url + path, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def finished_in_flower(flower: FlowerHandle, ids: list[str], timeout: float = 30.0
                       ) -> dict[str, Any]:
    """Flower's task records of ``ids`` once every one of them succeeded there with a result."""
    deadline = time.monotonic() + timeout
    while True:
        tasks = flower_json(flower, "/api/tasks")
        if all(tasks.get(i, {}).get("state") == "SUCCESS" and tasks[i].get("result")
               for i in ids):
            return {i: tasks[i] for i in ids}
        assert time.monotonic() < deadline, f"Flower lists {sorted(tasks)}, not all of {ids}"
        time.sleep(0.2)


def watching_events(flower: FlowerHandle, client: TangramClient, trajectory: str,
                    timeout: float = 90.0, each: float = 5.0) -> None:
    """Return once Flower records task events: run ``true`` in ``trajectory`` until Flower has
    seen one of these probes succeed (a new probe every ``each`` seconds), then end it."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            probe = client.submit(command_action(trajectory, "true"))
            assert probe.result(timeout=60).ok
            seen = time.monotonic() + each
            while time.monotonic() < seen:
                record = flower_json(flower, "/api/tasks").get(probe.id, {})
                if record.get("state") == "SUCCESS":
                    return
                time.sleep(0.2)
            assert time.monotonic() < deadline, "Flower never saw a task's events"
    finally:
        client.end_trajectory(trajectory)
