"""Hostile strings in the log, through every command that prints them.

A run's texts come from outside: error messages of engines, reasons of adapters, base
URLs, the cause of the end. Here they hold rich markup (``[/x]`` used to crash
``import`` after it committed, then every command on the ledger), terminal control
sequences (clear screen, an OSC 52 clipboard write, a C1 CSI), quotes, backslashes,
emoji, right-to-left text, combining characters, bidi overrides and newlines. The
run is exported and imported under a run id that holds markup, quotes, a backslash
and unicode (a run id is printable by the log's rule), then every printing command
is run on it. Each exits 0, shows the text with every control as a visible escape and
nothing else changed, writes no control character to stdout or stderr, and ``--json``
gives back the exact strings.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from fleetledger.cli.output import terminal_safe
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.models import FailureCount, FleetConfig, ShardOutcomes
from fleetledger.store.log import EventLog
from tests.cli_support import invoke, run_cli, run_with_a_terminal
from tests.test_bad_input import assert_cli_error

pytestmark = pytest.mark.usefixtures("cli_sandbox")

CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"

FAMILY = "\U0001f469\u200d\U0001f469\u200d\U0001f467"  # joined by ZWJ: shown as it is
MARKUP = "[/x] [bold red]loud[/bold red] [link=https://evil.example]click[/link] [/] :warning:"
CONTROLS = "\x1b[2J\x1b[H \x1b]52;c;ZXZpbA==\x07 \x1b]0;title\x1b\\ \x9b31m \x08\x7f"
QUOTES = 'it\'s "quoted" C:\\models\\v1 and a literal \\x1b'
UNICODE = f"🚀 {FAMILY} שלום مرحبا e\u0301 \u202egpj.exe \u2066iso\u2069"
NEWLINES = "first line\nsecond line\r\nthird"
TEXT = " ".join((MARKUP, CONTROLS, QUOTES, UNICODE, NEWLINES))

# How TEXT is shown in text output: written out here, not computed by the code under test.
SHOWN_CONTROLS = r"\x1b[2J\x1b[H \x1b]52;c;ZXZpbA==\x07 \x1b]0;title\x1b\ \x9b31m \x08\x7f"
SHOWN_UNICODE = f"🚀 {FAMILY} שלום مرحبا e\u0301 " + r"\u202egpj.exe \u2066iso\u2069"
SHOWN = " ".join(
    (MARKUP, SHOWN_CONTROLS, QUOTES, SHOWN_UNICODE, r"first line\nsecond line\r\nthird")
)
# ``explain`` keeps the line breaks its lines are joined with; a newline in a text is one.
SHOWN_LINES = SHOWN.replace(
    r"first line\nsecond line\r\nthird", "first line\nsecond line\\r\nthird"
)

# A run id is 1..128 printable characters: markup, quotes, a backslash and unicode, yes.
RUN = "run[/x] [bold red]'\"\\ 🚀 שלום e\u0301"

# What must never reach a terminal raw (C0 but the newline, DEL, C1, bidi controls).
RAW_CONTROL = re.compile(
    r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
)

LABELS = ("probe", "death", "restart", "window", "abort", "refusal", "cause")
# Death and failure causes are read into facts (events/causes.py) and printed as one line:
# the first, its terminal sequences (CSI, OSC) dropped, runs of blanks one; the raw text
# is kept whole in the event's cause and given back by --json and export.
CAUSE_LABELS = ("probe", "death", "restart")


def cause_line(label: str) -> str:
    return f"{label}: {MARKUP} \x08\x7f {QUOTES} {UNICODE} first line"


def shown_cause(label: str) -> str:
    return f"{label}: {MARKUP} " + r"\x08\x7f" + f" {QUOTES} {SHOWN_UNICODE} first line"


def shown_as(label: str) -> str:
    """How ``label``'s text is shown in text output."""
    return shown_cause(label) if label in CAUSE_LABELS else shown(label)


def labelled(label: str) -> str:
    return f"{label}: {TEXT}"


def shown(label: str) -> str:
    return f"{label}: {SHOWN}"


# ── the hostile run ───────────────────────────────────────────────────────────


def _record_story(url: str, run: str) -> int:
    """A run whose every free text is hostile: failed probes condemn shard 0, shard 1
    dies and fails its restart, shard 0 comes back at a hostile URL, an adapter reports
    a failure of shard 2, a refit aborts, the condemnation is refused, the run fails."""
    config = FleetConfig(
        shard_count=3,
        train_world_size=2,
        base_urls=tuple(f"http://gen-{i}.test/{TEXT}" for i in range(3)),
        settings={"note": TEXT},
    )
    ok = ProbeResult.ok()
    with EventLog.open(url) as log:
        ledger = Ledger.start(log, run, config)
        for _ in range(2):
            ledger.record_probes({0: ok, 1: ok, 2: ok})
        for _ in range(3):
            ledger.record_probes({0: ProbeResult("error", labelled("probe")), 1: ok, 2: ok})
        ledger.actor_died(1, labelled("death"))
        ledger.restart_requested(1)
        ledger.restart_failed(1, labelled("restart"))
        ledger.restart_requested(0)
        ledger.replacement_loaded(0, base_url=f"http://replacement.test/{TEXT}")
        ledger.report_outcomes(
            f"adapter {TEXT}",
            [
                ShardOutcomes(
                    shard=2,
                    failures=(FailureCount(category="infra", reason=labelled("window")),),
                )
            ],
        )
        ledger.refit_started(1)
        ledger.refit_aborted(1, labelled("abort"))
        ledger.refuse_condemnation([], labelled("refusal"))
        ledger.end_run("failed", labelled("cause"))
        return log.head(run)


@dataclass(frozen=True)
class Hostile:
    url: str
    events: int
    imported: Result  # what `import` printed


@pytest.fixture
def hostile(sqlite_url: str, tmp_path: Path) -> Hostile:
    """The story recorded as run 'source', exported, and imported under ``RUN``."""
    events = _record_story(sqlite_url, "source")
    exported = invoke("export", "source", "--db", sqlite_url)
    assert_no_raw_control(exported, allow_bidi_and_c1=True)
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(exported.stdout_bytes)
    imported = invoke("import", str(path), "--run", RUN, "--db", sqlite_url)
    return Hostile(sqlite_url, events, imported)


def assert_no_raw_control(result: Result, *, allow_bidi_and_c1: bool = False) -> str:
    """Exit 0, no traceback, no control character on stdout or stderr; returns stdout.

    The bytes are read, not ``result.stdout`` (which turns ``\\r\\n`` into ``\\n``).
    """
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    for name, raw in (("stdout", result.stdout_bytes), ("stderr", result.stderr_bytes)):
        text = raw.decode("utf-8")
        assert "Traceback" not in text, text
        if allow_bidi_and_c1:  # the export file format: JSON escapes C0, ESC included
            assert "\x1b" not in text and "\r" not in text, f"a raw control on {name}"
            continue
        found = RAW_CONTROL.search(text)
        assert found is None, (
            f"raw {found.group()!r} on {name}: {text[max(0, found.start() - 40) :]!r}"
        )
    return result.stdout_bytes.decode("utf-8")


def json_out(*args: str) -> Any:
    result = invoke(*args)
    assert_no_raw_control(result)
    return json.loads(result.stdout)


def json_lines_out(*args: str) -> list[Any]:
    result = invoke(*args)
    assert_no_raw_control(result)
    return [json.loads(line) for line in result.stdout.splitlines()]


def strings(doc: Any) -> Iterator[str]:
    """Every string in a JSON document (keys and values)."""
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for key, value in doc.items():
            yield key
            yield from strings(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from strings(item)


def holds(doc: Any, text: str) -> bool:
    return any(text in s for s in strings(doc))


# ── the commands ──────────────────────────────────────────────────────────────


def test_import_prints_the_hostile_run_id_and_commits_once(hostile: Hostile) -> None:
    out = assert_no_raw_control(hostile.imported)
    assert out == f"imported {hostile.events} events as run {RUN}\n"
    with EventLog.open(hostile.url) as log:
        assert sorted(s.run_id for s in log.runs()) == sorted(["source", RUN])
        assert log.head(RUN) == hostile.events


def test_import_json_round_trips_the_run_id(hostile: Hostile, tmp_path: Path) -> None:
    path = tmp_path / "again.jsonl"
    path.write_bytes(invoke("export", RUN, "--db", hostile.url).stdout_bytes)
    other = RUN + " again"
    doc = json_out("import", str(path), "--run", other, "--json", "--db", hostile.url)
    assert doc["run"] == other and doc["events"] == hostile.events


def test_runs_shows_the_whole_run_id(hostile: Hostile) -> None:
    out = assert_no_raw_control(invoke("runs", "--db", hostile.url))
    assert RUN in out
    listed = json_out("runs", "--json", "--db", hostile.url)
    assert sorted(r["run"] for r in listed) == sorted(["source", RUN])


def test_membership_shows_the_cause_as_written_and_json_round_trips(hostile: Hostile) -> None:
    out = assert_no_raw_control(invoke("membership", RUN, "--db", hostile.url))
    assert out.startswith(f"run {RUN} at seq {hostile.events} (")
    assert f"ended: failed at seq {hostile.events}: {shown('cause')}\n" in out
    doc = json_out("membership", RUN, "--json", "--db", hostile.url)
    assert doc["run"] == RUN
    assert doc["ended"]["cause"] == labelled("cause")
    assert doc["shards"]["1"]["since_rule"] == f"restart failed: {cause_line('restart')}"


def test_replay_shows_every_text_escaped_one_entry_per_line(hostile: Hostile) -> None:
    out = assert_no_raw_control(invoke("replay", RUN, "--db", hostile.url))
    assert out.startswith(f"run {RUN}: seqs 1..{hostile.events}, ")
    for label in LABELS:
        assert shown_as(label) in out, label
    assert f"http://replacement.test/{SHOWN}" in out
    # A newline inside a text never starts a line of its own (no forged rows): the title,
    # the header (no rule off a terminal), then one line per entry.
    assert "\nsecond line" not in out and "\nthird" not in out
    entries = json_lines_out("replay", RUN, "--json", "--db", hostile.url)
    assert len(out.splitlines()) == 2 + len(entries)


def test_replay_json_round_trips_every_text(hostile: Hostile) -> None:
    entries = json_lines_out("replay", RUN, "--json", "--db", hostile.url)
    for label in LABELS:
        said = cause_line(label) if label in CAUSE_LABELS else labelled(label)
        assert holds(entries, said), label
    assert entries[-1]["kind"] == "end" and entries[-1]["cause"] == labelled("cause")


def test_explain_run_and_shards_show_the_texts_and_json_round_trips(hostile: Hostile) -> None:
    run_text = assert_no_raw_control(invoke("explain", RUN, "--db", hostile.url))
    assert run_text.startswith(f"run {RUN} ended failed at seq {hostile.events} (")
    assert f"cause: {SHOWN_LINES}" in run_text
    assert f"refusal: {SHOWN_LINES}" in run_text
    for shard, label in ((0, "probe"), (1, "restart"), (2, "window")):
        text = assert_no_raw_control(invoke("explain", RUN, str(shard), "--db", hostile.url))
        shown_here = shown_cause(label) if label in CAUSE_LABELS else f"{label}: {SHOWN_LINES}"
        assert shown_here in text, shard
        doc = json_out("explain", RUN, str(shard), "--json", "--db", hostile.url)
        assert holds(doc, labelled(label)), shard  # the raw text, whole
    shard0 = assert_no_raw_control(invoke("explain", RUN, "0", "--db", hostile.url))
    assert f"http://replacement.test/{SHOWN_LINES}" in shard0
    doc = json_out("explain", RUN, "--json", "--db", hostile.url)
    assert doc["run"] == RUN and doc["ended"]["cause"] == labelled("cause")


def test_watch_of_the_ended_run_prints_its_end(hostile: Hostile) -> None:
    result = invoke("watch", RUN, "--db", hostile.url)
    out = assert_no_raw_control(result)
    assert re.search(rf"run ended \(failed\)\s+{re.escape(shown('cause'))}", out)
    assert result.stderr.startswith(f"watching run {RUN} from seq {hostile.events} ")
    (end,) = json_lines_out("watch", RUN, "--json", "--db", hostile.url)
    assert end["kind"] == "end" and end["cause"] == labelled("cause")


def test_export_is_exact_json_with_no_raw_escape(hostile: Hostile) -> None:
    result = invoke("export", RUN, "--db", hostile.url)
    # Not even C1 or bidi controls: they are written as JSON's \uXXXX, the same JSON.
    assert_no_raw_control(result)
    lines = [json.loads(line) for line in result.stdout_bytes.decode().splitlines()]
    assert len(lines) == hostile.events
    assert {line["run"] for line in lines} == {RUN}
    for label in LABELS:
        assert holds(lines, labelled(label)), label
    assert lines[0]["data"]["config"]["settings"] == {"note": TEXT}


def test_timeline_summary_line_shows_the_end_escaped(hostile: Hostile, tmp_path: Path) -> None:
    target = tmp_path / "hostile.html"
    out = assert_no_raw_control(invoke("timeline", RUN, "-o", str(target), "--db", hostile.url))
    assert out == (
        f"wrote {target} (HTML, 3 shards, {hostile.events} events, 1 refit): "
        f"run failed at seq {hostile.events}: {shown('cause')}\n"
    )
    doc = json_out("timeline", RUN, "-o", str(target), "--json", "--db", hostile.url)
    assert doc["run"] == RUN
    assert doc["end"] == f"run failed at seq {hostile.events}: {labelled('cause')}"


def test_replay_on_a_terminal_sends_no_hostile_sequence(hostile: Hostile) -> None:
    """On a terminal rich adds its colours; the log's own sequences arrive escaped."""
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "2000", "FLEETLEDGER_DB": hostile.url}
    env.pop("NO_COLOR", None)
    status, stderr, received = run_with_a_terminal(
        [str(CONSOLE_SCRIPT), "replay", RUN], terminal="stdout", env=env
    )
    assert status == 0, stderr
    terminal = received.decode()
    for sequence in ("\x1b[2J", "\x1b[H", "\x1b]", "\x9b", "\u202e", "\u2066", "\x07", "\x08"):
        assert sequence not in terminal, repr(sequence)
    styled = re.sub(r"\x1b\[[0-9;]*m", "", terminal)  # rich's own colours (SGR) only
    assert "\x1b" not in styled
    assert shown("cause") in styled


# ── refused input says what it refused, escaped ───────────────────────────────


def test_a_run_id_with_a_control_is_refused_in_one_escaped_line(
    hostile: Hostile, tmp_path: Path
) -> None:
    path = tmp_path / "again.jsonl"
    path.write_bytes(invoke("export", RUN, "--db", hostile.url).stdout_bytes)
    result = run_cli("import", str(path), "--run", "evil\x1b[2J\u202eid", "--db", hostile.url)
    line = assert_cli_error(result, ["run id"])
    assert RAW_CONTROL.search(result.stderr_bytes.decode()) is None
    assert "\\x1b[2J" in line


def test_an_unknown_run_named_with_controls_is_one_escaped_line(hostile: Hostile) -> None:
    result = run_cli("membership", "ghost\x1b]52;c;eA==\x07\nline", "--db", hostile.url)
    assert_cli_error(result, ["no run 'ghost"])
    assert RAW_CONTROL.search(result.stderr_bytes.decode()) is None


# ── the escaping itself ───────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("\x1b[2J", r"\x1b[2J"),
        ("\x1b]52;c;ZQ==\x07", r"\x1b]52;c;ZQ==\x07"),
        ("a\nb\rc\td", r"a\nb\rc\td"),
        ("\x00\x7f\x85\x9b", r"\x00\x7f\x85\x9b"),
        (
            "\u202egpj.exe\u202c \u2066x\u2069 \u200e\u200f\u061c",
            r"\u202egpj.exe\u202c \u2066x\u2069 \u200e\u200f\u061c",
        ),
        ("\u2028\u2029", r"\u2028\u2029"),
        ("\ud800", r"\ud800"),
        (MARKUP, MARKUP),
        (QUOTES, QUOTES),
        (f"🚀 {FAMILY} שלום مرحبا e\u0301 \u00a0", f"🚀 {FAMILY} שלום مرحبا e\u0301 \u00a0"),
    ],
    ids=[
        "csi",
        "osc52",
        "c0-named",
        "c0-del-c1",
        "bidi",
        "separators",
        "surrogate",
        "markup",
        "quotes",
        "unicode",
    ],
)
def test_terminal_safe_escapes_controls_and_nothing_else(raw: str, escaped: str) -> None:
    assert terminal_safe(raw) == escaped


def test_terminal_safe_can_keep_the_line_breaks_of_a_text() -> None:
    assert terminal_safe("a\x1b\nb\r\n", keep_newlines=True) == "a\\x1b\nb\\r\n"
