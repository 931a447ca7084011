"""The chaos campaign, run by hand: N trials of a real simulated fleet, faults at random
moments, judged by the oracle; one line per trial and a summary.

    python bench/chaos_campaign.py --trials 300 --seed 2026 --jsonl a.jsonl
    python bench/chaos_campaign.py --trials 150 --seed 2026 --skip 150 --jsonl b.jsonl
    python bench/chaos_campaign.py --summarize a.jsonl b.jsonl   # one summary of both
    python bench/chaos_campaign.py --replay 123456789            # one trial again
    python bench/chaos_campaign.py --engine vllm --trials 20     # real vLLM engines
    python bench/chaos_campaign.py --only kill@refit_start --trials 20   # one story
    python bench/chaos_campaign.py --engine vllm --stratified 3 --seed 34   # every cell 3x
    python bench/chaos_campaign.py --router --trials 40     # rollouts through the router

Each trial's scenario (fault kinds, shards, phase, step, delays) is drawn from its own
seed (printed on its line), so any trial replays alone; ``--seed`` draws the sequence of
trial seeds and ``--skip N`` starts it at its N+1-th (a campaign run in parts).
``--stratified N`` runs every scenario × phase cell the engine can draw N times (round
after round over the cells), instead of drawing the cells at random; a trial of it
replays with ``--only CELL --replay SEED``. The
trials share one local Ray cluster and one SQLite ledger (``--db``, a fresh file under
the temp dir by default); each is a run of its own, there to be explained afterwards:
``fleetledger explain RUN --db URL``.

``--router`` sends the loop's rollouts through the run's router (``simulate --router``):
the oracle then holds each request against the moment its shard left the fleet; without
it, each fault's cost (from the ledger alone) against what the loop itself counted.

What the oracle checks: fleetledger/simulate/oracle.py and account_oracle.py. Exit status
1 when any trial failed it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from fleetledger.controller.ray_fleet import local_ray
from fleetledger.simulate.account_oracle import LEFT_WAIT_BOUND_S
from fleetledger.simulate.campaign import dumps, run_trial
from fleetledger.simulate.chaos_plan import (
    TrialSettings,
    cells,
    plan_trial,
    stratified_plans,
    trial_seeds,
)
from fleetledger.simulate.oracle import REFIT_AFTER_DEATH_BOUND_S, judge_from_log
from fleetledger.store.log import EventLog


def _figures(samples: list[float]) -> str:
    if not samples:
        return "-"
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered):5.2f}s  p99 {p99:5.2f}s  max {ordered[-1]:5.2f}s"


def summarize(trials: Iterable[dict[str, Any]]) -> int:
    """Print the campaign's summary from its trials' JSON lines; 1 if any failed."""
    detection: dict[tuple[str, str], list[float]] = defaultdict(list)
    recovery: dict[tuple[str, str], list[float]] = defaultdict(list)
    scenarios: dict[str, int] = defaultdict(int)
    left_waits: list[float] = []
    n = failed = false_deaths = hung = lost = exhausted = costs = routed = 0
    trials_seen = list(trials)
    for trial in trials_seen:
        n += 1
        scenarios[trial["scenario"].split("@")[0]] += 1
        failed += bool(trial["problems"])
        false_deaths += trial["false_deaths"]
        hung += trial["hung"]
        lost += trial["lost_prompts"]
        exhausted += trial.get("exhausted_by_faults", False)
        costs += trial.get("costs_checked", 0)
        routed += trial.get("routed", False)
        left_waits += trial.get("left_waits_s", [])
        for kind, phase, seconds in trial["detection_s"]:
            detection[kind, phase].append(seconds)
        for kind, phase, seconds in trial["recovery_s"]:
            recovery[kind, phase].append(seconds)
    print(
        f"\n{n} trials: {failed} failed the oracle, {false_deaths} false deaths, {hung} hung "
        f"runs, {lost} lost prompts"
        + (
            f"; {exhausted} runs failed rightly, the faults left too few shards"
            if exhausted
            else ""
        )
    )
    print("  scenarios: " + ", ".join(f"{k} {v}" for k, v in sorted(scenarios.items())))
    print(
        f"  fault costs held against the loop's own count: {costs} (in {n - routed} trials "
        f"the loop picked its shards)"
    )
    if routed:
        print(
            f"  {routed} trials through the router: {len(left_waits)} requests on a shard "
            f"that left, waited past its leaving {_figures(left_waits)} "
            f"(bound {LEFT_WAIT_BOUND_S:g}s)"
        )
    print(
        "detection: fault → DEAD recorded; recovery: fault → the interrupted refit "
        f"completed (bound from the death: {REFIT_AFTER_DEATH_BOUND_S:g}s)"
    )
    for key in sorted(set(detection) | set(recovery)):
        kind, phase = key
        print(
            f"  {kind:<17s} {phase:<14s} n={len(detection[key]):<4d} "
            f"detection {_figures(detection[key])}   recovery {_figures(recovery[key])}"
        )
    _cell_table(trials_seen)
    return 1 if failed else 0


def _cell_table(trials: list[dict[str, Any]]) -> None:
    """One row per scenario × phase cell: its trials, failures, faults whose phase never
    came (a cell that only skipped was not covered), and the detection and recovery of
    the cell's own fault (a first kill that set up a restart is not the cell's)."""
    rows: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"n": 0, "failed": 0, "skipped": 0, "detection": [], "recovery": []}
    )
    for trial in trials:
        cell = trial["scenario"]
        phase = cell.split("@")[1]
        row = rows[cell]
        row["n"] += 1
        row["failed"] += bool(trial["problems"])
        row["skipped"] += any(
            i["skipped"] and i["fault"]["phase"] == phase for i in trial["injections"]
        )
        row["detection"] += [s for _, p, s in trial["detection_s"] if p == phase]
        row["recovery"] += [s for _, p, s in trial["recovery_s"] if p == phase]
    if not rows:
        return
    print("per cell (trials, failed, skipped: the fault's phase never came):")
    for cell in sorted(rows):
        row = rows[cell]
        print(
            f"  {cell:<32s} n={row['n']:<3d} failed {row['failed']:<2d} "
            f"skipped {row['skipped']:<2d} detection {_figures(row['detection'])}   "
            f"recovery {_figures(row['recovery'])}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip", type=int, default=0, help="start at the N+1-th trial seed")
    parser.add_argument("--replay", type=int, action="append", help="run this trial seed")
    parser.add_argument("--db", help="ledger URL (default: a fresh SQLite file)")
    parser.add_argument("--jsonl", help="write one JSON line per trial here")
    parser.add_argument("--summarize", nargs="+", metavar="JSONL", help="summarize, run nothing")
    parser.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    parser.add_argument(
        "--router", action="store_true", help="the loop's rollouts through the run's router"
    )
    parser.add_argument(
        "--stratified",
        type=int,
        metavar="N",
        help="every scenario × phase cell N times (instead of --trials random ones)",
    )
    parser.add_argument(
        "--only",
        metavar="SCENARIO@PHASE",
        help="hold every trial to one scenario and phase (e.g. kill@refit_start)",
    )
    args = parser.parse_args(argv)
    if args.summarize:
        lines = []
        for path in args.summarize:
            with open(path) as f:
                lines += [json.loads(line) for line in f if line.strip()]
        return summarize(lines)
    db = args.db or f"sqlite:///{tempfile.mkdtemp(prefix='fl-chaos-')}/chaos.db"
    settings = TrialSettings.for_engine(args.engine, router=args.router)
    only = None
    if args.only:
        scenario, _, phase = args.only.partition("@")
        table = cells(settings)
        if (scenario, phase) not in table:
            parser.error(
                f"--only {args.only}: not a cell of the {args.engine} campaign; its cells: "
                + " ".join(f"{k}@{p}" for k, p in table)
            )
        only = (scenario, phase)
    if args.stratified is not None:
        if args.stratified < 1 or args.replay or only:
            parser.error("--stratified N takes N >= 1, and neither --replay nor --only")
        plans = list(stratified_plans(args.seed, args.stratified, settings))[args.skip :]
    else:
        seeds = args.replay or list(trial_seeds(args.seed, args.skip + args.trials))[args.skip :]
        plans = [plan_trial(seed, settings, only) for seed in seeds]  # type: ignore[arg-type]
    log = EventLog.open(db)  # created (and migrated) once, before any trial reads it
    trials: list[dict[str, Any]] = []
    started = time.monotonic()
    through = " through the router" if args.router else ""
    print(
        f"chaos campaign: {len(plans)} trials on {args.engine} engines{through}, ledger {db}",
        flush=True,
    )
    with local_ray():
        import ray

        address = ray.get_runtime_context().gcs_address
        for n, plan in enumerate(plans, 1):
            seed = plan.seed
            outcome = run_trial(plan, db, settings=settings, ray_address=address)
            verdict = judge_from_log(log, outcome)
            line = dumps(outcome, verdict)
            trials.append(json.loads(line))
            faults = ", ".join(
                f"{i.fault.kind} shard {i.fault.shard} {i.fault.phase}@{i.fault.step}"
                + (f" {i.fault.pause_s:.2f}s, held {i.held_s:.2f}s" if i.held_s is not None else "")
                + (f" (skipped: {i.skipped})" if i.skipped else "")
                for i in outcome.injections
            )
            status = "ok  " if verdict.ok else "FAIL"
            print(
                f"{status} {n:4d} seed {seed:<10d} {plan.label:<28s} {outcome.outcome:<9s} "
                f"{outcome.elapsed_s:5.1f}s  run {outcome.run}  [{faults}]",
                flush=True,
            )
            for problem in verdict.problems:
                print(f"       {problem}", flush=True)
            if args.jsonl:
                with open(args.jsonl, "a") as out:
                    out.write(line + "\n")
            if outcome.outcome == "hung":
                print("a trial hung: the campaign stops here", flush=True)
                break
    log.close()
    print(f"(ran in {time.monotonic() - started:.0f}s)")
    return summarize(trials)


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sys.exit(main())
