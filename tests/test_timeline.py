"""``fleetledger timeline``: the lanes projection (pure), and the PNG and HTML it draws.

The lanes tests fold random runs without a database and hold the picture's data to the
fold: every shard's intervals cover the run with no gap, and at every seq the interval
says what a fresh fold says. The command tests run on real SQLite files and the real
PostgreSQL server, on the demo run and on a longer scripted run written through the
ingest facade with a synthetic clock (``write_story``, also what drew
``docs/timeline-example.png``).
"""

from __future__ import annotations

import itertools
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import get_args

import pytest
from hypothesis import given
from typer.testing import Result

from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.models import (
    CondemnationRefused,
    FailureCount,
    FleetConfig,
    RecordedEvent,
    ShardOutcomes,
)
from fleetledger.projections.fleet_view import FleetView, ProjectionError
from fleetledger.projections.history import EpochEntry, TransitionEntry, replay
from fleetledger.projections.lanes import Lanes, build_lanes, lanes_of
from fleetledger.projections.shard_states import ShardState
from fleetledger.store.log import EventLog
from fleetledger.timeline import html as html_painter
from fleetledger.timeline.palette import NOT_ENDED_COLOUR, Glyph
from fleetledger.timeline.scene import MAX_LABELLED_REFITS, Scene, build_scene
from tests.cli_support import invoke, run_cli
from tests.projection_builders import Fleet, fleet_config
from tests.test_fold_properties import CHEAP_PROPERTY, runs

pytestmark = pytest.mark.usefixtures("cli_sandbox")

DOCS_EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "timeline-example.png"
STORY_RUN = "grpo-7b-0412"
STORY_SHARDS = 6


# ── a longer scripted run, with a synthetic clock ──────────────────────────────


class Clock:
    """The recorder's clock for a scripted run: time moves only when the script says."""

    def __init__(self, start_us: int = 1_795_946_400_000_000) -> None:  # 2026-11-29T10:00Z
        self.now = start_us

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1_000_000)


def write_story(url: str, run: str = STORY_RUN, *, end: bool = True) -> None:
    """Ninety minutes of a six-shard run, through the real ingest facade.

    Probes every 30 s and a refit every ten minutes or so, around the stories the
    timeline must show: a blip (SUSPECT and back), a wedged shard condemned by its
    reported streak, restarted and re-admitted by a refit; a refit aborted with one
    suspect, who is condemned and then retired when its restarts fail; an actor death;
    and a final refit aborted with two suspects (refused, context lost) and a stall —
    ending the run as failed, or (``end=False``) leaving it without ``run_ended``.
    """
    clock = Clock()
    config = FleetConfig(
        shard_count=STORY_SHARDS,
        workers_per_shard=2,
        train_world_size=4,
        max_restart_attempts_per_shard=2,
        min_healthy_shards=2,
        base_urls=tuple(f"http://gen-{i}.cluster.local:8000/v1" for i in range(STORY_SHARDS)),
        settings={"source": "tests/test_timeline.py story"},
    )
    with EventLog.open(url, clock_us=clock) as log:
        ledger = Ledger.start(log, run, config)
        ok = {i: ProbeResult.ok() for i in range(STORY_SHARDS)}
        version = 0

        def probes(bad: dict[int, ProbeResult] | None = None) -> None:
            clock.advance(30)
            ledger.record_probes({**ok, **(bad or {})})

        def minutes(n: int) -> None:
            for _ in range(2 * n):
                probes()

        def refit() -> None:
            nonlocal version
            version += 1
            clock.advance(5)
            ledger.refit_started(version)
            clock.advance(40)
            ledger.refit_completed(version)

        def aborted_refit(reason: str, *, context_lost: bool = False) -> None:
            nonlocal version
            version += 1
            clock.advance(5)
            ledger.refit_started(version)
            clock.advance(120)
            ledger.refit_aborted(version, reason, context_lost=context_lost)
            ledger.mark_weights_partial(version)
            clock.advance(1)

        refit()
        minutes(8)
        refit()
        probes({1: ProbeResult("timeout", "no answer within 2 s")})  # a blip
        minutes(7)
        refit()
        for _ in range(3):  # shard 3 wedges: probes answer, adapters time out
            clock.advance(20)
            ledger.report_outcomes(
                "rollout-adapter",
                [
                    ShardOutcomes(shard=0, successes=40),
                    ShardOutcomes(
                        shard=3,
                        failures=(FailureCount(category="infra", reason="ReadTimeout"),),
                    ),
                ],
            )
        clock.advance(10)
        ledger.restart_requested(3)
        minutes(3)
        clock.advance(10)
        ledger.replacement_loaded(3, "http://gen-3b.cluster.local:8000/v1")
        minutes(4)
        refit()
        minutes(10)
        refit()
        probes({5: ProbeResult("error", "HTTP 503")})
        aborted_refit("broadcast did not finish within refit_timeout_s=120")
        ledger.condemn_silent_participant(5, "the only SUSPECT shard when the refit aborted")
        clock.advance(5)
        ledger.refit_started(version)
        clock.advance(40)
        ledger.refit_completed(version)
        for _ in range(2):
            clock.advance(10)
            ledger.restart_requested(5)
            clock.advance(90)
            ledger.restart_failed(5, "engine failed to start: CUDA out of memory")
        clock.advance(10)
        ledger.restart_requested(5)  # over the budget of 2: retired
        minutes(6)
        refit()
        minutes(5)
        clock.advance(12)
        probes({0: ProbeResult("died", "ActorDiedError: worker exited with SIGKILL")})
        minutes(4)
        refit()
        clock.advance(10)
        ledger.restart_requested(0)
        minutes(3)
        clock.advance(10)
        ledger.replacement_loaded(0)
        minutes(5)
        refit()
        minutes(8)
        probes({1: ProbeResult("timeout"), 2: ProbeResult("timeout")})
        aborted_refit("gloo: Connection reset by peer", context_lost=True)
        ledger.refuse_condemnation(
            [1, 2], "2 shards were SUSPECT when the refit aborted: condemning one would be a guess"
        )
        clock.advance(600)
        ledger.stall_detected(
            committed_groups=1830, train_steps=57, idle_s=600.0, in_flight=0, action="abort"
        )
        if end:
            clock.advance(2)
            ledger.end_run(
                "failed", f"refit to v{version} aborted with context lost; no rebuild can succeed"
            )


# ── lanes: the projection ──────────────────────────────────────────────────────


def assert_lanes_match_the_fold(records: list[RecordedEvent], lanes: Lanes) -> None:
    """Coverage without gaps, and the interval's state == the fold's, at every seq."""
    last = records[-1]
    assert (lanes.last_seq, lanes.last_us) == (last.seq, last.at_us)
    at = {r.seq: r.at_us for r in records}
    for shard, lane in enumerate(lanes.lanes):
        assert lane, f"shard {shard} has no interval"
        assert (lane[0].start_seq, lane[0].start_us) == (1, records[0].at_us)
        assert lane[-1].end_seq == last.seq + 1 and lane[-1].end_us == last.at_us
        for before, after in itertools.pairwise(lane):
            assert before.end_seq == after.start_seq, (shard, before, after)
            assert before.end_us == after.start_us == at[after.start_seq]
            assert before.state != after.state, f"shard {shard}: unmerged {before}, {after}"
        for interval in lane:
            assert interval.shard == shard
            assert interval.start_seq < interval.end_seq
    view = FleetView.start(records[0])
    for record in records:
        if record.seq > 1:
            view.apply(record)
        for shard in range(lanes.shard_count):
            assert lanes.state_at(shard, record.seq) == view.state_of(shard).value, (
                f"shard {shard} at seq {record.seq}"
            )


@CHEAP_PROPERTY
@given(runs())
def test_lanes_cover_every_random_run_and_agree_with_the_fold_at_every_seq(
    records: list[RecordedEvent],
) -> None:
    assert_lanes_match_the_fold(records, lanes_of(records))


def test_lanes_of_a_recovery_story_name_each_state_and_its_rule() -> None:
    fleet = Fleet(shard_count=3)
    fleet.probe_failed(1, 3)  # seqs 2-4: SUSPECT at 2, DEAD at 4
    fleet.restart_requested(1)  # 5
    fleet.replacement_loaded(1)  # 6
    fleet.refit_started(7)  # 7
    fleet.refit_completed(7)  # 8
    lanes = lanes_of(fleet.records)
    assert_lanes_match_the_fold(fleet.records, lanes)
    assert [(i.state, i.start_seq, i.end_seq) for i in lanes.lanes[1]] == [
        ("HEALTHY", 1, 2),
        ("SUSPECT", 2, 4),
        ("DEAD", 4, 5),
        ("RESTARTING", 5, 6),
        ("STALE", 6, 8),
        ("HEALTHY", 8, 9),
    ]
    dead = lanes.lanes[1][2]
    assert dead.rule.startswith("3 consecutive failed probes ≥ unhealthy_threshold 3")
    assert [(i.state, i.start_seq, i.end_seq) for i in lanes.lanes[0]] == [("HEALTHY", 1, 9)]
    assert [(r.started_seq, r.seq, r.outcome) for r in lanes.refits] == [(7, 8, "completed")]
    assert [e.epoch for e in lanes.epochs] == [0, 1, 2]
    assert lanes.end is None
    assert lanes.end_label() == ("no run_ended recorded; last event seq 8: shards 0–2 HEALTHY")


def test_end_label_is_the_recorded_cause_or_where_the_run_stopped() -> None:
    ended = Fleet(shard_count=2)
    ended.actor_died(0)
    ended.run_ended("failed", "fleet exhausted below min_healthy_shards")
    assert lanes_of(ended.records).end_label() == (
        "run failed at seq 3: fleet exhausted below min_healthy_shards"
    )

    stopped = Fleet(shard_count=2)
    stopped.refit_started(4)
    stopped.actor_died(1)
    lanes = lanes_of(stopped.records)
    assert [(r.outcome, r.started_seq) for r in lanes.refits] == [("open", 2)]
    assert lanes.end_label() == (
        "no run_ended recorded; last event seq 3: shard 1 DEAD · shard 0 HEALTHY; "
        "refit to v4 open since seq 2"
    )


def test_a_stopped_fleet_is_summed_up_by_state_worst_first_with_shard_ranges() -> None:
    fleet = Fleet(shard_count=9)
    for shard in (2, 3, 4, 7):
        fleet.actor_died(shard)
    fleet.probe_failed(8)
    fleet.retired(0)
    assert lanes_of(fleet.records).describe_states() == (
        "shards 2–4, 7 DEAD · shard 0 RETIRED · shard 8 SUSPECT · shards 1, 5–6 HEALTHY"
    )


def test_two_moves_of_one_shard_in_one_event_show_only_where_it_ended() -> None:
    """The fold reports state after each event; a middle state is never on the picture."""
    config = fleet_config(2)
    t = 1_750_000_000_000_000

    def moved(seq: int, before: str, after: str) -> TransitionEntry:
        return TransitionEntry(seq, t + seq, 0, before, after, "probe failed", "rule", (seq,))

    start = EpochEntry(1, t + 1, 0, (0, 1), (), 2 * 2, {0: 0, 1: 1}, None)
    there_and_back = [start, moved(3, "HEALTHY", "SUSPECT"), moved(3, "SUSPECT", "HEALTHY")]
    lanes = build_lanes("r", config, there_and_back, last_seq=5, last_us=t + 5)
    assert [(i.state, i.start_seq, i.end_seq) for i in lanes.lanes[0]] == [("HEALTHY", 1, 6)]

    onwards = [start, moved(2, "HEALTHY", "SUSPECT"), moved(4, "SUSPECT", "HEALTHY")]
    onwards += [moved(4, "HEALTHY", "SUSPECT"), moved(4, "SUSPECT", "DEAD")]
    lanes = build_lanes("r", config, onwards, last_seq=5, last_us=t + 5)
    assert [(i.state, i.start_seq, i.end_seq) for i in lanes.lanes[0]] == [
        ("HEALTHY", 1, 2),
        ("SUSPECT", 2, 4),
        ("DEAD", 4, 6),
    ]


def test_lanes_refuse_a_history_that_does_not_start_at_seq_1() -> None:
    fleet = Fleet(shard_count=2)
    fleet.probe_failed(0)
    entries = list(replay(fleet.records))
    with pytest.raises(ProjectionError, match="begins with the epoch-0 entry at seq 1"):
        build_lanes("r", fleet.config, entries[1:], last_seq=2, last_us=fleet.records[-1].at_us)
    with pytest.raises(ProjectionError, match="nothing to draw"):
        lanes_of([])


def test_the_story_run_lanes_match_its_fold(sqlite_url: str) -> None:
    write_story(sqlite_url)
    with EventLog.open(sqlite_url) as log:
        records = list(log.read(STORY_RUN))
    lanes = lanes_of(records)
    assert_lanes_match_the_fold(records, lanes)
    assert lanes.final_states() == ("STALE",) * 5 + ("RETIRED",)
    assert [r.outcome for r in lanes.refits].count("aborted") == 2
    assert lanes.refits[-1].context_lost
    assert {d.decision for d in lanes.decisions} >= {"condemned", "condemnation_refused"}
    assert [s.action for s in lanes.stalls] == ["abort"]
    assert lanes.end is not None and lanes.end.outcome == "failed"
    assert ShardState.RETIRED.value in {i.state for i in lanes.lanes[5]}


# ── the command ────────────────────────────────────────────────────────────────


def timeline(*args: str, ok: bool = True) -> Result:
    result = run_cli("timeline", *args)
    if ok:
        assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    assert "Traceback" not in result.stdout + result.stderr
    return result


def demo_run(url: str) -> str:
    invoke("demo", "--db", url)
    with EventLog.open(url) as log:
        (run,) = [s.run_id for s in log.runs()]
    return run


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    assert data[-12:] == b"\x00\x00\x00\x00IEND\xaeB`\x82", f"{path} is truncated"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _matplotlib_missing() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed: pip install 'fleetledger[plot]' to test PNG output"
    return None


needs_matplotlib = pytest.mark.skipif(
    _matplotlib_missing() is not None, reason=_matplotlib_missing() or ""
)


@needs_matplotlib
def test_png_of_the_demo_run_is_a_valid_picture(sqlite_url: str, tmp_path: Path) -> None:
    run = demo_run(sqlite_url)
    target = tmp_path / "demo.png"
    result = timeline(run, "-o", str(target), "--db", sqlite_url)
    assert result.stdout.startswith(f"wrote {target} (PNG, 4 shards, 19 events, 4 refits)")
    assert "run completed at seq 19: demo script finished" in result.stdout
    width, height = png_size(target)
    assert 1000 <= width <= 2000 and 300 <= height <= 1200, (width, height)
    assert 10_000 < target.stat().st_size < 400_000
    assert not (tmp_path / "demo.png.partial").exists()


@needs_matplotlib
def test_png_of_a_long_run_grows_with_its_shards(ledger_url: str, tmp_path: Path) -> None:
    write_story(ledger_url)
    target = tmp_path / "story.png"
    timeline(STORY_RUN, "-o", str(target), "--db", ledger_url)
    by_seq = tmp_path / "story-seq.png"
    timeline(STORY_RUN, "-o", str(by_seq), "--axis", "seq", "--db", ledger_url)
    width, height = png_size(target)
    demo_width, _ = png_size(by_seq)
    assert width == demo_width
    assert 400 <= height <= 1400, height
    assert target.read_bytes() != by_seq.read_bytes()


class _Page(HTMLParser):
    """Collects every tag with its attributes, and the text, of an HTML document."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def with_class(self, tag: str, cls: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and cls in a.get("class", "").split()]


def parse_html(path: Path) -> tuple[str, _Page]:
    document = path.read_text(encoding="utf-8")
    page = _Page()
    page.feed(document)
    page.close()
    return document, page


def assert_offline(document: str, page: _Page) -> None:
    """Nothing that would reach the network: no script or link, no src/href with a scheme."""
    assert not [t for t, _ in page.tags if t in ("script", "link", "iframe", "object", "embed")]
    for tag, attrs in page.tags:
        for name in ("src", "href", "xlink:href", "action", "srcset", "poster", "data"):
            value = attrs.get(name, "").strip().lower()
            assert ":" not in value.split("/")[0], f"<{tag} {name}={value!r}> names a scheme"
    lowered = document.lower()
    assert "url(" not in lowered
    assert "@import" not in lowered
    # The only http text allowed is data: the shards' base URLs, shown as text.
    for line in lowered.splitlines():
        if "http" in line:
            assert "http://gen-" in line or "http://127.0.0.1:" in line, line


def test_html_of_a_long_run_has_a_lane_per_shard_refits_epochs_and_the_end(
    ledger_url: str, tmp_path: Path
) -> None:
    write_story(ledger_url)
    target = tmp_path / "story.html"
    result = timeline(STORY_RUN, "-o", str(target), "--db", ledger_url, "--json")
    assert '"format": "html"' in result.stdout
    document, page = parse_html(target)
    assert_offline(document, page)

    lanes = page.with_class("g", "lane")
    assert [a["data-shard"] for a in lanes] == [str(i) for i in range(STORY_SHARDS)]
    refits = page.with_class("g", "refit-mark")
    outcomes = [a["data-outcome"] for a in refits]
    assert len(outcomes) == 11 and outcomes.count("aborted") == 2
    assert outcomes.count("completed") == 9
    assert len(page.with_class("rect", "aborted")) == 2
    assert [a["data-epoch"] for a in page.with_class("g", "epoch-mark")] == [
        str(e) for e in range(1, 8)
    ]
    states = {a["data-state"] for a in page.with_class("rect", "interval")}
    assert states == {s.value for s in ShardState}
    assert len(page.with_class("path", "condemned")) == 1
    assert len(page.with_class("polygon", "refused")) == 2
    assert len(page.with_class("polygon", "stall")) == 1
    text = " ".join(page.text)
    assert "END · run failed at seq" in text
    assert "aborted with context lost; no rebuild can succeed" in text
    assert "http://gen-4.cluster.local:8000/v1" in text  # a base URL, as text


def test_html_of_a_run_that_never_ended_labels_where_it_stopped(
    sqlite_url: str, tmp_path: Path
) -> None:
    write_story(sqlite_url, end=False)
    target = tmp_path / "stopped.html"
    timeline(STORY_RUN, "-o", str(target), "--db", sqlite_url)
    document, page = parse_html(target)
    assert_offline(document, page)
    text = " ".join(page.text)
    assert "NOT ENDED · no run_ended recorded; last event seq" in text
    assert "shard 5 RETIRED · shards 0–4 STALE" in text
    assert "END ·" not in text
    # The end line is grey (no outcome), whatever colour the stall before it had.
    (end_line,) = page.with_class("line", "end-line")
    assert end_line["stroke"] == NOT_ENDED_COLOUR
    assert {a["fill"] for a in page.with_class("polygon", "stall")} == {"#d63031"}


def test_html_of_the_demo_run_by_seq(sqlite_url: str, tmp_path: Path) -> None:
    run = demo_run(sqlite_url)
    target = tmp_path / "demo.HTML"  # the extension is matched case-insensitively
    timeline(run, "-o", str(target), "--axis", "seq", "--db", sqlite_url)
    document, page = parse_html(target)
    assert_offline(document, page)
    assert len(page.with_class("g", "lane")) == 4
    assert "seq (event number in the run)" in " ".join(page.text)
    assert "run completed at seq 19: demo script finished" in " ".join(page.text)


@pytest.mark.parametrize("name", ["run.jpg", "run.svg", "run"])
def test_an_unknown_extension_is_refused_before_the_ledger_is_opened(
    tmp_path: Path, name: str
) -> None:
    ledger = tmp_path / "never-created.db"
    result = timeline(
        "any-run", "-o", str(tmp_path / name), "--db", f"sqlite:///{ledger}", ok=False
    )
    assert result.exit_code == 2
    assert "cannot tell the picture format" in result.stderr
    assert "FILE.png" in result.stderr and "FILE.html" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not ledger.exists()
    assert not (tmp_path / name).exists()


def test_png_without_matplotlib_names_the_extra_and_writes_nothing(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = demo_run(sqlite_url)
    # A None entry makes `import matplotlib` raise ImportError, as on a bare install.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    target = tmp_path / "run.png"
    result = timeline(run, "-o", str(target), "--db", sqlite_url, ok=False)
    assert result.exit_code == 2
    assert "pip install 'fleetledger[plot]'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not target.exists() and not (tmp_path / "run.png.partial").exists()
    # HTML needs nothing.
    timeline(run, "-o", str(tmp_path / "run.html"), "--db", sqlite_url)


def test_errors_name_the_run_and_the_directory(sqlite_url: str, tmp_path: Path) -> None:
    run = demo_run(sqlite_url)
    missing = timeline("no-such-run", "-o", str(tmp_path / "x.html"), "--db", sqlite_url, ok=False)
    assert missing.exit_code == 2 and "no run 'no-such-run'" in missing.stderr
    assert not (tmp_path / "x.html").exists()
    nowhere = tmp_path / "absent" / "x.html"
    result = timeline(run, "-o", str(nowhere), "--db", sqlite_url, ok=False)
    assert result.exit_code == 2 and f"there is no directory {nowhere.parent}" in result.stderr
    axis = timeline(
        run, "-o", str(tmp_path / "x.html"), "--axis", "wall", "--db", sqlite_url, ok=False
    )
    assert axis.exit_code == 2 and "--axis 'wall'" in axis.stderr


def test_the_committed_example_picture_is_a_small_valid_png() -> None:
    assert DOCS_EXAMPLE.is_file(), f"{DOCS_EXAMPLE} is missing"
    width, height = png_size(DOCS_EXAMPLE)
    assert width >= 1000 and height >= 300
    assert DOCS_EXAMPLE.stat().st_size < 300_000


# ── the scene: one picture, two painters ───────────────────────────────────────


def every_mark_lanes(**config: int) -> Lanes:
    """A short run with one mark of every kind: refits of each outcome, a condemnation, a
    refusal, stalls of both actions, an exhaustion, a refit left open."""
    fleet = Fleet(shard_count=3, **config)
    fleet.refit_started(1)
    fleet.refit_completed(1)
    fleet.probe_failed(2)
    fleet.refit_started(2)
    fleet.refit_aborted(2)
    fleet.condemned(2)
    fleet.probe_failed(0)
    fleet.probe_failed(1)
    fleet.refit_started(3)
    fleet.refit_aborted(3, "gloo: Connection reset by peer")
    fleet.apply(CondemnationRefused(suspected=(0, 1), reason="two suspects"))
    fleet.stall("warn")
    fleet.stall("abort")
    fleet.exhausted()
    fleet.refit_started(4)
    return lanes_of(fleet.records)


def test_the_scene_is_the_same_for_the_same_lanes() -> None:
    first, again = every_mark_lanes(), every_mark_lanes()
    assert first is not again
    for mode in ("time", "seq"):
        assert build_scene(first, mode) == build_scene(again, mode)
        assert hash(build_scene(first, mode)) == hash(build_scene(again, mode))
    assert build_scene(first, "time") != build_scene(first, "seq")


def test_the_scene_marks_only_the_decisions_a_colour_cannot_show() -> None:
    scene = build_scene(every_mark_lanes())
    # The condemnation and the refusal sit on their subjects' lanes; the exhaustion, which
    # belongs to no shard, in the refits row. Partial weights are a colour (STALE): no mark.
    assert [(m.glyph, m.shard) for m in scene.decisions] == [
        ("condemned", 2),
        ("refused", 0),
        ("refused", 1),
        ("exhausted", None),
    ]
    assert [(m.glyph, m.colour, m.shard) for m in scene.stalls] == [
        ("stall", "#e67700", None),
        ("stall", "#d63031", None),
    ]
    assert [(r.outcome, r.label) for r in scene.refits] == [
        ("completed", "v1"),
        ("aborted", "v2 ✕"),
        ("aborted", "v3 ✕"),
        ("open", "v4"),
    ]
    assert scene.refits[-1].x1 == scene.axis.hi  # an open refit runs to the edge
    assert "gloo: Connection reset by peer" in scene.refits[2].tip


def test_too_many_refits_keep_their_bars_and_lose_their_labels() -> None:
    fleet = Fleet(shard_count=2)
    for version in range(1, MAX_LABELLED_REFITS + 2):
        fleet.refit_started(version)
        fleet.refit_completed(version)
    refits = build_scene(lanes_of(fleet.records)).refits
    assert len(refits) == MAX_LABELLED_REFITS + 1
    assert {r.label for r in refits} == {None}


def test_the_legend_explains_every_glyph_the_painters_draw() -> None:
    scene = build_scene(every_mark_lanes())
    assert {item.glyph for item in scene.legend} == set(get_args(Glyph))
    drawn = {m.glyph for m in (*scene.decisions, *scene.stalls)}
    drawn |= {r.glyph for r in scene.refits} | {"band", "epoch", "end"}
    assert drawn == set(get_args(Glyph))
    labels = [item.label for item in scene.legend]
    assert len(labels) == len(set(labels)), labels


def html_legend_text(scene: Scene) -> tuple[list[str], str]:
    """The glyph of every legend entry of the page, and the legend's text as read."""
    document = html_painter.page(scene)
    legend = document.split('<div class="legend">', 1)[1].split("</div>", 1)[0]
    page = _Page()
    page.feed(legend)
    glyphs = [a["data-glyph"] for a in page.with_class("span", "legend-item")]
    return glyphs, "".join(page.text)


def test_the_html_draws_exactly_the_scenes_legend() -> None:
    scene = build_scene(every_mark_lanes())
    glyphs, text = html_legend_text(scene)
    assert glyphs == [item.glyph for item in scene.legend]
    assert text == "".join(item.text for item in scene.legend)
    for item in scene.legend:
        assert item.label in text


@needs_matplotlib
def test_the_png_draws_exactly_the_scenes_legend_the_html_does() -> None:
    from matplotlib.colors import to_hex
    from matplotlib.lines import Line2D

    from fleetledger.timeline import png

    def colour_of(handle: object) -> str:
        if isinstance(handle, Line2D):
            marked = handle.get_marker() not in (None, "None", "")
            return to_hex(handle.get_markerfacecolor() if marked else handle.get_color())
        return to_hex(handle.get_facecolor())  # type: ignore[attr-defined]

    scene = build_scene(every_mark_lanes())
    (legend,) = png.figure(scene).legends
    drawn = [t.get_text() for t in legend.get_texts()]
    assert drawn == [item.text for item in scene.legend]
    handles = png.legend_handles(scene)
    assert [colour_of(h) for h in handles] == [item.colour for item in scene.legend]
    # The same list as the HTML's, item for item.
    glyphs, text = html_legend_text(scene)
    assert "".join(drawn) == text and len(glyphs) == len(drawn)


def test_the_end_colour_in_the_legend_is_the_end_line_colour() -> None:
    stopped = build_scene(every_mark_lanes())
    assert stopped.end_colour == NOT_ENDED_COLOUR
    assert stopped.end_text.startswith("NOT ENDED · ")
    fleet = Fleet(shard_count=2)
    fleet.run_ended("completed", "max steps")
    ended = build_scene(lanes_of(fleet.records))
    assert ended.end_text == "END · run completed at seq 2: max steps"
    for scene in (stopped, ended):
        (end,) = [item for item in scene.legend if item.glyph == "end"]
        assert end.colour == scene.end_colour


def test_the_html_escapes_data_it_is_handed() -> None:
    fleet = Fleet(shard_count=2)
    fleet.refit_started(1)
    fleet.refit_aborted(1, '<script>alert("x")</script> & [rank0]')
    document = html_painter.page(build_scene(lanes_of(fleet.records)))
    assert "<script>" not in document
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; [rank0]" in document


def test_the_scene_and_the_html_painter_import_no_matplotlib() -> None:
    """The scene is pure and HTML needs nothing: neither may pull matplotlib in."""
    code = (
        "import sys\n"
        "import fleetledger.timeline.scene, fleetledger.timeline.html\n"
        "import fleetledger.cli.timeline_commands\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert found.strip() == "[]"
