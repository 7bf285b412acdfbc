"""The geo-distributed training testbed (arXiv 2411.14458: Atlas and BubbleTea), one package
layered by the data flow. Lower layers never import higher ones (tests/test_layers.py):

    spec -> rules -> host | plans -> emulation | hostproc -> features -> predict
         -> analysis -> run -> cli

spec: the scenario file as frozen types; rules: pure code the planner, the predictor and the
host processes share; host: what host processes and orchestration share (spans, spec files,
real-time priority, GPU lock, notices); plans: pure plans (systems, routing, placement, topology);
emulation: namespaces, shaping, delay lines, process registry; hostproc: the processes that run
on emulated hosts (trainer, prefill, traffic); features: temporal sharing, BubbleTea, faults and
cross-traffic, each a pure plan and a run handle; predict: the analytical model; analysis: result
files in, tables and figures out; run: orchestration of one job; cli: the commands.
"""
