#!/usr/bin/env bash
# The embedded sandbox's real cgroup v2 path, end to end, on a cgroup v2 host (run as root):
# exclusive cores, an OOM kill reported, pids capped, affinity widening refused, the work dir
# capped while an action runs. Phase 1 runs the node as root; phase 2 as a non-root worker
# (uid 65534) in a subtree delegated to it, as systemd's Delegate=yes gives one.
#   bash scripts/check-cgroup2.sh          # exits 3 on a host that is not cgroup v2
#   bash scripts/check-cgroup2.sh --any    # the same checks on whatever hierarchy this is
# Needs bubblewrap (bwrap; TANGRAM_BWRAP=path), prlimit and python3 >= 3.11 (PYTHON=path).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ANY=0; [ "${1:-}" = "--any" ] && ANY=1
PY="${PYTHON:-python3}"
BWRAP="${TANGRAM_BWRAP:-$(command -v bwrap || true)}"
FS="$(stat -fc %T /sys/fs/cgroup)"
echo "kernel $(uname -r); /sys/fs/cgroup: $FS; bwrap: ${BWRAP:-missing}; $("$PY" --version)"
[ -n "$BWRAP" ] || { echo "bubblewrap not found: apt-get install bubblewrap"; exit 2; }
if [ "$FS" != cgroup2fs ]; then
  [ "$ANY" = 1 ] || { echo "not a cgroup v2 host (mount | grep cgroup)"; exit 3; }
else
  echo "root controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
fi

echo "== phase 1: the node as root"
status=0
"$PY" scripts/check_cgroup2.py "$BWRAP" || status=1

if [ "$FS" = cgroup2fs ] && [ "$(id -u)" = 0 ]; then
  echo "== phase 2: the node as uid 65534 in a delegated subtree"
  DELEG=/sys/fs/cgroup/tangram-check-delegated
  mkdir -p "$DELEG"
  for c in cpuset memory pids; do echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control || true; done
  chown 65534:65534 "$DELEG" "$DELEG/cgroup.procs" "$DELEG/cgroup.subtree_control" \
    "$DELEG/cgroup.threads"
  COPY="$(mktemp -d /tmp/tangram-check-src-XXXX)"
  cp -r tangram_celery scripts "$COPY"/ && chmod -R a+rX "$COPY"
  sh -c "echo \$\$ > $DELEG/cgroup.procs && exec setpriv --reuid=65534 --regid=65534 \
    --clear-groups env HOME=/tmp $PY $COPY/scripts/check_cgroup2.py $BWRAP" || status=1
  rm -rf "$COPY"
  find "$DELEG" -mindepth 1 -depth -type d -exec rmdir {} \; 2>/dev/null || true
  rmdir "$DELEG" 2>/dev/null || true
fi
exit "$status"
