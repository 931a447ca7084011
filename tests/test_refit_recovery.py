"""Refit recovery on real gloo groups between Ray actor processes: probe now, mark
partial, condemn a lone suspect, rebuild, retry once — and abort a push as soon as the
ledger records a participant dead, and end the run on a deterministic failure.

Kills and freezes are real signals; every step of a recovery must be in the log, and
the layout the transport built must be the ledger's layout at that point. Tests at the
default refit timeout (300 s) assert on the recorded events and their order; the
``result(timeout=...)`` of a refit is only a guard against a hang, well below 300 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleetledger.adapters.failure_taxonomy import cause_chain
from fleetledger.config import FleetHealthConfig, RefitConfig
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.controller.probe_pump import ProbePump
from fleetledger.controller.refit_recovery import RefitCoordinator, RunFailed
from fleetledger.projections.shard_states import ShardState
from fleetledger.store.log import EventLog
from tests.builders import fleet_config

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
pytest.importorskip("torch", reason="torch is not installed: pip install -e '.[dev]'")

from fleetledger.projections.fleet_view import fold  # noqa: E402
from fleetledger.transports.gloo_broadcast import UNBOUNDED_SETTLE_S  # noqa: E402
from fleetledger.weight_sync import (  # noqa: E402
    AbortReport,
    Party,
    PushReport,
    ReconcileOutcome,
    RefitFailed,
    RefitFailureKind,
    WeightSynchronizer,
)
from tests.probe_facts import deaths  # noqa: E402
from tests.refit_fleet import SHARDS, Fleet  # noqa: E402

REFIT_TIMEOUT_S = 2.0
DEFAULTS = RefitConfig()  # refit_timeout_s 300, grace_s 60
HANG_GUARD_S = 200.0  # a refit not back by then is waiting out the 300 s timeout: a failure


@pytest.fixture
def ledger(sqlite_url: str) -> Iterator[Ledger]:
    log = EventLog.open(sqlite_url)
    yield Ledger.start(log, "refit", fleet_config(SHARDS, train_world_size=1))
    log.close()


def _fleet(total_bytes: int = 2_000_000) -> Fleet:
    return Fleet(total_bytes=total_bytes, refit_timeout_s=REFIT_TIMEOUT_S)


@pytest.fixture
def fleet(ray_cluster: str) -> Iterator[Fleet]:
    fleet = _fleet()
    yield fleet
    fleet.close()


def _coordinator(
    fleet: Fleet,
    ledger: Ledger,
    *,
    refit_timeout_s: float | None = REFIT_TIMEOUT_S,
    grace_s: float = 10.0,
) -> RefitCoordinator:
    return RefitCoordinator(
        ledger,
        fleet.sync,
        fleet.prober(),
        refit_timeout_s=refit_timeout_s,
        grace_s=grace_s,
        probe_timeout_s=1.0,
    )


def _types_since(ledger: Ledger, seq: int) -> list[str]:
    return [r.event.type for r in ledger.log.read(ledger.run, seq)]


def _checksums(fleet: Fleet, shards) -> set[str]:
    return {ray.get(fleet.workers[s].refit_checksum.remote(), timeout=60) for s in shards}


def test_kill_one_of_three_at_a_step_boundary_rebuilds_without_it(fleet, ledger):
    coordinator = _coordinator(fleet, ledger)
    fleet.step(1)
    assert coordinator.refit(1).participants == (0, 1, 2)
    os.kill(fleet.pids[1], signal.SIGKILL)
    _probe_until_dead(fleet, ledger, 1)
    expected = fleet.step(2)
    outcome = coordinator.refit(2)
    assert outcome.participants == (0, 2) and not outcome.recovered
    assert fleet.sync.built_layout == ledger.view.layout()
    assert _checksums(fleet, (0, 2)) == {expected}
    # A third step with the same membership: no rebuild, counted.
    fleet.step(3)
    coordinator.refit(3)
    assert (fleet.sync.rebuilds, fleet.sync.skipped_rebuilds) == (2, 1)


def test_kill_in_the_middle_of_a_broadcast_recovers_on_the_smaller_world(ray_cluster, ledger):
    fleet = _fleet(total_bytes=80_000_000)
    try:
        coordinator = _coordinator(fleet, ledger)
        fleet.sync.reconcile(ledger.view.absent)
        expected = fleet.step(1)
        head = ledger.log.head(ledger.run)
        with ThreadPoolExecutor(1) as pool:
            refit = pool.submit(coordinator.refit, 1)
            time.sleep(0.05)
            os.kill(fleet.pids[2], signal.SIGKILL)
            outcome = refit.result(timeout=300)
        assert outcome.recovered and outcome.participants == (0, 1)
        types = _types_since(ledger, head)
        assert types[:2] == ["refit_started", "refit_aborted"]
        (death,) = deaths(ledger.log.read(ledger.run, head), 2)
        partial = next(
            r.seq
            for r in ledger.log.read(ledger.run, head)
            if r.event.type == "weights_marked_partial"
        )
        assert death.seq < partial
        assert types[-2:] == ["refit_started", "refit_completed"]
        assert ledger.view.state_of(2) is ShardState.DEAD
        for shard in (0, 1):  # partial weights, then re-admitted by the retry
            assert ledger.view.state_of(shard) is ShardState.HEALTHY
            assert ledger.view.shards[shard].weight_version == 1
        assert fleet.sync.built_layout == ledger.view.layout()
        assert _checksums(fleet, (0, 1)) == {expected}
    finally:
        fleet.close()


@pytest.mark.parametrize("staged", [False, True], ids=["received-in-place", "staged"])
def test_a_kill_mid_broadcast_marks_partial_only_the_survivors_whose_load_began(
    ray_cluster, ledger, staged
):
    """A worker that receives in place has begun changing what it serves the moment the
    bytes arrive: it may be partial. One that receives into staging buffers and loads
    afterwards (an engine) still serves whole weights of the version before while the
    push is cut: it is not marked, stays serving, and the epoch moves once (the death)."""
    fleet = Fleet(total_bytes=80_000_000, refit_timeout_s=REFIT_TIMEOUT_S, staged=staged)
    try:
        coordinator = _coordinator(fleet, ledger)
        fleet.sync.reconcile(ledger.view.absent)
        fleet.step(1)
        head = ledger.log.head(ledger.run)
        with ThreadPoolExecutor(1) as pool:
            refit = pool.submit(coordinator.refit, 1)
            while set(fleet.in_flight([0, 1]).values()) != {1}:  # all inside the push
                time.sleep(0.005)
            os.kill(fleet.pids[2], signal.SIGKILL)
            outcome = refit.result(timeout=300)
        assert outcome.recovered and outcome.participants == (0, 1)
        events = list(ledger.log.read(ledger.run, head))
        (partial,) = [r.event for r in events if r.event.type == "weights_marked_partial"]
        assert partial.shards == (() if staged else (0, 1))
        view = fold(ledger.log.read(ledger.run, 0, head))
        serving_sets = []
        for recorded in events:
            view.apply(recorded)
            serving_sets.append(view.serving)
        # Staged: a router never had nothing to route to; in place, the survivors were
        # STALE until the retry re-admitted them.
        assert (() in serving_sets) is not staged
        assert (ledger.view.epoch - fold(ledger.log.read(ledger.run, 0, head)).epoch) == (
            1 if staged else 3
        )
    finally:
        fleet.close()


def test_a_shard_frozen_mid_refit_is_condemned_as_the_silent_participant(fleet, ledger):
    """Nothing suspected it before; the refit hangs on it, the probe of the recovery
    times out (its one suspect), and it is condemned."""
    coordinator = _coordinator(fleet, ledger)
    fleet.step(1)
    coordinator.refit(1)
    assert ledger.view.suspected == ()
    os.kill(fleet.pids[1], signal.SIGSTOP)
    expected = fleet.step(2)
    head = ledger.log.head(ledger.run)
    outcome = coordinator.refit(2)
    assert outcome.recovered and outcome.condemned == 1
    (condemned,) = [
        r.event
        for r in ledger.log.read(ledger.run, head)
        if r.event.type == "silent_participant_condemned"
    ]
    assert condemned.shard == 1 and "only suspect" in condemned.reason
    assert ledger.view.state_of(1) is ShardState.DEAD
    assert ledger.view.state_of(0) is ShardState.HEALTHY
    assert outcome.participants == (0, 2)
    assert fleet.sync.built_layout == ledger.view.layout()
    assert _checksums(fleet, (0, 2)) == {expected}
    assert ledger.view.ended is None  # the run carries on


def test_a_failed_build_leaves_the_record_of_the_communicator_that_exists(fleet, ledger):
    fleet.sync.reconcile(ledger.view.absent)
    before = (fleet.sync.built_absent, fleet.sync.built_layout, fleet.sync.rebuilds)
    os.kill(fleet.pids[2], signal.SIGSTOP)
    with pytest.raises(RefitFailed) as failed:
        fleet.sync.reconcile({1}, force=True)  # shard 2 must hear the membership: frozen
    assert failed.value.silent_shards == (2,)
    assert (fleet.sync.built_absent, fleet.sync.built_layout, fleet.sync.rebuilds) == before


def test_two_frozen_suspects_end_the_run_naming_both(fleet, ledger):
    coordinator = _coordinator(fleet, ledger)
    fleet.step(1)
    coordinator.refit(1)
    os.kill(fleet.pids[0], signal.SIGSTOP)
    os.kill(fleet.pids[2], signal.SIGSTOP)
    fleet.step(2)
    with pytest.raises(RunFailed, match=r"shards \[0, 2\] are suspected"):
        coordinator.refit(2)
    (refusal,) = [
        r.event for r in ledger.log.read(ledger.run, 1) if r.event.type == "condemnation_refused"
    ]
    assert refusal.suspected == (0, 2)
    assert ledger.view.ended.outcome == "failed"
    assert "shards [0, 2] are suspected" in ledger.view.ended.cause


def test_a_restarted_shard_rejoins_the_next_refit_and_serves_at_the_new_version(fleet, ledger):
    coordinator = _coordinator(fleet, ledger)
    fleet.step(1)
    coordinator.refit(1)
    generations = [_integers(ledger)]
    os.kill(fleet.pids[1], signal.SIGKILL)
    _probe_until_dead(fleet, ledger, 1)
    generations.append(_integers(ledger))
    fleet.step(2)
    coordinator.refit(2)
    assert fleet.sync.built_layout.world_size == 3
    # Restart: recorded first, then the new process, then loaded (STALE: start-up weights).
    ledger.restart_requested(1)
    generations.append(_integers(ledger))
    fleet.new_worker(1)
    ledger.replacement_loaded(1)
    generations.append(_integers(ledger))
    assert ledger.view.state_of(1) is ShardState.STALE
    expected = fleet.step(3)
    outcome = coordinator.refit(3)
    generations.append(_integers(ledger))
    assert outcome.participants == (0, 1, 2)
    assert fleet.sync.built_layout.world_size == 4  # the layout grew back
    assert fleet.sync.built_layout == ledger.view.layout()
    assert ledger.view.state_of(1) is ShardState.HEALTHY
    assert ledger.view.shards[1].weight_version == 3
    assert _checksums(fleet, (0, 1, 2)) == {expected}
    # (epoch, absent generation) after: refit 1, the death, restart_requested (DEAD →
    # RESTARTING: absent either way), replacement_loaded (RESTARTING → STALE: the layout
    # grows back, the serving set does not), refit 3 (STALE → HEALTHY: serving again).
    # The transport rebuilt exactly where the absent generation moved.
    assert generations == [(0, 0), (1, 1), (1, 1), (1, 2), (2, 2)]
    assert fleet.sync.rebuilds == 3  # the first build, after the death, after re-admission


def _remote_task_error(cause: BaseException) -> BaseException:
    """A real Ray task error as the driver receives it: the remote exception as
    ``.cause``, no ``__cause__`` (the plain form, not the dual-class one)."""
    from ray.exceptions import RayTaskError

    return RayTaskError("push", "Traceback (remote)", cause, proctitle="trainer", pid=1)


class _ContextLossTransport(WeightSynchronizer):
    """A transport whose push fails with a lost device context — what a CUDA fault in the
    bulk transfer looks like. No CPU collective can lose a device context, so this one
    case is scripted; the recovery's reaction to it is what is under test. ``arrives``:
    as raised, as the ``__cause__`` of another error, or as the ``.cause`` of a remote
    task's error (what Ray's task error carries) — as an RPC layer would hand it on.
    """

    def __init__(self, arrives: str) -> None:
        super().__init__()
        self.reconciles: list[bool] = []
        self.arrives = arrives

    def reconcile(self, absent, *, force=False) -> ReconcileOutcome:
        self.reconciles.append(force)
        return ReconcileOutcome.NOT_APPLICABLE

    def push(self, version) -> PushReport:
        lost = RefitFailed(
            "push",
            errors={Party.trainer(0): "CUDA error: an illegal memory access was encountered"},
            context_lost=True,
        )
        if self.arrives == "chained":
            raise RuntimeError("the trainer's push task failed") from lost
        if self.arrives == "remote":
            raise _remote_task_error(lost)
        raise lost

    def abort(self, *, gone=()) -> AbortReport:
        raise AssertionError("no rebuild may be attempted on a lost context")


@pytest.mark.parametrize("arrives", ["direct", "chained", "remote"])
def test_a_lost_device_context_ends_the_run_at_once(ledger, arrives):
    class NoProbes:
        def probe(self, shards, timeout_s, *, deep=False):
            raise AssertionError("no probing on a lost context")

    transport = _ContextLossTransport(arrives)
    coordinator = RefitCoordinator(
        ledger, transport, NoProbes(), refit_timeout_s=1.0, grace_s=1.0, probe_timeout_s=0.5
    )
    with pytest.raises(RunFailed, match="device context is lost"):
        coordinator.refit(1)
    aborted = [r.event for r in ledger.log.read(ledger.run, 1) if r.event.type == "refit_aborted"]
    assert [a.context_lost for a in aborted] == [True]
    assert transport.reconciles == [False]
    assert "device context is lost" in ledger.view.ended.cause
    if arrives == "direct":  # the transport's account is the recorded reason, parties and all
        assert "trainer 0: CUDA error: an illegal memory access" in ledger.view.ended.cause


class _FailsOnce(WeightSynchronizer):
    """A transport whose first push fails with ``failure`` and whose retry succeeds;
    counts the aborts it is asked for."""

    def __init__(self, failure: BaseException) -> None:
        super().__init__()
        self.failures = [failure]
        self.aborts = 0

    def reconcile(self, absent, *, force=False) -> ReconcileOutcome:
        return ReconcileOutcome.NOT_APPLICABLE

    def push(self, version) -> PushReport:
        if self.failures:
            raise self.failures.pop()
        return PushReport(version, 1, 0, "", 0.0)

    def abort(self, *, gone=()) -> AbortReport:
        self.aborts += 1
        return AbortReport()


class _Answers:
    """Probe answers by shard; a shard not listed answers ok."""

    def __init__(self, answers: dict[int, ProbeResult]) -> None:
        self.answers = answers

    def probe(self, shards, timeout_s, *, deep=False):
        return {s: self.answers.get(s, ProbeResult.ok()) for s in shards}


def _scripted(ledger: Ledger, failure: RefitFailed, answers: dict[int, ProbeResult]):
    return RefitCoordinator(
        ledger,
        _FailsOnce(failure),
        _Answers(answers),
        refit_timeout_s=1.0,
        grace_s=1.0,
        probe_timeout_s=0.5,
    )


_FROZEN = {0: ProbeResult("timeout", "no answer within 0.5s")}


def test_the_lone_suspect_the_transport_named_is_condemned_with_the_decisions_reason(ledger):
    failure = RefitFailed("push", silent={Party.shard(0): "no answer within 3s"})
    outcome = _scripted(ledger, failure, _FROZEN).refit(1)
    assert outcome.recovered and outcome.condemned == 0 and outcome.participants == (1, 2)
    (condemned,) = [
        r.event
        for r in ledger.log.read(ledger.run, 1)
        if r.event.type == "silent_participant_condemned"
    ]
    assert condemned.reason == (
        "refit v1 aborted with nothing absent and shard 0 the only suspect: "
        "RefitFailed: refit push failed — silent: shard 0: no answer within 3s"
    )


def test_a_lone_suspect_the_transport_did_not_name_is_refused_and_the_run_ends(ledger):
    """The transport saw shard 2 hang while shard 0 was the one that missed a probe:
    blaming shard 0 would condemn the wrong shard."""
    failure = RefitFailed("push", silent={Party.shard(2): "no answer within 3s"})
    found = "the only suspect, shard 0, is not among the shards the transport named ([2])"
    with pytest.raises(RunFailed) as failed:
        _scripted(ledger, failure, _FROZEN).refit(1)
    assert (
        str(failed.value) == f"refit v1 aborted and no silent participant could be named: {found}"
    )
    (refusal,) = [
        r.event for r in ledger.log.read(ledger.run, 1) if r.event.type == "condemnation_refused"
    ]
    assert (refusal.suspected, refusal.reason) == ((0,), f"refit v1: {found}")
    assert ledger.view.ended.cause == str(failed.value)
    assert "silent_participant_condemned" not in _types_since(ledger, 1)


def test_a_dead_trainer_ends_the_run_without_a_rebuild(ledger):
    failure = RefitFailed("push", dead={Party.trainer(0): "ActorDiedError: gone"})
    with pytest.raises(RunFailed, match=r"trainer rank\(s\) \[0\] died"):
        _scripted(ledger, failure, {}).refit(1)
    assert "weights_marked_partial" not in _types_since(ledger, 1)


def test_a_shard_the_push_saw_die_is_recorded_dead_though_its_probe_answered(ledger):
    failure = RefitFailed("push", dead={Party.shard(1): "ActorDiedError: killed"})
    outcome = _scripted(ledger, failure, {}).refit(1)
    assert outcome.recovered and outcome.participants == (0, 2) and outcome.condemned is None
    (death,) = deaths(ledger.log.read(ledger.run, 1))
    assert (death.shard, death.error) == (1, "seen dying by the refit: ActorDiedError: killed")


class _RestartedBeforeRecovery(_FailsOnce):
    """Shard 1 dies mid-push; before the push's failure reaches the recovery, the death
    is recorded and the shard restarted (as the probe pump and the restarter would)."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(
            RefitFailed("push", dead={Party.shard(1): "ActorDiedError: killed"}, kind=None)
        )
        self.ledger = ledger

    def push(self, version) -> PushReport:
        if self.failures:
            self.ledger.actor_died(1, "ActorDiedError: killed (seen by a probe)")
            self.ledger.restart_requested(1)
            self.ledger.replacement_loaded(1)
        return super().push(version)


def test_a_death_the_push_saw_is_never_recorded_against_a_replacement(ledger):
    coordinator = RefitCoordinator(
        ledger,
        _RestartedBeforeRecovery(ledger),
        _Answers({}),
        refit_timeout_s=1.0,
        grace_s=1.0,
        probe_timeout_s=0.5,
    )
    outcome = coordinator.refit(1)
    loaded = next(
        r.seq for r in ledger.log.read(ledger.run, 1) if r.event.type == "replacement_loaded"
    )
    after = [r.event for r in ledger.log.read(ledger.run, loaded)]
    assert not any(e.type == "actor_death_confirmed" and e.shard == 1 for e in after)
    assert ledger.view.state_of(1) is not ShardState.DEAD
    # Back (STALE) before the recovery looked, it was still replaced: the round's failure
    # is explained, nobody is condemned, and the retry re-admits the replacement.
    assert outcome.recovered and outcome.condemned is None
    assert not {"silent_participant_condemned", "condemnation_refused"} & {e.type for e in after}
    assert outcome.participants == (0, 1, 2) and ledger.view.state_of(1) is ShardState.HEALTHY


class _BuildParksUntilAborted(WeightSynchronizer):
    """The first build parks as a rendezvous does on a frozen member, until an abort
    gives it up; the next build and every push succeed."""

    def __init__(self) -> None:
        super().__init__()
        self.given_up = threading.Event()
        self.builds = 0

    def reconcile(self, absent, *, force=False) -> ReconcileOutcome:
        self.builds += 1
        if self.builds == 1:
            self.given_up.wait(HANG_GUARD_S)
            raise RefitFailed("build", detail="given up", kind=RefitFailureKind.ABORTED)
        return ReconcileOutcome.REBUILT

    def push(self, version) -> PushReport:
        return PushReport(version, 1, 0, "", 0.0)

    def abort(self, *, gone=()) -> AbortReport:
        self.given_up.set()
        return AbortReport()


def test_a_stale_participant_frozen_during_the_build_is_found_by_its_probes(ledger):
    """The pump does not probe a STALE shard, so nothing records the re-admitted
    replacement frozen; the waiting refit probes it itself, gives the build up after
    unhealthy_threshold failures naming it silent, and the recovery condemns it."""
    ledger.actor_died(1, "ActorDiedError: killed")
    ledger.restart_requested(1)
    ledger.replacement_loaded(1)
    frozen = _Answers({1: ProbeResult("timeout", "no answer within 0.5s")})
    coordinator = RefitCoordinator(
        ledger,
        _BuildParksUntilAborted(),
        frozen,
        refit_timeout_s=1.0,
        grace_s=1.0,
        probe_timeout_s=0.5,
        watch_interval_s=0.01,
        stale_probe_interval_s=0.01,
    )
    head = ledger.log.head(ledger.run)
    outcome = coordinator.refit(1)
    assert outcome.recovered and outcome.condemned == 1 and outcome.participants == (0, 2)
    (aborted,) = [
        r.event for r in ledger.log.read(ledger.run, head) if r.event.type == "refit_aborted"
    ]
    assert aborted.reason.startswith("RefitFailed: refit build failed — silent: shard 1: 3 ")
    assert "consecutive failed probes while STALE ≥ unhealthy_threshold 3" in aborted.reason
    # The watch's own probes were never folded: the recovery's round is the one recorded.
    rounds = [r.event for r in ledger.log.read(ledger.run, head) if r.event.type == "probe_round"]
    assert len(rounds) == 1
    assert ledger.view.state_of(1) is ShardState.DEAD
    assert {ledger.view.state_of(s) for s in (0, 2)} == {ShardState.HEALTHY}


def _integers(ledger: Ledger) -> tuple[int, int]:
    """(epoch, absent generation), read from the thread-safe copy and checked against the
    live view it was copied from."""
    m = ledger.membership
    assert (m.epoch, m.absent_generation) == (ledger.view.epoch, ledger.view.absent_generation)
    return m.epoch, m.absent_generation


def _probe_until_dead(fleet: Fleet, ledger: Ledger, shard: int, timeout_s: float = 60.0) -> None:
    """Probe rounds, as the pump would run them, until the runtime reports the death."""
    deadline = time.monotonic() + timeout_s
    while ledger.view.state_of(shard) is not ShardState.DEAD:
        assert time.monotonic() < deadline, f"shard {shard} never reported dead"
        results = fleet.prober().probe(list(ledger.view.serving), 10.0)
        ledger.record_probes({s: r for s, r in results.items() if r.kind in ("ok", "died")})


# ── a death recorded mid-push aborts it: no waiting out the refit timeout ─────────


@contextlib.contextmanager
def _pumping(fleet: Fleet, ledger: Ledger) -> Iterator[None]:
    """The probe pump, as the controller runs it, on a short cadence; stopped and joined
    on the way out, so the test never closes the log under one of the pump's writes."""
    stop = threading.Event()
    config = FleetHealthConfig(enabled=True, probe_interval_s=0.5, probe_timeout_s=0.4)
    thread = ProbePump(ledger, fleet.prober(), config).start(stop)
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)


def _until_parked(fleet: Fleet, shards, timeout_s: float = 60.0) -> None:
    """Wait until the trainer and ``shards`` are each inside the push's collective."""
    deadline = time.monotonic() + timeout_s
    while set(fleet.in_flight(shards).values()) != {1}:
        assert time.monotonic() < deadline, f"the push never started: {fleet.in_flight(shards)}"
        time.sleep(0.02)


def _kill_mid_push(fleet: Fleet, coordinator: RefitCoordinator, pool, victim: int, version: int):
    """Start refit ``version`` and SIGKILL ``victim`` while the push is in flight.

    Stopped first, the victim cannot receive, so the push cannot complete before the
    kill lands; killed, it leaves every survivor parked in the collective (shard 1 is an
    interior rank of gloo's broadcast tree: nobody sees an error until the op timeout).
    """
    os.kill(fleet.pids[victim], signal.SIGSTOP)
    refit = pool.submit(coordinator.refit, version)
    _until_parked(fleet, [s for s in range(SHARDS) if s != victim])
    os.kill(fleet.pids[victim], signal.SIGKILL)
    return refit


def _assert_aborted_on_the_recorded_death(ledger: Ledger, head: int, victim: int) -> None:
    events = list(ledger.log.read(ledger.run, head))
    by_seq = {r.seq: r.event for r in events}
    died_at = ledger.view.shards[victim].since_seq  # the event that made it DEAD
    assert [(f.seq, f.kind) for f in deaths(events, victim)] == [(died_at, "died")]
    assert died_at in by_seq
    aborted = [r for r in events if r.event.type == "refit_aborted"]
    assert len(aborted) == 1, [a.event.reason for a in aborted]
    (abort,) = aborted
    assert died_at < abort.seq  # recorded first, then the abort it caused
    assert f"shard {victim} was recorded DEAD at seq {died_at}" in abort.event.reason
    assert "not waiting out" in abort.event.reason
    types = [r.event.type for r in events if r.seq > abort.seq]
    assert "weights_marked_partial" in types
    assert types.index("weights_marked_partial") < types.index("refit_started")
    assert types[-1] == "refit_completed"
    assert "silent_participant_condemned" not in types  # the dead one is absent: no guess


def test_a_kill_mid_push_at_the_default_timeout_aborts_as_soon_as_the_death_is_recorded(
    ray_cluster, ledger
):
    """refit_timeout_s=300 (the default): the probe pump records the death, the waiting
    coordinator sees it, aborts the communicator (releasing the parked survivors) and
    recovers; the next refit succeeds without the shard."""
    fleet = Fleet(total_bytes=80_000_000, refit_timeout_s=DEFAULTS.refit_timeout_s)
    try:
        coordinator = _default_coordinator(fleet, ledger)
        fleet.sync.reconcile(ledger.view.absent)
        expected = fleet.step(1)
        head = ledger.log.head(ledger.run)
        with _pumping(fleet, ledger), ThreadPoolExecutor(1) as pool:
            refit = _kill_mid_push(fleet, coordinator, pool, victim=1, version=1)
            outcome = refit.result(timeout=HANG_GUARD_S)
        assert outcome.recovered and outcome.participants == (0, 2)
        assert outcome.condemned is None
        _assert_aborted_on_the_recorded_death(ledger, head, victim=1)
        assert ledger.view.state_of(1) is ShardState.DEAD
        assert fleet.sync.built_layout == ledger.view.layout()
        assert _checksums(fleet, (0, 2)) == {expected}
        # The survivors' collectives in the old group were released, not left parked.
        assert fleet.in_flight((0, 2)) == {"trainer 0": 0, "shard 0": 0, "shard 2": 0}
        # And the fleet carries on: the next step's refit over the smaller world.
        expected = fleet.step(2)
        assert coordinator.refit(2).participants == (0, 2)
        assert _checksums(fleet, (0, 2)) == {expected}
    finally:
        fleet.close()


def test_a_participant_recorded_dead_during_the_build_gives_the_build_up_at_once(
    ray_cluster, ledger
):
    """A shard frozen as the first build begins parks it: its membership call would be
    waited for refit_timeout_s + grace_s (360 s by default). The probe pump records it
    dead; the coordinator, watching the build as it watches a push, gives the build up
    naming that death, and recovers over the survivors. Nothing was pushed: nobody's
    weights are partial."""
    fleet = Fleet(total_bytes=2_000_000, refit_timeout_s=DEFAULTS.refit_timeout_s)
    try:
        coordinator = _default_coordinator(fleet, ledger)
        os.kill(fleet.pids[1], signal.SIGSTOP)
        expected = fleet.step(1)
        with _pumping(fleet, ledger), ThreadPoolExecutor(1) as pool:
            outcome = pool.submit(coordinator.refit, 1).result(timeout=HANG_GUARD_S)
        assert outcome.recovered and outcome.participants == (0, 2)
        assert outcome.condemned is None
        died_at = ledger.view.shards[1].since_seq
        events = list(ledger.log.read(ledger.run, 1))
        (abort,) = [r for r in events if r.event.type == "refit_aborted"]
        assert died_at < abort.seq
        assert f"shard 1 was recorded DEAD at seq {died_at} (" in abort.event.reason
        assert "while refit v1's build was in flight" in abort.event.reason
        (partial,) = [r.event for r in events if r.event.type == "weights_marked_partial"]
        assert partial.shards == ()
        assert ledger.view.state_of(1) is ShardState.DEAD
        assert fleet.sync.built_layout == ledger.view.layout()
        assert _checksums(fleet, (0, 2)) == {expected}
    finally:
        fleet.close()


def test_an_unbounded_refit_is_aborted_by_a_death_another_writer_records(
    ray_cluster, ledger, sqlite_url
):
    """refit_timeout_s=None, configured explicitly, is unbounded (no TypeError) — and
    still abortable: a rollout in another process records the death in the same log."""
    fleet = Fleet(total_bytes=80_000_000, refit_timeout_s=None)
    try:
        coordinator = RefitCoordinator(
            ledger,
            fleet.sync,
            fleet.prober(),
            refit_timeout_s=None,
            grace_s=DEFAULTS.grace_s,
            probe_timeout_s=1.0,
        )
        fleet.step(1)
        assert coordinator.refit(1).participants == (0, 1, 2)  # unbounded, and it works
        assert fleet.sync.settle_s == UNBOUNDED_SETTLE_S  # the wait for stragglers: bounded
        expected = fleet.step(2)
        head = ledger.log.head(ledger.run)
        with EventLog.open(sqlite_url) as other_log, ThreadPoolExecutor(1) as pool:
            rollout = Ledger.resume(other_log, ledger.run)  # another writer of the run
            refit = _kill_mid_push(fleet, coordinator, pool, victim=1, version=2)
            rollout.actor_died(1, "ActorDiedError: the actor died unexpectedly (a rollout)")
            outcome = refit.result(timeout=HANG_GUARD_S)
        assert outcome.recovered and outcome.participants == (0, 2)
        _assert_aborted_on_the_recorded_death(ledger, head, victim=1)
        assert _checksums(fleet, (0, 2)) == {expected}
    finally:
        fleet.close()


# ── a deterministic failure ends the run with it: no probe, no condemnation ───────


def test_a_value_error_from_the_transport_with_one_suspect_ends_the_run_with_it(
    ray_cluster, ledger
):
    """Shard 1's member raises a ValueError in the push (a bug); shard 0 is SUSPECT.
    Recovering would probe and condemn (or refuse over) the suspect for a bug that is
    nobody's; the refit fails with the error instead, and the other members are
    released at once instead of waiting out the settle window (the default 300 s)."""
    fleet = Fleet(total_bytes=2_000_000, refit_timeout_s=DEFAULTS.refit_timeout_s, faulty=1)
    try:
        coordinator = _default_coordinator(fleet, ledger)
        fleet.step(1)
        coordinator.refit(1)
        ledger.record_probes({0: ProbeResult("timeout", "no answer within 1s")})
        assert ledger.view.suspected == (0,)
        ray.get(fleet.workers[1].arm_fault.remote("tensor 'layer0.weight': shape (4,) ≠ (8,)"))
        fleet.step(2)
        head = ledger.log.head(ledger.run)
        with ThreadPoolExecutor(1) as pool:
            refit = pool.submit(coordinator.refit, 2)
            with pytest.raises(RunFailed) as failed:
                refit.result(timeout=HANG_GUARD_S)
        # The run ends with the error, its cause chained: RefitFailed, then the member's.
        transport_error = failed.value.__cause__
        assert isinstance(transport_error, RefitFailed)
        assert transport_error.failure_kind is RefitFailureKind.DETERMINISTIC
        assert transport_error.errors[Party.shard(1)].startswith("ValueError: tensor")
        assert any(isinstance(link, ValueError) for link in cause_chain(failed.value))
        assert "failed deterministically" in str(failed.value)
        # Recorded: the abort with the error, and the end. Nothing probed, marked partial,
        # condemned or retried.
        events = [r.event for r in ledger.log.read(ledger.run, head)]
        assert [e.type for e in events] == ["refit_started", "refit_aborted", "run_ended"]
        assert "ValueError: tensor 'layer0.weight'" in events[1].reason
        assert not events[1].context_lost
        assert events[2].outcome == "failed" and "ValueError: tensor" in events[2].cause
        assert ledger.view.state_of(0) is ShardState.SUSPECT  # not condemned
        assert fleet.in_flight((0, 2)) == {"trainer 0": 0, "shard 0": 0, "shard 2": 0}
    finally:
        fleet.close()


def _default_coordinator(fleet: Fleet, ledger: Ledger) -> RefitCoordinator:
    return _coordinator(
        fleet, ledger, refit_timeout_s=DEFAULTS.refit_timeout_s, grace_s=DEFAULTS.grace_s
    )


@pytest.mark.parametrize(
    "failure",
    [
        ValueError("shape mismatch: layer0.weight (4,) ≠ (8,)"),
        RefitFailed("verify", errors={Party.shard(2): "rank 3: checksum 1a2b ≠ root 3c4d"}),
        RefitFailed("push", errors={Party.shard(1): "KeyError: 'layer9'"}),
    ],
    ids=["value-error", "checksum", "errors-only"],
)
def test_a_deterministic_failure_with_a_lone_suspect_condemns_nobody(ledger, failure):
    ledger.record_probes({0: ProbeResult("timeout", "no answer within 0.5s")})
    probes: list = []

    class Prober:
        def probe(self, shards, timeout_s, *, deep=False):
            probes.append(shards)
            return {s: ProbeResult.ok() for s in shards}

    transport = _FailsOnce(failure)
    coordinator = RefitCoordinator(
        ledger, transport, Prober(), refit_timeout_s=1.0, grace_s=1.0, probe_timeout_s=0.5
    )
    with pytest.raises(RunFailed) as failed:
        coordinator.refit(1)
    assert failed.value.__cause__ is failure
    assert probes == [] and coordinator.recoveries == 0
    types = _types_since(ledger, 1)
    assert "silent_participant_condemned" not in types
    assert "condemnation_refused" not in types and "weights_marked_partial" not in types
    assert types[-3:] == ["refit_started", "refit_aborted", "run_ended"]
    assert ledger.view.state_of(0) is ShardState.SUSPECT
    assert transport.aborts == 1  # members parked in it are released on the way out
    assert str(failure) in ledger.view.ended.cause


@pytest.mark.parametrize(
    "failure",
    [
        RefitFailed(
            "push", errors={Party.shard(0): "CollectiveAborted"}, kind=RefitFailureKind.ABORTED
        ),
        RefitFailed("push", silent={Party.shard(0): "no answer within 3s"}),
        TimeoutError("the trainer's push task timed out"),
    ],
    ids=["aborted", "silent", "timeout"],
)
def test_a_timeout_or_an_abort_with_a_lone_suspect_still_condemns_it(ledger, failure):
    ledger.record_probes({0: ProbeResult("timeout", "no answer within 0.5s")})
    coordinator = RefitCoordinator(
        ledger,
        _FailsOnce(failure),
        _Answers(_FROZEN),
        refit_timeout_s=1.0,
        grace_s=1.0,
        probe_timeout_s=0.5,
    )
    outcome = coordinator.refit(1)
    assert outcome.recovered and outcome.condemned == 0 and outcome.participants == (1, 2)


class _Scripted(WeightSynchronizer):
    """A transport that fails as scripted: each reconcile and push pops the next entry of
    its list (``None``: succeed)."""

    def __init__(self, reconciles: list, pushes: list) -> None:
        super().__init__()
        self.reconciles, self.pushes = reconciles, pushes
        self.pushed_to: list[int] = []

    def reconcile(self, absent, *, force=False) -> ReconcileOutcome:
        failure = self.reconciles.pop(0) if self.reconciles else None
        if failure is not None:
            raise failure
        return ReconcileOutcome.NOT_APPLICABLE

    def push(self, version) -> PushReport:
        failure = self.pushes.pop(0) if self.pushes else None
        if failure is not None:
            raise failure
        return PushReport(version, 1, 0, "", 0.0)

    def abort(self, *, gone=()) -> AbortReport:
        return AbortReport()


class _Rounds:
    """Probe answers per round: the n-th probe of the recovery gets the n-th dict."""

    def __init__(self, *rounds: dict[int, ProbeResult]) -> None:
        self.rounds = list(rounds)

    def probe(self, shards, timeout_s, *, deep=False):
        answers = self.rounds.pop(0) if len(self.rounds) > 1 else self.rounds[0]
        return {s: answers.get(s, ProbeResult.ok()) for s in shards}


def test_a_member_frozen_after_the_recoverys_probe_is_found_by_the_next_round(ledger):
    """Two faults close together (seen by the chaos campaign): shard 1 is killed in the
    push, shard 0 frozen just after. The first round records 1's death and rebuilds over
    {0, 2}; the rebuild finds 0 silent. That is a failed round, not the end of the run:
    the next round probes again, condemns 0 (the lone suspect, nothing newly absent),
    and the refit completes on shard 2."""
    killed = RefitFailed("push", dead={Party.shard(1): "ActorDiedError: killed"})
    frozen = RefitFailed("membership", silent={Party.shard(0): "no answer within 3s"})
    sync = _Scripted(reconciles=[None, frozen], pushes=[killed])
    rounds = _Rounds(
        {1: ProbeResult("died", "ActorDiedError: killed")},
        {0: ProbeResult("timeout", "no answer within 0.5s")},
    )
    coordinator = RefitCoordinator(
        ledger, sync, rounds, refit_timeout_s=1.0, grace_s=1.0, probe_timeout_s=0.5
    )
    outcome = coordinator.refit(1)
    assert outcome.recovered and outcome.participants == (2,) and outcome.condemned == 0
    assert ledger.view.state_of(1) is ShardState.DEAD
    assert ledger.view.state_of(0) is ShardState.DEAD
    assert ledger.view.state_of(2) is ShardState.HEALTHY
    assert ledger.view.ended is None


def test_recovery_rounds_end_when_a_round_loses_nobody(ledger):
    """Every round must leave a participant out; a retry that fails with everyone still
    answering finds no lone suspect, and the run ends naming why."""
    timeout = RefitFailed("push", silent={Party.shard(0): "no answer within 3s"})
    sync = _Scripted(reconciles=[], pushes=[timeout, timeout, timeout])
    coordinator = RefitCoordinator(
        ledger, sync, _Rounds({}), refit_timeout_s=1.0, grace_s=1.0, probe_timeout_s=0.5
    )
    with pytest.raises(RunFailed):
        coordinator.refit(1)
    assert ledger.view.ended is not None and ledger.view.ended.outcome == "failed"


def test_a_second_kill_in_the_retry_is_recovered_too(ledger):
    """Two kills close together as a refit starts (seen by the chaos campaign): the retry
    meets the second death. Each round lost a participant, so the next round rebuilds
    over the last survivor and the refit completes — the reference ended the run."""
    first = RefitFailed("push", dead={Party.shard(1): "ActorDiedError: killed"})
    second = RefitFailed("push", dead={Party.shard(2): "ActorDiedError: killed"})
    sync = _Scripted(reconciles=[], pushes=[first, second])
    rounds = _Rounds(
        {1: ProbeResult("died", "ActorDiedError: killed")},
        {2: ProbeResult("died", "ActorDiedError: killed")},
        {},
    )
    coordinator = RefitCoordinator(
        ledger, sync, rounds, refit_timeout_s=1.0, grace_s=1.0, probe_timeout_s=0.5
    )
    outcome = coordinator.refit(1)
    assert outcome.recovered and outcome.participants == (0,) and outcome.condemned is None
    assert [ledger.view.state_of(s) for s in range(3)] == [
        ShardState.HEALTHY,
        ShardState.DEAD,
        ShardState.DEAD,
    ]
    types = [r.event.type for r in ledger.log.read(ledger.run, 1)]
    assert types.count("refit_aborted") == 2 and types[-1] == "refit_completed"
