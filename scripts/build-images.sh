#!/usr/bin/env bash
# Build the local stack's images (compose/docker-compose.yml) without any registry: the base image
# from a Debian rootfs (debootstrap + docker import, cached), the tangram image from
# compose/Dockerfile with `--network host` so pip reaches the package index, and the CPU node's
# sandbox image (the same debootstrap code as scripts/build-sandbox-image.sh). Each is built only
# when missing or out of date.
#   bash scripts/build-images.sh [--docker-url unix:///var/run/docker.sock] [--force]
#                                [--base-image python:3.11-slim] [--extras reward] [--no-wheels]
#                                [--no-sandbox-image] [--mirror URI] [--cache-dir /var/cache/tangram]
# Needs root (debootstrap), debootstrap and a running engine: see `bash scripts/run.sh setup`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${TANGRAM_VENV:-$ROOT/.venv}/bin/python"
if [ ! -x "$PYTHON" ]; then
  echo "build-images: no venv at ${PYTHON%/bin/python}; run \`bash scripts/run.sh setup\`" >&2
  exit 1
fi
cd "$ROOT"
exec "$PYTHON" -m tangram_celery.stack.images "$@"
