"""The docker backend's containers: the warm pool, each trajectory's container, their removal.

Every container is labelled with its backend's owner tag and host, so the containers of a
backend whose process died are removed by the next one on the host
(:meth:`ContainerPool.reap_stale`). Each container's actions run as a host uid of its own, taken
from the host's uid pool when the container is made and given back once it is removed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors

from tangram_celery.errors import (
    SandboxEngineError,
    SandboxError,
    SandboxSetupError,
    WorkdirQuotaError,
)
from tangram_celery.sandbox.base import SandboxLimits
from tangram_celery.sandbox.docker.cpu import ContainerCpu, container_cpu
from tangram_celery.sandbox.docker.engine import API_ERRORS, KEEPER_ERRORS, diagnose
from tangram_celery.sandbox.docker.link import Resident
from tangram_celery.sandbox.docker.options import container_options
from tangram_celery.sandbox.docker.policy import (
    WarmPoolPolicy,
    idle_expired,
    plan_pool,
    warm_pool_target,
)
from tangram_celery.sandbox.owner import is_stale_tag, owner_tag
from tangram_celery.sandbox.uids import UidPool

log = logging.getLogger(__name__)
FURNISH_ERRORS: tuple[type[Exception], ...] = (SandboxError, *API_ERRORS)

OWNER_PREFIX = "dkr-"
LABEL_OWNER = "tangram.sandbox.owner"
LABEL_HOST = "tangram.sandbox.host"
LABEL_UID = "tangram.sandbox.uid"


@dataclass
class Box:
    """A started sandbox container, its resident executor, the control of its cores and the
    host uid its actions run as."""

    container: Any
    resident: Resident
    cpu: ContainerCpu
    uid: int


@dataclass
class Env:
    """A trajectory's environment: its container and what the backend knows about it."""

    trajectory_id: str
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    box: Box | None = None
    used: bool = False
    broken: str | None = None
    lost: str | None = None
    oom_seen: int = 0
    active: int = 0
    ended: bool = False
    exceeded: bool = False
    settle: Future[None] | None = None
    pinned: tuple[int, ...] | None = None
    """The cores of the action running now (None between actions), guarded by ``pin_lock``."""
    pin_lock: threading.Lock = field(default_factory=threading.Lock)


def mark_broken(env: Env, reason: str) -> None:
    """Log that ``env``'s container is broken; its next action gets a fresh one."""
    log.warning("the container of trajectory %s is broken and will be replaced: %s",
                env.trajectory_id, reason)
    env.broken = reason


class ContainerPool:
    """Every container of one backend, from creation to removal. Thread-safe.

    A trajectory's container lives in its :class:`Env`; ready ones wait in the warm pool. A keeper
    thread expires idle trajectories and resizes the warm pool every ``tick_s``. ``lock`` guards
    the environments and the pool; the backend takes it too.
    """

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        docker_url: str,
        image: str,
        limits: SandboxLimits,
        seccomp: str | None,
        policy: WarmPoolPolicy,
        idle_ttl_s: float,
        tick_s: float,
        uids: UidPool,
        setup_timeout_s: float = 120.0,
        direct_cpu: bool = True,
    ) -> None:
        """Remove what dead backends left on this host, then start the keeper.

        ``uids`` gives each container the uid its actions run as. ``setup_timeout_s`` bounds a
        container's executor start; ``direct_cpu``: pin cores through the container's cgroup
        files when the node can write them (else the API).
        """
        self.client = client
        self.setup_timeout_s = setup_timeout_s
        self.direct_cpu = direct_cpu
        self.docker_url = docker_url
        self.image = image
        self.limits = limits
        self.idle_ttl_s = idle_ttl_s
        self.pool_policy = policy
        self.uids = uids
        self._seccomp = seccomp
        self.owner = owner_tag(OWNER_PREFIX)
        self._labels = {LABEL_OWNER: self.owner, LABEL_HOST: socket.gethostname()}
        self.lock = threading.Lock()
        self._envs: dict[str, Env] = {}
        self._pool: deque[Box] = deque()
        self._creating = 0
        self._arrivals: deque[float] = deque(maxlen=4096)
        self.create_s = 0.3
        self._closed = False
        self._wake = threading.Event()
        self.background = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tangram-docker")
        self.reap_stale()
        self._keeper = threading.Thread(target=self._keep, args=(tick_s,), daemon=True,
                                        name="tangram-docker-pool")
        self._keeper.start()

    # -- trajectories -----------------------------------------------------------------------

    def enter(self, trajectory_id: str) -> Env:
        """The trajectory's environment (a new one on first use), marked active."""
        with self.lock:
            if self._closed:
                raise SandboxError("the sandbox backend is closed; create a new one")
            env = self._envs.get(trajectory_id)
            if env is None:
                env = Env(trajectory_id, time.monotonic())
                self._envs[trajectory_id] = env
                self._arrivals.append(time.monotonic())
            if env.exceeded:
                raise WorkdirQuotaError(
                    f"trajectory {trajectory_id!r}: its work dir grew past the "
                    f"{self.limits.workdir_mb} MiB quota; end_trajectory() it and start over"
                )
            env.active += 1
            return env

    def get(self, trajectory_id: str) -> Env | None:
        """The trajectory's environment (None: it holds none)."""
        with self.lock:
            return self._envs.get(trajectory_id)

    def leave(self, env: Env) -> None:
        """An action of ``env`` is over: it is idle from now on, unless another runs."""
        with self.lock:
            env.active -= 1
            env.last_used = time.monotonic()

    def end(self, trajectory_id: str, idle_since: float | None) -> bool:
        """End a trajectory; with ``idle_since``, only if it stayed idle since then."""
        with self.lock:
            env = self._envs.get(trajectory_id)
            if env is None:
                return False
            if idle_since is not None and (env.active or env.last_used != idle_since):
                return False
            del self._envs[trajectory_id]
            env.ended = True
            box, env.box = env.box, None
        if box is not None:
            self._discard(box)
        return True

    def trajectories(self) -> list[str]:
        """The ids of the trajectories that hold an environment now."""
        with self.lock:
            return sorted(self._envs)

    # -- containers -------------------------------------------------------------------------

    def size(self) -> int:
        """How many ready containers wait in the warm pool now."""
        with self.lock:
            return len(self._pool)

    def containers(self) -> list[str]:
        """The ids of every container of this backend (trajectories' and the pool's)."""
        found = self.client.api.containers(
            all=True, filters={"label": f"{LABEL_OWNER}={self.owner}"})
        return [str(entry["Id"]) for entry in found]

    def close(self) -> bool:
        """End every trajectory, empty the pool, wait for the removals; idempotent.

        Returns whether this call closed it (False when it was closed already).
        """
        with self.lock:
            if self._closed:
                return False
            self._closed = True
            ids = list(self._envs)
            pool, self._pool = list(self._pool), deque()
        self._wake.set()
        self._keeper.join(timeout=30)
        for trajectory_id in ids:
            self.end(trajectory_id, idle_since=None)
        for box in pool:
            self._discard(box)
        self.background.shutdown(wait=True)
        with contextlib.suppress(*API_ERRORS):
            for container_id in self.containers():  # one created while we were closing
                self._remove_id(container_id)
        return True

    def reap_stale(self) -> int:
        """Remove containers of backends whose process died on this host; returns how many."""
        host = socket.gethostname()
        removed = 0
        try:
            found = self.client.api.containers(all=True, filters={"label": LABEL_OWNER})
        except API_ERRORS as exc:
            raise SandboxEngineError(f"cannot list containers at {self.docker_url}: {exc}") \
                from exc
        for entry in found:
            labels = entry.get("Labels") or {}
            if labels.get(LABEL_HOST) == host and \
                    is_stale_tag(labels.get(LABEL_OWNER, ""), OWNER_PREFIX):
                self._remove_id(str(entry["Id"]))
                removed += 1
        return removed

    def replace(self, env: Env) -> None:
        """Give ``env`` a fresh container, throwing its old one away."""
        old = env.box
        if old is not None:
            if env.used:
                env.lost = env.lost or env.broken or "the container broke"
            env.box = None
            self._discard(old)
        self._take_container(env)

    def _take_container(self, env: Env) -> None:
        """Give ``env`` a ready container: from the warm pool, else a new one."""
        with self.lock:
            box = self._pool.popleft() if self._pool else None
        self._wake.set()
        if box is None:
            box = self._create()
        with self.lock:
            ended = env.ended
            if not ended:
                env.box, env.used, env.broken, env.oom_seen = box, False, None, 0
        if ended:
            self._discard(box)
            raise SandboxError(f"trajectory {env.trajectory_id!r} was ended while its action "
                               "was starting")

    def _create(self) -> Box:
        t0 = time.monotonic()
        with self.lock:
            uid = self.uids.take()
        labels = {**self._labels, LABEL_UID: str(uid)}
        try:
            container = self.client.containers.run(
                self.image, **container_options(self.limits, labels, self._seccomp, uid))
        except API_ERRORS as exc:
            self._give_back(uid)
            raise SandboxSetupError(f"cannot start a sandbox container from {self.image!r}: "
                                    f"{exc}") from exc
        try:
            box = self._furnish(container, uid)
        except FURNISH_ERRORS as exc:
            state = diagnose(container)
            if self._remove_id(str(container.id)):
                self._give_back(uid)
            raise SandboxSetupError(f"cannot start the executor of a sandbox container: {exc} "
                                    f"({state})") from exc
        with self.lock:
            self.create_s = 0.8 * self.create_s + 0.2 * (time.monotonic() - t0)
        return box

    def _furnish(self, container: Any, uid: int) -> Box:
        """Start the container's resident executor, then throttle it until its first action."""
        container.reload()
        cpu = container_cpu(container, direct=self.direct_cpu)
        link = Resident.start(self.client, str(container.id), self.setup_timeout_s, uid)
        try:
            cpu.idle()
        except SandboxError:
            link.close()
            raise
        return Box(container, link, cpu, uid)

    def _discard(self, box: Box) -> None:
        """Remove a container in the background (force: kills what runs in it)."""
        try:
            self.background.submit(self._remove, box)
        except RuntimeError:  # shutting down
            self._remove(box)

    def _remove(self, box: Box) -> None:
        box.resident.close()
        if self._remove_id(str(box.container.id)):
            self._give_back(box.uid)

    def _remove_id(self, container_id: str) -> bool:
        """Remove a container (killing what runs in it); whether it is gone."""
        try:
            self.client.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            return True
        except API_ERRORS:
            log.warning("cannot remove sandbox container %s; its uid stays held",
                        container_id[:12], exc_info=True)
            return False
        return True

    def _give_back(self, uid: int) -> None:
        with self.lock:
            self.uids.give_back(uid)

    # -- the pool keeper --------------------------------------------------------------------

    def _keep(self, tick_s: float) -> None:
        """The pool keeper's loop: expire idle trajectories, resize the warm pool."""
        while True:
            self._wake.wait(tick_s)
            self._wake.clear()
            with self.lock:
                if self._closed:
                    return
            try:
                self._expire_idle()
                self._refill()
            except KEEPER_ERRORS:
                log.warning("the docker pool keeper's tick failed", exc_info=True)

    def _expire_idle(self) -> None:
        with self.lock:
            last = {tid: env.last_used for tid, env in self._envs.items()}
            busy = {tid for tid, env in self._envs.items() if env.active or env.lock.locked()}
        for trajectory_id in idle_expired(last, busy, time.monotonic(), self.idle_ttl_s):
            if self.end(trajectory_id, idle_since=last[trajectory_id]):
                log.info("trajectory %s was idle for %.0f s: its container is removed",
                         trajectory_id, self.idle_ttl_s)

    def _refill(self) -> None:
        with self.lock:
            target = warm_pool_target(self._arrivals, time.monotonic(), self.create_s,
                                      self.pool_policy)
            plan = plan_pool(len(self._pool), self._creating, target)
            surplus = [self._pool.pop() for _ in range(plan.remove)]
            self._creating += plan.create
        for box in surplus:
            self._discard(box)
        for _ in range(plan.create):
            self._add_to_pool()

    def _add_to_pool(self) -> None:
        try:
            box: Box | None = self._create()
        except SandboxError as exc:
            log.warning("cannot add a container to the warm pool: %s", exc)
            box = None
        with self.lock:
            self._creating -= 1
            keep = box is not None and not self._closed
            if box is not None and keep:
                self._pool.append(box)
        if box is not None and not keep:
            self._remove(box)
