"""The geo-distributed training testbed (arXiv 2411.14458: Atlas and BubbleTea): the harness,
layered by the data flow, beside the host-process packages trainer/, prefill/ and traffic/ at
the top of the repository. Lower layers never import higher ones (tests/test_layers.py):

    spec -> rules -> host | plans -> emulation | (trainer, prefill, traffic) -> features
         -> predict -> analysis -> run -> cli

spec: the scenario file as frozen types; rules: pure code the planner, the predictor and the
host processes share; host: what host processes and orchestration share (spans, spec files,
real-time priority, GPU lock, notices); plans: pure plans (systems, routing, placement, topology);
emulation: namespaces, shaping, delay lines, process registry; trainer, prefill, traffic (top
level, not in this package): the processes that run on emulated hosts, importing only spec,
rules and host; features: temporal sharing, BubbleTea, faults and
cross-traffic, each a pure plan and a run handle; predict: the analytical model; analysis: result
files in, tables and figures out; run: orchestration of one job; cli: the commands.
"""
