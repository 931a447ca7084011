"""Bad output targets, through the CLI: one error line naming the file, nothing lost or left.

Every command that writes a file — ``export RUN -o FILE``, ``export RUN --bundle FILE``,
``timeline RUN -o FILE`` — writes it through :func:`fleetledger.cli.output.whole_file`.
Each refusal here checks, as ``tests/test_bad_input.py`` does for bad input: exit 2,
exactly one ``fleetledger: error:`` line on stderr naming what and where, nothing on
stdout, no traceback; the stored ledger unchanged (every row, and the bytes of every
file in its directory); and no file left behind in the output's directory (no temporary
file, no ``.partial``).

Real mechanisms only: the ledger's real ``-wal``/``-shm`` names, real symlinks, a real
tmpfs mounted full (``mount -t tmpfs``, as root; skipped with the reason otherwise), a
read-only tmpfs, ``/dev/full`` for stdout, and a real pipe closed by ``head``.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import secrets
import stat
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetledger.cli.output import OutputFileError, whole_file
from fleetledger.events.models import FleetConfig, RunStarted
from fleetledger.store.errors import UnknownRun
from fleetledger.store.log import EventLog
from tests.builders import probe_failed
from tests.cli_support import invoke, run_cli
from tests.test_bad_input import R1_HEAD, _build, assert_cli_error, dump, raw_sql

pytestmark = pytest.mark.usefixtures("cli_sandbox")  # cwd is tmp_path: relative paths work

CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"
RUN = "r1"  # built by tests.test_bad_input._build, with r2 beside it


# ── the commands that write files ─────────────────────────────────────────────


@dataclass(frozen=True)
class Writer:
    """A file-writing command: its usual output name, and its command line."""

    name: str
    output: str  # a file name the command accepts
    ledger: str  # a ledger file name the command could be pointed at (timeline: a picture)
    option: tuple[str, ...]

    def args(self, run: str, target: str | Path, url: str) -> list[str]:
        return [*self.option[:1], run, *self.option[1:], str(target), "--db", url]

    def check_written(self, target: Path) -> None:
        """The file is what the command writes: complete, and a file of its own."""
        assert target.is_file() and not target.is_symlink()
        data = target.read_bytes()
        if self.name == "export":
            assert data.decode().splitlines()[0].startswith('{"run":"r1","seq":1,')
            assert len(data.decode().splitlines()) == R1_HEAD
        elif self.name == "bundle":
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                assert archive.testzip() is None
        else:
            assert data.startswith(b"<!DOCTYPE html>") and data.rstrip().endswith(b"</html>")


EXPORT = Writer("export", "e.jsonl", "ledger.db", ("export", "-o"))
BUNDLE = Writer("bundle", "b.zip", "ledger.db", ("export", "--bundle"))
# The picture format comes from the name: a ledger it could overwrite is named like one.
TIMELINE = Writer("timeline", "t.html", "ledger.html", ("timeline", "-o"))
WRITERS = [pytest.param(w, id=w.name) for w in (EXPORT, BUNDLE, TIMELINE)]


# ── what must not change ──────────────────────────────────────────────────────


def entries(directory: Path) -> dict[str, str]:
    """Every entry of ``directory`` (not followed): a file's sha256, a link's target."""
    found = {}
    for p in sorted(directory.iterdir()):
        if p.is_symlink():
            found[p.name] = f"-> {os.readlink(p)}"
        elif p.is_dir():
            found[p.name] = "directory"
        else:
            found[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return found


@dataclass
class Kept:
    """The ledger's rows and the entries of the directories that must not change."""

    url: str
    directories: tuple[Path, ...]

    def __post_init__(self) -> None:
        self.before = self._now()

    def _now(self) -> tuple[object, ...]:
        return (dump(self.url), *(entries(d) for d in self.directories))

    def assert_unchanged(self) -> None:
        rows, *listings = self._now()
        assert rows == self.before[0], "the stored log changed"
        for directory, before, after in zip(
            self.directories, self.before[1:], listings, strict=True
        ):
            assert after == before, f"{directory} changed (a file was written or left)"


def ledger_at(path: Path) -> str:
    url = f"sqlite:///{path}"
    _build(url)
    return url


def refused(args: list[str], fragments: list[str]) -> str:
    line = assert_cli_error(run_cli(*args), fragments)
    assert ".partial" not in line, line  # the error names the file asked for, not a temp
    return line


# ── the ledger itself ─────────────────────────────────────────────────────────


def _ledger(ledger: Path) -> str:
    return str(ledger)


def _wal(ledger: Path) -> str:
    return f"{ledger}-wal"


def _shm(ledger: Path) -> str:
    return f"{ledger}-shm"


def _symlink(ledger: Path) -> str:
    link = ledger.with_name("link" + ledger.suffix)
    link.symlink_to(ledger.name)
    return str(link)


def _relative(ledger: Path) -> str:
    (ledger.parent / "sub").mkdir()
    return f"sub/../{ledger.name}"  # relative to the working directory, tmp_path


LEDGER_TARGETS: list[tuple[str, Callable[[Path], str], tuple[Writer, ...]]] = [
    ("the_ledger", _ledger, (EXPORT, BUNDLE, TIMELINE)),
    # A timeline cannot be named FILE-wal: its format check refuses that name first.
    ("its_wal", _wal, (EXPORT, BUNDLE)),
    ("its_shm", _shm, (EXPORT, BUNDLE)),
    ("a_symlink_to_it", _symlink, (EXPORT, BUNDLE, TIMELINE)),
    ("a_relative_path_to_it", _relative, (EXPORT, BUNDLE, TIMELINE)),
]


@pytest.mark.parametrize(
    ("writer", "make_target"),
    [
        pytest.param(w, make, id=f"{w.name}-{name}")
        for name, make, writers in LEDGER_TARGETS
        for w in writers
    ],
)
def test_an_output_that_is_the_ledger_is_refused_and_the_ledger_kept(
    writer: Writer, make_target: Callable[[Path], str], tmp_path: Path
) -> None:
    ledger = tmp_path / writer.ledger
    url = ledger_at(ledger)
    target = make_target(ledger)
    kept = Kept(url, (tmp_path,))
    # Which file, and which ledger: the one --db named.
    refused(writer.args(RUN, target, url), [f"cannot write {target}", f"the ledger {url}"])
    kept.assert_unchanged()


def test_an_output_that_is_the_ledger_reached_through_a_symlinked_db_is_refused(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger.db"
    ledger_at(ledger)
    link = tmp_path / "alias.db"
    link.symlink_to(ledger)
    url = f"sqlite:///{link}"
    kept = Kept(url, (tmp_path,))
    refused(EXPORT.args(RUN, ledger, url), [f"cannot write {ledger}", "the ledger"])
    refused(EXPORT.args(RUN, f"{ledger}-wal", url), [f"cannot write {ledger}-wal", "-wal"])
    kept.assert_unchanged()


# ── files planted next to the output ──────────────────────────────────────────


@pytest.mark.parametrize("writer", WRITERS)
def test_a_planted_partial_symlink_is_not_followed(writer: Writer, tmp_path: Path) -> None:
    """The old sibling ``FILE.partial`` was opened by name: a symlink there was written through."""
    url = ledger_at(tmp_path / "ledger.db")
    out = tmp_path / "out"
    out.mkdir()
    victim = out / "victim.txt"
    victim.write_text("do not touch\n")
    target = out / writer.output
    planted = out / f"{writer.output}.partial"
    planted.symlink_to(victim)
    kept = Kept(url, (tmp_path,))

    invoke(*writer.args(RUN, target, url))

    kept.assert_unchanged()
    assert victim.read_text() == "do not touch\n"
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    writer.check_written(target)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [victim.name, planted.name, target.name]
    ), "a temporary file was left behind"


@pytest.mark.parametrize("writer", WRITERS)
def test_output_files_are_0600_when_new_and_when_replacing_a_0644_file(
    writer: Writer, tmp_path: Path
) -> None:
    url = ledger_at(tmp_path / "ledger.db")
    fresh, replaced = tmp_path / f"new-{writer.output}", tmp_path / f"old-{writer.output}"
    replaced.write_text("an older file\n")
    replaced.chmod(0o644)
    previous = os.umask(0o022)  # the usual umask, whatever the test runner's is
    try:
        invoke(*writer.args(RUN, fresh, url))
        invoke(*writer.args(RUN, replaced, url))
    finally:
        os.umask(previous)
    for path in (fresh, replaced):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, (path, oct(path.stat().st_mode))
        writer.check_written(path)


def test_a_png_timeline_is_0600_and_written_whole(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="PNG output needs the 'plot' extra")
    url = ledger_at(tmp_path / "ledger.db")
    target = tmp_path / "t.png"
    target.write_bytes(b"old")
    target.chmod(0o644)
    invoke("timeline", RUN, "-o", str(target), "--db", url)
    assert target.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("ledger.db")) == [
        "t.png"
    ]


# ── targets that cannot be written ────────────────────────────────────────────


@pytest.mark.parametrize("writer", WRITERS)
def test_a_directory_as_output_is_refused_naming_it(writer: Writer, tmp_path: Path) -> None:
    url = ledger_at(tmp_path / "ledger.db")
    target = tmp_path / writer.output
    target.mkdir()
    (target / "inside.txt").write_text("kept\n")
    kept = Kept(url, (tmp_path, target))
    refused(writer.args(RUN, target, url), [f"cannot write {target}", "it is a directory"])
    kept.assert_unchanged()


def test_a_missing_output_directory_is_named(tmp_path: Path) -> None:
    """(``--bundle`` and ``timeline`` already said this; ``export -o`` named a temp file.)"""
    url = ledger_at(tmp_path / "ledger.db")
    target = tmp_path / "absent" / EXPORT.output
    kept = Kept(url, (tmp_path,))
    refused(
        EXPORT.args(RUN, target, url),
        [f"cannot write {target}", f"there is no directory {target.parent}"],
    )
    kept.assert_unchanged()
    assert not target.parent.exists()


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[[Path, str], None]]:
    """Mount a real tmpfs on a directory (root only); unmounted after the test."""
    mounted: list[Path] = []

    def mount(directory: Path, options: str) -> None:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root; this test runs as a normal user")
        directory.mkdir(exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"mount -t tmpfs -o {options} was refused: {done.stderr.strip()}")
        mounted.append(directory)

    yield mount
    for directory in reversed(mounted):
        subprocess.run(["umount", str(directory)], check=True)


@pytest.mark.parametrize("writer", WRITERS)
def test_an_unwritable_directory_is_refused_naming_it(
    writer: Writer, tmp_path: Path, mount_tmpfs: Callable[[Path, str], None]
) -> None:
    url = ledger_at(tmp_path / "ledger.db")
    locked = tmp_path / "locked"
    if os.geteuid() == 0:  # root writes through mode bits: a read-only filesystem it is
        mount_tmpfs(locked, "ro,size=64k")
    else:
        locked.mkdir()
        locked.chmod(0o500)
    target = locked / writer.output
    kept = Kept(url, (tmp_path, locked))
    refused(writer.args(RUN, target, url), [f"cannot write {target}", f"{locked} is not writable"])
    kept.assert_unchanged()


def _fill(directory: Path) -> None:
    """Write a filler file until the filesystem says it is full."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


@pytest.mark.parametrize("writer", WRITERS)
def test_a_full_disk_names_the_file_and_leaves_nothing(
    writer: Writer, tmp_path: Path, mount_tmpfs: Callable[[Path, str], None]
) -> None:
    """A real full filesystem: a 64 KiB tmpfs, filled up before the command runs."""
    url = ledger_at(tmp_path / "ledger.db")
    full = tmp_path / "full"
    mount_tmpfs(full, "size=64k")
    _fill(full)
    target = full / writer.output
    kept = Kept(url, (tmp_path, full))
    refused(writer.args(RUN, target, url), [f"fleetledger: error: {target}: No space left"])
    kept.assert_unchanged()


def test_stdout_on_a_full_device_names_stdout(tmp_path: Path) -> None:
    """``export RUN > /dev/full``: every write fails with ENOSPC, as on a full disk."""
    if not os.path.exists("/dev/full"):
        pytest.skip("this system has no /dev/full")
    url = ledger_at(tmp_path / "ledger.db")
    kept = Kept(url, (tmp_path,))
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [str(CONSOLE_SCRIPT), "export", RUN, "--db", url],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["fleetledger: error: stdout: No space left on device"]
    kept.assert_unchanged()


# ── stdout closed early ───────────────────────────────────────────────────────


def test_export_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    """``export RUN | head -1``: the reader goes away; no message, no traceback."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = FleetConfig(shard_count=1, train_world_size=1, base_urls=("http://gen-0.test/v1",))
    with EventLog.open(url) as log:
        log.append("big", [RunStarted(config=config)])
        # Far more than a pipe and stdout's buffer hold (~250 bytes a line, 3000 lines).
        log.append(
            "big",
            [probe_failed(0, "error", secrets.token_hex(64)) for _ in range(3000)],
        )
    exporter = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "export", "big", "--db", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert exporter.stdout is not None and exporter.stderr is not None
    head = subprocess.run(
        ["head", "-1"], stdin=exporter.stdout, capture_output=True, timeout=120, check=True
    )
    exporter.stdout.close()  # only head holds the pipe's read end: it has exited
    stderr = exporter.stderr.read().decode()
    exporter.stderr.close()
    status = exporter.wait(timeout=120)
    assert head.stdout.decode().startswith('{"run":"big","seq":1,')
    assert stderr == ""
    assert status in (0, 1), status  # 1: stdout_may_close's quiet stop, as for replay


# ── the run, checked before the target is touched ─────────────────────────────


def test_an_unknown_run_exports_nothing_and_leaves_no_file(tmp_path: Path) -> None:
    """(The old ``export -o`` left ``FILE.partial``; bundle and timeline are pinned elsewhere.)"""
    url = ledger_at(tmp_path / "ledger.db")
    out = tmp_path / "out"
    out.mkdir()
    kept = Kept(url, (tmp_path, out))
    refused(EXPORT.args("ghost", out / EXPORT.output, url), ["no run 'ghost' in", "r1, r2"])
    kept.assert_unchanged()


def test_a_read_that_fails_mid_way_leaves_no_file(tmp_path: Path) -> None:
    """A hole in the stored seqs is found while the file is being written: nothing stays."""
    url = ledger_at(tmp_path / "ledger.db")
    raw_sql(url, "DELETE FROM fleetledger_events WHERE run_id = 'r1' AND seq = 3")
    out = tmp_path / "out"
    out.mkdir()
    kept = Kept(url, (tmp_path, out))
    refused(EXPORT.args(RUN, out / EXPORT.output, url), ["run 'r1'", "the ledger is damaged"])
    kept.assert_unchanged()


# ── the writer itself ─────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(lambda: ValueError("a bug in the writer"), id="exception"),
        pytest.param(lambda: UnknownRun("r9", "no run 'r9' here"), id="unknown-run-mid-way"),
        pytest.param(KeyboardInterrupt, id="ctrl-c"),
    ],
)
def test_whole_file_removes_its_temporary_file_on_any_failure(
    failure: Callable[[], BaseException], tmp_path: Path
) -> None:
    target = tmp_path / "e.jsonl"
    target.write_bytes(b"the previous export\n")
    raised = failure()
    with pytest.raises(type(raised)):
        with whole_file(target) as stream:
            stream.write(b"half of a new export" * 1000)
            raise raised
    assert target.read_bytes() == b"the previous export\n"
    assert [p.name for p in tmp_path.iterdir()] == ["e.jsonl"]


def test_whole_file_refuses_a_protected_path_before_creating_anything(tmp_path: Path) -> None:
    target = tmp_path / "ledger.db"
    with pytest.raises(OutputFileError, match=r"it is the ledger X itself"):
        with whole_file(target, {target.resolve(): "the ledger X itself"}):
            raise AssertionError("never reached")
    assert list(tmp_path.iterdir()) == []
