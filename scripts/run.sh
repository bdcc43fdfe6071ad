#!/usr/bin/env bash
# One entry point that does all the set-up on a fresh Debian machine with Python 3.11, then runs
# what is asked:
#   bash scripts/run.sh demo   -> tangram demo (the local stack of compose/docker-compose.yml as processes)
#   bash scripts/run.sh test   -> ruff, mypy and the whole test suite, slow end-to-end tests included
# Set-up (idempotent): Debian packages, a venv in .venv, the package with its test extras.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3.11}"
VENV="${TANGRAM_VENV:-$ROOT/.venv}"
DEBIAN_PACKAGES=(bubblewrap redis-server python3 python3-pytest python3-pytest-xdist util-linux procps g++
  docker.io docker-compose debootstrap chromium fonts-dejavu-core)
DEBIAN_PACKAGES+=(iproute2)  # ip netns: the multi-host test's hosts
# the gateway's languages beside python, bash, C and C++: their toolchains run in the sandbox
DEBIAN_PACKAGES+=(libssl-dev default-jdk-headless golang-go nodejs node-typescript rustc ruby
  php-cli lua5.4 r-base-core sqlite3)
DEBIAN_PACKAGES+=(python3-ipykernel python3-jupyter-client)  # /run_jupyter: a kernel per request

log() { printf '[run.sh] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    log "need root for: $*"; return 1; fi
}

install_debian_packages() {
  local missing=()
  for pkg in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

make_venv() {
  if ! command -v "$PYTHON" >/dev/null; then
    log "$PYTHON not found; installing Debian's python3.11"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11 python3.11-venv >/dev/null
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv $VENV"
    "$PYTHON" -m venv "$VENV" 2>/dev/null || {
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11-venv >/dev/null
      "$PYTHON" -m venv "$VENV"; }
  fi
  local stamp="$VENV/.tangram-installed"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    log "installing tangram-celery and its test tools into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -e ".[dev]"
    install_verl
    touch "$stamp"
  fi
}

# verl pins numpy>=2 and transformers<5.11 (tritonserver's nvidia-pytriton needs numpy<2), and its
# full set pulls vllm and ray[default]; the modules the integrations import need only what the
# `integrations` extra installs, so verl itself goes in without its dependency list.
VERL_VERSION=0.9.1
install_verl() {
  "$VENV/bin/python" -m pip install -q --no-deps "verl==$VERL_VERSION"
}

# The test suites of a few published pure-Python packages (scripts/test-suites.txt), fetched once
# at set-up as pinned sdists and unpacked; the tests never download anything.
fetch_test_suites() {
  local dir="$VENV/share/tangram-test-suites" want
  want="$(grep -v '^#' scripts/test-suites.txt | grep .)"
  if [ -f "$dir/.fetched" ] && [ "$(cat "$dir/.fetched")" = "$want" ]; then return; fi
  log "fetching the test suites of: $(echo $want)"
  mkdir -p "$dir/sdists"
  # shellcheck disable=SC2086  # one argument per pinned package
  "$VENV/bin/python" -m pip download -q --no-deps --no-binary :all: -d "$dir/sdists" $want
  for sdist in "$dir"/sdists/*.tar.gz; do tar --no-same-owner -xzf "$sdist" -C "$dir"; done
  printf '%s' "$want" > "$dir/.fetched"
}

setup() {
  install_debian_packages
  make_venv
  fetch_test_suites
}

run_tests() {
  log "ruff"
  "$VENV/bin/ruff" check tangram_celery tangram_bench workers tests
  log "mypy"
  "$VENV/bin/mypy"
  log "pytest (slow end-to-end tests included)"
  set +e
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
  local status=$?
  set -e
  if [ "$status" -eq 5 ]; then
    log "pytest collected no tests: failing"
    return 1
  fi
  return "$status"
}

case "${1:-}" in
  demo) shift; setup; exec "$VENV/bin/tangram" demo "$@" ;;
  test) shift; setup; run_tests "$@" ;;
  setup) setup ;;
  *) echo "usage: bash scripts/run.sh {demo|test|setup} [args...]" >&2; exit 2 ;;
esac
