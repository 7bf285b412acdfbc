"""The features a system may switch on, one folder each (temporal sharing, BubbleTea, faults,
cross-traffic): a pure plan, read by plan/show/predict, and a run handle, as the contract in
testbed.features.base says; testbed.features.registry lists them and the orders a run starts and
stops them in.
"""
