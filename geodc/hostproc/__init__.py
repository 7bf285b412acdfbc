"""Processes that run on emulated hosts, started with `python -m`. They import only spec,
rules and host: never emulation, plans or orchestration.
"""
