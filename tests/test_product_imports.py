"""The product imports none of its test bench: neither ``tangram_bench`` nor matplotlib (the
``bench`` extra) is loaded by importing the client, a CPU node, the gateway, or any module of
``tangram_celery`` at all."""

from __future__ import annotations

import subprocess
import sys

import pytest

LOADED = "print('tangram_bench' in sys.modules, 'matplotlib' in sys.modules)"

FRONT_DOORS = """
import sys
import tangram_celery
import tangram_celery.client
import tangram_celery.pools.cpu_pool.node
import tangram_celery.gateway.server
import tangram_celery.cli
""" + LOADED

EVERY_MODULE = """
import importlib, pkgutil, sys
import tangram_celery
names = [m.name for m in pkgutil.walk_packages(tangram_celery.__path__, "tangram_celery.")
         if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
print(len(names), file=sys.stderr)
""" + LOADED


def loaded_after(script: str) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip(), done.stderr.strip()


def test_the_front_doors_load_no_bench_and_no_matplotlib() -> None:
    assert loaded_after(FRONT_DOORS)[0] == "False False"


@pytest.mark.slow
def test_no_module_of_the_product_loads_the_bench() -> None:
    out, err = loaded_after(EVERY_MODULE)
    assert int(err.splitlines()[-1]) > 150, "every module of the package was imported"
    assert out == "False False"


def test_the_check_sees_the_bench_when_it_is_loaded() -> None:
    assert loaded_after("import sys, tangram_bench.plots\n" + LOADED)[0] == "True True"
