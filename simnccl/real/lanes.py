"""Lanes: which backends a real run may use on this machine, and the program rewrite that gets it there.

CPU lane (every CI run): NCCL-family backend names (``nccl``, ``nccl2``, ``nccl-lazy``, ``nccl-legacy``, and the
``cuda:`` leg of a device string such as ``"cpu:gloo,cuda:nccl"``) become ``gloo``; ``pg_options`` (NCCL's
``lazy_init``, ``split_share``, ``is_high_priority_stream``) are dropped because gloo has no such options;
``device_id`` is dropped (there is no CUDA device to bind); ``set_device``, ``alloc`` and ``memory_check`` become
no-op ``compute(seconds=0)`` steps so op indices stay those of the scenario. The same rewrite is applied to the
simulator's input for an apples-to-apples comparison, and a policy is wrapped (``CpuLanePolicy``) so that what
it decides is rewritten the same way.

What the CPU lane can and cannot tell: on gloo every group is bootstrapped by its members only (no bound parent,
no ``ncclCommSplit``, no NOCOLOR split), so hangs that exist only because an NCCL default group is bound — a
creation-order mismatch inside ``new_group``, ``use_local_synchronization`` members waiting in a split — do not
reproduce there; they show up later (at the first collective) or not at all. ``comparability`` says so per
scenario.

GPU lane: the scenario's own backends on CUDA devices, one rank per visible GPU; more ranks than GPUs are
refused (NCCL rejects two ranks on one GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simnccl.ops import (
    NO_OPTIONS,
    Alloc,
    Compute,
    EmptyCache,
    Free,
    InitProcessGroup,
    MemoryCheck,
    NewGroup,
    Op,
    Program,
    SetDevice,
    SplitGroup,
)
from simnccl.policy import (
    TRUSTED_WRAPPERS,
    GroupDecision,
    GroupRequest,
    InitPlan,
    InitRequest,
    Policy,
    ask_group,
    ask_init,
    get_policy,
)
from simnccl.real.programs import share_identical

LANES = ("cpu", "gpu")
NCCL_FAMILY = ("nccl", "nccl2", "nccl-lazy", "nccl-legacy")
GPU_ONLY_OPS = (SetDevice, Alloc, Free, EmptyCache, MemoryCheck)
NO_CUDA = "no CUDA device: the GPU lane needs one"


class LaneError(RuntimeError):
    """A lane that cannot run here (no CUDA device, more ranks than visible GPUs)."""


def gloo_backend(backend: str | None) -> str | None:
    """The CPU-lane name for a backend string. ``None`` on ``init_process_group`` means torch's default for the
    machine (``nccl`` on a CUDA host, which is what the scenario models), so it becomes gloo too; on
    ``new_group`` None means "the default group's", which is already gloo — pass None for that."""
    if backend is None:
        return "gloo"
    text = backend.lower()
    if ":" not in text:
        return "gloo" if text in NCCL_FAMILY else text
    legs = []
    for pair in text.split(","):
        device, _, name = pair.partition(":")
        legs.append((device.strip(), "gloo" if name.strip() in NCCL_FAMILY else name.strip()))
    if all(name == "gloo" for _, name in legs):
        return "gloo"  # BackendConfig("gloo") is cpu:gloo,cuda:gloo: one backend object
    return ",".join(f"{device}:{name}" for device, name in legs)


def _group_backend(backend: str | None) -> str | None:
    return None if backend is None else gloo_backend(backend)


def cpu_op(op: Op) -> Op:
    """One op as the CPU lane runs it (see the module docstring)."""
    if isinstance(op, GPU_ONLY_OPS):
        return Compute(seconds=0.0)
    if isinstance(op, InitProcessGroup):
        return replace(op, backend=gloo_backend(op.backend), device_id=None, pg_options=NO_OPTIONS)
    if isinstance(op, NewGroup):
        return replace(op, backend=_group_backend(op.backend), device_id=None, pg_options=NO_OPTIONS)
    if isinstance(op, SplitGroup):
        return replace(op, pg_options=NO_OPTIONS)
    return op


def cpu_programs(programs: tuple[Program, ...] | list[Program]) -> tuple[Program, ...]:
    """Every rank's program rewritten for the CPU lane; identical programs stay one shared object."""
    cache: dict[int, Program] = {}
    out = []
    for program in programs:
        rewritten = cache.get(id(program))
        if rewritten is None:
            rewritten = cache[id(program)] = Program(tuple(cpu_op(op) for op in program.ops))
        out.append(rewritten)
    return share_identical(out)


def cpu_substitutions(programs: tuple[Program, ...] | list[Program]) -> list[str]:
    """Human-readable list of what ``cpu_programs`` changed (declared in every CPU-lane report)."""
    seen: dict[str, None] = {}
    for program in programs:
        for op in program.ops:
            new = cpu_op(op)
            if new == op:
                continue
            if isinstance(op, GPU_ONLY_OPS):
                seen[f"{op.name}: skipped on the CPU lane (no CUDA device)"] = None
                continue
            backend = getattr(op, "backend", None)
            if backend != getattr(new, "backend", None) and hasattr(op, "backend"):
                seen[f"{op.name}: backend {backend or '<default: nccl>'} -> {new.backend}"] = None  # type: ignore[attr-defined]
            if getattr(op, "pg_options", NO_OPTIONS) != NO_OPTIONS:
                seen[f"{op.name}: pg_options {op.pg_options.to_dict()} dropped (gloo has none)"] = None  # type: ignore[attr-defined]
            if getattr(op, "device_id", None) is not None:
                seen[f"{op.name}: device_id {op.device_id!r} dropped (no CUDA device)"] = None  # type: ignore[attr-defined]
    return list(seen)


@dataclass(frozen=True)
class CpuLanePolicy:
    """Wraps a policy so that its plans land on the CPU lane: NCCL names -> gloo, no NCCL options, no device.

    Both the simulator (CPU-lane comparison) and the real driver use it, so they see the same decisions.
    """

    inner: Policy

    @property
    def name(self) -> str:
        return f"cpu-lane({self.inner.name})"

    def on_init(self, request: InitRequest) -> InitPlan:
        plan = ask_init(self.inner, request)  # the inner policy's error is named as its own, not the lane's
        return replace(plan, backend=gloo_backend(plan.backend), device_id=None, pg_options=NO_OPTIONS)

    def on_group(self, request: GroupRequest, decision: GroupDecision) -> GroupDecision:
        decided = ask_group(self.inner, request, decision)  # the inner policy's error is named as its own
        backend = decided.backend if decided.backend == "fake" else _group_backend(decided.backend)
        return replace(decided, backend=backend, pg_options=NO_OPTIONS, device_id=None)


TRUSTED_WRAPPERS[CpuLanePolicy] = "inner"  # its plans are the inner policy's, rewritten alike on every rank


def lane_policy(spec: str | Policy, lane: str) -> Policy:
    policy = get_policy(spec) if isinstance(spec, str) else spec
    return CpuLanePolicy(policy) if lane == "cpu" else policy


def comparability(programs: tuple[Program, ...] | list[Program]) -> list[str]:
    """What the CPU lane cannot tell about these programs (NCCL-only semantics), one line each."""
    notes: dict[str, None] = {}
    for program in programs:
        for op in program.ops:
            renamed = isinstance(op, (InitProcessGroup, NewGroup)) and gloo_backend(op.backend) != op.backend
            if renamed and (isinstance(op, InitProcessGroup) or op.backend is not None):
                notes[
                    "NCCL groups run on gloo: members-only bootstrap, no bound parent, no ncclCommSplit/NOCOLOR "
                    "split; a hang that needs a bound NCCL world (creation order inside new_group, "
                    "use_local_synchronization under nccl2) appears later or not at all. The simulator is "
                    "run with the same gloo rewrite, so verdicts and stuck ranks are comparable; the scenario's "
                    "own NCCL verdict is not checked by this lane."
                ] = None
            if isinstance(op, NewGroup) and op.use_local_synchronization:
                notes["use_local_synchronization: on gloo members bootstrap alone, nothing to split"] = None
            if isinstance(op, SplitGroup):
                notes["split_group: gloo splits by a members-only bootstrap, not ncclCommSplit"] = None
            if isinstance(op, (Alloc, Free, EmptyCache, MemoryCheck)):
                notes[
                    "memory: not measured on the CPU lane (alloc, free, empty_cache and memory_check are skipped)"
                ] = None
    return list(notes)


def visible_gpus() -> int:
    """CUDA devices this process can see (0 when torch or CUDA is missing); never initialises a context."""
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:
        return 0


def check_gpu_lane(world_size: int, gpus: int | None = None) -> None:
    """Refuse clearly: no CUDA, or more ranks than visible GPUs (NCCL rejects two ranks on one GPU)."""
    count = visible_gpus() if gpus is None else gpus
    if count == 0:
        raise LaneError(NO_CUDA)
    if world_size > count:
        raise LaneError(
            f"the GPU lane needs one GPU per rank: {world_size} ranks but {count} visible GPU(s) "
            "(NCCL rejects two ranks on one GPU: 'Duplicate GPU detected'); run a scenario with at most "
            f"{count} ranks, or use --lane cpu"
        )
