"""``ProcessGroupGloo``: no GPU memory; the members connect a full mesh over the store at construction.

How gloo differs from NCCL where ranks disagree — measured on torch 2.15.0 gloo, 2-4 CPU processes over a
FileStore (pinned in the simulator by ``tests/test_gloo_semantics.py``, on real gloo by
``tests/test_real_gloo_semantics.py``):

* **Matching.** Every collective draws the next tag of its process group, and each gloo algorithm sends on its
  own *slot* (``Slot::build(prefix, tag)``, one prefix per algorithm). Two ranks at one tag running different
  algorithms never see each other's messages: both wait until the timeout (all_reduce vs broadcast, all_gather,
  barrier or all_to_all; broadcast vs barrier; all_gather vs reduce_scatter all time out with ``Timed out waiting
  ...ms for recv/send operation to complete``). torch runs ``reduce_scatter_tensor`` as an allreduce, so
  all_reduce vs reduce_scatter of one size *completes* (``WIRE_FAMILY``).
* **Sizes.** One algorithm with different sizes: a rank that receives more bytes than it posted aborts the
  process (``gloo::EnforceNotMet ... op.preamble.length <= op.nbytes ... Received data size doesn't match
  expected size``, SIGABRT); what its peers see then is its sockets closing (all_reduce, reduce_scatter,
  all_to_all: ``Read error ...: Connection reset by peer``; a broadcast root or an all_gather rank that received
  no more than it posted may complete first). The simulator aborts every member (the verdict, error, and the
  unfinished ranks are the same; the generated differential programs use one size throughout).
* **Closed peers.** A ProcessGroupGloo closes its sockets when freed (gloo has no shutdown), and a process
  closes all of them when it dies: a peer already waiting on it, or one that later posts an operation towards
  it, fails at once with ``RuntimeError: [.../gloo/transport/tcp/pair.cc:561] Connection closed by peer
  [addr]:port`` (or, when unread data was pending, as after an abort: ``Read error ...: Connection reset by
  peer``). ``destroy_process_group()``
  frees the default group (torch holds its only reference); a subgroup lives on while the program holds it
  (frameworks keep theirs in globals; so does ``simnccl.real.driver``), and a peer waiting on it keeps waiting (seed3-
  case47). Only peers the algorithm talks to directly fail (``direct_peers``); a rank that is merely idle or
  failed with a Python exception keeps its sockets open. A gloo timeout also closes the rank's pair, not
  modelled: the simulator reports a timeout as the hang it ends.
* **Partial collectives.** gloo collectives are point-to-point algorithms. Rings (all_reduce, reduce_scatter,
  all_gather), the dissemination barrier and all_to_all need every member, but broadcast is a binomial tree: with
  a member missing, the ranks whose parent chain and children are all in complete (``broadcast_needs``).
* **One-rank groups** still write their key under the group's store prefix (``SINGLETON_RACE``).
* **Split.** ``ProcessGroupGloo::split`` builds a fresh gloo context over a store prefixed with the new group's
  hashed name (members only; a non-member returns ``NON_GROUP_MEMBER`` at once): it is a members-only bootstrap,
  not a collective on the parent as ``ncclCommSplit`` is (``split_is_collective``).
"""

from __future__ import annotations

from simnccl.backends.base import Lifecycle
from simnccl.release import Impl, Release

# The gloo algorithm (and so the slot prefix) each torch collective runs on ProcessGroupGloo.
WIRE_FAMILY = {
    "all_reduce": "allreduce",
    "reduce_scatter": "allreduce",  # ProcessGroupGloo reduce_scatter: an allreduce, then the local chunk
    "broadcast": "broadcast",
    "all_gather": "allgather",
    "all_to_all": "alltoall",
    "barrier": "barrier",
}

# What a rank waiting on a late peer raises at its timeout (measured on torch 2.15's gloo, 3 ranks, one 8 s late
# to an all_reduce under timeout=3 s: "unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to
# complete" on the waiting rank; a rank whose pending *send* slot is the one that expires prints the same with
# ":129" and "send", which this model does not tell apart).
RECV_TIMED_OUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting {ms}ms "
    "for recv operation to complete"
)

PEER_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
    "(rank {peer}). This is typically caused by a remote worker crashing. Check the logs of the remote worker "
    "before reporting an error."
)

# A one-rank ProcessGroupGloo writes its address under the group-rank-0 key of its name (measured: one store key)
# and waits for nobody; a real group bootstrapping under the same name (diverged counters) reads whichever write
# came last. Real runs of one program end either way (seed2-case27: a hang once, a pass twice).
SINGLETON_RACE = "a one-rank group's key: whether the bootstrap succeeds depends on the order of the store writes"


def wire_mismatch(a: tuple[str, int, str], b: tuple[str, int, str]) -> str | None:
    """How two collectives at one tag of a gloo group end: None (they run as one), ``"hang"`` (different
    algorithms: different slots, nobody matches) or ``"abort"`` (one algorithm, different sizes: someone
    receives more than it posted). Payloads are ``(op name, size_bytes, dtype)``; a barrier carries no data."""
    family_a, family_b = WIRE_FAMILY.get(a[0], a[0]), WIRE_FAMILY.get(b[0], b[0])
    if family_a != family_b:
        return "hang"
    if family_a == "barrier":
        return None
    return "abort" if a[1] != b[1] else None


def direct_peers(op_name: str, index: int, size: int, root: int = 0) -> tuple[int, ...]:
    """The group ranks whose sockets a gloo algorithm reads or writes on group rank ``index``: only a closed
    socket to one of them fails the operation; a rank whose own peers stay open keeps waiting.

    Measured (4 ranks, rank 3 destroys its groups while 0-2 wait in the collective): all_reduce, reduce_scatter
    and all_gather are rings (ranks 0 and 2 fail, rank 1 times out); broadcast is a binomial tree over
    ``(rank - root) % size`` (rank 1, 3's parent, fails; the root and rank 2 complete; measured with root 0,
    other roots follow gloo's virtual rank); all_to_all and barrier
    talk to every rank; a send/recv talks to its peer.
    """
    if size <= 1:
        return ()
    family = WIRE_FAMILY.get(op_name, op_name)
    if family in ("allreduce", "allgather"):
        return tuple(sorted({(index - 1) % size, (index + 1) % size} - {index}))
    if family == "broadcast":
        v = (index - root) % size
        peers = set(_tree_children(v, size))
        if v:
            peers.add(v - (1 << (v.bit_length() - 1)))
        return tuple(sorted((p + root) % size for p in peers))
    return tuple(r for r in range(size) if r != index)


def _tree_children(v: int, size: int) -> list[int]:
    """Virtual rank ``v``'s children in gloo's binomial broadcast tree of ``size``: ``v + 2^k`` for every bit
    above ``v``'s highest set bit (every bit for the root), shared by ``direct_peers`` and ``broadcast_needs``."""
    children = []
    bit = 1 << v.bit_length() if v else 1
    while v + bit < size:
        children.append(v + bit)
        bit <<= 1
    return children


def broadcast_needs(index: int, size: int, root: int = 0) -> tuple[int, ...]:
    """The group ranks that must have joined a gloo broadcast before group rank ``index`` can leave it: its
    chain of tree ancestors (the data comes down it) and its children (a gloo send completes only once the
    receiver has posted its recv). Measured, 4 ranks, root 0, rank 2 never joins: the root hangs (its send to 2),
    rank 1 receives and completes, rank 3 (1's child) completes."""
    v = (index - root) % size
    needs = set(_tree_children(v, size))
    u = v
    while u:
        u -= 1 << (u.bit_length() - 1)
        needs.add(u)
    return tuple(sorted((n + root) % size for n in needs))


class GlooLifecycle(Lifecycle):
    impl = Impl.GLOO
    allocates_gpu_memory = False
    split_is_collective = False

    def eager_at_creation(self, release: Release, *, bound: bool, lazy_init: bool) -> bool:
        return True
