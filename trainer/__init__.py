"""The training worker: one pipeline stage replica, its transports and data parallelism.
"""
