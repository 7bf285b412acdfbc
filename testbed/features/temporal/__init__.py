"""Temporal sharing of WAN links (Atlas): the slot plan and the arbiters that enforce it.
"""
