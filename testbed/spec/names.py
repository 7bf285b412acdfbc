"""Names a scenario may choose from that more than one layer checks or branches on: one list each.

The systems and placements are in testbed.spec.systems (the systems as data)."""

SCHEDULES = ("gpipe", "1f1b")                   # testbed.rules.schedule builds each one's table
ROUTING_POLICIES = ("direct", "shortest-delay")  # testbed.plans.routing
