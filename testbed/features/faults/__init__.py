"""Scheduled faults on WAN links during a run.
"""
