"""The malleable runner inside a real bubblewrap sandbox, on the sandbox's own Python and pytest:
its modules shipped as the action's files (standard library only besides pytest), its socket in
the sandbox's /tmp, its workers children of the action. The verdict equals a plain run's in the
same sandbox, and the output cap keeps the head and the tail, where the summary line is."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import Run
from malleable_runs import ROOT, malleable_args, verdict_of
from test_malleable import MIXED

RUNNER = ".runner"


def runner_files() -> dict[str, str]:
    """The source of every tangram_celery module the plugin imports, under ``.runner/``."""
    listed = subprocess.run(
        ["/usr/bin/python3", "-c",
         "import json, sys\nimport tangram_celery.sandbox.malleable.plugin\n"
         "print(json.dumps(sorted(m.__file__ for n, m in sys.modules.items()\n"
         "                        if n.startswith('tangram_celery'))))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    paths = [Path(p) for p in json.loads(listed.stdout)]
    return {f"{RUNNER}/{p.relative_to(ROOT)}": p.read_text() for p in paths}


def test_a_malleable_run_in_a_sandbox(run: Run, two_cores: tuple[int, int]) -> None:
    files = {**runner_files(), "suite/test_mixed.py": MIXED}
    pytest = f"PYTHONPATH=/work/{RUNNER} python3 -m pytest -q -p no:cacheprovider -rA"
    plain = run(f"{pytest} suite", files=files, cores=two_cores, timeout_s=120)
    malleable = run(f"{pytest} {' '.join(malleable_args(2))} suite", files=files,
                    cores=two_cores, timeout_s=120, output_cap_bytes=1024)
    assert verdict_of(plain.stdout, plain.exit_code or 0).status == 1, plain.stdout
    assert verdict_of(malleable.stdout, malleable.exit_code or 0) == verdict_of(
        plain.stdout, plain.exit_code or 0), malleable.stdout + malleable.stderr
    assert malleable.stdout_cut_bytes > 0, "the -rA output is over the cap of 1 KiB"
    assert malleable.stdout.splitlines()[0].endswith("[100%]"), "the head: the progress line"
