"""OpenRLHF's remote reward API on the GPU pool: ``POST /get_reward``.

OpenRLHF trainers given ``--remote_rm_url http://HOST:PORT/get_reward`` post
``{"query": [...], "prompts": [...], "labels": [...]}`` (one entry per sample) and read
``rewards`` (and ``scores``, ``extra_logs``) back. :class:`RewardService` answers with one
reward action on the GPU pool per request, every sample a row of it (the Triton model batches
them): the model is ``TANGRAM_GATEWAY_REWARD_MODEL``, each query its ``response`` and each label
its ``reference``. :func:`parse_reward_request` checks the body (pure).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tangram_celery.client import TangramClient
from tangram_celery.errors import GatewayRequestError, ServiceError
from tangram_celery.pools.gpu_pool import reward_action

MAX_SAMPLES = 4096


@dataclass(frozen=True)
class RewardRequest:
    """One ``/get_reward`` body: the samples' queries, prompts and labels."""

    queries: tuple[str, ...]
    prompts: tuple[str, ...]
    labels: tuple[str, ...]


def parse_reward_request(body: bytes | str) -> RewardRequest:
    """Check a ``/get_reward`` body; raises :class:`GatewayRequestError` naming the field."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise GatewayRequestError("body", f"not valid JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise GatewayRequestError("body", "expected a JSON object with 'query'")
    queries = _texts("query", data.get("query"))
    if not queries:
        raise GatewayRequestError("query", "a non-empty list of texts (the samples)")
    prompts = _texts("prompts", data.get("prompts"), len(queries))
    labels = _texts("labels", data.get("labels"), len(queries))
    return RewardRequest(queries, prompts, labels)


def _texts(name: str, raw: Any, count: int | None = None) -> tuple[str, ...]:
    if raw is None and count is not None:
        return ("",) * count
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(t, str | None) for t in raw):
        raise GatewayRequestError(name, "expected a list of texts")
    if len(raw) > MAX_SAMPLES:
        raise GatewayRequestError(name, f"at most {MAX_SAMPLES} samples per request")
    if count is not None and len(raw) != count:
        raise GatewayRequestError(name, f"{len(raw)} entries for {count} queries")
    return tuple(t or "" for t in raw)


class RewardService:
    """Answers ``/get_reward`` with reward actions through the real client; thread-safe."""

    def __init__(self, client: TangramClient, model: str, wait_s: float) -> None:
        self.client = client
        self.model = model
        self.wait_s = wait_s

    def rewards(self, request: RewardRequest) -> dict[str, Any]:
        """OpenRLHF's response: ``rewards`` and ``scores`` (one float per query) and
        ``extra_logs``. Raises :class:`ServiceError` when the GPU pool cannot answer."""
        action = reward_action(f"gw-reward-{uuid.uuid4().hex}", self.model,
                               {"response": list(request.queries),
                                "reference": list(request.labels)})
        started = time.monotonic()
        result = self.client.submit(action).result(self.wait_s)
        if not result.ok:
            raise ServiceError(f"the reward model {self.model!r} failed: "
                               f"{result.error or result.status}")
        raw: Any = result.output.get("reward")
        values: list[Any] = raw if isinstance(raw, list) else [raw]
        rewards = [float(v[0] if isinstance(v, list) else v) for v in values]
        if len(rewards) != len(request.queries):
            raise ServiceError(f"the reward model {self.model!r} gave {len(rewards)} rewards "
                               f"for {len(request.queries)} queries")
        return {"rewards": rewards, "scores": rewards,
                "extra_logs": {"tangram_act_s": [result.act["total"]] * len(rewards),
                               "tangram_wait_s": [time.monotonic() - started] * len(rewards)}}
