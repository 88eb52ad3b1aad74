"""``[[expect]]``: what a scenario asserts, every name in it (variant, checkpoint, device, rank) checked to exist."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from simnccl.cluster import Cluster
from simnccl.limits import current as current_limits
from simnccl.ops import (
    Checkpoint,
    Program,
)
from simnccl.scenario.model import VERDICTS, Expectation, ScenarioError
from simnccl.scenario.reader import Reader, brief, opt_count, opt_number, ranks_in_world, str_list, unknown_name


def checkpoint_labels(programs: Sequence[Program]) -> frozenset[str]:
    """Every checkpoint label some rank's program passes (each shared program read once)."""
    labels: set[str] = set()
    seen: set[int] = set()
    for program in programs:
        if id(program) in seen:
            continue
        seen.add(id(program))
        labels.update(op.label for op in program.ops if isinstance(op, Checkpoint))
    return frozenset(labels)


def _checkpoint_known(name: str, known: frozenset[str], recovery: bool) -> bool:
    """A checkpoint of the workload, or (recovery runs) one of the orchestrator's markers."""
    if name in known:
        return True
    if not recovery:
        return False
    from simnccl.recovery import MARKER_LABEL  # recovery imports this module

    return MARKER_LABEL.fullmatch(name) is not None


def read_expectations(
    top: Reader,
    source: str,
    variant_names: Sequence[str],
    checkpoints: frozenset[str],
    cluster: Cluster,
) -> list[Expectation]:
    out = []
    recovery = "recovery" in top.table
    for i, raw in enumerate(top.get("expect", list, [], what="an array of tables [[expect]]")):
        reader = Reader(source, f"expect[{i}]", raw)
        names = str_list(reader, "variants", "a list of variant names")
        if names is not None and not names:  # checked nothing, and passed
            raise reader.error("variants", "expected at least one variant (omit the key for every variant)")
        names = list(variant_names) if names is None else list(names)
        for n in names:
            if n not in variant_names:
                raise reader.error(
                    "variants", f"unknown variant {brief(n)}; expected one of {', '.join(variant_names)}"
                )
        exp = Expectation(
            variants=tuple(names),
            checkpoint=reader.get("checkpoint", str, None),
            baseline=reader.get("baseline", str, None),
            used_mib=opt_number(reader, "used_mib", -math.inf),
            tolerance_pct=_unsigned_zero(opt_number(reader, "tolerance_pct", 0)),
            tolerance_mib=_unsigned_zero(opt_number(reader, "tolerance_mib", 0)),
            devices=str_list(reader, "devices", "a list of device keys such as 'n0:cuda:0'") or (),
            verdict=reader.get("verdict", str, None),
            error_contains=reader.get("error_contains", str, None),
            hang_ranks=reader.int_list("hang_ranks", None),
            detected_at_s=opt_number(reader, "detected_at_s", 0),
            tolerance_s=_default(tolerance_s := opt_number(reader, "tolerance_s", 0), 1e-6),
            key=f"expect[{i}]",
            committed_steps=opt_count(reader, "committed_steps"),
            lost_steps=opt_count(reader, "lost_steps"),
            replacement_devices=str_list(reader, "replacement_devices", "a list of device keys such as 'n0:cuda:6'"),
            fault_detected_at_s=opt_number(reader, "fault_detected_at_s", 0),
            error_at_s=opt_number(reader, "error_at_s", 0),
            fr_dump_ranks=reader.int_list("fr_dump_ranks", None),
        )
        reader.finish()
        if exp.verdict is not None and exp.verdict not in VERDICTS:
            raise reader.error("verdict", f"expected one of {', '.join(VERDICTS)}, got {brief(exp.verdict)}")
        if exp.used_mib is not None and exp.checkpoint is None:
            raise reader.error("used_mib", "needs a checkpoint to measure at")
        if exp.baseline is not None and exp.used_mib is None:
            raise reader.error("baseline", "only meaningful with used_mib")
        asserted = (exp.used_mib, exp.verdict, exp.error_contains, exp.hang_ranks, exp.detected_at_s)
        asserted += (exp.committed_steps, exp.lost_steps, exp.replacement_devices, exp.fault_detected_at_s)
        asserted += (exp.error_at_s, exp.fr_dump_ranks)
        if all(v is None for v in asserted):
            raise ScenarioError(
                source, f"expect[{i}]", "asserts nothing; expected used_mib, verdict, error_contains or hang_ranks"
            )
        # A key that changes nothing without its partner is refused, as tolerance_pct alone is: an [[expect]] that
        # gives devices, a checkpoint or tolerance_s alone looked like a check and measured nothing. Given is given:
        # ``tolerance_pct = 0`` and ``devices = []`` alone were taken (a test of the value, not of the key).
        for key in ("tolerance_pct", "tolerance_mib", "devices", "checkpoint"):
            if key in raw and exp.used_mib is None:
                raise reader.error(key, "only meaningful with used_mib")
        if "devices" in raw and not exp.devices:
            raise reader.error("devices", "expected at least one device (omit the key for every device)")
        # A tolerance as wide as the whole check passes whatever was used: 100 % of the expected figure, or the
        # memory of one GPU of the cluster (``tolerance_pct = 1e300`` made ``used_mib = 1`` a check that cannot fail).
        if exp.tolerance_pct is not None and exp.tolerance_pct >= 100:
            raise reader.error("tolerance_pct", f"expected less than 100 (percent), got {exp.tolerance_pct!r}")
        if exp.tolerance_mib is not None and exp.tolerance_mib >= cluster.gpu.total_mib:
            raise reader.error(
                "tolerance_mib",
                f"expected less than one GPU's memory ({cluster.gpu.total_mib:g} MiB), got {exp.tolerance_mib!r}",
            )
        # Likewise a text every message contains (``error_contains = ""`` or blank found a space in any message, or
        # "no error or hang" passed for none), and a time tolerance as long as the longest run the engine lets run
        # (``max_sim_time_s``): any two times of a run are closer, so ``tolerance_s = 1e300`` checked nothing.
        if exp.error_contains is not None and not exp.error_contains.strip():
            raise reader.error(
                "error_contains",
                f"expected a text to find in an error or hang, not a blank one, got {exp.error_contains!r}",
            )
        longest = current_limits().max_sim_time_s
        if tolerance_s is not None and tolerance_s >= longest:
            raise reader.error(
                "tolerance_s",
                f"expected less than the longest simulated run (max_sim_time_s, {longest:,.0f} s), got {tolerance_s!r}",
            )
        timed = (exp.detected_at_s, exp.error_at_s, exp.fault_detected_at_s)
        if tolerance_s is not None and all(t is None for t in timed):
            raise reader.error("tolerance_s", "only meaningful with detected_at_s, error_at_s or fault_detected_at_s")
        if exp.tolerance_pct is not None and exp.tolerance_mib is not None:
            raise reader.error("tolerance_mib", "give tolerance_pct or tolerance_mib, not both")
        for key in ("checkpoint", "baseline"):
            name = getattr(exp, key)
            if name is not None and not _checkpoint_known(name, checkpoints, recovery):
                markers = " (a recovery run also has start, ready:<step>, done:<step>, commit:<step>)"
                raise reader.error(key, unknown_name("checkpoint", name, checkpoints) + (markers if recovery else ""))
        for key in ("devices", "replacement_devices"):
            for device in getattr(exp, key) or ():
                if not _device_exists(cluster, device):
                    raise reader.error(key, unknown_name("device", device, (d.key for d in cluster.devices())))
        for key in ("hang_ranks", "fr_dump_ranks"):
            ranks = getattr(exp, key)
            if ranks is not None:
                ranks_in_world(reader, key, ranks, cluster.world_size)
        out.append(exp)
    return out


def _device_exists(cluster: Cluster, key: str) -> bool:
    """``n<node>:cuda:<index>`` names a GPU of the cluster (as the memory ledgers key devices)."""
    match = re.fullmatch(r"n(0|[1-9][0-9]*):cuda:(0|[1-9][0-9]*)", key)
    return match is not None and int(match[1]) < cluster.nodes and int(match[2]) < cluster.gpus_per_node


def _unsigned_zero(value: float | None) -> float | None:
    """``-0.0`` as ``0.0``: TOML keeps the sign, and a tolerance of -0 printed "± -0 MiB" (an exact check)."""
    return 0.0 if value == 0 else value


def _default(value: float | None, default: float) -> float:
    return default if value is None else value
