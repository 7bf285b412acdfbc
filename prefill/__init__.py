"""BubbleTea's processes: the controller, prefill servers and decode servers.
"""
