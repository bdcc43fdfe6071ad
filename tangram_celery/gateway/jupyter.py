"""SandboxFusion's ``/run_jupyter``: notebook cells in a fresh Jupyter kernel per request.

A request (``cells``, ``cell_timeout``, ``total_timeout``, ``memory_limit_MB``, ``kernel``,
``files``, ``fetch_files``) is one action in a recycled sandbox: a driver program (run in the
warm interpreter) starts a real ``python3`` Jupyter kernel (Debian's ``python3-ipykernel`` and
``python3-jupyter-client``, over unix sockets in the sandbox's ``/tmp``: the sandbox has no
network), runs the cells one by one and prints each cell's ``stdout``, ``stderr``, ``display``
data and ``error`` as JSON. ``total_timeout`` is the action's; a cell past ``cell_timeout``
(0: none) ends the run. As SandboxFusion answers: a driver that finished is ``Success`` with
the cells and the fetched files (a cell that raised is in its ``error``, not a failure); one
that did not (a time-out, a kernel that did not start) is ``Failed`` with the ``driver`` result
and no cells. Pure, but for the driver's text, which runs in the sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tangram_celery.action import ActionResult
from tangram_celery.errors import GatewayRequestError
from tangram_celery.gateway.protocol import (
    FAILED,
    FINISHED,
    SANDBOX_ERROR,
    SUCCESS,
    RunRequest,
    parse_run_request,
)

DEFAULT_TOTAL_TIMEOUT_S = 45.0
DRIVER = r'''
import json, os, sys
os.environ.update(JUPYTER_RUNTIME_DIR="/tmp/jupyter-runtime", IPYTHONDIR="/tmp/ipython",
                  JUPYTER_DATA_DIR="/tmp/jupyter-data", PYDEVD_DISABLE_FILE_VALIDATION="1",
                  JUPYTER_PLATFORM_DIRS="1")
from jupyter_client import KernelManager

manager = KernelManager(kernel_name=KERNEL, transport="ipc", ip="/tmp/tangram-kernel")
manager.start_kernel(extra_arguments=["--HistoryManager.enabled=False"])
client = manager.client()
client.start_channels()
client.wait_for_ready(timeout=60)
cells = []
for index, code in enumerate(CELLS):
    cell = {"stdout": "", "stderr": "", "display": [], "error": []}
    def hook(msg, cell=cell):
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "stream":
            cell[content["name"]] += content["text"]
        elif kind in ("display_data", "execute_result"):
            cell["display"].append(content["data"])
        elif kind == "error":
            cell["error"].append(content)
    try:
        client.execute_interactive(code, output_hook=hook, timeout=CELL_TIMEOUT or None)
    except TimeoutError:
        sys.stderr.write(f"tangram: cell {index} ran past cell_timeout ({CELL_TIMEOUT} s)\n")
        sys.stderr.flush()
        os._exit(124)
    cells.append(cell)
sys.stdout.write("\n" + MARK + json.dumps(cells) + "\n")
sys.stdout.flush()
os._exit(0)
'''
"""The driver the action runs (its constants are prepended)."""
MARK = "TANGRAM-JUPYTER-CELLS:"


@dataclass(frozen=True)
class JupyterRequest:
    """One ``/run_jupyter`` body, checked; ``run`` carries the files, fetch and memory."""

    cells: tuple[str, ...]
    cell_timeout: float = 0.0
    total_timeout: float = DEFAULT_TOTAL_TIMEOUT_S
    kernel: str = "python3"
    run: RunRequest = field(default_factory=lambda: RunRequest("", "python"))


def parse_jupyter_request(body: bytes | str) -> JupyterRequest:
    """Check a ``/run_jupyter`` body; raises :class:`GatewayRequestError` naming the field."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise GatewayRequestError("body", f"not valid JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise GatewayRequestError("body", "expected a JSON object with 'cells'")
    cells = data.get("cells")
    if not isinstance(cells, list) or not all(isinstance(c, str) for c in cells):
        raise GatewayRequestError("cells", "a list of code cells (strings)")
    if data.get("kernel", "python3") != "python3":
        raise GatewayRequestError("kernel", "the only kernel is 'python3'")
    run = parse_run_request(json.dumps({
        "code": "", "language": "python", "run_timeout": data.get("total_timeout", 45),
        "memory_limit_MB": data.get("memory_limit_MB"), "files": data.get("files"),
        "fetch_files": data.get("fetch_files")}))
    cell_timeout = data.get("cell_timeout", 0)
    if isinstance(cell_timeout, bool) or not isinstance(cell_timeout, int | float) \
            or cell_timeout < 0:
        raise GatewayRequestError("cell_timeout", "seconds per cell, 0 for none")
    return JupyterRequest(tuple(cells), float(cell_timeout), run.run_timeout, "python3", run)


def driver_code(request: JupyterRequest) -> str:
    """The program of a request's action: the driver with its cells."""
    return (f"CELLS = {json.dumps(list(request.cells))}\nKERNEL = {json.dumps(request.kernel)}\n"
            f"CELL_TIMEOUT = {request.cell_timeout!r}\nMARK = {json.dumps(MARK)}\n{DRIVER}")


def jupyter_response(result: ActionResult, driver: dict[str, Any] | None,
                     files: Mapping[str, str], executor: str | None) -> dict[str, Any]:
    """SandboxFusion's ``RunJupyterResponse`` from the action's result and its driver step."""
    body: dict[str, Any] = {"status": FAILED, "message": "", "driver": driver, "cells": [],
                            "executor_pod_name": executor, "files": {}}
    if driver is None or driver.get("status") not in (FINISHED, "TimeLimitExceeded"):
        body.update(status=SANDBOX_ERROR, message=(driver or {}).get("stderr") or
                    result.error or "the sandbox could not run the notebook")
        return body
    stdout = str(driver.get("stdout") or "")
    if driver["status"] != FINISHED or driver.get("return_code") != 0 or MARK not in stdout:
        return body
    head, _, cells = stdout.rpartition(MARK)
    driver["stdout"] = head.rstrip("\n")
    body.update(status=SUCCESS, cells=json.loads(cells), files=dict(files))
    return body
