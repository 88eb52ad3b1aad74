"""What captured code reads back from a collective (``simnccl.capture.collective_values``) and from the CUDA
generator (``simnccl.capture.cuda_generator``): defined, deterministic values, as torch's own code needs them.

Before: the stand-in wrote nothing into the outputs of functional and coalesced gathers, reduce-scatters and
all-to-alls, so DTensor's ``full_tensor`` returned uninitialised memory, and ``trunc_normal_`` on a DTensor
(``while mask.any(): resample``) spun until the rank was killed; DTensor's random ops failed on the CPU
generator's state (``AssertionError`` in ``_PhiloxState``).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist

from simnccl import capture as cap
from simnccl.capture.cuda_generator import PhiloxStateGenerator

pytestmark = pytest.mark.torch


def _startup() -> None:
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())


def test_every_collective_output_holds_this_ranks_data_as_if_every_rank_held_it() -> None:
    import torch.distributed._functional_collectives as funcol

    seen: dict[int, dict[str, Any]] = {}

    def target() -> None:
        _startup()
        rank, world = dist.get_rank(), dist.get_world_size()
        x = torch.arange(4.0, device="cuda") + 10 * rank
        out: dict[str, Any] = {}
        gathered = torch.full((4 * world,), -1.0, device="cuda")
        dist.all_gather_into_tensor(gathered, x)
        out["all_gather_into_tensor"] = gathered.tolist()
        out["functional all_gather"] = funcol.all_gather_single(x, 0, dist.group.WORLD).tolist()
        out["coalesced all_gather"] = [
            t.tolist() for t in funcol.all_gather_single_coalesced([x, x + 1], dist.group.WORLD)
        ]
        chunk = torch.full((2,), -1.0, device="cuda")
        dist.reduce_scatter_tensor(chunk, x)
        out["reduce_scatter_tensor"] = chunk.tolist()
        out["functional reduce_scatter"] = funcol.reduce_scatter_single(x, "sum", 0, dist.group.WORLD).tolist()
        exchanged = torch.full((4,), -1.0, device="cuda")
        dist.all_to_all_single(exchanged, x)
        out["all_to_all_single"] = exchanged.tolist()
        received = torch.full((4,), -1.0, device="cuda")
        if rank == 1:
            dist.recv(received, 0)
        else:
            dist.send(x, 1)
        out["recv"] = received.tolist()
        seen[rank] = out

    cap.capture(target, 2, mode="inline")
    one = [10.0, 11.0, 12.0, 13.0]
    assert seen[1]["all_gather_into_tensor"] == seen[1]["functional all_gather"] == one + one
    assert seen[1]["coalesced all_gather"] == [one + one, [v + 1 for v in one] * 2]
    assert seen[0]["reduce_scatter_tensor"] == seen[0]["functional reduce_scatter"] == [0.0, 1.0]
    assert seen[1]["reduce_scatter_tensor"] == seen[1]["functional reduce_scatter"] == [12.0, 13.0]
    assert seen[1]["all_to_all_single"] == [12.0, 13.0, 12.0, 13.0]
    assert seen[1]["recv"] == [0.0] * 4


def test_dtensor_random_init_draws_from_the_devices_philox_state_and_moves_its_offset() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    seen: dict[int, Any] = {}

    def target() -> None:
        _startup()
        mesh = init_device_mesh("cuda", (2,))
        weight = distribute_tensor(torch.zeros(64, 8, device="cuda"), mesh, [Shard(0)])
        before = torch.cuda.get_rng_state()
        with torch.no_grad():
            torch.nn.init.trunc_normal_(weight, std=0.02, a=-0.03, b=0.03)  # rejection sampling: loops on any()
        first = weight.to_local().clone()
        with torch.no_grad():
            weight.normal_()
        full = weight.full_tensor()
        seen[dist.get_rank()] = (
            before,
            torch.cuda.get_rng_state(),
            first,
            weight.to_local(),
            full,
            torch.cuda.memory_allocated(),
        )

    cap.capture(target, 2, mode="inline")
    before, after, first, second, full, allocated = seen[0]
    assert before.numel() == after.numel() == 16  # torch's CUDA (Philox) state: seed, offset
    assert before[:8].tolist() == after[:8].tolist() and after[8:].view(torch.int64).item() > 0
    assert first.abs().max().item() <= 0.03 and not torch.equal(first, second)
    assert full.shape == (64, 8) and torch.isfinite(full).all()
    assert allocated > 0  # the shards' storage is on the fake device


def test_the_fake_cuda_generator_keeps_torchs_philox_state_protocol() -> None:
    generator = PhiloxStateGenerator().manual_seed(1234)
    state = generator.get_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    assert state[:8].view(torch.int64).item() == 1234 and generator.get_offset() == 0
    drawn = torch.rand(6, generator=generator)
    generator.advance(6)
    assert generator.get_offset() == 8  # one Philox counter step per four values
    generator.set_state(state)
    assert generator.get_offset() == 0 and torch.equal(torch.rand(6, generator=generator), drawn)
    generator.set_offset(8)
    assert generator.initial_seed() == 1234 and not torch.equal(torch.rand(6, generator=generator), drawn)
    with pytest.raises(RuntimeError, match="wrong size"):
        generator.set_state(torch.get_rng_state())


def test_ranks_issuing_different_collectives_on_a_group_get_a_note_naming_it() -> None:
    def branching() -> None:
        _startup()
        x = torch.ones(4, device="cuda")
        for _ in range(1 + dist.get_rank()):  # a data- or rank-dependent loop
            dist.all_reduce(x)

    def spmd() -> None:
        _startup()
        dist.all_reduce(torch.ones(4, device="cuda"))

    run = cap.capture(branching, 2, mode="inline")
    notes = [n for n in run.notes if "different numbers of collectives" in n]
    assert len(notes) == 1 and "ranks 0: 1; ranks 1: 2" in notes[0], run.notes
    assert notes[0] in run.summary()
    assert run.simulate().verdict == "hang"  # the note explains; it never changes the verdict
    assert not any("different numbers" in n for n in cap.capture(spmd, 2, mode="inline").notes)
