"""The Docker engine: connecting to it, checking the sandbox image, an exec's exit code, diagnosis.

Every engine call can fail with one of :data:`API_ERRORS` (the SDK's, the HTTP client's and OS
errors).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import docker
import docker.errors
import requests.exceptions

from tangram_celery.errors import SandboxEngineError, SandboxError, SandboxSetupError
from tangram_celery.sandbox.docker.image import SETUP_HELP
from tangram_celery.sandbox.docker.protocol import MIN_FREE_PIDS

DEFAULT_DOCKER_URL = "unix:///var/run/docker.sock"


def _unix_socket_path(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme in ("unix", "http+unix"):
        return parts.path or None
    return None


def connect(url: str, timeout_s: float) -> docker.DockerClient:
    """A client of the engine at ``url`` that answered a ping; raises SandboxEngineError."""
    switch = "or use the embedded backend (TANGRAM_SANDBOX_BACKEND=bwrap)"
    path = _unix_socket_path(url)
    if path is not None and not os.path.exists(path):
        raise SandboxEngineError(
            f"no Docker engine socket at {path}: start dockerd (install it with {SETUP_HELP}), "
            f"point the backend's docker_url at a running engine, {switch}"
        )
    try:
        client = docker.DockerClient(base_url=url, timeout=timeout_s, max_pool_size=32)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        text = str(exc)
        hint = ("the worker may not use the socket: run it as root or in the docker group"
                if "ermission denied" in text else "is dockerd running and answering?")
        raise SandboxEngineError(
            f"the Docker engine at {url} did not answer ({text}); {hint} {switch}"
        ) from exc
    return client


API_ERRORS: tuple[type[Exception], ...] = (
    docker.errors.DockerException, requests.exceptions.RequestException, OSError)
KEEPER_ERRORS: tuple[type[Exception], ...] = (*API_ERRORS, SandboxError)


def check_image(client: docker.DockerClient, image: str, docker_url: str) -> None:
    """Raise :class:`SandboxSetupError` (saying how to build it) unless the engine has ``image``."""
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound as exc:
        raise SandboxSetupError(
            f"the sandbox image {image!r} is not in the engine at {docker_url}; "
            f"build it: bash scripts/build-sandbox-image.sh --docker-url {docker_url} "
            f"--tag {image}"
        ) from exc
    except API_ERRORS as exc:
        raise SandboxEngineError(f"cannot inspect image {image!r}: {exc}") from exc


def not_running(container: Any) -> str | None:
    """Why the engine says ``container`` cannot run anything now (paused, exited), or None."""
    try:
        container.reload()
    except API_ERRORS as exc:
        return f"the engine cannot inspect the container: {exc}"
    status = container.status
    return None if status == "running" else f"the container is {status}"


def diagnose(container: Any) -> str:
    """Why a container may refuse to run anything: its state, or its pid cap being full."""
    if container is None:
        return "no container"
    try:
        container.reload()
        if container.status != "running":
            return f"the container is {container.status}"
        pids = container.stats(stream=False, one_shot=True).get("pids_stats") or {}
    except API_ERRORS as exc:
        return f"the engine cannot inspect the container: {exc}"
    current, limit = pids.get("current"), pids.get("limit")
    if isinstance(current, int) and isinstance(limit, int) and limit - current < MIN_FREE_PIDS:
        return f"pid cap exhausted: {current} of {limit} in use"
    return "no output"
