"""A mixed batch of CPU and reward actions for the local-stack tests (``tangram up`` and
docker compose), the checks of its results, and Flower's task list."""

from __future__ import annotations

import base64
import json
import urllib.request

from tangram_celery.action import Action, ActionResult
from tangram_celery.client import code_action
from tangram_celery.pools.gpu_pool import reward_action


def flower_tasks(port: int, password: str) -> dict[str, object]:
    """Flower's ``/api/tasks`` with basic auth (user ``tangram``)."""
    token = base64.b64encode(f"tangram:{password}".encode()).decode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/tasks",
                                     headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:  # nosec B310 # loopback URL built here
        return dict(json.load(response))


def mixed_batch(prefix: str) -> list[Action]:
    """Four code actions on the CPU node and four reward actions on the GPU pool."""
    actions = [code_action(f"{prefix}-c{i}", f"print({i} * {i})") for i in range(4)]
    actions += [reward_action(f"{prefix}-r{i}", "answer_match",
                              {"response": str(i), "reference": "2"}) for i in range(3)]
    actions.append(reward_action(f"{prefix}-s", "semantic_similarity",
                                 {"response": "a cat sat on the mat",
                                  "reference": "a cat is sitting on the mat"}))
    return actions


def check_batch_results(results: list[ActionResult]) -> None:
    """Every result came back ok with the output its action implies."""
    assert len(results) == 8
    for result in results:
        assert result.ok, f"{result.kind} {result.status}: {result.error} {result.output}"
    stdouts = [r.output["stdout"] for r in results[:4]]
    assert stdouts == [f"{i * i}\n" for i in range(4)]
    rewards = [r.output["reward"] for r in results[4:7]]
    assert rewards == [0.0, 0.0, 1.0]
    assert 0.5 < results[7].output["reward"] <= 1.0
