"""The event vocabulary (``models``), its ids, its storage codec (``codec``) and errors,
and the formats a run is exported in (``jsonl``, ``bundle``). Imports nothing else of
fleetledger: the durable log that stores these events is ``store``'s.

Import from the submodules: ``projections`` reads ``events.models`` alone and must not
pull the codec or a format in with it.
"""
