"""``simnccl cost --scenario FILE``: the cost table for a scenario's own workload, one column per variant.

Why: a field failure mode ships as a scenario whose variants are the workarounds (``NCCL_NVLS_ENABLE=0``,
``dedupe``, ``lazy-init`` ...); comparing them side by side is the question ``cost`` answers for framework
startups. Each variant becomes a column with its own env, policy, release and profile; every ``--policy`` given
adds a column on the first variant's settings; ``--env`` applies to every column; ``--variant`` selects. The
scenario's faults are not injected (``cost`` prices the workload; ``simnccl run`` checks the expectations).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from simnccl.cli_options import OverrideError, check_env, check_json_target, env_overrides
from simnccl.cost import EXIT_BAD_INPUT, Column, CostError, check_policy, only_columns, report
from simnccl.policy.as_captured import replayed_as
from simnccl.scenario import Scenario, ScenarioError, load_scenario


def scenario_columns(
    scenario: Scenario,
    policies: Sequence[str] | None = None,
    env: dict[str, str] | None = None,
    only: Sequence[str] | None = None,
) -> list[Column]:
    """One column per variant (its env with ``env`` over it, policy, release, profile), then one per policy spec
    on the first variant's settings; ``only`` keeps the named columns."""
    extra = dict(env or {})
    columns = [
        Column(
            v.name,
            {**v.env, **extra},
            None if v.policy == "torch-default" else v.policy,
            v.release,
            v.profile,
        )
        for v in scenario.variants
    ]
    base = scenario.variants[0]
    for spec in policies or ():
        if any(c.name == spec for c in columns):
            continue
        check_policy(spec)
        try:  # a capture's steps (as-captured) are replayed, never decided again by another policy
            replayed = replayed_as(base.policy, spec)
        except ValueError as err:
            raise CostError(f"--policy: {err}") from None
        columns.append(Column(spec, {**base.env, **extra}, replayed, base.release, base.profile))
    columns = only_columns(columns, only)
    for column in columns:
        assert column.profile is not None
        check_env(column.profile, column.env)
    return columns


def _refuse_workload_flags(args: argparse.Namespace, extra: Sequence[str]) -> None:
    """What the scenario fixes itself (workload, GPU, release, world) cannot come from the command line."""
    for flag, given in (
        ("--workload", args.workload),
        ("--gpu", args.gpu),
        ("--release", args.release),
        ("--world", args.world),
        ("--gpus-per-node", args.gpus_per_node),
    ):
        if given is not None:
            raise CostError(
                f"{flag}: not with --scenario (the scenario file names its workload, cluster, GPU and release)"
            )
    if extra:
        raise CostError(f"unexpected argument {extra[0]!r}: framework knobs go with --workload, not --scenario")


def run_scenario(args: argparse.Namespace, extra: Sequence[str], out: Any) -> int:
    try:
        check_json_target(args.json)
        _refuse_workload_flags(args, extra)
        scenario = load_scenario(args.scenario)
        if scenario.recovery is not None:
            # its process groups are made by simnccl.recovery between segments: pricing the bare steps met
            # groups never created and printed 0 MiB per device, exit 0, as if that were the startup's cost
            raise CostError(
                f"{scenario.source}: recovery: a [recovery] scenario's groups are re-formed by simnccl.recovery, "
                "which cost does not run; its memory is in `simnccl run` (per segment and checkpoint)"
            )
        columns = scenario_columns(scenario, args.policy, env_overrides(args, scenario.extra_knobs), args.variant)
    except (CostError, OverrideError, ScenarioError) as err:
        out.error(str(err))
        return EXIT_BAD_INPUT
    cluster = scenario.cluster
    release = scenario.variants[0].release
    title = (
        f"simnccl cost: scenario {scenario.name} ({scenario.source}) on {cluster.world_size} x {cluster.gpu.key} "
        f"({cluster.nodes} node{'s' if cluster.nodes > 1 else ''} x {cluster.gpus_per_node}); "
        f"{len(columns)} column(s)"
    )
    if args.policy and len(scenario.variants) > 1:
        # a --policy column runs on the first variant's settings: said, as its env may not be the startup's own
        # (a file whose first variant is its legacy workaround tested the policy on legacy, with no word of it)
        base = scenario.variants[0]
        env = ", ".join(f"{k}={v}" for k, v in sorted(base.env.items())) or "no env"
        title += f"; --policy columns run on the settings of variant {base.name!r} ({env}, torch {base.release})"
    document = {
        "scenario": scenario.name,
        "source": scenario.source,
        "world": cluster.world_size,
        "gpu": cluster.gpu.key,
        "release": release,
    }
    return report(out, args, title, scenario.name, (scenario.programs, cluster, release, columns), document)
