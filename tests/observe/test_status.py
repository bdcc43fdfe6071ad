"""``tangram status``: the tables on plain data, then on a real cluster (workers, a published GPU
pool, queued messages), and one clear line when Redis is down."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import redis
from rich.console import Console

from tangram_celery import keys
from tangram_celery.errors import BrokerUnreachable
from tangram_celery.observe.status import (
    StatusData,
    consumers_by_queue,
    print_status,
    render_status,
)
from tangram_celery.pools.inventory import (
    ApiPoolView,
    GpuPoolView,
    Inventory,
    QueueDepth,
    Resident,
)
from tangram_celery.pools.registry import NodeView
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import make_app

CpuWorkers = Callable[..., list[str]]


def rendered(data: StatusData) -> str:
    console = Console(record=True, width=180)
    console.print(render_status(data))
    return console.export_text()


def rows(text: str) -> dict[str, list[str]]:
    """Table rows by their first or second cell."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = line.split()
        if cells:
            out.setdefault(cells[0], cells)
    return out


def test_render_shows_pools_members_depths_and_residents() -> None:
    inventory = Inventory(
        at=time.time(),
        nodes=(NodeView("n1", 4, 1, 8192, 1024, alive=True),
               NodeView("n2", 2, 2, 4096, 0, alive=False)),
        gpu_pools=(GpuPoolView("big", 8, 5, True, "gpu-big@h", ("rm", "judge"),
                               (Resident("rm", (0, 1)), Resident("judge", (4,)))),),
        api_pools=(ApiPoolView("search", 4, 3, 2, "10/1s"),),
        queues=(QueueDepth(keys.cpu_queue("n1"), "cpu", ((0, 2), (5, 1)), unacked=3),
                QueueDepth(keys.gpu_queue("big"), "gpu/big", ((0, 4),), unacked=1),
                QueueDepth(keys.api_queue("search"), "api/search", ((0, 0),), unacked=2)),
    )
    consumers = consumers_by_queue({"cpu-n1@h": [{"name": keys.cpu_queue("n1")}],
                                    "gpu-big@h": [{"name": keys.gpu_queue("big")}]})
    text = rendered(StatusData(inventory, consumers, inspected=True, broker="r:6379/0"))
    table = rows(text)
    assert table["cpu"][1:8] == ["1/2", "4", "3", "1", "3", "3", "cpu-n1@h"]
    assert table["n1"][:7] == ["n1", "yes", "4", "3", "1", "3", "3"]
    assert table["n2"][:3] == ["n2", "NO", "2"]
    assert table["gpu/big"][1:8] == ["1/1", "8", "3", "5", "4", "1", "gpu-big@h"]
    assert "resident: rm@[0, 1], judge@[4]" in text
    assert table["api/search"][1:7] == ["4", "3", "1", "0", "2", "no"]
    assert "quota 10/1s, 2 waiting for slots" in text
    assert table["tangram.cpu.n1"][-2:] == ["p0=2", "p5=1"]
    assert "no GPU pool publishes" not in text


def test_render_says_what_is_not_published() -> None:
    inventory = Inventory(time.time(), (), (), (), ())
    text = rendered(StatusData(inventory, {}, inspected=True))
    assert "no GPU pool publishes its inventory" in text
    assert "no Celery worker answered" in text


@pytest.mark.slow
def test_status_of_a_real_cluster(settings: Settings, cpu_workers: CpuWorkers,
                                  redis_client: redis.Redis) -> None:
    cpu_workers({"st-a": 2})
    redis_client.sadd(keys.GPU_POOLS, "small")
    redis_client.hset(keys.gpu_pool("small"), mapping={
        "gpus": 2, "free_gpus": 1, "heartbeat": time.time(), "worker": "gpu-small@h",
        "models": json.dumps(["rm"]), "residents": json.dumps([{"model": "rm", "gpus": [1]}]),
    })
    app = make_app(settings)
    for priority in (0, 4, 4):
        app.send_task(keys.task_name("reward"), args=[{}], queue=keys.gpu_queue("small"),
                      priority=priority)
    console = Console(record=True, width=180)
    data = print_status(settings, console=console)
    text = console.export_text()
    table = rows(text)
    assert data.inspected and any(w.startswith("cpu-st-a@") for w in
                                  data.consumers[keys.cpu_queue("st-a")])
    assert table["st-a"][:6] == ["st-a", "yes", "2", "0", "2", "0"]
    assert table["cpu"][7].startswith("cpu-st-a@")
    assert table["gpu/small"][1:7] == ["1/1", "2", "1", "1", "3", "0"]
    assert "resident: rm@[1]" in text
    assert table["tangram.gpu.small"][2:] == ["3", "0", "p0=1", "p4=2"]


def test_status_without_redis_is_one_clear_line(settings: Settings) -> None:
    with pytest.raises(BrokerUnreachable) as raised:
        print_status(settings.with_(redis_url="redis://:secret@127.0.0.1:1/0"),
                     console=Console(record=True))
    message = str(raised.value)
    assert "\n" not in message and "secret" not in message
    assert message.startswith("cannot reach the broker (Redis) at 127.0.0.1:1/0")
    assert "TANGRAM_REDIS_URL" in message
