"""Pure plans made from a scenario: systems, routing, placement, topology, timeouts, the
training workers (their specs, with the features' typed extras).
"""
