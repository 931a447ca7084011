"""fleetledger: an event-sourced membership controller for the generation fleet of an
asynchronous RL run (see README.md)."""

__version__ = "0.1.0"
