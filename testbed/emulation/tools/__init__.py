"""Argument lists and output parsers for iperf3 and ping, as calibration runs them.
"""
