"""SandboxFusion's ``/run_jupyter`` on a real stack: a real Jupyter kernel (Debian's ipykernel)
per request inside the bubblewrap sandbox, its cells' streams, displays and errors, the total
time-out and a fresh kernel each time."""

from __future__ import annotations

import pytest
from conftest import StartGateway, call

from tangram_celery.errors import GatewayRequestError
from tangram_celery.gateway.jupyter import parse_jupyter_request

CELLS = ["a = 123", "a", "print(a)", 'import sys; sys.stderr.write("stderr message")',
         'raise RuntimeError("error message")']


def test_the_request_is_sandboxfusions() -> None:
    request = parse_jupyter_request('{"cells": ["1"], "total_timeout": "9"}')
    assert (request.cells, request.total_timeout, request.cell_timeout) == (("1",), 9.0, 0.0)
    for body, field in (('{"cells": "x"}', "cells"), ('{"cells": [], "kernel": "r"}', "kernel"),
                        ('{"cells": [], "cell_timeout": -1}', "cell_timeout")):
        with pytest.raises(GatewayRequestError) as caught:
            parse_jupyter_request(body)
        assert caught.value.field == field


@pytest.mark.slow
def test_cells_run_in_a_fresh_kernel_with_sandboxfusions_answers(gateway: StartGateway) -> None:
    url = gateway()
    status, body = call(f"{url}/run_jupyter", body={"cells": CELLS, "fetch_files": ["f.txt"],
                                                     "total_timeout": 120})
    assert status == 200 and body["status"] == "Success", body
    cells = body["cells"]
    assert [c["display"] for c in cells[:2]] == [[], [{"text/plain": "123"}]]
    assert cells[2]["stdout"] == "123\n" and cells[3]["stderr"] == "stderr message"
    assert cells[4]["error"][0]["ename"] == "RuntimeError"
    assert body["driver"]["status"] == "Finished" and body["files"] == {}
    status, fresh = call(f"{url}/run_jupyter", body={"cells": ["a"], "total_timeout": 120})
    assert fresh["status"] == "Success" and fresh["cells"][0]["error"][0]["ename"] == "NameError"
    status, slow = call(f"{url}/run_jupyter", body={"cells": ["import time; time.sleep(60)"],
                                                     "total_timeout": 15})
    assert slow["status"] == "Failed" and slow["cells"] == []
    assert slow["driver"]["status"] == "TimeLimitExceeded"
