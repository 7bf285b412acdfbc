# Run as root (the testbed builds network namespaces): `make run`, `make test`.
PY := .venv/bin/python
SCENARIO ?= topologies/two_dc.yaml

.PHONY: setup run test test-unit test-loopback test-stock-kernel lint calibrate bench cleanup

setup:
	@bash scripts/setup.sh

run: setup        ## build the default scenario's network and train on it
	$(PY) run_testbed.py run $(SCENARIO)

test: setup       ## the test suite, all three rings (root tests build real namespaces)
	$(PY) -m pytest -q

test-unit: setup  ## the unit ring: pure, no processes or sockets, under a minute
	$(PY) -m pytest -q -m unit

test-loopback: setup  ## the loopback ring: real processes and sockets on 127.0.0.1, no root
	$(PY) -m pytest -q -m loopback

# The stock-kernel ring: Debian's 6.12 kernel (it has netem) booted under QEMU without KVM
# (scripts/stock_kernel.py; --prepare downloads it the first time), the network tests of
# STOCK_RING once per backend. Left out (STOCK_SKIP), because TCG emulates the CPU: training
# runs (importing torch in each worker takes minutes), and the project's tight wall-clock
# margins, which missed there on netem on 2026-12-02 (idle RTT 1-3 ms over 2 x delay against
# 0.5 ms; a child Python's network up after over 30 s; a fault applied 0.5 s late against
# 0.25 s; on the delay line, release lateness under TCG on 2026-12-03: median 0.7-1.8 ms for
# pings and 1.2-4.6 ms under iperf3, against 1 ms). tests/test_backends.py checks RTT and
# goodput at the guest's tolerance instead.
# Both backends run even when the first fails; the target fails if either did. Each guest's
# kernel console is kept in results/stock-kernel/BACKEND-console.log. About 25-30 minutes; .ci/run
# runs it after make test (docs/network.md: its record of passes).
STOCK_RING := tests/test_backends.py tests/test_network.py tests/test_wanstats.py \
              tests/test_faults_run.py tests/test_cleanup.py tests/test_shaping_commands.py
STOCK_SKIP := not training and not crash and not cross_traffic and not path_delay \
              and not rtt_is_twice and not on_signal and not forced_netem and not on_the_wire \
              and not killed_run and not pings_are_counted and not iperf3_bytes_are_counted
# On the delay line, iperf3's goodput at 90-101% of a 20 Mbit/s link missed in the guest (the
# sixth run, two vCPUs); test_backends' calibration holds the delay line's goodput there instead,
# at time_scale 8 (GEODC_TEST_CALIBRATE_TIME_SCALE; at 1 and 2 the guest's CPU, emulated by TCG,
# carried 63-79% of the link, and on a host twice as slow on 2026-12-07 time_scale 4 carried
# 45-58%, 8 carried 91-100%: docs/network.md). Netem across servers (a local cluster in the
# guest, about 5 minutes under TCG) runs in the netem guest only.
STOCK_SKIP_DELAYLINE := and not wan_rate_by_iperf3 and not netem_across

test-stock-kernel: setup  ## the stock-kernel ring: netem and delayline backends in a guest
	.venv/bin/python scripts/stock_kernel.py --prepare
	mkdir -p results/stock-kernel
	rc=0; \
	echo "== backend netem"; $(call stock_ring,netem,,) || rc=1; \
	echo "== backend delayline"; \
	$(call stock_ring,delayline,GEODC_TEST_CALIBRATE_TIME_SCALE=8,$(STOCK_SKIP_DELAYLINE)) || rc=1; \
	exit $$rc

# One backend's ring in a fresh guest: $(1) the backend, $(2) more environment, $(3) more
# deselected ("and not ..."). A guest is stopped after 30 minutes (each took 10-12 here, up to 20
# on a slow host), so a hung one fails the target with the reason, inside the 90 minutes of the
# CI that runs .ci/run (the GitHub workflow runs scripts/container_check.sh, which leaves this
# ring out, within its own 45).
stock_ring = .venv/bin/python scripts/stock_kernel.py run --timeout 1800 --log results/stock-kernel/$(1)-console.log \
	-- sh -c 'env GEODC_TEST_BACKEND=$(1) $(2) $(PY) -m pytest -q -p no:cacheprovider -m network \
	  $(STOCK_RING) -k "$(STOCK_SKIP) $(3)"; rc=$$?; echo "== guest after pytest: exit $$rc"; \
	  free -m; df -m /tmp /run; exit $$rc'

lint: setup       ## ruff and the layer contracts (both also in the unit ring)
	.venv/bin/ruff check .
	.venv/bin/lint-imports --config pyproject.toml --no-cache

calibrate: setup  ## measure every WAN link of three_dc against its configuration
	$(PY) run_testbed.py calibrate topologies/three_dc.yaml

bench: setup      ## benchmarks: WAN fidelity (idle, under CPU load, transients, congestion control), build/teardown, bubbles, K connections, the Atlas sweep, the BubbleTea rate sweep, tenants beside Atlas and BubbleTea, deadlines, time_scale auto at 64 GPUs
	$(PY) bench/bench_network.py
	$(PY) bench/bench_loaded_rtt.py
	$(PY) bench/bench_transients.py
	$(PY) bench/bench_congestion.py
	$(PY) bench/bench_bubbles.py
	$(PY) bench/bench_connections.py
	$(PY) bench/bench_atlas_sweep.py
	$(PY) bench/bench_bubbletea_sweep.py
	$(PY) bench/bench_cross_traffic.py
	$(PY) bench/bench_planning.py
	$(PY) bench/bench_deadlines.py
	$(PY) bench/bench_path_cost.py
	$(PY) bench/bench_autoscale.py --systems atlas --iterations 4

cleanup:          ## remove what a killed run left behind
	$(PY) run_testbed.py cleanup
