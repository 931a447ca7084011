"""Fixtures: ledger URLs on real SQLite files and a real PostgreSQL server.

PostgreSQL: the project's machines run a server at 127.0.0.1:5432 (trust auth, user
``postgres``). When none answers there, a throwaway server is started from the Debian
``initdb``/``pg_ctl`` for the session; when that is impossible too, the PostgreSQL cases
are skipped with the reason. ``FLEETLEDGER_TEST_PG=throwaway`` skips the probe of port
5432 and always starts a throwaway server (to exercise that path).

Every PostgreSQL test gets its own database ``fl_<hex>``, dropped afterwards.
"""

from __future__ import annotations

import glob
import logging
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from fleetledger.store.database import migrate
from fleetledger.store.log import EventLog

# Ray writes an auth token under ~/.ray unless told not to; set before any test imports it.
os.environ["RAY_AUTH_MODE"] = "disabled"

# Transitions are logged at info; thousands of hypothesis examples would bury a failure's
# output in them. Warnings and errors still show.
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_USER = "postgres"


def _sqlalchemy_url(port: int, database: str) -> str:
    return f"postgresql+psycopg://{PG_USER}@{PG_HOST}:{port}/{database}"


def _libpq_url(port: int, database: str) -> str:
    return f"postgresql://{PG_USER}@{PG_HOST}:{port}/{database}"


def _probe(port: int) -> str | None:
    """None when a server answers on ``port``, else why not."""
    import psycopg

    try:
        with psycopg.connect(_libpq_url(port, "postgres"), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((PG_HOST, 0))
        return sock.getsockname()[1]


def _pg_bindir() -> Path | None:
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")

    def major(path: str) -> int:
        part = Path(path).parts[-3]
        return int(part) if part.isdigit() else 0

    return Path(max(found, key=major)).parent if found else None


class _ThrowawayServer:
    """A PostgreSQL cluster in a temporary directory, on a free loopback port."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        # Under /tmp, not pytest's 0700 tmp root: the postgres user must reach it.
        self.base = Path(tempfile.mkdtemp(prefix="fleetledger-pg-"))
        self.data = self.base / "data"
        self.port = _free_port()
        self.prefix: list[str] = []
        if os.geteuid() == 0:  # initdb refuses to run as root
            shutil.chown(self.base, "postgres", "postgres")
            self.prefix = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str) -> None:
        result = subprocess.run(
            [*self.prefix, *args], capture_output=True, text=True, timeout=120, check=False
        )
        if result.returncode != 0:
            output = (result.stderr or result.stdout).strip().splitlines()
            raise RuntimeError(
                f"{Path(args[0]).name} exited {result.returncode}: "
                + (output[-1] if output else "no output")
            )

    def start(self) -> None:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            PG_USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            f"-p {self.port} -k {self.base} -c listen_addresses={PG_HOST}",
            "-l",
            str(self.base / "server.log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._run(
                    str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"
                )
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """A SQLAlchemy URL of the ``postgres`` database of a running server."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("PostgreSQL cases need psycopg: pip install 'fleetledger[dev]'")
    if os.environ.get("FLEETLEDGER_TEST_PG") == "throwaway":
        why_not = "not probed: FLEETLEDGER_TEST_PG=throwaway"
    else:
        why_not = _probe(PG_PORT)
        if why_not is None:
            yield _sqlalchemy_url(PG_PORT, "postgres")
            return
    no_server = f"no PostgreSQL server at {PG_HOST}:{PG_PORT} ({why_not})"
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip(f"{no_server} and no initdb found under /usr/lib/postgresql/*/bin")
    server = _ThrowawayServer(bindir)
    try:
        server.start()
    except (OSError, LookupError, RuntimeError, subprocess.TimeoutExpired) as exc:
        server.stop()
        pytest.skip(f"{no_server} and initdb failed: {exc}")
    try:
        yield _sqlalchemy_url(server.port, "postgres")
    finally:
        server.stop()


def _admin_url(server_url: str) -> str:
    return server_url.replace("postgresql+psycopg://", "postgresql://", 1)


def drop_database(server_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(_admin_url(server_url), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A fresh, empty database on the server (no fleetledger schema in it)."""
    import psycopg

    name = f"fl_{secrets.token_hex(6)}"
    with psycopg.connect(_admin_url(postgres_server_url), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = postgres_server_url.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        drop_database(postgres_server_url, name)


@pytest.fixture
def migrated_postgres_url(postgres_url: str) -> str:
    """A fresh database migrated to head: PostgreSQL ledgers are never created on open."""
    migrate(postgres_url)
    return postgres_url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ledger.db"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest) -> str:
    """A ready-to-use ledger URL on each backend (the SQLite file is created on open)."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("migrated_postgres_url")


@pytest.fixture
def log(ledger_url: str) -> Iterator[EventLog]:
    with EventLog.open(ledger_url) as opened:
        yield opened


@pytest.fixture(scope="module")
def campaign_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EventLog]]:
    """One SQLite ledger for a module's chaos trials (each trial is a run of its own),
    its URL and a log open on it for the oracle's reads."""
    db = f"sqlite:///{tmp_path_factory.mktemp('chaos')}/chaos.db"
    log = EventLog.open(db)
    yield db, log
    log.close()


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real local Ray cluster for one test module (starting one costs ~3 s and ~1 GB).

    Yields the cluster's GCS address, for drivers started in subprocesses.
    """
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # no auth token written under ~/.ray
    temp_dir = tempfile.mkdtemp(prefix="fl-ray-")  # Ray's socket paths must stay short
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _temp_dir=temp_dir,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def cli_sandbox(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """An empty working directory, no fleetledger settings from the environment, and
    structlog's configuration restored after the test (see tests/cli_support.py)."""
    from tests.cli_support import CLI_ENV_VARS

    monkeypatch.chdir(tmp_path)
    for name in CLI_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
