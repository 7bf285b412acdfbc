#!/usr/bin/env bash
# The container check, the commands CI runs (.github/workflows/ci.yml): build the Dockerfile's
# image, then in one privileged container run `.ci/run` (make test; the stock-kernel ring left
# out, GEODC_CI_STOCK_RING=0: it boots its own kernel under QEMU, the same inside as outside) and
# `make run`, and check what differs in a container: real-time priority granted or refused (and
# the run's record of it in env.json), /run and sysfs as seen inside, nothing left behind
# (namespaces, interfaces, processes, registry files) inside or on the host, and the host's
# root-namespace sysctls the same after as before. Prints a summary with the measured figures;
# exits non-zero on any failure. As root, with a Docker daemon running:
#   scripts/container_check.sh              everything
#   scripts/container_check.sh --build-only the base image and the image alone
# (the container itself runs it with --inside).
# The base image (debian:12) is used if present, else pulled, else made with debootstrap from a
# Debian mirror and imported as geodc-base:bookworm (its own tag: nothing else on the machine
# takes it for Debian's image).
# The image's pip installs requirements-container.txt (requirements.txt's pins, setuptools and
# pip, each with the sha256 of its file: scripts/pin_hashes.py writes it) with --require-hashes.
# Settings (environment):
#   IMAGE          the image's tag (geo-dc-testbed)
#   OUT            logs and summary (results/container-check)
#   WHEELS         where the build's pip finds those files: "index" (the
#                  Dockerfile's: PyPI and PyTorch's CPU index) or "host" (the host's own pip
#                  fetches them, with its configuration: local wheel folders, mirrors,
#                  certificates, into $CACHE/wheels, served to the build on 127.0.0.1 alone,
#                  nothing else reachable). Default: host where /opt/wheels exists (machines
#                  that keep torch's CPU wheel there, as scripts/setup.sh), else index.
#   CACHE          the wheels, and the debootstrap tree while it is made (/var/tmp/geodc-container):
#                  made root's, mode 0700; refused if it exists owned by anyone else, open to
#                  anyone else's writes, or is a symbolic link (pip would install, as root, a
#                  wheel another user put there)
#   DEBIAN_MIRROR  debootstrap's mirror (http://deb.debian.org/debian)
#   WHEEL_PORT     the wheel server's port on 127.0.0.1 (38117)
set -euo pipefail
cd "$(dirname "$0")/.."

# ---- inside the container ------------------------------------------------------------------
inside() {
  local out=/out fail=0
  mkdir -p "$out"
  : > "$out/inside.txt"
  note() { echo "$1=$2" >> "$out/inside.txt"; }
  bad() { echo "FAIL: $1"; note "fail" "$1"; fail=1; }

  # what a container changes: /run is the image's own folder (no tmpfs), sysfs shows this
  # network namespace's devices, the cgroup may give real-time tasks no time at all
  note run_mount "$(findmnt -no FSTYPE,OPTIONS --target /run)"
  note sys_mount "$(findmnt -no FSTYPE,OPTIONS /sys)"
  note sys_class_net "$(ls /sys/class/net | tr '\n' ' ')"
  note cgroup "$(stat -fc %T /sys/fs/cgroup)"
  local rt_budget=none
  for f in /sys/fs/cgroup/cpu/cpu.rt_runtime_us /sys/fs/cgroup/cpu,cpuacct/cpu.rt_runtime_us; do
    [ -r "$f" ] && { rt_budget="$(cat "$f") us per $(cat "${f%runtime_us}period_us") us"; break; }
  done
  note cgroup_rt_runtime "$rt_budget"
  note sched_rt_runtime_us "$(cat /proc/sys/kernel/sched_rt_runtime_us)"
  local probe
  if probe=$(chrt -f 1 true 2>&1); then note rt_probe granted
  else note rt_probe "refused (${probe##*: })"; fi
  # sysfs is this network namespace's: its devices alone (lo, with --network none)
  [ "$(ls /sys/class/net | tr '\n' ' ')" = "$(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort | tr '\n' ' ')" ] \
    || bad "/sys/class/net ($(ls /sys/class/net | tr '\n' ' ')) is not this namespace's links"

  # the image holds exactly requirements.txt's pins (torch's local tag, +cpu, aside), and
  # nothing else but pip, setuptools (torch's dependency, unpinned) and geodc itself
  local pins extra
  pins=$(diff <(sed 's/#.*//; s/ *$//; /^$/d' requirements.txt | tr 'A-Z_' 'a-z-' | sort) \
              <(.venv/bin/python -m pip freeze --exclude-editable 2>/dev/null | sed 's/+[a-z0-9.]*$//' \
                | tr 'A-Z_' 'a-z-' | grep -v '^setuptools==' | sort) || true)
  extra=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | grep -iE '^(pip|setuptools)==' | tr '\n' ' ')
  note pins "$([ -z "$pins" ] && echo "requirements.txt exactly" || echo "differ: $pins" | tr '\n' ' '); beside: $extra"
  [ -z "$pins" ] || bad "the image's packages differ from requirements.txt: $pins"

  local t0 t1 rc
  t0=$(date +%s)
  set +e; GEODC_CI_STOCK_RING=0 .ci/run 2>&1 | tee "$out/suite.log"; rc=${PIPESTATUS[0]}; set -e
  t1=$(date +%s)
  note suite_rc "$rc"; note suite_s "$((t1 - t0))"
  note suite_counts "$(grep -E '^=*.* (passed|failed|error)' "$out/suite.log" | tail -1 | tr -d '=' | xargs)"
  [ "$rc" = 0 ] || bad ".ci/run exited $rc"

  t0=$(date +%s)
  set +e; make run 2>&1 | tee "$out/run.log"; rc=${PIPESTATUS[0]}; set -e
  t1=$(date +%s)
  note run_rc "$rc"; note run_s "$((t1 - t0))"
  [ "$rc" = 0 ] || bad "make run exited $rc"
  note run_model "$(grep -m1 -o 'model: iteration [^,]*' "$out/run.log" || true)"
  local metrics env
  metrics=$(grep -m1 -o 'results: .*metrics.json' "$out/run.log" | cut -d' ' -f2 || true)
  env="$(dirname "${metrics:-none/x}")/env.json"
  if [ -r "$env" ]; then
    cp "$env" "$out/env.json"
    local record
    record=$(.venv/bin/python -c 'import json,sys; print(" ".join(f"{k}={v}" for k, v in
      sorted(json.load(open(sys.argv[1]))["network"]["delay_line_realtime"].items())))' "$env")
    note run_realtime "$record"
    # the run's record agrees with what this container allows
    case "$(grep '^rt_probe=' "$out/inside.txt")" in
      rt_probe=granted) [[ "$record" != *refused* && "$record" == *fifo:* ]] \
                          || bad "real-time granted here, but the run recorded: $record" ;;
      *) [[ "$record" != *fifo:* && "$record" == *refused* ]] \
           || bad "real-time refused here, but the run recorded: $record" ;;
    esac
  else
    bad "make run: no env.json (${env})"
  fi

  # nothing left: registry files, network namespaces other than the container's, interfaces
  # other than lo, iptables rules, processes other than this script
  local left
  left=$(ls /run/geotestbed/ 2>/dev/null | tr '\n' ' ')
  note left_registry "${left:-none}"; [ -z "$left" ] || bad "registry files left: $left"
  local own_net; own_net=$(readlink /proc/$$/ns/net)
  left=$(for p in /proc/[0-9]*; do readlink "$p/ns/net" 2>/dev/null || true; done | sort -u | grep -vxF "$own_net" | tr '\n' ' ' || true)
  note left_netns "${left:-none}"; [ -z "$left" ] || bad "network namespaces left: $left"
  left=$(ip -o link show | awk -F': ' '{print $2}' | grep -vx lo | tr '\n' ' ' || true)
  note left_links "${left:-none}"; [ -z "$left" ] || bad "interfaces left: $left"
  left=$(iptables-save 2>/dev/null | grep -c '^-A' || true)
  note left_iptables_rules "$left"; [ "$left" = 0 ] || bad "iptables rules left: $left"
  ps -eo pid=,ppid=,args= > /tmp/ps.txt
  left=$(awk -v me=$$ '$1 != me && $2 != me' /tmp/ps.txt | tr '\n' ';' || true)
  note left_procs "${left:-none}"; [ -z "$left" ] || bad "processes left: $left"
  note namespaces "net=$own_net pid=$(readlink /proc/$$/ns/pid)"
  return "$fail"
}
if [ "${1:-}" = --inside ]; then inside; exit $?; fi

# ---- on the host ---------------------------------------------------------------------------
IMAGE=${IMAGE:-geo-dc-testbed}
OUT=${OUT:-results/container-check}
CACHE=${CACHE:-/var/tmp/geodc-container}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WHEELS=${WHEELS:-$([ -d /opt/wheels ] && echo host || echo index)}
case "$WHEELS" in host|index) ;; *)
  echo "error: WHEELS: '$WHEELS' is neither host nor index; WHEELS=index uses PyPI and PyTorch's CPU index" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "error: run as root (sudo): the check reads every host process's namespaces" >&2; exit 2; }
# The cache is root's alone: made 0700 (mkdir without -p fails if another made it first), or
# refused as it is found.
mkdir -m 700 "$CACHE" 2>/dev/null || true
if [ -L "$CACHE" ] || [ ! -d "$CACHE" ] || [ "$(stat -c %u "$CACHE")" != 0 ] \
   || [ $(( 0$(stat -c %a "$CACHE") & 022 )) != 0 ]; then
  echo "error: CACHE: $CACHE is not a folder owned by root and writable by root alone ($(stat -c '%U %A' "$CACHE" 2>/dev/null || echo missing)); remove it or set CACHE to one that is (it is made mode 0700 if missing)" >&2
  exit 2
fi
docker info >/dev/null 2>&1 || { echo "error: docker: no daemon answers; start dockerd (or the docker service)" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd -P)
failures=()
started=$(date +%s)

# The root-namespace sysctls a container could reach: the list the test session checks after
# every test (tests/root_sysctls.py: net.core, net.ipv4, net.ipv6.conf.all, kernel.pty,
# fs.file-max, less the two that move on their own), compared name by name.
netns_held() { for p in /proc/[0-9]*; do readlink "$p/ns/net" 2>/dev/null || true; done | sort -u; }
python3 tests/root_sysctls.py save "$OUT/sysctl-before.json"
netns_held > "$OUT/netns-before.txt"
ip -o link show | awk -F': ' '{print $2}' | sort > "$OUT/links-before.txt"
ls /run/geotestbed 2>/dev/null | sort > "$OUT/registry-before.txt" || true

# ---- the base image ----
BASE=debian:12
if docker image inspect debian:12 >/dev/null 2>&1; then
  base="present"
elif timeout 300 docker pull -q debian:12 >/dev/null 2>&1; then
  base="pulled"
elif docker image inspect geodc-base:bookworm >/dev/null 2>&1; then
  BASE=geodc-base:bookworm; base="made with debootstrap earlier"
else
  command -v debootstrap >/dev/null \
    || { echo "error: base image: debian:12 is neither present nor pullable, and debootstrap is missing; apt-get install debootstrap" >&2; exit 2; }
  root="$CACHE/bookworm"
  rm -rf "$root"
  echo "base: debootstrap bookworm from $DEBIAN_MIRROR (about a minute)"
  debootstrap --variant=minbase bookworm "$root" "$DEBIAN_MIRROR" > "$OUT/debootstrap.log" 2>&1 \
    || { echo "error: debootstrap failed, see $OUT/debootstrap.log" >&2; exit 1; }
  # the official image's sources: bookworm, its updates and security
  security=${DEBIAN_MIRROR%/debian}/debian-security
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
    "$DEBIAN_MIRROR" "$DEBIAN_MIRROR" "$security" > "$root/etc/apt/sources.list"
  # this host's apt settings for its mirror (e.g. a frozen mirror's Release dates accepted)
  for f in /etc/apt/apt.conf.d/*; do
    grep -q '^Acquire::' "$f" 2>/dev/null && cp "$f" "$root/etc/apt/apt.conf.d/"
  done
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  BASE=geodc-base:bookworm
  tar -C "$root" -c . | docker import -c 'CMD ["bash"]' - "$BASE" >/dev/null
  rm -rf "$root"
  base="made with debootstrap"
fi
echo "base: $BASE $base"

# ---- the image ----
build_args=(--build-arg "BASE=$BASE")
server=
stop_server() { [ -z "$server" ] || kill "$server" 2>/dev/null || true; }
trap stop_server EXIT
if [ "$WHEELS" = host ]; then
  PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
  [ "$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = 3.11 ] \
    || { echo "error: PYTHON: $PYTHON is not Python 3.11 (Debian 12's); set PYTHON to a 3.11 with pip" >&2; exit 2; }
  echo "wheels: the host's pip fetches requirements-container.txt's files into $CACHE/wheels"
  # --require-hashes: each file is the one hashed in requirements-container.txt (a file already
  # in the cache is checked too, and fetched again if it differs); the build checks them again
  "$PYTHON" -m pip download -q --require-hashes -r requirements-container.txt -d "$CACHE/wheels" \
    > "$OUT/wheels.log" 2>&1 || { echo "error: pip download failed, see $OUT/wheels.log" >&2; exit 1; }
  # a fixed port: the address is a build argument, and a new one would rebuild the pins' layer
  port=${WHEEL_PORT:-38117}
  "$PYTHON" -u -m http.server --bind 127.0.0.1 --directory "$CACHE/wheels" "$port" > "$OUT/wheel-server.log" 2>&1 &
  server=$!
  for _ in $(seq 50); do
    grep -q "port $port" "$OUT/wheel-server.log" && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.2
  done
  grep -q "port $port" "$OUT/wheel-server.log" \
    || { echo "error: the wheel server did not start on 127.0.0.1:$port (WHEEL_PORT), see $OUT/wheel-server.log" >&2; exit 1; }
  build_args=(--build-arg PIP_NO_INDEX=1 --build-arg PIP_EXTRA_INDEX_URL=
              --build-arg "PIP_FIND_LINKS=http://127.0.0.1:$port/")
fi
t0=$(date +%s)
echo "build: docker build --network host -t $IMAGE ${build_args[*]} ."
docker build --network host -t "$IMAGE" "${build_args[@]}" . > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; echo "error: docker build failed, see $OUT/build.log" >&2; exit 1; }
build_s=$(( $(date +%s) - t0 ))
stop_server; server=
if [ "${1:-}" = --build-only ]; then echo "built $IMAGE in ${build_s} s"; exit 0; fi

# ---- the container: .ci/run, make run, the checks inside ----
# --privileged gives the container every capability the kernel knows; where the host's own root
# lacks some (a sandboxed VM: its bounding set), the container cannot start so, and gets the
# closest instead: every capability the host has, no seccomp or AppArmor profile, /proc
# unmasked, the one device the testbed opens; sysfs stays read-only then (the summary says
# which). --network none: everything is in the image, and no traffic reaches the host's network.
missing=()
last=$(cat /proc/sys/kernel/cap_last_cap)
bnd=$((16#$(awk '/^CapBnd/ {print $2}' /proc/self/status)))
for ((c = 0; c <= last; c++)); do
  (( (bnd >> c) & 1 )) || missing+=("$c")
done
if [ ${#missing[@]} = 0 ]; then
  mode=(--privileged)
  privileged="yes"
else
  names=()
  for c in "${missing[@]}"; do
    n=$(capsh --decode=$(printf '%x' $((1 << c))) 2>/dev/null | sed 's/.*=cap_//' || true)
    names+=("${n:-$c}")
  done
  mode=(--cap-add ALL --security-opt seccomp=unconfined --security-opt apparmor=unconfined
        --security-opt systempaths=unconfined)
  for n in "${names[@]}"; do mode+=(--cap-drop "$n"); done
  [ -e /dev/cpu_dma_latency ] && mode+=(--device /dev/cpu_dma_latency)
  privileged="no: this host's root lacks ${names[*]}; every other capability instead (${mode[*]})"
fi
rm -f "$OUT/inside.txt"
echo "container: docker run ${mode[*]} --rm --network none $IMAGE scripts/container_check.sh --inside"
set +e
docker run "${mode[@]}" --rm --network none -v "$OUT:/out" "$IMAGE" scripts/container_check.sh --inside
rc=$?
set -e
[ "$rc" = 0 ] || failures+=("inside the container (exit $rc)")
[ -r "$OUT/inside.txt" ] || failures+=("the container wrote no $OUT/inside.txt")
get() { grep -m1 "^$1=" "$OUT/inside.txt" 2>/dev/null | cut -d= -f2- || true; }

# ---- on the host after it: nothing left, sysctls as they were ----
ns=$(get namespaces)
for kind in net pid; do
  inode=$(sed -n "s/.*$kind=\([^ ]*\).*/\1/p" <<< "$ns")
  [ -n "$inode" ] || continue
  for p in /proc/[0-9]*; do
    if [ "$(readlink "$p/ns/$kind" 2>/dev/null)" = "$inode" ]; then
      failures+=("host: process ${p#/proc/} is still in the container's $kind namespace")
    fi
  done
done
netns_held > "$OUT/netns-after.txt"
ip -o link show | awk -F': ' '{print $2}' | sort > "$OUT/links-after.txt"
ls /run/geotestbed 2>/dev/null | sort > "$OUT/registry-after.txt" || true
host_left=""
new=$(comm -13 "$OUT/netns-before.txt" "$OUT/netns-after.txt" | tr '\n' ' ')
[ -z "$new" ] || host_left+="network namespaces: $new; "
new=$(comm -13 "$OUT/links-before.txt" "$OUT/links-after.txt" | tr '\n' ' ')
[ -z "$new" ] || host_left+="interfaces: $new; "
new=$(comm -13 "$OUT/registry-before.txt" "$OUT/registry-after.txt" | tr '\n' ' ')
[ -z "$new" ] || host_left+="registry files: $new; "
[ -z "$host_left" ] || failures+=("host: new since the start: $host_left")
python3 tests/root_sysctls.py diff "$OUT/sysctl-before.json" > "$OUT/sysctl-diff.txt" \
  || { head -21 "$OUT/sysctl-diff.txt"; failures+=("host: $(head -1 "$OUT/sysctl-diff.txt")"); }
cat <<EOF | tee "$OUT/summary.txt"
container check, $(date -u +%Y-%m-%dT%H:%MZ), $(( $(date +%s) - started )) s in all
  base $BASE: $base; image $IMAGE built in ${build_s} s (pip: $WHEELS)
  pins: $(get pins)
  privileged: $privileged
  .ci/run inside: exit $(get suite_rc), $(get suite_s) s: $(get suite_counts)
  make run inside: exit $(get run_rc), $(get run_s) s; $(get run_model)
  real-time: probe $(get rt_probe); cgroup rt budget $(get cgroup_rt_runtime); the run recorded: $(get run_realtime)
  /run: $(get run_mount); /sys: $(get sys_mount); /sys/class/net: $(get sys_class_net); cgroup: $(get cgroup)
  left inside: registry $(get left_registry); netns $(get left_netns); links $(get left_links); iptables rules $(get left_iptables_rules); processes $(get left_procs)
  left on the host: ${host_left:-none}
  host sysctls: $(head -1 "$OUT/sysctl-diff.txt")
EOF
if [ ${#failures[@]} -gt 0 ]; then
  printf 'FAIL: %s\n' "${failures[@]}" | tee -a "$OUT/summary.txt"
  exit 1
fi
echo "container check passed" | tee -a "$OUT/summary.txt"
