"""A CPU action's exec spec: code actions name their script for the warm interpreter."""

from __future__ import annotations

from tangram_celery.client import code_action, command_action
from tangram_celery.pools.conversion import SANDBOX_PYTHON, exec_spec


def test_a_code_action_names_its_script_and_keeps_a_shell_form() -> None:
    action = code_action("t", "print(1)")
    spec = exec_spec(action, (0,), (3,), 30.0)
    assert spec.python is not None and spec.files[spec.python] == "print(1)"
    assert spec.command.startswith(f"{SANDBOX_PYTHON} {spec.python};")
    assert spec.cores == (3,) and spec.env["TANGRAM_UNITS"] == "1"


def test_a_command_action_has_no_script_and_gets_its_parallelism() -> None:
    spec = exec_spec(command_action("t", "pytest -q", cpu=(1, 4)), (0, 1), (0, 1), 30.0)
    assert spec.python is None and spec.command == "pytest -n 2 -q"
    assert spec.env["TANGRAM_UNITS"] == "2"


def test_a_malleable_test_run_ships_the_runner_and_other_commands_stay() -> None:
    from tangram_celery.client import test_run_action
    from tangram_celery.pools.conversion import MALLEABLE_CONTROL, MALLEABLE_RUNNER
    from tangram_celery.sandbox.malleable import PLUGIN

    action = test_run_action("t", "python3 -m pytest -q tests",
                             payload={"malleable": True, "env": {"PYTHONPATH": "/work/src"}})
    spec = exec_spec(action, (0, 1, 2), (4, 5, 6), 30.0)
    assert spec.command == (
        f"python3 -m pytest -p {PLUGIN} --malleable=3 --malleable-control=/work/"
        f"{MALLEABLE_CONTROL} -q tests; s=$?; rm -rf /work/{MALLEABLE_RUNNER}; exit $s")
    assert f"{MALLEABLE_RUNNER}/tangram_celery/sandbox/malleable/plugin.py" in spec.files
    assert spec.env["PYTHONPATH"] == f"/work/{MALLEABLE_RUNNER}:/work/src"
    plain = exec_spec(test_run_action("t", "python3 solve.py", payload={"malleable": True}),
                      (0, 1), (0, 1), 30.0)
    assert plain.command == "python3 solve.py" and not plain.files
    assert "PYTHONPATH" not in plain.env


def test_the_node_decides_whether_a_pytest_run_is_malleable() -> None:
    from tangram_celery.client import test_run_action
    from tangram_celery.pools.conversion import exec_specs
    from tangram_celery.sandbox.malleable import PLUGIN

    said = test_run_action("t", "pytest -q tests", cpu=(1, 4))
    (made,) = exec_specs(said, (0, 1), (0, 1), 30.0, malleable=True)
    assert f"-p {PLUGIN} --malleable=2" in made.command
    (kept,) = exec_specs(said, (0, 1), (0, 1), 30.0)
    assert kept.command == "pytest -n 2 -q tests", "by default as the action says: not asked"
    asked = test_run_action("t", "pytest -q tests", cpu=(1, 4), payload={"malleable": True})
    (refused,) = exec_specs(asked, (0, 1), (0, 1), 30.0, malleable=False)
    assert refused.command == "pytest -n 2 -q tests"
