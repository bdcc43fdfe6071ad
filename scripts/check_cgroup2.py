"""The bubblewrap backend's isolation, end to end, on this host: what scripts/check-cgroup2.sh
runs (as root, and as a non-root worker in a delegated subtree). Standard library only, plus the
package from this checkout; prints one line per check and exits 1 if any fails."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tangram_celery.sandbox import ExecOutcome, ExecSpec, SandboxLimits
from tangram_celery.sandbox.bwrap import BwrapBackend

LIMITS = SandboxLimits(memory_mb=256, pids=48, workdir_mb=16, tmp_mb=16, file_size_mb=64)
MB = 1 << 20
PY = "python3 - <<'PYEOF'\n{}\nPYEOF\n"
MEMORY_HOG = """
import os, time
kids = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        b = bytearray(b"x" * (120 << 20))
        time.sleep(1.5)
        os._exit(0)
    kids.append(pid)
print("SURVIVORS", sum(1 for p in kids if os.waitpid(p, 0)[1] == 0), flush=True)
"""
FORK_BOMB = """
import os, time
n = 0
for i in range(500):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    n += 1
print("FORKED", n, flush=True)
"""
WIDEN = """
import os
try:
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    print("WIDENED", flush=True)
except OSError as exc:
    print("REFUSED", exc.errno, flush=True)
print("ON", sorted(os.sched_getaffinity(0)))
"""
CORES = ("grep Cpus_allowed_list /proc/self/status | cut -f2; "
         "(grep ':cpuset:' /proc/self/cgroup || grep '^0::' /proc/self/cgroup); sleep 1")
FILL = ("i=0; while [ $i -lt 60 ]; do i=$((i + 1)); dd if=/dev/zero of=f$i bs=512K count=1 "
        "2>&1 | grep -o 'No space left'; done | sort -u")


def run(backend: BwrapBackend, tid: str, command: str, cores: tuple[int, ...]) -> ExecOutcome:
    return backend.run(ExecSpec(tid, command, {}, 30.0, cores))


def main(bwrap: str) -> int:
    cpus = sorted(os.sched_getaffinity(0))
    print(f"uid {os.geteuid()}, cores {cpus}, cgroup {Path('/proc/self/cgroup').read_text()!r}")
    root = Path(tempfile.mkdtemp(prefix="tangram-cgroup2-check-", dir="/tmp"))
    root.chmod(0o755)
    backend = BwrapBackend(root, LIMITS, bwrap_path=bwrap, ready=0)
    print("isolation:", backend.isolation.summary())
    for reason in backend.isolation.reasons:
        print("  reason:", reason)
    failed: list[str] = []

    def check(name: str, ok: bool, detail: str, limit: str = "") -> None:
        if limit in backend.isolation.gaps:
            print(f"GAP  {name}: not enforced here, and the backend says so: {detail}")
            return
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
        if not ok:
            failed.append(name)

    try:
        first, second = cpus[0], cpus[-1]
        seen: dict[int, ExecOutcome] = {}
        threads = [threading.Thread(target=lambda c=c: seen.__setitem__(
            c, run(backend, f"cores-{c}", CORES, (c,)))) for c in {first, second}]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        check("exclusive cores", all(o.stdout.split("\n")[0] == str(c) for c, o in seen.items()),
              "; ".join(f"core {c}: {o.stdout.split(chr(10))[0]} in "
                        f"{o.stdout.split(chr(10))[1]}" for c, o in seen.items()))
        hog = run(backend, "memory", PY.format(MEMORY_HOG), (first,))
        check("memory kill reported", hog.oom_killed and "SURVIVORS 3" not in hog.stdout,
              f"oom_killed={hog.oom_killed}, {hog.stdout.strip()!r}", "memory")
        bomb = run(backend, "pids", PY.format(FORK_BOMB), (first,))
        forked = [int(w.split()[1]) for w in bomb.stdout.splitlines() if w.startswith("FORKED")]
        check("pids capped", bool(forked) and forked[0] < LIMITS.pids, f"forked {forked}",
              "pids")
        widen = run(backend, "widen", PY.format(WIDEN), (second,))
        check("affinity widening refused",
              "REFUSED 1" in widen.stdout and f"ON [{second}]" in widen.stdout,
              widen.stdout.strip().replace("\n", "; "))
        fill = run(backend, "disk", FILL, (first,))
        check("work dir capped while running",
              "No space left" in fill.stdout and fill.workdir_bytes <= (LIMITS.workdir_mb + 1) * MB,
              f"{fill.workdir_bytes} bytes written, {fill.stdout.strip()!r}", "workdir")
    finally:
        backend.close()
        os.rmdir(root)
    print("FAILED: " + ", ".join(failed) if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "bwrap"))
