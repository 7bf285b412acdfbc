# The testbed in a container: Debian 12 and the README's two set-up commands. Network namespaces,
# qdiscs, iptables and real-time priority need a privileged container:
#   docker build -t geo-dc-testbed .
#   docker run --privileged --rm geo-dc-testbed              # make test (the default command)
#   docker run --privileged --rm geo-dc-testbed make run     # the default scenario
# Without real-time scheduling the delay lines run at normal priority (recorded in each run's
# env.json, and late releases are counted and warned about); without netem (this project's
# machines have none) the delayline backend is used.
FROM debian:12
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 \
    PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# (torch==2.13.0 then resolves to the CPU build, 2.13.0+cpu, instead of PyPI's CUDA one)
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 python3-venv python3-pip make git \
      ca-certificates mininet iperf3 iptables bridge-utils net-tools iproute2 iputils-ping \
      libpcap0.8 procps \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /testbed
COPY . .
# the set-up (Debian packages present already, .venv from requirements.txt) baked in
RUN make setup
CMD ["make", "test"]
