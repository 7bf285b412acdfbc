# Run as root (the testbed builds network namespaces): `make run`, `make test`.
PY := .venv/bin/python
SCENARIO ?= topologies/two_dc.yaml

.PHONY: setup run test test-unit test-loopback lint calibrate bench cleanup

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

lint: setup       ## ruff and the layer contracts (both also in the unit ring)
	.venv/bin/ruff check .
	.venv/bin/lint-imports --config pyproject.toml --no-cache

calibrate: setup  ## measure every WAN link of three_dc against its configuration
	$(PY) run_testbed.py calibrate topologies/three_dc.yaml

bench: setup      ## benchmarks: WAN fidelity (idle, under CPU load, transients, congestion control), build/teardown, bubbles, K connections, the Atlas sweep, the BubbleTea rate sweep, tenants beside Atlas and BubbleTea, deadlines
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

cleanup:          ## remove what a killed run left behind
	$(PY) run_testbed.py cleanup
