"""Pure plans made from a scenario: systems, routing, placement, topology, timeouts.
"""
