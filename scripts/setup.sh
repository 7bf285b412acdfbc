#!/usr/bin/env bash
# One-time set-up, run by `make setup` (and so by `make run` / `make test`): Debian packages for
# the emulated network, then a Python virtual environment with requirements.txt's exact pins and
# this project itself, editable (testbed, trainer, prefill and traffic importable from
# anywhere, the `geodc` command in
# .venv/bin). Safe to run again: it installs only what is missing, and reinstalls the venv's
# part when requirements.txt or pyproject.toml change. GEODC_PIP_HASHES=FILE (the Dockerfile
# sets requirements-container.txt) installs FILE with pip's --require-hashes instead of
# requirements.txt, and leaves pip as FILE pins it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

# tool -> Debian package
declare -A NEED=([sshd]=openssh-server [mnexec]=mininet [iperf3]=iperf3 [iptables]=iptables [brctl]=bridge-utils
                 [ifconfig]=net-tools [ip]=iproute2 [ping]=iputils-ping [make]=make)
missing=()
for tool in "${!NEED[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${NEED[$tool]}")
done
[ -e /usr/lib/x86_64-linux-gnu/libpcap.so.0.8 ] || [ -e /usr/lib/aarch64-linux-gnu/libpcap.so.0.8 ] \
  || missing+=(libpcap0.8)
"$PYTHON" -c "import venv, ensurepip" >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "error: set-up installs Debian packages (${missing[*]}) and the testbed builds network namespaces: run as root (sudo make ...)" >&2
    exit 2
  fi
  echo "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Machines of this project's kind keep torch's CPU wheel on local disk; use it when it is there
# (PyPI's torch for Linux is the CUDA build, several GB).
if [ -z "${PIP_FIND_LINKS:-}" ] && [ -d /opt/wheels ]; then
  export PIP_FIND_LINKS=/opt/wheels
fi

# The stamp covers both files: a changed pin or a changed [project] table reinstalls.
stamp=.venv/.requirements.sha256
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $("$PYTHON" --version)"
  "$PYTHON" -m venv .venv
fi
# The editable install must point at this checkout (a moved checkout, or a .venv another
# checkout installed itself into, does not). A .venv that is a link (a git worktree sharing
# another checkout's) keeps that checkout's: this one's tests and runs start in this checkout,
# whose folder then puts its own packages first on the path.
repo=$(pwd -P)
shared=$([ -L .venv ] && echo 1 || true)
installed() {   # asked from / so that the working directory does not put testbed on the path
  [ -n "$shared" ] || { [ -x .venv/bin/geodc ] && [ "$(cd / && "$repo/.venv/bin/python" -c 'import testbed, trainer; print(testbed.__file__, trainer.__file__)' 2>/dev/null)" = "$repo/testbed/__init__.py $repo/trainer/__init__.py" ]; }
}
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! installed; then
  echo "installing requirements.txt and the project (editable) into .venv (first time: about a minute)"
  if [ -n "${GEODC_PIP_HASHES:-}" ]; then
    # the container (Dockerfile): every file checked against its sha256, pip itself pinned
    .venv/bin/python -m pip install -q --require-hashes -r "$GEODC_PIP_HASHES"
  else
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    .venv/bin/python -m pip install -q -r requirements.txt
  fi
  # --no-deps: requirements.txt holds them all, pinned; --no-build-isolation: the venv's own
  # setuptools (torch needs >= 77, PEP 660 editable installs >= 64) builds it, offline;
  # -qq: not setuptools' warning about a testbed/ folder in the working directory
  if [ -n "$shared" ]; then
    echo "note: .venv is a link to $(readlink -f .venv): its editable install is left as it is"
  else
    .venv/bin/python -m pip install -qq --no-deps --no-build-isolation -e .
  fi
  if ! installed; then
    echo "error: after pip install -e ., testbed does not import from $repo/testbed (or .venv/bin/geodc is missing)" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
echo "set-up done"
