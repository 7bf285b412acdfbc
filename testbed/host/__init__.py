"""What host processes and orchestration share: spans and records, per-process spec files,
real-time priority, the GPU lock, BubbleTea's notices, congestion control. Imports spec and
rules only.
"""
