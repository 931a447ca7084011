"""The controller's configuration: inert defaults, the validators, renames, what a run records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from fleetledger.config import (
    CLIENT_RETRIED_STATUSES,
    RENAMED_KEYS,
    ConfigError,
    ControllerConfig,
    WatchdogConfig,
)
from fleetledger.controller.ledger import Ledger
from fleetledger.errors import FleetledgerError
from fleetledger.events.models import RunStarted
from fleetledger.store.log import EventLog

URLS = tuple(f"http://127.0.0.1:{8000 + i}/v1" for i in range(4))


def rejected(data: dict[str, Any], *needles: str) -> str:
    """Build ``data``, expect it refused, and expect the message to contain ``needles``."""
    with pytest.raises(ValidationError) as info:
        ControllerConfig.from_mapping(data)
    text = str(info.value)
    for needle in needles:
        assert needle in text, f"{needle!r} not in:\n{text}"
    return text


def nested(path: str, value: Any) -> dict[str, Any]:
    """{"a": {"b": value}} for "a.b"."""
    *parents, leaf = path.split(".")
    data: dict[str, Any] = {leaf: value}
    for part in reversed(parents):
        data = {part: data}
    return data


# ── defaults ─────────────────────────────────────────────────────────────────


def test_no_keys_builds_and_changes_nothing() -> None:
    config = ControllerConfig.from_mapping({})
    assert config == ControllerConfig()
    assert config.fleet_health.enabled is False  # no probe timer, no quarantine
    assert config.fleet_health.restart_dead_shards is False
    assert config.router.enabled is False
    assert config.router.no_healthy_status == 409
    assert (
        config.timeouts.rollout_timeout_s,
        config.timeouts.generation_timeout_s,
        config.timeouts.env_timeout_s,
    ) == (None,) * 3  # every rollout deadline: wait indefinitely
    # The router's are bounded, and the defaults are where a reader of the config sees them.
    assert (config.router.connect_timeout_s, config.router.backend_timeout_s) == (5.0, 300.0)
    assert config.model_dump()["router"]["backend_timeout_s"] == 300.0
    # … except the refit's: a collective with a dead rank in it never returns by itself.
    assert (config.refit.refit_timeout_s, config.refit.bound_s) == (300, 360)
    assert ControllerConfig.from_mapping({"refit": {"refit_timeout_s": None}}).refit.bound_s is None
    assert config.watchdog.stall_action == "warn"  # observes, never ends a run
    assert config.rollout_failure.on_data_exhausted == "fail"
    assert config.rollout_failure.max_skipped_prompts == 0
    assert config.rollout_failure.max_consecutive_dropped_prompts == 0


def test_reference_defaults() -> None:
    c = ControllerConfig()
    assert (c.fleet_health.probe_interval_s, c.fleet_health.probe_timeout_s) == (5, 2)
    assert (c.fleet_health.unhealthy_threshold, c.fleet_health.healthy_threshold) == (3, 2)
    assert c.fleet_health.max_restart_attempts_per_shard == 5
    assert c.fleet_health.min_healthy_shards == 1
    f = c.rollout_failure
    assert (f.max_infra_attempts, f.max_data_attempts) == (5, 2)
    assert (f.backoff_base_s, f.max_backoff_s) == (1, 30)
    assert (c.watchdog.interval_s, c.watchdog.stall_timeout_s) == (30, 600)
    assert c.refit.grace_s == 60


def test_config_is_frozen() -> None:
    config = ControllerConfig()
    with pytest.raises(ValidationError, match="frozen"):
        config.watchdog.stall_action = "abort"  # type: ignore[misc]


def test_unknown_key_is_refused_by_name() -> None:
    rejected({"watchdog": {"stall_actoin": "abort"}}, "watchdog.stall_actoin", "Extra inputs")
    rejected({"fleet_helth": {}}, "fleet_helth", "Extra inputs")


def test_non_finite_durations_are_refused() -> None:
    # A JSON dump would write inf as null, and the recorded run would mean something else.
    rejected(nested("fleet_health.probe_interval_s", float("inf")), "fleet_health.probe_interval_s")
    rejected(nested("refit.grace_s", float("nan")), "refit.grace_s")


@pytest.mark.parametrize(
    "path", ["fleet_health.probe_interval_s", "watchdog.interval_s", "timeouts.env_timeout_s"]
)
def test_durations_must_be_positive(path: str) -> None:
    rejected(nested(path, 0), path, "greater than 0")


# ── validators ───────────────────────────────────────────────────────────────


def test_probe_timeout_must_fit_inside_the_interval() -> None:
    ok = ControllerConfig.from_mapping(
        {"fleet_health": {"probe_interval_s": 1.0, "probe_timeout_s": 0.99}}
    )
    assert ok.fleet_health.probe_timeout_s == 0.99
    for timeout in (5.0, 7.5):
        rejected(
            {"fleet_health": {"probe_timeout_s": timeout}},
            f"fleet_health.probe_timeout_s={timeout}",
            "fleet_health.probe_interval_s=5.0",
            "lower the timeout or raise the interval",
        )


def test_probe_timeout_is_checked_even_while_fleet_health_is_off() -> None:
    # Turning fleet health on later must not be what reveals a broken pair.
    rejected({"fleet_health": {"enabled": False, "probe_timeout_s": 9}}, "probe_timeout_s")


def test_max_backoff_must_be_at_least_the_base() -> None:
    for base, cap in ((1, 1), (0, 0), (2, 30)):
        config = ControllerConfig.from_mapping(
            {"rollout_failure": {"backoff_base_s": base, "max_backoff_s": cap}}
        )
        assert config.rollout_failure.max_backoff_s == cap
    rejected(
        {"rollout_failure": {"backoff_base_s": 10, "max_backoff_s": 5}},
        "rollout_failure.max_backoff_s=5.0",
        "rollout_failure.backoff_base_s=10.0",
        "raise max_backoff_s or lower backoff_base_s",
    )


def test_stall_timeout_must_exceed_the_watchdog_interval() -> None:
    # (A stall timeout this short also needs a refit bound below it: the default refit
    # deadline of 300 s + 60 s grace would be refused, by the validator below.)
    ok = ControllerConfig.from_mapping(
        {"watchdog": {"interval_s": 30, "stall_timeout_s": 31}, "refit": {"refit_timeout_s": None}}
    )
    assert ok.watchdog.stall_timeout_s == 31
    for stall in (30, 10):
        rejected(
            {"watchdog": {"stall_timeout_s": stall}},
            f"watchdog.stall_timeout_s={float(stall)}",
            "watchdog.interval_s=30.0",
        )


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("timeouts", "rollout_timeout_s"),
        ("timeouts", "generation_timeout_s"),
        ("timeouts", "env_timeout_s"),
    ],
)
def test_stall_timeout_must_exceed_every_deadline_set(section: str, key: str) -> None:
    ok = ControllerConfig.from_mapping({section: {key: 599.5}})
    assert getattr(getattr(ok, section), key) == 599.5
    for deadline in (600, 900):
        rejected(
            {section: {key: deadline}},
            "watchdog.stall_timeout_s=600",
            f"{section}.{key}={deadline}",
            "raise watchdog.stall_timeout_s or shorten the deadline",
        )
    # Raising the stall timeout is the fix the message offers; it works.
    fixed = ControllerConfig.from_mapping(
        {section: {key: 900}, "watchdog": {"stall_timeout_s": 901}}
    )
    assert fixed.watchdog.stall_timeout_s == 901


def test_stall_timeout_must_exceed_the_refit_bound_including_grace() -> None:
    # A hung refit parks the rollout pump: the watchdog must not call it a stall before
    # refit_timeout_s + grace_s has fired and the recovery has had its chance.
    ok = ControllerConfig.from_mapping({"refit": {"refit_timeout_s": 539}})
    assert ok.refit.bound_s == 599
    rejected(
        {"refit": {"refit_timeout_s": 540}},
        "watchdog.stall_timeout_s=600",
        "refit.refit_timeout_s + refit.grace_s=600",
    )
    rejected({"refit": {"refit_timeout_s": 500, "grace_s": 100}}, "refit.grace_s=600")


def test_every_offending_deadline_is_named_at_once() -> None:
    text = rejected(
        {"timeouts": {"rollout_timeout_s": 700, "env_timeout_s": 800, "generation_timeout_s": 5}}
    )
    assert "timeouts.rollout_timeout_s=700" in text
    assert "timeouts.env_timeout_s=800" in text
    assert "generation_timeout_s" not in text


def test_a_disabled_watchdog_does_not_constrain_deadlines() -> None:
    config = ControllerConfig.from_mapping(
        {"watchdog": {"enabled": False}, "timeouts": {"rollout_timeout_s": 3600}}
    )
    assert config.timeouts.rollout_timeout_s == 3600


def test_connect_timeout_must_not_exceed_backend_timeout() -> None:
    for connect, backend in ((5, 5), (1, 60), (5, None), (None, 5)):
        config = ControllerConfig.from_mapping(
            {"router": {"connect_timeout_s": connect, "backend_timeout_s": backend}}
        )
        assert config.router.connect_timeout_s == connect
    rejected(
        {"router": {"connect_timeout_s": 10, "backend_timeout_s": 5}},
        "router.connect_timeout_s=10.0",
        "router.backend_timeout_s=5.0",
    )


def test_a_router_call_must_fit_inside_the_generation_deadline() -> None:
    """A backend call that outlives the deadline keeps the engine busy with a rollout
    already re-dispatched elsewhere: refused, naming both keys."""
    rejected(
        {"router": {"enabled": True}, "timeouts": {"generation_timeout_s": 60}},
        "router.backend_timeout_s=300",
        "timeouts.generation_timeout_s=60",
    )
    rejected(
        {
            "router": {"enabled": True, "backend_timeout_s": 90},
            "timeouts": {"rollout_timeout_s": 60},
        },
        "router.backend_timeout_s=90",
        "timeouts.rollout_timeout_s=60",
    )
    fits = ControllerConfig.from_mapping(
        {
            "router": {"enabled": True, "backend_timeout_s": 60},
            "timeouts": {"generation_timeout_s": 60, "rollout_timeout_s": 500},
        }
    )
    assert fits.router.backend_bound_s == 60 and fits.router.connect_bound_s == 5
    # The router off, its timeouts bound nothing.
    off = ControllerConfig.from_mapping({"timeouts": {"generation_timeout_s": 60}})
    assert off.router.backend_timeout_s == 300


@pytest.mark.parametrize("status", sorted(CLIENT_RETRIED_STATUSES))
def test_router_status_must_not_be_one_its_clients_retry(status: int) -> None:
    rejected(
        {"router": {"no_healthy_status": status}},
        f"router.no_healthy_status={status}",
        "retry forever",
        "409",
    )


def test_router_statuses_that_are_not_retried_are_accepted() -> None:
    assert CLIENT_RETRIED_STATUSES == {429, 500, 502, 503, 504, 520}
    for status in (409, 410, 400, 599):
        config = ControllerConfig.from_mapping({"router": {"no_healthy_status": status}})
        assert config.router.no_healthy_status == status
    # A success or redirect would tell the client a missing fleet answered.
    for status in (200, 307):
        rejected({"router": {"no_healthy_status": status}}, "router.no_healthy_status")


def test_skip_with_a_zero_skip_budget_is_refused() -> None:
    rejected(
        {"rollout_failure": {"on_data_exhausted": "skip"}},
        "rollout_failure.on_data_exhausted='skip'",
        "rollout_failure.max_skipped_prompts=0",
        "behaves exactly like 'fail'",
    )
    ok = ControllerConfig.from_mapping(
        {"rollout_failure": {"on_data_exhausted": "skip", "max_skipped_prompts": 3}}
    )
    assert ok.rollout_failure.max_skipped_prompts == 3


def test_a_skip_budget_without_skipping_is_refused() -> None:
    rejected(
        {"rollout_failure": {"max_skipped_prompts": 3}},
        "rollout_failure.max_skipped_prompts=3",
        "on_data_exhausted='fail'",
    )


def test_on_data_exhausted_accepts_only_fail_or_skip() -> None:
    rejected({"rollout_failure": {"on_data_exhausted": "fail_fast"}}, "on_data_exhausted")


def test_restarting_dead_shards_needs_fleet_health_and_a_budget() -> None:
    rejected(
        {"fleet_health": {"restart_dead_shards": True}},
        "fleet_health.restart_dead_shards=true",
        "fleet_health.enabled=false",
    )
    rejected(
        {
            "fleet_health": {
                "enabled": True,
                "restart_dead_shards": True,
                "max_restart_attempts_per_shard": 0,
            }
        },
        "fleet_health.max_restart_attempts_per_shard=0",
    )
    ok = ControllerConfig.from_mapping(
        {"fleet_health": {"enabled": True, "restart_dead_shards": True}}
    )
    assert ok.fleet_health.restart_dead_shards


@pytest.mark.parametrize(
    "path", ["fleet_health.unhealthy_threshold", "fleet_health.min_healthy_shards"]
)
def test_thresholds_are_at_least_one(path: str) -> None:
    rejected(nested(path, 0), path, "greater than or equal to 1")


# ── renamed keys ─────────────────────────────────────────────────────────────


def _value_for(new_path: str) -> Any:
    """A value valid at ``new_path`` (renames carry values, so the value must fit)."""
    return {} if new_path == "router" else 45 if "stall" in new_path else 3


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED_KEYS.items()))
def test_renamed_key_is_refused_naming_the_new_key(old: str, new: str) -> None:
    rejected(nested(old, _value_for(new)), f"{old} was renamed to {new}", "move its value there")


def test_renamed_key_is_refused_even_next_to_the_new_one() -> None:
    rejected(
        {"stall_seconds": 700, "watchdog": {"stall_timeout_s": 700}},
        "stall_seconds was renamed to watchdog.stall_timeout_s",
    )


def test_renamed_key_is_refused_by_the_section_itself() -> None:
    with pytest.raises(ValidationError, match=r"watchdog\.stall_seconds was renamed"):
        WatchdogConfig.model_validate({"stall_seconds": 700})


def _has_path(model: type[BaseModel], path: str) -> bool:
    head, _, rest = path.partition(".")
    field = model.model_fields.get(head)
    if field is None:
        return False
    if not rest:
        return True
    annotation = field.annotation
    return (
        isinstance(annotation, type)
        and issubclass(annotation, BaseModel)
        and _has_path(annotation, rest)
    )


def test_every_rename_points_at_a_key_that_exists_and_none_at_an_old_one() -> None:
    for old, new in RENAMED_KEYS.items():
        assert _has_path(ControllerConfig, new), f"{old} → {new}: {new} is not a config key"
        assert not _has_path(ControllerConfig, old), f"{old} is still a config key"


def test_recorded_settings_with_old_keys_are_moved_not_refused() -> None:
    settings = {
        "policy_router": {"enabled": True},
        "router": {"no_healthy_status": 410},
        "health_check_interval_s": 8,
        "watchdog": {"stall_seconds": 900},
        "rollout_failure": {"max_retries": 7},
    }
    config = ControllerConfig.from_recorded(settings)
    assert config.router.enabled is True and config.router.no_healthy_status == 410
    assert config.fleet_health.probe_interval_s == 8
    assert config.watchdog.stall_timeout_s == 900
    assert config.rollout_failure.max_infra_attempts == 7
    assert "policy_router" in settings  # the caller's mapping is not touched


# ── loading from files ───────────────────────────────────────────────────────


def test_loads_json_and_toml_files(tmp_path: Path) -> None:
    as_json = tmp_path / "controller.json"
    as_json.write_text(json.dumps({"watchdog": {"stall_action": "abort"}}))
    as_toml = tmp_path / "controller.toml"
    as_toml.write_text('[watchdog]\nstall_action = "abort"\n')
    assert ControllerConfig.from_file(as_json) == ControllerConfig.from_file(as_toml)
    assert ControllerConfig.from_file(as_toml).watchdog.stall_action == "abort"


def test_file_errors_name_the_file_and_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "controller.toml"
    bad.write_text("[fleet_health]\nprobe_timeout_s = 9\n")
    with pytest.raises(ConfigError, match=r"(?s)controller\.toml.*fleet_health\.probe_timeout_s"):
        ControllerConfig.from_file(bad)
    with pytest.raises(ConfigError, match=r"controller\.yaml.*use a \.json or \.toml"):
        ControllerConfig.from_file(tmp_path / "controller.yaml")
    with pytest.raises(ConfigError, match=r"missing\.json: cannot read"):
        ControllerConfig.from_file(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match=r"broken\.json: cannot read"):
        ControllerConfig.from_file(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    with pytest.raises(ConfigError, match=r"list\.json: .*top level"):
        ControllerConfig.from_file(listed)


# ── what the run records ─────────────────────────────────────────────────────


def _configured() -> ControllerConfig:
    return ControllerConfig.from_mapping(
        {
            "fleet_health": {
                "enabled": True,
                "probe_interval_s": 0.5,
                "probe_timeout_s": 0.25,
                "unhealthy_threshold": 4,
                "healthy_threshold": 1,
                "max_restart_attempts_per_shard": 2,
                "min_healthy_shards": 2,
                "restart_dead_shards": True,
            },
            "rollout_failure": {"on_data_exhausted": "skip", "max_skipped_prompts": 10},
            "timeouts": {"generation_timeout_s": 120.0},
            "watchdog": {"stall_action": "abort"},
            "refit": {"refit_timeout_s": 300.0},
            "router": {"enabled": True, "connect_timeout_s": 2, "backend_timeout_s": 60},
        }
    )


def test_fleet_config_takes_thresholds_from_fleet_health() -> None:
    config = _configured()
    fleet = config.fleet_config(
        shard_count=4, train_world_size=8, base_urls=URLS, workers_per_shard=2
    )
    assert (fleet.shard_count, fleet.train_world_size, fleet.workers_per_shard) == (4, 8, 2)
    assert fleet.base_urls == URLS
    assert fleet.unhealthy_threshold == 4
    assert fleet.healthy_threshold == 1
    assert fleet.max_restart_attempts_per_shard == 2
    assert fleet.min_healthy_shards == 2
    assert fleet.settings == config.model_dump(mode="json")


def test_fleet_config_refuses_a_floor_above_the_fleet() -> None:
    config = ControllerConfig.from_mapping({"fleet_health": {"min_healthy_shards": 3}})
    with pytest.raises(
        ValueError, match=r"fleet_health\.min_healthy_shards=3 exceeds shard_count=2"
    ):
        config.fleet_config(shard_count=2, train_world_size=1, base_urls=URLS[:2])


def test_fleet_config_refuses_a_base_url_count_that_does_not_match() -> None:
    with pytest.raises(ConfigError, match="base_urls has 3 entries for shard_count=4"):
        ControllerConfig().fleet_config(shard_count=4, train_world_size=1, base_urls=URLS[:3])


def test_settings_round_trip_through_a_real_ledger(sqlite_url: str) -> None:
    config = _configured()
    fleet = config.fleet_config(shard_count=4, train_world_size=8, base_urls=URLS)
    with EventLog.open(sqlite_url) as log:
        ledger = Ledger.start(log, "configured-run", fleet)
        assert ledger.view.config.unhealthy_threshold == 4
    # A different process reading the file later: only what the log holds counts.
    with EventLog.open(sqlite_url) as log:
        first = next(iter(log.read("configured-run", 0, 1)))
    assert isinstance(first.event, RunStarted)
    recorded = first.event.config
    assert recorded == fleet
    assert ControllerConfig.from_recorded(recorded.settings) == config
    assert ControllerConfig.from_recorded(recorded.settings) != ControllerConfig()


def test_the_fleet_configuration_refuses_in_one_line_naming_the_fix() -> None:
    """What an embedder hands ``fleet_config`` (its fleet's ``base_urls()``, its counts)
    is refused as a ``ConfigError`` — a ``FleetledgerError``, one line — never as
    pydantic's multi-line ``ValidationError``."""
    config = ControllerConfig()
    with pytest.raises(ConfigError) as no_url:
        config.fleet_config(shard_count=2, train_world_size=1, base_urls=["http://a/v1", None])
    assert isinstance(no_url.value, FleetledgerError)
    assert str(no_url.value).startswith("base_urls[1] is None: shard 1 has no address")
    assert "base_url()" in str(no_url.value) and "\n" not in str(no_url.value)
    with pytest.raises(ConfigError, match=r"base_urls has 1 entries for shard_count=2") as short:
        config.fleet_config(shard_count=2, train_world_size=1, base_urls=["http://a/v1"])
    assert "\n" not in str(short.value)
    with pytest.raises(ConfigError, match=r"train_world_size: Input should be greater"):
        config.fleet_config(shard_count=1, train_world_size=0, base_urls=["http://a/v1"])
    made = config.fleet_config(shard_count=1, train_world_size=1, base_urls=["ray://shard-0"])
    assert made.base_urls == ("ray://shard-0",)


def test_keys_set_from_code_are_validated_as_a_file_is_and_refused_in_one_line() -> None:
    base = ControllerConfig.from_mapping({"fleet_health": {"enabled": True}})
    changed = base.with_overrides({"fleet_health.probe_interval_s": 8.0, "refit.grace_s": 5.0})
    assert (changed.fleet_health.probe_interval_s, changed.refit.grace_s) == (8.0, 5.0)
    assert changed.fleet_health.enabled and base.fleet_health.probe_interval_s == 5.0
    refused = [
        ({"fleet_health.probe_interval_sec": 1.0}, "fleet_health.probe_interval_sec: no such"),
        ({"nosection.key": 1}, "nosection.key: no such configuration key"),
        # a combination the file would refuse: the timeout outlasts the interval
        ({"fleet_health.probe_timeout_s": 9.0}, "overrides, fleet_health: "),
        ({"refit.refit_timeout_s": "soon"}, "overrides, refit.refit_timeout_s: "),
    ]
    for overrides, said in refused:
        with pytest.raises(ConfigError) as caught:
            base.with_overrides(overrides)
        assert str(caught.value).startswith(said) and "\n" not in str(caught.value), caught.value
        assert isinstance(caught.value, FleetledgerError)
