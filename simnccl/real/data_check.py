"""The real driver's data check: every tensor a rank sends names its sender, so a result names whose data it holds.

Why: two groups of one size bootstrapped under one store name whose members' group ranks differ write each
group-rank key once, and torch connects the writers (``simnccl.engine.store_collisions``; measured on torch 2.15
gloo, ``tests/test_real_gloo_cross_wiring.py``). Every op on such a group then runs between the wrong ranks, on
their data, and raises nothing: a real run with tensors of ones said "pass" where its groups silently exchanged
data with ranks outside them. The simulator stops such a rank with a check of its own (``CROSS_WIRED_TYPE``); this
is the same check made on the data itself, so a real run (gloo in CI, NCCL on a GPU lane) stops where the data
shows it, and the two sides can be compared op for op.

The encoding, in global ranks (what the rank's data identifies whatever the group thinks its members are):

* an op that sums (``all_reduce``, ``reduce_scatter``): rank ``r`` contributes ``2**r``, so a sum of distinct
  ranks' values is the bit mask of the ranks summed;
* an op that moves data (``broadcast``, ``all_gather``, ``all_to_all``, ``recv``): rank ``r`` sends ``r + 1``, and an
  output not yet written holds 0 (``torch.zeros``), which names no rank.

A result is flagged only when it names a rank that is **not a member of the group**, with the signature of a wrong
connection (``foreign_senders``: each chunk one value throughout; a sum of as many distinct ranks as the group
has, the receiver among them): data no member sent can reach a rank only over a connection to a rank outside the
group. Anything else is left alone, on purpose: two members running different algorithms at one tag (an
all_reduce beside a reduce_scatter of one size, which gloo completes), or of different sizes, leave partial or
misaligned sums of members, a timing question the simulator models as its own, not a wrong peer.

Where a dtype cannot hold every value exactly (``bool``, ``int8`` beyond 7 ranks, the float8 kinds, ``bfloat16``
sums beyond 8 ranks), the op's data is not checked, and the op's record says so (its detail ends ``data not
checked: ...``, ``unchecked_reason``), so a result is never read as checked when it was not. A barrier and a
send carry nothing back to check.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from simnccl.backends.gloo import CROSS_WIRED_TYPE

# The error type a flagged result raises: the simulator's check of the same fact, so the two sides compare alike
# (the ranks it names go beside the message under the simulator's key, ``backends.gloo.FOREIGN_RANKS``).
FOREIGN_DATA_TYPE = CROSS_WIRED_TYPE

SUMS = "sums"  # an op whose result is the sum of its members' values
MOVES = "moves"  # an op whose result is some member's values, moved

FOREIGN_DATA = (
    "simnccl data check: {op} on group {name!r} of ranks {members} returned data sent by ranks {foreign}, which "
    "are not members of it: torch connected this rank's group to other ranks (groups bootstrapped under one "
    "store name, each group-rank key written once) and raised nothing"
)


def value_of(rank: int, kind: str) -> int:
    """What global rank ``rank`` puts in every element it sends in an op of ``kind``."""
    return 1 << rank if kind == SUMS else rank + 1


def largest(world_size: int, kind: str) -> int:
    """The largest value a result of ``kind`` holds in a world of ``world_size`` ranks (every rank summed once)."""
    return (1 << world_size) - 1 if kind == SUMS else world_size


def unchecked_reason(torch: Any, dtype: Any, world_size: int, kind: str) -> str | None:
    """Why ``dtype`` cannot carry the check of a ``kind`` op at ``world_size`` ranks, or None when it can: every
    value from 0 to ``largest`` must survive a round trip through it exactly (for an integer or a float kind the
    largest one surviving means every smaller one does)."""
    top = largest(world_size, kind)
    try:
        probe = torch.full((1,), top, dtype=dtype)
        back = probe.to(torch.complex128).real if probe.is_complex() else probe.to(torch.float64)
        exact = back.item() == top
    except (RuntimeError, TypeError, OverflowError):
        exact = False
    if exact:
        return None
    return f"data not checked: {dtype} cannot hold {top} exactly ({kind} of {world_size} ranks)"


def senders(value: float, world_size: int, kind: str) -> set[int]:
    """The global ranks one element's value names (none for a value no encoding makes, such as the 0 of an output
    never written)."""
    if value != int(value) or value <= 0 or value > largest(world_size, kind):
        return set()
    code = int(value)
    if kind == SUMS:
        return {r for r in range(world_size) if code >> r & 1}
    return {code - 1}


def sample(result: Any, chunks: int = 1) -> list[list[float]]:
    """Per chunk of ``result`` (a tensor this rank received into; an all_gather or all_to_all output holds one
    chunk per member), its first, middle and last element. Each sender fills its whole tensor with one value, so a
    chunk of a clean result is one sender's value (or one sum) throughout, and a connection to the wrong rank makes
    every element of its chunk wrong alike.

    Why a sample and not ``torch.unique``: on the GPU lane a result can be hundreds of MiB, which a copy to the
    host and a sort would make seconds and GiBs per op; an element read with ``item()`` allocates nothing on the
    device, so the lane's memory figures stay the op's own."""
    flat = result.detach().reshape(-1)
    count = flat.numel()
    if count == 0:
        return []
    if chunks < 1 or count % chunks:
        chunks = 1
    width = count // chunks
    out = []
    for start in range(0, count, width):
        values = []
        for index in sorted({start, start + width // 2, start + width - 1}):
            value = flat[index].item()
            values.append(value.real if isinstance(value, complex) else float(value))
        out.append(values)
    return out


def foreign_senders(
    result: Any, rank: int, members: Collection[int], world_size: int, kind: str, chunks: int = 1
) -> list[int]:
    """The ranks outside ``members`` whose data ``result``, received by global rank ``rank``, holds, in order; none
    unless the sample (``sample``) has the signature of a wrong connection, so that no other garbage is read as
    one: every chunk one value throughout, and a sum (``SUMS``) the sum of as many distinct ranks as the group
    has, this rank among them (a connection to the wrong ranks still sums every connected rank once; a size
    mismatch between members, a race of its own, leaves partial sums that would not be read as a wrong peer)."""
    found: set[int] = set()
    for values in sample(result, chunks):
        if len(set(values)) != 1:
            return []
        named = senders(values[0], world_size, kind)
        if kind == SUMS and named and (rank not in named or len(named) != len(members)):
            return []
        found |= named
    return sorted(found - set(members))
