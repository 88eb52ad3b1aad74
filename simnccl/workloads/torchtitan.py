"""torchtitan startup: ``init_distributed`` then ``ParallelDims.build_mesh`` through torch's DeviceMesh.

Follows **torchtitan 0.3.0** (the PyPI release): ``torchtitan/distributed/parallel_dims.py`` (``ParallelDims``,
``_mesh_exist``, ``build_mesh``), ``torchtitan/distributed/utils.py`` (``init_distributed``) and
``torchtitan/config/configs.py`` (``CommConfig.init_timeout_seconds`` = 300, ``ParallelismConfig.spmd_backend``),
and torch 2.15's ``torch/distributed/device_mesh.py`` (``_init_one_process_group``, ``_unflatten``,
``_flatten``) from the installed wheel. tests/test_framework_fidelity.py captures the real 0.3.0 code and checks
this generator against it op for op.

1. ``torch.cuda.set_device(LOCAL_RANK)``; ``init_process_group(backend="nccl"`` (``"cuda:nccl,cpu:gloo"``
   with ``enable_cpu_backend``), ``timeout=300 s, device_id=None)`` — ``device_id=cuda:LOCAL_RANK`` only with
   ``--comm.mode=torchcomms`` (the ``device_id`` knob; not checked against the real code, which needs the
   torchcomms package).
2. ``init_device_mesh(device, (W,), ("world",))``: the world dim reuses the default group (no call).
3. ``_unflatten``s of the world mesh, in order: dataloading ``(pp, batch, cp, tp)``; loss
   ``dataloading["batch", "cp"]._flatten("loss_mesh")``; then by ``spmd_backend``: ``spmd_types`` (the default)
   dense_fsdp ``(pp, dp_replicate, dp_shard, cp, tp)`` and dense_fwdbwd ``(pp, dp, cp, tp)``; ``full_dtensor``
   dense ``(pp, dp_replicate, dp_shard, cp, tp)`` only; ``partial_dtensor`` dense ``(pp, dp_replicate, fsdp,
   tp)``; last, sparse ``(pp, dp_replicate, efsdp, ep)``.
   A dim gets ``backend_override="fake"`` unless ``_mesh_exist``: degree > 1, or ``fsdp``/``dp_shard``
   (always real; ``dp_shard`` only exists under spmd_types/full_dtensor), or ``efsdp`` with ep > 1. The
   flattened loss dim has no override (always real).
4. Per dim, ``DeviceMesh._init_one_process_group``: a real dim spanning the whole world reuses the default
   group; else, when the default group is bound to a device (``device_id``) and the dim has no override, ONE
   ``split_group(split_ranks=<every subgroup>, group_desc=f"mesh_{dim}")``; else a ``new_group(ranks,
   backend=<override>, group_desc=f"mesh_{dim}")`` per subgroup, on every rank (fake dims always loop).
   Subgroups are enumerated row-major over the other dims (checked against torch 2.15's DeviceMesh).

DeviceMesh recreates a process group for every dim of every mesh, so the same rank sets come back (tp x3,
pp x4, the data dims x3-4): the duplicates the ``dedupe`` policy removes.

Modelling note: without ``device_id`` torch 2.15's nccl2 default group still gets a ``bound_device_id``
(rank fallback, reference §0), so real torch would take the split_group branch there, and the new_group
loop only under legacy/2.14. A Program is fixed data, so the default generator emits the loop (valid on
every release); the simulator prices each of its new_groups on 2.15 as a split of the bound world, so
memberships and memory are the same, only group names and the number of world-wide split rounds differ.
``split_group = true`` emits the split branch (it needs a bound default group: device_id, or 2.15 nccl2).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from simnccl.ops import Checkpoint, InitProcessGroup, NewGroup, Op, SetDevice, SplitGroup
from simnccl.workloads._common import BOOL, INT, STR, Config, Generator, Param, WorkloadError, programs_by_key

Ranks = tuple[int, ...]

INIT_TIMEOUT_S = 300.0  # CommConfig.init_timeout_seconds
SPMD_BACKENDS = ("spmd_types", "full_dtensor", "partial_dtensor")

PARAMS = (
    Param("dp_replicate", INT, 1, "--parallelism.data_parallel_replicate_degree", minimum=1),
    Param("dp_shard", INT, -1, "--parallelism.data_parallel_shard_degree (-1: the rest of the world)"),
    Param("cp", INT, 1, "--parallelism.context_parallel_degree", minimum=1),
    Param("tp", INT, 1, "--parallelism.tensor_parallel_degree", minimum=1),
    Param("pp", INT, 1, "--parallelism.pipeline_parallel_degree", minimum=1),
    Param("ep", INT, 1, "--parallelism.expert_parallel_degree", minimum=1),
    Param("spmd_backend", STR, "spmd_types", "--parallelism.spmd_backend: which dense meshes", choices=SPMD_BACKENDS),
    Param("device_id", BOOL, False, "--comm.mode=torchcomms: init_process_group(device_id=cuda:LOCAL_RANK)"),
    Param("split_group", BOOL, None, "emit DeviceMesh's split_group branch (default: with device_id)"),
    Param("enable_cpu_backend", BOOL, False, "--training.enable_cpu_offload: cuda:nccl,cpu:gloo default group"),
    Param("local_world_size", INT, 8, "processes per node (LOCAL_RANK = rank % local_world_size)", minimum=1),
)


def _dims(config: Config, world_size: int) -> dict[str, int]:
    dpr, cp, tp, pp, ep = config["dp_replicate"], config["cp"], config["tp"], config["pp"], config["ep"]
    dps = config["dp_shard"]
    rest = dpr * cp * tp * pp
    if dps == -1:
        if world_size % rest:
            raise WorkloadError(
                "dp_shard", f"world_size ({world_size}) is not divisible by dp_replicate*cp*tp*pp = {rest}"
            )
        dps = world_size // rest
    elif dps < 1:
        raise WorkloadError("dp_shard", f"expected -1 or a degree >= 1, got {dps}")
    if dpr * dps * cp * tp * pp != world_size:
        raise WorkloadError(
            "dp_shard",
            f"dp_replicate({dpr}) * dp_shard({dps}) * cp({cp}) * tp({tp}) * pp({pp}) != WORLD_SIZE({world_size})",
        )
    region = dps * cp * tp
    if region % ep:
        raise WorkloadError("ep", f"ep ({ep}) must divide dp_shard*cp*tp = {region}")
    return {"dp_replicate": dpr, "dp_shard": dps, "cp": cp, "tp": tp, "pp": pp, "ep": ep}


def natural_world(config: Config) -> int | None:
    if config["dp_shard"] == -1:
        return None
    return config["dp_replicate"] * config["dp_shard"] * config["cp"] * config["tp"] * config["pp"]


def check(config: Config, world_size: int) -> None:
    _dims(config, world_size)


def _real(name: str, degree: int, ep: int) -> bool:
    """torchtitan's ``_mesh_exist``: which dims get a real (non-fake) process group."""
    if name in ("fsdp", "dp_shard"):
        return True
    if name == "efsdp":
        return ep > 1
    return degree > 1


def mesh_groups(sizes: Sequence[int], vary: Sequence[int]) -> list[Ranks]:
    """Subgroups of a contiguous row-major mesh along the dims ``vary``: one per coordinate of the other
    dims, enumerated row-major (first dim outermost), members sorted (new_group sorts them)."""
    strides = [1] * len(sizes)
    for d in range(len(sizes) - 2, -1, -1):
        strides[d] = strides[d + 1] * sizes[d + 1]
    other = [d for d in range(len(sizes)) if d not in vary]
    groups = []
    for fixed in itertools.product(*(range(sizes[d]) for d in other)):
        base = sum(c * strides[d] for c, d in zip(fixed, other, strict=True))
        members = sorted(
            base + sum(c * strides[d] for c, d in zip(moving, vary, strict=True))
            for moving in itertools.product(*(range(sizes[d]) for d in vary))
        )
        groups.append(tuple(members))
    return groups


def meshes(config: Config, world_size: int) -> list[tuple[str, tuple[str, ...], tuple[int, ...], tuple[int, ...]]]:
    """(mesh, dim names, sizes, flattened dims) in build_mesh's order; a flatten is a mesh with one dim."""
    d = _dims(config, world_size)
    pp, dpr, dps, cp, tp, ep = d["pp"], d["dp_replicate"], d["dp_shard"], d["cp"], d["tp"], d["ep"]
    batch = dpr * dps
    out = [("dataloading", ("pp", "batch", "cp", "tp"), (pp, batch, cp, tp), ())]
    out.append(("loss", ("loss_mesh",), (pp, batch, cp, tp), (1, 2)))
    backend = config["spmd_backend"]
    if backend == "spmd_types":
        out.append(("dense_fsdp", ("pp", "dp_replicate", "dp_shard", "cp", "tp"), (pp, dpr, dps, cp, tp), ()))
        out.append(("dense_fwdbwd", ("pp", "dp", "cp", "tp"), (pp, batch, cp, tp), ()))
    elif backend == "full_dtensor":
        out.append(("dense", ("pp", "dp_replicate", "dp_shard", "cp", "tp"), (pp, dpr, dps, cp, tp), ()))
    else:
        out.append(("dense", ("pp", "dp_replicate", "fsdp", "tp"), (pp, dpr, dps * cp, tp), ()))
    out.append(("sparse", ("pp", "dp_replicate", "efsdp", "ep"), (pp, dpr, dps * cp * tp // ep, ep), ()))
    return out


def dim_calls(config: Config, world_size: int) -> list[tuple[str, str, list[Ranks], str | None]]:
    """(mesh, dim, subgroups, backend override) for every dim DeviceMesh initialises, in order; dims that
    reuse the default group are left out (they make no call)."""
    ep = config["ep"]
    out = []
    for mesh, names, sizes, flattened in meshes(config, world_size):
        if flattened:
            groups = mesh_groups(sizes, flattened)
            override = None  # _flatten(mesh_dim_name) without backend_override
            dims = [(names[0], groups, override)]
        else:
            dims = []
            for index, (name, size) in enumerate(zip(names, sizes, strict=True)):
                override = None if _real(name, size, ep) else "fake"
                dims.append((name, mesh_groups(sizes, (index,)), override))
        for name, groups, override in dims:
            if len(groups[0]) == world_size and override is None:
                continue  # the whole world, no override: the default group is reused
            out.append((mesh, name, groups, override))
    return out


def _shared_ops(config: Config, world_size: int, split: bool) -> list[Op]:
    ops: list[Op] = []
    for mesh, name, groups, override in dim_calls(config, world_size):
        bind = f"{mesh}.{name}"
        traffic = "p2p" if name == "pp" else "collectives"
        if split and override is None:
            ops.append(
                SplitGroup(
                    split_ranks=tuple(groups), bind=bind, group_desc=f"mesh_{name}", purpose=name, traffic=traffic
                )
            )
            continue
        for ranks in groups:
            ops.append(
                NewGroup(
                    ranks=ranks, backend=override, bind=bind, group_desc=f"mesh_{name}", purpose=name, traffic=traffic
                )
            )
    ops.append(Checkpoint("startup"))
    return ops


def build(config: Config, world_size: int):
    split = config["split_group"] if config["split_group"] is not None else config["device_id"]
    shared = _shared_ops(config, world_size, split)
    backend = "cuda:nccl,cpu:gloo" if config["enable_cpu_backend"] else "nccl"
    local = config["local_world_size"]

    def ops_for(device: int | None) -> list[Op]:
        init = InitProcessGroup(backend=backend, device_id=device, timeout_s=INIT_TIMEOUT_S)
        return [SetDevice(), init, Checkpoint("after_init"), *shared]

    if not config["device_id"]:
        return programs_by_key(world_size, lambda rank: None, ops_for)
    return programs_by_key(world_size, lambda rank: rank % local, ops_for)


GENERATOR = Generator(
    name="torchtitan",
    framework="torchtitan (DeviceMesh)",
    source="torchtitan 0.3.0: torchtitan/distributed/parallel_dims.py, torchtitan/distributed/utils.py "
    "+ torch 2.15 torch/distributed/device_mesh.py",
    params=PARAMS,
    build=build,
    natural_world=natural_world,
    check=check,
    doc="ParallelDims.build_mesh: unflattens of the world mesh, default-group reuse, fake degree-1 dims",
)
