"""Pure folds of the event log into views, and the decisions and words derived from them.

No I/O, no clock, no random numbers: a view is a function of the event sequence and
nothing else, which is what makes replay, time travel and property tests possible.
Imports only ``fleetledger.events`` (and ``fleetledger.errors``).
"""
