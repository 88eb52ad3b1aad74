"""vLLM worker startup: ``init_worker_distributed_environment``, then the startup memory check.

Follows ``vllm/distributed/parallel_state.py`` of vllm-project/vllm (read at 0c175ae, mid-2026:
``init_distributed_environment``, ``initialize_model_parallel``), a 2026 copy of ``GroupCoordinator.__init__``
with the ``VLLM_DISTRIBUTED_USE_SPLIT_GROUP`` branch and ``_create_subgroups_split_group`` (vllm#41980), and
``Worker.init_device`` in ``vllm/v1/worker/gpu_worker.py``, as ../shared/reference/framework-startup.md §1
describes them (the eplb family is from that page; the source read predates it):

1. ``torch.cuda.set_device(local_rank)``.
2. ``init_process_group(backend="nccl")`` with no ``device_id`` (default path), or
   ``init_process_group("cpu:gloo,cuda:nccl", device_id=cuda:<local>)`` (split path).
   With DP > 1 the world spans every DP engine: ``rank = dp_rank * world_size + rank``.
3. ``_WORLD = GroupCoordinator([[0..W-1]], group_name="world")``; ``_INNER_DP_WORLD`` when one DP engine
   spans several nodes.
4. ``initialize_model_parallel``: ranks laid out as ``arange(W).reshape(-1, DP, PP, PCP, TP)``; groups in the
   order tp, dcp, pcp, pp, dp, ep (MoE only), eplb (``enable_eplb`` only).
5. Every ``GroupCoordinator`` issues, on every rank and for every group of its family, the twin
   ``new_group(ranks, backend="nccl")`` + ``new_group(ranks, backend="gloo")`` (default path; size-1 groups
   included), or two ``split_group`` collectives over the whole world (``{name}:device`` and ``{name}:cpu``,
   both with a cuda:nccl backend) on the split path. The call list is rank-independent on the default path:
   every rank shares one Program. The split path differs per rank only in ``device_id``.
6. ``gc.collect(); torch.cuda.empty_cache(); MemorySnapshot()`` and the check
   ``free >= ceil(total * gpu_memory_utilization)`` (``MemoryCheck``), preceded by the checkpoint
   ``before_memory_check``.
7. Optionally (``v2_model_runner``) the V2 runner's ``pp.make_sibling_device_group("pp_broadcast")``: one more
   NCCL ``new_group`` per PP group, after the check.

Not modelled: vLLM's own PyNccl communicators (raw ``ncclCommInitRank`` over each cpu group of size > 1,
eager on every torch version), custom all-reduce IPC buffers and all2all managers. They cost the same under
every torch release and policy; ``pynccl_mib`` charges a caller-supplied figure per PyNccl communicator (an
``alloc`` right after each device-communicator group is created), default 0. Elastic-EP
``StatelessGroupCoordinator``s (own TCPStore, no ``new_group``) are not modelled.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from simnccl.limits import current as current_limits
from simnccl.limits import exceeded, number_text
from simnccl.ops import Alloc, Checkpoint, InitProcessGroup, MemoryCheck, NewGroup, Op, SetDevice, SplitGroup
from simnccl.workloads._common import (
    BOOL,
    FLOAT,
    INT,
    Config,
    Generator,
    Param,
    WorkloadError,
    programs_by_key,
    same_for_all,
)

Ranks = tuple[int, ...]

PARAMS = (
    Param("tp", INT, 1, "--tensor-parallel-size", minimum=1),
    Param("pp", INT, 1, "--pipeline-parallel-size", minimum=1),
    Param("dcp", INT, 1, "--decode-context-parallel-size (within tp; tp % dcp == 0)", minimum=1),
    Param("pcp", INT, 1, "--prefill-context-parallel-size", minimum=1),
    Param("dp", INT, None, "--data-parallel-size: DP engines in one world (default: world / (tp*pp*pcp))", 1),
    Param("moe", BOOL, False, "the model is MoE: the ep group is created"),
    Param("enable_eplb", BOOL, False, "--enable-eplb: a separate eplb group with the ep ranks (MoE only)"),
    Param("split_group", BOOL, False, "VLLM_DISTRIBUTED_USE_SPLIT_GROUP=1: device_id world and split_group families"),
    Param("gpu_memory_utilization", FLOAT, 0.9, "--gpu-memory-utilization for the startup check", minimum=0.0),
    Param("memory_check", BOOL, True, "run the startup memory check (Worker.init_device)"),
    Param("v2_model_runner", BOOL, False, "V2 model runner: pp.make_sibling_device_group after the check"),
    Param("local_world_size", INT, 8, "processes per node (LOCAL_RANK = rank % local_world_size)", minimum=1),
    Param("pynccl_mib", FLOAT, 0.0, "MiB to charge per vLLM PyNccl communicator (not torch's; default 0)", 0.0),
)


def _sizes(config: Config, world_size: int) -> tuple[int, int, int, int, int]:
    tp, pp, pcp, dcp = config["tp"], config["pp"], config["pcp"], config["dcp"]
    if tp % dcp:
        raise WorkloadError("dcp", f"tp ({tp}) must be divisible by dcp ({dcp}): DCP splits each TP group")
    engine = tp * pp * pcp
    if world_size % engine:
        raise WorkloadError("tp", f"the world of {world_size} ranks is not divisible by tp*pp*pcp = {engine}")
    dp = config["dp"]
    if dp is None:
        dp = world_size // engine
    elif dp * engine != world_size:
        raise WorkloadError(
            "dp",
            f"tp*pp*pcp*dp = {engine * dp} does not match the world of {world_size} ranks "
            f"(tp={tp}, pp={pp}, pcp={pcp}, dp={dp})",
        )
    return tp, pp, pcp, dcp, dp


def natural_world(config: Config) -> int | None:
    """One engine (vLLM's default --data-parallel-size 1) unless dp is given."""
    dp = 1 if config["dp"] is None else config["dp"]
    return config["tp"] * config["pp"] * config["pcp"] * dp


def check(config: Config, world_size: int) -> None:
    _sizes(config, world_size)
    # A size like any allocation's: past the limit a scenario's alloc step is refused at, so a huge figure
    # (1e30) is bad input (exit 2), not a simulated OOM reported as torch's finding (exit 0).
    limit = current_limits().max_alloc_mib
    if config["pynccl_mib"] > limit:
        raise WorkloadError("pynccl_mib", exceeded("max_alloc_mib", f"{number_text(config['pynccl_mib'])} MiB", limit))
    if config["enable_eplb"] and not config["moe"]:
        raise WorkloadError("enable_eplb", "EPLB needs an MoE model (set moe = true)")
    if not 0.0 < config["gpu_memory_utilization"] <= 1.0:
        raise WorkloadError(
            "gpu_memory_utilization", f"expected a fraction in (0, 1], got {config['gpu_memory_utilization']}"
        )


def _grid(world_size: int, dp: int, pp: int, pcp: int, tp: int) -> dict[tuple[int, ...], int]:
    """``arange(W).reshape(-1, DP, PP, PCP, TP)``: coordinates (ext, dp, pp, pcp, tp) -> rank, row-major."""
    ext = world_size // (dp * pp * pcp * tp)
    shape = (ext, dp, pp, pcp, tp)
    out = {}
    for rank, coord in enumerate(itertools.product(*(range(s) for s in shape))):
        out[coord] = rank
    return out


def _permuted_groups(
    shape: Sequence[int], grid: dict[tuple[int, ...], int], perm: Sequence[int], size: int
) -> list[Ranks]:
    """``all_ranks.permute(perm).reshape(-1, size).unbind(0)``: walk the permuted tensor row-major and cut it
    into consecutive rows of ``size`` (``transpose(a, b)`` is the permutation swapping a and b)."""
    flat = []
    for moved in itertools.product(*(range(shape[a]) for a in perm)):
        coord = [0] * len(shape)
        for a, v in zip(perm, moved, strict=True):
            coord[a] = v
        flat.append(grid[tuple(coord)])
    return [tuple(flat[i : i + size]) for i in range(0, len(flat), size)]


def _swap(a: int, b: int, n: int = 5) -> tuple[int, ...]:
    axes = list(range(n))
    axes[a], axes[b] = axes[b], axes[a]
    return tuple(axes)


def families(config: Config, world_size: int) -> list[tuple[str, list[Ranks], bool]]:
    """(group_name, group_ranks, use_device_communicator) in vLLM's creation order, world first."""
    tp, pp, pcp, dcp, dp = _sizes(config, world_size)
    ext = world_size // (dp * pp * pcp * tp)
    shape = (ext, dp, pp, pcp, tp)
    grid = _grid(world_size, dp, pp, pcp, tp)
    out: list[tuple[str, list[Ranks], bool]] = [("world", [tuple(range(world_size))], False)]
    engine = tp * pp * pcp
    nnodes_within_dp = -(-engine // config["local_world_size"])
    if nnodes_within_dp > 1 and dp > 1:
        out.append(
            (
                "inner_dp_world",
                [tuple(d * engine + i for i in range(engine)) for d in range(world_size // engine)],
                False,
            )
        )
    flat = list(range(world_size))
    out.append(("tp", [tuple(flat[i : i + tp]) for i in range(0, world_size, tp)], True))  # view(-1, TP)
    out.append(("dcp", [tuple(flat[i : i + dcp]) for i in range(0, world_size, dcp)], True))  # reshape(-1, DCP)
    out.append(("pcp", _permuted_groups(shape, grid, _swap(3, 4), pcp), True))  # transpose(3, 4)
    out.append(("pp", _permuted_groups(shape, grid, _swap(2, 4), pp), True))  # transpose(2, 4)
    out.append(("dp", _permuted_groups(shape, grid, _swap(1, 4), dp), True))  # transpose(1, 4)
    if config["moe"]:
        ep = _permuted_groups(shape, grid, _swap(1, 2), dp * pcp * tp)  # transpose(1, 2).reshape(-1, DP*PCP*TP)
        out.append(("ep", ep, True))
        if config["enable_eplb"]:
            out.append(("eplb", ep, True))
    return out


_TRAFFIC = {"pp": "p2p"}


def _device_groups(config: Config, world_size: int, ops: list[Op]) -> None:
    """The default path: each GroupCoordinator's new_group twins, every group, every rank."""
    for name, group_ranks, device_comm in families(config, world_size):
        traffic = _TRAFFIC.get(name, "collectives")
        for ranks in group_ranks:
            ops.append(NewGroup(ranks=ranks, backend="nccl", bind=name, purpose=name, traffic=traffic, group_desc=None))
            ops.append(NewGroup(ranks=ranks, backend="gloo", bind=f"{name}_cpu", purpose=name, traffic="collectives"))
        _pynccl(config, group_ranks, device_comm, name, ops)


def _pynccl(config: Config, group_ranks: list[Ranks], device_comm: bool, name: str, ops: list[Op]) -> None:
    if config["pynccl_mib"] > 0 and device_comm and len(group_ranks[0]) > 1:
        ops.append(Alloc(mib=config["pynccl_mib"], tag=f"pynccl:{name}"))


def _split_groups(config: Config, world_size: int, ops: list[Op]) -> None:
    """``_create_subgroups_split_group``: two world-wide split_group collectives per GroupCoordinator."""
    for name, group_ranks, device_comm in families(config, world_size):
        traffic = _TRAFFIC.get(name, "collectives")
        split = tuple(group_ranks)
        ops.append(SplitGroup(split_ranks=split, bind=name, group_desc=f"{name}:device", purpose=name, traffic=traffic))
        ops.append(
            SplitGroup(
                split_ranks=split, bind=f"{name}_cpu", group_desc=f"{name}:cpu", purpose=name, traffic="collectives"
            )
        )
        _pynccl(config, group_ranks, device_comm, name, ops)


def _tail(config: Config, world_size: int) -> list[Op]:
    ops: list[Op] = [Checkpoint("before_memory_check")]
    if config["memory_check"]:
        ops.append(MemoryCheck(gpu_memory_utilization=config["gpu_memory_utilization"]))
    if config["v2_model_runner"]:
        for name, group_ranks, _ in families(config, world_size):
            if name == "pp":
                for ranks in group_ranks:
                    ops.append(
                        NewGroup(
                            ranks=ranks,
                            backend="nccl",
                            bind="pp_broadcast",
                            group_desc="pp_broadcast",
                            purpose="pp",
                            traffic="collectives",
                        )
                    )
        ops.append(Checkpoint("after_memory_check"))
    return ops


def build(config: Config, world_size: int):
    if not config["split_group"]:
        ops: list[Op] = [SetDevice(), InitProcessGroup(backend="nccl"), Checkpoint("after_init")]
        _device_groups(config, world_size, ops)
        return same_for_all(world_size, ops + _tail(config, world_size))
    shared: list[Op] = []
    _split_groups(config, world_size, shared)
    shared += _tail(config, world_size)
    local = config["local_world_size"]

    def ops_for(device: int) -> list[Op]:
        init = InitProcessGroup(backend="cpu:gloo,cuda:nccl", device_id=device)
        return [SetDevice(), init, Checkpoint("after_init"), *shared]

    return programs_by_key(world_size, lambda rank: rank % local, ops_for)


GENERATOR = Generator(
    name="vllm",
    framework="vLLM",
    source="vllm-project/vllm vllm/distributed/parallel_state.py @ 0c175ae (mid-2026) + vllm/v1/worker/gpu_worker.py",
    params=PARAMS,
    build=build,
    natural_world=natural_world,
    check=check,
    doc="init_worker_distributed_environment (NCCL + gloo GroupCoordinator twins) then the startup memory check",
)
