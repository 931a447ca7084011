"""The event vocabulary (``models``), its storage codec (``codec``) and the durable log
(``log``, ``database``). Imports nothing else of fleetledger.

Import from the submodules: ``projections`` reads ``events.models`` alone and must not
pull the database layer in with it.
"""
