"""The comparison point of the overhead and gateway benchmarks: a subprocess-per-request HTTP
server with no isolation and no queue, as SandboxFusion runs without its isolation.

    python -m tangram_bench.baseline [--port 0]

It speaks SandboxFusion's ``POST /run_code`` (fields ``code``, ``language`` in python, bash or
cpp, ``stdin``, ``compile_timeout``, ``run_timeout``) and answers in SandboxFusion's shape. Every
request starts its process at once, on a thread of its own: nothing waits for a core. It listens
on loopback only and takes no credentials; it is a benchmark baseline, not a service.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from tangram_celery.errors import ServiceError
from tangram_celery.processes import free_port, stop_process

LOOPBACK = "127.0.0.1"
SPLIT_KEY = "_split"
"""Where :func:`run_code` puts a tangram gateway's ``X-Tangram-Timings`` (seconds per part)."""
SOURCE_FILES = {"python": "main.py", "bash": "main.sh", "cpp": "main.cpp"}


def run_command(argv: list[str], stdin: str | None, timeout: float, cwd: Path) -> dict[str, Any]:
    """One process, run to its end or its timeout, as a SandboxFusion ``CommandRunResult``."""
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, input=(stdin or "").encode(), capture_output=True,
                              timeout=timeout, cwd=cwd, check=False)
    except subprocess.TimeoutExpired as expired:
        return {"status": "TimeLimitExceeded", "execution_time": time.perf_counter() - start,
                "return_code": None, "stdout": _text(expired.stdout),
                "stderr": _text(expired.stderr)}
    return {"status": "Finished", "execution_time": time.perf_counter() - start,
            "return_code": done.returncode, "stdout": _text(done.stdout),
            "stderr": _text(done.stderr)}


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def respond(request: dict[str, Any]) -> dict[str, Any]:
    """The SandboxFusion response to one ``/run_code`` request, run without isolation."""
    language = request.get("language", "python")
    if language not in SOURCE_FILES:
        return _answer("SandboxError", f"language {language!r}: the baseline runs "
                       f"{', '.join(SOURCE_FILES)}", None, None)
    run_timeout = float(request.get("run_timeout") or 10)
    with tempfile.TemporaryDirectory(prefix="tangram-baseline-") as tmp:
        cwd = Path(tmp)
        source = cwd / SOURCE_FILES[language]
        source.write_text(str(request.get("code", "")))
        compiled = None
        if language == "cpp":
            compiled = run_command(["g++", "-O2", "-o", "main", source.name], None,
                                   float(request.get("compile_timeout") or 10), cwd)
            if compiled["status"] != "Finished" or compiled["return_code"] != 0:
                return _answer("Failed", "", compiled, None)
        argv = {"python": [sys.executable, source.name], "bash": ["bash", source.name],
                "cpp": ["./main"]}[language]
        ran = run_command(argv, request.get("stdin"), run_timeout, cwd)
    ok = ran["status"] == "Finished" and ran["return_code"] == 0
    return _answer("Success" if ok else "Failed", "", compiled, ran)


def _answer(status: str, message: str, compiled: dict[str, Any] | None,
            ran: dict[str, Any] | None) -> dict[str, Any]:
    return {"status": status, "message": message, "compile_result": compiled,
            "run_result": ran, "executor_pod_name": None, "files": {}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/v1/ping":
            self._send(200, "pong")
        else:
            self._send(404, {"error": f"{self.path}: the baseline serves POST /run_code"})

    def do_POST(self) -> None:
        if self.path != "/run_code":
            self._send(404, {"error": f"{self.path}: the baseline serves POST /run_code"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError as error:
            self._send(400, {"error": f"request body is not JSON: {error}"})
            return
        self._send(200, respond(request))

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


def serve(port: int) -> None:
    """Serve on loopback until killed, printing the bound port first."""
    server = _Server((LOOPBACK, port), _Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


@dataclass
class BaselineServer:
    """A running baseline server process; ``url`` is its ``http://127.0.0.1:PORT``."""

    url: str
    process: subprocess.Popen[bytes]

    def __enter__(self) -> BaselineServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server process."""
        stop_process(self.process)


def start_baseline(timeout: float = 30.0) -> BaselineServer:
    """Start the baseline in a process of its own and wait until it answers ``/v1/ping``."""
    port = free_port(LOOPBACK)
    process = subprocess.Popen([sys.executable, "-m", "tangram_bench.baseline",
                                "--port", str(port)], stdout=subprocess.DEVNULL)
    server = BaselineServer(f"http://{LOOPBACK}:{port}", process)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{server.url}/v1/ping", timeout=1):  # nosec B310 # http URL built here
                return server
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                server.close()
                raise ServiceError(f"the baseline server on port {port} did not start "
                                   f"within {timeout:.0f} s") from None
            time.sleep(0.05)


def run_code(url: str, request: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """POST one ``/run_code`` request to a SandboxFusion-shaped server; its JSON answer."""
    body = json.dumps(request).encode()
    call = urllib.request.Request(f"{url}/run_code", data=body, method="POST",
                                  headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(call, timeout=timeout) as answer:  # nosec B310 # a caller-given http URL
        result: dict[str, Any] = json.loads(answer.read())
        split = answer.headers.get("X-Tangram-Timings")
    if split:
        result[SPLIT_KEY] = json.loads(split)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the baseline (the benchmarks start it with ``start_baseline``)."""
    parser = argparse.ArgumentParser(prog="python -m tangram_bench.baseline")
    parser.add_argument("--port", type=int, default=0)
    serve(parser.parse_args(argv).port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
