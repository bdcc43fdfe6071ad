"""OpenRLHF's remote reward API on a real stack: the gateway's ``POST /get_reward`` with the
payload OpenRLHF's trainer posts (``query``, ``prompts``, ``labels``), answered by one reward
action on a real GPU pool worker over a real tritonserver (the ``answer_match`` model); OpenRLHF
itself needs GPU packages to install, so its documented payload is sent as its client sends it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import StartGateway, call

from tangram_celery.errors import GatewayRequestError
from tangram_celery.gateway.reward import parse_reward_request
from tangram_celery.pools.gpu_pool import worker_name
from tangram_celery.pools.launch import spawn_gpu_worker, wait_for_worker
from tangram_celery.processes import stop_process
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import make_app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def gpu_pool(settings: Settings, triton_server: Any, tmp_path: Path) -> Iterator[str]:
    env = {"TANGRAM_REDIS_URL": settings.broker.redis_url,
           "TANGRAM_TRITON_URL": triton_server.http_url,
           "TANGRAM_TRITON_REPOSITORY": str(ROOT / "triton_models")}
    process = spawn_gpu_worker(env, "default", 2, tmp_path / "gpu.log")
    try:
        wait_for_worker(make_app(settings), worker_name("default", process.pid), process)
        yield "default"
    finally:
        stop_process(process, timeout=30)


def test_the_payload_is_checked_and_prompts_and_labels_may_be_left_out() -> None:
    request = parse_reward_request('{"query": ["a", "b"]}')
    assert request.labels == ("", "") and request.prompts == ("", "")
    for body, field in (('{"query": []}', "query"), ('{"query": ["a"], "labels": []}', "labels"),
                        ('{"query": [1]}', "query"), ("[1]", "body")):
        with pytest.raises(GatewayRequestError) as caught:
            parse_reward_request(body)
        assert caught.value.field == field


@pytest.mark.slow
def test_openrlhfs_get_reward_is_scored_on_the_gpu_pool(gateway: StartGateway,
                                                         gpu_pool: str) -> None:
    url = gateway(token="tok")
    payload = {"query": ["so the answer is \\boxed{42}", "#### 7", "no idea"],
               "prompts": ["q1", "q2", "q3"], "labels": ["42", "8", "5"]}
    status, body = call(f"{url}/get_reward?token=tok", body=payload)
    assert status == 200, body
    assert body["rewards"] == [1.0, 0.0, 0.0] == body["scores"]
    assert set(body["extra_logs"]) >= {"tangram_act_s"}
    assert call(f"{url}/get_reward", body=payload)[0] == 401
    status, bad = call(f"{url}/get_reward?token=tok", body={"query": "x", "labels": ["a", "b"]})
    assert status == 422 and bad["field"] == "labels"
