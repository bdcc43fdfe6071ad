"""A local HTTP API that enforces a rate limit and slows down under load, for tests and benchmarks.

    with RateLimitedService(ServiceLimits(rate_per_s=20, concurrency=4)) as service:
        ...  # call service.url + "/search?q=..."; service.stats() counts 200s and 429s

Every request first passes the provider's limits: a token bucket (``rate_per_s``, size ``burst``)
and a cap on requests in flight; past either it answers ``429`` at once. An admitted request then
needs ``work_s`` seconds of the backend's one shared capacity, which is split evenly among the
requests in flight (processor sharing), plus a fixed ``base_s``: with ``n`` calls overlapping each
takes about ``base_s + n * work_s``, so the API answers slowly under load while its throughput
stays ``1 / work_s``, as a saturated search or judge backend does. A ``delay`` query parameter
(seconds, capped) replaces that with a plain sleep for one call, and ``status`` sets the status
code of the answer (to test errors). The service binds 127.0.0.1 on a
free port and shuts itself down after ``lifetime_s`` even if nobody stops it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True)
class ServiceLimits:
    """The provider's limits and latency model."""

    rate_per_s: float = 20.0
    burst: int = 20
    concurrency: int = 16
    base_s: float = 0.01
    work_s: float = 0.04
    max_delay_s: float = 10.0
    lifetime_s: float = 300.0


@dataclass
class ServiceStats:
    """Counters of what the service answered."""

    requests: int = 0
    ok: int = 0
    rejected_rate: int = 0
    rejected_concurrency: int = 0
    in_flight: int = 0
    max_in_flight: int = 0

    @property
    def rejected(self) -> int:
        """All 429 answers."""
        return self.rejected_rate + self.rejected_concurrency


class _Limiter:
    """The provider-side admission: token bucket plus in-flight cap, under one lock."""

    def __init__(self, limits: ServiceLimits) -> None:
        self.limits = limits
        self.stats = ServiceStats()
        self._lock = threading.Lock()
        self._tokens = float(limits.burst)
        self._stamp = time.monotonic()

    def enter(self) -> tuple[str, int]:
        """Admit one request: ``("", in_flight)`` or the reason it is refused."""
        with self._lock:
            self.stats.requests += 1
            now = time.monotonic()
            rate = self.limits.rate_per_s
            self._tokens = min(float(self.limits.burst), self._tokens + (now - self._stamp) * rate)
            self._stamp = now
            if self.stats.in_flight >= self.limits.concurrency:
                self.stats.rejected_concurrency += 1
                return "concurrency", self.stats.in_flight
            if self._tokens < 1.0:
                self.stats.rejected_rate += 1
                return "rate", self.stats.in_flight
            self._tokens -= 1.0
            self.stats.in_flight += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
            return "", self.stats.in_flight

    def leave(self) -> None:
        """A request finished (counted before its answer is sent)."""
        with self._lock:
            self.stats.in_flight -= 1
            self.stats.ok += 1

    def snapshot(self) -> ServiceStats:
        """A copy of the counters."""
        with self._lock:
            return ServiceStats(**asdict(self.stats))


class _SharedCapacity:
    """Processor sharing: every request in service advances at ``1 / n`` of full speed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._left: dict[int, float] = {}
        self._stamp = time.monotonic()
        self._next = 0

    def serve(self, work_s: float, stop: threading.Event) -> None:
        """Block until ``work_s`` seconds of full-speed work are done (or ``stop`` is set)."""
        with self._cond:
            self._advance()
            key, self._next = self._next, self._next + 1
            self._left[key] = work_s
            self._cond.notify_all()
            while self._left[key] > 1e-6 and not stop.is_set():
                self._cond.wait(min(self._left.values()) * len(self._left) + 1e-4)
                self._advance()
            del self._left[key]
            self._cond.notify_all()

    def _advance(self) -> None:
        now = time.monotonic()
        if self._left:
            share = (now - self._stamp) / len(self._left)
            for key in self._left:
                self._left[key] = max(self._left[key] - share, 0.0)
        self._stamp = now


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _answer(self) -> None:
        length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY_BYTES)
        body = self.rfile.read(length) if length else b""
        limiter = self.server.limiter
        refused, in_flight = limiter.enter()
        if refused:
            self._send(429, {"error": f"too many requests ({refused} limit)"})
            return
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        started = time.monotonic()
        limits = limiter.limits
        try:
            delay = min(max(float(query["delay"]), 0.0), limits.max_delay_s)
        except (KeyError, ValueError):
            self.server.stopping.wait(limits.base_s)
            self.server.capacity.serve(limits.work_s, self.server.stopping)
        else:
            self.server.stopping.wait(delay)
        delay = time.monotonic() - started
        limiter.leave()
        self._send(_status(query.get("status", "200")), {
            "path": parts.path, "query": query, "in_flight": in_flight, "delay_s": delay,
            "body_bytes": len(body),
            "results": [f"result {k} for {query.get('q', '')}" for k in range(3)],
        })

    def _send(self, status: int, data: dict[str, Any]) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


def _status(raw: str) -> int:
    try:
        code = int(raw)
    except ValueError:
        return 400
    return code if 200 <= code <= 599 else 400


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, limits: ServiceLimits) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.limiter = _Limiter(limits)
        self.capacity = _SharedCapacity()
        self.stopping = threading.Event()


class RateLimitedService:
    """Run the rate-limited API in background threads; a context manager."""

    def __init__(self, limits: ServiceLimits | None = None) -> None:
        self.limits = limits or ServiceLimits()
        self._server: _Server | None = None
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        """Base URL, ``http://127.0.0.1:PORT``."""
        if self._server is None:
            raise RuntimeError("the service is not running; use it as a context manager")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> str:
        """Bind a free port, start serving and the self-stop timer; returns the base URL."""
        self._server = _Server(self.limits)
        serve = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                 name="ratelimited-http", daemon=True)
        timer = threading.Thread(target=self._expire, name="ratelimited-timer", daemon=True)
        self._threads = [serve, timer]
        for thread in self._threads:
            thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving (idempotent); requests still sleeping are answered at once."""
        server = self._server
        if server is None or server.stopping.is_set():
            return
        server.stopping.set()
        server.shutdown()
        server.server_close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    def stats(self) -> ServiceStats:
        """What the service has answered so far."""
        if self._server is None:
            return ServiceStats()
        return self._server.limiter.snapshot()

    def __enter__(self) -> RateLimitedService:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _expire(self) -> None:
        server = self._server
        if server is not None and not server.stopping.wait(self.limits.lifetime_s):
            self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the rate-limited API on 127.0.0.1 until its lifetime ends (or Ctrl-C)."""
    parser = argparse.ArgumentParser(prog="python -m tangram_bench.ratelimited")
    defaults = ServiceLimits()
    parser.add_argument("--rate", type=float, default=defaults.rate_per_s)
    parser.add_argument("--burst", type=int, default=defaults.burst)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--lifetime", type=float, default=60.0)
    args = parser.parse_args(argv)
    limits = ServiceLimits(rate_per_s=args.rate, burst=args.burst, concurrency=args.concurrency,
                           lifetime_s=args.lifetime)
    with RateLimitedService(limits) as service:
        print(service.url, flush=True)
        deadline = time.monotonic() + args.lifetime
        try:
            while time.monotonic() < deadline:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        print(json.dumps(asdict(service.stats())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
