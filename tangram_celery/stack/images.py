"""The local stack's Docker images, built without pulling from any registry.

    python -m tangram_celery.stack.images [--docker-url URL] [--base-image IMAGE] [--force] ...
    bash scripts/build-images.sh [same options]

Three images, each built only when missing or out of date:

1. ``tangram-base:bookworm-1``: a ``debootstrap --variant=minbase`` Debian with Python 3.11,
   ``python3-venv``, ``libpython3.11`` (the Triton python backend stub links it) and
   ``redis-server``, imported with ``docker import``. It is made by the same code as the sandbox
   image (:func:`tangram_celery.sandbox.docker.image.ensure_image`, other packages), and its rootfs
   tarball is cached, so a fresh engine only imports it.
2. ``tangram:<version>`` from ``compose/Dockerfile`` with ``--network host`` (pip reaches the
   package index). The Dockerfile builds ``FROM`` the base image, or ``FROM python:3.11-slim``
   where a registry is reachable (``--base-image python:3.11-slim``). The wheels that this
   machine's pip resolves, with its own configuration (package index, local wheel directories
   such as a CPU-only torch, certificates of an intercepting proxy), are downloaded once into a
   cache and served to the build on a loopback port; the build installs from them alone, so the
   image holds the same distributions as the host. ``--no-wheels`` lets pip in the build fetch
   from the package index itself. The image carries a label with a digest of
   everything that went into it; an image whose label matches is not built again.
3. ``tangram-sandbox:bookworm-1``, the CPU node's sandbox image
   (:mod:`tangram_celery.sandbox.docker.image`), unless ``--no-sandbox-image``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import re
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions

from tangram_celery.errors import SandboxSetupError, ServiceError
from tangram_celery.sandbox.docker.image import DEFAULT_CACHE_DIR, ensure_image, prune_rootfs

BASE_TAG = "tangram-base:bookworm-1"
BASE_PACKAGES = ("python3", "python3-venv", "libpython3.11", "redis-server", "ca-certificates")
BASE_CHANGES = ("ENV LANG=C.UTF-8", "LABEL tangram.recipe=base-1")
DOCKERFILE = "compose/Dockerfile"
CONTEXT_FILES = ("pyproject.toml", "README.md", DOCKERFILE, ".dockerignore")
CONTEXT_DIRS = ("tangram_celery", "tangram_bench", "workers", "triton_models")
SOURCE_LABEL = "tangram.source"
DEFAULT_EXTRAS = "reward"
WHEELS_PORT = 47913  # fixed, so the build argument (and so Docker's layer cache) stays the same
PIP_TIMEOUT_S = 1800
MAX_RESOLVE_ROUNDS = 10
BUILD_REQUIREMENTS = ("pip>=24", "setuptools>=77", "wheel")  # the Dockerfile installs these first


def default_tag() -> str:
    """``tangram:<installed version>``: the image the compose file runs by default."""
    try:
        return f"tangram:{version('tangram-celery')}"
    except PackageNotFoundError:
        return "tangram:latest"


def source_files(root: Path) -> list[Path]:
    """The files the image is built from (what ``.dockerignore`` lets through), sorted."""
    found = [root / name for name in CONTEXT_FILES if (root / name).is_file()]
    for name in CONTEXT_DIRS:
        found += [p for p in (root / name).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return sorted(found)


def source_digest(root: Path, build_args: Mapping[str, str], base_id: str) -> str:
    """A digest of the build's inputs: file names and contents, build arguments, base image."""
    digest = hashlib.sha256()
    for key in sorted(build_args):
        digest.update(f"arg {key}={build_args[key]}\n".encode())
    digest.update(f"base {base_id}\n".encode())
    for path in source_files(root):
        digest.update(f"file {path.relative_to(root)}\n".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def requirements(pyproject: Path, extras: Sequence[str]) -> list[str]:
    """The package's dependencies plus those of ``extras`` (self-references expanded)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    name = project["name"]
    optional: Mapping[str, list[str]] = project.get("optional-dependencies", {})
    wanted: list[str] = list(project.get("dependencies", []))
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for req in optional.get(extra, []):
            if req.startswith(f"{name}["):
                pending += [e.strip() for e in req[len(name) + 1:].rstrip("]").split(",")]
            else:
                wanted.append(req)
    return list(dict.fromkeys(wanted))


def pip_download(reqs: Sequence[str], cache: Path) -> None:
    """``pip download`` wheels of ``reqs`` (and their dependencies) into ``cache`` with this
    machine's pip and its configuration (indexes, local wheel directories, certificates)."""
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
            "--dest", str(cache), *reqs]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"pip download took over {PIP_TIMEOUT_S} s") from exc
    if done.returncode != 0:
        raise ServiceError(f"pip download failed: {(done.stdout + done.stderr)[-2000:]}")


def missing_requirement(pip_output: str) -> str | None:
    """The requirement pip could not satisfy, from its ``No matching distribution`` error."""
    found = re.search(r"No matching distribution found for ([^\s;]+)", pip_output)
    return found.group(1) if found else None


def resolve_in_image(
    client: docker.DockerClient, image: str, reqs: Sequence[str], wheels_url: str,
) -> str | None:
    """Resolve ``reqs`` from ``wheels_url`` alone with ``image``'s own Python (its markers, such
    as ``python_full_version``, decide some dependencies); returns the first requirement that
    is missing, or None when everything resolves."""
    script = ("import subprocess, sys, venv\n"
              "venv.create('/tmp/resolve', with_pip=True)\n"
              "done = subprocess.run(['/tmp/resolve/bin/python', '-m', 'pip', 'install', "
              "'--dry-run', "
              "'--quiet', '--ignore-installed', '--only-binary=:all:', '--no-index', "
              "'--find-links', sys.argv[1], *sys.argv[2:]], capture_output=True, text=True)\n"
              "print(done.stdout + done.stderr)\n"
              "print('rc', done.returncode)\n")
    try:
        raw = client.containers.run(image, ["python3", "-c", script, wheels_url, *reqs],
                                    remove=True, network_mode="host")
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise ServiceError(f"cannot run pip in {image}: {exc}") from exc
    output = bytes(raw).decode(errors="replace")
    if output.rstrip().endswith("rc 0"):
        return None
    missing = missing_requirement(output)
    if missing is None:
        raise ServiceError(f"pip in {image} cannot resolve the requirements: {output[-2000:]}")
    return missing


def collect_wheels(
    client: docker.DockerClient, image: str, reqs: Sequence[str], cache: Path,
    wheels_url: str, announce: Callable[[str], None],
) -> None:
    """Fill ``cache`` (served at ``wheels_url``) with wheels for ``reqs`` as ``image``'s Python
    needs them: this machine's pip downloads, the image's pip checks, until nothing is missing.
    Skipped when ``cache`` already served the same requirements to the same image."""
    cache.mkdir(parents=True, exist_ok=True)
    stamp = cache / ".requirements"
    wanted = f"image {image_id(client, image)}\n" + "\n".join(reqs) + "\n"
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    announce(f"collecting wheels for {len(reqs)} requirements into {cache}")
    pip_download(reqs, cache)
    for _ in range(MAX_RESOLVE_ROUNDS):
        missing = resolve_in_image(client, image, reqs, wheels_url)
        if missing is None:
            stamp.write_text(wanted)
            return
        announce(f"{image} also needs {missing}")
        pip_download([missing], cache)
    raise ServiceError(f"wheels for {image} still incomplete after {MAX_RESOLVE_ROUNDS} rounds")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Requests are not logged."""


@contextlib.contextmanager
def serve_directory(directory: Path, port: int = WHEELS_PORT) -> Iterator[str]:
    """Serve ``directory``'s listing and files on 127.0.0.1 (``port``, else a free one) while
    the block runs; yields the URL (a pip ``--find-links`` location)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="wheel-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def image_label(client: docker.DockerClient, tag: str, label: str) -> str | None:
    """The value of ``label`` on image ``tag`` (None when the image or the label is missing)."""
    try:
        labels = client.images.get(tag).labels or {}
    except docker.errors.ImageNotFound:
        return None
    value = labels.get(label)
    return str(value) if value is not None else None


def image_id(client: docker.DockerClient, tag: str) -> str:
    """The id of image ``tag``; a registry image is pulled first when missing."""
    try:
        return str(client.images.get(tag).id)
    except docker.errors.ImageNotFound:
        pass
    try:
        return str(client.images.pull(tag).id)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise ServiceError(f"base image {tag} is not in the engine and cannot be pulled "
                           f"({exc}); build the local one with the default --base-image") from exc


def docker_build(
    client: docker.DockerClient, root: Path, tag: str, build_args: Mapping[str, str],
    labels: Mapping[str, str], announce: Callable[[str], None],
) -> str:
    """``docker build --network host -f compose/Dockerfile`` of ``root``; returns the image id.
    Raises :class:`ServiceError` with the build's last lines when it fails."""
    lines: list[str] = []
    try:
        stream = client.api.build(
            path=str(root), dockerfile=DOCKERFILE, tag=tag, buildargs=dict(build_args),
            labels=dict(labels), network_mode="host", rm=True, forcerm=True, decode=True,
        )
        for chunk in stream:
            if "error" in chunk:
                raise ServiceError(f"docker build of {tag} failed: {chunk['error']}\n"
                                   + "".join(lines[-30:]))
            text = str(chunk.get("stream", ""))
            if text:
                lines.append(text)
                if text.startswith("Step "):
                    announce(text.strip())
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise ServiceError(f"docker build of {tag} failed: {exc}") from exc
    return str(client.images.get(tag).id)


def ensure_stack_image(
    client: docker.DockerClient,
    root: Path,
    *,
    tag: str | None = None,
    base_image: str = BASE_TAG,
    extras: str = DEFAULT_EXTRAS,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    mirror: str | None = None,
    wheels: bool = True,
    force: bool = False,
    announce: Callable[[str], None] = print,
) -> str:
    """Make sure the engine holds the stack image built from ``root`` as it is now; returns
    its tag. The local base image is built (or imported from the cached rootfs) when needed."""
    tag = tag or default_tag()
    if base_image == BASE_TAG:
        ensure_image(client, BASE_TAG, cache_dir=cache_dir, mirror=mirror,
                     packages=BASE_PACKAGES, customize=prune_rootfs, changes=BASE_CHANGES)
    build_args = {"BASE_IMAGE": base_image, "EXTRAS": extras}
    digest = source_digest(root, build_args, image_id(client, base_image))
    if not force and image_label(client, tag, SOURCE_LABEL) == digest:
        announce(f"{tag} is up to date")
        return tag
    with contextlib.ExitStack() as stack:
        if wheels:
            extra_names = [e for e in extras.split(",") if e]
            reqs = [*BUILD_REQUIREMENTS, *requirements(root / "pyproject.toml", extra_names)]
            cache = cache_dir / "wheels"
            cache.mkdir(parents=True, exist_ok=True)
            build_args["WHEELS_URL"] = stack.enter_context(serve_directory(cache))
            collect_wheels(client, base_image, reqs, cache, build_args["WHEELS_URL"], announce)
        started = time.monotonic()
        docker_build(client, root, tag, build_args, {SOURCE_LABEL: digest}, announce)
        announce(f"built {tag} in {time.monotonic() - started:.0f} s")
    return tag


def repository_root() -> Path:
    """The source checkout this package runs from (where ``compose/`` lives)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / DOCKERFILE).is_file():
        raise ServiceError(f"no {DOCKERFILE} beside the package at {root}: build the images "
                           "from a source checkout")
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build what is missing or out of date, print the tags."""
    parser = argparse.ArgumentParser(description="Build the local stack's images.")
    parser.add_argument("--docker-url", default="unix:///var/run/docker.sock",
                        help="the engine's API address")
    parser.add_argument("--tag", default=None, help="stack image tag (default tangram:VERSION)")
    parser.add_argument("--base-image", default=BASE_TAG,
                        help=f"FROM image (default {BASE_TAG}, built from a Debian rootfs; "
                             "python:3.11-slim where a registry is reachable)")
    parser.add_argument("--extras", default=DEFAULT_EXTRAS,
                        help="package extras to install (default reward; '' for a slim image)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                        help="where rootfs tarballs and wheels are cached")
    parser.add_argument("--mirror", default=None, help="Debian mirror URI (default: apt's)")
    parser.add_argument("--no-wheels", dest="wheels", action="store_false",
                        help="let pip in the build fetch everything from the index")
    parser.add_argument("--no-sandbox-image", dest="sandbox", action="store_false",
                        help="do not build the CPU node's sandbox image")
    parser.add_argument("--force", action="store_true", help="rebuild the stack image")
    args = parser.parse_args(argv)
    try:
        client = docker.DockerClient(base_url=args.docker_url, timeout=600)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        print(f"no Docker engine answers at {args.docker_url}: {exc}", file=sys.stderr)
        return 1
    try:
        tags = [ensure_stack_image(client, repository_root(), tag=args.tag,
                                   base_image=args.base_image, extras=args.extras,
                                   cache_dir=args.cache_dir, mirror=args.mirror,
                                   wheels=args.wheels, force=args.force,
                                   announce=lambda line: print(line, flush=True))]
        if args.sandbox:
            tags.append(ensure_image(client, cache_dir=args.cache_dir, mirror=args.mirror))
    except (ServiceError, SandboxSetupError) as exc:
        print(f"build-images: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    for tag in tags:
        print(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
