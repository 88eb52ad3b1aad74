"""One cell of a sweep: what it computes (``Cell``, plain data that pickles to any worker), the cells a matrix
expands into, and ``run_cell``, the function every executor calls (in this process, a pool worker or a Dask
worker) and that turns whatever happens into one row.

Why a row for every outcome: a sweep of thousands of cells must not stop at the first surprise, and its exit
code must say what kind of surprise it was. A check that fails is a finding (``fail``); a cell stopped by its
wall-clock limit or the engine's guard is ``stopped``; any other exception is a bug in simnccl or in a
user's policy (``crash``, with its traceback in ``error``): reported in its row, never raised.
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from simnccl import __version__
from simnccl.cost import POLICY_DEFECTS, Column, build_cluster, column_config, measure, summarise
from simnccl.engine import Engine, EngineGuardError, Limits, RunOutcome
from simnccl.engine.outcome import pass_decided_by_race
from simnccl.expect import ACCEPTS_RACES, ACCEPTS_UNACTED
from simnccl.memory import distinct_figures
from simnccl.ops import Program
from simnccl.policy.as_captured import replayed_as
from simnccl.policy.plans import PolicyError
from simnccl.policy.sources import loaded_sources, sources_digest
from simnccl.policy.specs import get_policy
from simnccl.runner import default_limits, run_variant
from simnccl.scenario import Scenario
from simnccl.sweep.deadline import CellTimeout, call_with_deadline
from simnccl.sweep.matrix import DEFAULT_POLICY, Checks, Matrix, digest, scenario_key
from simnccl.sweep.store import FIELDS, FIGURES, Row
from simnccl.workloads import GENERATORS

WORKLOAD, SCENARIO = "workload", "scenario"


@dataclass(frozen=True, slots=True)
class Cell:
    """Everything one simulation needs, as plain values (a scenario cell also carries its parsed Scenario)."""

    index: int
    kind: str
    label: str
    gpu: str
    release: str
    policy: str
    env: Mapping[str, str]
    checks: Checks
    generator: str = ""
    knobs: Mapping[str, Any] = field(default_factory=dict)
    world: int = 0
    gpus_per_node: int = 0
    scenario: str = ""
    scenario_sha256: str = ""
    variant: str = ""
    policy_source: str = ""  # a user policy's source digest (``policy.sources``); "" for simnccl's own
    payload: Scenario | None = field(default=None, compare=False, repr=False)

    def identity(self) -> dict[str, Any]:
        """What the cell computes (not where it sits in the matrix): the input of ``cell_id``."""
        return {
            "kind": self.kind,
            "generator": self.generator,
            "knobs": dict(self.knobs),
            "world": self.world,
            "gpus_per_node": self.gpus_per_node,
            "scenario": scenario_key(self.scenario),  # its content: the sha256
            "scenario_sha256": self.scenario_sha256,
            "variant": self.variant,
            "gpu": self.gpu,
            "release": self.release,
            "policy": self.policy,
            "env": dict(sorted(self.env.items())),
            "checks": self.checks.to_dict(),
            # the model and the built-in policies are simnccl's: resumed across an upgrade, a cell runs again (a
            # row of another version was kept and relabelled with this one, found by a tester)
            "simnccl": __version__,
            # only where there is one: the cells of simnccl's own policies keep the ids they always had
            **({"policy_source": self.policy_source} if self.policy_source else {}),
        }

    @property
    def cell_id(self) -> str:
        return digest(self.identity())


def expand(matrix: Matrix) -> Iterator[Cell]:
    """The cells, in a fixed order: workloads x policies x releases x GPUs x env sets, then each scenario's
    variants x policies x env sets. Call only after the matrix has been validated and counted."""
    index = 0
    for workload in matrix.workloads:
        for policy in matrix.policies or (DEFAULT_POLICY,):
            for release in matrix.releases:
                for gpu in matrix.gpus:
                    for env_set in matrix.env_sets:
                        yield Cell(
                            index=index,
                            kind=WORKLOAD,
                            label=workload.label,
                            gpu=gpu,
                            release=release,
                            policy=policy,
                            env={**matrix.env, **env_set},
                            checks=matrix.checks,
                            policy_source=sources_digest(matrix.policy_sources.get(policy, {})),
                            generator=workload.generator,
                            knobs=workload.knobs,
                            world=workload.world,
                            gpus_per_node=matrix.gpus_per_node,
                        )
                        index += 1
    for entry in matrix.scenarios:
        scenario = entry.scenario
        for name in entry.variants:
            variant = scenario.variant(name)
            for policy in matrix.policies or (variant.policy,):
                for env_set in matrix.env_sets:
                    yield Cell(
                        index=index,
                        kind=SCENARIO,
                        label=f"{scenario.name}:{name}",
                        gpu=scenario.cluster.gpu.key,
                        release=variant.release,
                        policy=replayed_as(variant.policy, policy),  # a capture's own policy: its replay
                        env={**variant.env, **matrix.env, **env_set},
                        checks=matrix.checks,
                        policy_source=sources_digest(matrix.policy_sources.get(policy, {})),
                        world=len(scenario.programs),
                        gpus_per_node=scenario.cluster.gpus_per_node,
                        scenario=entry.path,
                        scenario_sha256=entry.sha256,
                        variant=name,
                        payload=scenario,
                    )
                    index += 1


# ---------------------------------------------------------------------------------------------- running


@lru_cache(maxsize=8)
def _programs(generator: str, knobs_json: str, world: int) -> tuple[Program, ...]:
    """A worker runs one config under many policies: its Programs are generated once per process."""
    return GENERATORS[generator](json.loads(knobs_json), world)


def _simulate_workload(cell: Cell, limits: Limits) -> tuple[RunOutcome, tuple[Program, ...], list[str]]:
    programs = _programs(cell.generator, json.dumps(dict(cell.knobs), sort_keys=True), cell.world)
    cluster = build_cluster(cell.gpu, cell.world, cell.gpus_per_node)
    column = Column(cell.policy, dict(cell.env), None if cell.policy == DEFAULT_POLICY else cell.policy)
    config = replace(column_config(programs, cluster, cell.release, column), limits=limits)
    outcome = Engine(config).run()
    return outcome, programs, verdict_failures(outcome, cell.checks)


def verdict_failures(outcome: RunOutcome, checks: Checks) -> list[str]:
    """What a workload cell's verdict fails of ``checks``: a verdict not accepted, a defect of the cell's policy
    (``cost.POLICY_DEFECTS``: under ``--accept-verdict error`` too, as ``cost`` fails it whatever torch's default
    does: accepting torch's errors as findings must not accept a policy that breaks production), or a pass a race
    decided (``pass_decided_by_race``) where ``race`` is not accepted."""
    if outcome.verdict not in checks.verdicts:
        return [f"verdict {outcome.verdict}{_why(outcome)}"]
    defect = next((e for e in outcome.errors if e["type"] in POLICY_DEFECTS), None)
    if defect is not None:
        return [f"a defect of the policy: {POLICY_DEFECTS[defect['type']]} (rank {defect['rank']})"]
    raced = pass_decided_by_race(outcome)
    return [] if raced is None or ACCEPTS_RACES in checks.verdicts else [f"verdict pass {raced}"]


def _simulate_scenario(cell: Cell, limits: Limits) -> tuple[RunOutcome, tuple[Program, ...], list[str]]:
    scenario = cell.payload
    assert scenario is not None, "a scenario cell carries its Scenario"
    variant = replace(scenario.variant(cell.variant), policy=cell.policy, env=dict(cell.env))
    allow = frozenset({ACCEPTS_RACES, ACCEPTS_UNACTED}) & frozenset(cell.checks.verdicts)
    result = run_variant(scenario, variant, limits=limits, allow=allow, allow_flag="--accept-verdict")
    failed = [f"{e.key}: {e.message}" for e in result.expectations if not e.ok]
    return result.outcome, scenario.programs, failed


def _why(outcome: RunOutcome) -> str:
    if outcome.errors:
        first = outcome.errors[0]
        line = next(iter(str(first["message"]).splitlines()), "")  # empty for a bare ``assert``
        return f" (rank {first['rank']}: {first['type']}" + (f": {line})" if line else ")")
    if outcome.hangs:
        first = outcome.hangs[0]
        return f" (rank {first['rank']} hangs in {first['op']})"
    return ""


def blank_row(cell: Cell) -> Row:
    row: Row = dict.fromkeys(FIELDS)
    row.update(
        index=cell.index,
        cell_id=cell.cell_id,
        kind=cell.kind,
        workload=cell.label,
        generator=cell.generator,
        knobs=dict(cell.knobs),
        world=cell.world,
        scenario=cell.scenario,
        variant=cell.variant,
        gpu=cell.gpu,
        release=cell.release,
        policy=cell.policy,
        env=dict(sorted(cell.env.items())),
        verdict="",
        check="",
        checkpoint="",
        trace_hash="",
        error="",
        worker=f"{socket.gethostname()}:{os.getpid()}",
    )
    return row


class PolicyCodeMismatch(Exception):
    """The process running a cell does not run the user's policy code the sweep was planned with: another file
    (a worker in another folder), an edited file its process imported before the edit (a Dask worker kept between
    sweeps), or a module it cannot import. A missing prerequisite of that worker (exit 2), not a result: its rows
    would be the other code's under this cell's identity (found by a tester: a stale worker passed an edited
    policy that fails locally)."""


def _check_policy_code(cell: Cell) -> None:
    """``PolicyCodeMismatch`` unless this process loads the policy the cell names, from the files it was planned
    with (``Cell.policy_source``), as they were when it imported them (``policy.sources.loaded_sources``)."""
    try:
        get_policy(cell.policy)
    except PolicyError as err:
        raise PolicyCodeMismatch(f"the policy {cell.policy!r} does not load here: {err}") from None
    sources, stale = loaded_sources(cell.policy)
    here = sources_digest(sources)
    if here != cell.policy_source:
        raise PolicyCodeMismatch(
            f"the policy {cell.policy!r} has other source files here (digest {here or 'none'}) than where the "
            f"sweep was planned ({cell.policy_source}): every worker needs the same policy files"
        )
    if stale:
        raise PolicyCodeMismatch(
            f"the policy {cell.policy!r}: {', '.join(stale)} changed after this process ({socket.gethostname()}, "
            f"pid {os.getpid()}) imported it, and the old code is what runs here; restart it (Dask: the workers)"
        )


def run_cell(cell: Cell, timeout_s: float) -> Row:
    """Simulate one cell under a wall-clock limit of ``timeout_s``; every outcome is a row, nothing raises."""
    row = blank_row(cell)
    simulate = _simulate_workload if cell.kind == WORKLOAD else _simulate_scenario
    # The engine's own guards as every command sets them (the input limits, SIMNCCL_LIMIT_* included: a sweep
    # kept the default max_sim_time_s whatever the user set), the cell's timeout as its wall clock, and the
    # deadline for whatever runs outside the engine
    limits = replace(default_limits(), wall_s=timeout_s)
    start = time.monotonic()

    def checked_simulation() -> tuple[RunOutcome, tuple[Program, ...], list[str]]:
        if cell.policy_source:  # under the cell's deadline too: it may import the user's module
            _check_policy_code(cell)
        return simulate(cell, limits)

    try:
        outcome, programs, failed = call_with_deadline(checked_simulation, timeout_s)
        per_rank, checkpoint = measure(outcome, programs)
        for key in FIGURES:
            values = per_rank.get(key)
            if values:
                row[key] = summarise(values)[0]  # the typical value, of figures rounded to 0.1 MiB
                # the extremes exact (to the byte): rounded, a peak of 2,719.889 MiB was "2,719.9" beside a cap of
                # 2,719.89 it passed, and --resume refused the sweep's own file as edited
                row[f"{key}_min"], row[f"{key}_max"] = round(min(values), 6), round(max(values), 6)
        # The cap holds over the whole run: used MiB is read at the startup checkpoint (or the end), and a
        # communicator made after it, or memory freed before the end, left a run over the cap reading as under it.
        cap = cell.checks.max_used_mib
        peak = max(per_rank.get("peak_mib") or [0.0])
        if cap is not None and peak > cap:
            shown, cap_shown = distinct_figures(peak, cap)
            failed.append(f"peak used {shown} MiB/device > {cap_shown}")
        row.update(
            status="fail" if failed else "ok",
            verdict=outcome.verdict,
            check="; ".join(failed),
            checkpoint=checkpoint or "",
            event_count=outcome.event_count,
            trace_hash=outcome.trace_hash,
        )
    except CellTimeout:
        row.update(status="stopped", check=f"no result within the cell's wall-clock limit of {timeout_s:g} s")
    except EngineGuardError as err:
        row.update(status="stopped", check=f"simulation stopped: {err}")
    except Exception as err:  # a bug (simnccl's or a user policy's): this cell's row, never the whole sweep
        row.update(
            status="crash",
            check=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": "),
            error="".join(traceback.format_exception(err)),
        )
    row["wall_s"] = round(time.monotonic() - start, 3)
    return row
