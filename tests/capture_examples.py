"""Startups written in plain torch, to be captured by ``simnccl.capture`` (not collected by pytest).

Each function is what a framework does at startup, rewritten with nothing but ``torch.distributed`` calls, so
the capture sees real torch 2.15 behaviour (DeviceMesh's own branches, new_group's own sorting):

* ``torchtitan_build_mesh``: torchtitan's ``init_distributed`` + ``ParallelDims.build_mesh`` at b5bcd76
  (../shared/reference/framework-startup.md §4): the world mesh, then the dataloading / loss / dense_fsdp /
  dense_fwdbwd / sparse unflattens, ``backend_override="fake"`` for degree-1 dims (except fsdp/dp_shard, and
  efsdp when ep > 1).
* ``device_mesh_2d`` / ``device_mesh_3d``: a bare ``init_device_mesh``.
* ``vllm_group_coordinators``: vLLM's ``init_distributed_environment`` + ``initialize_model_parallel`` default
  path: every GroupCoordinator creates, for every rank list of its family and on every rank, a
  ``new_group(ranks, backend="nccl")`` then a ``new_group(ranks, backend="gloo")``; the rank lists come from
  ``torch.arange(W).reshape(-1, DP, PP, PCP, TP)`` exactly as vLLM computes them.

Run as a script (``python -m simnccl.capture --world 8 tests/capture_examples.py torchtitan --tp 4``), each
reads its sizes from the command line and the world from the environment, as under torchrun.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def torchtitan_build_mesh(
    *,
    dp_replicate: int = 1,
    dp_shard: int = -1,
    cp: int = 1,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    device_id: bool = False,
) -> None:
    """torchtitan ``init_distributed`` then ``ParallelDims.build_mesh`` (spmd_types meshes)."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.cuda.set_device(_local_rank())
    device = torch.device("cuda", _local_rank()) if device_id else None
    dist.init_process_group(backend="nccl", timeout=timedelta(seconds=300), device_id=device)
    world = dist.get_world_size()
    if dp_shard == -1:
        dp_shard = world // (dp_replicate * cp * tp * pp)
    batch = dp_replicate * dp_shard
    efsdp = dp_shard * cp * tp // ep

    def fake_dims(names: tuple[str, ...], sizes: tuple[int, ...]) -> dict[str, str]:
        def real(name: str, degree: int) -> bool:
            if name in ("fsdp", "dp_shard"):
                return True
            if name == "efsdp":
                return ep > 1
            return degree > 1

        return {n: "fake" for n, s in zip(names, sizes, strict=True) if not real(n, s)}

    def unflatten(mesh, names: tuple[str, ...], sizes: tuple[int, ...]):
        return mesh._unflatten(0, sizes, names, backend_override=fake_dims(names, sizes))

    world_mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("world",))
    dataloading = unflatten(world_mesh, ("pp", "batch", "cp", "tp"), (pp, batch, cp, tp))
    dataloading["batch", "cp"]._flatten("loss_mesh")
    unflatten(world_mesh, ("pp", "dp_replicate", "dp_shard", "cp", "tp"), (pp, dp_replicate, dp_shard, cp, tp))
    unflatten(world_mesh, ("pp", "dp", "cp", "tp"), (pp, batch, cp, tp))
    unflatten(world_mesh, ("pp", "dp_replicate", "efsdp", "ep"), (pp, dp_replicate, efsdp, ep))


def device_mesh_2d(dp: int = 2, tp: int = 4) -> None:
    """``init_device_mesh("cuda", (dp, tp), ("dp", "tp"))`` after an init without device_id."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.cuda.set_device(_local_rank())
    dist.init_process_group(backend="nccl")
    mesh = init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))
    dist.all_reduce(torch.ones(1024, device="cuda"), group=mesh.get_group("tp"))  # nccl: cuda tensors only


def device_mesh_3d(pp: int = 2, dp: int = 2, tp: int = 2) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.cuda.set_device(_local_rank())
    dist.init_process_group(backend="nccl")
    init_device_mesh("cuda", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))


def vllm_group_coordinators(tp: int = 1, pp: int = 1, dcp: int = 1, pcp: int = 1, moe: bool = False) -> None:
    """vLLM's default-path GroupCoordinators: an NCCL + gloo ``new_group`` twin per rank list, every rank."""
    torch.cuda.set_device(_local_rank())
    dist.init_process_group(backend="nccl")
    world = dist.get_world_size()

    def coordinator(group_ranks: list[list[int]]) -> None:
        for ranks in group_ranks:
            dist.new_group(ranks, backend="nccl")
            dist.new_group(ranks, backend="gloo")

    dp = world // (tp * pp * pcp)
    all_ranks = torch.arange(world).reshape(-1, dp, pp, pcp, tp)
    coordinator([list(range(world))])  # _WORLD
    coordinator([r.tolist() for r in all_ranks.view(-1, tp).unbind(0)])  # tp
    coordinator([r.tolist() for r in all_ranks.reshape(-1, dcp).unbind(0)])  # dcp
    coordinator([r.tolist() for r in all_ranks.transpose(3, 4).reshape(-1, pcp).unbind(0)])  # pcp
    coordinator([r.tolist() for r in all_ranks.transpose(2, 4).reshape(-1, pp).unbind(0)])  # pp
    coordinator([r.tolist() for r in all_ranks.transpose(1, 4).reshape(-1, dp).unbind(0)])  # dp
    if moe:
        coordinator([r.tolist() for r in all_ranks.transpose(1, 2).reshape(-1, dp * pcp * tp).unbind(0)])  # ep


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("startup", choices=("torchtitan", "mesh2d", "mesh3d", "vllm"))
    for knob in ("tp", "pp", "dp", "cp", "dp-shard"):
        parser.add_argument(f"--{knob}", type=int, default=None)
    args = parser.parse_args()
    given = {k: v for k, v in vars(args).items() if k != "startup" and v is not None}
    if args.startup == "torchtitan":
        torchtitan_build_mesh(**given)
    elif args.startup == "mesh2d":
        device_mesh_2d(**given)
    elif args.startup == "mesh3d":
        device_mesh_3d(**given)
    else:
        vllm_group_coordinators(**given)


if __name__ == "__main__":
    main()


def tagged_pipeline_groups() -> None:
    """Production-style code: plain torch calls, tagged with simnccl.tags (no simnccl apply() needed)."""
    from simnccl.tags import group_tags, new_group

    dist.init_process_group("nccl")
    world = dist.get_world_size()
    with group_tags(purpose="pp", traffic="p2p"):
        dist.new_group([r for r in range(world) if r % 2 == 0])
    new_group([r for r in range(world) if r % 2 == 1], purpose="tp", traffic="collectives")
    dist.new_group(list(range(world)))


def megatron_style_loops(tp: int = 2) -> None:
    """Every rank creates every tp group, then every dp group (``new_group`` loops, as Megatron does), then an
    all_reduce on its own two."""
    torch.cuda.set_device(_local_rank())
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = []
    for ranks in [list(range(i, i + tp)) for i in range(0, world, tp)] + [list(range(j, world, tp)) for j in range(tp)]:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine.append(group)
    for group in mine:
        dist.all_reduce(torch.ones(1024, device="cuda"), group=group)


def sets_nccl2_knob(on_ranks: tuple[int, ...] | None = None, gloo_first: bool = False) -> None:
    """Sets ``TORCH_DIST_USE_NCCL2=0`` in ``os.environ`` on ``on_ranks`` (None: every rank) before its first use
    of "nccl", where real torch reads it: its init_process_group, or (``gloo_first``) an nccl group after a gloo
    default group."""
    if gloo_first:
        dist.init_process_group("gloo")
    if on_ranks is None or int(os.environ["RANK"]) in on_ranks:
        os.environ["TORCH_DIST_USE_NCCL2"] = "0"
    torch.cuda.set_device(_local_rank())
    group = dist.new_group(list(range(int(os.environ["WORLD_SIZE"]))), backend="nccl") if gloo_first else None
    if not gloo_first:
        dist.init_process_group("nccl")
    dist.all_reduce(torch.ones(16, device="cuda"), group=group)


def device_mesh_after_barrier(dp: int = 2, tp: int = 4) -> None:
    """A barrier on the default group, then ``init_device_mesh``: a lazy_init default group is initialised
    (and so a split source) by then, so DeviceMesh's split_group works under ``lazy-init`` too."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.cuda.set_device(_local_rank())
    dist.init_process_group(backend="nccl")
    dist.barrier()
    init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))


def caught_rejections() -> None:
    """Defensive startup code: calls torch rejects before it makes anything, caught, then the group it falls back
    to (real gloo: exit 0, one group)."""
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    for bad in ([world + 5], [0, 0]):  # out of range, duplicated: torch's ValueError before its group counter
        with contextlib.suppress(ValueError):
            dist.new_group(bad)
    with contextlib.suppress(ValueError):
        dist.init_process_group("nccl")  # twice: torch's ValueError
    dist.new_group(list(range(world)))


def reinit_cycles(cycles: int = 2) -> None:
    """A test suite's fixtures: init, an all_reduce, destroy, as many times as there are cases."""
    torch.cuda.set_device(_local_rank())
    for _ in range(cycles):
        dist.init_process_group("nccl")
        dist.all_reduce(torch.ones(2, device="cuda"))
        dist.destroy_process_group()


def collective_on(backend: str | None, devices: tuple[str, ...] = ("cuda",), device_id: bool = False) -> None:
    """``init_process_group(backend)`` (None: torch picks), then an all_reduce of a tensor on each of ``devices``."""
    torch.cuda.set_device(_local_rank())
    kwargs: dict[str, object] = {} if backend is None else {"backend": backend}
    if device_id:
        kwargs["device_id"] = torch.device("cuda", _local_rank())
    dist.init_process_group(**kwargs)  # type: ignore[arg-type]
    for device in devices:
        dist.all_reduce(torch.ones(2, device=device))


def object_collectives(broadcast: bool = False) -> None:
    """vLLM/Megatron-style object collectives on an nccl group: every rank gathers every rank's dict; with
    ``broadcast``, rank 0's config reaches the others (``broadcast_object_list``)."""
    torch.cuda.set_device(_local_rank())
    dist.init_process_group("nccl")
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rank": dist.get_rank()})
    if broadcast:
        config = [{"tp": 2}] if dist.get_rank() == 0 else [None]
        dist.broadcast_object_list(config, src=0)


def monitored(backend: str) -> None:
    """``monitored_barrier`` on a new group of ``backend`` (real torch: gloo's only)."""
    torch.cuda.set_device(_local_rank())
    dist.init_process_group("nccl")
    group = dist.new_group(backend=backend)
    dist.monitored_barrier(group=group, timeout=timedelta(seconds=10))


def device_capability(backend: str) -> list[str]:
    """What torch says a default group of ``backend`` serves (``_device_capability``), as code that picks a device
    from it reads it; a ``monitored_barrier`` that falls back to ``barrier`` where the group has no CPU backend."""
    torch.cuda.set_device(_local_rank())
    dist.init_process_group(backend)
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=10))
    except ValueError:  # torch: "monitored_barrier requires a group with a CPU-capable backend (e.g. GLOO)."
        dist.barrier()
    return dist.distributed_c10d._device_capability()


def rooted_calls(kind: str) -> None:
    """gloo's rooted collectives as a startup might call them (found by a tester: the capture recorded reduce as an
    all_reduce, gather as an all_gather, scatter as a broadcast and monitored_barrier as a barrier, so ranks naming
    different roots, or mixing reduce with all_reduce, passed where real gloo times out, 3 runs of 3)."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(4)
    if kind == "same-roots":
        dist.reduce(t, dst=1)
        dist.gather(t, [torch.zeros(4) for _ in range(world)] if rank == 2 else None, dst=2)
        dist.scatter(t, [torch.ones(4) for _ in range(world)] if rank == 0 else None, src=0)
        dist.monitored_barrier(timeout=timedelta(seconds=10))
    elif kind == "reduce-own-root":
        dist.reduce(t, dst=rank)
    elif kind == "gather-own-root":
        dist.gather(t, [torch.zeros(4) for _ in range(world)], dst=rank)
    elif kind == "reduce-vs-all-reduce":
        dist.reduce(t, dst=0) if rank == 0 else dist.all_reduce(t)
    elif kind == "scatter-vs-broadcast":
        if rank == 0:
            dist.scatter(t, [torch.ones(4) for _ in range(world)], src=0)
        else:
            dist.broadcast(t, src=0)
    elif kind == "monitored-vs-barrier":
        dist.monitored_barrier(timeout=timedelta(seconds=10)) if rank == 0 else dist.barrier()
    dist.destroy_process_group()


def tagged_p2p(recv_tag: int) -> None:
    """Rank 0 sends with tag 1, rank 1 receives with ``recv_tag`` (gloo matches by tag; the capture dropped it)."""
    dist.init_process_group("gloo")
    t = torch.ones(4)
    if dist.get_rank() == 0:
        dist.send(t, 1, tag=1)
    else:
        dist.recv(t, 0, tag=recv_tag)
    dist.destroy_process_group()


def recv_from_any() -> None:
    """Rank 0 receives from whoever sends (``recv`` without ``src``: gloo runs it)."""
    dist.init_process_group("gloo")
    t = torch.ones(4)
    if dist.get_rank() == 0:
        dist.recv(t)
    else:
        dist.send(t, 0)
    dist.destroy_process_group()


def object_gathers_of_different_sizes() -> None:
    """Each rank's object pickles to its own size (DCP's planning gathers such): torch pads them to the largest."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    obj = {"rank": rank, "pad": "x" * 100 * rank}
    dist.all_gather_object([None] * world, obj)
    dist.gather_object(obj, [None] * world if rank == 0 else None, dst=0)
    dist.destroy_process_group()


def gloo_refused(kind: str) -> None:
    """Calls ProcessGroupGloo refuses on the calling rank (torch 2.15: every rank raises)."""
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    t = torch.ones(4)
    if kind == "premul-sum":
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
    elif kind == "band-float":
        dist.all_reduce(t, op=dist.ReduceOp.BAND)
    elif kind == "band-int":
        dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BAND)
    elif kind == "all-gather-list":
        dist.all_gather([torch.zeros(4) for _ in range(world + 1)], t)
    dist.destroy_process_group()


def gloo_list_checks(kind: str) -> None:
    """Lists ProcessGroupGloo checks on the calling rank (torch 2.15: the root, or every rank, raises)."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(4)
    if kind == "gather-list":
        dist.gather(t, [torch.zeros(4) for _ in range(world + 1)] if rank == 0 else None, dst=0)
    elif kind == "scatter-list":
        dist.scatter(t, [torch.ones(4) for _ in range(world + 1)] if rank == 0 else None, src=0)
    elif kind == "all-gather-sizes":
        dist.all_gather([torch.zeros(4), torch.zeros(8)], t)
    elif kind == "negative-tag":
        dist.send(t, 1, tag=-1) if rank == 0 else dist.recv(t, 0, tag=-1)
    elif kind == "batch-tag":
        peer = 1 - rank
        ops = [dist.P2POp(dist.isend, t, peer, tag=1), dist.P2POp(dist.irecv, torch.zeros(4), peer, tag=1)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    dist.destroy_process_group()
