"""Being told of appends to a PostgreSQL ledger as they commit (``LISTEN``), in a thread.

Every append notifies ``postgres.APPENDED_CHANNEL`` inside its transaction, so the news
arrives when — and only if — it commits. A follower that listens reads the tail at once
instead of at its next poll. A notification is a hint, never the data: the follower
still reads the rows by seq, so a lost notification (a dropped connection) only delays
it until its fallback poll, and the listener says so and connects again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from fleetledger.store.database import Database
from fleetledger.store.postgres import APPENDED_CHANNEL, read_appended_payload

# (run, last seq) of a committed append.
OnAppend = Callable[[str, int], None]
# A change of the listener's state, in one line: "listening", or why it is not.
OnState = Callable[[str], None]

WAIT_SLICE_S = 0.5  # how often a waiting listener looks at its stop flag
RETRY_AFTER_S = 1.0


class AppendListener:
    """Calls ``on_append`` for each append committed to the ledger, from its own thread."""

    def __init__(self, database: Database, on_append: OnAppend, on_state: OnState) -> None:
        if database.backend != "postgresql" or database.engine is None:
            raise ValueError("only a PostgreSQL ledger notifies its appends")
        self._engine = database.engine
        self._on_append = on_append
        self._on_state = on_state
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleetledger-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=WAIT_SLICE_S * 4)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception as exc:  # a lost server: say it, poll meanwhile, try again
                first = (str(exc).splitlines() or [""])[0]
                self._on_state(f"not listening ({type(exc).__name__}: {first}); polling")
                self._stop.wait(RETRY_AFTER_S)

    def _listen(self) -> None:
        raw: Any = self._engine.raw_connection()
        try:
            conn = raw.driver_connection
            conn.rollback()
            conn.autocommit = True
            conn.execute(f"LISTEN {APPENDED_CHANNEL}")
            self._on_state("listening")
            while not self._stop.is_set():
                for note in conn.notifies(timeout=WAIT_SLICE_S):
                    appended = read_appended_payload(note.payload)
                    if appended is not None:
                        self._on_append(*appended)
        finally:
            raw.invalidate()  # never hand a listening session back to the pool
