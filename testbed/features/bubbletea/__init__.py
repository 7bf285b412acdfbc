"""BubbleTea: prefill requests in pipeline bubbles, the request load and its processes.
"""
