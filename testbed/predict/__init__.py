"""The analytical model of an iteration (the predictor): imports spec, rules, plans and the
features' pure plans only, so it runs without root, torch or a network.
"""
