"""What an embedding of fleetledger uses as one piece: the run's lifetime (:class:`FleetRun`)."""

from fleetledger.embedding.fleet_run import FleetRun, RunPieces, refit_machinery

__all__ = ["FleetRun", "RunPieces", "refit_machinery"]
