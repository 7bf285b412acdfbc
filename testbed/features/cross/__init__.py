"""Cross-traffic of other tenants on the WAN.
"""
