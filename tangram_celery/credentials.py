"""Credentials of tangram's servers: where one may listen without them, basic auth, and keeping
secrets out of logs and out of other processes' view of a command line.

* :func:`is_loopback` and :func:`require_credential`: a server listens off loopback only with a
  credential (every server of the stack follows this rule);
* :func:`basic_authorization` and :func:`authorized`: HTTP basic auth, compared in constant time;
* :func:`redact`: a log line with the values of ``token=``, ``password=``, ``key=`` query
  parameters and the password of a ``scheme://user:password@host`` URL replaced;
* :func:`hide_argument`: blank a secret in a running child's command line
  (``/proc/PID/cmdline``, what ``ps`` shows), for a program that takes it only as an argument.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import re

from tangram_celery.errors import ConfigError

MASK = "***"
SECRET_QUERY = re.compile(r"(?i)\b((?:token|password|passwd|key|secret)=)[^&\s\"']+")
URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s/]+(@)", re.IGNORECASE)
ARG_START_FIELD = 48  # /proc/PID/stat: where the argument strings start and end (man 5 proc)


def is_loopback(address: str) -> bool:
    """True for ``localhost`` and loopback IPs; False for anything else (``""`` and ``0.0.0.0``
    listen everywhere)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def require_credential(address: str, credential: str, server: str, fix: str) -> None:
    """Raise :class:`ConfigError` when ``server`` would listen on ``address`` off loopback
    without ``credential``; ``fix`` says which setting to set."""
    if credential or is_loopback(address):
        return
    raise ConfigError(
        f"refusing to start {server} on {address or '*'} without a credential: anyone who "
        f"reaches that address could use it; {fix}, or listen on 127.0.0.1"
    )


def basic_authorization(user: str, password: str) -> str:
    """The ``Authorization`` header value of basic-auth credentials."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def authorized(header: str | None, expected: str) -> bool:
    """Whether an ``Authorization`` header equals ``expected`` (in constant time)."""
    return header is not None and hmac.compare_digest(header.encode(), expected.encode())


def redact(text: str) -> str:
    """``text`` with secrets in URLs masked: ``?token=...`` (also ``password``, ``key``,
    ``secret``) and the password of ``scheme://user:password@host``."""
    return URL_PASSWORD.sub(rf"\1{MASK}\2", SECRET_QUERY.sub(rf"\1{MASK}", text))


def hide_argument(pid: int, secret: str) -> bool:
    """Overwrite every occurrence of ``secret`` in the command line of process ``pid`` (its
    argument area, which ``/proc/PID/cmdline`` and ``ps`` read) with ``*``; True when it was
    found and blanked.

    For a program that reads a secret only from its arguments: call it once the program has
    parsed them (it keeps its own copy), as its parent or as root. Until then the secret is
    visible to whoever may read ``/proc/PID/cmdline`` (every local user, unless ``/proc`` is
    mounted with ``hidepid=2``)."""
    needle = secret.encode()
    if not needle:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        start, end = (int(fields[n - 3]) for n in (ARG_START_FIELD, ARG_START_FIELD + 1))
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as memory:
            memory.seek(start)
            area = memory.read(end - start)
            found = [m.start() for m in re.finditer(re.escape(needle), area)]
            for offset in found:
                memory.seek(start + offset)
                memory.write(b"*" * len(needle))
    except (OSError, ValueError, IndexError):
        return False
    return bool(found)
