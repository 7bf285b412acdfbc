"""The emulated network on this kernel: namespaces, shaping, delay lines, and the registry of
every process a run starts. Root-only at run time.
"""
