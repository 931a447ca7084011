"""A rollout adapter in a process of its own: requests through the router, outcomes into
the ledger with its own reporter (a separate writer of the run).

    python -m tests.router_client ROUTER_URL DB_URL RUN COUNT

Eight requests at a time (least outstanding spreads only concurrent requests: one at a
time, the lowest index wins every tie). Prints one JSON object:
{"served": {shard: count}, "statuses": {status: count}}.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import openai

from fleetledger.adapters.outcome_reporter import OutcomeReporter

SHARD_HEADER = "x-fleetledger-shard"


def main(url: str, db: str, run: str, count: int) -> None:
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
    reporter = OutcomeReporter(db, run, "rollouts")
    served: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    lock = threading.Lock()

    def one(k: int) -> None:
        try:
            raw = client.completions.with_raw_response.create(
                model="fleetledger-sim", prompt=f"p{k}", max_tokens=2
            )
        except openai.APIStatusError as exc:
            with lock:
                statuses[exc.status_code] += 1
            return
        shard = raw.headers.get(SHARD_HEADER)
        with lock:
            statuses[raw.status_code] += 1
            if shard is not None:
                served[shard] += 1
                reporter.success(int(shard))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))
    reporter.flush()
    print(json.dumps({"served": served, "statuses": statuses}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
