"""What the stand-in backend writes into a collective's outputs: the values of a world where every rank holds
this rank's data, and zeros where that says nothing.

Why: the stand-in communicates nothing, but captured code reads what collectives return and branches on it —
``torch.nn.init.trunc_normal_`` on a DTensor loops until a gathered mask is all False, DTensor's
``full_tensor`` feeds later ops, optimizers check gathered norms for overflow. An output left as ``empty``
memory made those branches random: a capture that differed from run to run, or a rejection loop that spun
until the rank was killed. With these rules every output is defined and the capture is deterministic:

* gathers (``all_gather``, ``all_gather_into_tensor`` and their coalesced forms, ``gather`` at the root): every
  slot holds this rank's input;
* ``reduce_scatter`` (list and tensor forms): this rank's own chunk of its input, as ``all_reduce`` here leaves
  the input as it is (one contributor's values, whatever the reduction);
* ``all_to_all``: every chunk received is the chunk this rank would send to itself (equal splits; otherwise
  zeros);
* ``scatter`` at a non-root and ``recv``: zeros (nothing about the sender's data is known);
* ``broadcast`` at a receiver: what the receiver holds (its own model's parameters, as seeded alike on every
  rank; zeros in a buffer torch made with ``empty``, which the capture's placement zero-fills: such memory made
  ``broadcast_object_list`` read a size of 94 TB on one run and 139 TB on the next). A capture note says so.

The values are not a real run's (no other rank's data exists here); only their determinism, shapes and dtypes
are relied on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def gather_into(output: torch.Tensor, input: torch.Tensor) -> None:
    """``output`` is ``size`` copies of ``input`` laid end to end (``all_gather_into_tensor``)."""
    if input.numel() and output.numel() % input.numel() == 0:
        # clone: FSDP2 gathers in place (its input is a slice of the output)
        output.view(-1, input.numel()).copy_(input.reshape(1, -1).clone())
    else:
        output.zero_()


def gather_into_slots(slots: Sequence[torch.Tensor], input: torch.Tensor) -> None:
    """Every slot of a list all-gather (or a gather's root) holds ``input``."""
    for slot in slots:
        slot.copy_(input)


def own_chunk(output: torch.Tensor, input: torch.Tensor, rank: int) -> None:
    """``reduce_scatter_tensor``: this rank's chunk of its own (flattened) input."""
    count = output.numel()
    flat = input.reshape(-1)
    if flat.numel() >= (rank + 1) * count:
        output.copy_(flat[rank * count : (rank + 1) * count].reshape(output.shape))
    else:
        output.zero_()


def own_chunk_of_list(output: torch.Tensor, inputs: Sequence[torch.Tensor], rank: int) -> None:
    """``reduce_scatter`` with a list input: this rank's entry."""
    if rank < len(inputs) and inputs[rank].numel() == output.numel():
        output.copy_(inputs[rank].reshape(output.shape))
    else:
        output.zero_()


def exchange(output: torch.Tensor, input: torch.Tensor, rank: int, size: int, splits: Sequence[int]) -> None:
    """``all_to_all_single``: each chunk received is the chunk this rank sends itself (equal splits only)."""
    if (splits and len(set(splits)) > 1) or size <= 0 or input.shape != output.shape or input.shape[0] % size:
        output.zero_()
        return
    chunk = input.shape[0] // size
    own = input[rank * chunk : (rank + 1) * chunk].clone()
    output.view(size, chunk, *input.shape[1:]).copy_(own.unsqueeze(0))


def exchange_list(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], rank: int) -> None:
    """``all_to_all`` with lists: every output is the input this rank sends itself."""
    own = inputs[rank] if rank < len(inputs) else None
    for output in outputs:
        if own is not None and own.shape == output.shape:
            output.copy_(own)
        else:
            output.zero_()


def zeros(tensors: Sequence[torch.Tensor]) -> None:
    """A receive with nothing known about the sender's data."""
    for tensor in tensors:
        tensor.zero_()
