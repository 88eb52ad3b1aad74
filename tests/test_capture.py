"""``simnccl.capture`` on real torch 2.15 (CPU): unmodified torch code in, the framework generators' Programs out.

The startups under capture are plain torch (``tests/capture_examples.py``): torchtitan's ``build_mesh`` written
with DeviceMesh's own ``_unflatten``/``_flatten``, bare ``init_device_mesh`` meshes, and vLLM's GroupCoordinator
loop. Real torch is ground truth: each capture is compared with the generator, op for op, after one
normalisation: ``bind``/``purpose``/``traffic`` are simnccl annotations (the name of the variable a framework
stores a group in, and what it is for), not torch arguments, so capture cannot see them; handles are compared up
to renaming (first appearance order), which checks that the same calls bind and use the same groups.

Each capture forks one child per rank from this worker (torch imported once), so a world of 8 takes well under
a second once torch's lazy imports are paid.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import no_child_left_behind

pytest.importorskip("torch")

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

import capture_examples as examples

from simnccl import capture as cap
from simnccl.ops import (
    AllGather,
    Alloc,
    AllReduce,
    AllToAll,
    Barrier,
    BatchIsendIrecv,
    Broadcast,
    Checkpoint,
    InitProcessGroup,
    NewGroup,
    Op,
    PgOptions,
    Recv,
    ReduceScatter,
    Send,
    SetDevice,
    SplitGroup,
)
from simnccl.scenario import load_scenario
from simnccl.testing import simulate
from simnccl.workloads import generate, torchtitan

pytestmark = pytest.mark.torch

EXAMPLES = Path(__file__).parent / "capture_examples.py"
_LOCAL_RANK_BEFORE = os.environ.get("LOCAL_RANK")


# ---------------------------------------------------------------------------------------------- helpers


def normalised(ops: tuple[Op, ...]) -> list[Op]:
    """Drop simnccl's annotations and rename handles by first appearance (see the module docstring)."""
    names: dict[str, str] = {"world": "world"}

    def rename(handle: str | None) -> str | None:
        if handle is None:
            return None
        return names.setdefault(handle, f"h{len(names)}")

    out = []
    for op in ops:
        changes: dict[str, Any] = {}
        for field in ("bind", "group", "parent"):
            if hasattr(op, field):
                changes[field] = rename(getattr(op, field))
        for field in ("purpose", "traffic"):
            if hasattr(op, field):
                changes[field] = None
        out.append(dataclasses.replace(op, **changes))
    return out


def groups_of(outcome: Any) -> dict[Any, Any]:
    return {
        key: (rec.desc, rec.impl, rec.via_split, {r: m.get("bytes") for r, m in sorted(rec.members.items())})
        for key, rec in outcome.groups.items()
    }


def memory_of(outcome: Any) -> dict[str, Any]:
    ledgers = {d: (ledger.used_bytes, ledger.peak_bytes) for d, ledger in sorted(outcome.ledgers.items())}
    points = {
        label: {d: s.used_bytes for d, s in sorted(snaps.items())} for label, snaps in outcome.checkpoints.items()
    }
    return {"ledgers": ledgers, "checkpoints": points}


def replay_generator(programs: tuple[Any, ...], gpus_per_node: int, env: dict[str, str] | None = None) -> Any:
    nodes = len(programs) // gpus_per_node
    return simulate([p.ops for p in programs], gpu="h100-80gb", nodes=nodes, gpus_per_node=gpus_per_node, env=env or {})


# ---------------------------------------------------------------------------------------------- DeviceMesh


TITAN_CASES = {
    # name: (capture env, torchtitan_build_mesh kwargs, generator args). On 2.15 the nccl2 default group is
    # bound even without device_id, so real DeviceMesh takes split_group: the generator's split_group branch.
    "fsdp2-tp4-2.15": ({}, {"tp": 4}, {"tp": 4, "split_group": True}),
    "fsdp2-tp4-legacy": ({"TORCH_DIST_USE_NCCL2": "0"}, {"tp": 4}, {"tp": 4}),
    "fsdp2-tp4-device-id": ({}, {"tp": 4, "device_id": True}, {"tp": 4, "device_id": True}),
}


@pytest.mark.parametrize("case", list(TITAN_CASES))
def test_torchtitan_build_mesh_capture_equals_the_generator(case: str) -> None:
    """ACCEPTANCE: a 2-D (dp_shard 2 x tp 4) DeviceMesh build on 8 simulated ranks equals the torchtitan
    generator op for op, and replayed in the simulator reproduces its groups and per-device memory exactly."""
    env, kwargs, args = TITAN_CASES[case]
    target = functools.partial(examples.torchtitan_build_mesh, **kwargs)
    run = cap.capture(target, 8, env=env, final_checkpoint="startup")
    generated = generate("torchtitan", args, 8)
    assert len(set(map(id, run.programs))) == len(set(map(id, generated)))  # same sharing between ranks
    for rank in range(8):
        assert normalised(run.programs[rank].ops) == normalised(generated[rank].ops), f"rank {rank}"

    captured = run.simulate(gpu="h100-80gb")
    expected = replay_generator(generated, 8, env)
    assert captured.verdict == expected.verdict == "pass"
    assert groups_of(captured) == groups_of(expected)
    assert memory_of(captured) == memory_of(expected)
    assert len(captured.groups) > 20  # the duplicates DeviceMesh creates are all there

    if case == "fsdp2-tp4-2.15":
        # Documented in workloads/torchtitan.py: the generator's default (a new_group loop, what 2.14/legacy
        # do) prices the same memberships as the split_group branch real 2.15 takes; only names differ.
        loop = replay_generator(generate("torchtitan", {"tp": 4}, 8), 8)
        assert memory_of(captured) == memory_of(loop)
        assert sorted(k[1] for k in captured.groups) == sorted(k[1] for k in loop.groups)
        assert groups_of(captured) != groups_of(loop)


def test_init_device_mesh_2d_groups_and_collective() -> None:
    run = cap.capture(examples.device_mesh_2d, 8)
    ops = run.programs[5].ops
    splits = [op for op in ops if isinstance(op, SplitGroup)]
    assert [s.split_ranks for s in splits] == [
        tuple(torchtitan.mesh_groups((2, 4), (0,))),
        tuple(torchtitan.mesh_groups((2, 4), (1,))),
    ]
    assert [s.group_desc for s in splits] == ["mesh_dp", "mesh_tp"]
    (reduce,) = [op for op in ops if isinstance(op, AllReduce)]
    assert reduce == AllReduce(group=splits[1].bind, size_bytes=1024 * 4, dtype="Float")
    assert ops[:3] == (SetDevice(), InitProcessGroup(backend="nccl"), Checkpoint("after_init"))
    assert run.programs[0] is run.programs[7]  # rank-independent calls: one shared Program
    outcome = run.simulate(gpu="h100-80gb")
    assert outcome.verdict == "pass"
    assert sorted(k[1] for k in outcome.groups) == sorted(
        [tuple(range(8)), *torchtitan.mesh_groups((2, 4), (0,)), *torchtitan.mesh_groups((2, 4), (1,))]
    )


def test_init_device_mesh_3d_legacy_loops_new_group_in_mesh_order() -> None:
    run = cap.capture(examples.device_mesh_3d, 8, env={"TORCH_DIST_USE_NCCL2": "0"})
    new_groups = [op for op in run.programs[0].ops if isinstance(op, NewGroup)]
    expected = [
        (ranks, f"mesh_{name}")
        for dim, name in enumerate(("pp", "dp", "tp"))
        for ranks in torchtitan.mesh_groups((2, 2, 2), (dim,))
    ]
    assert [(g.ranks, g.group_desc) for g in new_groups] == expected
    assert len({g.bind for g in new_groups}) == 3  # one handle per dim: every rank is in one group of each
    assert run.simulate(gpu="h100-80gb", env={"TORCH_DIST_USE_NCCL2": "0"}).verdict == "pass"


def test_fork_and_inline_modes_capture_the_same_programs() -> None:
    target = functools.partial(examples.torchtitan_build_mesh, tp=2)
    forked = cap.capture(target, 4, mode="fork")
    inline = cap.capture(target, 4, mode="inline")
    assert [p.ops for p in forked.programs] == [p.ops for p in inline.programs]
    assert not dist.is_initialized()  # inline mode leaves no process group behind
    assert "LOCAL_RANK" not in os.environ or os.environ["LOCAL_RANK"] == _LOCAL_RANK_BEFORE


def test_a_larger_world_is_a_recapture_and_still_equals_the_generator() -> None:
    target = functools.partial(examples.torchtitan_build_mesh, tp=4)
    runs = cap.capture_scaled(target, [8, 16], final_checkpoint="startup")
    for world, run in runs.items():
        generated = generate("torchtitan", {"tp": 4, "split_group": True}, world)
        assert normalised(run.programs[-1].ops) == normalised(generated[-1].ops)
    big = runs[16]
    assert (big.nodes, big.gpus_per_node) == (2, 8)
    captured = big.simulate(gpu="h100-80gb")
    expected = replay_generator(generate("torchtitan", {"tp": 4, "split_group": True}, 16), 8)
    assert memory_of(captured) == memory_of(expected)


# ---------------------------------------------------------------------------------------------- vLLM


@pytest.mark.parametrize(
    ("knobs", "world"),
    [({"tp": 8}, 8), ({"tp": 2, "pp": 2}, 8), ({"tp": 2, "pp": 2, "dcp": 2, "moe": True}, 8)],
    ids=["tp8", "tp2-pp2-dp2", "tp2-pp2-dcp2-moe"],
)
def test_vllm_group_coordinator_loop_equals_the_vllm_generators_group_list(knobs: dict[str, Any], world: int) -> None:
    run = cap.capture(functools.partial(examples.vllm_group_coordinators, **knobs), world)
    generated = generate("vllm", knobs, world)

    def group_list(ops: tuple[Op, ...]) -> list[tuple[Any, ...]]:
        return [
            (op.ranks, op.backend, op.use_local_synchronization, op.group_desc, op.pg_options)
            for op in ops
            if isinstance(op, NewGroup)
        ]

    assert group_list(run.programs[0].ops) == group_list(generated[0].ops)
    assert len(set(map(id, run.programs))) == 1  # every rank makes every call: one Program
    # a non-member's calls are recorded too: rank 0 is not in the second TP group, yet calls new_group for it
    calls = [c for c in run.calls[0] if c.name == "new_group"]
    assert len(calls) == len(group_list(generated[0].ops))


# ---------------------------------------------------------------------------------------------- the call vocabulary


def _traffic() -> None:
    """Every kind of collective and p2p the stand-in records, on the world and on subgroups."""
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    options = dist.ProcessGroupNCCL.Options()
    options.lazy_init = True
    options.is_high_priority_stream = True
    dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
    rank = dist.get_rank()
    pair = dist.new_group([2, 3], pg_options=options, group_desc="pair", timeout=__import__("datetime").timedelta(9))
    cpu = dist.new_group([0, 1, 2, 3], backend="gloo", use_local_synchronization=True)
    cuda = torch.device("cuda")  # the nccl groups' tensors (nccl serves cuda only); the gloo group's on cpu
    x = torch.ones(8, dtype=torch.bfloat16, device=cuda)
    dist.broadcast(x, src=0)
    out = [torch.empty(8, dtype=torch.bfloat16, device=cuda) for _ in range(4)]
    dist.all_gather(out, x)
    dist.all_gather_into_tensor(torch.empty(32, dtype=torch.bfloat16, device=cuda), x)
    dist.reduce_scatter_tensor(torch.empty(2, dtype=torch.bfloat16, device=cuda), x)
    dist.all_to_all_single(torch.empty(8, dtype=torch.bfloat16, device=cuda), x)
    if rank in (2, 3):
        peer = 5 - rank
        (dist.send if rank == 2 else dist.recv)(torch.zeros(16, dtype=torch.int64, device=cuda), peer, group=pair)
    gathered = [torch.empty(2, dtype=torch.int32) for _ in range(4)]
    dist.all_gather(gathered, torch.tensor([rank, 7], dtype=torch.int32), group=cpu)
    assert gathered[0].tolist() == [rank, 7]  # no communication: every slot holds this rank's own input
    cap.checkpoint("traffic")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def traffic() -> cap.CapturedRun:
    return cap.capture(_traffic, 4, gpus_per_node=4, final_checkpoint=None)


def test_collectives_and_p2p_record_kind_group_bytes_dtype_and_peer(traffic: cap.CapturedRun) -> None:
    ops = traffic.programs[2].ops
    kinds = [type(op) for op in ops]
    assert kinds[:4] == [SetDevice, InitProcessGroup, Checkpoint, NewGroup]
    assert ops[1] == InitProcessGroup(backend="nccl", device_id=2)
    pair = ops[3]
    assert pair == NewGroup(
        ranks=(2, 3),
        bind=pair.bind,
        pg_options=PgOptions(lazy_init=True, is_high_priority_stream=True),
        group_desc="pair",
        timeout_s=9 * 86400.0,
    )
    cpu = ops[4]
    assert (cpu.backend, cpu.use_local_synchronization, cpu.ranks) == ("gloo", True, (0, 1, 2, 3))
    traffic_ops = [op for op in ops if not isinstance(op, (SetDevice, InitProcessGroup, NewGroup, Checkpoint, Alloc))]
    assert traffic_ops[:5] == [
        Broadcast(size_bytes=16, dtype="BFloat16", src=0),
        AllGather(size_bytes=16, dtype="BFloat16"),
        AllGather(size_bytes=16, dtype="BFloat16"),
        ReduceScatter(size_bytes=16, dtype="BFloat16"),
        AllToAll(size_bytes=16, dtype="BFloat16"),
    ]
    assert traffic_ops[5] == Send(peer=3, group=pair.bind, size_bytes=128, dtype="Long")
    assert Recv(peer=2, group=pair.bind, size_bytes=128, dtype="Long") in traffic.programs[3].ops
    assert AllGather(group=cpu.bind, size_bytes=8, dtype="Int") in traffic_ops[6:]
    assert Checkpoint("traffic") in ops
    assert isinstance(traffic_ops[-2], Barrier) and traffic_ops[-1].name == "destroy_process_group"


def test_non_members_record_the_call_and_calls_keep_their_arguments(traffic: cap.CapturedRun) -> None:
    rank0 = traffic.programs[0].ops
    assert any(isinstance(op, NewGroup) and op.ranks == (2, 3) for op in rank0)  # not a member, still recorded
    assert not any(isinstance(op, (Send, Recv)) for op in rank0)
    init = next(c for c in traffic.calls[2] if c.name == "init_process_group")
    assert init.args["device_id"] == "cuda:2" and init.handle == "world"
    new_group = next(c for c in traffic.calls[2] if c.name == "new_group")
    assert new_group.args["pg_options"] == {"lazy_init": True, "is_high_priority_stream": True}
    json.dumps(traffic.to_json())  # calls are plain data


def test_replay_of_the_traffic_capture(traffic: cap.CapturedRun) -> None:
    outcome = traffic.simulate(gpu="h100-80gb")
    assert outcome.verdict == "pass", outcome.errors or outcome.hangs
    assert "traffic" in outcome.checkpoints


def _batched_ring(mixed: bool = False) -> None:
    """A pipeline stage's exchange: send to the next rank, receive from the previous one, in one batch."""
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    out, back = torch.ones(256, device="cuda"), torch.empty(256, device="cuda")
    ops = [dist.P2POp(dist.isend, out, (rank + 1) % world), dist.P2POp(dist.irecv, back, (rank - 1) % world)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    if mixed and rank == 0:  # tensors of two sizes in one batch
        dist.batch_isend_irecv([dist.P2POp(dist.isend, out, 1), dist.P2POp(dist.isend, out[:8], 2)])
    dist.destroy_process_group()


def test_batch_isend_irecv_is_recorded_as_one_batch_and_its_ring_passes() -> None:
    """Recorded as its sends and recvs one by one, each blocking, the ring was simulated as a hang."""
    run = cap.capture(_batched_ring, 4, gpus_per_node=4, final_checkpoint=None)
    for rank, program in enumerate(run.programs):
        batches = [op for op in program.ops if isinstance(op, BatchIsendIrecv)]
        assert batches == [BatchIsendIrecv(sends=((rank + 1) % 4,), recvs=((rank - 1) % 4,), size_bytes=1024)]
        assert not any(isinstance(op, (Send, Recv)) for op in program.ops)
    outcome = run.simulate(gpu="h100-80gb")
    assert outcome.verdict == "pass", outcome.hangs or outcome.errors


def test_a_batch_of_tensors_of_several_sizes_records_each_ones_size() -> None:
    run = cap.capture(functools.partial(_batched_ring, True), 4, gpus_per_node=4, final_checkpoint=None)
    assert [op for op in run.programs[0].ops if isinstance(op, BatchIsendIrecv)][1] == BatchIsendIrecv(
        sends=(1, 2), size_bytes=1024, send_bytes=(1024, 32)
    )
    assert not any("batch_isend_irecv" in note for note in run.notes)


def _tensor_on(device: str | None, *, set_device: bool) -> None:
    """An all_reduce of a tensor on ``device`` (None: the rank's own GPU); ``set_device``: to the rank's GPU."""
    local = int(os.environ["LOCAL_RANK"])
    if set_device:
        torch.cuda.set_device(local)
    own = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=None if set_device else own)
    dist.all_reduce(torch.zeros(1, device=device or own))
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("device", "set_device", "release", "error"),
    [
        # every rank's tensor on cuda:0, each rank's current device its own
        ("cuda:0", True, "2.14", "Multiple Ranks are using the same GPU"),  # legacy keys its communicator by it
        ("cuda:0", True, "2.15", "bound to device cuda:1 but an operation was issued on cuda:0"),
        (None, False, "2.15", None),  # on the bound device, with no set_device (current device 0)
        (None, False, "2.14", None),
    ],
)
def test_a_collective_runs_on_its_tensors_device_not_the_current_one(
    device: str | None, set_device: bool, release: str, error: str | None
) -> None:
    """The first captured as a pass (the simulator read the current device); the last two as nccl2's or legacy's
    wrong-device error."""
    target = functools.partial(_tensor_on, device, set_device=set_device)
    run = cap.capture(target, 2, final_checkpoint=None, release=release)
    outcome = run.simulate(gpu="h100-80gb", release=release)
    if error is None:
        assert outcome.verdict == "pass", outcome.errors
    else:
        assert outcome.verdict != "pass" and any(error in e["message"] for e in outcome.errors), outcome.errors


def _sets_knobs(per_rank: bool) -> None:
    """Every rank on cuda:0, NCCL told to allow it in the code; ``per_rank``: NCCL_DEBUG differs by rank."""
    os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    if per_rank:
        os.environ["NCCL_DEBUG"] = "INFO" if os.environ["RANK"] == "0" else "WARN"
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    dist.all_reduce(torch.ones(4, device="cuda:0"))
    dist.destroy_process_group()


def test_nccl_knobs_the_code_sets_in_os_environ_are_simulated_with_it() -> None:
    """NCCL reads them when it makes a communicator; the capture restored the environment after each rank and
    simulated without them: this rank sharing a GPU failed with NCCL's "Multiple Ranks are using the same GPU"."""
    run = cap.capture(functools.partial(_sets_knobs, False), 2, final_checkpoint=None)
    assert run.env.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1"
    assert any("set NCCL_MULTI_RANK_GPU_ENABLE=1 in os.environ: simulated with it" in n for n in run.notes)
    assert run.simulate().verdict == "pass"
    assert 'env = { "NCCL_MULTI_RANK_GPU_ENABLE" = "1" }' in run.to_scenario_toml("knobs")
    assert "NCCL_MULTI_RANK_GPU_ENABLE" not in os.environ  # the capturing process's own is as it was


def test_knobs_the_ranks_set_differently_are_named_and_left_out() -> None:
    run = cap.capture(functools.partial(_sets_knobs, True), 2, final_checkpoint=None)
    assert "NCCL_DEBUG" not in run.env and run.env.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1"
    assert any("NCCL_DEBUG (ranks set it differently)" in n and "simulated without it" in n for n in run.notes)


def _sets_flight_recorder(per_rank: bool) -> None:
    """The flight recorder's buffer set by the code (torch reads it at its first ProcessGroupNCCL), and its dump
    folder per rank when ``per_rank`` (a path only reports name)."""
    os.environ["TORCH_FR_BUFFER_SIZE"] = "64"
    if per_rank:
        os.environ["TORCH_FR_DUMP_TEMP_FILE"] = f"/tmp/fr-{os.environ['RANK']}/trace_"
    dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
    dist.all_reduce(torch.ones(4, device="cuda"))
    dist.destroy_process_group()


def test_flight_recorder_knobs_the_code_sets_are_simulated_with_and_a_per_rank_dump_path_only_named() -> None:
    """TORCH_FR_* were not among the knobs a capture saw the code set: a flight recorder the code sized was
    simulated at torch's default. A dump path set per rank changes only where dumps go: named, not refused. (The
    capture runs its ranks with TORCH_FR_BUFFER_SIZE=0 for itself: a code that sets that very value is not seen.)"""
    run = cap.capture(functools.partial(_sets_flight_recorder, True), 2, final_checkpoint=None)
    assert run.env.get("TORCH_FR_BUFFER_SIZE") == "64"
    assert "TORCH_FR_DUMP_TEMP_FILE" not in run.env
    assert any("TORCH_FR_DUMP_TEMP_FILE (ranks set it differently)" in n for n in run.notes), run.notes


def test_knobs_a_policy_sets_are_the_policys_not_the_codes() -> None:
    run = cap.capture(examples.device_mesh_2d, 8, policy="share-resources")
    assert "NCCL_COMM_SPLIT_SHARE_RESOURCES" not in run.env
    assert not any("in os.environ" in n for n in run.notes)


def _in_device_block(block: str, *, set_device: bool) -> None:
    """An all_reduce inside ``with torch.cuda.device(...)`` (``block``: "0" or "local")."""
    local = int(os.environ["LOCAL_RANK"])
    if set_device:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    with torch.cuda.device(0 if block == "0" else local):
        dist.all_reduce(torch.zeros(1, device="cuda"))
    if set_device:
        dist.all_reduce(torch.zeros(1, device="cuda"))  # back on the device before the block
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("block", "set_device", "release", "error"),
    [
        ("0", True, "2.14", "Multiple Ranks are using the same GPU"),
        ("0", True, "2.15", "bound to device cuda:1 but an operation was issued on cuda:0"),
        ("local", False, "2.15", None),  # nccl2 binds LOCAL_RANK at init; the block's tensors are there
    ],
)
def test_a_with_cuda_device_block_is_recorded_as_set_device(
    block: str, set_device: bool, release: str, error: str | None
) -> None:
    """``with torch.cuda.device(i)`` switched the current device without a record: a block on cuda:0 after
    set_device(LOCAL_RANK) captured as a pass, one on LOCAL_RANK without set_device as NCCL's error."""
    target = functools.partial(_in_device_block, block, set_device=set_device)
    outcome = cap.capture(target, 2, final_checkpoint=None, release=release).simulate(gpu="h100-80gb", release=release)
    if error is None:
        assert outcome.verdict == "pass", outcome.errors
    else:
        assert any(error in e["message"] for e in outcome.errors), outcome.errors


def _knob_around_init(when: str) -> None:
    """Every rank on cuda:0; NCCL told to allow it ``when``: "after" the first all_reduce made the communicator,
    or "during" its creation only (set before init_process_group, deleted after)."""
    if when == "during":
        os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    os.environ["NCCL_NVLS_ENABLE"] = "abc"  # NCCL warns and keeps its default
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    os.environ.pop("NCCL_MULTI_RANK_GPU_ENABLE", None)
    dist.all_reduce(torch.ones(4, device="cuda:0"))
    if when == "after":
        os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    dist.destroy_process_group()


@pytest.mark.parametrize("when", ["during", "after"])
def test_a_knob_that_changed_after_init_process_group_is_not_guessed_at(when: str) -> None:
    """NCCL reads its knobs when it makes a communicator: at init for an eager one, at the first collective for a
    lazy one. The rank's end was taken: a knob set after the communicator was made passed a run that fails. Then
    the one at init was: a knob set around init only passed legacy's lazy communicator, made when it was gone.
    A knob the simulation reads whose value changed between the two moments is refused (exit 2): simnccl simulates
    one value for the run; a value simnccl cannot use stopped the simulation (exit 2), where NCCL goes on with its
    default, so it is named and left out."""
    target = functools.partial(_knob_around_init, when)
    if when == "during":
        with pytest.raises(cap.CaptureError, match=r"changed NCCL_MULTI_RANK_GPU_ENABLE in os.environ between init"):
            cap.capture(target, 2, final_checkpoint=None)
        return
    run = cap.capture(target, 2, final_checkpoint=None)
    assert run.simulate().verdict == "error"  # every rank on cuda:0, NCCL not told to allow it
    assert "NCCL_MULTI_RANK_GPU_ENABLE" not in run.env and "NCCL_NVLS_ENABLE" not in run.env
    assert any("NCCL_NVLS_ENABLE=abc (expected an integer" in n and "simulated without it" in n for n in run.notes)


def _connects_at_init_on(ranks: str) -> None:
    """``NCCL_RUNTIME_CONNECT=0`` (every connection made at init) set by the code on ``ranks``: "0", "all" or
    "none"."""
    if ranks == "all" or (ranks == "0" and os.environ["RANK"] == "0"):
        os.environ["NCCL_RUNTIME_CONNECT"] = "0"
    dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
    dist.all_reduce(torch.ones(4, device="cuda"))
    dist.destroy_process_group()


def test_a_simulated_knob_the_ranks_set_differently_is_refused_not_left_out() -> None:
    """Rank 0's code set NCCL_RUNTIME_CONNECT=0: its communicators connect everything at init (more memory than its
    peers'). simnccl simulates one environment for all ranks; it simulated the run without the knob, noted, and
    passed it: now refused, naming the values by rank. Set alike on every rank, it is simulated with it."""
    with pytest.raises(cap.CaptureError, match=r"set NCCL_RUNTIME_CONNECT in os.environ differently on different"):
        cap.capture(functools.partial(_connects_at_init_on, "0"), 4, final_checkpoint=None)
    try:
        cap.capture(functools.partial(_connects_at_init_on, "0"), 4, final_checkpoint=None)
    except cap.CaptureError as err:
        assert "rank(s) 0: '0'; rank(s) 1-3: not set" in str(err)
    alike = cap.capture(functools.partial(_connects_at_init_on, "all"), 4, final_checkpoint=None)
    assert alike.env.get("NCCL_RUNTIME_CONNECT") == "0"
    default = cap.capture(functools.partial(_connects_at_init_on, "none"), 4, final_checkpoint=None)
    peaks = [max(ledger.peak_bytes for ledger in run.simulate().ledgers.values()) for run in (alike, default)]
    assert peaks[0] > peaks[1]  # the knob the refusal is about changes memory


def _set_device_as(device: Any) -> None:
    torch.cuda.set_device(device)


@pytest.mark.parametrize(
    ("device", "error"),
    [
        ("cuda", "Expected a torch.device with a specified index or an integer, but got:cuda"),
        ("cpu", "Expected a cuda device, but got: cpu"),
        (-1, None),  # torch's no-op
    ],
)
def test_set_device_takes_what_torch_takes(device: Any, error: str | None) -> None:
    """The stand-in took "cuda" and "cpu" as device 0, and refused -1, which torch ignores."""
    if error is None:
        run = cap.capture(functools.partial(_set_device_as, device), 1, final_checkpoint=None)
        assert not any(isinstance(op, SetDevice) for op in run.programs[0].ops)
        return
    with pytest.raises(cap.CaptureError, match=error):
        cap.capture(functools.partial(_set_device_as, device), 1, final_checkpoint=None)


# ---------------------------------------------------------------------------------------------- files and CLI


def test_scenario_toml_round_trips_to_the_same_programs(tmp_path: Path, traffic: cap.CapturedRun) -> None:
    path = tmp_path / "captured.toml"
    path.write_text(traffic.to_scenario_toml("traffic", gpu="h100-80gb"), encoding="utf-8")
    scenario = load_scenario(path)
    assert [p.ops for p in scenario.programs] == [p.ops for p in traffic.programs]
    assert scenario.cluster.world_size == 4


def test_cli_captures_a_script_simulates_and_writes_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    toml, data = tmp_path / "mesh.toml", tmp_path / "mesh.json"
    argv = ["--world", "8", "--simulate", "--toml", str(toml), "--json", str(data), str(EXAMPLES), "mesh2d"]
    assert cap.main(argv) == 0
    out = capsys.readouterr().out
    assert "captured 8 ranks" in out and "2 split_group" in out and "default  torch 2.15.0" in out
    assert "captured  default  pass  ok  peak " in out  # the simulated variant's summary line
    assert len(load_scenario(toml).programs) == 8
    doc = json.loads(data.read_text())  # the document every simnccl command writes
    assert doc["command"] == "capture" and doc["ok"] is True
    (record,) = doc["results"]
    assert record["capture"]["programs"][0]["ranks"] == list(range(8))
    assert record["simulated"]["variants"][0]["verdict"] == "pass"


def test_cli_runs_a_module_with_its_own_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    (tmp_path / "capmod.py").write_text(
        "import sys, torch.distributed as dist\n"
        "if __name__ == '__main__':\n"
        "    dist.init_process_group('nccl')\n"
        "    for _ in range(int(sys.argv[2])):\n"
        "        dist.new_group([0])\n"
        "    sys.exit(0)  # a normal end: the calls are kept\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cap.main(["--world", "2", "-m", "capmod", "--groups", "3"]) == 0
    assert "3 new_group" in capsys.readouterr().out


def test_a_script_imports_a_module_beside_it_and_m_finds_one_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """As ``python train.py`` and ``python -m train`` do; runpy adds neither directory, and a script importing its
    own helper module failed the capture (exit 2, ModuleNotFoundError) where torchrun runs it."""
    (tmp_path / "helpers_beside.py").write_text(
        "import torch.distributed as dist\ndef init():\n    dist.init_process_group('nccl')\n", encoding="utf-8"
    )
    (tmp_path / "train_beside.py").write_text(
        "from helpers_beside import init\ninit()\nimport torch.distributed as dist\ndist.barrier()\n", encoding="utf-8"
    )
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    for argv in (["--no-preload"], []):
        assert cap.main(["--world", "2", "--simulate", *argv, str(tmp_path / "train_beside.py")]) == 0, (
            capsys.readouterr()
        )
    monkeypatch.chdir(tmp_path)
    assert cap.main(["--world", "2", "--simulate", "-m", "train_beside"]) == 0, capsys.readouterr()
    assert str(tmp_path) not in sys.path and os.getcwd() not in sys.path[:1]


def test_a_scripts_directory_serves_its_exit_handlers_its_step_and_shadows_a_loaded_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The script's directory left sys.path when the script returned: an import in its atexit handler failed,
    unseen (the handler's barrier unrecorded: a pass where rank 0 alone calls it), and a --step function's import
    failed the capture. A module beside it named like one the capturing process had loaded (``statistics``)
    was the loaded one."""
    (tmp_path / "statistics.py").write_text("def mean(values):\n    return 'own'\n", encoding="utf-8")
    (tmp_path / "late.py").write_text(
        "import torch.distributed as dist\ndef finish():\n    if dist.get_rank() == 0:\n        dist.barrier()\n",
        encoding="utf-8",
    )
    (tmp_path / "train_dir.py").write_text(
        "import atexit, torch.distributed as dist\nfrom statistics import mean\nassert mean([1]) == 'own'\n"
        "dist.init_process_group('nccl')\n"
        "def step(state):\n    from late import finish\n    finish()\n"
        "@atexit.register\ndef end():\n    from late import finish\n    finish()\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path.parent)
    script = str(tmp_path / "train_dir.py")
    assert cap.main(["--world", "2", "--simulate", "-q", script]) == 1  # rank 0's barrier alone: a hang
    assert "hang" in capsys.readouterr().out
    assert cap.main(["--world", "2", "--toml", str(tmp_path / "s.toml"), "--step", f"{script}:step", script]) == 0
    assert (tmp_path / "s.toml").read_text(encoding="utf-8").count('op = "barrier"') == 2  # the step's and exit's


def test_a_module_beside_the_script_named_like_one_torch_imports_is_refused(tmp_path: Path, capsys) -> None:
    """``json.py`` beside the script: run alone, torch's own ``import json`` finds it and ``import torch`` fails.
    The capturing process had imported torch before the script's directory was on sys.path, so the capture passed
    (exit 0). It is bad input now (exit 2), named; a name torch does not import (``statistics.py``) is the
    script's own (``test_a_scripts_directory_serves_...``)."""
    (tmp_path / "json.py").write_text("VALUE = 1\n", encoding="utf-8")
    (tmp_path / "train_json.py").write_text("import torch.distributed as dist\n", encoding="utf-8")
    assert cap.main(["--world", "2", "--simulate", str(tmp_path / "train_json.py")]) == 2
    err = capsys.readouterr().err
    assert "json.py beside the script has the name of a module import torch loads" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--world", "2", "-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
        (["--world", "2", "missing_script.py"], "no such script 'missing_script.py'"),
        (["--world", "0", str(EXAMPLES), "mesh2d"], "world_size: expected an integer >= 1, got 0"),
        (["--world", "2", "--release", "3.0", str(EXAMPLES), "mesh2d"], "unknown torch release '3.0'"),
        # the scenario it writes would be refused by `simnccl run` (it was written, exit 0)
        (["--world", "2", "--name", "evil\n[x]\x1b", str(EXAMPLES), "mesh2d"], "--name: expected a name on one"),
        (["--world", "2", "--name", " ", str(EXAMPLES), "mesh2d"], "--name: expected a name on one line"),
        # a relative module name: importlib raises where it answers None for a missing one (exit 70)
        (["--world", "2", "-m", ".foo"], "-m '.foo': no package specified"),
        # an empty --toml wrote nothing and said nothing (exit 0)
        (["--world", "2", "--toml", "", str(EXAMPLES), "mesh2d"], "--toml: expected a file to write the scenario"),
    ],
)
def test_cli_bad_input_is_a_clear_message_not_a_traceback(argv: list[str], message: str, capsys) -> None:
    assert cap.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback (most recent call last)" not in err


def test_a_world_past_the_limit_is_refused_before_torch_is_imported() -> None:
    """``--world 100000000`` is bad input answered at once (exit 2, the limit named), not hours of forking: the
    check runs before the capture imports torch (a fresh interpreter shows it never did)."""
    code = (
        "import sys\n"
        "from simnccl.capture_cli import main\n"
        f"rc = main(['--world', '100000000', {str(EXAMPLES)!r}, 'mesh2d'])\n"
        "print('rc', rc, 'torch imported', 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.split() == ["rc", "2", "torch", "imported", "False"], done.stderr
    assert "--world: a world of 100000000 ranks exceeds the limit max_world_size = 65536" in done.stderr


def test_the_capture_world_limit_is_the_one_the_environment_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_WORLD_SIZE", "4")
    with pytest.raises(cap.CaptureError, match="a world of 8 ranks exceeds the limit max_world_size = 4"):
        cap.capture(examples.device_mesh_2d, 8)


def test_cli_code_that_raises_names_the_rank_and_the_error(tmp_path: Path, capsys) -> None:
    script = tmp_path / "boom.py"
    script.write_text(
        "import torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "if dist.get_rank() == 1:\n    raise ValueError('tp must divide the world')\n",
        encoding="utf-8",
    )
    assert cap.main(["--world", "2", str(script)]) == 2
    err = capsys.readouterr().err
    assert "rank 1: the captured code raised ValueError: tp must divide the world" in err


# ---------------------------------------------------------------------------------------------- errors and limits


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0}, "world_size: expected an integer >= 1, got 0"),
        ({"world_size": True}, "world_size: expected an integer >= 1"),
        ({"world_size": 2, "gpus_per_node": 0}, "gpus_per_node: expected an integer >= 1"),
        ({"world_size": 2, "mode": "threads"}, "mode: expected one of fork, inline"),
        ({"world_size": 2, "device_type": "xpu"}, "device_type: expected 'cuda' or 'cpu'"),
        ({"world_size": 10**8}, "world_size: a world of 100000000 ranks exceeds the limit max_world_size"),
        ({"world_size": 2, "jobs": 10**5}, "jobs: 100000 ranks at a time exceeds the limit max_capture_jobs = 64"),
        ({"world_size": 2, "env": {"WORLD_SIZE": "8"}}, "env: WORLD_SIZE is set by the capture for each rank"),
        ({"world_size": 2, "env": {"RANK": "0", "NCCL_DEBUG": "INFO"}}, "env: RANK is set by the capture"),
        # each crashed (AttributeError) or failed in rank 0 as "the captured code raised" (a fuzzing round)
        ({"world_size": 2, "env": [("NCCL_DEBUG", "WARN")]}, "env: expected a mapping of variable names"),
        ({"world_size": 2, "env": {1: "x"}}, "env: expected variable names and string values, got 1: 'x'"),
        ({"world_size": 2, "env": {"NCCL_DEBUG": 1}}, "env: expected variable names and string values"),
        ({"world_size": 2, "env": {"A=B": "x"}}, "env: expected variable names and string values, got 'A=B'"),
        ({"world_size": 2, "backend": "bogus"}, "backend: unknown backend name 'bogus'"),
        ({"world_size": 2, "final_checkpoint": 5}, "final_checkpoint: expected a name on one line"),
        ({"world_size": 2, "final_checkpoint": "a\nb"}, "final_checkpoint: expected a name on one line"),
        ({"world_size": 2, "mode": []}, "mode: expected one of fork, inline"),
        # an AttributeError, an OverflowError, and every rank failing as "the captured code raised" (fuzzing)
        ({"world_size": 2, "backend": 5}, "backend: expected a backend name such as 'nccl' or 'gloo', got 5"),
        ({"world_size": 2, "timeout_s": 10**400}, "timeout_s: expected a positive number of seconds, got an integer"),
        ({"world_size": 2, "env": {"FOO": "a\x00b"}}, "env: expected variable names and string values, got 'FOO'"),
    ],
)
def test_bad_arguments_raise_capture_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(cap.CaptureError, match=message.replace("(", r"\(")):
        cap.capture(examples.device_mesh_2d, **kwargs)


def test_not_a_callable() -> None:
    with pytest.raises(cap.CaptureError, match="expected a callable"):
        cap.capture("examples.device_mesh_2d", 2)  # type: ignore[arg-type]


def _hangs() -> None:
    dist.init_process_group("nccl")
    time.sleep(60)


def test_a_rank_that_never_finishes_is_killed_and_reaped() -> None:
    started = time.monotonic()
    with no_child_left_behind(), pytest.raises(cap.CaptureError, match=r"rank \d: no result within 1 s"):
        cap.capture(_hangs, 2, timeout_s=1)
    assert time.monotonic() - started < 15


def _reaped(marker: Path) -> bool:
    """True once ``marker`` names a process that no longer exists (its parent saw it end and reaped it)."""
    if not marker.exists():
        return False
    try:
        os.kill(int(marker.read_text()), 0)
    except ProcessLookupError:
        return True
    return False


def _rank_one_fails_first(marker: Path, rank_zero: str) -> None:
    """Rank 1 fails at once; rank 0 waits until the capturing process has reaped rank 1, then fails
    (``rank_zero="raise"``) or hangs (``"hang"``)."""
    dist.init_process_group("nccl")
    if dist.get_rank() == 1:
        written = marker.with_suffix(".tmp")
        written.write_text(str(os.getpid()))
        written.rename(marker)
        raise RuntimeError("rank one failed first")
    deadline = time.monotonic() + 30
    while not _reaped(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
    if rank_zero == "hang":
        time.sleep(60)
    raise RuntimeError("rank zero failed last")


@pytest.mark.parametrize(
    ("rank_zero", "message"),
    [
        ("raise", "rank 0: the captured code raised RuntimeError: rank zero failed last"),
        ("hang", "rank 0: no result within 3 s"),
    ],
)
def test_when_several_ranks_fail_the_lowest_is_named_not_the_first_seen(
    tmp_path: Path, rank_zero: str, message: str
) -> None:
    marker = tmp_path / "rank1.pid"
    with no_child_left_behind(), pytest.raises(cap.CaptureError, match=message):
        cap.capture(functools.partial(_rank_one_fails_first, marker, rank_zero), 2, jobs=2, timeout_s=3)
    assert _reaped(marker)  # rank 1 had failed, and been seen failing, before rank 0 did


def _collector_pace() -> None:
    """Records the rank's collector settings as checkpoint labels (what a rank sees, read back in the Program)."""
    import gc

    dist.init_process_group("nccl")
    cap.checkpoint(f"threshold={gc.get_threshold()[0]} enabled={gc.isenabled()}")


def test_a_forked_rank_collects_garbage_rarely_and_the_capturing_process_keeps_its_pace() -> None:
    """A forked rank's collector runs after ``RANK_GC_THRESHOLD`` allocations (at CPython's 700 it took 17-20 ms
    of a 140 ms Megatron rank, rescanning the rank's growing record); it is never switched off, and the process
    that captures (inline ranks run there) keeps its own settings."""
    import gc

    from simnccl.capture.heap import RANK_GC_THRESHOLD

    before = gc.get_threshold()
    forked = cap.capture(_collector_pace, 2, mode="fork", final_checkpoint=None)
    labels = {op.label for program in forked.programs for op in program.ops if isinstance(op, Checkpoint)}
    assert f"threshold={RANK_GC_THRESHOLD} enabled=True" in labels
    inline = cap.capture(_collector_pace, 2, mode="inline", final_checkpoint=None)
    labels = {op.label for program in inline.programs for op in program.ops if isinstance(op, Checkpoint)}
    assert f"threshold={before[0]} enabled={gc.isenabled()}" in labels
    assert gc.get_threshold() == before


def test_inline_mode_reports_the_failing_rank() -> None:
    def fails() -> None:
        dist.init_process_group("nccl")
        if dist.get_rank() == 1:
            raise RuntimeError("boom")

    with pytest.raises(cap.CaptureError, match="rank 1: the captured code raised RuntimeError: boom"):
        cap.capture(fails, 2, mode="inline")
    assert not dist.is_initialized()


def test_backend_argument_initialises_the_world_for_the_target() -> None:
    run = cap.capture(lambda: dist.new_group([0, 1], backend="gloo"), 2, backend="gloo", mode="inline")
    assert [type(op) for op in run.programs[0].ops] == [InitProcessGroup, Checkpoint, NewGroup, Checkpoint]
    assert run.programs[0].ops[0] == InitProcessGroup(backend="gloo")


def test_simnccl_cli_forwards_capture(capsys: pytest.CaptureFixture) -> None:
    from simnccl.cli import main

    assert main(["capture", "--world", "2", str(EXAMPLES), "mesh2d", "--dp", "1", "--tp", "2"]) == 0
    assert "captured 2 ranks" in capsys.readouterr().out


@pytest.mark.parametrize("entry", [["simnccl", "capture"], ["simnccl.capture"]], ids=["simnccl", "simnccl.capture"])
def test_both_entry_points_exit_2_naming_an_unwritable_toml(entry: list[str], tmp_path: Path) -> None:
    """``python -m simnccl.capture`` is guarded as ``simnccl capture`` is: not a traceback and exit 1 (a check
    that failed)."""
    script = tmp_path / "plain.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('nccl')\n", encoding="utf-8")
    toml = tmp_path / "missing" / "x.toml"
    command = [sys.executable, "-m", *entry, "--world", "2", "--toml", str(toml), str(script)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    # refused up front, before any rank ran (it was refused when the scenario was written, at the end)
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"error: --toml: no such directory {str(toml.parent)!r} for {str(toml)!r}", last


def test_the_scenario_is_never_written_over_the_captured_script(capsys, tmp_path: Path) -> None:
    from simnccl.cli import main

    script = tmp_path / "plain.py"
    text = "import torch.distributed as dist\ndist.init_process_group('nccl')\n"
    script.write_text(text, encoding="utf-8")
    (tmp_path / "alias.py").symlink_to(script)
    for target in (script, tmp_path / "alias.py"):  # it was: exit 0, the script replaced by the scenario
        assert main(["capture", "--world", "2", "--toml", str(target), str(script)]) == 2
        assert "is the captured script; give another file" in capsys.readouterr().err
        assert script.read_text(encoding="utf-8") == text


def test_a_nonzero_exit_status_is_a_failure() -> None:
    def exits() -> None:
        dist.init_process_group("nccl")
        sys.exit(3)

    with pytest.raises(cap.CaptureError, match="rank 0: the captured code exited with status 3"):
        cap.capture(exits, 2, mode="inline")
    with pytest.raises(cap.CaptureError, match=r"rank \d: the captured code exited with status 3"):
        cap.capture(exits, 2)


@pytest.mark.parametrize("mode", ["inline", "fork"])
@pytest.mark.parametrize(("code", "fails"), [(0, None), (256, None), (3, "3"), (259, "3"), ("bye", "1 \\(bye\\)")])
def test_sys_exit_in_the_startup_or_the_step_is_read_as_python_exits(mode: str, code: Any, fails: str | None) -> None:
    """``sys.exit(code)`` ends a real process with Python's status: ``code & 0xFF`` (``sys.exit(256)`` exits 0), 1
    for a message. In the step as in the startup: a step's ``sys.exit(0)`` left ``capture()`` (inline, it ended
    the capturing process with exit 0 and no report)."""

    def startup() -> None:
        dist.init_process_group("nccl")

    def step(state: Any) -> None:
        dist.new_group([0, 1])
        sys.exit(code)

    def exits() -> None:
        startup()
        sys.exit(code)

    for target, kwargs in ((exits, {}), (startup, {"step": step})):
        if fails is None:
            run = cap.capture(target, 2, mode=mode, **kwargs)
            assert all(isinstance(p.ops[0], InitProcessGroup) for p in run.programs)
        else:
            with pytest.raises(cap.CaptureError, match=rf"rank \d: the captured code exited with status {fails}"):
                cap.capture(target, 2, mode=mode, **kwargs)


_BINDS_AT_IMPORT = '''
"""Binds torch's group functions at import, as DeviceMesh and user modules do."""
from torch.distributed import init_process_group, new_group


def run():
    init_process_group("nccl")
    new_group([0, 1], backend="gloo")
'''


def test_inline_ranks_record_calls_of_a_module_first_imported_by_an_earlier_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rank 0 imports the module while capturing, so the module binds whatever torch.distributed holds then; every
    # later rank must still record through it (the module is imported once per process, not once per rank).
    name = "capture_binds_at_import"
    (tmp_path / f"{name}.py").write_text(_BINDS_AT_IMPORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)

    def target() -> None:
        __import__(name).run()

    try:
        run = cap.capture(target, 2, mode="inline")
    finally:
        module = sys.modules.pop(name, None)
    for calls in run.calls:
        assert [c.name for c in calls] == ["init_process_group", "new_group"]
    assert len(run.programs) == 2 and run.programs[0] is run.programs[1]
    assert [type(op) for op in run.programs[0].ops] == [InitProcessGroup, Checkpoint, NewGroup, Checkpoint]
    assert not run.notes
    # Once the capture is over, that module holds torch's own function again, as every other module does.
    assert module.new_group is dist.distributed_c10d.new_group is dist.new_group


def test_an_inline_rank_past_its_timeout_is_interrupted_even_through_except_exception() -> None:
    swallowed: list[BaseException] = []

    def swallows() -> None:
        while True:
            try:
                time.sleep(0.05)
            except Exception as err:  # user code that swallows errors must not swallow the capture's timeout
                swallowed.append(err)

    started = time.monotonic()
    with pytest.raises(cap.CaptureError, match=r"rank 0: no result within 1 s; interrupted"):
        cap.capture(swallows, 2, mode="inline", timeout_s=1)
    assert time.monotonic() - started < 15
    assert not swallowed
    assert not dist.is_initialized()


def test_group_tags_around_plain_torch_calls_are_recorded() -> None:
    run = cap.capture(examples.tagged_pipeline_groups, 4)
    groups = [op for op in run.programs[0].ops if isinstance(op, NewGroup)]
    assert [(g.ranks, g.purpose, g.traffic) for g in groups] == [
        ((0, 2), "pp", "p2p"),
        ((1, 3), "tp", "collectives"),
        ((0, 1, 2, 3), None, None),
    ]
    # The tags reach a policy in the simulator: nccl-lazy-p2p puts the p2p group on nccl-lazy.
    outcome = run.simulate(gpu="h100-80gb", policy="nccl-lazy-p2p")
    assert outcome.verdict == "pass"
    backends = {key[1]: record.impl for key, record in outcome.groups.items()}
    assert backends[(0, 2)] == "nccl-lazy" and backends[(1, 3)] != "nccl-lazy"


# ---------------------------------------------------------------------------------------------- per variant

LEGACY_ENV = {"TORCH_DIST_USE_NCCL2": "0"}


@pytest.fixture(scope="module")
def mesh_2d_215() -> cap.CapturedRun:
    return cap.capture(examples.device_mesh_2d, 8)


def test_a_capture_records_the_settings_its_branches_depended_on(mesh_2d_215: cap.CapturedRun) -> None:
    under = mesh_2d_215.captured_under()
    assert (under.default_backend, under.default_bound, under.default_lazy) == ("nccl2", True, False)
    doc = mesh_2d_215.to_json()
    assert doc["policy"] is None and doc["captured_under"]["default_bound"] is True
    assert "# Captured under torch 2.15, no policy: default group nccl2, bound" in mesh_2d_215.to_scenario_toml()
    legacy = cap.capture(examples.device_mesh_2d, 8, env=LEGACY_ENV).captured_under()
    assert (legacy.default_backend, legacy.default_bound) == ("nccl", False)


@pytest.mark.parametrize(
    "settings",
    [{"env": LEGACY_ENV}, {"release": "2.14"}, {"policy": "legacy"}, {"policy": "lazy-init"}],
    ids=["env-legacy", "release-2.14", "policy-legacy", "policy-lazy-init"],
)
def test_a_215_capture_replayed_where_its_branches_differ_is_refused(
    mesh_2d_215: cap.CapturedRun, settings: dict[str, Any]
) -> None:
    with pytest.raises(cap.BranchMismatch) as refused:
        mesh_2d_215.simulate(**settings)
    message = str(refused.value)
    assert isinstance(refused.value, ValueError) and "\n" not in message
    assert message.startswith("refusing to simulate a capture made under torch 2.15, no policy as ")
    assert "re-capture under those settings" in message and "simnccl capture --release" in message
    assert "does not support splitting" not in message  # never reported as a torch error


def test_the_refusal_says_why_and_how_to_recapture(mesh_2d_215: cap.CapturedRun) -> None:
    with pytest.raises(cap.BranchMismatch, match=r"unbound instead of bound \(DeviceMesh takes the new_group loop"):
        mesh_2d_215.simulate(env=LEGACY_ENV)
    with pytest.raises(cap.BranchMismatch, match=r"env=\{'TORCH_DIST_USE_NCCL2': '0'\}\) or simnccl capture"):
        mesh_2d_215.simulate(env=LEGACY_ENV)


def test_a_policy_that_leaves_the_branches_alone_replays(mesh_2d_215: cap.CapturedRun) -> None:
    assert mesh_2d_215.simulate(policy="dedupe").verdict == "pass"
    assert mesh_2d_215.simulate(policy="torch-default").verdict == "pass"


def test_recaptured_under_legacy_the_mesh_loops_new_group_and_passes(mesh_2d_215: cap.CapturedRun) -> None:
    for run, settings in (
        (cap.capture(examples.device_mesh_2d, 8, env=LEGACY_ENV), {}),
        (cap.capture(examples.device_mesh_2d, 8, policy="legacy"), {"policy": "legacy"}),
        (cap.capture(examples.device_mesh_2d, 8, release="2.14"), {}),
    ):
        names = [op.name for op in run.programs[0].ops]
        assert "split_group" not in names and names.count("new_group") == 6, settings
        assert run.simulate(**settings).verdict == "pass", settings
    legacy_toml = cap.capture(examples.device_mesh_2d, 8, policy="legacy").to_scenario_toml()
    assert legacy_toml.count('policy = "as-captured(legacy)"') == 1


def test_a_policy_capture_replays_as_decided_and_refuses_another_policy() -> None:
    # Its Programs are legacy's decisions: replayed as captured (its env knob included) with no policy named,
    # legacy or as-captured(legacy); another policy would be asked about legacy's output, so it is refused.
    run = cap.capture(examples.device_mesh_2d, 8, policy="legacy")
    hashes = {run.simulate(policy=p).trace_hash for p in (None, "legacy", "as-captured(legacy)")}
    assert len(hashes) == 1
    assert run.simulate().verdict == "pass"
    with pytest.raises(cap.BranchMismatch, match=r"made under policy 'legacy' as policy 'dedupe': its Programs"):
        run.simulate(policy="dedupe")


def test_code_that_picks_legacy_for_itself_is_refused_not_captured_as_nccl2() -> None:
    # Real torch reads TORCH_DIST_USE_NCCL2 at the first use of "nccl": rank 1 alone picked legacy among nccl2
    # peers, and the capture (emulating torch from the environment the ranks started with) passed it as nccl2.
    with pytest.raises(
        cap.CaptureError, match=r"set TORCH_DIST_USE_NCCL2=0 in os.environ .* on rank\(s\) 1: .* picks legacy"
    ) as one:
        cap.capture(functools.partial(examples.sets_nccl2_knob, (1,)), 4)
    assert "cannot make groups together on real torch" in str(one.value)
    with pytest.raises(cap.CaptureError, match=r"rank\(s\) 0-3: .*capture again with it in the environment") as every:
        cap.capture(examples.sets_nccl2_knob, 4)
    assert "--env TORCH_DIST_USE_NCCL2=0" in str(every.value)
    # after a gloo default group, "nccl" is first used by the nccl group: torch reads it there (found by a tester)
    with pytest.raises(cap.CaptureError, match=r"before its first use of 'nccl' on rank\(s\) 1: "):
        cap.capture(functools.partial(examples.sets_nccl2_knob, (1,), gloo_first=True), 4)
    run = cap.capture(examples.sets_nccl2_knob, 4, env={"TORCH_DIST_USE_NCCL2": "0"})  # as the refusal says
    assert run.simulate().verdict == "pass" and "default group nccl, unbound" in str(run.captured_under())


def test_a_policy_that_is_not_idempotent_is_not_asked_again_about_its_own_capture(tmp_path: Path) -> None:
    # The upper half of the ranks made lazy groups, the lower half eager ones: real torch hangs. Replayed under
    # the policy again, the upper half flipped back to eager and the startup passed (a false pass).
    policy = "user_policies:FlipsLazyOnUpperHalf"
    run = cap.capture(examples.megatron_style_loops, 4, policy=policy)
    lazy = {
        rank: [op.pg_options.lazy_init for op in p.ops if op.name == "new_group"] for rank, p in enumerate(run.programs)
    }
    assert lazy == {0: [False] * 4, 1: [False] * 4, 2: [True] * 4, 3: [True] * 4}
    outcome = run.simulate()
    assert outcome.verdict == "error", outcome
    assert {e["rank"] for e in outcome.errors} == {2, 3}
    assert all(e["type"] == "PolicyInconsistency" for e in outcome.errors)
    toml = tmp_path / "flip.toml"
    toml.write_text(run.to_scenario_toml(), encoding="utf-8")
    with_variant = tmp_path / "flip-variant.toml"
    with_variant.write_text(
        run.to_scenario_toml() + '\n[[variants]]\nname = "d"\npolicy = "dedupe"\n', encoding="utf-8"
    )

    def simnccl(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "simnccl", *argv],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).parent,  # where user_policies is importable, as the user's own module is in theirs
        )

    for argv in (["run", "-q", str(toml)], ["run", "-q", str(toml), "--policy", policy]):
        ran = simnccl(*argv)
        assert ran.returncode == 1 and "error" in ran.stdout, (argv, ran.stdout + ran.stderr)
    # another policy on the capture's steps would decide the policy's decisions again (found by a tester: exit 0)
    for argv in (
        ["run", "-q", str(toml), "--policy", "dedupe"],
        ["run", "-q", str(with_variant)],
        ["cost", "--scenario", str(toml), "--policy", "dedupe"],
        ["sweep", "--scenario", str(toml), "--policy", "dedupe", "--dry-run"],
    ):
        ran = simnccl(*argv)
        assert ran.returncode == 2, (argv, ran.stdout + ran.stderr)
        assert "the steps were captured under policy 'user_policies:FlipsLazyOnUpperHalf'" in ran.stderr, argv


def test_a_capture_under_a_policy_object_replays_and_writes_as_one_under_its_spec() -> None:
    # Found by a tester: capture(..., policy=obj) then simulate() raised AttributeError (the replay took a spec)
    import user_policies

    run = cap.capture(examples.megatron_style_loops, 4, policy=user_policies.FlipsLazyOnUpperHalf())
    assert run.simulate().verdict == "error"
    assert 'policy = "as-captured(user_policies:FlipsLazyOnUpperHalf)"' in run.to_scenario_toml()
    json.dumps(run.to_json())  # the policy described as data


def test_under_lazy_init_a_mesh_of_a_bound_lazy_default_group_fails_as_real_torch_does() -> None:
    # torch 2.15: nccl2 binds the lazy_init default group, DeviceMesh takes split_group, and a lazy parent
    # is no split source until first used (supportsSplitting, ../shared/reference torch-2.15 §B.5).
    with pytest.raises(cap.CaptureError) as failed:
        cap.capture(examples.device_mesh_2d, 8, policy="lazy-init")
    assert "RuntimeError: No backend for the parent process group" in str(failed.value)
    assert "ran under policy 'lazy-init'" in str(failed.value)
    assert not isinstance(failed.value, cap.BranchMismatch)


@pytest.mark.parametrize(
    ("target", "kwargs", "ops"),
    [
        (examples.device_mesh_after_barrier, {}, ("barrier", "split_group", "split_group")),
        (examples.device_mesh_2d, {"env": LEGACY_ENV}, ("new_group",) * 6 + ("alloc", "all_reduce")),
        (examples.device_mesh_2d, {"release": "2.14"}, ("new_group",) * 6 + ("alloc", "all_reduce")),
    ],
    ids=["used-default-group-splits", "legacy-loops-new-group", "2.14-loops-new-group"],
)
def test_a_lazy_init_capture_of_a_device_mesh_simulates_without_the_bogus_error(
    target: Any, kwargs: dict[str, Any], ops: tuple[str, ...]
) -> None:
    run = cap.capture(target, 8, policy="lazy-init", **kwargs)
    assert run.policy == "lazy-init"
    names = tuple(op.name for op in run.programs[0].ops if op.name not in ("set_device", "checkpoint"))
    assert names == ("init_process_group", *ops)
    for policy in ("lazy-init", None):  # the Programs hold lazy_init themselves: the same branches either way
        outcome = run.simulate(policy=policy)
        assert outcome.verdict == "pass", (policy, outcome)


def test_cli_refuses_a_simulated_variant_that_would_change_the_branches(capsys: pytest.CaptureFixture) -> None:
    argv = ["--world", "8", "--simulate", "--policy", "dedupe", "--policy", "lazy-init", str(EXAMPLES), "mesh2d"]
    assert cap.main(argv) == 2
    err = capsys.readouterr().err
    assert "variant 'default,policy=lazy-init': refusing to simulate a capture made under torch 2.15" in err
    assert "simnccl capture --release 2.15 --policy lazy-init" in err


def test_cli_captures_under_a_single_policy_and_env(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    toml = tmp_path / "legacy.toml"
    argv = ["--world", "8", "--simulate", "--policy", "lazy-init", "--env", "TORCH_DIST_USE_NCCL2=0"]
    assert cap.main([*argv, "--toml", str(toml), str(EXAMPLES), "mesh2d"]) == 0
    out = capsys.readouterr().out
    assert "captured under torch 2.15, TORCH_DIST_USE_NCCL2=0, policy lazy-init" in out and "6 new_group" in out
    assert 'policy = "as-captured(lazy-init)"' in toml.read_text()


def test_cli_single_lazy_init_policy_on_a_bound_mesh_names_torchs_reason(capsys: pytest.CaptureFixture) -> None:
    argv = ["--world", "8", "--simulate", "--policy", "lazy-init", str(EXAMPLES), "mesh2d"]
    assert cap.main(argv) == 2  # the captured code failed, as on a GPU under that policy: not "verdict error"
    err = capsys.readouterr().err
    assert "does not support splitting" in err and "ran under policy 'lazy-init'" in err


def test_inline_and_fork_capture_the_same_programs_under_a_policy() -> None:
    forked = cap.capture(examples.device_mesh_after_barrier, 8, policy="lazy-init", mode="fork")
    inline = cap.capture(examples.device_mesh_after_barrier, 8, policy="lazy-init", mode="inline")
    assert [p.ops for p in forked.programs] == [p.ops for p in inline.programs]
    init = next(op for op in inline.programs[0].ops if isinstance(op, InitProcessGroup))
    assert init.pg_options.lazy_init is True  # what torch received from the policy, recorded
    from simnccl import torch_apply

    assert torch_apply.current() is None and not dist.is_initialized()  # the policy is gone after capture


def _groups_from_iterators() -> None:
    dist.init_process_group("nccl")
    dist.new_group(iter([1, 0]))
    dist.new_group(ranks=(rank for rank in range(2)))
    dist.new_group(map(int, ["0", "1"]), use_local_synchronization=True)


def test_ranks_given_as_an_iterator_are_recorded_and_torch_still_gets_them() -> None:
    """torch reads ``ranks`` into a list first, so any iterable works; the recording used to exhaust an
    iterator before torch saw it ("Group rank must be specified", an error real torch never raises)."""
    run = cap.capture(_groups_from_iterators, 2, mode="inline")
    assert [op.ranks for op in run.programs[0].ops if isinstance(op, NewGroup)] == [(0, 1)] * 3
    assert run.simulate().verdict == "pass"


def _groups_forever() -> None:
    """A rank that loops on group creation and swallows every error: only a BaseException ends it."""
    dist.init_process_group("nccl")
    while True:
        try:
            dist.new_group([0])
        except Exception:  # the captured code's own catch-all, which the bound must get past
            continue


@pytest.mark.parametrize("mode", ["inline", "fork"])
def test_a_rank_that_records_past_max_program_ops_is_stopped(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """A loop of group calls grew the rank's record (and the parent's) without bound until the rank's timeout;
    the recorder stops it at ``max_program_ops``, through the code's own ``except Exception``."""
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_PROGRAM_OPS", "200")
    with pytest.raises(cap.CaptureError, match="rank 0: the captured code issued more ops than a Program may hold"):
        cap.capture(_groups_forever, 2, mode=mode, timeout_s=60)


def _init_only() -> None:
    dist.init_process_group("nccl")


def test_capture_env_is_checked_as_the_command_line_env_is() -> None:
    """``capture(env={"TORCH_DIST_USE_NCL2": "0"})`` captured torch's default branch under a typo: refused before any
    rank runs, naming the nearest knob and how a newer one reaches the ranks."""
    with pytest.raises(cap.CaptureError, match=r"env: TORCH_DIST_USE_NCL2: .*did you mean TORCH_DIST_USE_NCCL2\?"):
        cap.capture(_init_only, 2, env={"TORCH_DIST_USE_NCL2": "0"})
    with pytest.raises(cap.CaptureError, match="this process's environment, which every rank inherits"):
        cap.capture(_init_only, 2, env={"NCCL_FROM_THE_FUTURE": "1"})
    with pytest.raises(cap.CaptureError, match=r"env: TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC: expected an integer"):
        cap.capture(_init_only, 2, env={"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "soon"})


def test_every_variable_the_capture_sets_per_rank_is_one_env_may_not_set() -> None:
    """``--env WORLD_SIZE=8`` captured a different world than ``--world`` and reported it ok: every variable
    ``rank_env`` sets for the world's shape is refused in ``env``; the rest of ``env`` reaches each rank."""
    from simnccl.capture.ranks import _Spec
    from simnccl.env_knobs import LAUNCHER_VARIABLES

    spec = _Spec(examples.device_mesh_2d, 4, 2, "2.15", {"NCCL_DEBUG": "INFO"}, None, True, False, None, 60.0)
    env = spec.rank_env(3)
    # torchrun also sets TORCH_NCCL_ASYNC_ERROR_HANDLING, unless the launching shell (``env``) did
    assert set(env) - set(LAUNCHER_VARIABLES) == {
        "NCCL_DEBUG",
        "TORCH_FR_BUFFER_SIZE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    }
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["NCCL_DEBUG"]) == ("3", "1", "4", "INFO")
    assert (env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"], env["TORCH_NCCL_ASYNC_ERROR_HANDLING"]) == ("2", "1", "1")


@pytest.mark.parametrize("mode", ["inline", "fork"])
def test_init_of_the_fake_backend_without_rank_or_world_fails_where_real_torch_does(mode: str) -> None:
    """torch 2.15 takes no rendezvous for ``init_process_group("fake")``: rank and world stay -1, and its
    FakeProcessGroup refuses them at init (checked on real torch). The stand-in must fail at the same call."""

    def startup() -> None:
        dist.init_process_group("fake")
        dist.new_group([0, 1])

    with pytest.raises(
        cap.CaptureError,
        match=r"rank 0: the captured code raised RuntimeError: Cannot init process group where rank \(-1\) >= "
        r"world_size \(-1\)",
    ):
        cap.capture(startup, 2, mode=mode)
    assert not dist.is_initialized()


def test_init_of_the_fake_backend_with_rank_and_world_is_captured() -> None:
    run = cap.capture(
        lambda: dist.init_process_group("fake", rank=int(os.environ["RANK"]), world_size=2), 2, mode="inline"
    )
    assert run.programs[0].ops[0] == InitProcessGroup(backend="fake")


def test_cli_json_to_stdout_is_the_document_alone_when_a_policy_prints(capsys: pytest.CaptureFixture) -> None:
    """``capture --simulate --json -`` under a policy that prints: its lines went to stdout before the document
    (exit 0, no JSON reader could parse it). They go to stderr, as under every other command."""
    argv = ["--world", "2", "--simulate", "--policy", "user_policies:PrintsOnStdout", "--json", "-"]
    assert cap.main([*argv, str(EXAMPLES), "mesh2d", "--dp", "1", "--tp", "2"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["command"] == "capture"
    assert "prints-on-stdout: rank 0 init" in err


def test_a_group_desc_outside_ascii_round_trips_through_the_scenario_toml() -> None:
    """``json.dumps`` wrote "tp😀" as a surrogate pair TOML forbids: the scenario was refused by ``simnccl run``
    and ``--simulate`` ended in an internal error (exit 70)."""
    import tomllib

    desc = 'tp😀 "q" \\ é\x7f\t'
    run = cap.capture(lambda: (dist.init_process_group("nccl"), dist.new_group([0, 1], group_desc=desc)), 2)
    steps = tomllib.loads(run.to_scenario_toml())["workload"]["steps"]
    assert [s["group_desc"] for s in steps if s["op"] == "new_group"] == [desc]
    assert run.simulate().verdict == "pass"


@pytest.mark.parametrize("mode", ["inline", "fork"])
def test_a_split_that_leaves_ranks_out_gives_them_a_non_member(mode: str) -> None:
    """torch documents ``split_ranks=[[0, 1]]`` on 4 ranks as valid: ranks 2 and 3 get ``NON_GROUP_MEMBER`` (gloo's
    and NCCL's split answer nullptr). The stand-in's None crashed the rank (SIGSEGV; inline, the whole process)."""
    got = []

    def startup() -> None:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
        group = dist.split_group(split_ranks=[[0, 1]])
        got.append(group is dist.GroupMember.NON_GROUP_MEMBER)
        if group is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.all_reduce(torch.zeros(1, device="cuda"), group=group)

    run = cap.capture(startup, 4, mode=mode)
    splits = [[op for op in p.ops if isinstance(op, SplitGroup)] for p in run.programs]
    assert all(len(s) == 1 and s[0].split_ranks == ((0, 1),) for s in splits)
    if mode == "inline":
        assert got == [False, False, True, True]
    assert run.simulate().verdict == "pass"


def _init_with(**kwargs: Any) -> Any:
    def startup() -> None:
        dist.init_process_group("nccl", **kwargs)
        dist.new_group([0, 1])

    return startup


@pytest.mark.parametrize("mode", ["inline", "fork"])
@pytest.mark.parametrize(
    ("startup", "failure"),
    [
        # every process rank 0: real ranks collide on the store's port or wait for rank 1 forever
        (_init_with(rank=0, world_size=2), r"rank 1: init_process_group made this process rank 0 of a world of 2"),
        # a world the capture does not run: real torch's rendezvous waits for 6 ranks that never come
        (_init_with(world_size=8), r"rank 0: init_process_group made this process rank 0 of a world of 8, but it"),
        # torch's tcp:// rendezvous needs a rank and a world in its URL or arguments
        (_init_with(init_method="tcp://127.0.0.1:29511"), r"rank 0: .*tcp:// rendezvous: rank parameter missing"),
    ],
    ids=["rank-0-everywhere", "world-8-of-2", "tcp-without-rank"],
)
def test_a_rendezvous_real_torch_would_not_complete_fails_the_capture(mode: str, startup: Any, failure: str) -> None:
    """The stand-in rendezvous took a rank and world from wherever it found one (0 and 1 at worst), and nothing
    compared them with the rank captured: each of these was captured and simulated as a pass."""
    with pytest.raises(cap.CaptureError, match=failure):
        cap.capture(startup, 2, mode=mode)


def test_env_rendezvous_without_rank_fails_as_torchs_does(monkeypatch: pytest.MonkeyPatch) -> None:
    def startup() -> None:
        del os.environ["RANK"]
        dist.init_process_group("nccl")

    with pytest.raises(cap.CaptureError, match="env:// rendezvous: environment variable RANK expected, but not set"):
        cap.capture(startup, 2, mode="inline")


def test_a_rendezvous_given_each_processs_own_rank_and_world_is_captured() -> None:
    run = cap.capture(_own_rank, 2)
    assert all(isinstance(p.ops[0], InitProcessGroup) for p in run.programs)


def _own_rank() -> None:
    dist.init_process_group(
        "nccl",
        init_method="tcp://127.0.0.1:29512",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )
    dist.new_group([0, 1])


@pytest.mark.parametrize(
    ("argv", "module", "script", "args"),
    [
        (["--world", "2", "train.py", "-m", "llama", "--tp", "4"], None, "train.py", ["-m", "llama", "--tp", "4"]),
        (["--world", "2", "-m", "pkg.train", "--tp", "4"], "pkg.train", None, ["--tp", "4"]),
        (["--world", "2", "--json", "out.json", "-m", "pkg.train", "x"], "pkg.train", None, ["x"]),
        (["--world", "2", "--json", "-m", "pkg.train"], "pkg.train", None, []),
        (["--world=2", "--simulate", "train.py", "-m", "x"], None, "train.py", ["-m", "x"]),
    ],
)
def test_a_scripts_own_dash_m_stays_the_scripts(
    argv: list[str], module: str | None, script: str | None, args: list[str]
) -> None:
    """Everything after the script belongs to the captured code: ``-m`` was looked for anywhere, and a script's
    own ``-m llama`` was taken from it (captured with the wrong arguments, exit 0)."""
    from simnccl.capture_cli import parse

    parsed = parse(argv)
    assert (parsed.module, parsed.script, parsed.args) == (module, script, args)


def test_a_send_to_a_rank_outside_the_world_is_the_ranks_error_not_the_stand_ins() -> None:
    """The stand-in's own IndexError ("list index out of range") was reported as the captured code's error."""

    def startup() -> None:
        dist.init_process_group("nccl")
        dist.send(torch.zeros(1, device="cuda"), 99)

    with pytest.raises(cap.CaptureError, match=r"rank 0: the captured code raised ValueError: Invalid peer rank 99"):
        cap.capture(startup, 2, mode="inline")


@pytest.mark.parametrize("mode", ["inline", "fork"])
def test_an_exception_whose_str_raises_is_reported_as_the_captured_codes(mode: str) -> None:
    class Odd(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    def startup() -> None:
        dist.init_process_group("nccl")
        raise Odd()

    with pytest.raises(cap.CaptureError, match=r"rank 0: the captured code raised Odd: <Odd whose str\(\) raised"):
        cap.capture(startup, 2, mode=mode, jobs=1)


@pytest.mark.parametrize("mode", ["inline", "fork"])
def test_what_runs_after_the_last_line_is_captured_as_python_runs_it(mode: str) -> None:
    """A real process joins its non-daemon threads, then runs its exit handlers (last registered first), before
    it ends; a collective there is part of the run. The rank's result was sent as soon as its code returned: a
    rank-0-only all_reduce from an exit handler (a hang on real GPUs) was dropped and the capture passed."""
    import atexit
    import threading

    def startup() -> None:
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        late = threading.Thread(target=lambda: (time.sleep(0.05), dist.new_group([0, 1], group_desc="thread")))
        late.start()
        atexit.register(dist.new_group, [0, 1], group_desc="first-registered")
        if rank == 0:
            atexit.register(dist.all_reduce, torch.zeros(1))

    run = cap.capture(startup, 2, mode=mode)
    descs = [[op.group_desc for op in p.ops if isinstance(op, NewGroup)] for p in run.programs]
    assert descs == [["thread", "first-registered"]] * 2
    assert [sum(isinstance(op, AllReduce) for op in p.ops) for p in run.programs] == [1, 0]
    assert run.simulate().verdict == "hang"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's error, printed
@pytest.mark.parametrize("mode", ["inline", "fork"])
def test_a_thread_that_reaches_the_gpu_less_cuda_fails_the_capture(mode: str) -> None:
    """The fake CUDA serves the rank's main thread only: a thread's CUDA tensor raised there, the thread died with
    its collective, and the capture passed a program a real run hangs in."""
    import threading

    def startup() -> None:
        dist.init_process_group("nccl")
        threading.Thread(target=lambda: dist.all_reduce(torch.ones(1, device="cuda"))).start()

    with pytest.raises(cap.CaptureError, match=r"rank \d: a thread the captured code started reached CUDA"):
        cap.capture(startup, 2, mode=mode, jobs=1)


def test_inline_a_keyboard_interrupt_the_code_raises_is_its_failure_and_ctrl_c_stays_ctrl_c() -> None:
    """Inline, the captured code's own ``raise KeyboardInterrupt`` ended the command as if the user had pressed
    Ctrl-C (exit 130, "interrupted"); fork mode reports it as the code's failure (exit 2). A SIGINT stays one."""
    import signal

    def raises() -> None:
        dist.init_process_group("nccl")
        raise KeyboardInterrupt

    def pressed() -> None:
        dist.init_process_group("nccl")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)

    with pytest.raises(cap.CaptureError, match="rank 0: the captured code raised KeyboardInterrupt"):
        cap.capture(raises, 2, mode="inline")
    with pytest.raises(KeyboardInterrupt):
        cap.capture(pressed, 2, mode="inline")
    assert not dist.is_initialized()


def test_inline_the_captured_codes_os_exit_ends_the_rank_not_the_capture() -> None:
    """Inline, the rank is this process: ``os._exit(0)`` ended ``simnccl capture --simulate`` with exit 0 and no
    output. It is reported as fork mode reports a rank that ended without a result; a process the captured code
    forks still exits for real."""

    def exits() -> None:
        dist.init_process_group("nccl")
        child = os.fork()
        if child == 0:
            os._exit(7)  # the forked helper's own exit, for real
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 7
        if dist.get_rank() == 1:
            os._exit(0)

    with pytest.raises(cap.CaptureError, match=r"rank 1: the capture process died without a result; it exited with "):
        cap.capture(exits, 2, mode="inline")
    assert os._exit.__module__ == "posix" and not dist.is_initialized()


def test_an_init_that_fails_in_its_rendezvous_leaves_torchs_group_counter_as_it_was() -> None:
    """torch counts the default group's name before its rendezvous: a failed init left the counter one on, and the
    next capture in this process (a user's test suite) named every group one further on."""
    from torch.distributed import distributed_c10d as c10d

    before = c10d._world.group_count
    with pytest.raises(cap.CaptureError, match="rank parameter missing"):
        cap.capture(_init_with(init_method="tcp://127.0.0.1:29511"), 2, mode="inline")
    assert c10d._world.group_count == before


def test_a_call_torch_rejected_and_the_code_caught_is_not_recorded() -> None:
    """``new_group([world + 5])`` caught by the code was recorded as a group: the capture then failed on the
    Program's own checks (exit 2) where real torch went on, and a group torch never made would be charged."""
    run = cap.capture(examples.caught_rejections, 2)
    for rank in range(2):
        groups = [op for op in run.programs[rank].ops if isinstance(op, NewGroup)]
        inits = [op for op in run.programs[rank].ops if isinstance(op, InitProcessGroup)]
        assert [op.ranks for op in groups] == [(0, 1)] and len(inits) == 1
    notes = " ".join(run.notes)
    assert "new_group raised ValueError (torch rejected the call): not recorded" in notes
    assert "init_process_group raised ValueError" in notes
    assert simulate([list(p.ops) for p in run.programs], gpus_per_node=2).verdict == "pass"


def test_a_rejected_call_after_torch_took_a_group_name_is_refused() -> None:
    """Real gloo (measured): ``new_group(timeout=-5 s)`` raises gloo's "Invalid timeout" after torch's group
    counter moved on (the next group is named one higher); no Program of the calls that succeeded says so."""
    from simnccl.capture.intercept import _refuse_renamed, _unrecord
    from simnccl.capture.recorder import _Recorder

    rec = _Recorder(0, 0, checkpoints=False)
    rec.ops += [Checkpoint("kept"), Checkpoint("made by the call")]
    count = dist.distributed_c10d._world.group_count
    _unrecord(rec, "new_group", (1, 0, count - 1), RuntimeError("Invalid timeout"))
    assert rec.ops == [Checkpoint("kept")]
    with pytest.raises(cap.CaptureError, match="after torch took a group name from its counter, and the code went"):
        _refuse_renamed(rec)  # at the rank's next group call


def test_a_reinit_gets_a_checkpoint_of_its_own() -> None:
    """Each init_process_group added "after_init", so a program that destroys and re-initialises (a test suite's
    fixtures) met the label twice and the capture, and a scenario written from it, were refused (exit 2)."""
    run = cap.capture(examples.reinit_cycles, 2)
    labels = [op.label for op in run.programs[0].ops if isinstance(op, Checkpoint)]
    assert labels == ["after_init", "after_init_2", "end"]
    # simulated as re-inits are: under torchrun the agent's store keeps the destroyed incarnation's keys
    out = simulate([list(p.ops) for p in run.programs], gpus_per_node=2)
    assert out.verdict == "error" and "stale store key" in out.errors[0]["message"]


@pytest.mark.parametrize(
    ("backend", "devices", "missing"),
    [
        ("nccl", ("cpu",), "cpu"),  # torch 2.15's backend_capability: nccl serves cuda only
        (None, ("cuda", "cpu"), "cpu"),  # "undefined": the accelerator's backend only (BackendConfig)
        ("cpu:gloo", ("cuda",), "cuda"),
        ("cuda:nccl", ("cpu",), "cpu"),
    ],
)
def test_a_collective_on_a_device_its_group_has_no_backend_for_fails_as_on_a_gpu_host(
    backend: str | None, devices: tuple[str, ...], missing: str
) -> None:
    """The capture's stand-ins served every device type (its CUDA tensors are CPU tensors underneath), so a CPU
    tensor's all_reduce on an nccl group captured and simulated as a pass, where a GPU host raises torch's
    "No backend type associated with device type cpu"; and ``init_process_group()`` failed on its first CUDA
    collective, which a GPU host runs."""
    target = functools.partial(examples.collective_on, backend, devices)
    with pytest.raises(cap.CaptureError, match=f"No backend type associated with device type {missing}"):
        cap.capture(target, 2)


@pytest.mark.parametrize(
    ("backend", "devices", "recorded"),
    [
        (None, ("cuda",), "undefined"),
        ("cpu:gloo,cuda:nccl", ("cuda", "cpu"), "cpu:gloo,cuda:nccl"),
        ("gloo", ("cuda", "cpu"), "gloo"),
        ("nccl", ("cuda",), "nccl"),
    ],
)
def test_a_collective_on_a_device_its_group_serves_is_captured(
    backend: str | None, devices: tuple[str, ...], recorded: str, tmp_path: Path
) -> None:
    run = cap.capture(functools.partial(examples.collective_on, backend, devices), 2)
    [init] = [op for op in run.programs[0].ops if isinstance(op, InitProcessGroup)]
    assert init.backend == recorded
    assert len([op for op in run.programs[0].ops if isinstance(op, AllReduce)]) == len(devices)
    path = tmp_path / "c.toml"
    path.write_text(run.to_scenario_toml(), encoding="utf-8")  # a scenario simnccl run reads
    assert load_scenario(path).programs[0].ops == run.programs[0].ops


def test_init_with_only_a_device_id_records_the_backend_torch_picks(tmp_path: Path) -> None:
    """``init_process_group(device_id=cuda:N)``: torch takes the device type's default backend (l.2632). The
    capture recorded None, and writing its scenario was an internal error (exit 70)."""
    run = cap.capture(functools.partial(examples.collective_on, None, ("cuda",), True), 2)
    [init] = [op for op in run.programs[1].ops if isinstance(op, InitProcessGroup)]
    assert (init.backend, init.device_id) == ("nccl", 1)
    path = tmp_path / "c.toml"
    path.write_text(run.to_scenario_toml(), encoding="utf-8")
    assert load_scenario(path).programs[1].ops == run.programs[1].ops


def test_an_object_collective_on_an_nccl_group_makes_its_tensors_on_the_gpu() -> None:
    """torch picks an object collective's device from the group's device types, preferring cpu; every stand-in
    serves cpu, so the capture made them on cpu, where an nccl group (cuda only) has no backend."""
    run = cap.capture(examples.object_collectives, 2)
    assert [type(op) for op in run.programs[1].ops if isinstance(op, AllGather)] == [AllGather, AllGather]


def test_a_received_broadcast_is_deterministic_and_said_to_be_the_receivers_own() -> None:
    """``broadcast_object_list`` on a receiver read its sizes from ``torch.empty`` memory: an allocation of
    94 TB on one run, 139 TB on the next. Zeros now, every run: the receiver cannot unpickle rank 0's objects
    (which it never has), and a note says why."""
    failures = []
    for _ in range(2):
        with pytest.raises(cap.CaptureError) as failed:
            cap.capture(functools.partial(examples.object_collectives, True), 2)
        failures.append(str(failed.value).split("\\n")[0])
    assert failures[0] == failures[1] and "rank 1: the captured code raised EOFError" in failures[0]
    assert "a broadcast's or scatter's receivers kept their own values" in str(failed.value)


def test_monitored_barrier_is_a_barrier_of_a_gloo_group_and_torchs_error_elsewhere() -> None:
    """The stand-ins had no monitoredBarrier, so torch's C++ default refused it on gloo itself ("Backend gloo does
    not support monitoredBarrier, only GLOO supports monitored barrier"), which real gloo runs."""
    run = cap.capture(functools.partial(examples.monitored, "gloo"), 2)
    barriers = [op for op in run.programs[0].ops if isinstance(op, Barrier)]
    assert len(barriers) == 1 and barriers[0].group != "world" and barriers[0].call == "monitored_barrier"
    assert barriers[0].timeout_s == 10.0  # its own timeout (the code's timedelta), simulated as its wait's
    assert "monitored_barrier is simulated as a barrier of its group that only monitored" in " ".join(run.notes)
    assert simulate([list(p.ops) for p in run.programs], gpus_per_node=2).verdict == "pass"
    with pytest.raises(cap.CaptureError, match=r"monitored_barrier requires a group with a CPU-capable backend"):
        cap.capture(functools.partial(examples.monitored, "nccl"), 2)  # nccl: no cpu backend at all (ValueError)


@pytest.mark.parametrize(("backend", "served"), [("nccl", ["cuda"]), ("cpu:gloo,cuda:nccl", ["cpu", "cuda"])])
def test_a_group_shows_the_device_types_a_gpu_hosts_torch_gives_it(backend: str, served: list[str]) -> None:
    """Every stand-in registers for cpu and cuda, so an nccl group's ``_device_types`` showed cpu too: torch then
    picked the CPU for what it decides from them (``_get_pg_default_device``: DCP's ``broadcast_from_rank0``
    broadcast CPU tensors over nccl, and the capture refused it), and ``monitored_barrier``'s own check let an
    nccl group through. Code that catches torch's ValueError there falls back as it does on a GPU host."""
    seen: list[list[str]] = []

    def target() -> None:
        seen.append(examples.device_capability(backend))

    run = cap.capture(target, 2, mode="inline")
    assert [sorted(types) for types in seen] == [served, served]
    assert any(isinstance(op, Barrier) for op in run.programs[0].ops)


def test_a_functional_collective_on_a_device_its_group_has_no_backend_for_fails_too() -> None:
    """``funcol.all_reduce`` (``torch.ops._c10d_functional``: DTensor's path) reaches the backend without the
    Python ``torch.distributed`` call, so a CPU tensor's on an nccl group captured as a pass."""
    from torch.distributed import _functional_collectives as funcol

    def startup(device: str) -> None:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        funcol.wait_tensor(funcol.all_reduce(torch.ones(4, device=device), "sum", dist.group.WORLD))

    assert cap.capture(functools.partial(startup, "cuda"), 2, mode="inline").programs[0].ops
    with pytest.raises(cap.CaptureError, match="No backend type associated with device type cpu"):
        cap.capture(functools.partial(startup, "cpu"), 2, mode="inline")
