"""The warm executor's behaviour: Python code actions in the forked interpreter, environment and
parallelism, one executor per trajectory across its actions, and the ready sandboxes."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from test_sandbox_attacks import Run

from tangram_celery.errors import SandboxSetupError
from tangram_celery.pools.cpu_pool.worker import backend_options
from tangram_celery.sandbox import ExecSpec, SandboxLimits, make_backend, rewrite_parallelism
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.sandbox.bwrap import action as bwrap_action
from tangram_celery.sandbox.bwrap import placement as bwrap_placement
from tangram_celery.sandbox.bwrap.warm import child_pid
from tangram_celery.settings import Settings


def _python(run: Run, code: str, **kw: object) -> tuple[int | None, str, str]:
    out = run("unused", files={"main.py": code}, python="main.py", **kw)
    return out.exit_code, out.stdout, out.stderr


def test_python_code_runs_as_main_with_its_env_and_stdin(run: Run) -> None:
    code = ("import os, sys\nprint(__name__, sys.argv, os.getcwd(), os.environ['TANGRAM_UNITS'],"
            " os.environ.get('EXTRA'), sys.stdin.read().strip(), os.getpid() != 1)")
    exit_code, stdout, _ = _python(run, code, env={"EXTRA": "yes"}, stdin="fed\n",
                                   cores=(0, 1))
    assert exit_code == 0
    assert stdout == "__main__ ['/work/main.py'] /work 2 yes fed True\n"


def test_python_exit_codes_and_tracebacks_are_the_interpreters(run: Run) -> None:
    assert _python(run, "import sys\nsys.exit(7)")[0] == 7
    assert _python(run, "raise SystemExit('bye')")[:1] == (1,)
    code, _, err = _python(run, "def f():\n    raise ValueError('boom')\nf()")
    assert code == 1 and "ValueError: boom" in err and "Traceback" in err
    assert _python(run, "import atexit\natexit.register(print, 'late')\nprint('early')")[1] \
        == "early\nlate\n"
    assert _python(run, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")[0] == 137


def test_the_script_is_removed_and_sibling_modules_import(run: Run) -> None:
    out = run("unused", files={"main.py": "import helper\nprint(helper.X)",
                               "helper.py": "X = 42"}, python="main.py")
    assert out.stdout == "42\n"
    assert "main.py" not in run("ls").stdout.split()


def test_one_executor_serves_every_action_of_a_trajectory(run: Run,
                                                          backend: BwrapBackend) -> None:
    run("true")
    executor = backend._trajs["t1"].executor
    for _ in range(5):
        assert run("echo $TANGRAM_UNITS", cores=(0, 1)).stdout == "2\n"
    assert backend._trajs["t1"].executor is executor
    assert run("echo $$").stdout.strip() != "1", "an action ran as the sandbox's pid 1"


def test_pytest_gets_its_parallelism_in_the_warm_sandbox(run: Run) -> None:
    files = {f"test_{i}.py": f"def test_{i}():\n    assert True\n" for i in range(2)}
    out = run(rewrite_parallelism("python3 -m pytest -q -p no:cacheprovider", 2), files=files,
              cores=(0, 1), timeout_s=60)
    assert out.exit_code == 0, out.stdout + out.stderr
    assert "2 workers" in out.stdout or "gw" in out.stdout or "2 passed" in out.stdout


def test_ready_sandboxes_serve_first_actions_and_are_never_shared(
    sandbox_tools: None, sandbox_root: Path
) -> None:
    with BwrapBackend(sandbox_root, SandboxLimits(), ready=2) as backend:
        deadline = time.monotonic() + 30
        while backend._ready.count() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert backend._ready.count() == 2
        first = backend.run(ExecSpec("r1", "echo one > f; ls -A; id -u", {}, 20.0, (0,)))
        second = backend.run(ExecSpec("r2", "ls -A", {}, 20.0, (0,)))
        assert first.stdout.startswith("f\n") and second.stdout == ""
        uids = {backend._trajs[t].uid for t in ("r1", "r2")}
        assert len(uids) == 2
        assert backend._trajs["r1"].home.name != backend._trajs["r2"].home.name
        assert backend.run(ExecSpec("r1", "cat f", {}, 20.0, (0,))).stdout == "one\n"
        backend.end_trajectory("r1")
        while backend._ready.count() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert backend._ready.count() == 2, "the ready sandboxes were not refilled"
        third = backend.run(ExecSpec("r3", "ls -A", {}, 20.0, (0,)))
        assert third.stdout == ""


def test_a_child_gone_before_it_was_placed_is_started_again_once(
        run: Run, backend: BwrapBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    assert backend.cgroups is not None, "the node needs its cgroups to place an action's child"
    killed: list[int] = []

    def vanishing(control: socket.socket, deadline: float) -> int | None:
        pid = child_pid(control, deadline)
        if pid is not None and not killed:
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)
            while Path(f"/proc/{pid}").exists():
                time.sleep(0.005)
        return pid

    monkeypatch.setattr(bwrap_placement, "child_pid", vanishing)
    busy = threading.Thread(target=run, args=("sleep 2",))
    busy.start()  # it holds the trajectory's cgroups: the next action's child is moved
    time.sleep(0.5)
    out = run("echo ran >> runs.txt; cat runs.txt")
    busy.join()
    assert killed, "the fault was never injected"
    assert (out.exit_code, out.stdout) == (0, "ran\n"), "the vanished child ran, or twice"
    assert run("echo next").stdout == "next\n"


def _failing_start(monkeypatch: pytest.MonkeyPatch, times: int, field: str = "cwd"
                   ) -> list[str]:
    """Break the first ``times`` requests: a work dir that is not there (a forked child fails
    after its go, before the command) or, for ``field="argv"``, a shell that is not there (a
    spawn fails)."""
    sent: list[str] = []
    plain = bwrap_action.ActionRunner._request

    def broken(self: bwrap_action.ActionRunner, spec: ExecSpec,
               group: object) -> dict[str, object]:
        request = plain(self, spec, group)  # type: ignore[arg-type]
        if len(sent) < times and field == "argv" and "argv" in request:
            request["argv"] = ["/no-such-dir/sh", *request["argv"][1:]]
        elif len(sent) < times:
            request["cwd"] = "/no-such-dir"
        sent.append(str(request["cwd"] if field == "cwd" else request.get("argv", ["-"])[0]))
        return request

    monkeypatch.setattr(bwrap_action.ActionRunner, "_request", broken)
    return sent


def test_a_child_that_could_not_start_the_command_is_started_again_once(
        run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _failing_start(monkeypatch, times=1)
    out = run("echo ran >> runs.txt; cat runs.txt")
    assert sent == ["/no-such-dir", "/work"]
    assert (out.exit_code, out.stdout) == (0, "ran\n"), "read as a user exit status, or ran twice"


def test_a_command_whose_spawn_fails_is_started_again_once(
        run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _failing_start(monkeypatch, times=1, field="argv")
    out = run("echo ran >> runs.txt; cat runs.txt")
    assert sent == ["/no-such-dir/sh", "/bin/sh"]
    assert (out.exit_code, out.stdout) == (0, "ran\n"), "read as a user exit status, or ran twice"
    _failing_start(monkeypatch, times=99, field="argv")
    with pytest.raises(SandboxSetupError, match=r"could not start.*no-such-dir/sh.*2 tries"):
        run("echo never")


def test_a_command_that_never_starts_is_a_clear_setup_error(
        run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_start(monkeypatch, times=99)
    with pytest.raises(SandboxSetupError, match=r"could not start.*no-such-dir.*2 tries"):
        run("echo never")
    with pytest.raises(SandboxSetupError, match="could not start"):
        run("x", files={"main.py": "print(1)"}, python="main.py")
    monkeypatch.undo()
    assert run("echo next").stdout == "next\n"


def test_the_number_of_ready_sandboxes_is_a_setting(
    sandbox_tools: None, sandbox_root: Path
) -> None:
    for env, expected in (({}, 2), ({"TANGRAM_SANDBOX_READY": "1"}, 1),
                          ({"TANGRAM_SANDBOX_READY": "0"}, 0)):
        options = backend_options(Settings.from_env(env).sandbox, "node-a")
        assert options["ready"] == expected
        backend = make_backend("bwrap", sandbox_root / str(expected), SandboxLimits(), **options)
        assert isinstance(backend, BwrapBackend)
        try:
            deadline = time.monotonic() + 30
            while backend._ready.count() < expected and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.2)
            assert backend._ready.count() == expected
        finally:
            backend.close()
