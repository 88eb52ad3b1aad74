"""NVLS multicast slots: a ledger per node of the multicast objects NCCL communicators hold on its NVSwitches.

Why a room: multicast slots are a per-node resource no device ledger sees. Every communicator with NVLink SHARP
active binds multicast objects on its node's switches at init (src/transport/nvls.cc ncclNvlsSetup ->
nvlsAllocateMem), and holds them until it is destroyed; a split child that shares its parent's resources at the
same local rank count reuses the parent's (nvls.cc: ``nvlsShare``). When the switches are full the bind fails
with CUDA error 2: NCCL >= 2.29 fails the communicator's init (NVIDIA/nccl#2077), older NCCL proceeds without
NVLS unless ``NCCL_NVLS_ENABLE=1`` forces it. Whether NVLS is active for a communicator is
``simnccl.nccl``'s decision (version, ``NCCL_NVLS_ENABLE``, topology, local rank count); how many slots a node
has and a communicator takes are data (``simnccl/data/nvls_multicast.toml``), never code.

This ledger is the one count of slots in simnccl: every report of them (``RunOutcome.multicast_slots`` per
node, ``multicast_slots`` per group member in the results, "NVLS multicast slots" in ``simnccl cost
--breakdown``) reads what it charged (``charged``, ``used``). It counts on every GPU kind where NVLS is active;
only a kind with a measured ``slots_per_node`` is limited. ``simnccl.nccl``'s ``Part.multicast_objects`` is a
different, smaller figure (the multicast objects backing the memory that model prices) and is not a slot count.

``Comms`` consults this room when a communicator becomes ready (``reserve``) and when it is destroyed
(``release``); a failed bind raises NCCL's error on every member on the full node, as the bind is collective.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Mapping
from dataclasses import dataclass

from simnccl.backends import Comm, lifecycle
from simnccl.c10d import Group, TorchError
from simnccl.comm_memory import nccl_env
from simnccl.engine.sim import Sim
from simnccl.engine.state import RankRuntime
from simnccl.nccl import NcclInputError, NcclVersion, communicator_bytes, settings_from
from simnccl.nccl.constants import NcclConstants, parse_constants

DATA_FILE = "nvls_multicast.toml"
ERROR_TYPE = "torch.distributed.DistBackendError"


@functools.cache
def multicast_data() -> NcclConstants:
    """The shipped multicast figures (read once), validated like NCCL's constants."""
    resource = importlib.resources.files("simnccl") / "data" / DATA_FILE
    return parse_constants(resource.read_text(encoding="utf-8"), str(resource))


def slots_per_node(gpu_kind: str) -> int | None:
    """Multicast objects one node of this GPU kind holds; None where the data sets no limit."""
    data = multicast_data()
    key = f"slots_per_node.{gpu_kind}"
    return data.integer(key) if key in data.entries else None


def bind_failure(nccl_version: str, *, forced: bool) -> str:
    """NCCL's message when a multicast bind fails for lack of slots (src/transport/nvls.cc, by version)."""
    data = multicast_data()
    size = data.integer("per_communicator.bind_size_bytes")
    advice = (
        "Disable NVLS (NCCL_NVLS_ENABLE=0) if you wish to avoid this error in the future."
        if not forced
        else "Do not force-enable NVLS (NCCL_NVLS_ENABLE=1) if you wish to avoid this error in the future."
    )
    return (
        f"NCCL error in: ProcessGroupNCCL.cpp, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
        f"NCCL version {nccl_version}\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
        f"Failed to bind NVLink SHARP (NVLS) Multicast memory of size {size} : CUDA error 2 'out of memory'.\n"
        f"This is usually caused by a system or configuration error in the Fabric Manager or NVSwitches.\n{advice}"
    )


def _fatal(nccl_version: str, since: str) -> bool:
    """Whether a failed bind fails the init on this NCCL; a profile whose version is not stated (free text)
    gets the behaviour of the NCCL releases torch 2.14+ ship (fatal)."""
    try:
        return NcclVersion.parse(nccl_version).at_least(since)
    except NcclInputError:
        return True


# Whether NVLS is active, by GPU kind and NCCL version, then by member layout and NCCL_* environment: shared by
# every run of the process (a pure function of the key; a property run simulates thousands of small programs
# with the same few layouts, and asking the NCCL model is most of a bind).
_ACTIVE: dict[tuple[str, str], dict[tuple[object, ...], tuple[bool, int]]] = {}


@dataclass(slots=True)
class _Binding:
    """One communicator's multicast objects on one node: how many, which local members hold them, or why not."""

    slots: int
    holders: set[int] | frozenset[int]
    failure: str | None = None


# The binding of every communicator that binds nothing on a node and did not fail (no NVLS, its parent's reused,
# or slots exhausted before NCCL made that fatal): one object for all of them, never changed (holders are added,
# and slots freed, only where slots were taken). Why: most memberships of a large startup bind nothing (a dp or
# pp group has one member per node), and an object with an empty set each was ~4.5% of a startup's memory.
_NO_SLOTS = _Binding(0, frozenset())


_ONE = (1,)  # the ranks per node of a one-rank group


class MulticastSlots:
    """Per node: the slots in use, and each communicator's binding there (keyed by node and comm id); per rank
    and communicator name: the slots that rank's communicator took on its node at its init (``charged``)."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.cluster = sim.cluster
        self.nccl_version = sim.profile.nccl_version
        self.capacity = slots_per_node(self.cluster.gpu.key)
        data = multicast_data()
        self.need = data.integer("per_communicator.slots")
        self.fatal = self.capacity is not None and _fatal(
            self.nccl_version, data.text("versions.bind_failure_fatal_since")
        )
        self.used: dict[int, int] = {}  # node -> slots in use
        self.peak: dict[int, int] = {}
        self._bindings: dict[tuple[int, int], _Binding] = {}
        # (rank, communicator name) -> slots its binding took on the rank's node (shared by the node's members);
        # the latest communicator of that name, kept past destroy. One that took none (no NVLS, its parent's
        # reused) is absent: most memberships of a large startup take none, and an entry each was ~4% of its
        # memory. Readers ask ``charged.get(key, 0)``.
        self.charged: dict[tuple[int, str], int] = {}
        self._parents: dict[int, tuple[Comm, Comm]] = {}  # id(child) -> (child, parent): a split's parent
        # This run's answers: (members, ranks on the node, layout number, id(interned env items)) -> active, enable
        self._active: dict[tuple[int, int, int, int], tuple[bool, int]] = {}
        self._process_active = _ACTIVE.setdefault((self.cluster.gpu.key, self.nccl_version), {})
        # id(member tuple) -> (the tuple, ranks per node (None: one on each), nodes spanned, ranks per node in
        # node order, that order's number)
        self._per_node: dict[int, tuple[tuple[int, ...], dict[int, int] | None, int, tuple[int, ...], int]] = {}
        self._layouts: dict[tuple[int, ...], int] = {}  # ranks per node in node order -> its number (a cache key)
        # A one-rank group's layout needs no count (46% of a Megatron startup's calls are one: a count and an entry
        # each were a tenth of making it), only its rank checked as ``Cluster.nodes_of`` checks it.
        self._world = self.cluster.world_size
        # id(env) -> (env, its NCCL_* part, that part's items interned in _env_items)
        self._envs: dict[int, tuple[Mapping[str, str], dict[str, str], tuple[tuple[str, str], ...]]] = {}
        self._env_items: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}

    def note_parent(self, comm: Comm, parent: Comm | None) -> None:
        """A communicator made by splitting ``parent`` (its sharing of NVLS resources depends on the parent)."""
        if parent is not None and comm.shared:  # only a sharing child can reuse its parent's (``_shares_parent``)
            self._parents[id(comm)] = (comm, parent)

    def reserve(
        self,
        rt: RankRuntime,
        comm: Comm,
        group: Group,
        members: Mapping[int, tuple[int, ...]],
        ranks: tuple[int, ...] | None = None,
    ) -> None:
        """This rank's communicator binds its multicast objects on the rank's node, or fails as NCCL does.

        ``ranks``: the communicator's members when they are not the group's: a send/recv pair communicator,
        which NCCL initialises like any other (ncclNvlsSetup runs at every init, whatever the calls to come),
        so two ranks of one NVSwitch node bind NVLS there on NCCL >= 2.28.7.
        """
        if comm.comm_id is None or not comm.impl.is_nccl:
            return
        if not lifecycle(comm.impl).allocates_gpu_memory:
            return
        self.reserve_in(rt, comm, group.ranks if ranks is None else ranks, members)

    def reserve_in(
        self,
        rt: RankRuntime,
        comm: Comm,
        ranks: tuple[int, ...],
        members: Mapping[int, tuple[int, ...]],
        layout: tuple[tuple[int, ...], dict[int, int] | None, int, tuple[int, ...], int] | None = None,
    ) -> None:
        """``reserve`` for an NCCL communicator with device memory whose members are ``ranks``; ``layout``:
        ``_layout_of(ranks)``, from a caller that counted it once for many members (a call's ``CallSlots``)."""
        key = (rt.node, comm.comm_id)
        binding = self._bindings.get(key)
        if binding is None:
            local = self._local_in(rt, self._layout_of(ranks) if layout is None else layout)
            binding = self._bind(rt, comm, ranks, members, local)
            # A binding is shared by the communicator's members on this node. A member alone on its node is the
            # only one ever to ask, and a binding of nothing has no holder to release, so it is not kept: most
            # memberships of a large startup are alone on their node (a dp or pp group), and an entry each was
            # millions of entries at 131,072 ranks.
            if binding is not _NO_SLOTS or local[0] > 1:
                self._bindings[key] = binding
        # This rank's communicator holds its node's binding: fails as the binding did, or counts its slots.
        if binding.failure is not None:
            raise TorchError(ERROR_TYPE, binding.failure)
        if binding.slots:
            binding.holders.add(rt.rank)
            self.charged[(rt.rank, comm.group)] = binding.slots
        elif self.charged:  # a communicator of this name that took slots before: this one took none
            self.charged.pop((rt.rank, comm.group), None)

    def release(self, rt: RankRuntime, comm: Comm) -> None:
        """This rank destroyed its communicator (and with it its send/recv pair communicators): the node's slots
        are free once no local member holds them."""
        if comm.comm_id is None:
            return
        for comm_id, name in ((comm.comm_id, comm.group), *((p, comm.group) for p in comm.pair_comms.values())):
            binding = self._bindings.get((rt.node, comm_id))
            if binding is None or rt.rank not in binding.holders:
                continue
            binding.holders.discard(rt.rank)
            if not binding.holders:
                self.used[rt.node] -= binding.slots
                binding.slots = 0
                self.sim.trace.record(self.sim.now(), rt.rank, "nvls-release", name, self.used[rt.node])

    def _bind(
        self,
        rt: RankRuntime,
        comm: Comm,
        ranks: tuple[int, ...],
        members: Mapping[int, tuple[int, ...]],
        local: tuple[int, int, tuple[int, ...], int],
    ) -> _Binding:
        """``local``: ``_local(rt, ranks)``."""
        active, nvls_enable = self._nvls_active(rt, ranks, local)
        if not active or self._shares_parent(rt, comm, ranks, members):
            return _NO_SLOTS
        used = self.used.get(rt.node, 0)
        if self.capacity is not None and used + self.need > self.capacity:
            forced = nvls_enable == 1
            self.sim.trace.record(self.sim.now(), rt.rank, "nvls-exhausted", comm.group, used, self.capacity)
            if self.fatal or forced:
                return _Binding(0, set(), bind_failure(self.nccl_version, forced=forced and not self.fatal))
            return _NO_SLOTS  # NCCL < 2.29: "Proceeding without NVLS support"
        used = self.used[rt.node] = used + self.need
        self.peak[rt.node] = max(self.peak.get(rt.node, 0), used)
        self.sim.trace.record(self.sim.now(), rt.rank, "nvls-bind", comm.group, used)
        return _Binding(self.need, set())

    def in_use(self) -> dict[str, int]:
        """Slots held now on each node that holds any (``"n0"``: 20), in node order."""
        return {f"n{node}": slots for node, slots in sorted(self.used.items()) if slots}

    def _local(self, rt: RankRuntime, ranks: tuple[int, ...]) -> tuple[int, int, tuple[int, ...], int]:
        """(ranks on this rank's node, nodes spanned, ranks per node in node order, that order's number) of a
        member list ``rt`` is one of. Counted once per member tuple (every member binds), so no member hashes
        the node list; a list with one member per node keeps no count per node (a dp or pp group: most groups
        of a large startup, and a count per node each was a dict per group)."""
        return self._local_in(rt, self._layout_of(ranks))

    @staticmethod
    def _local_in(
        rt: RankRuntime, layout: tuple[tuple[int, ...], dict[int, int] | None, int, tuple[int, ...], int]
    ) -> tuple[int, int, tuple[int, ...], int]:
        """``_local`` from a member list's ``_layout_of`` count already at hand."""
        _, per_node, nodes, sizes, number = layout
        return 1 if per_node is None else per_node[rt.node], nodes, sizes, number

    def _layout_of(
        self, ranks: tuple[int, ...]
    ) -> tuple[tuple[int, ...], dict[int, int] | None, int, tuple[int, ...], int]:
        """``_local``'s count of a member list, whatever the node: (the list, ranks per node (None: one on
        each), nodes spanned, ranks per node in node order, that order's number)."""
        if len(ranks) == 1 and type(rank := ranks[0]) is int and 0 <= rank < self._world:
            # a one-rank group: one member on one node, nothing counted or kept
            return (ranks, None, 1, _ONE, self._layouts.setdefault(_ONE, len(self._layouts)))
        entry = self._per_node.get(id(ranks))
        if entry is None or entry[0] is not ranks:
            counts = self.sim.node_counts(ranks)
            sizes = tuple(counts[n] for n in sorted(counts))
            layout = self._layouts.setdefault(sizes, len(self._layouts))
            per_node = None if len(counts) == len(ranks) else counts  # None: one member on each node
            entry = self._per_node[id(ranks)] = (ranks, per_node, len(counts), sizes, layout)
        return entry

    def _nccl_env(self, env: Mapping[str, str]) -> tuple[dict[str, str], tuple[tuple[str, str], ...]]:
        """A process environment's NCCL_* part, sorted, and its items (interned: equal parts share one tuple),
        once per environment object (a rank's never changes)."""
        cached = self._envs.get(id(env))
        if cached is None or cached[0] is not env:
            items = nccl_env(env)
            items = self._env_items.setdefault(items, items)
            cached = self._envs[id(env)] = (env, dict(items), items)
        return cached[1], cached[2]

    def _nvls_active(
        self, rt: RankRuntime, ranks: tuple[int, ...], local_counts: tuple[int, int, tuple[int, ...], int]
    ) -> tuple[bool, int]:
        """Whether NCCL turns NVLS on for this communicator (``simnccl.nccl``), and NCCL_NVLS_ENABLE's value.
        ``local_counts``: ``_local(rt, ranks)``."""
        local, nodes, sizes, layout = local_counts
        env, items = self._nccl_env(rt.ctx.env)
        # By the interned environment's identity: every member of a group on another node asks again, and
        # hashing the environment's items each time was most of this call.
        cache_key = (len(ranks), local, layout, id(items))
        known = self._active.get(cache_key)
        if known is not None:
            return known
        shared_key = (len(ranks), local, sizes, items)  # the process's, by the node sizes themselves
        known = self._process_active.get(shared_key)
        if known is None:
            try:
                breakdown = communicator_bytes(
                    self.cluster.gpu.key, len(ranks), local, nodes, self.nccl_version, env, node_sizes=sizes
                )
                known = (breakdown.nvls_active, settings_from(env, None).nvls_enable)
            except NcclInputError:
                known = (False, 0)  # a kind without a topology in gpu_kinds.toml: no NVLS modelled
            self._process_active[shared_key] = known
        self._active[cache_key] = known
        return known

    def _shares_parent(
        self, rt: RankRuntime, comm: Comm, ranks: tuple[int, ...], members: Mapping[int, tuple[int, ...]]
    ) -> bool:
        """nvls.cc ncclNvlsSetup: a child reuses its parent's NVLS resources when the parent shares its resources
        and has the same number of local ranks (the parent's own NVLS being active)."""
        entry = self._parents.get(id(comm))
        if entry is None or entry[0] is not comm or not comm.shared:
            return False
        parent = entry[1]
        parent_ranks = members.get(parent.comm_id) if parent.comm_id is not None else None
        if parent_ranks is None:
            return False
        return self._local(rt, parent_ranks)[0] == self._local(rt, ranks)[0]


class CallSlots:
    """``MulticastSlots.reserve`` for the members of one call (one communicator id, one member list), with the
    member list's count per node made once per call, not looked up per member.

    Why: at a world-wide startup most memberships are the first (often the only) member of their communicator on
    their node. The rules stay ``MulticastSlots``'s (``reserve_in``), so a member reserved here and one reserved
    there leave the ledger alike."""

    __slots__ = ("_layout", "members", "ranks", "slots")

    def __init__(self, slots: MulticastSlots, ranks: tuple[int, ...], members: Mapping[int, tuple[int, ...]]) -> None:
        self.slots = slots
        self.ranks = ranks
        self.members = members
        self._layout = slots._layout_of(ranks)

    def reserve(self, rt: RankRuntime, comm: Comm) -> None:
        """``slots.reserve(rt, comm, group, members)`` for ``comm``, this call's communicator on ``rt`` (an NCCL
        communicator with device memory whose group's ranks are this call's)."""
        self.slots.reserve_in(rt, comm, self.ranks, self.members, self._layout)
