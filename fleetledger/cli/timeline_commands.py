"""Commands: timeline (forensics) — a picture of a run, for the morning after.

``fleetledger timeline RUN -o FILE.png|FILE.html`` draws one lane per shard coloured by
state over time, the refits (aborted ones marked), the epoch changes, the decisions a
colour cannot show, and how the run ended. The data is the run's history, as
``replay`` prints it (:mod:`fleetledger.projections.lanes`); what is drawn is one scene
and the files are its painters (:mod:`fleetledger.timeline`).

The format comes from the file name, and is checked before the ledger is opened: a
typo in ``-o`` should not cost a fold of a million events first; so is the directory,
and once the ledger is open, that ``-o`` is not the ledger itself. The file is written
whole (mode 0600) or not at all, by :func:`fleetledger.cli.output.whole_file`.
"""

# No `from __future__ import annotations` in a command module: typer reads every
# command's annotations at start-up, and a string annotation costs it a compile (cli.app).

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from fleetledger.cli.app import DbOption, JsonOption, _fail, app, cli_errors, open_log
from fleetledger.cli.output import check_output, ledger_files, print_json, say, whole_file
from fleetledger.cli.paused_gc import paused_gc

if TYPE_CHECKING:
    from fleetledger.timeline import AxisMode

PictureFormat = Literal["png", "html"]
FORMATS: dict[str, PictureFormat] = {".png": "png", ".html": "html", ".htm": "html"}
AXIS_MODES: "dict[str, AxisMode]" = {"time": "time", "seq": "seq"}  # type: ignore[valid-type]


def picture_format(output: Path) -> PictureFormat:
    """The format a file name asks for; an unknown extension is refused with the choices."""
    found = FORMATS.get(output.suffix.lower())
    if found is None:
        given = f"'{output.suffix}'" if output.suffix else "no extension"
        raise _fail(
            f"{output}: cannot tell the picture format from {given}; name the file "
            "FILE.png (matplotlib) or FILE.html (self-contained, opens offline)"
        )
    return found


@app.command()
@cli_errors
def timeline(
    run: Annotated[str, typer.Argument(help="Run id (see `fleetledger runs`).")],
    output: Annotated[
        Path,
        typer.Option(
            "-o",
            "--output",
            help="Picture to write: FILE.png (needs the 'plot' extra) or FILE.html.",
        ),
    ],
    axis: Annotated[
        str,
        typer.Option(
            "--axis",
            help="x axis: 'time' since the run started, or 'seq' (every event one step: "
            "for scripted runs whose events are milliseconds apart).",
        ),
    ] = "time",
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Draw a run: one lane per shard coloured by state, refits, epochs and the end."""
    # Imported when the command runs (cli.app): the painters are no other command's.
    from fleetledger.projections.lanes import lanes_of
    from fleetledger.timeline import PAINTERS, PlotUnavailable, build_scene, plural

    kind = picture_format(output)
    mode = AXIS_MODES.get(axis)
    if mode is None:
        raise _fail(f"--axis {axis!r}: choose 'time' or 'seq'")
    check_output(output)
    painter = PAINTERS[kind]
    try:
        painter.require()
    except PlotUnavailable as exc:
        raise _fail(str(exc)) from None
    with open_log(db, mode="read") as log:
        protect = ledger_files(log.database)
        check_output(output, protect)  # never the ledger, and before a fold of the run
        with paused_gc():
            lanes = lanes_of(log.read(run))
    with whole_file(output, protect) as stream:
        painter.write(build_scene(lanes, mode), stream)
    summary = {
        "run": lanes.run,
        "output": str(output),
        "format": kind,
        "axis": mode,
        "events": lanes.last_seq,
        "shards": lanes.shard_count,
        "refits": len(lanes.refits),
        "epoch_changes": len(lanes.epochs) - 1,
        "end": lanes.end_label(),
    }
    if as_json:
        print_json(summary)
    else:
        say(
            f"wrote {output} ({kind.upper()}, {plural(lanes.shard_count, 'shard')}, "
            f"{plural(lanes.last_seq, 'event')}, {plural(len(lanes.refits), 'refit')}): "
            f"{lanes.end_label()}"
        )
