"""Scenario files: TOML in, a validated Scenario out, or an error naming the file, the key and the expectation.

Scenario files are untrusted input (DESIGN rule 9): parsed with ``tomllib``, every key checked against a
schema, nothing evaluated; every size is checked against ``simnccl.limits`` before anything is expanded, every
number is finite and in its range, and names used later (checkpoints, devices, env knobs) are checked here, so a
mistake is exit 2 up front rather than a surprise at the end of a simulation. Explicit workload steps expand
into one Program per rank; ranks whose expanded steps are identical share one Program object (DESIGN rule 8).

Schema (every table but ``[[variants]]`` and ``[[expect]]`` required unless marked optional)::

    [scenario]   name, description?, seed? (int), policy? ("torch-default")
    [cluster]    gpu, nodes?, gpus_per_node, ranks_per_node?
    [torch]      release, profile? (built-in name or path relative to the file), launcher? (torchrun|spawn), env?,
                 extra_env_knobs? (upper-case TORCH_*/PYTORCH_*/NCCL_* names newer than simnccl.env_knobs' list)
    [workload]   steps = [{op = "...", repeat?, on_ranks?, <op fields>}, ...]  |  generator = "...", args?
    [[variants]] name, description?, env?, release?, profile?, policy?
    [matrix]     release? = [...], policy? = [...], env? = {VAR = [...]}   (cartesian product, added to variants)
    [[expect]]   variants?, checkpoint?, baseline?, used_mib?, tolerance_pct?, tolerance_mib?, devices?,
                 verdict?, error_contains?, hang_ranks?, detected_at_s?, tolerance_s?, error_at_s?, fr_dump_ranks?,
                 committed_steps?, lost_steps?, replacement_devices?, fault_detected_at_s? (recovery runs)
    [faults]     inject? = [{kind, rank, at_op?, at_s?, factor?, peer?}], seed?, classes?, max_faults?
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simnccl.faults import (
    NO_FAULTS,
)
from simnccl.limits import InputLimits, exceeded, file_problem, nesting_depth
from simnccl.limits import current as current_limits
from simnccl.scenario.expectations import checkpoint_labels, read_expectations
from simnccl.scenario.fault_table import read_faults
from simnccl.scenario.model import LAUNCHERS, Scenario, ScenarioError, Variant
from simnccl.scenario.reader import Reader, brief
from simnccl.scenario.steps import read_programs
from simnccl.scenario.variants import (
    MatrixBase,
    check_env,
    matrix_variants,
    read_cluster,
    read_extra_knobs,
    read_policy,
    read_profile,
    read_release,
)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file: a regular file within the size limit, TOML within the nesting limit."""
    path = Path(path)
    source = str(path)
    limits = current_limits()
    problem = file_problem(path, limits.max_file_bytes)
    if problem is not None:
        raise ScenarioError(source, "", problem)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ScenarioError(source, "", f"cannot read: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ScenarioError(source, "", f"not UTF-8 text (TOML files are UTF-8): {err}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(source, "", f"malformed TOML: {err}") from None
    except ValueError as err:  # tomllib passes int()'s own error through (an integer of > 4300 digits)
        raise ScenarioError(source, "", f"malformed TOML: {err}") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise ScenarioError(
            source, "", "tables or arrays nested too deeply to parse: " + exceeded_depth(limits)
        ) from None
    try:
        return parse_scenario(data, source, base_dir=path.parent)
    except Exception as err:  # not ScenarioError: a defect; say which file made it, for the report
        if not isinstance(err, ScenarioError):
            err.add_note(f"while reading the scenario {source}")
        raise


def _check_captured_replays(source: str, policy: str, variants: list[Variant], listed: int) -> None:
    """Where the steps are a capture's (a policy ``as-captured(X)``, what ``simnccl capture --toml`` writes), every
    variant replays them so: a variant under another policy would decide X's decisions again
    (``simnccl.policy.as_captured.replayed_as``). ``listed``: how many variants came from ``[[variants]]`` (the
    rest are the matrix's)."""
    from simnccl.policy.as_captured import captured_policy, replayed_as

    captured = next((p for p in (policy, *(v.policy for v in variants)) if captured_policy(p) is not None), None)
    if captured is None:
        return
    for i, variant in enumerate(variants):
        try:
            replayed_as(captured, variant.policy)
        except ValueError as err:
            key = f"variants[{i}].policy" if i < listed else "matrix.policy"
            raise ScenarioError(source, key, f"variant {variant.name!r}: {err}") from None


def exceeded_depth(limits: InputLimits) -> str:
    return exceeded("max_nesting_depth", "the nesting", limits.max_nesting_depth)


def parse_scenario(data: Mapping[str, Any], source: str, base_dir: Path | None = None) -> Scenario:
    limits = current_limits()
    depth = nesting_depth(dict(data))
    if depth > limits.max_nesting_depth:
        raise ScenarioError(source, "", f"tables or arrays nested {depth} deep: " + exceeded_depth(limits))
    top = Reader(source, "", dict(data))
    meta = Reader(source, "scenario", top.get("scenario", dict))
    name = meta.label("name")
    description = meta.get("description", str, "")
    seed = meta.get("seed", int, 0)
    policy = read_policy(meta, "policy", "torch-default")
    meta.finish()

    cluster = read_cluster(Reader(source, "cluster", top.get("cluster", dict)), limits)
    torch = Reader(source, "torch", top.get("torch", dict))
    release = read_release(torch, "release")
    launcher = torch.get("launcher", str, "torchrun")
    if launcher not in LAUNCHERS:
        raise torch.error("launcher", f"expected one of {', '.join(LAUNCHERS)}, got {brief(launcher)}")
    extra_knobs = read_extra_knobs(torch)
    base_env = torch.env("env", extra_knobs)
    profile_ref = torch.get("profile", str, None)
    torch.finish()
    base_profile = read_profile(source, "torch.profile", profile_ref, cluster.gpu.key, release, base_dir)
    check_env(source, "torch.env", base_profile, base_env)

    workload = Reader(source, "workload", top.get("workload", dict))
    # [recovery] binds its own groups (``simnccl.recovery``: the replica and dp groups every restart makes)
    recovering = "recovery" in top.table
    if recovering:
        from simnccl.recovery.config import DP, REPLICA
    programs = read_programs(workload, cluster.world_size, limits, (REPLICA, DP) if recovering else ())
    workload.finish()

    raw_variants = top.get("variants", list, [], what="an array of tables [[variants]]")
    if len(raw_variants) > limits.max_variants:
        raise top.error("variants", exceeded("max_variants", f"{len(raw_variants)} variants", limits.max_variants))
    variants = []
    for i, raw in enumerate(raw_variants):
        reader = Reader(source, f"variants[{i}]", raw)
        v_name = reader.label("name")
        if any(v.name == v_name for v in variants):
            raise reader.error("name", f"duplicate variant name {brief(v_name)}")
        v_release = read_release(reader, "release", release)
        own_env = reader.env("env", extra_knobs)
        env = {**base_env, **own_env}
        v_profile_ref = reader.get("profile", str, None)
        if v_profile_ref is None and v_release == release:
            v_profile = base_profile
        else:
            v_profile = read_profile(
                source, f"variants[{i}].profile", v_profile_ref or profile_ref, cluster.gpu.key, v_release, base_dir
            )
        check_env(source, f"variants[{i}].env", v_profile, own_env)
        variants.append(
            Variant(
                v_name,
                reader.get("description", str, ""),
                v_release,
                v_profile,
                env,
                read_policy(reader, "policy", policy),
            )
        )
        reader.finish()
    if "matrix" in top.table:
        for variant in matrix_variants(
            Reader(source, "matrix", top.get("matrix", dict)),
            MatrixBase(release, policy, base_env, profile_ref, cluster, base_dir, extra_knobs),
            limits.max_variants - len(variants),
        ):
            if any(v.name == variant.name for v in variants):
                raise ScenarioError(source, "matrix", f"variant {brief(variant.name)} is also defined in [[variants]]")
            variants.append(variant)
    if not variants:
        variants.append(Variant("default", "", release, base_profile, base_env, policy))
    _check_captured_replays(source, policy, variants, len(raw_variants))

    recovery = top.get("recovery", dict, None, what="a table ([recovery])")
    checkpoints = checkpoint_labels(programs)
    expectations = read_expectations(top, source, [v.name for v in variants], checkpoints, cluster)
    faults, swarm = read_faults(top, source, programs, limits) if "faults" in top.table else (NO_FAULTS, None)
    top.finish()
    scenario = Scenario(
        name,
        description,
        source,
        seed,
        cluster,
        launcher,
        programs,
        tuple(variants),
        tuple(expectations),
        faults,
        recovery,
        swarm,
        tuple(extra_knobs),
    )
    if recovery is not None:
        # Validated here, before any simulation (the orchestrator reads it again when it runs).
        from simnccl.recovery import check_recovery

        check_recovery(scenario, limits)
    return scenario
