"""The controller's configuration: frozen pydantic models, every default inert.

Why it is shaped like this:

- **Every default is inert, but one.** A configuration with no keys at all builds, and
  means "nothing changes": fleet health off (no probe timer, no quarantine), the router
  off, every rollout deadline ``None`` (wait indefinitely), stalls only warned about, a
  data failure that exhausts its budget fails the run. The exception is the refit
  deadline (300 s + 60 s grace): an unbounded collective with a dead rank in it is the
  wedge this project exists to remove, so it is bounded unless someone says otherwise.
- **Combinations that would silently do nothing are rejected when the config is
  built**, not discovered in production: a probe timeout that does not fit inside the
  probe interval, a stall timeout the watchdog could never observe or that would fire
  before a deadline had its chance, ``on_data_exhausted="skip"`` with a skip budget of
  zero (it behaves exactly like ``"fail"`` while reading as if bad prompts were
  tolerated), a router status its clients retry (answering "no healthy backend" with a
  status the client retries spins forever — the very hang the router exists to prevent).
- **Renamed keys are refused with the new name** (:data:`RENAMED_KEYS`): with
  ``extra="forbid"`` an old key would be refused anyway, but "extra inputs are not
  permitted" does not say where the value went. Recorded settings of an old run are the
  exception: :meth:`ControllerConfig.from_recorded` moves renamed keys instead, because a
  replay must read the log it has.
- **Errors name the field by its dotted path** (``fleet_health.probe_timeout_s``) and
  say what to change.

The part of this configuration that the folds use (thresholds, fleet shape) goes into
:class:`~fleetledger.events.models.FleetConfig`, recorded in ``run_started``; the whole
of it travels in ``FleetConfig.settings`` so a replay has every value the run had
(:meth:`ControllerConfig.fleet_config`).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fleetledger.errors import FleetledgerError
from fleetledger.events.models import FleetConfig

Seconds = Annotated[float, Field(gt=0, description="A duration in seconds, > 0.")]
NonNegativeSeconds = Annotated[float, Field(ge=0, description="A duration in seconds, >= 0.")]

# Old dotted key → new dotted key. This is the table future renames go into: add a row
# whenever a key moves, never delete one, so a stale config file keeps getting a message
# that says where its value went (and a recorded run keeps replaying, see
# ``ControllerConfig.from_recorded``). A key is only looked for in the section its old
# path names.
RENAMED_KEYS: dict[str, str] = {
    "health_check_interval_s": "fleet_health.probe_interval_s",
    "health_check_timeout_s": "fleet_health.probe_timeout_s",
    "stall_seconds": "watchdog.stall_timeout_s",
    "watchdog.stall_seconds": "watchdog.stall_timeout_s",
    "rollout_failure.max_retries": "rollout_failure.max_infra_attempts",
    "policy_router": "router",
}

# Statuses the rollout client retries (docs/reference.md §7); for the rate-limit subset
# it even raises its own retry ceiling per attempt. The router's "no healthy backend"
# answer must be none of them, or a fleet with no serving shard wedges its clients forever.
CLIENT_RETRIED_STATUSES: frozenset[int] = frozenset({429, 500, 502, 503, 504, 520})


class ConfigError(FleetledgerError, ValueError):
    """A configuration file could not be read or does not validate; names the file."""


def _renamed_under(prefix: str, data: Mapping[str, Any]) -> list[str]:
    """Messages for every renamed key present directly in the section at ``prefix``."""
    found = []
    for old, new in RENAMED_KEYS.items():
        if not old.startswith(prefix):
            continue
        key = old[len(prefix) :]
        if "." not in key and key in data:
            found.append(f"{old} was renamed to {new}; move its value there")
    return found


class _Section(BaseModel):
    """Base of every section: frozen, unknown keys refused, renamed keys named."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # Dotted prefix of this section's keys ("" for the top level): errors and the rename
    # table speak in full dotted paths so a message points at one line of a config file.
    PREFIX: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _refuse_renamed_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            renamed = _renamed_under(cls.PREFIX, data)
            if renamed:
                raise ValueError("; ".join(renamed))
        return data

    @classmethod
    def _key(cls, name: str) -> str:
        return f"{cls.PREFIX}{name}"


class FleetHealthConfig(_Section):
    """Probing and quarantine. Off by default: a default run gains no timer and never
    takes a shard out of traffic. The thresholds are recorded in ``run_started`` either
    way, because adapter-reported failures are folded with them too."""

    PREFIX: ClassVar[str] = "fleet_health."

    enabled: bool = False
    probe_interval_s: Seconds = 5.0
    probe_timeout_s: Seconds = 2.0
    unhealthy_threshold: int = Field(default=3, ge=1)
    healthy_threshold: int = Field(default=2, ge=1)
    max_restart_attempts_per_shard: int = Field(default=5, ge=0)
    min_healthy_shards: int = Field(default=1, ge=1)
    restart_dead_shards: bool = False
    # A deep probe asks the engine for one token: a wedged engine core still answers a
    # liveness probe (and /health) while every completion hangs, so only a probe that
    # generates — or the adapters' reported streak — can condemn it.
    deep_probe: bool = False

    @model_validator(mode="after")
    def _coherent(self) -> FleetHealthConfig:
        if self.probe_timeout_s >= self.probe_interval_s:
            # Probes of one round run concurrently, so a round costs one timeout; a
            # timeout that does not fit inside the interval makes rounds overlap and the
            # configured interval decorative.
            raise ValueError(
                f"{self._key('probe_timeout_s')}={self.probe_timeout_s} must be less than "
                f"{self._key('probe_interval_s')}={self.probe_interval_s}: a probe round must "
                "finish inside its interval; lower the timeout or raise the interval"
            )
        if self.restart_dead_shards and not self.enabled:
            raise ValueError(
                f"{self._key('restart_dead_shards')}=true has no effect while "
                f"{self._key('enabled')}=false (nothing detects a dead shard to restart); "
                "enable fleet health or drop restart_dead_shards"
            )
        if self.deep_probe and not self.enabled:
            raise ValueError(
                f"{self._key('deep_probe')}=true has no effect while "
                f"{self._key('enabled')}=false (nothing probes); enable fleet health or drop "
                "deep_probe"
            )
        if self.restart_dead_shards and self.max_restart_attempts_per_shard == 0:
            raise ValueError(
                f"{self._key('restart_dead_shards')}=true with "
                f"{self._key('max_restart_attempts_per_shard')}=0 retires every dead shard "
                "instead of restarting it; allow at least 1 attempt or drop restart_dead_shards"
            )
        return self


class RolloutFailureConfig(_Section):
    """Retry budgets per prompt. Infra failures retry elsewhere with capped exponential
    backoff; data failures are deterministic, so they get a small budget and no backoff."""

    PREFIX: ClassVar[str] = "rollout_failure."

    max_infra_attempts: int = Field(default=5, ge=1)
    max_data_attempts: int = Field(default=2, ge=1)
    backoff_base_s: NonNegativeSeconds = 1.0
    max_backoff_s: NonNegativeSeconds = 30.0
    on_data_exhausted: Literal["fail", "skip"] = "fail"
    max_skipped_prompts: int = Field(
        default=0, ge=0, description="Run-wide skip budget (only with on_data_exhausted=skip)."
    )
    max_consecutive_dropped_prompts: int = Field(
        default=0,
        ge=0,
        description="Drop a prompt whose infrastructure budget ran out, while fewer than this "
        "many in a row were dropped; 0 = never drop (the run fails).",
    )
    backoff_jitter: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Fraction of each backoff drawn at random, so failures that happened "
        "together do not retry together.",
    )

    @model_validator(mode="after")
    def _coherent(self) -> RolloutFailureConfig:
        if self.max_backoff_s < self.backoff_base_s:
            raise ValueError(
                f"{self._key('max_backoff_s')}={self.max_backoff_s} must be at least "
                f"{self._key('backoff_base_s')}={self.backoff_base_s}: the cap would undercut "
                "the first backoff; raise max_backoff_s or lower backoff_base_s"
            )
        if self.on_data_exhausted == "skip" and self.max_skipped_prompts == 0:
            raise ValueError(
                f"{self._key('on_data_exhausted')}='skip' with "
                f"{self._key('max_skipped_prompts')}=0 behaves exactly like 'fail' while "
                "reading as if bad prompts were tolerated; set max_skipped_prompts > 0 "
                "or on_data_exhausted='fail'"
            )
        if self.on_data_exhausted == "fail" and self.max_skipped_prompts > 0:
            raise ValueError(
                f"{self._key('max_skipped_prompts')}={self.max_skipped_prompts} has no effect "
                f"with {self._key('on_data_exhausted')}='fail' (no prompt is ever skipped); "
                "set on_data_exhausted='skip' to tolerate bad prompts, or max_skipped_prompts=0"
            )
        return self


class TimeoutsConfig(_Section):
    """Deadlines of one rollout. ``None`` (the default) waits indefinitely, so a run that
    configures none behaves as it did before they existed."""

    PREFIX: ClassVar[str] = "timeouts."

    rollout_timeout_s: Seconds | None = None
    generation_timeout_s: Seconds | None = None
    env_timeout_s: Seconds | None = None


class WatchdogConfig(_Section):
    """Stall detection: work remains and (committed groups, train steps) has not moved for
    ``stall_timeout_s``. On by default because it only observes: with ``stall_action``
    ``warn`` (the default) a stall is recorded — what makes a wedged run explainable —
    and the run carries on."""

    PREFIX: ClassVar[str] = "watchdog."

    enabled: bool = True
    interval_s: Seconds = 30.0
    stall_timeout_s: Seconds = 600.0
    stall_action: Literal["warn", "abort"] = "warn"

    @model_validator(mode="after")
    def _coherent(self) -> WatchdogConfig:
        if self.stall_timeout_s <= self.interval_s:
            raise ValueError(
                f"{self._key('stall_timeout_s')}={self.stall_timeout_s} must be greater than "
                f"{self._key('interval_s')}={self.interval_s}: the watchdog only looks every "
                "interval, so it could not tell a stall from one slow tick; raise "
                "stall_timeout_s or lower interval_s"
            )
        return self


class RefitConfig(_Section):
    """Bound on one refit. The grace lets the workers' own, attributable error win the race
    against our "refit never came back".

    On by default — the one deadline that is: a collective that includes a dead or frozen
    rank otherwise blocks forever while every process looks healthy, and that wedge is
    what this project exists to remove. 300 s fits a push of a large model over a slow
    fabric and stays inside the default stall timeout with its grace (360 < 600); size it
    for the model. ``None`` keeps a refit unbounded, explicitly: the coordinator waits for
    the push without a bound, the collectives' op timeout and the transport's settle
    window (which follow this timeout) are unbounded too.

    The bound is the last resort, not the usual way out: a push is aborted as soon as the
    ledger records one of its participants dead (the refit coordinator watches it while
    it waits), bounded or not — so a SIGKILL mid-push costs the time to record the death,
    not ``refit_timeout_s``."""

    PREFIX: ClassVar[str] = "refit."

    refit_timeout_s: Seconds | None = 300.0
    grace_s: NonNegativeSeconds = 60.0

    @property
    def bound_s(self) -> float | None:
        """How long a refit may take before it is aborted (timeout + grace), or ``None``."""
        return None if self.refit_timeout_s is None else self.refit_timeout_s + self.grace_s


class RouterConfig(_Section):
    """The one stable URL in front of the engines. Off by default.

    The timeouts may be left unset in a config file; the router then uses bounded
    defaults (:attr:`connect_bound_s`, :attr:`backend_bound_s`), because an unbounded
    backend call is the reference client's hang: it retried a refused connection in an
    uncapped loop with no HTTP timeout, and a dead engine kept ~1/N of the rollouts.
    """

    PREFIX: ClassVar[str] = "router."

    DEFAULT_CONNECT_TIMEOUT_S: ClassVar[float] = 5.0
    DEFAULT_BACKEND_TIMEOUT_S: ClassVar[float] = 300.0

    enabled: bool = False
    # The defaults are written here, where a reader of the configuration sees them; a
    # ``null`` in a file means the same default (never an unbounded call).
    connect_timeout_s: Seconds | None = DEFAULT_CONNECT_TIMEOUT_S
    backend_timeout_s: Seconds | None = DEFAULT_BACKEND_TIMEOUT_S
    no_healthy_status: int = Field(default=409, ge=400, le=599)

    @property
    def backend_bound_s(self) -> float:
        """The bound on one backend call, whole body included (default 300 s)."""
        if self.backend_timeout_s is not None:
            return self.backend_timeout_s
        return self.DEFAULT_BACKEND_TIMEOUT_S

    @property
    def _connect_set(self) -> bool:
        return "connect_timeout_s" in self.model_fields_set and self.connect_timeout_s is not None

    @property
    def connect_bound_s(self) -> float:
        """The bound on connecting to a backend (default 5 s, or the backend bound if
        that is shorter: connecting is part of the backend call)."""
        if self._connect_set:
            return self.connect_timeout_s  # type: ignore[return-value]
        return min(self.DEFAULT_CONNECT_TIMEOUT_S, self.backend_bound_s)

    @model_validator(mode="after")
    def _coherent(self) -> RouterConfig:
        if self.no_healthy_status in CLIENT_RETRIED_STATUSES:
            raise ValueError(
                f"{self._key('no_healthy_status')}={self.no_healthy_status} is a status the "
                f"router's clients retry ({sorted(CLIENT_RETRIED_STATUSES)}): with no serving "
                "shard they would retry forever; use a non-retried 4xx such as 409"
            )
        if self._connect_set and self.connect_bound_s > self.backend_bound_s:
            backend = (
                f"{self._key('backend_timeout_s')}={self.backend_timeout_s}"
                if "backend_timeout_s" in self.model_fields_set
                and self.backend_timeout_s is not None
                else f"the default {self._key('backend_timeout_s')} of {self.backend_bound_s:g}"
            )
            raise ValueError(
                f"{self._key('connect_timeout_s')}={self.connect_timeout_s} must not exceed "
                f"{backend}: connecting is "
                "part of the backend call; lower connect_timeout_s or raise backend_timeout_s"
            )
        return self


class ControllerConfig(_Section):
    """Everything the controller is told, in sections. ``ControllerConfig()`` is valid and
    changes nothing."""

    fleet_health: FleetHealthConfig = FleetHealthConfig()
    rollout_failure: RolloutFailureConfig = RolloutFailureConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    watchdog: WatchdogConfig = WatchdogConfig()
    refit: RefitConfig = RefitConfig()
    router: RouterConfig = RouterConfig()

    @model_validator(mode="after")
    def _backend_call_inside_the_generation_deadline(self) -> ControllerConfig:
        # A router call that outlives the generation's deadline is abandoned by the
        # rollout while the router still waits on the engine: the deadline fires, the
        # rollout is re-dispatched, and the first call keeps the engine busy.
        if not self.router.enabled:
            return self
        for name in ("generation_timeout_s", "rollout_timeout_s"):
            deadline = getattr(self.timeouts, name)
            if deadline is None:
                continue
            if self.router.backend_bound_s > deadline:
                raise ValueError(
                    f"router.backend_timeout_s={self.router.backend_bound_s:g} is longer than "
                    f"timeouts.{name}={deadline:g}: a backend call would outlive the "
                    "rollout's deadline; lower router.backend_timeout_s to at most it"
                )
            break  # the innermost deadline set is the one a backend call must fit
        return self

    @model_validator(mode="after")
    def _stall_outlasts_every_deadline(self) -> ControllerConfig:
        # A stall declared before a deadline fires pre-empts the deadline's own, more
        # specific error (and, with abort, the refit recovery the deadline triggers).
        # Only checked while the watchdog runs: a disabled watchdog's timeout is unused.
        if not self.watchdog.enabled:
            return self
        stall = self.watchdog.stall_timeout_s
        deadlines: dict[str, float | None] = {
            "timeouts.rollout_timeout_s": self.timeouts.rollout_timeout_s,
            "timeouts.generation_timeout_s": self.timeouts.generation_timeout_s,
            "timeouts.env_timeout_s": self.timeouts.env_timeout_s,
            "refit.refit_timeout_s + refit.grace_s": self.refit.bound_s,
        }
        too_long = [
            f"{name}={value:g}"
            for name, value in deadlines.items()
            if value is not None and value >= stall
        ]
        if too_long:
            raise ValueError(
                f"watchdog.stall_timeout_s={stall:g} must be greater than every deadline that "
                f"is set, but {', '.join(too_long)}: the stall would be declared before the "
                "deadline could fire; raise watchdog.stall_timeout_s or shorten the deadline"
            )
        return self

    # ── loading ─────────────────────────────────────────────────────────────

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ControllerConfig:
        """Validate a plain mapping (parsed JSON/TOML, a CLI's overrides)."""
        return cls.model_validate(dict(data))

    @classmethod
    def from_file(cls, path: str | Path) -> ControllerConfig:
        """Read a ``.json`` or ``.toml`` file; errors name the file and the field."""
        path = Path(path)
        if path.suffix not in (".json", ".toml"):
            raise ConfigError(
                f"{path}: unsupported configuration format {path.suffix!r}; "
                "use a .json or .toml file"
            )
        try:
            text = path.read_text(encoding="utf-8")
            data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"{path}: cannot read configuration: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the configuration must be a table/object at top level")
        try:
            return cls.from_mapping(data)
        except ValidationError as exc:
            raise ConfigError(f"{path}: {exc}") from exc

    def with_overrides(self, overrides: Mapping[str, Any]) -> ControllerConfig:
        """This configuration with keys set from code, by their dotted names
        (``{"fleet_health.probe_interval_s": 1.0}``), validated whole as a file is — so a
        combination the file would refuse is refused here too. A key that does not exist
        or a value refused is one :class:`ConfigError` naming the key.

        Story: ``model_copy(update=…)`` skips validation (a probe timeout longer than
        its interval went through), and a nested section has to be copied by hand.
        """
        data = self.model_dump(mode="json")
        for dotted, value in overrides.items():
            section, _, key = dotted.partition(".")
            table = data.get(section)
            if not isinstance(table, dict) or key not in table:
                raise ConfigError(
                    f"{dotted}: no such configuration key (a key is section.name, e.g. "
                    "fleet_health.probe_interval_s; the keys are in docs/controller.md)"
                )
            table[key] = value
        try:
            return self.from_mapping(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or ", ".join(overrides)
            raise ConfigError(f"overrides, {where}: {first['msg']}") from None

    @classmethod
    def from_recorded(cls, settings: Mapping[str, Any]) -> ControllerConfig:
        """The configuration a run recorded (``FleetConfig.settings``), renamed keys moved.

        Unlike a config file, a recorded run cannot be edited, so keys renamed since it
        was recorded are moved to their new place instead of refused.
        """
        return cls.model_validate(_move_renamed(settings))

    # ── what the run records ────────────────────────────────────────────────

    def fleet_config(
        self,
        *,
        shard_count: int,
        train_world_size: int,
        base_urls: Sequence[str],
        workers_per_shard: int = 1,
    ) -> FleetConfig:
        """The :class:`FleetConfig` recorded in ``run_started``.

        The thresholds come from ``fleet_health``; the whole configuration is dumped into
        ``settings`` so a replay has every value the run had, not today's defaults.
        Every refusal is a one-line :class:`ConfigError` naming what to fix (a
        ``FleetledgerError``, so the documented ``except`` catches it).
        """
        health = self.fleet_health
        if health.min_healthy_shards > shard_count:
            raise ConfigError(
                f"fleet_health.min_healthy_shards={health.min_healthy_shards} exceeds "
                f"shard_count={shard_count}: the fleet would be exhausted before it starts; "
                "lower min_healthy_shards or add shards"
            )
        urls = tuple(base_urls)
        for shard, url in enumerate(urls):
            if not isinstance(url, str) or not url:
                # Story: an engine without base_url() answered None through
                # fleet.base_urls(), and the run failed to start with pydantic's error.
                raise ConfigError(
                    f"base_urls[{shard}] is {url!r}: shard {shard} has no address to record; "
                    "give its engine a base_url() (its OpenAI-compatible .../v1, or "
                    f"ray://<actor name> when it serves no HTTP)"
                )
        try:
            return FleetConfig(
                shard_count=shard_count,
                workers_per_shard=workers_per_shard,
                train_world_size=train_world_size,
                unhealthy_threshold=health.unhealthy_threshold,
                healthy_threshold=health.healthy_threshold,
                max_restart_attempts_per_shard=health.max_restart_attempts_per_shard,
                min_healthy_shards=health.min_healthy_shards,
                base_urls=urls,
                settings=self.model_dump(mode="json"),
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "fleet"
            raise ConfigError(f"fleet configuration, {where}: {first['msg']}") from None


def _move_renamed(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``settings`` with every key of :data:`RENAMED_KEYS` at its new path.

    A value already at the new path wins over the old one (it is the newer of the two).
    """
    data: dict[str, Any] = json.loads(json.dumps(dict(settings)))

    def pop(path: str) -> tuple[bool, Any]:
        *parents, leaf = path.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            return True, node.pop(leaf)
        return False, None

    def put(path: str, value: Any) -> None:
        *parents, leaf = path.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        current = node.get(leaf)
        if isinstance(current, dict) and isinstance(value, dict):
            node[leaf] = {**value, **current}  # a renamed section merges; newer keys win
        else:
            node.setdefault(leaf, value)

    # Longest old paths first, so a nested rename moves before a whole section does.
    for old in sorted(RENAMED_KEYS, key=lambda k: -k.count(".")):
        present, value = pop(old)
        if present:
            put(RENAMED_KEYS[old], value)
    return data
