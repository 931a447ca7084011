"""The ``fleetledger`` command line: one module of commands per concern.

Importing a command module registers its commands on ``app``.
"""

from fleetledger.cli import (  # noqa: F401 - imported for their commands
    explain_commands,
    ledger_commands,
    replay_commands,
    router_commands,
    router_sync_commands,
    serve_commands,
    simulate_commands,
    timeline_commands,
)
from fleetledger.cli.app import app, main

__all__ = ["app", "main"]
