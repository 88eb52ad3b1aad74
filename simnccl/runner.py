"""Run a scenario: every variant (or one) through the engine, then its expectations.

Why a separate module: the CLI, the tests and the real tier's ``compare`` all need "scenario in, result
out" without the CLI's printing or exit codes.

Verdicts are part of the truth a run tells: a variant that hangs or fails when no ``[[expect]]`` asks for that
verdict is a failed check, not a pass with a footnote (``allow`` opts out per verdict, as ``--allow`` does on
the command line). Every run is also written to the active ``RunJournal`` (if any), so an interrupted command
can still report what finished.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from simnccl import limits as input_limits
from simnccl.engine import Engine, Limits, SimConfig
from simnccl.expect import ALLOW_FLAG, check, unacted_faults, unexpected_verdict
from simnccl.interrupt_deferral import deferred_interrupt
from simnccl.policy import get_policy
from simnccl.recovery import run_recovery
from simnccl.release import get_release
from simnccl.result import ScenarioResult, VariantResult
from simnccl.scenario import Scenario, Variant


@dataclass(slots=True)
class RunJournal:
    """What a command has run so far: the scenarios it started (with their finished variants) and the one
    variant in progress, as ``(source, variant name)``; ``lines``: what a command that runs no scenario
    (``cost``) says finished and what was still running, one line each."""

    scenarios: list[ScenarioResult] = field(default_factory=list)
    running: tuple[str, str] | None = None
    lines: list[str] = field(default_factory=list)


_JOURNAL: contextvars.ContextVar[RunJournal | None] = contextvars.ContextVar("simnccl_run_journal", default=None)


@contextlib.contextmanager
def journal() -> Iterator[RunJournal]:
    """Record every ``run_scenario`` inside the block (``simnccl.cli_guard`` reports it after a Ctrl-C)."""
    record = RunJournal()
    token = _JOURNAL.set(record)
    try:
        yield record
    finally:
        _JOURNAL.reset(token)


# Which input limit (``simnccl/data/limits.toml``) sets which engine guard (``Limits`` field); ``max_ops`` has
# none: it bounds engine work, which no input size maps to one to one.
ENGINE_LIMITS_FROM_INPUT = {"wall_s": "max_wall_s", "max_sim_time_s": "max_sim_time_s"}


def limit_hint(error: Exception) -> str:
    """For an ``EngineGuardError``: the input limit that set the guard it passed, and how to raise it."""
    name = ENGINE_LIMITS_FROM_INPUT.get(getattr(error, "limit", ""))
    if name is None:
        return "too large a run"
    return f"{name} in {input_limits.DATA_FILE}; to raise it for one run, set {input_limits.ENV_PREFIX}{name.upper()}"


def current_journal() -> RunJournal | None:
    """The journal of the command running in this context (``simnccl.cli_guard``), if any."""
    return _JOURNAL.get()


def default_limits() -> Limits:
    """The engine's guards from the input limits (``simnccl/data/limits.toml`` and its overrides)."""
    chosen = input_limits.current()
    return Limits(**{guard: getattr(chosen, name) for guard, name in ENGINE_LIMITS_FROM_INPUT.items()})


def config_for(scenario: Scenario, variant: Variant, limits: Limits | None = None) -> SimConfig:
    return SimConfig(
        cluster=scenario.cluster,
        release=get_release(variant.release),
        profile=variant.profile,
        programs=scenario.programs,
        env=variant.env,
        launcher=scenario.launcher,
        seed=scenario.seed,
        limits=limits or default_limits(),
        policy=get_policy(variant.policy),
        faults=scenario.faults,
    )


def run_variant(
    scenario: Scenario,
    variant: Variant,
    *,
    keep_trace: bool = False,
    limits: Limits | None = None,
    allow: frozenset[str] = frozenset(),
    allow_flag: str = ALLOW_FLAG,
) -> VariantResult:
    """One variant through the engine, then its expectations. ``allow``: verdicts other than ``pass`` that
    are not a failure when no expectation asks for them (``--allow hang,error``); ``race`` in it: a pass a race
    decided is not a failure either (``expect.unexpected_verdict``); ``unacted`` in it: nor a scheduled fault that
    never acted (``expect.unacted_faults``). ``allow_flag``: the calling command's name for ``allow``, which the
    failed entries' remedies name."""
    try:
        config = config_for(scenario, variant, limits)
        if scenario.recovery is not None:  # a training loop run segment by segment by the recovery orchestrator
            outcome, explanations = run_recovery(scenario, config, keep_trace=keep_trace)
        else:
            engine = Engine(config, keep_trace=keep_trace)
            outcome, explanations = engine.run(), engine.explanations
    except Exception as err:  # a defect (bad input is caught at load): say where, for the bug report
        err.add_note(f"while simulating {scenario.source}, variant {variant.name!r}")
        raise
    result = VariantResult(
        name=variant.name,
        description=variant.description,
        release=variant.release,
        torch_version=get_release(variant.release).version,
        profile=variant.profile.name,
        env=dict(variant.env),
        policy=variant.policy,
        outcome=outcome,
        explanations=explanations,
    )
    swarm = scenario.fault_swarm
    if swarm is not None and len(scenario.faults.faults) == swarm.injected:
        # The seed's draw came up empty: the run is the fault-free one, which ``expect.unacted_faults`` then fails.
        outcome.faults_unacted.append(
            f"swarm seed={scenario.faults.seed}: drew no fault: never acted (its draw of 0..{swarm.max_faults} faults "
            f"from classes {','.join(scenario.faults.classes) or '-'} came up 0; try another --seed)"
        )
    mine = [e for e in scenario.expectations if variant.name in e.variants]
    for expectation in mine:
        result.expectations.extend(check(expectation, result))
    unexpected = unexpected_verdict(result, mine, allow, allow_flag)
    if unexpected is not None:
        result.expectations.append(unexpected)
    unacted = unacted_faults(result, allow, allow_flag)
    if unacted is not None:
        result.expectations.append(unacted)
    return result


def run_scenario(
    scenario: Scenario,
    variants: list[str] | None = None,
    *,
    keep_trace: bool = False,
    limits: Limits | None = None,
    on_variant: Callable[[VariantResult], None] | None = None,
    allow: frozenset[str] = frozenset(),
) -> ScenarioResult:
    """``on_variant`` is called with each variant's result as it finishes (the CLI streams its output)."""
    chosen = [scenario.variant(n) for n in variants] if variants else list(scenario.variants)
    result = ScenarioResult(
        scenario=scenario.name, source=scenario.source, seed=scenario.seed, variants=[], faults=scenario.faults
    )
    record = _JOURNAL.get()
    if record is not None:
        record.scenarios.append(result)
    for variant in chosen:
        if record is not None:
            record.running = (scenario.source, variant.name)
        finished = run_variant(scenario, variant, keep_trace=keep_trace, limits=limits, allow=allow)
        with deferred_interrupt():  # a variant the journal keeps is a variant reported (on_variant), or neither
            result.variants.append(finished)
            if record is not None:
                record.running = None
            if on_variant is not None:
                on_variant(finished)
    return result
