"""The ACT log on plain data: the pool of a queue, the worker's view of a result, its record."""

from __future__ import annotations

import pytest

from tangram_celery import keys
from tangram_celery.tasks.actlog import ActRecord, act_record, pool_of_queue, worker_view


def test_pool_of_queue() -> None:
    assert pool_of_queue(keys.cpu_queue("n1")) == "cpu"
    assert pool_of_queue(keys.gpu_queue("big")) == "gpu/big"
    assert pool_of_queue(keys.api_queue("search")) == "api/search"
    assert pool_of_queue(keys.control_queue()) == "control"
    assert pool_of_queue("celery") == "other"


def worker_result() -> dict[str, object]:
    return {
        "action_id": "a1", "trajectory_id": "t1", "kind": "exec", "status": "ok",
        "output": {"stdout": "x" * 5000}, "node": "n1", "units": [0], "error": "",
        "attempts": 1, "act": {"queue": 1.7e9, "exec": 0.5, "overhead": 0.0, "total": 1.7e9},
        "timings": {"received": 100.2, "admitted": 100.5, "exec_started": 100.6,
                    "exec_finished": 101.1, "stored": 101.2, "exec_s": 0.5},
    }


def test_worker_view_stamps_submit_time_and_puts_act_first() -> None:
    viewed = worker_view(worker_result(), {"id": "a1", "submitted_at": 100.0})
    assert viewed["act"] == pytest.approx({"queue": 0.5, "exec": 0.5, "overhead": 0.2,
                                           "total": 1.2})
    assert list(viewed)[:5] == ["action_id", "trajectory_id", "kind", "status", "act"]
    assert list(viewed)[-2:] == ["output", "timings"]
    assert repr(viewed)[:1024].count("'total'") == 1, "Flower's 1024-char repr keeps the ACT"
    no_stamp = worker_view(worker_result(), {"id": "a1"})
    assert no_stamp["act"]["total"] == pytest.approx(1.0), "falls back to the receive time"
    assert worker_view({"not": "a result"}, {}) == {"not": "a result"}


def test_act_record_round_trips() -> None:
    viewed = worker_view(worker_result(), {"submitted_at": 100.0})
    record = act_record(viewed, keys.cpu_queue("n1"))
    decoded = ActRecord.decode({k.encode(): v.encode() for k, v in record.items()})
    assert decoded == ActRecord("exec", "cpu", "tangram.cpu.n1", "n1", "ok", 0.5, 0.5, 0.2, 1.2,
                                101.2, viewed["action_id"])
    older = {k.encode(): v.encode() for k, v in record.items() if k != "action_id"}
    assert ActRecord.decode(older) == ActRecord(**{**vars(decoded), "action_id": ""})
    assert ActRecord.decode({b"kind": b"exec"}) is None
