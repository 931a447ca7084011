"""A live ``simulate --router`` run with a router in front, as a user runs it: every
answer's version headers are the versions the engine generated with, a refit landing
mid-stream included, and the run records the router it really runs.

The simulated engine's tokens each say the version they came from (`` vN``), so "the
version the engine generated with" is read from the generated text itself, not from
anything the router or the ledger says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp", reason="the router needs aiohttp: pip install -e '.[dev]'")

from fleetledger.events.attestation import Attested, end_in_line, read_attestation  # noqa: E402
from fleetledger.queries import load_view  # noqa: E402
from fleetledger.router.app import Router  # noqa: E402
from fleetledger.store.log import EventLog  # noqa: E402

CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"
ANSWERS = 48
STREAMS_AT_MOST = 40


def _versions_in(text: str) -> list[int]:
    return [int(word[1:]) for word in text.split() if word[:1] == "v" and word[1:].isdigit()]


def _wait_for_serving(db: str, run: str, process: subprocess.Popen[str]) -> None:
    """Until the run's first refit completed (its engines serve, their versions move)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before it served"
        try:
            with EventLog.open(db, mode="read") as log:
                if any(r.event.type == "refit_completed" for r in log.read(run, 0)):
                    return
        except Exception:  # not created yet
            pass
        time.sleep(0.2)
    raise AssertionError("the run's first refit did not complete within 120 s")


def _completion(client: openai.OpenAI, i: int) -> tuple[Attested | None, list[int]]:
    raw = client.completions.with_raw_response.create(
        model="fleetledger-sim", prompt=f"q{i}", max_tokens=6
    )
    return read_attestation(raw.headers), _versions_in(raw.parse().choices[0].text)


def _stream(client: openai.OpenAI) -> tuple[Attested | None, list[int], list[str]]:
    args = {"model": "fleetledger-sim", "prompt": "s", "max_tokens": 24, "stream": True}
    with client.completions.with_streaming_response.create(**args) as streamed:
        lines = [line for line in streamed.iter_lines() if line]
        headers = streamed.headers
    ends = [end_in_line(line) for line in lines if line.startswith(":")]
    text = "".join(
        json.loads(line[6:])["choices"][0]["text"] for line in lines if line.startswith("data: {")
    )
    end = ends[-1] if ends else None
    return read_attestation(headers, end), _versions_in(text), lines


@pytest.mark.slow
def test_every_answer_through_the_router_names_the_weights_it_was_generated_with(sqlite_url):
    run = f"attested-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "FLEETLEDGER_DB": sqlite_url}
    args = ["simulate", "--router", "--shards", "2", "--steps", "40", "--groups", "2"]
    args += ["--group-size", "2", "--generation-ms", "400", "--run", run, "--json"]
    process = subprocess.Popen(
        [str(CONSOLE_SCRIPT), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    router: Router | None = None
    stop = threading.Event()
    try:
        _wait_for_serving(sqlite_url, run, process)
        # What `fleetledger router RUN` runs, in front of the live run.
        router = Router(sqlite_url, run, port=0, poll_s=0.05, name="front")
        serving = threading.Thread(target=router.serve_forever, args=(stop,), daemon=True)
        serving.start()
        client = openai.OpenAI(base_url=router.url, api_key="unused", max_retries=0, timeout=30)
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda i: _completion(client, i), range(ANSWERS)))
        for attested, tokens in answers:
            assert attested is not None and attested.source == "engine"
            assert (attested.start, attested.end) == (tokens[0], tokens[-1])
        assert len({a.start for a, _ in answers if a is not None}) >= 2  # refits went by
        # Streams until a refit lands mid-stream (the run refits every step).
        moved = None
        for _ in range(STREAMS_AT_MOST):
            attested, tokens, lines = _stream(client)
            assert attested is not None
            assert (attested.start, attested.end) == (tokens[0], tokens[-1]), lines
            if attested.moved:
                moved = attested
                break
        assert moved is not None, f"no refit landed in {STREAMS_AT_MOST} streams"
    finally:
        stop.set()
        out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    assert json.loads(out)["outcome"] == "completed"
    with EventLog.open(sqlite_url, mode="read") as log:
        view = load_view(log, run)
    recorded = view.config.settings["router"]
    generation_deadline = view.config.settings["timeouts"]["generation_timeout_s"]
    assert recorded["enabled"] is True
    assert recorded["backend_timeout_s"] <= generation_deadline
