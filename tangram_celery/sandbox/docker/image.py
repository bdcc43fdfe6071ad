"""The Docker sandbox image, built locally from a Debian rootfs: no registry is needed.

    python -m tangram_celery.sandbox.docker.image [--docker-url URL] [--tag TAG] [--force]
    bash scripts/build-sandbox-image.sh [same options]

The image is a ``debootstrap --variant=minbase`` Debian (``bookworm``) with ``python3-minimal``,
``python3-pytest`` and ``python3-pytest-xdist``, an unprivileged ``sandbox`` account (uid 1000,
home ``/work``) and ``CMD ["sleep", "infinity"]``, turned into an image with ``docker import``.
The Debian mirror is read from this machine's apt configuration at run time (never hard-coded);
``--mirror`` overrides it.

Two caches keep rebuilds rare: :func:`ensure_image` does nothing when the tag exists in the
engine, and the rootfs tarball is kept in a cache directory so that a fresh engine only needs the
import (about 2 s) instead of the debootstrap (30-90 s).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import docker
import docker.errors
import requests.exceptions

from tangram_celery.errors import SandboxSetupError

SUITE = "bookworm"
RECIPE_VERSION = 1
DEFAULT_TAG = f"tangram-sandbox:{SUITE}-{RECIPE_VERSION}"
PACKAGES = ("python3-minimal", "python3-pytest", "python3-pytest-xdist")
DEFAULT_CACHE_DIR = Path("/var/cache/tangram")
APT_DIR = Path("/etc/apt")
SANDBOX_UID = 1000
SANDBOX_HOME = "/work"
IMAGE_CHANGES = ('CMD ["sleep", "infinity"]', f"LABEL tangram.recipe={RECIPE_VERSION}")
DEBOOTSTRAP_TIMEOUT_S = 1200
# documentation and caches a sandbox never reads (about half the rootfs)
PRUNE = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
         "var/cache/apt/archives", "var/lib/apt/lists", "var/cache/debconf/templates.dat-old")
SETUP_HELP = "run `bash scripts/run.sh setup` (it installs docker.io and debootstrap)"


# ---------------------------------------------------------------------------------------------
# The mirror, from apt's own configuration (pure parsing)


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    """The stanzas of a deb822 ``.sources`` file as field -> value (continuations joined)."""
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.lstrip().startswith("#"):
            continue
        if not line.strip():
            if current:
                stanzas.append(current)
            current, last = {}, ""
            continue
        if line[0] in " \t" and last:
            current[last] += " " + line.strip()
            continue
        key, _, value = line.partition(":")
        last = key.strip().lower()
        current[last] = value.strip()
    if current:
        stanzas.append(current)
    return stanzas


def _one_line_entries(text: str) -> list[tuple[str, str, str]]:
    """(uri, suite, components) of the ``deb`` lines of a one-line ``.list`` file."""
    entries = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line[4:])
        fields = line.split()
        if len(fields) >= 3:
            entries.append((fields[0], fields[1], " ".join(fields[2:])))
    return entries


def _is_enabled(stanza: Mapping[str, str]) -> bool:
    return stanza.get("enabled", "yes").lower() not in ("no", "false", "0")


def debian_mirror(sources: Mapping[str, str], suite: str = SUITE) -> str:
    """The first Debian archive URI that apt uses for ``suite`` with the ``main`` component.

    ``sources`` maps apt source file names (``sources.list``, ``sources.list.d/x.sources``...)
    to their text; only ``.list`` and ``.sources`` files count, as in apt. Raises
    :class:`SandboxSetupError` when none serves the suite.
    """
    for name in sorted(sources, key=lambda n: (n != "sources.list", n)):
        text = sources[name]
        if name.endswith(".sources"):
            for stanza in _deb822_stanzas(text):
                if not _is_enabled(stanza) or "deb" not in stanza.get("types", "").split():
                    continue
                if suite in stanza.get("suites", "").split() and \
                        "main" in stanza.get("components", "").split():
                    uris = stanza.get("uris", "").split()
                    if uris:
                        return uris[0]
        elif name.endswith(".list"):
            for uri, entry_suite, components in _one_line_entries(text):
                if entry_suite == suite and "main" in components.split():
                    return uri
    raise SandboxSetupError(
        f"apt has no source for Debian {suite!r} with component 'main' (looked in "
        f"{', '.join(sorted(sources)) or 'nothing'}); pass --mirror URL"
    )


def read_apt_sources(apt_dir: Path = APT_DIR) -> dict[str, str]:
    """apt's source files, relative name -> text (``sources.list`` and ``sources.list.d/*``)."""
    found: dict[str, str] = {}
    main = apt_dir / "sources.list"
    if main.is_file():
        found["sources.list"] = main.read_text(errors="replace")
    extra = apt_dir / "sources.list.d"
    if extra.is_dir():
        for path in sorted(extra.iterdir()):
            if path.is_file() and path.suffix in (".list", ".sources"):
                found[f"sources.list.d/{path.name}"] = path.read_text(errors="replace")
    return found


# ---------------------------------------------------------------------------------------------
# The rootfs


def passwd_lines(uid: int = SANDBOX_UID, home: str = SANDBOX_HOME) -> tuple[str, str]:
    """The ``/etc/passwd`` and ``/etc/group`` lines of the unprivileged ``sandbox`` account."""
    return (f"sandbox:x:{uid}:{uid}:tangram sandbox:{home}:/bin/sh\n", f"sandbox:x:{uid}:\n")


def customize_rootfs(root: Path) -> None:
    """Add the ``sandbox`` account and the ``/work`` mount point; drop docs and apt caches."""
    passwd, group = passwd_lines()
    for name, line in (("passwd", passwd), ("group", group)):
        path = root / "etc" / name
        text = path.read_text()
        if not any(entry.startswith("sandbox:") for entry in text.splitlines()):
            path.write_text(text + line)
    (root / SANDBOX_HOME.lstrip("/")).mkdir(mode=0o755, exist_ok=True)
    prune_rootfs(root)


def prune_rootfs(root: Path) -> None:
    """Empty the documentation and apt cache directories (about half a minbase rootfs)."""
    for rel in PRUNE:
        target = root / rel
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True, exist_ok=True)


def debootstrap_command(root: Path, mirror: str, suite: str = SUITE,
                        packages: Sequence[str] = PACKAGES) -> list[str]:
    """The debootstrap invocation for a rootfs with ``packages`` (default: the sandbox's)."""
    return ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
            suite, str(root), mirror]


def build_rootfs(root: Path, mirror: str, packages: Sequence[str] = PACKAGES) -> None:
    """Run debootstrap into ``root`` (needs root and network access to ``mirror``)."""
    if shutil.which("debootstrap") is None and not Path("/usr/sbin/debootstrap").exists():
        raise SandboxSetupError(f"debootstrap is not installed; {SETUP_HELP}")
    if os.geteuid() != 0:
        raise SandboxSetupError("building the sandbox rootfs needs root (debootstrap)")
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
    try:
        done = subprocess.run(debootstrap_command(root, mirror, packages=packages),
                              capture_output=True, text=True,
                              env=env, timeout=DEBOOTSTRAP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SandboxSetupError(f"debootstrap from {mirror} took over "
                                f"{DEBOOTSTRAP_TIMEOUT_S} s; check the mirror") from exc
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-2000:]
        raise SandboxSetupError(f"debootstrap from {mirror} failed ({done.returncode}): {tail}")


def make_tarball(root: Path, out: Path) -> None:
    """Pack ``root`` into ``out`` (written next to it, then renamed, so it is never partial)."""
    partial = out.with_suffix(".partial")
    done = subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf",  # nosec B607 # operator-run image build; tar from the operator's PATH
                           str(partial), "."], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SandboxSetupError(f"cannot pack the rootfs: {done.stderr[-1000:]}")
    partial.replace(out)


def tarball_path(cache_dir: Path, tag: str) -> Path:
    """Where the rootfs tarball of ``tag`` is cached."""
    return cache_dir / (re.sub(r"[^A-Za-z0-9._-]", "_", tag) + ".tar")


def cached_tarball(
    cache_dir: Path, tag: str, mirror: str | None, packages: Sequence[str] = PACKAGES,
    customize: Callable[[Path], None] = customize_rootfs,
) -> Path:
    """The rootfs tarball for ``tag``: from the cache, else debootstrapped now (with
    ``packages``, then ``customize``) and cached."""
    out = tarball_path(cache_dir, tag)
    if out.is_file():
        return out
    cache_dir.mkdir(parents=True, exist_ok=True)
    chosen = mirror or debian_mirror(read_apt_sources())
    with tempfile.TemporaryDirectory(prefix="tangram-rootfs-", dir=cache_dir) as tmp:
        root = Path(tmp) / "root"
        build_rootfs(root, chosen, packages)
        customize(root)
        make_tarball(root, out)
    return out


# ---------------------------------------------------------------------------------------------
# The engine side


def has_image(client: docker.DockerClient, tag: str) -> bool:
    """Whether the engine holds ``tag``."""
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def import_image(client: docker.DockerClient, tarball: Path, tag: str,
                 changes: Sequence[str] = IMAGE_CHANGES) -> str:
    """``docker import`` the tarball as ``tag`` with Dockerfile ``changes``; returns the id."""
    repository, _, version = tag.rpartition(":")
    if not repository:
        repository, version = tag, "latest"
    try:
        client.api.import_image_from_file(str(tarball), repository=repository, tag=version,
                                          changes=list(changes))
        return str(client.images.get(tag).id)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise SandboxSetupError(f"docker import of {tarball} as {tag} failed: {exc}") from exc


def ensure_image(
    client: docker.DockerClient,
    tag: str = DEFAULT_TAG,
    *,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    mirror: str | None = None,
    force: bool = False,
    packages: Sequence[str] = PACKAGES,
    customize: Callable[[Path], None] = customize_rootfs,
    changes: Sequence[str] = IMAGE_CHANGES,
) -> str:
    """Make sure the engine holds the image ``tag``; build it only if it is missing.

    The defaults build the sandbox image; other ``packages``, ``customize`` and ``changes``
    build other images from a Debian rootfs the same way (the local stack's base image).
    Returns the tag. ``force`` rebuilds the rootfs and imports it again.
    """
    if not force and has_image(client, tag):
        return tag
    if force:
        tarball_path(cache_dir, tag).unlink(missing_ok=True)
    import_image(client, cached_tarball(cache_dir, tag, mirror, packages, customize), tag,
                 changes)
    return tag


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: build (if missing) and import the sandbox image."""
    parser = argparse.ArgumentParser(description="Build the tangram Docker sandbox image.")
    parser.add_argument("--docker-url", default="unix:///var/run/docker.sock",
                        help="the engine's API address")
    parser.add_argument("--tag", default=DEFAULT_TAG, help="image tag to build")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                        help="where the rootfs tarball is cached")
    parser.add_argument("--mirror", default=None,
                        help="Debian mirror URI (default: the one apt uses here)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the tag exists")
    args = parser.parse_args(argv)
    try:
        client = docker.DockerClient(base_url=args.docker_url, timeout=120)
    except docker.errors.DockerException as exc:
        raise SystemExit(f"no Docker engine answers at {args.docker_url}: {exc}") from exc
    try:
        tag = ensure_image(client, args.tag, cache_dir=args.cache_dir, mirror=args.mirror,
                           force=args.force)
        print(f"{tag} {client.images.get(tag).id}")
    except SandboxSetupError as exc:
        raise SystemExit(str(exc)) from exc
    finally:
        client.close()


if __name__ == "__main__":
    main()
