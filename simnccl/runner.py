"""Run a scenario: every variant (or one) through the engine, then its expectations.

Why a separate module: the CLI, the tests and the real tier's ``compare`` all need "scenario in, result
out" without the CLI's printing or exit codes.
"""

from __future__ import annotations

from collections.abc import Callable

from simnccl.engine import Engine, Limits, SimConfig
from simnccl.expect import check
from simnccl.policy import get_policy
from simnccl.recovery import run_recovery
from simnccl.release import get_release
from simnccl.result import ScenarioResult, VariantResult
from simnccl.scenario import Scenario, Variant


def config_for(scenario: Scenario, variant: Variant, limits: Limits | None = None) -> SimConfig:
    return SimConfig(
        cluster=scenario.cluster,
        release=get_release(variant.release),
        profile=variant.profile,
        programs=scenario.programs,
        env=variant.env,
        launcher=scenario.launcher,
        seed=scenario.seed,
        limits=limits or Limits(),
        policy=get_policy(variant.policy),
        faults=scenario.faults,
    )


def run_variant(
    scenario: Scenario, variant: Variant, *, keep_trace: bool = False, limits: Limits | None = None
) -> VariantResult:
    config = config_for(scenario, variant, limits)
    if scenario.recovery is not None:  # a training loop run segment by segment by the recovery orchestrator
        outcome, explanations = run_recovery(scenario, config, keep_trace=keep_trace)
    else:
        engine = Engine(config, keep_trace=keep_trace)
        outcome, explanations = engine.run(), engine.explanations
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
    for expectation in scenario.expectations:
        if variant.name in expectation.variants:
            result.expectations.extend(check(expectation, result))
    return result


def run_scenario(
    scenario: Scenario,
    variants: list[str] | None = None,
    *,
    keep_trace: bool = False,
    limits: Limits | None = None,
    on_variant: Callable[[VariantResult], None] | None = None,
) -> ScenarioResult:
    """``on_variant`` is called with each variant's result as it finishes (the CLI streams its output)."""
    chosen = [scenario.variant(n) for n in variants] if variants else list(scenario.variants)
    results = []
    for variant in chosen:
        results.append(run_variant(scenario, variant, keep_trace=keep_trace, limits=limits))
        if on_variant is not None:
            on_variant(results[-1])
    return ScenarioResult(scenario=scenario.name, source=scenario.source, seed=scenario.seed, variants=results)
