"""``[faults]``: injected faults and a generated swarm schedule, checked against the workload's programs."""

from __future__ import annotations

from simnccl.faults import (
    Fault,
    FaultError,
    FaultSchedule,
    check_program_faults_distinct,
    generate,
    unused_fields,
    validate,
)
from simnccl.limits import InputLimits, exceeded
from simnccl.ops import (
    Program,
)
from simnccl.scenario.model import FaultSwarm, ScenarioError
from simnccl.scenario.reader import Reader, finite, str_list


def read_faults(
    top: Reader, source: str, programs: tuple[Program, ...], limits: InputLimits
) -> tuple[FaultSchedule, FaultSwarm | None]:
    """``[faults]``: ``inject = [{kind, rank, at_op?, at_s?, factor?, peer?}, ...]`` and/or a generated swarm
    schedule (``seed``, ``classes?``, ``max_faults?``). Op indexes count the rank's expanded steps from 0."""
    reader = Reader(source, "faults", top.get("faults", dict))
    raw_injected = reader.get("inject", list, [], what="a list of fault tables")
    if len(raw_injected) > limits.max_faults:
        raise reader.error("inject", exceeded("max_faults", f"{len(raw_injected)} faults", limits.max_faults))
    injected: list[Fault] = []
    for i, raw in enumerate(raw_injected):
        item = Reader(source, f"faults.inject[{i}]", raw)
        at_s = item.get("at_s", (int, float), None)
        factor = item.get("factor", (int, float), 1.0)
        fault = Fault(
            kind=item.get("kind", str),
            rank=item.get("rank", int),
            at_op=item.get("at_op", int, None),
            at_s=None if at_s is None else finite(item, "at_s", at_s, 0, limits.max_sim_time_s, "max_sim_time_s"),
            factor=finite(item, "factor", factor, 1),
            peer=item.get("peer", int, None),
        )
        item.finish()
        unused = unused_fields(fault.kind, [name for name in ("at_op", "at_s", "factor", "peer") if name in raw])
        if unused:  # even a factor of 1 on a crash: the kind does not use the field at all
            raise item.error(unused[0], f"not used by a fault of kind {fault.kind!r}")
        if "at_op" in raw and "at_s" in raw:
            raise item.error("at_s", "give at_op or at_s, not both")
        try:
            validate(fault, programs)
        except FaultError as err:
            raise ScenarioError(source, f"faults.inject[{i}]", str(err)) from None
        injected.append(fault)
    seed = reader.get("seed", int, None)
    classes = str_list(reader, "classes", "a list of fault classes")
    max_faults = reader.get("max_faults", int, 2)
    reader.finish()
    # A swarm that can draw nothing (``max_faults = 0``, ``classes = []``) ran the fault-free run and passed it as a
    # fault run: refused, as a tolerance that cannot fail is.
    if not 1 <= max_faults <= limits.max_faults:
        message = f"expected an integer >= 1 (0 draws no fault: the run would test none), got {max_faults}"
        raise reader.error(
            "max_faults", message if max_faults < 1 else exceeded("max_faults", max_faults, limits.max_faults)
        )
    if classes is not None and not classes:
        raise reader.error(
            "classes", "expected at least one fault class (omit the key to draw the classes from the seed)"
        )
    if seed is None:
        if classes is not None:
            raise reader.error("classes", "only meaningful with a seed (a generated schedule)")
        try:
            check_program_faults_distinct(injected)
        except FaultError as err:
            raise reader.error("inject", str(err)) from None
        return FaultSchedule(None, tuple(sorted({f.kind for f in injected})), tuple(injected)), None
    try:
        generated = generate(seed, programs, classes=classes, max_faults=max_faults)
        check_program_faults_distinct((*injected, *generated.faults))
    except FaultError as err:
        raise reader.error("classes", str(err)) from None
    swarm = FaultSwarm(None if classes is None else tuple(classes), max_faults, len(injected))
    return FaultSchedule(seed, generated.classes, tuple(injected) + generated.faults), swarm
