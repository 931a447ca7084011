"""``fleetledger serve``: the ledger over HTTP, read-only — the live page and the JSON API.

A read command: it never writes the ledger and never loads the controller. It keeps
serving whatever happens to the ledger (created later, migrated, a lost server): each
request that cannot be answered gets its one-line error, and the next one tries again.
"""

# No `from __future__ import annotations` in a command module: typer reads every
# command's annotations at start-up, and a string annotation costs it a compile (cli.app).

import os
import signal
import sys
from types import FrameType
from typing import Annotated

import typer

from fleetledger.cli.app import DbOption, app, cli_errors
from fleetledger.cli.output import CommandLineError, say

DEFAULT_PORT = 8321  # held to the web part's own by a test (cli.app: no import here)


@app.command()
@cli_errors
def serve(
    host: Annotated[
        str, typer.Option(help="Address to listen on (loopback unless you mean otherwise).")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="Port to listen on; 0 picks a free one.")
    ] = DEFAULT_PORT,
    poll_s: Annotated[
        float | None,
        typer.Option(
            "--poll-s",
            metavar="S",
            help="Seconds between reads of a followed run's tail whatever the news [default: "
            "1.0]; news comes sooner: PostgreSQL pushes appends, and a SQLite ledger's file "
            "stamp is looked at every 5 ms.",
            show_default=False,
        ),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            metavar="NAME",
            help="A Host name the server answers besides its own (repeatable); off loopback "
            "with none given, any.",
        ),
    ] = None,
    token_file: Annotated[
        str | None,
        typer.Option(
            "--token-file",
            metavar="FILE",
            help="A file holding the bearer token every API request must show (or "
            "FLEETLEDGER_TOKEN); needed to serve off loopback. The page: open /#token=TOKEN.",
        ),
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth", help="Serve off loopback with no token: anyone who reaches it reads."
        ),
    ] = False,
    db: DbOption = None,
) -> None:
    """Serve the ledger read-only over HTTP: the live page at /, the JSON API at /api/v1/.

    Prints the URL on stdout once listening; runs until Ctrl-C or SIGTERM. On loopback it
    answers only requests addressed to it; anywhere else it needs a token or --no-auth.
    """
    if poll_s is not None and not poll_s > 0:
        raise CommandLineError(f"--poll-s {poll_s}: give a positive number of seconds")
    if not 0 <= port <= 65535:
        raise CommandLineError(f"--port {port}: give a port number from 0 to 65535")
    token = _token(token_file)
    try:
        from fleetledger.web import ServedLedger, serve_forever
        from fleetledger.web.server import Access
    except ImportError as exc:
        raise CommandLineError(
            f"serve needs aiohttp ({exc.name} is not installed): pip install 'fleetledger[serve]'"
        ) from None

    def listening(url: str, served: "ServedLedger") -> None:
        say(url)
        sys.stdout.flush()
        if no_auth:
            say(
                f"fleetledger: warning: --no-auth: anyone who can reach {host}:{port} reads the "
                "whole ledger",
                err=True,
            )
        say(
            f"fleetledger: serving {served.source.display_url} read-only: the page at {url}, "
            f"the API at {url}api/v1/; Ctrl-C to stop",
            err=True,
        )

    def first_look(problem: str | None) -> None:
        if problem is not None:
            say(
                f"fleetledger: warning: {problem}; serving anyway: requests answer 503 until "
                "the ledger can be read",
                err=True,
            )

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        serve_forever(
            db,
            host,
            port,
            poll_interval_s=poll_s,
            on_listening=listening,
            on_first_look=first_look,
            access=Access(tuple(allow_host or ()), token, no_auth),
        )
    except KeyboardInterrupt:
        raise typer.Exit(code=0) from None


def _token(path: str | None) -> str | None:
    """The bearer token: from ``--token-file``, else ``FLEETLEDGER_TOKEN``, else none."""
    if path is None:
        return os.environ.get("FLEETLEDGER_TOKEN") or None
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise CommandLineError(f"--token-file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CommandLineError(f"--token-file {path}: not UTF-8 text") from None
    if not token or any(c.isspace() for c in token):
        raise CommandLineError(f"--token-file {path}: give one token, on one line, no spaces")
    return token
