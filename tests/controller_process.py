"""A controller in a process of its own, for the controller-restart test.

``python -m tests.controller_process DB_URL RUN GCS_ADDRESS NAMESPACE PREFIX SHARDS``
connects to the test's Ray cluster, resumes the run from the ledger, finds the shard
actors by name, prints the membership it resumed with as one JSON line, then probes
until it is killed.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import ray

from fleetledger.config import ControllerConfig
from fleetledger.controller.fleet_controller import FleetController, TrainingProgress
from fleetledger.controller.ledger import Ledger
from fleetledger.controller.ray_fleet import RayShardFleet
from fleetledger.projections.membership import membership_document
from fleetledger.store.log import EventLog


def main() -> None:
    db_url, run, address, namespace, prefix, shards = sys.argv[1:7]
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address=address, namespace=namespace, log_to_driver=False, configure_logging=False)
    ledger = Ledger.resume(EventLog.open(db_url), run)
    config = ControllerConfig.from_recorded(ledger.view.config.settings)
    fleet = RayShardFleet.attach(int(shards), prefix, namespace=namespace)
    print(json.dumps(membership_document(ledger.view)), flush=True)
    FleetController(ledger, fleet, config, progress=lambda: TrainingProgress(0, 0, 0, True)).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
