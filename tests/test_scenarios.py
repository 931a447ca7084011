"""The failure stories a fleet must survive, as ledgers, and what forensics says.

Each test writes one story through the real ingest facade (``Ledger``) into a real
ledger (a SQLite file; the freeze-mid-refit story also on PostgreSQL), then checks two
readers of it: ``projections.history.replay`` (the right shard, seq, rule, evidence)
and ``fleetledger explain`` through the command line, in the words a reader gets.

The stories: kill an idle shard; kill a serving shard; freeze a shard mid-refit with one
suspect (condemned, the retry completes); two suspects (condemnation refused, the run
fails); three blips among thousands of successes (never condemned); a wedged engine
that answers probes (only the reported streak condemns it); restarts exhausted
(RETIRED); the fleet exhausted below min_healthy_shards; a stall with nothing in flight;
the device context lost mid-transfer.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

import pytest

from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.models import FailureCount, FleetConfig, ShardOutcomes
from fleetledger.projections.history import (
    DecisionEntry,
    EndEntry,
    Entry,
    EpochEntry,
    RefitEntry,
    RestartEntry,
    StallEntry,
    TransitionEntry,
    replay,
)
from fleetledger.store.log import EventLog
from tests.builders import fleet_config
from tests.cli_support import invoke

pytestmark = pytest.mark.usefixtures("cli_sandbox")

E = TypeVar("E", bound=Entry)

RUN = "scenario"
OK = ProbeResult.ok()
TIMEOUT = ProbeResult("timeout", "no answer within probe_timeout_s=2")
DIED = ProbeResult("died", "ActorDiedError: The actor died unexpectedly before finishing this task")


# ── reading a scenario back ────────────────────────────────────────────────────


def history(url: str) -> list[Entry]:
    with EventLog.open(url) as log:
        return list(replay(log.read(RUN)))


def explain(url: str, *args: str) -> str:
    return invoke("explain", RUN, *args, "--db", url).stdout


def explain_json(url: str, *args: str) -> dict[str, Any]:
    return json.loads(explain(url, *args, "--json"))


def transitions(entries: list[Entry], shard: int) -> list[tuple[int, str, str, str]]:
    """(seq, before, after, input) of every transition of ``shard``."""
    return [
        (e.seq, e.before, e.after, e.input)
        for e in entries
        if isinstance(e, TransitionEntry) and e.shard == shard
    ]


def transition_at(entries: list[Entry], shard: int, seq: int) -> TransitionEntry:
    found = [
        e for e in entries if isinstance(e, TransitionEntry) and e.shard == shard and e.seq == seq
    ]
    assert len(found) == 1, (shard, seq, [e for e in entries if isinstance(e, TransitionEntry)])
    return found[0]


def of_kind(entries: list[Entry], kind: type[E]) -> list[E]:
    return [e for e in entries if isinstance(e, kind)]


def refit(ledger: Ledger, version: int) -> int:
    """A refit over every shard not absent that completes; returns the completion seq."""
    ledger.refit_started(version)
    ledger.refit_completed(version)
    return ledger.view.seq


def window(**by_shard: tuple[int, str | None]) -> list[ShardOutcomes]:
    """Outcomes per shard: ``s2=(successes, infra failure reason or None)``."""
    out = []
    for key, (successes, failure) in by_shard.items():
        failures = () if failure is None else (FailureCount(category="infra", reason=failure),)
        out.append(ShardOutcomes(shard=int(key[1:]), successes=successes, failures=failures))
    return out


class Story:
    """A run written through ``Ledger`` into a real ledger; ``seq`` names its moments."""

    def __init__(self, url: str, config: FleetConfig) -> None:
        self.url = url
        self._log = EventLog.open(url)
        self.ledger = Ledger.start(self._log, RUN, config)
        self.seq: dict[str, int] = {}

    def mark(self, name: str) -> int:
        self.seq[name] = self.ledger.view.seq
        return self.seq[name]

    def close(self) -> None:
        self._log.close()


def story(url: str, config: FleetConfig) -> Story:
    return Story(url, config)


# ── kill an idle shard ─────────────────────────────────────────────────────────


def test_kill_an_idle_shard_it_is_dead_at_once_traffic_moves_and_the_run_completes(
    sqlite_url: str,
) -> None:
    s = story(sqlite_url, fleet_config(2, workers_per_shard=2))
    led = s.ledger
    refit(led, 1)
    led.record_probes({0: OK, 1: OK})
    led.report_progress(committed_groups=4, train_steps=1, in_flight=0)
    led.record_probes({0: OK, 1: DIED})
    death = s.mark("death")
    led.report_outcomes("rollout-adapter", window(s0=(16, None)))
    second = refit(led, 2)
    led.report_progress(committed_groups=8, train_steps=2, in_flight=0)
    led.end_run("completed", "reached max_num_steps=2")
    end = s.mark("end")
    s.close()

    entries = history(sqlite_url)
    assert transitions(entries, 1) == [(death, "HEALTHY", "DEAD", "actor death confirmed")]
    assert transitions(entries, 0) == []
    dead = transition_at(entries, 1, death)
    assert dead.rule == f"actor death confirmed by the runtime: {DIED.error}"
    assert dead.evidence == (death,)
    epochs = of_kind(entries, EpochEntry)
    assert [(e.seq, e.serving, e.absent, e.world_size) for e in epochs] == [
        (1, (0, 1), (), 6),
        (death, (0,), (1,), 4),
    ]
    refits = of_kind(entries, RefitEntry)
    assert [(r.weight_version, r.participants, r.outcome) for r in refits] == [
        (1, (0, 1), "completed"),
        (2, (0,), "completed"),
    ]
    assert refits[-1].seq == second
    assert [(e.seq, e.outcome) for e in of_kind(entries, EndEntry)] == [(end, "completed")]

    out = explain(sqlite_url, "1")
    assert (
        f"shard 1 is DEAD since seq {death}: the runtime confirmed its actor is gone (seq "
        f"{death}: {DIED.error}); a confirmed death is conclusive, so it went HEALTHY → DEAD at "
        "once, without counting failures"
    ) in out
    assert "absent (no traffic, no rank in the next refit)" in out
    assert "serving [0], absent [1]" in out
    assert "layout: world 4; shard 1 has no rank (absent)" in out  # its own place in it
    assert "restarts: 0 of max_restart_attempts_per_shard 5 used" in out

    run = explain(sqlite_url)
    assert run.startswith(f"run {RUN} ended completed at seq {end} (")
    assert "why:" not in run  # it completed: nothing decisive happened
    assert f"seq {death} (" in run
    assert f"shard 1 HEALTHY → DEAD: actor death confirmed by the runtime: {DIED.error}" in run
    assert "  shard 1 DEAD since seq" in run
    assert f"the last completed was weight version 2 over shard 0 at seq {second}" in run


# ── kill a serving shard ───────────────────────────────────────────────────────


def test_kill_a_serving_shard_its_failed_generation_then_its_death(sqlite_url: str) -> None:
    s = story(sqlite_url, fleet_config(3))
    led = s.ledger
    refit(led, 1)
    failure = "ActorDiedError: actor died during generate_async"
    led.report_outcomes("rollout-adapter", window(s0=(5, None), s1=(5, None), s2=(4, failure)))
    reported = s.mark("reported")
    led.record_probes({0: OK, 1: OK, 2: DIED})
    death = s.mark("death")
    led.report_outcomes("rollout-adapter", window(s0=(8, None), s1=(8, None)))
    second = refit(led, 2)
    led.end_run("completed", "reached max_num_steps=2")
    s.close()

    entries = history(sqlite_url)
    assert transitions(entries, 2) == [
        (reported, "HEALTHY", "SUSPECT", "reported failure"),
        (death, "SUSPECT", "DEAD", "actor death confirmed"),
    ]
    assert transition_at(entries, 2, reported).rule == f"reported failure: {failure} ×1"
    assert transition_at(entries, 2, death).evidence == (death,)
    # HEALTHY → SUSPECT leaves the serving set alone; the death moves it.
    assert [(e.seq, e.serving) for e in of_kind(entries, EpochEntry)] == [
        (1, (0, 1, 2)),
        (death, (0, 1)),
    ]
    assert of_kind(entries, RefitEntry)[-1].participants == (0, 1)

    out = explain(sqlite_url, "2")
    assert f"shard 2 is DEAD since seq {death}: the runtime confirmed its actor is gone" in out
    assert "so it went SUSPECT → DEAD at once, without counting failures" in out
    assert "how it got here (2 transitions):" in out
    assert (
        f"seq {reported} (" in out and f"HEALTHY → SUSPECT — reported failure: {failure} ×1" in out
    )
    # The cause printed once (in the answer's first sentence), then by reference.
    assert f"(seq {death}: {DIED.error})" in out
    moved = "SUSPECT → DEAD — actor death confirmed by the runtime"
    assert f"{moved}: same cause as seq {death}" in out
    assert (
        "refits: none open; the last completed was weight version 2 over shards 0 and 1 at "
        f"seq {second}" in explain(sqlite_url)
    )


# ── freeze mid-refit, one suspect ──────────────────────────────────────────────


def test_freeze_mid_refit_the_lone_suspect_is_condemned_and_the_retry_completes(
    ledger_url: str,
) -> None:
    s = story(ledger_url, fleet_config(4, workers_per_shard=2))
    led = s.ledger
    refit(led, 1)
    led.report_progress(committed_groups=6, train_steps=1, in_flight=2)
    led.refit_started(2)
    started = s.mark("started")
    led.record_probes(
        {0: OK, 1: OK, 2: OK, 3: TIMEOUT}
    )  # SIGSTOP: the actor lives, answers nothing
    suspect = s.mark("suspect")
    reason = "refit did not finish within refit_timeout_s=30 + 60 s grace"
    led.refit_aborted(2, reason)
    abort = s.mark("abort")
    led.mark_weights_partial(2)
    partial = s.mark("partial")
    led.condemn_silent_participant(3, "the only SUSPECT shard when refit 2 aborted")
    condemned = s.mark("condemned")
    retried = refit(led, 2)
    led.report_progress(committed_groups=12, train_steps=2, in_flight=0)
    led.end_run("completed", "reached max_num_steps=2")
    end = s.mark("end")
    s.close()

    entries = history(ledger_url)
    assert transitions(entries, 3) == [
        (suspect, "HEALTHY", "SUSPECT", "probe failed"),
        (partial, "SUSPECT", "STALE", "weights marked partial"),
        (condemned, "STALE", "DEAD", "condemned as silent participant"),
    ]
    assert transition_at(entries, 3, condemned).rule == (
        "condemned as the silent participant: the only SUSPECT shard when refit 2 aborted"
    )
    for shard in (0, 1, 2):
        assert transitions(entries, shard) == [
            (partial, "HEALTHY", "STALE", "weights marked partial"),
            (retried, "STALE", "HEALTHY", "refit completed"),
        ]
    decisions = [(d.seq, d.decision, d.subjects) for d in of_kind(entries, DecisionEntry)]
    assert decisions == [
        (partial, "weights_partial", (0, 1, 2, 3)),
        (condemned, "condemned", (3,)),
    ]
    refits = [
        (r.started_seq, r.seq, r.participants, r.outcome, r.reason)
        for r in of_kind(entries, RefitEntry)
    ]
    assert refits[1:] == [
        (started, abort, (0, 1, 2, 3), "aborted", reason),
        (retried - 1, retried, (0, 1, 2), "completed", ""),
    ]
    last_epoch = of_kind(entries, EpochEntry)[-1]
    assert (last_epoch.seq, last_epoch.serving, last_epoch.absent, last_epoch.world_size) == (
        retried,
        (0, 1, 2),
        (3,),
        8,
    )

    out = explain(ledger_url, "3")
    assert (
        f"shard 3 is DEAD since seq {condemned}: condemned as the silent participant at seq "
        f"{condemned} (the only SUSPECT shard when refit 2 aborted): a judgement after an "
        "aborted refit, not an actor death"
    ) in out
    assert (
        f"the refit to weight version 2 over shards 0, 1, 2 and 3 aborted at seq {abort} ({reason})"
        in out
    )
    assert (
        f"it was SUSPECT before the abort (since seq {suspect}: failed probe: timeout: "
        "no answer within probe_timeout_s=2)"
    ) in out
    assert f"seq {abort} (" in out and f"refit to weight version 2 aborted: {reason}" in out

    # As of the abort's partial weights, before the judgement: STALE, a suspect, waiting.
    before = explain(ledger_url, "3", "--at", str(partial))
    assert f"run {RUN}, as of seq {partial} (" in before
    assert (
        f"shard 3 is STALE since seq {partial}: the refit to weight version 2 aborted at seq "
        f"{abort}" in before
    )
    assert "it was SUSPECT before the abort, so it counts as a suspect" in before
    assert "no open refit includes it: it waits for the next one" in before
    assert "suspected [3]" in before

    run = explain(ledger_url)
    assert run.startswith(f"run {RUN} ended completed at seq {end} (")
    assert (
        "aborted after " in run
        and f"{reason}; recovered: the refit to weight version 2 over shards 0, 1 and 2 "
        f"completed at seq {retried}"
        in run
    )
    assert "shard 3 STALE → DEAD: condemned as the silent participant" in run
    doc = explain_json(ledger_url)
    # A recovered abort and a condemned shard do not end a run by themselves.
    assert [(f["seq"], f["kind"], f["decisive"]) for f in doc["findings"]] == [
        (abort, "refit_aborted", False),
        (condemned, "shard_lost", False),
    ]
    assert doc["why"] is None


# ── two suspects ───────────────────────────────────────────────────────────────


def test_two_suspects_condemnation_is_refused_naming_both_and_the_run_fails(
    sqlite_url: str,
) -> None:
    s = story(sqlite_url, fleet_config(3))
    led = s.ledger
    refit(led, 1)
    led.refit_started(2)
    led.record_probes({0: OK, 1: TIMEOUT, 2: TIMEOUT})
    suspects = s.mark("suspects")
    led.refit_aborted(2, "broadcast timed out")
    led.mark_weights_partial(2)
    partial = s.mark("partial")
    assert led.view.suspected == (1, 2)
    detail = "2 suspects (shards 1, 2): cannot tell which one broke the refit"
    led.refuse_condemnation(led.view.suspected, detail)
    refused = s.mark("refused")
    led.end_run("failed", "refit 2 aborted and no lone suspect could be condemned")
    end = s.mark("end")
    s.close()

    entries = history(sqlite_url)
    refusal = [d for d in of_kind(entries, DecisionEntry) if d.decision == "condemnation_refused"]
    assert [(d.seq, d.subjects, d.detail) for d in refusal] == [(refused, (1, 2), detail)]
    # One probe round, one event: both timeouts are at the round's seq (applied in
    # shard order there).
    for shard, timed_out in ((1, suspects), (2, suspects)):
        assert transitions(entries, shard) == [
            (timed_out, "HEALTHY", "SUSPECT", "probe failed"),
            (partial, "SUSPECT", "STALE", "weights marked partial"),
        ]
    assert not [e for e in entries if isinstance(e, TransitionEntry) and e.after == "DEAD"]
    assert [(e.seq, e.outcome) for e in of_kind(entries, EndEntry)] == [(end, "failed")]

    run = explain(sqlite_url)
    assert (
        run.startswith(f"run {RUN} ended failed at seq {end} (")
        and "refit 2 aborted and no lone suspect could be condemned" in run
    )
    assert (
        "why: condemnation refused: 2 suspects (shards 1 and 2): there is no telling which one "
        f"broke the refit, so condemning one would be a guess; recorded reason: {detail} "
        f"(seq {refused})"
    ) in run
    assert f"shard 1 STALE (suspected) since seq {partial}" in run
    assert f"shard 2 STALE (suspected) since seq {partial}" in run
    assert "suspected [1, 2]" in run
    findings = explain_json(sqlite_url)["findings"]
    assert [(f["kind"], f["shards"], f["decisive"]) for f in findings] == [
        ("refit_aborted", [0, 1, 2], True),  # no refit completed after it
        ("condemnation_refused", [1, 2], True),
    ]

    shard = explain(sqlite_url, "2")
    assert (
        f"condemnation was refused at seq {refused}: it was one of the suspects (shards 1 and 2), "
        "so none was condemned"
    ) in shard
    assert "it was SUSPECT before the abort, so it counts as a suspect" in shard
    assert "it has never been condemned (no transition to DEAD or RETIRED)" in shard


# ── three blips among thousands of successes ───────────────────────────────────


def test_three_blips_among_thousands_of_successes_never_condemn_the_shard(
    sqlite_url: str,
) -> None:
    s = story(sqlite_url, fleet_config(2))
    led = s.ledger
    refit(led, 1)
    blips = []
    for _day in range(3):
        for _ in range(4):
            led.report_outcomes("router", window(s0=(1000, None), s1=(1000, None)))
            led.record_probes({0: OK, 1: OK})
        # One transport blip in a window that also served a thousand requests.
        led.report_outcomes("router", window(s0=(1000, "ReadTimeout"), s1=(1000, None)))
        blips.append(s.mark("blip"))
        led.record_probes({0: OK, 1: OK})
        led.record_probes({0: OK, 1: OK})
    led.report_outcomes("router", window(s0=(1000, None), s1=(1000, None)))
    led.end_run("completed", "reached max_num_steps=40")
    s.close()

    entries = history(sqlite_url)
    shard0 = transitions(entries, 0)
    assert [t for t in shard0 if t[2] in ("DEAD", "RETIRED")] == []
    assert [(seq, after) for seq, _, after, _ in shard0 if after == "SUSPECT"] == [
        (b, "SUSPECT") for b in blips
    ]
    for b in blips:
        # Successes of the window are applied first, so each blip is a streak of one.
        assert transition_at(entries, 0, b).rule == "reported failure: ReadTimeout ×1"
        assert transition_at(entries, 0, b).evidence == (b,)
    assert len(of_kind(entries, EpochEntry)) == 1  # HEALTHY ↔ SUSPECT never moves the epoch

    out = explain(sqlite_url, "0")
    assert re.search(
        r"shard 0 is HEALTHY since seq \d+: probes answered again: \d+ consecutive successful "
        r"probes ≥ healthy_threshold 2",
        out,
    )
    assert "it has never been condemned (no transition to DEAD or RETIRED)" in out
    assert "streaks: 0 failed probes, 0 reported failures (unhealthy_threshold 3)" in out
    assert "how it got here (6 transitions):" in out
    assert out.count("HEALTHY → SUSPECT — reported failure: ReadTimeout ×1") == 3
    run = explain(sqlite_url)
    assert "trouble recorded: none" in run and "every shard is HEALTHY" in run


# ── a wedged engine: probes answer, generations time out ───────────────────────


def test_a_wedged_engine_answering_probes_is_condemned_by_the_reported_streak_alone(
    sqlite_url: str,
) -> None:
    s = story(sqlite_url, fleet_config(3))
    led = s.ledger
    refit(led, 1)
    failures = []
    for _ in range(3):
        led.report_outcomes("router", window(s0=(40, None), s1=(40, None), s2=(0, "ReadTimeout")))
        failures.append(s.mark("failure"))
        if len(failures) < 3:
            for _ in range(4):  # the actor answers is_alive: the engine is wedged, not dead
                led.record_probes({0: OK, 1: OK, 2: OK})
    dead = failures[-1]
    s.close()

    entries = history(sqlite_url)
    condemned = transition_at(entries, 2, dead)
    assert (condemned.after, condemned.input) == ("DEAD", "reported failure")
    assert condemned.rule == (
        "3 consecutive reported failures ≥ unhealthy_threshold 3 (last: ReadTimeout ×1)"
    )
    assert condemned.evidence == tuple(failures)
    # Probes kept succeeding: they lifted it back to HEALTHY between failures, never cleared
    # the reported streak.
    assert [(t[2], t[3]) for t in transitions(entries, 2)] == [
        ("SUSPECT", "reported failure"),
        ("HEALTHY", "probe ok"),
        ("SUSPECT", "reported failure"),
        ("HEALTHY", "probe ok"),
        ("DEAD", "reported failure"),
    ]

    out = explain(sqlite_url, "2")
    a, b, c = failures
    assert (
        f"shard 2 is DEAD since seq {dead}: 3 consecutive reported failures (seqs {a}, {b}, {c}: "
        "infra ReadTimeout) ≥ unhealthy_threshold 3; probes kept succeeding (8 successful probes "
        "in that span), so only the reported streak could condemn it."
    ) in out
    for seq in failures:
        assert f"seq {seq} (" in out
    assert "adapter router reported shard 2: 0 successes, failures: infra ReadTimeout ×1" in out
    doc = explain_json(sqlite_url, "2")
    assert doc["probe_tally"] == {
        "shard": 2,
        "first_seq": a,
        "last_seq": c,
        "probes_ok": 8,
        "probes_failed": 0,
    }
    # The run has not ended: explain says so, and lists the condemned shard.
    run = explain(sqlite_url)
    assert f"run {RUN} has not ended: as of seq {dead}" in run
    assert f"shard 2 DEAD since seq {dead}: 3 consecutive reported failures" in run


# ── restarts exhausted ─────────────────────────────────────────────────────────


def test_restart_budget_exhausted_retires_the_shard(sqlite_url: str) -> None:
    s = story(sqlite_url, fleet_config(3, max_restart_attempts_per_shard=2))
    led = s.ledger
    refit(led, 1)
    led.record_probes({0: OK, 1: DIED, 2: OK})
    death = s.mark("round")  # the round is one event: shard 1's death is at its seq
    requested, failed = [], []
    for _ in range(2):
        led.restart_requested(1)
        requested.append(s.mark("requested"))
        led.restart_failed(1, "engine failed to start: CUDA out of memory")
        failed.append(s.mark("failed"))
    led.restart_requested(1)
    retired = s.mark("retired")
    requested.append(retired)
    refit(led, 2)
    led.end_run("completed", "reached max_num_steps=2")
    s.close()

    entries = history(sqlite_url)
    assert transitions(entries, 1) == [
        (death, "HEALTHY", "DEAD", "actor death confirmed"),
        (requested[0], "DEAD", "RESTARTING", "restart requested"),
        (failed[0], "RESTARTING", "DEAD", "restart failed"),
        (requested[1], "DEAD", "RESTARTING", "restart requested"),
        (failed[1], "RESTARTING", "DEAD", "restart failed"),
        (retired, "DEAD", "RETIRED", "restart requested"),
    ]
    assert transition_at(entries, 1, retired).rule == (
        "restart attempts exhausted (3 > max_restart_attempts_per_shard 2)"
    )
    assert transition_at(entries, 1, requested[1]).rule == "restart requested (attempt 2 of 2)"
    assert [(r.seq, r.action) for r in of_kind(entries, RestartEntry)] == [
        (requested[0], "requested"),
        (failed[0], "failed"),
        (requested[1], "requested"),
        (failed[1], "failed"),
        (retired, "requested"),
    ]

    out = explain(sqlite_url, "1")
    assert (
        f"shard 1 is RETIRED since seq {retired}: restart attempts exhausted (3 > "
        f"max_restart_attempts_per_shard 2): the restart requested at seq {retired} was one more "
        "than the budget allows; RETIRED is terminal: nothing moves it again."
    ) in out
    assert (
        f"restarts: 3 of max_restart_attempts_per_shard 2 used (requested at seqs "
        f"{requested[0]}, {requested[1]}, {retired}; failed at seqs {failed[0]}, {failed[1]})"
    ) in out
    assert "how it got here (6 transitions):" in out
    assert "RESTARTING → DEAD — restart failed: engine failed to start: CUDA out of memory" in out
    assert f"shard 1 RETIRED since seq {retired}: restart attempts exhausted" in explain(sqlite_url)


# ── fleet exhausted ────────────────────────────────────────────────────────────


def test_fleet_exhausted_below_min_healthy_shards_ends_the_run_with_that_cause(
    sqlite_url: str,
) -> None:
    s = story(sqlite_url, fleet_config(3, min_healthy_shards=2))
    led = s.ledger
    refit(led, 1)
    led.record_probes({0: DIED, 1: OK, 2: OK})
    death = s.mark("death")
    probes = []
    for _ in range(3):
        led.record_probes({1: TIMEOUT, 2: OK})
        probes.append(s.mark("probe"))
    exhaustion = led.view.exhaustion()
    assert exhaustion is not None
    led.declare_exhausted()
    exhausted = s.mark("exhausted")
    led.end_run("failed", exhaustion.describe())
    end = s.mark("end")
    s.close()

    entries = history(sqlite_url)
    # Each probe round is one event: shard 1's timeout is at the round's seq.
    timeouts = tuple(probes)
    assert transitions(entries, 1) == [
        (timeouts[0], "HEALTHY", "SUSPECT", "probe failed"),
        (timeouts[2], "SUSPECT", "DEAD", "probe failed"),
    ]
    assert transition_at(entries, 1, timeouts[2]).evidence == timeouts
    assert transitions(entries, 0) == [(death, "HEALTHY", "DEAD", "actor death confirmed")]
    decision = [d for d in of_kind(entries, DecisionEntry) if d.decision == "fleet_exhausted"]
    assert [(d.seq, d.detail) for d in decision] == [
        (exhausted, "1 serving < min_healthy_shards 2 (HEALTHY 1, DEAD 2)")
    ]
    assert [(e.seq, e.outcome, e.cause) for e in of_kind(entries, EndEntry)] == [
        (end, "failed", exhaustion.describe())
    ]

    run = explain(sqlite_url)
    assert run.startswith(f"run {RUN} ended failed at seq {end} (")
    assert (
        "why: fleet exhausted: 1 serving < min_healthy_shards 2 (HEALTHY 1, DEAD 2) "
        f"(seq {exhausted})"
    ) in run
    assert f"shard 0 DEAD since seq {death}: actor death confirmed by the runtime" in run
    assert (
        f"shard 1 DEAD since seq {timeouts[2]}: 3 consecutive failed probes ≥ unhealthy_threshold 3"
    ) in run

    shard = explain(sqlite_url, "1")
    a, b, c = timeouts
    assert (
        f"shard 1 is DEAD since seq {c}: 3 consecutive failed probes (seqs {a}, {b}, {c}: "
        "timeout: no answer within probe_timeout_s=2) ≥ unhealthy_threshold 3; no actor death "
        "was confirmed: the probe streak condemned it."
    ) in shard
    assert "layout: world 3; shard 1 has no rank (absent)" in shard


# ── a stall with nothing in flight ─────────────────────────────────────────────


def test_stall_with_nothing_in_flight_says_where_progress_stopped(sqlite_url: str) -> None:
    s = story(sqlite_url, fleet_config(2))
    led = s.ledger
    refit(led, 1)
    led.report_progress(committed_groups=8, train_steps=3, in_flight=4)
    led.report_progress(committed_groups=10, train_steps=4, in_flight=0)
    progress = s.mark("progress")
    led.refit_started(4)  # a hung weight sync parks the rollout pump: nothing is in flight
    started = s.mark("started")
    led.record_probes({0: OK, 1: OK})
    led.record_probes({0: OK, 1: OK})
    led.stall_detected(
        committed_groups=10, train_steps=4, idle_s=371.8, in_flight=0, action="abort"
    )
    stall = s.mark("stall")
    cause = "stall: no progress for 371.8 s (stall_timeout_s=300) with 0 in flight"
    led.end_run("aborted", cause)
    end = s.mark("end")
    s.close()

    entries = history(sqlite_url)
    stalls = of_kind(entries, StallEntry)
    assert [
        (e.seq, e.committed_groups, e.train_steps, e.idle_s, e.in_flight, e.action) for e in stalls
    ] == [(stall, 10, 4, 371.8, 0, "abort")]
    open_refits = [r for r in of_kind(entries, RefitEntry) if r.outcome == "open"]
    assert [(r.started_seq, r.weight_version, r.participants) for r in open_refits] == [
        (started, 4, (0, 1))
    ]
    assert [(e.seq, e.outcome, e.cause) for e in of_kind(entries, EndEntry)] == [
        (end, "aborted", cause)
    ]

    run = explain(sqlite_url)
    assert run.startswith(f"run {RUN} ended aborted at seq {end} (")
    assert (
        "why: stall detected: no progress for 371.8 s at 10 committed groups, 4 train steps, "
        "0 in flight (action abort); nothing was in flight, so nothing could fail or time out: "
        f"only the missing progress shows the wedge (seq {stall})"
    ) in run
    assert f"last progress at seq {progress} (" in run
    assert (
        f"10 committed groups, 4 train steps, 0 in flight; nothing newer in the {end - progress} "
        "events"
    ) in run
    assert f"refit open: weight version 4 over shards 0 and 1 since seq {started} (" in run

    # Before the end, explain says where progress stopped, and that the run has not ended.
    earlier = explain(sqlite_url, "--at", str(stall))
    assert f"run {RUN} has not ended: as of seq {stall}" in earlier
    assert "why:" not in earlier
    assert f"last progress at seq {progress} (" in earlier
    assert (
        f"stalls: 1 recorded, the last at seq {stall} (idle 371.8 s, 0 in flight, action abort)"
        in earlier
    )
    assert f"refit open: weight version 4 over shards 0 and 1 since seq {started}" in earlier
    doc = explain_json(sqlite_url, "--at", str(stall))
    assert doc["ended"] is None
    assert doc["progress"]["seq"] == progress and doc["progress"]["in_flight"] == 0
    assert doc["open_refit"]["started_seq"] == started


# ── context lost mid-transfer ──────────────────────────────────────────────────


def test_context_lost_mid_transfer_ends_the_run_attributably(sqlite_url: str) -> None:
    s = story(sqlite_url, fleet_config(2))
    led = s.ledger
    refit(led, 1)
    led.report_progress(committed_groups=4, train_steps=1, in_flight=0)
    led.refit_started(2)
    started = s.mark("started")
    reason = "[REFIT_CONTEXT_LOST] sync_stream_within: kernels orphaned on the trainer's stream"
    led.refit_aborted(2, reason, context_lost=True)
    abort = s.mark("abort")
    led.end_run("failed", "device context lost mid-transfer")
    end = s.mark("end")
    s.close()

    entries = history(sqlite_url)
    aborted = [r for r in of_kind(entries, RefitEntry) if r.outcome == "aborted"]
    assert [(r.started_seq, r.seq, r.participants, r.context_lost, r.reason) for r in aborted] == [
        (started, abort, (0, 1), True, reason)
    ]
    assert [
        e for e in entries if isinstance(e, TransitionEntry) and e.seq > 1 and e.seq >= started
    ] == []

    run = explain(sqlite_url)
    assert run.startswith(f"run {RUN} ended failed at seq {end} (")
    assert (
        "why: refit to weight version 2 aborted with the device context lost mid-transfer: no "
        f"rebuild can succeed ({reason}) (seq {abort})"
    ) in run
    assert "every shard is HEALTHY" in run
    doc = explain_json(sqlite_url)
    assert doc["why"]["kind"] == "context_lost"
    assert doc["ended"]["cause"] == "device context lost mid-transfer"
