"""Names a scenario may choose from that more than one layer checks or branches on: one list each.

The systems and placements are in geodc.spec.systems (the systems as data)."""

SCHEDULES = ("gpipe", "1f1b")                   # geodc.rules.schedule builds each one's table
ROUTING_POLICIES = ("direct", "shortest-delay")  # geodc.plans.routing
