"""The declared API limits: the ``TANGRAM_API_LIMITS`` format, its parser, an action's needs.

``TANGRAM_API_LIMITS`` format: ``;``-separated entries ``name=field:value,field:value``::

    search=url:http://127.0.0.1:8080,concurrency:4,rate:10/1s;judge=url:https://j.example/v1,rate:600/1m,burst:20

* ``url`` (required): the API's base URL (``http``/``https``, no query, no credentials, no ``,``
  or ``;``). Workers only ever call paths below it; a payload never names a host.
* ``concurrency``: at most this many calls in flight at once, over all workers.
* ``rate``: the provider's quota ``N/PERIOD``: ``N`` calls per period, refilled continuously;
  ``PERIOD`` is ``250ms``, ``1s``, ``1m``, ``1h`` or plain seconds (``1`` means ``1/1s``).
* ``burst``: the provider's bucket size, default ``N``. The manager's own bucket holds
  ``burst - 1`` tokens (at least 1): one token of headroom absorbs the jitter between a grant in
  Redis and the request's arrival at the provider.
* ``lease``: TTL of leases and waiting tickets (default ``10s``); renewed every third of it.

At least one of ``concurrency`` and ``rate`` is required. For a provider that counts calls in
fixed or sliding windows rather than a bucket, declare ``rate:<N-1>/PERIOD,burst:1``.

:func:`needs_of` checks what an action asks of the declared APIs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from tangram_celery.action import Action
from tangram_celery.action.model import API_PATTERN
from tangram_celery.errors import ConfigError, ValidationError

SETTING = "TANGRAM_API_LIMITS"
DEFAULT_LEASE_S = 10.0
FIELDS = frozenset({"url", "concurrency", "rate", "burst", "lease"})
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@dataclass(frozen=True)
class Quota:
    """A provider's quota: ``count`` calls per ``period_s``, bucket size ``burst``."""

    count: int
    period_s: float
    burst: int

    @property
    def rate_per_s(self) -> float:
        """Tokens added per second."""
        return self.count / self.period_s

    @property
    def capacity(self) -> int:
        """Size of the manager's bucket: ``burst - 1`` (one token of headroom), at least 1."""
        return max(1, self.burst - 1)


@dataclass(frozen=True)
class ApiSpec:
    """One declared API: where it lives and what it allows."""

    name: str
    base_url: str
    concurrency: int | None = None
    quota: Quota | None = None
    lease_s: float = DEFAULT_LEASE_S

    def max_amount(self) -> int | None:
        """The largest amount one action may ask of this API (None: unbounded)."""
        bounds = [b for b in (self.concurrency,
                              None if self.quota is None else self.quota.capacity) if b]
        return min(bounds) if bounds else None


def parse_duration(raw: str) -> float:
    """Seconds in ``250ms``, ``1s``, ``2m``, ``1h`` or a plain number of seconds."""
    match = _DURATION.match(raw)
    if match is None:
        raise ValueError(f"{raw!r} is not a duration like 500ms, 1s, 1m or 1h")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"{raw!r} must be longer than zero")
    return seconds


def parse_api_limits(text: str) -> dict[str, ApiSpec]:
    """Parse ``TANGRAM_API_LIMITS`` (see the module docstring) into specs by API name.

    Raises :class:`ConfigError` naming the entry and what is wrong with it.
    """
    specs: dict[str, ApiSpec] = {}
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        spec = _parse_entry(entry)
        if spec.name in specs:
            raise ConfigError(f"{SETTING}: API {spec.name!r} is declared twice")
        specs[spec.name] = spec
    return specs


def _parse_entry(entry: str) -> ApiSpec:
    name, sep, body = entry.partition("=")
    name = name.strip()
    if not sep or not API_PATTERN.fullmatch(name):
        raise ConfigError(f"{SETTING}: {entry!r}: expected name=field:value,... with a name of "
                          "1-64 characters a-z 0-9 _ -")
    values: dict[str, str] = {}
    for item in (i.strip() for i in body.split(",")):
        key, colon, value = item.partition(":")
        key = key.strip()
        if not colon or key not in FIELDS or key in values:
            raise ConfigError(f"{SETTING}: API {name!r}: bad or repeated field {item!r}; "
                              f"fields are {sorted(FIELDS)} as field:value")
        values[key] = value.strip()
    try:
        return _spec(name, values)
    except ValueError as exc:
        raise ConfigError(f"{SETTING}: API {name!r}: {exc}") from None


def _spec(name: str, values: Mapping[str, str]) -> ApiSpec:
    if "url" not in values:
        raise ValueError("url:<base URL> is required")
    if "concurrency" not in values and "rate" not in values:
        raise ValueError("declare concurrency:N, rate:N/PERIOD or both")
    quota = None
    if "rate" in values:
        quota = _quota(values["rate"], values.get("burst"))
    elif "burst" in values:
        raise ValueError("burst needs a rate")
    concurrency = _positive_int("concurrency", values["concurrency"]) \
        if "concurrency" in values else None
    lease = parse_duration(values["lease"]) if "lease" in values else DEFAULT_LEASE_S
    return ApiSpec(name, _base_url(values["url"]), concurrency, quota, lease)


def _quota(rate: str, burst: str | None) -> Quota:
    count, slash, period = rate.partition("/")
    calls = _positive_int("rate", count)
    period_s = parse_duration(period) if slash else 1.0
    size = _positive_int("burst", burst) if burst is not None else calls
    return Quota(calls, period_s, size)


def _positive_int(what: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{what}: {raw!r} is not a whole number") from None
    if value < 1:
        raise ValueError(f"{what}: must be at least 1")
    return value


def _base_url(raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"url: {raw!r} must be http(s)://host[:port][/prefix]")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"url: {raw!r} must have no query, fragment or credentials")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"url: {raw!r} has a bad port") from None
    return raw.rstrip("/")


@dataclass(frozen=True)
class Need:
    """What one action takes from one API: ``amount`` tokens and ``amount`` concurrency slots."""

    api: str
    amount: int


def needs_of(action: Action, specs: Mapping[str, ApiSpec]) -> tuple[Need, ...]:
    """The API needs of an action, sorted by API name (zero amounts dropped).

    Raises :class:`ValidationError` for an undeclared API or an amount no API could ever grant.
    """
    needs = []
    for api in action.apis():
        spec = specs.get(api)
        if spec is None:
            raise ValidationError(f"cost.api:{api}", f"API not declared in {SETTING}")
        amount = int(action.cost[f"api:{api}"].min)
        bound = spec.max_amount()
        if bound is not None and amount > bound:
            raise ValidationError(
                f"cost.api:{api}",
                f"{amount} exceeds what the API can ever grant at once ({bound}); lower it",
            )
        if amount > 0:
            needs.append(Need(api, amount))
    return tuple(needs)
