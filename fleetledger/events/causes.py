"""What a death or failure cause says, read into fields when it is recorded.

Why: Ray's account of a killed actor is a kilobyte — ids, a namespace, then advice about
the OOM killer and resource isolation — and was quoted whole in every rule, transition
and explanation, pointing on-call at the wrong cause for a plain SIGKILL. A task error
carries ANSI colour codes, the actor's repr and a Python traceback, with the message that
matters at its end. So a cause is read once, at ingest, into what died, how, the pid, the
node, the ids and one line (:class:`Cause`); the raw text is kept once, bounded, shown
only on request (``explain --raw``, ``--json``). The same reading serves rows recorded
before the fields existed (their ``error`` is the raw text), so an old ledger's
explanations are as short as a new one's.

Rules of this file:

- Each family of texts has one parser, found by a table of patterns over the text
  (``PARSERS``, first match wins): Ray's actor death, its unavailable actor, its task
  error, its node death; vLLM's engine death (as the shard says it, and vLLM's own);
  the transports' gloo errors; a timeout. Anything else keeps its first line: never a
  guess dressed as a fact.
- A field is set only when the text says it. Ray's "connection error code 2. End of
  file" is a process that ended without a word to Ray — SIGKILL (``kill -9``, the
  kernel's OOM killer, ``ray stop --force``) or a crash; the cause says both, and never
  repeats Ray's advice.
- Pure: text in, fields out; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

__all__ = [
    "CAUSE_RAW_LIMIT",
    "Cause",
    "CauseHow",
    "CauseWhat",
    "cause_line",
    "exception_line",
    "read_cause",
]

CAUSE_RAW_LIMIT = 4096
"""The most characters of raw text a cause keeps (an event's text limit)."""
CAUSE_LINE_LIMIT = 200
"""The most characters of the one-line message a cause keeps."""

CauseWhat = Literal["actor", "engine", "node", "peer", "call"]
"""What failed: the shard's actor process, the engine core under it, the node they ran
on, a peer of the refit communicator, or one call (a task error, a timeout)."""

CauseHow = Literal[
    "killed",  # ended without a word: SIGKILL or a crash
    "signal",  # a signal the process saw (``signal`` names it)
    "exit",  # exited on its own (``exit_code``)
    "ray.kill",  # ray.kill
    "out_of_memory",  # Ray's memory monitor killed it
    "node_lost",  # the node died
    "preempted",  # the node was preempted
    "owner_died",  # the actor's owner process died
    "exception",  # an exception (``exception`` names its type)
    "engine_died",  # the engine core under a live actor
    "connection_lost",  # a peer closed or reset the connection
    "timeout",  # no answer within a bound
    "unavailable",  # the runtime cannot reach it now; it may come back
    "unknown",
]

# A terminal's sequences, dropped from the fields: CSI (ESC [ … and its C1 form) and OSC
# (ESC ] … ended by BEL or ESC \). What else is a control stays, for the printer to escape.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x9b[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
)
_EXCEPTION_HEAD = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:\([\w.]+\))?): (?P<rest>.*)$", re.S)


class Cause(BaseModel):
    """A cause as facts: what failed, how, where; ``message`` its one line, ``raw`` the
    text it was read from (ANSI codes dropped, bounded). Unknown fields are empty."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    what: CauseWhat = "call"
    how: CauseHow = "unknown"
    exception: str = Field(default="", description="The exception's type, as raised.")
    signal: str = Field(default="", description="SIGKILL, SIGTERM, …")
    exit_code: int | None = None
    pid: int | None = None
    node: str = Field(default="", description="The node's address.")
    actor_id: str = ""
    engine_id: str = ""
    call: str = Field(default="", description="The remote method that raised (a task error).")
    message: str = Field(default="", max_length=CAUSE_LINE_LIMIT)
    raw: str = Field(default="", max_length=CAUSE_RAW_LIMIT)

    @property
    def line(self) -> str:
        """The cause in one line, as every command prints it."""
        return _LINES[self.how](self)

    @model_serializer(mode="wrap")
    def _stored(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Only what the text said: an unknown field is left out, not stored empty."""
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v not in ("", None) or k == "message"}


# ── the one line, per how ──────────────────────────────────────────────────────


def _process(c: Cause) -> str:
    """``actor process 4242 on 10.0.0.2``; for a call, where it ran."""
    pid = f" {c.pid}" if c.pid is not None else ""
    node = f" on {c.node}" if c.node else ""
    if c.what == "call":
        return f"{c.call or 'call'}{', pid' + pid if pid else ''}{node}"
    name = {"engine": "engine core", "actor": "actor process"}.get(c.what, c.what)
    return f"{name}{pid}{node}"


def _with_message(head: str, c: Cause) -> str:
    return f"{head}: {c.message}" if c.message else head


def _exit_words(c: Cause) -> str:
    code = f" (exit code {c.exit_code})" if c.exit_code is not None else ""
    return code


_LINES: dict[str, Callable[[Cause], str]] = {
    "killed": lambda c: f"{_process(c)} killed (SIGKILL or a crash)",
    "signal": lambda c: f"{_process(c)} ended by {c.signal}{_exit_words(c)}",
    "exit": lambda c: _with_message(f"{_process(c)} exited{_exit_words(c)}", c),
    "ray.kill": lambda c: f"{_process(c)} killed by ray.kill",
    "out_of_memory": lambda c: _with_message(
        f"{_process(c)} killed by Ray's memory monitor (node low on memory)", c
    ),
    "node_lost": lambda c: (
        f"node {c.node or '(address unknown)'} lost"
        + (f", and actor process {c.pid} with it" if c.pid is not None else "")
    ),
    "preempted": lambda c: (
        f"node {c.node or '(address unknown)'} preempted"
        + (f", and actor process {c.pid} with it" if c.pid is not None else "")
    ),
    "owner_died": lambda c: f"{_process(c)} ended: its owner died",
    "exception": lambda c: (
        f"{c.exception}: {c.message}" + (f" (in {_process(c)})" if c.pid is not None else "")
    ),
    "engine_died": lambda c: _with_message(
        _process(c)
        + (
            f" killed by {c.signal}"
            if c.signal
            else f" exited{_exit_words(c)}"
            if c.exit_code is not None
            else " died"
        ),
        c,
    ),
    "connection_lost": lambda c: _with_message(
        f"communicator peer {c.node or '(address unknown)'} lost", c
    ),
    "timeout": lambda c: (
        c.message if c.message.startswith("no answer") else _with_message("no answer in time", c)
    ),
    "unavailable": lambda c: _with_message("actor unreachable for now", c),
    "unknown": lambda c: (
        (f"{c.exception}: {c.message}" if c.exception else c.message or "no detail")
        + (f" ({_process(c)})" if c.pid is not None or c.node else "")
    ),
}


# ── reading ────────────────────────────────────────────────────────────────────


def _clean(text: str) -> str:
    return _ANSI.sub("", text).replace("\r", "")


def _lines(text: str) -> list[str]:
    """The text's lines: newlines, and the `` | `` a one-line death text joined them with."""
    out: list[str] = []
    for line in text.split("\n"):
        out += [part.strip() for part in line.split(" | ")]
    return [line for line in out if line]


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= CAUSE_LINE_LIMIT else line[: CAUSE_LINE_LIMIT - 1] + "…"


def _field(lines: list[str], name: str) -> str:
    prefix = f"{name}: "
    for line in lines:
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return ""


def _int(text: str | None) -> int | None:
    return int(text) if text and text.lstrip("-").isdigit() else None


_SIGNAL = re.compile(r"\b(SIG[A-Z]{2,6})\b")
_EXIT_CODE = re.compile(r"[Ee]xit code:? (-?\d+)")
_NODE_ID = re.compile(r"Node Id: ([0-9a-f]+)")


def _ray_actor_died(exception: str, body: str, lines: list[str]) -> Cause:
    """Ray's ``ActorDiedError``: the fields it lists, then why, from its own sentence."""
    common = {
        "what": "actor",
        "exception": exception,
        "pid": _int(_field(lines, "pid")),
        "node": _field(lines, "ip"),
        "actor_id": _field(lines, "actor_id"),
    }
    why = body
    if "killed by `ray.kill`" in why:
        return Cause(how="ray.kill", **common)  # type: ignore[arg-type]
    if "preempted" in why:  # before the node's death: the reason it died
        return Cause(how="preempted", **common)  # type: ignore[arg-type]
    if "its node has died" in why or "node it was running on is dead" in why:
        node_id = _NODE_ID.search(why)
        message = f"node id {node_id.group(1)[:12]}" if node_id else ""
        return Cause(how="node_lost", message=message, **common)  # type: ignore[arg-type]
    if "running low on memory" in why or "memory pressure (OOM)" in why:
        return Cause(how="out_of_memory", **common)  # type: ignore[arg-type]
    if "its owner has died" in why:
        return Cause(how="owner_died", **common)  # type: ignore[arg-type]
    if "connection error code" in why and "End of file" in why:
        return Cause(how="killed", **common)  # type: ignore[arg-type]
    signal = _SIGNAL.search(why)
    code = _EXIT_CODE.search(why)
    if signal is not None:
        return Cause(
            how="signal",
            signal=signal.group(1),
            exit_code=_int(code.group(1)) if code else None,
            **common,  # type: ignore[arg-type]
        )
    if code is not None:
        return Cause(how="exit", exit_code=int(code.group(1)), **common)  # type: ignore[arg-type]
    if "error raised in its creation task" in why:
        inner = _exception_at_end(lines)
        return Cause(
            how="exception",
            exception=inner[0],
            message=inner[1],
            **{k: v for k, v in common.items() if k != "exception"},
        )  # type: ignore[arg-type]
    reason = [line for line in lines if line.startswith("The actor is dead because")]
    return Cause(how="unknown", message=_one_line(reason[0] if reason else lines[0]), **common)  # type: ignore[arg-type]


_UNAVAILABLE = re.compile(
    r"The actor (?P<actor>[0-9a-f]+|None) is unavailable: (?P<why>.*?)\.?"
    r"(?: The task may or may not have been executed on the actor\.)?$",
    re.S,
)


def _ray_unavailable(exception: str, body: str, lines: list[str]) -> Cause:
    found = _UNAVAILABLE.search(" ".join(lines))
    actor = found.group("actor") if found else ""
    return Cause(
        what="actor",
        how="unavailable",
        exception=exception,
        actor_id="" if actor == "None" else actor,
        message=_one_line(found.group("why") if found else lines[0]),
    )


_TASK_HEAD = re.compile(r"ray::(?P<call>[\w.]+)\(\)\s*\((?P<attrs>[^)\n]*)\)")


def _exception_at_end(lines: list[str]) -> tuple[str, str]:
    """The last ``Type: message`` line of a traceback: the message that matters."""
    for line in reversed(lines):
        head = _EXCEPTION_HEAD.match(line)
        if head and not line.startswith("File "):
            return head.group("type"), _one_line(head.group("rest"))
    return "", _one_line(lines[-1]) if lines else ""


def _ray_task_error(exception: str, body: str, lines: list[str]) -> Cause:
    """A ``RayTaskError(Inner)``: the remote call, its pid and node, and the inner
    exception's own last line (the traceback and the actor's repr dropped)."""
    head = _TASK_HEAD.search(body)
    attrs = dict(
        part.split("=", 1)
        for part in (head.group("attrs").split(", ") if head else ())
        if "=" in part
    )
    inner_type, message = _exception_at_end(lines[1:] if head else lines)
    wrapped = re.match(r"RayTaskError\((?P<inner>[\w.]+)\)", exception)
    return Cause(
        what="call",
        how="exception",
        call=f"{head.group('call')}()" if head else "",
        exception=inner_type or (wrapped.group("inner") if wrapped else exception),
        pid=_int(attrs.get("pid")),
        node=attrs.get("ip", ""),
        actor_id=attrs.get("actor_id", ""),
        message=message,
    )


_NODE_DEAD = re.compile(
    r"node it was running on is dead or unavailable\. "
    r"Node IP: (?P<ip>[^,]+), node ID: (?P<id>[0-9a-f]+)"
)


def _ray_node_died(exception: str, body: str, lines: list[str]) -> Cause:
    found = _NODE_DEAD.search(body)
    return Cause(
        what="node",
        how="node_lost",
        exception=exception,
        node=found.group("ip") if found else "",
        message=f"node id {found.group('id')[:12]}" if found else "",
    )


# Our own words for an engine core that died under a live actor
# (engines/vllm_shard.py): "shard 1: the vLLM engine core (pid 4242, killed by SIGKILL) is
# dead under a live actor: …".
_ENGINE_PROCESS = re.compile(r"engine core \(pid (?P<pid>\d+)(?:, (?P<how>[^)]*))?\)")
_VLLM_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


_ENGINE_SAID = ("the vLLM engine core is dead under a live actor", "the vLLM ")


def _engine_died(exception: str, body: str, lines: list[str]) -> Cause:
    found = _ENGINE_PROCESS.search(body)
    how = (found.group("how") or "") if found else ""
    signal = _SIGNAL.search(how)
    code = _EXIT_CODE.search(how)
    # vLLM's own sentence points at a stack trace that is not in the ledger, and the
    # shard's "is dead under a live actor" is what ``how`` already says.
    message = _ENGINE_PROCESS.sub("engine core", lines[0]).replace(_VLLM_DEAD_MESSAGE, "")
    for said in _ENGINE_SAID:
        message = message.replace(said, "")
    message = re.sub(r"^shard \d+: ", "", message).strip(" :")
    return Cause(
        what="engine",
        how="engine_died",
        exception=exception,
        pid=_int(found.group("pid")) if found else None,
        signal=signal.group(1) if signal else "",
        exit_code=_int(code.group(1)) if code else None,
        message=_one_line(message),
    )


_GLOO_SOURCE = re.compile(r"\[[^\]]*gloo[^\]]*\.cc:\d+\] ")
_PEER = re.compile(r"\[(?P<ip>[0-9a-fA-F.:]+)\]:(?P<port>\d+)")


def _gloo(exception: str, body: str, lines: list[str]) -> Cause:
    """gloo's ``RuntimeError``: its source position and sign-off dropped; a closed or
    reset connection names the peer."""
    text = _GLOO_SOURCE.sub("", lines[0])
    text = text.split(". This is typically caused")[0]
    peer = _PEER.search(text)
    lost = "Connection closed by peer" in text or "Connection reset by peer" in text
    if lost:
        return Cause(
            what="peer",
            how="connection_lost",
            exception=exception,
            node=f"{peer.group('ip')}:{peer.group('port')}" if peer else "",
            message="connection closed" if "closed" in text else "connection reset",
        )
    timed_out = "Timed out" in text
    return Cause(
        what="peer",
        how="timeout" if timed_out else "unknown",
        exception=exception,
        message=_one_line(f"gloo: {text}"),
    )


def _timeout(exception: str, body: str, lines: list[str]) -> Cause:
    """A bound that ran out: its own words when they say so ("no answer within …", the
    probe pump's), else the exception's type and message."""
    said = lines[0] if lines[0].startswith("no answer") or not exception else None
    return Cause(
        what="call",
        how="timeout",
        exception=exception,
        message=_one_line(said if said is not None else f"{exception}: {lines[0]}"),
    )


def _unknown(exception: str, body: str, lines: list[str]) -> Cause:
    return Cause(how="unknown", exception=exception, message=_one_line(lines[0] if lines else ""))


Parser = Callable[[str, str, list[str]], Cause]

# (exception type pattern, text pattern, parser): the first row whose patterns both
# match reads the cause. An empty pattern matches anything.
PARSERS: tuple[tuple[re.Pattern[str], re.Pattern[str], Parser], ...] = (
    (re.compile(r"ActorUnavailableError$"), re.compile(""), _ray_unavailable),
    (re.compile(r"(ActorDiedError|RayActorError)$"), re.compile(""), _ray_actor_died),
    (re.compile(""), re.compile(r"^The actor died unexpectedly"), _ray_actor_died),
    (re.compile(""), re.compile(r"node it was running on is dead"), _ray_node_died),
    (
        re.compile(""),
        re.compile(r"(vLLM )?engine core.*(dead|died)|EngineCore encountered"),
        _engine_died,
    ),
    (re.compile(r"EngineDead(Error)?$"), re.compile(""), _engine_died),
    (re.compile(r"^RayTaskError"), re.compile(""), _ray_task_error),
    (re.compile(""), re.compile(r"^ray::[\w.]+\(\)"), _ray_task_error),
    (re.compile(""), re.compile(r"gloo/"), _gloo),
    (re.compile(r"(GetTimeoutError|TimeoutError|TimeoutExpired)$"), re.compile(""), _timeout),
    (re.compile(""), re.compile(r"^no answer within"), _timeout),  # the probe pump's words
)


def _clip_raw(text: str) -> str:
    if len(text) <= CAUSE_RAW_LIMIT:
        return text
    tail = " … [clipped]"
    return text[: CAUSE_RAW_LIMIT - len(tail)] + tail


@lru_cache(maxsize=1024)
def read_cause(text: str) -> Cause:
    """``text`` (what a death or failure said: ``Type: message`` or the message alone)
    read into a :class:`Cause`, with the cleaned text kept as ``raw``."""
    clean = _clean(text).strip()
    head = _EXCEPTION_HEAD.match(clean)
    exception, body = (head.group("type"), head.group("rest")) if head else ("", clean)
    lines = _lines(body) or [exception or ""]
    for type_pattern, text_pattern, parser in PARSERS:
        if type_pattern.search(exception) and text_pattern.search(body):
            cause = parser(exception, body, lines)
            break
    else:
        cause = _unknown(exception, body, lines)
    return cause.model_copy(update={"raw": _clip_raw(text)})


def exception_line(exc: BaseException) -> str:
    """An exception as the one line its cause reads as (``Type: message``, read like any
    cause: Ray's death as the process, signal and node, gloo's as the peer, never a
    remote traceback); one whose text cannot be read still has its type."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    return cause_line(f"{type(exc).__name__}: {text}" if text.strip() else type(exc).__name__)


def cause_line(text: str) -> str:
    """The one line a recorded text reads as (``""`` stays ``""``)."""
    return read_cause(text).line if text.strip() else ""
