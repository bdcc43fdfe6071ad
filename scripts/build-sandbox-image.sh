#!/usr/bin/env bash
# Build the Docker sandbox image from a local Debian rootfs (debootstrap + docker import) and
# load it into an engine; no registry is needed. Does nothing when the tag already exists.
#   bash scripts/build-sandbox-image.sh [--docker-url unix:///var/run/docker.sock]
#                                       [--tag tangram-sandbox:bookworm-1] [--mirror URI] [--force]
# The Debian mirror comes from this machine's apt configuration unless --mirror is given.
# Needs root (debootstrap), debootstrap and a running engine: see `bash scripts/run.sh setup`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${TANGRAM_VENV:-$ROOT/.venv}/bin/python"
if [ ! -x "$PYTHON" ]; then
  echo "build-sandbox-image: no venv at ${PYTHON%/bin/python}; run \`bash scripts/run.sh setup\`" >&2
  exit 1
fi
cd "$ROOT"
exec "$PYTHON" -m tangram_celery.sandbox.docker.image "$@"
