"""Collectives and point-to-point: a rank's ``all_reduce``/``broadcast``/... and ``send``/``recv`` on a group.

Why a room: each is a meeting in the communicator's sequence (``("coll", comm id, seq)``; a send/recv pair
per channel, direction and count), after the communicator is made usable: bootstrapped if lazy (``Comms``),
connected (first-collective charges, ``Memory``), checked against the current device. The flight recorder
records each at issue. gloo differs where the wire does: a size mismatch aborts, a broadcast is a binomial
tree whose members leave as soon as their neighbours are in, and p2p may use a lazily made pair communicator.
Every ``Collective`` op (``simnccl.ops``) comes here: a new one needs a class there, not a new handler.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any

import simpy

from simnccl.backends import LIFECYCLES, Comm, CommState
from simnccl.backends.gloo import CROSS_WIRED_TYPE, FOREIGN_RANKS, RECV_FROM_SELF, broadcast_leavers
from simnccl.c10d import Group, TorchError
from simnccl.dtypes import gloo_refuses
from simnccl.engine.comms import LAZY_PAIR_ATTEMPTS, Comms, pair_in_group
from simnccl.engine.config import WorkloadFailure
from simnccl.engine.memory import Memory
from simnccl.engine.policy_gate import policy_fake_error
from simnccl.engine.reinit_store import STALE_PAIR_WHAT
from simnccl.engine.rendezvous import Rendezvous
from simnccl.engine.sim import Sim
from simnccl.engine.state import (
    DEFAULT_GROUP_MISSING,
    GROUP_NOT_REGISTERED,
    UNREGISTERED_GROUP,
    RankRuntime,
    Waiting,
    current_device,
    fire_once,
    resolve,
)
from simnccl.engine.timing import Timing
from simnccl.flight_recorder import RECORDING_IMPLS, Entry, FlightRecorder, numel
from simnccl.meetings import Meeting
from simnccl.ops import (
    PADDED,
    AllGather,
    AllReduce,
    AllToAll,
    Barrier,
    BatchIsendIrecv,
    Broadcast,
    Collective,
    Op,
    PointToPoint,
    ReduceScatter,
    Send,
)
from simnccl.release import Impl

_GLOO = Impl.GLOO  # a module constant: an enum member looked up on its class costs ~0.1 us, asked per collective
_LEGACY = Impl.LEGACY
_FAKE = Impl.FAKE
# The collectives torch 2.15 runs on a destroyed group's handle: none of them asks the unregistered group for a rank
# or its backend (broadcast's src, send/recv's peer and barrier's device do, and raise ValueError; so do the calls
# they may stand for: reduce's and gather's root, monitored_barrier's backend, ``_unregistered``).
_RUN_AFTER_DESTROY = (AllReduce, AllGather, ReduceScatter, AllToAll)

# torch 2.15's ``_check_not_self_rank(group, group_dst, "destination")`` in send (distributed_c10d.py l.1988)
SEND_TO_SELF = "Invalid destination rank: destination rank should not be the same as the rank of the current process."


def _wired_note(name: str, wire: Sequence[int], runs: str) -> str:
    """What a wait on a cross-wired gloo communicator says of itself: the ranks gloo connected, and what runs there
    (a collective's and a send's or recv's, one text)."""
    return (
        f"groups under name {name!r} are cross-wired (a store-key collision): gloo connected ranks {list(wire)}, "
        f"and {runs}"
    )


def _unregistered(rt: RankRuntime, call: str) -> str:
    """What torch 2.15 raises (ValueError) for a ``call`` (reduce, gather, monitored_barrier) on a group this rank
    destroyed: unlike the op it stands for, each looks the group up first — reduce's and gather's root through
    ``get_group_rank``, monitored_barrier its backend through ``get_backend`` — and finds it unregistered.
    Measured (gloo, 2 ranks, one run each): the subgroup destroyed, all three say it is not in the world group map;
    the world destroyed, reduce says the group is not registered, gather that no default group exists."""
    if rt.world is not None or call == "monitored_barrier":
        return UNREGISTERED_GROUP
    return GROUP_NOT_REGISTERED if call == "reduce" else DEFAULT_GROUP_MISSING


def _check_monitored(target: Group) -> None:
    """torch 2.15's ``monitored_barrier`` runs on the group's CPU backend, which must be gloo (l.6682): a group
    without one raises ValueError, another backend's RuntimeError (a capture raised these; a file's
    ``call = "monitored_barrier"`` on an NCCL group passed: found by a tester)."""
    cpu = target.comm_for("cpu")
    if cpu is None:
        raise TorchError("ValueError", "monitored_barrier requires a group with a CPU-capable backend (e.g. GLOO).")
    if cpu.impl is not _GLOO:
        raise TorchError(
            "RuntimeError",
            f"Backend {cpu.impl.cpp_name} does not support monitoredBarrier, only GLOO supports monitored barrier.",
        )


def _called(op: Collective, call: str, target: Group, payload: tuple[Any, ...]) -> tuple[Any, ...]:
    """A collective's payload as the torch call it stands for: the call's name where the op's was, and its root as
    a group rank (a broadcast's already is). torch turns a root outside the group into a group rank first, and
    raises there (``_canonicalize_group_rank``), as for a broadcast's ``src``."""
    if call == "monitored_barrier":
        _check_monitored(target)
    root = getattr(op, "root", None)
    if root is None:
        return (call, *payload[1:])
    return (call, payload[1], op.dtype, _root_index(root, target))


def _root_index(root: int, target: Group) -> int:
    """A rooted collective's root as a group rank: torch 2.15 turns it into one first (``_canonicalize_group_rank``
    -> ``get_group_rank``), which raises for a root outside the group, before any backend is involved."""
    if root not in target.ranks:
        raise TorchError("ValueError", f"Global rank {root} is not part of group {target.name!r}")
    return target.ranks.index(root)


class Collectives:
    def __init__(self, sim: Sim, rendezvous: Rendezvous, comms: Comms, memory: Memory, timing: Timing) -> None:
        self.env = sim.env
        self.device_type = sim.device_type
        self.record = sim.trace.record
        self.trace = sim.trace
        self.rendezvous = rendezvous
        self.comms = comms
        self.memory = memory
        self.timing = timing
        self._wires = comms.cross_wiring.wires  # empty unless a gloo bootstrap cross-wired (asked per op)
        # nccl-lazy's LazyBackend::nextPairAttempt, per process: (rank, lower group rank, higher) -> next attempt
        self._pair_attempts: dict[tuple[int, int, int], int] = {}
        # (group, lo, hi[, incarnation]) -> {rank: (its attempt, its meeting)}: the nccl-lazy pair each rank opened
        self._lazy_pairs: dict[tuple[Any, ...], dict[int, tuple[int, Meeting]]] = {}
        self._tree_released: dict[int, set[int]] = {}  # id(gloo broadcast) -> members already released
        self.policy_faked = sim.policy_faked
        self.policy_name = getattr(sim.config.policy, "name", "")

    def _usable_comm(self, rt: RankRuntime, group: Group, op: Op) -> Comm:
        device_type = self.device_type
        comm = group.comm_for(device_type)
        if comm is None:
            raise TorchError("RuntimeError", f"No backend type associated with device type {device_type}")
        if self.policy_faked and comm.impl is _FAKE and group.ranks in self.policy_faked:
            # torch's FakeProcessGroup returns at once without moving a byte: the simulated startup passed, and
            # ``cost`` priced the group at nothing, while production silently communicates nothing there
            asked = self.policy_faked[group.ranks]
            raise policy_fake_error(self.policy_name, group.ranks, asked, f"the program runs {op.name} on it")
        # A barrier makes its own tensor on the device the backend uses (torch 2.15's ``barrier``: a bound device,
        # else legacy's first used device or its guess), so it never meets the check below.
        if device_type == "cuda" and comm.impl.is_nccl and type(op) is not Barrier:
            current = current_device(rt)
            if comm.device is not None and comm.device != current:
                if comm.impl is Impl.LEGACY:
                    raise TorchError(
                        "ValueError",
                        f"Tensor found on device cuda:{current} but backend constrained to cuda:{comm.device}",
                    )
                raise TorchError(
                    "RuntimeError",
                    f"ProcessGroupNCCL is bound to device cuda:{comm.device} but an operation was "
                    f"issued on cuda:{current}",
                )
        return comm

    def _group_of(self, rt: RankRuntime, op: Collective | PointToPoint | BatchIsendIrecv) -> Group | None:
        """The group the op runs on; None (with torch's warning) where this rank is not a member.

        A gloo group this rank destroyed still runs an all_reduce, all_gather, reduce_scatter or all_to_all on
        its handle: torch 2.15's destroy_process_group(pg) unregisters pg and calls its shutdown, which leaves a
        ProcessGroupGloo's pairs connected, and those collectives never look the group up (measured: both members
        all_reduce after the destroy and complete; one does and waits for the other). NCCL's shutdown tears its
        communicators down (unmeasured here: it stays torch's ValueError). A barrier looks the group up for its
        device only on a host with an accelerator (``device.type == "cpu" or _get_object_coll_device(group)``):
        on a CPU-only cluster it runs too (found by a tester; measured on the CPU build, 5 runs)."""
        handle = rt.handles.get(op.group)
        if isinstance(handle, Group) and handle.destroyed and getattr(op, "call", ""):
            raise TorchError("ValueError", _unregistered(rt, op.call))  # type: ignore[union-attr]
        if (
            isinstance(handle, Group)
            and handle.destroyed
            and (type(op) in _RUN_AFTER_DESTROY or (type(op) is Barrier and self.device_type == "cpu"))
            and handle.comms
            and all(c.impl is _GLOO and c.comm_id is not None for c in handle.comms.values())
        ):
            return handle
        target = resolve(rt, op.group)
        if not isinstance(target, Group):
            rt.warnings.append(f"Running {op.name} on global rank {rt.rank} which does not belong to the given group.")
            return None
        return target

    def op_collective(self, rt: RankRuntime, op: Collective) -> Waiting:
        yield from self.rendezvous.settle(rt)
        target = self._group_of(rt, op)
        if target is None:
            return
        src = _root_index(op.src, target) if type(op) is Broadcast else None
        comm = self._usable_comm(rt, target, op)
        life = LIFECYCLES[comm.impl]
        if type(op) is Barrier and comm.device is None and comm.impl is _LEGACY:
            # Legacy's barrier on a group no collective has used yet, without a bound device: torch 2.15's
            # ``guessDeviceId`` (the ``barrier`` docstring's rule 4), not the current device.
            comm.device = rt.rank % self.memory.cluster.device_count
        if not comm.ready and not target.destroyed:  # a destroyed gloo group's pairs stay connected (_group_of)
            yield from self.comms.init(rt, target, comm, op)
        if not life.communicates:
            return
        if comm.impl.is_nccl:
            self.memory.touch(rt, comm.device, op)
        elif comm.impl is _GLOO and type(op) is not Barrier and gloo_refuses(op.dtype, getattr(op, "call", "")):
            # ProcessGroupGloo's dispatch on the tensor's type, on the rank, before anything is sent (dtypes.toml)
            raise TorchError("RuntimeError", "Invalid scalar type")
        # On a cross-wired communicator the op runs between the ranks gloo connected (its registry members) and
        # then the check stops the rank: a rank wired to one that never runs the op waits, as on real gloo.
        wrong = self._cross_wired(comm, target, op) if self._wires else None
        self._connect(rt, target, comm, op, op.name, op.size_bytes)
        comm.seq += 1
        entry = self._fr_record(rt, target, comm, op.name, op.size_bytes, op.dtype, p2p=False)
        members = self.comms.registry.members.setdefault(comm.comm_id, target.ranks)
        meeting = self.rendezvous.open(("coll", comm.comm_id, comm.seq), "collective", target.name, comm.seq, members)
        meeting.on_gloo = comm.impl is _GLOO
        if wrong is not None and meeting.note is None:  # a hang here names the ranks it really waits for, and why
            meeting.note = _wired_note(target.name, members, "this op runs between those")
        # A broadcast's payload names its root (a group rank here, as the backends see it): members naming
        # different roots do not run one broadcast (``Rendezvous._disagreement``), whatever their sizes.
        payload: tuple[Any, ...] = (op.name, op.size_bytes, op.dtype)
        if type(op) is AllGather and op.padded:  # each member's size is the members' largest (``Timing``)
            payload = (op.name, PADDED, op.dtype)
        if src is not None:
            payload = (*payload, src)
        call = getattr(op, "call", "")
        if call:  # the torch call it stands for (``ops.CALLS``) and its root: members must name the same
            payload = _called(op, call, target, payload)
        self.rendezvous.arrive(meeting, rt, payload, op, duration=self.timing.collective_s)
        if meeting.on_gloo and payload[0] == "broadcast" and len(members) > 2:
            yield from self._wait_tree(rt, meeting, op)
        else:
            yield from self.rendezvous.wait(rt, meeting, op)
        if meeting.on_gloo:  # a message near the timeout: the real host decides (``Timing.gloo_deadline``)
            self.timing.note_gloo_margin(meeting, op, target.timeout_s)
        FlightRecorder.complete(entry, self.env.now)
        # The event's text from parts (``Trace.record_text``): the clock's repr is shared by the members that leave
        # a meeting together, and the repr of the whole tuple was a twentieth of a collective.
        now, trace, name, group_name, seq = self.env.now, self.trace, op.name, target.name, comm.seq
        trace.record_text(
            f"({trace.time_text(now)}, {rt.rank!r}, {name!r}, {group_name!r}, {seq!r})",
            (now, rt.rank, name, group_name, seq),
        )
        if wrong is not None:
            raise wrong

    def _cross_wired(self, comm: Comm, target: Group, op: Op) -> WorkloadFailure | None:
        """The check that stops a rank at an op on a gloo communicator a store-key collision cross-wired
        (``engine.store_collisions``), or None: real gloo runs it between other ranks, on their data, without an
        error. A collective raises it once the op ran between the ranks it is wired to (a rank wired to one that
        never comes waits, as on real gloo: real diff seed135-case36); a send or recv is ``_wired_p2p``'s."""
        found = self.comms.cross_wiring.failure(comm.comm_id, target.name, target.ranks, op.name)
        if found is None:
            return None
        text, foreign = found
        return WorkloadFailure(text, CROSS_WIRED_TYPE, facts={FOREIGN_RANKS: foreign})

    def _connect(
        self, rt: RankRuntime, group: Group, comm: Comm, op: Op, collective: str, nbytes: int, peer: int | None = None
    ) -> None:
        """The first call of each collective kind (send/recv: each peer) connects what its algorithm needs."""
        comm.connected = True
        peer_index = None if peer is None else group.ranks.index(peer)
        self.memory.use_comm(rt, comm, group, op, collective, nbytes, peer_index)

    def _wait_tree(self, rt: RankRuntime, meeting: Meeting, op: Broadcast) -> Waiting:
        """A gloo broadcast is a binomial tree of sends and recvs, not one rendezvous: a member leaves as soon
        as its ancestors and children have joined (``broadcast_needs``), so the root and subtrees that do not
        depend on a missing rank complete, and only the ranks that wait on it hang. Each member waits on its own
        event; the meeting completing (everyone in) releases the rest at its end.

        A member that issued another gloo algorithm at this tag sends on another slot (``wire_mismatch``
        ``"hang"``): to the tree it is simply missing, so the problem it sets on the meeting does not stop the
        ranks that never talk to it (real, seed104-case33: rank 2 skips a broadcast from 0 and all_to_alls at its
        tag; ranks 1 and 3 complete the broadcast). A size mismatch among the broadcasters, beside such members
        or not, is decided per message instead (``fates``: ``Rendezvous._mismatch_beside_another_algorithm``)."""
        waits = self.rendezvous.releases(meeting)
        waits[rt.rank] = self.env.event()
        if meeting.problem is None or (meeting.fates is None and self._broadcasters_agree(meeting)):
            if meeting.complete:
                assert meeting.completed_at is not None
                release_at = meeting.completed_at
                ready = [r for r in sorted(waits) if r not in self._tree_released.setdefault(id(meeting), set())]
            else:
                release_at = self.env.now + self.timing.collective_s(meeting)
                ready = self._tree_ready(meeting, waits)
            for rank in ready:
                self._tree_released[id(meeting)].add(rank)
                if not meeting.complete:
                    self.record(self.env.now, rank, "tree-release", meeting.key)
                event = waits[rank]
                self.env.timeout(release_at - self.env.now).callbacks.append(lambda _ev, e=event: fire_once(e))
        yield from self.rendezvous.wait(rt, meeting, op, waits[rt.rank])

    def _tree_ready(self, meeting: Meeting, waits: Mapping[int, simpy.Event]) -> list[int]:
        """Members in the broadcast, not yet released, that get out of it (``broadcast_leavers``: with one root,
        those whose tree neighbours are all in; members naming different roots each run their own root's tree).
        O(members x log members) per arrival, and only while the broadcast is incomplete or mismatched."""
        released = self._tree_released.setdefault(id(meeting), set())
        expected = meeting.expected
        position = {r: i for i, r in enumerate(expected)}
        # Each broadcaster's root as it named it (members that disagree each run their own root's tree).
        roots = {position[r]: a.payload[3] for r, a in meeting.arrivals.items() if a.payload[0] == "broadcast"}
        leavers = broadcast_leavers(roots, len(expected))
        return [rank for rank in sorted(waits) if rank not in released and position[rank] in leavers]

    @staticmethod
    def _broadcasters_agree(meeting: Meeting) -> bool:
        """Whether the meeting's problem is only members that issued another algorithm at this tag: every
        broadcast arrival carries one payload (a size mismatch among them is gloo's per-message ``fates``, also
        beside members of another algorithm; with members naming different roots as well it is left to hang
        rather than guessed)."""
        payloads = {a.payload[:3] for a in meeting.arrivals.values() if a.payload[0] == "broadcast"}
        return len(payloads) == 1  # the root aside: members naming different roots are ``_tree_ready``'s

    def _fr_record(
        self, rt: RankRuntime, group: Group, comm: Comm, op: str, size_bytes: int, dtype: str, *, p2p: bool
    ) -> Entry | None:
        """What the flight recorder (hook or native) records at issue; fake records nothing (§E.1)."""
        if rt.fr is None or comm.impl not in RECORDING_IMPLS:
            return None
        trace = rt.fr.group(group.name, group.desc, group.ranks)
        return rt.fr.record(
            trace,
            comm.impl.cpp_name,
            op,
            numel=numel(size_bytes, dtype),
            dtype=dtype,
            p2p=p2p,
            time_s=self.env.now,
            timeout_s=group.timeout_s,
        )

    def op_p2p(self, rt: RankRuntime, op: PointToPoint) -> Waiting:
        """A send or recv: torch's checks of the peer, then a members-only meeting of the two ends."""
        yield from self.rendezvous.settle(rt)
        target = self._group_of(rt, op)
        if target is None:
            return
        sends = isinstance(op, Send)
        self._check_peer(rt, target, sends, op.peer)
        comm = self._usable_comm(rt, target, op)
        if op.tag < 0 and comm.impl is _GLOO:  # ProcessGroupGloo's own check, on the rank (real: 3 runs of 3)
            raise TorchError("RuntimeError", "Tag must be nonnegative")
        self._check_self_peer(rt, comm, op.peer)
        life = LIFECYCLES[comm.impl]
        if not life.communicates:
            return
        if life.p2p_uses_pair_comm(comm, bound=target.bound_device is not None):
            channel = yield from self._pair_comm(rt, target, comm, op)
            posted = self._post(rt, target, comm, op, sends, op.peer, op.size_bytes, op.dtype, channel)
        else:
            if comm.published is not None:  # a lazy gloo communicator: the pair connects alone
                yield from self.comms.connect_lazy_pair(rt, target, comm, op, op.peer)
            elif not comm.ready:
                yield from self.comms.init(rt, target, comm, op)
            posted = self._post(rt, target, comm, op, sends, op.peer, op.size_bytes, op.dtype)
        yield from self._finish(rt, target, op, posted)

    def op_batch_p2p(self, rt: RankRuntime, op: BatchIsendIrecv) -> Waiting:
        """``batch_isend_irecv``: torch's checks of every peer, every send and recv posted (each a meeting of its two
        ends, as an unbatched one's), then each waited on, in the list's order: a ring exchange completes.

        On NCCL the batch is coalesced on the group's own communicator (reference B.3, B.4: legacy's and nccl-lazy's
        batched P2P stay on it, unbatched may make a 2-rank one), made at its first use if lazy: torch's docstring
        asks every member of the group to take part when the batch is the group's first call, and a member that
        does not leaves the others in the communicator's bootstrap. gloo posts each as its isend/irecv."""
        yield from self.rendezvous.settle(rt)
        if not op.sends and not op.recvs:  # torch reads p2p_op_list[0] for the group
            raise TorchError("IndexError", "list index out of range")
        target = self._group_of(rt, op)
        if target is None:
            return
        for _op_type, peer, _size in op.items():  # P2POp's constructor asks every peer's group rank
            self._check_peer(rt, target, False, peer)
        comm = self._usable_comm(rt, target, op)
        if not LIFECYCLES[comm.impl].communicates:
            return
        for peer in dict.fromkeys(peer for _op_type, peer, _size in op.items()):
            if comm.published is None:  # not a lazy gloo communicator, or its whole bootstrap is done
                break
            yield from self.comms.connect_lazy_pair(rt, target, comm, op, peer)  # gloo posts each as its own
        if not comm.ready and comm.published is None:
            yield from self.comms.init(rt, target, comm, op)
        posted = []
        for op_type, peer, size in op.items():
            # isend and irecv do not check for the rank itself: gloo has no pair to it, and the ops posted before
            # it are out (measured on 2.15 gloo: a peer receiving an earlier send of the batch completes)
            self._check_self_peer(rt, comm, peer)
            posted.append(self._post(rt, target, comm, op, op_type is Send, peer, size, op.dtype))
        for one in posted:
            yield from self._finish(rt, target, op, one)

    @staticmethod
    def _check_peer(rt: RankRuntime, target: Group, sends: bool, peer: int) -> None:
        if peer not in target.ranks:  # get_group_rank's (torch names the group object)
            raise TorchError("ValueError", f"Global rank {peer} is not part of group {target.name!r}")
        if peer == rt.rank and sends:  # torch's _check_not_self_rank: send's destination only
            raise TorchError("ValueError", SEND_TO_SELF)

    @staticmethod
    def _check_self_peer(rt: RankRuntime, comm: Comm, peer: int) -> None:
        """A recv (or a batch's isend) with the rank itself reaches the backend (irecv allows src == own rank)."""
        if peer == rt.rank:
            if comm.impl is _GLOO:
                raise TorchError("RuntimeError", RECV_FROM_SELF)
            raise TorchError("SimulatorLimit", "a send or recv with the rank itself on NCCL is not modelled")

    def _post(
        self,
        rt: RankRuntime,
        target: Group,
        comm: Comm,
        op: PointToPoint | BatchIsendIrecv,
        sends: bool,
        peer: int,
        size_bytes: int,
        dtype: str,
        channel: int | None = None,
    ) -> tuple[Meeting, Entry | None, int, int, int, WorkloadFailure | None]:
        """A send (``sends``) or recv with ``peer`` posted: its meeting opened and joined. ``channel``: the 2-rank
        communicator it runs on (connected by ``_pair_comm``), else ``comm``, which it connects here. What
        ``_finish`` waits on: (meeting, flight recorder entry, source, destination, count, the check's error)."""
        name = "send" if sends else "recv"
        src, dst = (rt.rank, peer) if sends else (peer, rt.rank)
        ends, wrong = (src, dst), None  # the processes the message goes between, and the check's error if any
        if channel is None:
            self._connect(rt, target, comm, op, name, size_bytes, peer)
            channel = comm.comm_id
            if self._wires and comm.comm_id in self._wires:
                ends, wrong = self._wired_p2p(rt, comm, target, sends, peer)
        n = comm.next_p2p_seq(*ends)
        label = f"send {src}->{dst}" if sends else f"recv {dst}<-{src}"  # torch's view: the group's
        entry = self._fr_record(rt, target, comm, label, size_bytes, dtype, p2p=True)
        meeting = self.rendezvous.open(("p2p", channel, *ends, n), "p2p", target.name, n, ends)
        meeting.on_gloo = comm.impl is _GLOO  # a recv smaller than the send aborts (backends/gloo.py)
        if ends != (src, dst) and meeting.note is None:  # a hang here names the rank it really waits for, and why
            between = f"this {name} goes between ranks {ends[0]} and {ends[1]}"
            meeting.note = _wired_note(target.name, self._wires[comm.comm_id][0], between)
        tag = getattr(op, "tag", 0)  # an unbatched send/recv's (``Rendezvous._disagreement``: gloo matches by it)
        payload = ("p2p", size_bytes, dtype, tag) if tag else ("p2p", size_bytes, dtype)
        self.rendezvous.arrive(meeting, rt, payload, op, duration=self.timing.p2p_s)
        return meeting, entry, src, dst, n, wrong

    def _finish(
        self,
        rt: RankRuntime,
        target: Group,
        op: PointToPoint | BatchIsendIrecv,
        posted: tuple[Meeting, Entry | None, int, int, int, WorkloadFailure | None],
    ) -> Waiting:
        """Wait for a posted send or recv (``_post``), then record it."""
        meeting, entry, src, dst, n, wrong = posted
        yield from self.rendezvous.wait(rt, meeting, op)
        if meeting.on_gloo:  # a message near the timeout: the real host decides (``Timing.gloo_deadline``)
            self.timing.note_gloo_margin(meeting, op, target.timeout_s)
        FlightRecorder.complete(entry, self.env.now)
        name = "send" if src == rt.rank else "recv"
        now, trace, group_name = self.env.now, self.trace, target.name  # as op_collective's event
        trace.record_text(
            f"({trace.time_text(now)}, {rt.rank!r}, {name!r}, {group_name!r}, {src!r}, {dst!r}, {n!r})",
            (now, rt.rank, name, group_name, src, dst, n),
        )
        if wrong is not None:
            raise wrong

    def _wired_p2p(
        self, rt: RankRuntime, comm: Comm, target: Group, sends: bool, peer_rank: int
    ) -> tuple[tuple[int, int], WorkloadFailure | None]:
        """A send or recv on a cross-wired gloo communicator: the (source, destination) processes it goes between,
        and the check's error for a receiver, raised once the recv ran.

        Why: gloo addresses a peer by its group rank, so the message goes to (or comes from) whichever process
        gloo connected at the peer's group rank (``CrossWiring.wires``), not the peer torch named. Measured on
        real gloo (``tests/test_real_gloo_semantics.py``, cross-wired-send-recv): each receiver got the other
        group's sender's data, the real driver's data check stopped it, and the senders ran on, nothing coming back
        to them. So only a receiver whose data came from a rank outside its group is stopped (the rank, as the
        data check names it: ``foreign_ranks``); a message between two members of the group, the wrong two or
        not, carries nothing that shows it."""
        wire = self._wires[comm.comm_id][0]
        peer = wire[target.ranks.index(peer_rank)]
        if sends:
            return (rt.rank, peer), None
        if peer in target.ranks:
            return (peer, rt.rank), None
        found = self.comms.cross_wiring.failure(comm.comm_id, target.name, target.ranks, "recv")
        assert found is not None
        return (peer, rt.rank), WorkloadFailure(found[0], CROSS_WIRED_TYPE, facts={FOREIGN_RANKS: [peer]})

    def _lazy_pair_meeting(self, rt: RankRuntime, group: Group, pair_ranks: tuple[int, int]) -> Meeting:
        """``rt``'s bootstrap meeting of an nccl-lazy pair communicator, under the name torch gives it:
        ``<group>/p2p-<lo>-<hi>-<attempt>`` of the pair's *group* ranks (LazyBackend::channelFor).

        Why per rank: the attempt is LazyBackend::nextPairAttempt, a function-static map keyed by the two group
        ranks alone, one per process, shared by every nccl-lazy group and kept across destroy and re-init
        (``rt.rank`` is the process; its runtime outlives a re-init). Two ranks that made different numbers of
        pair communicators for these group ranks in other groups name the pair differently and bootstrap under
        different store prefixes: each waits in its own meeting, the reader (pair rank 1) times out in the store
        and the publisher blocks in ncclCommInitRank, and both meetings' notes say why. A re-init's meetings also
        carry the incarnation, so a group name reused after the destroy never joins a destroyed one's meeting."""
        lo, hi = sorted(pair_ranks)
        glo, ghi = sorted((group.ranks.index(lo), group.ranks.index(hi)))
        attempt = self._pair_attempts.get((rt.rank, glo, ghi), 0)
        self._pair_attempts[(rt.rank, glo, ghi)] = attempt + 1
        incarnation = (rt.incarnation,) if rt.incarnation else ()
        key = ("pair", group.name, lo, hi, attempt, *incarnation)
        meeting = self.rendezvous.open(key, "bootstrap", f"{group.name}/p2p-{glo}-{ghi}-{attempt}", 0, pair_ranks)
        opened = self._lazy_pairs.setdefault((group.name, lo, hi, *incarnation), {})
        opened[rt.rank] = (attempt, meeting)
        other = next((r for r in opened if r != rt.rank), None)
        if other is not None and opened[other][0] != attempt:
            note = LAZY_PAIR_ATTEMPTS.format(
                name=group.name,
                glo=glo,
                ghi=ghi,
                publisher=pair_ranks[0],
                reader=pair_ranks[1],
                first=opened[pair_ranks[0]][0],
                second=opened[pair_ranks[1]][0],
            )
            for _attempt, their in opened.values():
                their.note = their.note or note
        return meeting

    def _pair_comm(self, rt: RankRuntime, group: Group, comm: Comm, op: PointToPoint) -> Generator[Any, Any, int]:
        """A lazily created 2-rank communicator for one peer: a rendezvous with that peer, then its memory."""
        peer = op.peer
        existing = comm.pair_comms.get(peer)
        if existing is not None:
            return existing
        lo, hi = sorted((rt.rank, peer))
        if comm.device is None:
            comm.device = current_device(rt)
        # Expected in pair-rank order: pair rank 0, the lower *group* rank, publishes the unique id and the other
        # reads it from the store (``comms.unique_id_stage``); in a split group it may be the higher global rank.
        pair_ranks = (lo, hi) if group.ranks.index(lo) < group.ranks.index(hi) else (hi, lo)
        if comm.impl is Impl.LEGACY:
            # legacy's key ("<lo>:<hi>") has no counter: its meetings are told apart by the default group's
            # incarnation only, so a re-init's pair finds the destroyed one's (``ReinitStore.stale_pair_writer``)
            attempt = rt.incarnation
            key: tuple[Any, ...] = ("pair", group.name, lo, hi, attempt)
            meeting = self.rendezvous.open(key, "bootstrap", f"{group.name}/p2p-{lo}-{hi}-{attempt}", 0, pair_ranks)
        else:
            meeting = self._lazy_pair_meeting(rt, group, pair_ranks)
        if rt.incarnation and comm.impl is Impl.LEGACY and meeting.problem is None:
            writer = self.comms.reinit.stale_pair_writer(rt, group, pair_ranks)
            if writer is not None:
                pair = pair_in_group(meeting, group.ranks)
                assert pair is not None  # a pair meeting
                what = STALE_PAIR_WHAT.format(lo=pair[0], hi=pair[1])
                yield from self.comms.reinit.read_stale(rt, group, comm, meeting, writer, what)
        if meeting.problem is None:
            self.comms.reinit.refuse_on_old_store(rt, meeting.group)
            if (gone := self.comms.reinit.store_gone(rt, group.name)) is not None:
                raise gone
        self.comms.note_device(meeting, rt, comm)  # the pair's communicator is on the group's GPU
        self.rendezvous.arrive(meeting, rt, (lo, hi), op, duration=self.timing.bootstrap_s)
        yield from self.rendezvous.wait(rt, meeting, op)
        if meeting.devices is not None:  # two members: checked outright (their contexts come with the pair's memory)
            self.comms.refuse_shared_gpu(rt, pair_ranks, meeting.devices, comm)
        pair_id = self.comms.registry.id_for(meeting)
        comm.add_pair(peer, pair_id)
        pair = Comm(
            impl=comm.impl,
            group=f"{group.name}/p2p-{lo}-{hi}",
            size=2,
            device=comm.device,
            state=CommState.READY,
            comm_id=pair_id,
        )
        ranks = (lo, hi)
        self.comms.nvls.reserve(rt, pair, group, self.comms.registry.members, ranks=ranks)
        self.memory.init_comm(rt, pair, group, op, ranks=ranks, phase="p2p-pair")
        self.memory.use_comm(rt, pair, group, op, op.name, op.size_bytes, ranks.index(peer), phase="p2p-pair")
        return pair_id
