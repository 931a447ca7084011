"""The fold's quiet fast path: why ``FleetView.apply_page`` keeps one inlined copy of the
probe-success rule.

Folds 1,000,000 one-shard probe rounds of HEALTHY shards (what most of a long run is)
two ways, in the same process, interleaved, best of seven:

- ``apply_page``: the fold as it is, the rule inlined in its loop;
- through the function: ``apply_page`` compiled again from its own source with the
  inlined copy replaced by a call of ``shard_states.all_healthy_probes_ok`` (the guard
  and the count, written once there) — what the fast path would cost with no inlined
  copy, all else equal.

Run by hand: ``python bench/bench_fold.py`` (about 20 s).
"""

from __future__ import annotations

import gc
import inspect
import textwrap
import time
from collections.abc import Callable, Sequence

from fleetledger.events.models import FleetConfig, ProbeRound, RecordedEvent, RunStarted
from fleetledger.projections import fleet_view
from fleetledger.projections.fleet_view import FleetView
from fleetledger.projections.shard_states import all_healthy_probes_ok

SHARDS = 8
EVENTS = 1_000_000
PAGE = 1000
ROUNDS = 7
T0_US = 1_750_000_000_000_000


def _run() -> list[list[RecordedEvent]]:
    config = FleetConfig(
        shard_count=SHARDS,
        workers_per_shard=1,
        train_world_size=1,
        base_urls=tuple(f"http://gen-{i}.test:8000/v1" for i in range(SHARDS)),
    )
    records = [RecordedEvent("bench", 1, T0_US, RunStarted(config=config))]
    records += [
        RecordedEvent("bench", seq, T0_US + seq, ProbeRound(ok=(seq % SHARDS,)))
        for seq in range(2, EVENTS + 2)
    ]
    return [records[i : i + PAGE] for i in range(0, len(records), PAGE)]


def _inlined(view: FleetView, pages: Sequence[Sequence[RecordedEvent]]) -> None:
    for page in pages:
        for _ in view.apply_page(page):
            pass


_CALLED = """if all_healthy_probes_ok(shards, event.ok, at_us):
    repeating = event
    last_seq, last_at = seq, at_us
    continue
"""


def _inlined_block(lines: list[str]) -> tuple[int, int]:
    """(first, past-last) line of the inlined rule in ``apply_page``'s source: from
    ``ok = event.ok`` to the first ``continue`` after it. Found, not copied here, so the
    bench measures whatever the fold holds."""
    starts = [i for i, line in enumerate(lines) if line.strip() == "ok = event.ok"]
    if len(starts) != 1:
        raise SystemExit("bench_fold: apply_page no longer holds the inlined rule; update me")
    first = starts[0]
    for i in range(first, len(lines)):
        if lines[i].strip() == "continue":
            return first, i + 1
    raise SystemExit("bench_fold: the inlined rule has no `continue`; update me")


def _apply_page_calling_the_rule() -> Callable[..., object]:
    """``FleetView.apply_page`` compiled again from its own source with the inlined copy
    replaced by a call of the rule: the same code but for that one difference."""
    lines = textwrap.dedent(inspect.getsource(FleetView.apply_page)).splitlines(keepends=True)
    first, past = _inlined_block(lines)
    indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
    called = textwrap.indent(_CALLED, indent).splitlines(keepends=True)
    source = "".join(lines[:first] + called + lines[past:])
    namespace = dict(vars(fleet_view))
    namespace["all_healthy_probes_ok"] = all_healthy_probes_ok
    exec(compile(source, "<apply_page calling the rule>", "exec"), namespace)
    return namespace["apply_page"]  # type: ignore[no-any-return]


def _through_the_function(view: FleetView, pages: Sequence[Sequence[RecordedEvent]]) -> None:
    apply_page = _CALLING
    for page in pages:
        for _ in apply_page(view, page):  # type: ignore[attr-defined]
            pass


_CALLING = _apply_page_calling_the_rule()


def _once(
    fold: Callable[[FleetView, Sequence[Sequence[RecordedEvent]]], None],
    pages: list[list[RecordedEvent]],
) -> float:
    view = FleetView.start(pages[0][0])
    tail = [pages[0][1:], *pages[1:]]
    gc.collect()
    started = time.perf_counter()
    fold(view, tail)
    return time.perf_counter() - started


def _same_fold(pages: list[list[RecordedEvent]]) -> None:
    """Both ways fold the run to the same view, or the comparison means nothing."""
    views = []
    for fold in (_inlined, _through_the_function):
        view = FleetView.start(pages[0][0])
        fold(view, [pages[0][1:], *pages[1:]])
        views.append(view)
    if views[0] != views[1]:
        raise SystemExit("bench_fold: the two folds disagree; the substitution is wrong")


def main() -> None:
    pages = _run()
    _same_fold(pages[:50])
    # Interleaved, best of each: a machine busy with something else slows both alike.
    inlined, called = [], []
    for _ in range(ROUNDS):
        inlined.append(_once(_inlined, pages))
        called.append(_once(_through_the_function, pages))
    best_inlined, best_called = min(inlined), min(called)
    print(f"{EVENTS:,} one-shard probe rounds of HEALTHY shards, best of {ROUNDS}, interleaved")
    print(f"  {'apply_page, the rule inlined':34} {best_inlined:6.3f} s")
    print(
        f"  {'apply_page, all_healthy_probes_ok':34} {best_called:6.3f} s"
        f"   ({best_called / best_inlined:.2f}x)"
    )


if __name__ == "__main__":
    main()
