#!/usr/bin/env bash
# One-time set-up, run by `make setup` (and so by `make run` / `make test`): Debian packages for
# the emulated network, then a Python virtual environment with requirements.txt's exact pins.
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ "$(id -u)" != 0 ]; then
  echo "error: set-up installs Debian packages and the testbed builds network namespaces: run as root (sudo make ...)" >&2
  exit 2
fi

# tool -> Debian package
declare -A NEED=([mnexec]=mininet [iperf3]=iperf3 [iptables]=iptables [brctl]=bridge-utils
                 [ifconfig]=net-tools [ip]=iproute2 [ping]=iputils-ping [make]=make)
missing=()
for tool in "${!NEED[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${NEED[$tool]}")
done
[ -e /usr/lib/x86_64-linux-gnu/libpcap.so.0.8 ] || [ -e /usr/lib/aarch64-linux-gnu/libpcap.so.0.8 ] \
  || missing+=(libpcap0.8)
"$PYTHON" -c "import venv, ensurepip" >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
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

stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $("$PYTHON" --version)"
  "$PYTHON" -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing requirements.txt into .venv (first time: about a minute)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q -r requirements.txt
  echo "$want" > "$stamp"
fi
echo "set-up done"
