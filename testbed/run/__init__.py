"""Orchestration of one job: build the network, start the features and workers, collect.
"""
