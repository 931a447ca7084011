"""The one base of every error fleetledger raises on purpose.

An error raised on purpose says what was wrong and where (run, seq, shard, field, file)
in its first line, so the command line can print exactly that line and exit 2, and an
embedder can catch one class to tell "fleetledger refused" from "fleetledger broke".
Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations


class FleetledgerError(Exception):
    """Base of every error fleetledger raises on purpose."""
