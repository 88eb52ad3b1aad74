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
* **Sizes.** One algorithm with different sizes: gloo checks sizes per message, not per collective. Each rank
  sends and posts recvs sized from its own buffer only; a rank that receives a message larger than the recv it
  posted aborts the process (``gloo::EnforceNotMet ... op.preamble.length <= op.nbytes. 8 vs 4. Received data
  size doesn't match expected size``, SIGABRT); a smaller message completes the recv. A rank still waiting on
  the dead one fails at once as its sockets close (``Read error ...: Connection reset by peer``, sometimes
  ``Connection closed by peer``: peer-lost), a rank whose messages all fit completes, one left waiting on
  messages never sent times out (all_reduce of 4 floats on three ranks, 8 on the fourth: the segments match, the
  three complete, the fourth waits). ``wire_fates`` runs the algorithms' messages (``_steps``) to decide each
  rank; send/recv likewise (a recv smaller than its send aborts the receiver, the sender completes). The
  measured cases are pinned in ``tests/test_gloo_semantics.py`` (``MEASURED``). Racy in real runs, so not
  decided alike every time: whether an aborting rank's own messages got out before it died (all_gather and
  all_to_all on 2 ranks: its peer completed in some runs, lost it in others; the model follows the majority
  measured per algorithm).
* **Closed peers.** A ProcessGroupGloo closes its sockets when freed (gloo has no shutdown), and a process
  closes all of them when it dies: a peer already waiting on it, or one that later posts an operation towards
  it, fails at once with ``RuntimeError: [.../gloo/transport/tcp/pair.cc:561] Connection closed by peer
  [addr]:port`` (or, when unread data was pending, as after an abort: ``Read error ...: Connection reset by
  peer``). ``destroy_process_group()``
  frees the default group (torch holds its only reference); a subgroup lives on while the program holds it
  (frameworks keep theirs in globals; so does ``simnccl.real.driver``), and a peer waiting on it keeps waiting (seed3-
  case47). Only peers the algorithm talks to directly fail (``direct_peers``), and only once they wait on the
  closed socket: a pair signals the close to the buffers with an op pending on it, so gloo's ring allreduce
  (all_reduce, reduce_scatter), which waits on its recv from ``rank + 1`` before its send to ``rank - 1`` (two
  buffers), keeps waiting on a live recv peer that never sends while its send peer is closed, before or after it
  entered (``allreduce_waits``); allgather sends and receives on one buffer, so either neighbour fails it. A rank
  that is merely idle or failed with a Python exception keeps its sockets open. A gloo timeout closes every pair
  of the rank's context before torch raises (``context_->signalException``): the rank leaves the operation, a
  member still waiting on it directly fails then as peer-lost, and one arriving later does too, never completing
  the operation with it (measured by a tester, 2-3 ranks, 2 runs each; ``Watchdogs._gloo_timeout_closes``). The
  timed-out rank is reported as the hang it ends; a member its close failed keeps the wait it was in
  (``replaced_timeout`` with ``ended_by``), which a real run stopped before that timeout saw as stuck.
* **Partial collectives.** gloo collectives are point-to-point algorithms. Rings (all_reduce, reduce_scatter,
  all_gather), the dissemination barrier and all_to_all need every member, but broadcast is a binomial tree: with
  a member missing, the ranks whose parent chain and children are all in complete (``broadcast_needs``). A
  member that issued another algorithm at the broadcast's tag is missing to it (another slot; seed104-case33).
  If the broadcasters also disagree on size, the messages decide each of them (``wire_fates`` without the
  missing members), and a ring member beside them fails once its neighbour aborts (4 ranks, 0 and 3 all_reduce
  at the tag of a broadcast from 1 of 96 B that rank 2 posts 48 B for: 2 aborts, 3 loses it, 0 and 1 hang). Any
  algorithm's size mismatch beside another algorithm is decided the same way, the other members missing to it
  (ranks 0 to 2 all_gather 96, 192 and 96 B beside rank 3's barrier: 2 aborts, 1 and 3 lose it, 0 hangs).
* **One-rank groups** still write their key under the group's store prefix (``SINGLETON_RACE``); groups that
  collide under one name with all their members there may each read their own keys (``COMPLETE_COLLISION_RACE``).
  Groups of one size under one name whose members' group ranks differ write each key once: gloo connects the
  writers, cross-wired (``engine.store_collisions``, ``CROSS_WIRED``).
* **Split.** ``ProcessGroupGloo::split`` builds a fresh gloo context over a store prefixed with the new group's
  hashed name (members only; a non-member returns ``NON_GROUP_MEMBER`` at once): it is a members-only bootstrap,
  not a collective on the parent as ``ncclCommSplit`` is (``split_is_collective``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simnccl.backends.base import Comm, Lifecycle
from simnccl.dtypes import element_bytes
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


# Calls (``ops.CALLS``) whose messages ``mismatch_fates`` does not run: a size mismatch among them hangs rather than
# being guessed message by message (gather and scatter are run: each message is one member's buffer).
_NO_MESSAGE_MODEL = frozenset({"reduce"})


def wire_family(op_name: str) -> str:
    """The gloo algorithm ``op_name`` runs (``WIRE_FAMILY``); an op outside it (send, recv) is its own."""
    return WIRE_FAMILY.get(op_name, op_name)


# What a rank waiting on a late peer raises at its timeout (measured on torch 2.15's gloo, 3 ranks, one 8 s late
# to an all_reduce under timeout=3 s: "unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to
# complete" on the waiting rank; a rank whose pending *send* slot is the one that expires prints the same with
# ":129" and "send", which this model does not tell apart).
RECV_TIMED_OUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting {ms}ms "
    "for recv operation to complete"
)

# A recv from the rank itself (torch checks only send's destination, ``_check_not_self_rank``; irecv allows it, and
# isend and irecv in a batch_isend_irecv): gloo has no pair to itself. Measured on 2.15 gloo (both): the text then
# names the pair's addresses, left out here.
RECV_FROM_SELF = (
    "[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:809] state_ >= CONNECTED. "
    "1 vs 4. Pair is not connected"
)

PEER_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
    "(rank {peer}). This is typically caused by a remote worker crashing. Check the logs of the remote worker "
    "before reporting an error."
)

# A one-rank ProcessGroupGloo writes its address under the group-rank-0 key of its name (measured: one store key)
# and waits for nobody; a real group bootstrapping under the same name (diverged counters) reads whichever write
# came last. Real runs of one program end either way (seed2-case27: a hang once, a pass twice).
# A re-init's member that read a destroyed incarnation's address (``engine.reinit_store.ReinitStore.stale_writer``):
# measured on torch 2.15 under torchrun, rank 0 re-initialising 3 s late, rank 1 raised this from connectFullMesh
# after gloo's connect retries (tcp/helpers.cc retries at once), long before the timeout; "remote" is the old
# listener's address.
STALE_ADDRESS = (
    "Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152] "
    "timed out connecting: SO_ERROR: Connection refused, remote=[rank {peer}'s address in the destroyed "
    "incarnation]\n{stale}"
)
SINGLETON_RACE = "a one-rank group's key: whether the bootstrap succeeds depends on the order of the store writes"

# Two groups bootstrapping under one name with every member of each there (diverged counters: [0, 2] and [1, 3]
# both named '2') write the same group-rank keys; each member writes its own, then reads its peers'. A member
# that reads before the other group overwrites gets its own group's address, so the verdict is the order of the
# writes: real runs of seed124-case38 passed 4 times in 10 and hung 6.
COMPLETE_COLLISION_RACE = (
    "every colliding group is complete under that name: whether each member reads its own group's keys depends "
    "on the order of the store writes"
)


# An op on a group whose gloo bootstrap another group of its size joined by group rank under one name, each
# group-rank key written once (``engine.store_collisions``, measured there): gloo connected the writers, so the op runs
# between the wrong ranks and raises nothing. The simulator stops the rank there (a collective once it ran), as a
# check of its own (``CROSS_WIRED_TYPE``): real torch shows nothing, only the real driver's data check
# (``real.data_check``) does.
CROSS_WIRED = (
    "simnccl check: group {name!r} of ranks {group} bootstrapped under a store name that a group of ranks {other} "
    "also bootstrapped under (diverged group counters), each group-rank key written once, so gloo connected "
    "this rank to ranks {wire} (in group-rank order) in place of {group}. On torch 2.15 gloo this {op} runs "
    "between those ranks, on their data, and raises nothing"
)
CROSS_WIRED_TYPE = "CrossWiredGroup"
# The rank error's key for the ranks outside the group whose data the op would carry (the simulator's check) or
# carried (the real driver's data check): real compare checks the second against the first.
FOREIGN_RANKS = "foreign_ranks"

# A gloo all_to_all whose members disagree on size: a member that receives more than it posted aborts, and the
# member that sent too much completes only if every peer's message reached it before that peer died. Measured
# (real diff seed2-case11, 3 ranks, rank 2 sending twice the bytes): rank 2 lost a peer in 5 runs of 6 and
# completed in 1; ranks 0 and 1 aborted in all 6. The simulator reports the first; which one happens is timing.
ALLTOALL_SIZE_RACE = (
    "in gloo's all_to_all whether a member that sent too much reads its peers' messages before they abort is "
    "decided by timing"
)

# A two-member gloo all_gather whose members disagree on size: the member that receives more than it posted aborts,
# and the one that sent too much completes only if the aborting member's message reached it before that member
# died. Measured (real diff seed67-case27, 2-rank split group, rank 1 gathering twice the bytes): rank 2 aborted in
# 8 runs of 8; rank 1 completed in 4 and lost its peer in 4. The simulator reports it completing; which one happens
# is timing. Groups of more members are not measured, so they are compared rank by rank.
ALLGATHER_SIZE_RACE = (
    "in a two-member gloo all_gather whether the member that sent too much reads its peer's message before the "
    "peer aborts is decided by timing"
)


# A gloo ring allreduce (all_reduce, reduce_scatter) of three or more members whose members disagree on size: a
# member that receives more than it posted aborts, and the member with the larger buffer either loses its peer or
# is left waiting on a message never sent, by timing. Measured (real diff seed94-case7, 3 ranks, rank 2
# reduce_scattering twice the bytes: ranks 0 and 1 aborted or lost a peer in 4 runs of 4, rank 2 hung in 3 and lost
# its peer in 1; seed116-case4, 4 ranks, rank 1 all_reducing twice the bytes: it hung in 2 runs of 3 and lost its
# peer in 1; seed41-case12, 3 ranks, did both over earlier sessions). The simulator reports the peer lost. Two
# members are not measured, so they are compared rank by rank.
ALLREDUCE_SIZE_RACE = (
    "in a gloo ring allreduce of three or more members whether the member with the larger buffer loses its peer "
    "or waits on a message never sent is decided by timing"
)


# A gloo barrier a member left for good (it skipped the barrier and closed its sockets): every other member fails
# with "Connection closed by peer" or waits, depending on whether its peers' messages of the barrier's earlier
# rounds got out before those peers failed. Measured (real diff seed27-case3, 4 ranks, rank 0 skips the barrier and
# destroys the world): ranks 1 and 3 lost a peer in 6 runs of 6; rank 2 lost one in 3 and hung in 3. The
# simulator reports every member losing the peer; which one happens is timing.
BARRIER_PEER_RACE = (
    "in gloo's barrier whether a member whose peers failed before sending their part fails or waits is decided "
    "by timing"
)

# Members of one gloo collective or send/recv whose timeouts fall due together: a member that times out closes its
# pairs, so each other one either times out itself or first sees the closed socket ("Connection closed by peer").
# Measured (real diff seed3-case41, 2 ranks both rooting a broadcast on a 2 s group): both timed out in 4 runs of 7,
# one lost the peer in 3. The simulator reports every member timing out; which one happens is timing.
TIMEOUT_TIE_RACE = (
    "members of this gloo operation time out together: whether each times out or first sees a peer's closed "
    "socket is decided by timing"
)


def barrier_race(op_name: str) -> str:
    """What a peer-lost message of an op adds: the barrier's race (``BARRIER_PEER_RACE``), or nothing."""
    return f" ({BARRIER_PEER_RACE})" if op_name == "barrier" else ""


def wire_mismatch(a: tuple[str, int, str], b: tuple[str, int, str]) -> str | None:
    """How two collectives at one tag of a gloo group end: None (they run as one), ``"hang"`` (different
    algorithms: different slots, nobody matches) or ``"abort"`` (one algorithm, different sizes: the messages
    decide, ``mismatch_fates``, and someone may receive more than it posted). Payloads are ``(op name,
    size_bytes, dtype)``; a barrier carries no data. An all_reduce's ring cuts its segments by element count, so
    equal sizes of types of different widths are decided by the messages too: on 3 ranks 64 bytes of Float
    and of Double make segments of 12 and 16 bytes, and a rank aborts (found by a tester: the simulator passed;
    real gloo, 3 runs of 3: one rank SIGABRT, the others "Connection reset by peer"); on 2 ranks they agree."""
    family_a, family_b = wire_family(a[0]), wire_family(b[0])
    if family_a != family_b:
        return "hang"
    if family_a in ("barrier", "monitored_barrier"):
        return None
    if a[1] != b[1]:
        return "hang" if family_a in _NO_MESSAGE_MODEL else "abort"
    if family_a == "allreduce" and a[1] and element_bytes(a[2]) != element_bytes(b[2]):
        return "abort"
    return None


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
    family = wire_family(op_name)
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


def broadcast_leavers(roots: Mapping[int, int], size: int) -> frozenset[int]:
    """The group ranks that complete a gloo broadcast, ``roots`` mapping each group rank that joined it to the
    root (a group rank) it named; a rank not in ``roots`` has not joined.

    Each rank runs the binomial tree of its own root: it receives from its parent there, then sends to its
    children there (``broadcast_needs``: a send completes only once the receiver has posted a recv from this
    sender, a recv only once that sender sends). So a rank completes when its recv is matched by a parent that
    has the data itself (its own root, or matched in turn up the chain) and every child it sends to names it as
    its parent. With one root this is ``broadcast_needs`` (ancestors and children joined). With members naming
    different roots no pair agrees on every edge, and the ranks that wait on a disagreeing edge hang: measured
    on real gloo, 3 ranks with one naming another member as the root all hang (real diff seed0-case21)."""

    def parent(i: int) -> int | None:
        v = (i - roots[i]) % size
        return None if v == 0 else (v - (1 << (v.bit_length() - 1)) + roots[i]) % size

    def children(i: int) -> list[int]:
        root = roots[i]
        return [(c + root) % size for c in _tree_children((i - root) % size, size)]

    has_data: dict[int, bool] = {}
    for start in roots:
        path: list[int] = []
        on_path: set[int] = set()
        i = start
        while True:
            known = has_data.get(i)
            if known is not None:
                value = known
                break
            p = parent(i)
            if p is None:  # its own root: it has the data
                value = has_data[i] = True
                break
            if i in on_path or p not in roots or i not in children(p):
                value = False  # its recv is never matched (or a cycle of matched recvs with no root)
                break
            path.append(i)
            on_path.add(i)
            i = p
        for j in path:
            has_data[j] = value
    return frozenset(i for i in roots if has_data.get(i) and all(c in roots and parent(c) == i for c in children(i)))


# torch 2.15 under TORCH_GLOO_LAZY_INIT: a gloo split_group returns at once, and its child never connects.
# Measured (CPU, 3 ranks, ``real run``): split_group of the world by all three, then an all_reduce on the child:
# rank 0 "Timed out waiting 3000ms for recv operation to complete" at the child's 3 s timeout, ranks 1 and 2
# "Connect timeout" at 15 s; a send/recv between two of them: both stuck until the run's stall detector.
LAZY_SPLIT_NEVER_CONNECTS = (
    "TORCH_GLOO_LAZY_INIT: a gloo split_group child never connects (torch 2.15: split_group returns at once, and "
    "the child's first collective or send/recv times out on every member: recv timeout, Connect timeout)"
)


class GlooLifecycle(Lifecycle):
    impl = Impl.GLOO
    allocates_gpu_memory = False
    split_is_collective = False

    def eager_at_creation(self, release: Release, *, bound: bool, lazy_init: bool) -> bool:
        return True

    def supports_splitting(self, comm: Comm) -> bool:
        # ProcessGroupGloo::supportsSplitting is always true: its split connects the child's own mesh and asks
        # nothing of the parent's, so a lazy parent (TORCH_GLOO_LAZY_INIT) not connected yet splits too (found
        # by a tester: the simulator raised "does not support splitting" where real gloo split).
        return True


# What a rank whose peer died with unread data on their socket raises (measured, a size mismatch on 2 ranks: the
# rank that did not abort; with 3+ ranks a neighbour whose own writes were all read may see PEER_CLOSED instead,
# which real runs of one program do not decide the same way each time; both are peer-lost, a RuntimeError).
PEER_RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error (rank {peer}): Connection "
    "reset by peer. This is typically caused by a remote worker hanging or bugs in the application. Check the logs "
    "of the remote worker before reporting an error."
)

SIZE_ENFORCE = (
    "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at "
    "/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:464] op.preamble.length <= op.nbytes. "
    "{got} vs {posted}. Received data size doesn't match expected size. Is there a distributed collective "
    "mismatch in your code?"
)

# One step of a gloo algorithm on one rank: ("send" | "recv", peer group rank, bytes) or ("wait_send" | "wait_recv",)
Step = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Fate:
    """How one rank leaves a gloo operation whose members disagree on sizes (``wire_fates``).

    ``kind``: ``done`` (it completed, maybe with wrong data), ``abort`` (it received ``got`` bytes into a buffer of
    ``posted``: gloo::EnforceNotMet, SIGABRT), ``peer-lost`` (it still waits on ``peer``, which aborts: its socket
    closes under it) or ``stuck`` (it waits on a rank that never sends or receives: until its timeout)."""

    kind: str
    peer: int | None = None
    got: int = 0
    posted: int = 0


def _allreduce_segments(nbytes: int, size: int, elem: int) -> tuple[int, int]:
    """gloo's ring allreduce layout of ``nbytes``: (segment bytes, number of segments, a multiple of ``size``)."""
    seg = -(-((nbytes + 2 * size - 1) // (2 * size)) // elem) * elem
    return seg, -(-max(-(-nbytes // seg), 2 * size) // size) * size


def _allreduce_lengths(nbytes: int, size: int, layout: tuple[int, int], first: int, i: int) -> tuple[int, int]:
    """(send, recv) bytes of iteration ``i`` of a ring allreduce phase starting at segment block ``first`` (the
    reduce-scatter phase of group rank r has first = r + 1, the allgather phase r), for ``nbytes`` laid out as
    ``_allreduce_segments`` says (``layout``, worked out once per buffer); 0 or less: nothing posted."""
    seg, nseg = layout
    per = nseg // size
    send_off = ((first * per + i) * seg) % (nseg * seg)
    recv_off = (((first + 1) * per + i) * seg) % (nseg * seg)
    return min(seg, nbytes - send_off), min(seg, nbytes - recv_off)


def allreduce_waits(nbytes: int, elem: int, index: int, size: int) -> tuple[int, ...]:
    """The neighbours group rank ``index`` of gloo's ring allreduce (all_reduce, reduce_scatter) waits on first,
    in order: only a closed socket under the op it is waiting on fails it, so which comes first decides.

    Why per buffer (gloo ``allreduce.cc`` ring, ``tcp/pair.cc`` ``signalException``): the ring receives from
    ``index + 1`` into a scratch buffer and sends to ``index - 1`` from the output buffer, and waits on the recv
    first. A pair whose socket closes signals only the buffers with an op pending on it, so a rank waiting on
    its recv from a live peer that never sends is not woken when its send peer closes (it waits until its
    timeout); it fails once it waits on the send. A buffer whose first segment is empty posts no recv (48 bytes
    of Int on 4 ranks: rank 1's reduce-scatter segments lie past the end), so that rank waits on its send first
    (real diff seed25-case19). Measured on torch 2.15 gloo, 4 ranks, rank 0 never entering, rank 2 closing before
    or after ranks 1 and 3 entered: rank 1 (recv from 2) fails, rank 3 (send to 2, recv from 0) hangs, either
    way; rank 3 destroying while 0-2 wait: rank 2 (recv from 3) fails, rank 0 (recv from 1, which sends, then
    its send to 3) fails, rank 1 waits."""
    if size <= 1 or nbytes == 0:  # an empty buffer: gloo returns at once, waiting on no one
        return ()
    nxt, prv = (index + 1) % size, (index - 1) % size
    sent, got = _allreduce_lengths(nbytes, size, _allreduce_segments(nbytes, size, elem), index + 1, 0)
    if got > 0:
        return (nxt, prv) if sent > 0 else (nxt,)
    return (prv, nxt)  # its first send (or, with neither first segment posted, a later op) comes first


def _steps(family: str, nbytes: int, index: int, size: int, root: int, elem: int) -> list[Step]:
    """The sends, recvs and waits of gloo's ``family`` algorithm on group rank ``index`` for its own buffer of
    ``nbytes``, in program order, transcribed from gloo (allreduce.cc ring, broadcast.cc binomial tree,
    allgather.cc ring, alltoall.cc): every size a rank sends or posts derives from its own buffer only, which is
    why members that disagree can complete, abort or wait, each on its own."""
    steps: list[Step] = []
    if family in ("allreduce", "allgather") and nbytes == 0:
        # gloo's allreduce and allgather of no elements return at once, posting nothing (allreduce.cc; allgather:
        # measured by a tester, 2 and 3 ranks, 2 runs each: the empty rank returns, its peers wait)
        return steps
    if family == "allreduce":
        nxt, prv = (index + 1) % size, (index - 1) % size  # gloo: recvRank = rank + 1, sendRank = rank - 1
        layout = _allreduce_segments(nbytes, size, elem)
        nseg = layout[1]
        for first in (index + 1, index):  # reduce-scatter, then allgather
            for i in range(nseg):
                if i >= 2:
                    sent, got = _allreduce_lengths(nbytes, size, layout, first, i - 2)
                    steps += [("wait_recv",)] * (got > 0) + [("wait_send",)] * (sent > 0)
                if i < nseg - 2:
                    sent, got = _allreduce_lengths(nbytes, size, layout, first, i)
                    steps += [("recv", nxt, got)] * (got > 0) + [("send", prv, sent)] * (sent > 0)
    elif family == "broadcast":
        vrank, sends = (index - root) % size, 0
        dim = (size - 1).bit_length()
        mask = (1 << dim) - 1
        for i in range(dim):
            mask ^= 1 << i
            vpeer = vrank ^ (1 << i)
            if vrank & mask or vpeer >= size:
                continue
            if vrank & (1 << i):
                steps += [("recv", (vpeer + root) % size, nbytes), ("wait_recv",)]
            else:
                steps.append(("send", (vpeer + root) % size, nbytes))
                sends += 1
        steps += [("wait_send",)] * sends
    elif family == "allgather":
        chunks = (nbytes // 2, nbytes - nbytes // 2)
        for i in range((size - 1) * 2):
            if i >= 2:
                steps += [("wait_send",), ("wait_recv",)]
            steps += [("send", (index + 1) % size, chunks[i & 1]), ("recv", (index - 1) % size, chunks[i & 1])]
        steps += [("wait_send",), ("wait_recv",)] * min(2, (size - 1) * 2)
    elif family == "gather":  # gloo's gather: each member sends its buffer to the root, which posts one per member
        if index != root:
            steps += [("send", root, nbytes), ("wait_send",)]
        else:
            steps += [("recv", peer, nbytes) for peer in range(size) if peer != root]
            steps += [("wait_recv",)] * (size - 1)
    elif family == "scatter":  # gloo's scatter: the root sends each member a chunk of its own size
        if index != root:
            steps += [("recv", root, nbytes), ("wait_recv",)]
        else:
            steps += [("send", peer, nbytes) for peer in range(size) if peer != root]
            steps += [("wait_send",)] * (size - 1)
    elif family == "alltoall":
        chunk = nbytes // size
        for i in range(1, size):
            steps += [("send", (index + i) % size, chunk), ("recv", (index - i) % size, chunk)]
        steps += [("wait_send",), ("wait_recv",)] * (size - 1)
    return steps


def wire_fates(scripts: Mapping[int, list[Step]], *, aborts_first: bool = False) -> dict[int, Fate]:
    """Run gloo's point-to-point protocol over the members present (group rank -> its steps): a message between
    two ranks is delivered once the receiver has posted a recv for it (per direction, in order); a wait takes one
    completed op of its kind. A message larger than the recv posted for it aborts the receiver
    (``op.preamble.length <= op.nbytes``); a smaller one completes it, and the sender's send completes either way
    (it was written). A dead rank sends nothing more. A rank left waiting is ``peer-lost`` when an op it has
    posted is towards an aborted rank, ``stuck`` otherwise. Members absent from ``scripts`` never take part.

    When an abort happens relative to the aborting rank's own sends is measured, not derived: by default aborts
    are taken last, after every other delivery possible (all_gather, 4 vs 8 floats on 2 ranks: the aborting
    rank's messages got out, its peer completes, 4 runs of 4); ``aborts_first`` takes them before (all_to_all,
    4 vs 8 floats on 2 ranks and 4, 4, 8 on 3: the larger rank loses its peers, 4 runs of 4)."""
    pc = dict.fromkeys(scripts, 0)
    done = {r: {"wait_send": 0, "wait_recv": 0} for r in scripts}
    outbox: dict[tuple[int, int], list[int]] = {}  # (src, dst) -> bytes of messages sent, not yet delivered
    posted: dict[tuple[int, int], list[int]] = {}  # (src, dst) -> bytes of recvs dst posted from src
    fates: dict[int, Fate] = {}

    def oversized() -> list[tuple[int, int, int, int]]:
        return [
            (dst, src, queue[0], recvs[0])
            for (src, dst), queue in outbox.items()
            if queue and (recvs := posted.get((src, dst))) and queue[0] > recvs[0] and not {src, dst} & fates.keys()
        ]

    while True:
        moved = True
        while moved:
            moved = False
            for rank, steps in scripts.items():
                while rank not in fates and pc[rank] < len(steps):
                    step = steps[pc[rank]]
                    if step[0] == "send":
                        outbox.setdefault((rank, step[1]), []).append(step[2])
                    elif step[0] == "recv":
                        posted.setdefault((step[1], rank), []).append(step[2])
                    elif done[rank][step[0]]:
                        done[rank][step[0]] -= 1
                    else:
                        break
                    pc[rank] += 1
                    moved = True
            if aborts_first and oversized():
                break
            for (src, dst), queue in outbox.items():
                recvs = posted.get((src, dst))
                while queue and recvs and queue[0] <= recvs[0] and not {src, dst} & fates.keys():
                    queue.pop(0), recvs.pop(0)
                    done[src]["wait_send"] += 1
                    done[dst]["wait_recv"] += 1
                    moved = True
        found = oversized()
        if not found:
            break
        for dst, src, got, want in found:
            if dst in fates:
                continue
            fates[dst] = Fate("abort", src, got, want)
            for (sender, receiver), queue in outbox.items():  # what dst had asked for was written: those sends
                if receiver == dst:  # complete on their senders (all_gather, 2 ranks: the peer completes)
                    n = min(len(queue), len(posted.get((sender, dst), ())))
                    del queue[:n], posted[(sender, dst)][:n]
                    done[sender]["wait_send"] += n
    aborted = {r for r, f in fates.items() if f.kind == "abort"}
    for rank, steps in scripts.items():
        if rank in fates:
            continue
        if pc[rank] == len(steps):
            fates[rank] = Fate("done")
            continue
        towards = [d for (s, d), q in outbox.items() if s == rank and q] + [
            s for (s, d), q in posted.items() if d == rank and q
        ]
        lost = next((p for p in sorted(set(towards)) if p in aborted), None)
        fates[rank] = Fate("stuck") if lost is None else Fate("peer-lost", lost)
    return fates


def mismatch_fates(
    op_name: str, nbytes: Mapping[int, int], size: int, root: int, elem: Mapping[int, int]
) -> dict[int, Fate]:
    """Each present member's ``Fate`` in a gloo collective whose members (group rank -> its buffer's bytes) disagree
    on size; ``root`` is the broadcast's group root, ``elem`` each member's element size (allreduce segments by
    it)."""
    family = wire_family(op_name)
    scripts = {i: _steps(family, n, i, size, root, elem[i]) for i, n in nbytes.items()}
    return wire_fates(scripts, aborts_first=family == "alltoall")


def p2p_fates(src: int, dst: int, nbytes: Mapping[int, int]) -> dict[int, Fate]:
    """A gloo send/recv pair of different sizes (global rank -> bytes; either may be absent)."""
    scripts = {}
    if src in nbytes:
        scripts[src] = [("send", dst, nbytes[src]), ("wait_send",)]
    if dst in nbytes:
        scripts[dst] = [("recv", src, nbytes[dst]), ("wait_recv",)]
    return wire_fates(scripts)
