"""Traffic processes: WAN bursts, packet capture, CPU load.
"""
