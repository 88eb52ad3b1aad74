"""What one rank's NCCL communicator costs under a profile: NCCL's mechanics plus the profile's measured overheads.

Why its own module: the engine charges it (at init, and at the first use of each collective kind), the budget
policy prices an eager group with it, ``simnccl cost`` explains it; none of them should know how a group of
global ranks becomes an NCCL ``Layout``, which environment and options reach the model, or how results are
cached. Imports neither simpy nor torch.

What is priced where (``simnccl.nccl.communicator_bytes``):

* at creation, phase ``init``: what ``ncclCommInitRank``/``ncclCommSplit`` allocates (device communicator,
  channels, NVLS channels and credit region, work FIFO; with ``NCCL_RUNTIME_CONNECT=0`` every algorithm's
  connections and the NET shared pool too), plus the profile's ``comm_fixed_mib``;
* at the first use of each collective kind, phase ``used``: the connections of the algorithm that call needs
  (``NCCL_RUNTIME_CONNECT=1``, the default: NCCL connects an algorithm at the first collective needing it);
  a kind is keyed by its name and the size class the algorithm rule depends on, send/recv by the peer;
* a split child shares its parent's resources when the *parent* was created with ``splitShare``
  (``NCCL_COMM_SPLIT_SHARE_RESOURCES`` or ``config.split_share``), as NCCL decides it.

What is fitted, and to which data (everything else is predicted; each profile's ``[derivation]`` has the
arithmetic): ``comm_fixed_mib`` = 0.5556 MiB on Hopper, least squares over pytorch#199957's +2080 and +1188 MiB
for nine groups (the model: 230 and 132 MiB per group); 1.0 MiB on GB200, #199957's 197 MiB per group on a
machine without NVLS (the model: 196); 0 on the RTX 3060 (the model gives sglang#35538's 388 and 10 MiB).
``process_mib`` = 82 MiB, sglang#35538's world group (+470) minus a later group (+388), carried to every GPU.
``process_first_collective_mib`` = 1252.4444 MiB on Hopper, #199957's 4672 MiB after one all_reduce per group
minus the context (392, estimated), 82, and ten communicators at 230.56 + 64 (NVLS buffers); 0 on the RTX 3060.

``PgOptions`` fields that reach the model: ``max_ctas``, ``min_ctas``, ``nvls_ctas``, ``collnet_enable``,
``split_share`` (``MODEL_OPTION_FIELDS``); the others do not change memory in the model
(``unmodelled_for_memory``). Ranks are priced by class where the mechanics cannot tell them apart (an even
layout, nobody sharing): a rank's position on its node and its node's place in the tree, so a 4096-rank world
computes a handful of breakdowns, not 4096.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from simnccl.memory import mib_to_bytes
from simnccl.nccl import Breakdown, Part, Use, communicator_bytes, constants, settings_from
from simnccl.ops import NO_OPTIONS, PgOptions
from simnccl.profiles import Profile

# PgOptions fields (torch's names) the NCCL model reads, and the model's option name for each.
MODEL_OPTION_FIELDS = {
    "max_ctas": "max_ctas",
    "min_ctas": "min_ctas",
    "nvls_ctas": "nvls_ctas",
    "collnet_enable": "collnet_enable",
    "split_share": "split_share",
}
P2P_COLLECTIVES = ("send", "recv")


def model_options(options: PgOptions) -> tuple[tuple[str, Any], ...]:
    """The communicator config the model reads, from a group's ``PgOptions`` (unset fields left out)."""
    out = []
    for name, key in MODEL_OPTION_FIELDS.items():
        value = getattr(options, name)
        if value is not None:
            out.append((key, bool(value) if key in ("split_share", "collnet_enable") else value))
    return tuple(out)


def unmodelled_for_memory(options: PgOptions) -> tuple[str, ...]:
    """Fields ``options`` sets that change no byte in the model (recorded, replayed, not priced)."""
    return tuple(k for k in options.to_dict() if k not in MODEL_OPTION_FIELDS and k != "lazy_init")


def nccl_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The NCCL_* part of a process environment, as a hashable key (the rest cannot change NCCL's memory)."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith("NCCL_")))


@dataclass(frozen=True, slots=True)
class Shape:
    """Where a group's ranks sit: sizes per node in rank order, and the priced rank's index in the group."""

    nranks: int
    node_sizes: tuple[int, ...]
    rank: int

    @property
    def even(self) -> bool:
        return len(set(self.node_sizes)) == 1

    @property
    def local_ranks(self) -> int:
        first = 0
        for size in self.node_sizes:
            if self.rank < first + size:
                return size
            first += size
        raise ValueError(f"rank {self.rank} outside the group")  # pragma: no cover - built by shape_of

    def representative(self) -> int:
        """A rank the mechanics price the same (an even layout): same place on its node, same tree role of its
        node (has a parent node, how many child nodes) — the first node with that role."""
        local = self.node_sizes[0]
        node, at = divmod(self.rank, local)
        return _first_node_like(len(self.node_sizes), node) * local + at


@functools.cache
def _first_node_like(nodes: int, node: int) -> int:
    """The first node of a binary tree over ``nodes`` with ``node``'s role (root or not, how many children)."""

    def role(n: int) -> tuple[bool, int]:
        return n > 0, sum(1 for child in (2 * n + 1, 2 * n + 2) if child < nodes)

    mine = role(node)
    return next(n for n in range(nodes) if role(n) == mine)


@dataclass(slots=True)
class CommMemory:
    """One rank's communicator as priced so far: its inputs, the uses connected, and the latest breakdown.

    ``breakdown`` is what this rank's communicator holds now (its NVLS multicast slots are counted by the
    multicast ledger, ``simnccl.engine.nvls``); the engine keeps one per rank and communicator (``Comm.memory``)
    and in each group record.
    """

    shape: Shape
    env: tuple[tuple[str, str], ...]
    options: tuple[tuple[str, Any], ...]
    exact: bool  # priced as its own rank (it or its parent shares resources), not its class
    parent: CommMemory | None
    members: tuple[int, ...] | None  # this group's ranks as the sharing parent numbers them
    breakdown: Breakdown
    uses: tuple[Use, ...] = ()
    use_keys: set[tuple[Any, ...]] = field(default_factory=set)
    unmodelled: tuple[str, ...] = ()

    @property
    def share_resources(self) -> bool:
        return self.breakdown.share_resources


class Pricer:
    """Breakdowns for one profile on one cluster, cached by everything they depend on."""

    def __init__(self, profile: Profile, node_of: Callable[[int], int]) -> None:
        self.profile = profile
        self.node_of = node_of
        self.topology = profile.topology
        self.fixed_bytes = mib_to_bytes(profile.comm.comm_fixed_mib)
        self.fixed_source = f"{profile.name}: derivation.comm_fixed_mib"
        self.process_bytes = mib_to_bytes(profile.comm.process_mib)
        self.process_first_collective_bytes = mib_to_bytes(profile.comm.process_first_collective_mib)
        c = constants()
        self._tree_below = c.integer("algorithm_rule.tree_below_bytes")
        self._pat_below = c.integer("algorithm_rule.pat_below_bytes")
        self._cache: dict[tuple[Any, ...], Breakdown] = {}
        # Per member tuple (one object shared by a group's members): its node sizes, or its rank -> index map.
        self._sizes: dict[int, tuple[Sequence[int], tuple[int, ...]]] = {}
        self._index: dict[int, tuple[Sequence[int], dict[int, int]]] = {}
        self._shares: dict[tuple[Any, ...], bool] = {}

    # ------------------------------------------------------------------ creation

    def create(
        self,
        ranks: Sequence[int],
        rank_index: int,
        env: Mapping[str, str],
        options: PgOptions = NO_OPTIONS,
        parent: CommMemory | None = None,
        parent_ranks: Sequence[int] | None = None,
    ) -> CommMemory:
        """A communicator of ``ranks`` (global, in group order) as rank ``rank_index`` holds it after init.

        ``parent``: the communicator it was split from; it shares only when the parent shares
        (``parent.share_resources``), and ``parent_ranks`` (the parent's global ranks) map the members then.
        Raises NcclInputError for a bad NCCL knob or option.
        """
        shape = Shape(len(ranks), self._node_sizes(ranks), rank_index)
        env_key = nccl_env(env)
        opts = model_options(options)
        own_share = self._split_share(env_key, opts)
        sharing = parent if parent is not None and parent.share_resources else None
        members = None
        if sharing is not None:
            index = self._rank_index(parent_ranks or ())
            members = tuple(index[r] for r in ranks)
        exact = own_share or sharing is not None or not shape.even
        breakdown = self._priced(shape, exact, env_key, opts, (), sharing, members)
        return CommMemory(
            shape, env_key, opts, exact, sharing, members, breakdown, unmodelled=unmodelled_for_memory(options)
        )

    def _split_share(self, env: tuple[tuple[str, str], ...], options: tuple[tuple[str, Any], ...]) -> bool:
        """Whether a communicator created under ``env`` and ``options`` lets its split children share."""
        key = (env, options)
        share = self._shares.get(key)
        if share is None:
            share = self._shares[key] = settings_from(dict(env), dict(options)).split_share
        return share

    def _node_sizes(self, ranks: Sequence[int]) -> tuple[int, ...]:
        """The group's ranks per node, in rank order (a node counted where it first appears)."""
        cached = self._sizes.get(id(ranks))
        if cached is not None and cached[0] is ranks:
            return cached[1]
        sizes: dict[int, int] = {}
        for r in ranks:
            node = self.node_of(r)
            sizes[node] = sizes.get(node, 0) + 1
        result = tuple(sizes.values())
        self._sizes[id(ranks)] = (ranks, result)
        return result

    def _rank_index(self, ranks: Sequence[int]) -> dict[int, int]:
        cached = self._index.get(id(ranks))
        if cached is not None and cached[0] is ranks:
            return cached[1]
        index = {r: i for i, r in enumerate(ranks)}
        self._index[id(ranks)] = (ranks, index)
        return index

    # ------------------------------------------------------------------ first use

    def use_key(self, collective: str, nbytes: int | None, peer: int | None) -> tuple[Any, ...]:
        """What distinguishes one kind of first use from another (the algorithm rule's inputs)."""
        if collective in P2P_COLLECTIVES:
            return ("p2p", collective, peer)  # NCCL connects each direction at its own first use
        if collective == "all_to_all":
            return ("all_to_all",)
        n = nbytes or 0
        return (collective, n < self._tree_below, n < self._pat_below)

    def use(
        self, memory: CommMemory, collective: str, nbytes: int | None = None, peer: int | None = None
    ) -> tuple[Part, ...]:
        """Connect what the first call of this kind needs; the parts newly paid (empty when nothing is new).

        ``peer``: for send/recv, the peer's index in the group."""
        key = self.use_key(collective, nbytes, peer)
        if key in memory.use_keys:
            return ()
        memory.use_keys.add(key)
        if collective in P2P_COLLECTIVES:
            new = Use(collective, peers=None if peer is None else (peer,))
            memory.exact = True  # explicit peers are priced on the real rank numbers
        else:
            new = Use(collective, nbytes)
        m = memory
        before = self._priced(m.shape, m.exact, m.env, m.options, m.uses, m.parent, m.members)
        after = self._priced(m.shape, m.exact, m.env, m.options, (*m.uses, new), m.parent, m.members)
        if after.parts[: len(before.parts)] != before.parts:  # pragma: no cover - the model appends in order
            raise AssertionError("NCCL model: a first use changed what earlier phases paid")
        memory.uses = (*memory.uses, new)
        memory.breakdown = after
        return after.parts[len(before.parts) :]

    # ------------------------------------------------------------------ the model, cached

    def _priced(
        self,
        shape: Shape,
        exact: bool,
        env: tuple[tuple[str, str], ...],
        options: tuple[tuple[str, Any], ...],
        uses: tuple[Use, ...],
        parent: CommMemory | None,
        members: tuple[int, ...] | None,
    ) -> Breakdown:
        """The model's breakdown; cached unless a sharing parent (whose state moves) is involved."""
        rank = shape.rank if exact else shape.representative()
        key = (shape.nranks, shape.node_sizes, rank, env, options, uses)
        if parent is None:
            cached = self._cache.get(key)
            if cached is not None:
                return cached
        even = shape.even
        result = communicator_bytes(
            self.topology,
            shape.nranks,
            shape.node_sizes[0] if even else Shape(shape.nranks, shape.node_sizes, rank).local_ranks,
            len(shape.node_sizes),
            self.profile.nccl_version,
            env=dict(env),
            options=dict(options),
            phase="used" if uses else "init",
            uses=uses,
            rank=rank,
            parent=None if parent is None else parent.breakdown,
            members=members,
            node_sizes=None if even else shape.node_sizes,
            fixed_overhead_bytes=self.fixed_bytes,
            fixed_overhead_source=self.fixed_source,
        )
        if parent is None:
            self._cache[key] = result
        return result


def one_node_mib(
    profile: Profile,
    nranks: int,
    env: Mapping[str, str] | None = None,
    uses: Sequence[str] = (),
    **model: Any,
) -> float:
    """What one communicator of ``nranks`` ranks on one node costs rank 0 under ``profile`` (NCCL's mechanics
    plus the per-communicator overhead), at init or after the first call of each of ``uses``; ``model``:
    further ``communicator_bytes`` arguments (``parent``, ``options``). For checks and examples: the engine
    prices through ``Pricer``."""
    breakdown = communicator_bytes(
        profile.topology,
        nranks,
        nranks,
        1,
        profile.nccl_version,
        env=env,
        phase="used" if uses else "init",
        uses=uses,
        fixed_overhead_bytes=mib_to_bytes(profile.comm.comm_fixed_mib),
        **model,
    )
    return breakdown.device_bytes / (1024 * 1024)


def eager_group_mib(profile: Profile, env: Mapping[str, str]) -> float:
    """The most one eagerly created group charges a member at creation, as a budget prices it.

    Rank-independent on purpose (every member must reach the same decision): the larger of a one-rank and a
    two-rank group on one node (the groups #199957 and sglang#35538 measured), at init under ``env`` (with
    ``NCCL_RUNTIME_CONNECT=0`` that includes the connections); a group of a whole node, where it costs more,
    is under-priced. Raises NcclInputError for a bad NCCL knob in ``env``.
    """
    key = (profile.name, nccl_env(env))
    cached = _eager_mib.get(key)
    if cached is not None and cached[0] is profile:
        return cached[1]
    pricer = Pricer(profile, lambda rank: 0)
    worst = max(pricer.create(ranks, 0, env).breakdown.init_device_bytes for ranks in ((0,), (0, 1)))
    _eager_mib[key] = (profile, worst / (1024 * 1024))
    return worst / (1024 * 1024)


_eager_mib: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Profile, float]] = {}
