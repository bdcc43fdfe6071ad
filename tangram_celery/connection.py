"""Every Redis connection of tangram-celery is made here: plain or Sentinel-managed, with the
retries and the durability a failover asks for.

* :func:`connect` gives a client for the broker settings. With a ``sentinel://`` URL it is
  Sentinel-managed: each new connection asks the Sentinels for the current primary, so a client
  follows the primary across a failover (a connection still open to a demoted primary is
  dropped on its first ``READONLY`` reply).
* A command is retried while Redis fails over (for ``TANGRAM_REDIS_RETRY_S``) only when sending
  it twice does no harm: reads, writes of absolute values (``SET``, ``HSET``, ``SADD``,
  ``ZADD``, ``DEL``, ``EXPIRE``, ...), ``WAIT``, and Lua scripts declared with
  :func:`idempotent`. Counters, list pushes, stream appends and other scripts are sent once and
  their callers decide. A pipeline is retried when every command in it may be.
* :func:`durable` runs writes that must outlive a failover followed by ``WAIT`` for
  ``TANGRAM_REDIS_WAIT_REPLICAS`` replicas on the same connection, and counts what it covered
  (:data:`DURABILITY`).
* :func:`celery_options` configures Celery's broker and result backend for the same Redis.

A ``sentinel://`` URL names the Sentinels, ``sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/DB``
(kombu's ``sentinel://H1:P1;sentinel://H2:P2`` form is read too); its password is the data
nodes', the Sentinels' own is ``TANGRAM_REDIS_SENTINEL_PASSWORD``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.retry import Retry
from redis.sentinel import Sentinel

from tangram_celery.errors import ConfigError
from tangram_celery.settings import BrokerSettings

log = logging.getLogger(__name__)

SENTINEL_PORT = 26379
CONNECT_TIMEOUT_S = 2.0
SENTINEL_TIMEOUT_S = 1.0
HEALTH_CHECK_S = 2
RETRY_DELAY_MAX_S = 1.0
REPLICAS_FRESH_S = 1.0

SAFE_COMMANDS = frozenset({
    "GET", "MGET", "EXISTS", "TTL", "PTTL", "TYPE", "STRLEN", "HGET", "HMGET", "HGETALL",
    "HEXISTS", "HLEN", "HKEYS", "HVALS", "SMEMBERS", "SISMEMBER", "SCARD", "ZRANGE",
    "ZRANGEBYSCORE", "ZREVRANGE", "ZREVRANGEBYSCORE", "ZSCORE", "ZMSCORE", "ZRANK", "ZREVRANK",
    "ZCARD", "ZCOUNT", "LRANGE", "LLEN", "LINDEX", "XRANGE", "XREVRANGE", "XLEN", "XREAD",
    "XINFO", "SCAN", "SSCAN", "HSCAN", "ZSCAN", "KEYS", "PING", "TIME", "INFO", "ROLE", "DBSIZE",
    "ECHO", "SELECT", "CLIENT", "SCRIPT", "WAIT", "SET", "SETEX", "PSETEX", "SETNX", "MSET",
    "DEL", "UNLINK", "EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT", "PERSIST", "HSET", "HMSET",
    "HSETNX", "HDEL", "SADD", "SREM", "ZADD", "ZREM", "ZREMRANGEBYSCORE", "ZREMRANGEBYRANK",
    "LTRIM", "XTRIM"
})
"""Commands that do no harm when sent twice (a reply lost to a failover is then retried)."""
_SAFE_SCRIPTS: set[str] = set()
_RETRYABLE = (redis.ConnectionError, redis.TimeoutError)
_NEVER_RETRY = (redis.AuthenticationError, redis.exceptions.AuthorizationError)


def idempotent(script: str) -> str:
    """Declare a Lua script safe to run twice (its second run changes nothing); returns it."""
    _SAFE_SCRIPTS.add(hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest())
    return script


def is_safe(args: tuple[Any, ...]) -> bool:
    """Whether a command (its name and arguments) may be sent again after a lost reply."""
    name = str(args[0]).upper() if args else ""
    if name == "EVALSHA" and len(args) > 1:
        return str(args[1]) in _SAFE_SCRIPTS
    if name == "EVAL" and len(args) > 1:
        text = args[1] if isinstance(args[1], bytes) else str(args[1]).encode()
        return hashlib.sha1(text, usedforsecurity=False).hexdigest() in _SAFE_SCRIPTS
    if name == "ZADD":
        return not any(str(a).upper() == "INCR" for a in args[2:] if isinstance(a, str))
    return name.split(" ")[0] in SAFE_COMMANDS


@dataclass(frozen=True)
class Policy:
    """How a client retries and waits: seconds to retry safe commands, replicas to ``WAIT``
    for (0: none) and the longest wait (ms)."""

    retry_s: float = 0.0
    wait_replicas: int = 0
    wait_ms: int = 0


def _retrying(policy: Policy, safe: bool, call: Callable[[], Any],
              again: Callable[[], None] = lambda: None) -> Any:
    """``call()``, repeated while it fails to reach Redis if ``safe`` (``again`` runs before
    each repeat), for up to ``policy.retry_s`` seconds."""
    deadline = time.monotonic() + policy.retry_s
    delay = 0.05
    while True:
        try:
            return call()
        except _NEVER_RETRY:
            raise
        except _RETRYABLE:
            if not safe or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, RETRY_DELAY_MAX_S)
            again()


class TangramPipeline(Pipeline):
    """A pipeline retried as a whole when every command it holds is safe to repeat. Before a
    retry it gives its connection back: a pipeline that failed while loading its scripts keeps
    it, and redis-py reconnects a kept connection to the address it had, not to the primary
    the Sentinels name now."""

    policy = Policy()

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack, scripts = list(self.command_stack), set(self.scripts)
        safe = all(is_safe(tuple(args)) for args, _ in stack)

        def restore() -> None:
            self.reset()
            self.command_stack, self.scripts = list(stack), set(scripts)

        return list(_retrying(self.policy, safe, lambda: super(TangramPipeline, self).execute(
            raise_on_error), restore))


class TangramRedis(redis.Redis):
    """A redis-py client that retries only what is safe to repeat (see the module)."""

    policy = Policy()
    _replicas: tuple[int, float] = (-1, 0.0)

    def replicas(self) -> int:
        """The replicas connected to the primary now (``INFO replication``, read again when
        older than :data:`REPLICAS_FRESH_S`)."""
        count, at = self._replicas
        if time.monotonic() - at > REPLICAS_FRESH_S:
            count = int(self.info("replication").get("connected_slaves", 0))
            self._replicas = (count, time.monotonic())
        return count

    def execute_command(self, *args: Any, **options: Any) -> Any:
        send: Callable[..., Any] = super().execute_command
        return _retrying(self.policy, is_safe(args), lambda: send(*args, **options))

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> TangramPipeline:
        pipe = TangramPipeline(self.connection_pool, self.response_callbacks, transaction,
                               shard_hint)
        pipe.policy = self.policy
        return pipe


@dataclass(frozen=True)
class Address:
    """A Redis URL taken apart: the hosts (the Sentinels, for a ``sentinel://`` URL), the
    credentials and the database."""

    scheme: str
    hosts: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    db: int


def is_sentinel(url: str) -> bool:
    """Whether ``url`` names a Sentinel-managed Redis."""
    return urlsplit(url.strip()).scheme == "sentinel"


def parse_url(url: str) -> Address:
    """Read a ``sentinel://`` URL (either form, see the module) or a ``redis://`` one."""
    chunks = [c for c in url.split(";") if c.strip()]
    hosts: list[tuple[str, int]] = []
    username = password = None
    scheme = ""
    db = 0
    for number, chunk in enumerate(chunks):
        parts = urlsplit(chunk.strip())
        auth, _, hostlist = parts.netloc.rpartition("@")
        if number == 0:
            scheme = parts.scheme
            user, _, secret = auth.partition(":")
            username, password = unquote(user) or None, unquote(secret) or None
        path = parts.path.strip("/")
        if path:
            if not path.isdigit():
                raise ConfigError(f"Redis URL: database {path!r} is not a number")
            db = int(path) if number == 0 or db == 0 else db
        for host in filter(None, hostlist.split(",")):
            name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
            default = SENTINEL_PORT if scheme == "sentinel" else 6379
            if port and not port.isdigit():
                raise ConfigError(f"Redis URL: port {port!r} of {name!r} is not a number")
            hosts.append((name or host, int(port) if port else default))
    if not chunks:
        raise ConfigError("the Redis URL is empty: set TANGRAM_REDIS_URL")
    return Address(scheme, tuple(hosts), username, password, db)


def kombu_url(url: str) -> str:
    """The URL in the form Celery and kombu read: a ``sentinel://`` URL as one
    ``sentinel://HOST:PORT/DB`` per Sentinel joined by ``;`` (the password on the first)."""
    if not is_sentinel(url):
        return url
    address = parse_url(url)
    auth = ""
    if address.password:
        auth = f"{quote(address.username or '', safe='')}:{quote(address.password, safe='')}@"
    return ";".join(f"sentinel://{auth if i == 0 else ''}{host}:{port}/{address.db}"
                    for i, (host, port) in enumerate(address.hosts))


def _sentinel_kwargs(broker: BrokerSettings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"socket_timeout": SENTINEL_TIMEOUT_S,
                              "socket_connect_timeout": SENTINEL_TIMEOUT_S}
    if broker.sentinel_password:
        kwargs["password"] = broker.sentinel_password
    return kwargs


def connect(broker: BrokerSettings, url: str | None = None, *, timeout_s: float | None = None,
            retry_s: float | None = None, **kwargs: Any) -> redis.Redis:
    """A client of the Redis at ``url`` (default ``TANGRAM_REDIS_URL``), Sentinel-managed for a
    ``sentinel://`` URL; ``timeout_s`` and ``retry_s`` override the settings' (a heartbeat
    retries nothing: the next beat is its retry). Opens no connection yet."""
    url = url or broker.redis_url
    timeout = broker.timeout_s if timeout_s is None else timeout_s
    options: dict[str, Any] = {
        "socket_timeout": timeout, "socket_connect_timeout": min(timeout, CONNECT_TIMEOUT_S),
        "socket_keepalive": True, "health_check_interval": HEALTH_CHECK_S,
        "retry": Retry(NoBackoff(), 0), **kwargs,
    }
    sentinel = is_sentinel(url)
    policy = Policy(broker.retry_s if retry_s is None else retry_s,
                    broker.wait_replicas if sentinel else 0, broker.wait_ms)
    if not sentinel:
        client = TangramRedis.from_url(url, **options)
    else:
        address = parse_url(url)
        manager = Sentinel(list(address.hosts), sentinel_kwargs=_sentinel_kwargs(broker),
                           **options)
        client = manager.master_for(broker.master_name, redis_class=TangramRedis,
                                    username=address.username, password=address.password,
                                    db=address.db)
    assert isinstance(client, TangramRedis)
    client.policy = policy
    return client


def sentinel_client(broker: BrokerSettings, host: str, port: int,
                    timeout_s: float = SENTINEL_TIMEOUT_S) -> redis.Redis:
    """A client of one Sentinel itself (for its healthcheck), with its password."""
    return redis.Redis(host=host, port=port, password=broker.sentinel_password or None,
                       socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def celery_options(broker: BrokerSettings) -> dict[str, Any]:
    """Celery settings for the broker and result backend at the settings' Redis: the URLs in
    kombu's form, the socket timeouts and health checks that notice a dead primary, results
    stored again after a connection error (for about ``TANGRAM_REDIS_RETRY_S``), and for a
    Sentinel-managed Redis the master name and the Sentinels' credentials. The transport option
    dicts are to be merged into tangram's own."""
    transport: dict[str, Any] = {
        "socket_timeout": broker.timeout_s,
        "socket_connect_timeout": min(broker.timeout_s, CONNECT_TIMEOUT_S),
        "socket_keepalive": True,
        "health_check_interval": HEALTH_CHECK_S,
    }
    backend: dict[str, Any] = {}
    for url, options in ((broker.redis_url, transport), (broker.result_backend_url, backend)):
        if is_sentinel(url):
            options.update(master_name=broker.master_name,
                           sentinel_kwargs=_sentinel_kwargs(broker))
    return {
        "broker_url": kombu_url(broker.redis_url),
        "result_backend": kombu_url(broker.result_backend_url),
        "broker_transport_options": transport,
        "result_backend_transport_options": backend,
        "redis_socket_timeout": broker.timeout_s,
        "redis_socket_connect_timeout": min(broker.timeout_s, CONNECT_TIMEOUT_S),
        "redis_socket_keepalive": True,
        "redis_backend_health_check_interval": HEALTH_CHECK_S,
        "result_backend_always_retry": True,
        "result_backend_max_retries": max(1, int(broker.retry_s / RETRY_DELAY_MAX_S)),
        "result_backend_max_sleep_between_retries_ms": int(RETRY_DELAY_MAX_S * 1000),
    }


class DurabilityCounts:
    """Writes :func:`durable` ran in this process, by kind: covered (on enough replicas within
    the wait) or not. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}

    def record(self, kind: str, covered: bool) -> None:
        """Count one write of ``kind``."""
        with self._lock:
            self._counts.setdefault(kind, [0, 0])[0 if covered else 1] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{kind: {"covered": n, "uncovered": m}}`` so far."""
        with self._lock:
            return {k: {"covered": c, "uncovered": u} for k, (c, u) in self._counts.items()}


DURABILITY = DurabilityCounts()
"""This process's durable writes (a worker publishes them with its heartbeat)."""


def durable(client: redis.Redis, kind: str, queue: Callable[[Pipeline], object]) -> list[Any]:
    """Run the writes ``queue`` puts on a pipeline, then, when the client waits for replicas
    (a Sentinel-managed Redis), ``WAIT`` for them on the same connection; returns the writes'
    replies. A write not on enough replicas within ``TANGRAM_REDIS_WAIT_MS`` is still done: it
    is logged and counted as not covered. While the primary has fewer replicas connected than
    it waits for (one was just promoted, and the old primary has not come back), nothing is
    waited for: those writes count as not covered at once, without the wait's latency."""
    policy = client.policy if isinstance(client, TangramRedis) else Policy()
    pipe = client.pipeline(transaction=False)
    queue(pipe)
    if policy.wait_replicas <= 0:
        return list(pipe.execute())
    assert isinstance(client, TangramRedis)
    if client.replicas() < policy.wait_replicas:
        replies = list(pipe.execute())
        DURABILITY.record(kind, False)
        return replies
    pipe.wait(policy.wait_replicas, policy.wait_ms)
    *replies, acked = pipe.execute()
    covered = int(acked) >= policy.wait_replicas
    DURABILITY.record(kind, covered)
    if not covered:
        log.warning("a %s write reached %s of %d replicas within %d ms: it may be lost if the "
                    "primary fails now", kind, acked, policy.wait_replicas, policy.wait_ms)
    return replies
