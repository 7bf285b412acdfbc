# The testbed in a container: Debian 12 and the README's two set-up commands. Network namespaces,
# qdiscs, iptables and real-time priority need a privileged container:
#   docker build --network host -t geo-dc-testbed .
#   docker run --privileged --rm geo-dc-testbed              # make test (the default command)
#   docker run --privileged --rm geo-dc-testbed make run     # the default scenario
# scripts/container_check.sh builds it, runs both inside and checks what differs in a container
# (CI runs that script). Without real-time scheduling the delay lines run at normal priority
# (recorded in each run's env.json, and late releases are counted and warned about); without
# netem the delayline backend is used.
# BASE: Debian 12's official image, or (scripts/container_check.sh on a machine that cannot pull
# it) the one it made with debootstrap under its own tag, never posing as debian:12.
ARG BASE=debian:12
FROM $BASE
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 python3-venv python3-pip make git \
      ca-certificates mininet iperf3 iptables bridge-utils net-tools iproute2 iputils-ping \
      libpcap0.8 procps \
 && rm -rf /var/lib/apt/lists/*
# Where pip finds the pins. By default PyPI, with PyTorch's CPU index beside it, so that
# torch==2.13.0 resolves to the CPU build (2.13.0+cpu) instead of PyPI's CUDA one. A machine
# without those (scripts/container_check.sh on one whose pip has local wheels) passes its own:
# --build-arg PIP_INDEX_URL=... PIP_EXTRA_INDEX_URL=... PIP_FIND_LINKS=... PIP_NO_INDEX=1.
# Build arguments reach the RUN steps only, not the image.
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_FIND_LINKS=
ARG PIP_NO_INDEX=0
WORKDIR /testbed
# The pins alone first: their layer (torch, a few hundred MB) is kept while only the code
# changes. pip installs requirements-container.txt (requirements.txt's pins, setuptools and
# pip, each with its sha256: scripts/pin_hashes.py) with --require-hashes, so a file that is
# not the one hashed there (a mirror's, a planted wheel) stops the build; `make setup` below
# (GEODC_PIP_HASHES: the same file, no unpinned pip upgrade) then installs geodc itself.
COPY requirements.txt requirements-container.txt ./
RUN python3 -m venv .venv \
 && .venv/bin/python -m pip install -q --require-hashes -r requirements-container.txt
ENV GEODC_PIP_HASHES=requirements-container.txt
COPY . .
# the set-up (Debian packages present already, .venv from requirements-container.txt) baked in
RUN make setup
CMD ["make", "test"]
