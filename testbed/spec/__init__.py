"""The scenario file as frozen types, checked on load: the vocabulary every layer above shares.
Pure: imports nothing else of testbed.
"""
