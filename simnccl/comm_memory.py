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
import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

from simnccl.memory import mib_to_bytes
from simnccl.nccl import (
    Breakdown,
    NcclSettings,
    Part,
    Use,
    communicator_bytes,
    constants,
    settings_from,
    shared_value,
)
from simnccl.nccl.knobs import option_value
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
            out.append((key, option_value(key, value)))
    return tuple(out)


def unmodelled_for_memory(options: PgOptions) -> tuple[str, ...]:
    """Fields ``options`` sets that change no byte in the model (recorded, replayed, not priced)."""
    return tuple(k for k in options.to_dict() if k not in MODEL_OPTION_FIELDS and k != "lazy_init")


def nccl_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The NCCL_* part of a process environment, as a hashable key (the rest cannot change NCCL's memory)."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith("NCCL_")))


class Shape(NamedTuple):
    """Where a group's ranks sit: sizes per node in rank order, and the priced rank's index in the group.

    A named tuple (built and hashed in C): every communicator a startup creates makes one."""

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
        """A rank the mechanics price the same (``representative``)."""
        return representative(self.node_sizes, self.rank)


def representative(node_sizes: tuple[int, ...], rank: int) -> int:
    """A rank the mechanics price as ``rank`` (an even layout): same place on its node, same tree role of its
    node (has a parent node, how many child nodes) — the first node with that role."""
    local = node_sizes[0]
    node, at = divmod(rank, local)
    return _first_node_like(len(node_sizes), node) * local + at


def _first_node_like(nodes: int, node: int) -> int:
    """The first node of a binary tree over ``nodes`` with ``node``'s role (root or not, how many children)."""
    return _first_of_role(nodes)[_role(nodes, node)]


def _role(nodes: int, node: int) -> tuple[bool, int]:
    return node > 0, (2 * node + 1 < nodes) + (2 * node + 2 < nodes)


@functools.cache
def _first_of_role(nodes: int) -> dict[tuple[bool, int], int]:
    """Each role's first node, in one pass per tree size. Why: scanning from node 0 for each node's role was
    quadratic in the nodes (a leaf's first like it is half way down): 1.1 million role checks for the world-wide
    groups of 16,384 ranks, 67 million at 131,072."""
    first: dict[tuple[bool, int], int] = {}
    for n in range(nodes):
        first.setdefault(_role(nodes, n), n)
    return first


class _Prefix(NamedTuple):
    """What ``Pricer.create`` reads of a member list, an environment and options (``Pricer._prefix``)."""

    options_object: PgOptions
    nranks: int
    node_sizes: tuple[int, ...]
    even: bool
    env: tuple[tuple[str, str], ...]
    options: tuple[tuple[str, Any], ...]
    unmodelled: tuple[str, ...]
    own_share: bool  # created with splitShare: its split children share its resources
    number: int  # its class number: equal for member lists of one size and layout under equal settings
    # Per group rank, the rank the mechanics price it as (``representative``), where the layout is even: one
    # table per layout, so a member's class is an index, not a walk up its node's tree role.
    representatives: Sequence[int]


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


_ONE_NODE_ONE_RANK = (1,)


class Pricer:
    """Breakdowns for one profile on one cluster, cached by everything they depend on."""

    def __init__(
        self,
        profile: Profile,
        node_of: Callable[[int], int],
        nodes_of: Callable[[Sequence[int]], Sequence[int]] | None = None,
        node_counts: Callable[[Sequence[int]], Mapping[int, int]] | None = None,
    ) -> None:
        """``node_of``: a global rank's node; ``nodes_of``: that for a whole member list at once (faster, e.g.
        ``Cluster.nodes_of``), if the caller has it."""
        self.profile = profile
        self.node_of = node_of
        self.nodes_of = nodes_of if nodes_of is not None else (lambda ranks: [node_of(r) for r in ranks])
        # Ranks per node of a member list, nodes in order of first appearance (``node_counts``: the caller's, if
        # it counts them already, e.g. ``Sim.node_counts``).
        self.node_counts = node_counts if node_counts is not None else (lambda ranks: Counter(self.nodes_of(ranks)))
        self.topology = profile.topology
        self.fixed_bytes = mib_to_bytes(profile.comm.comm_fixed_mib)
        self.fixed_source = f"{profile.name}: derivation.comm_fixed_mib"
        self.process_bytes = mib_to_bytes(profile.comm.process_mib)
        self.process_first_collective_bytes = mib_to_bytes(profile.comm.process_first_collective_mib)
        c = constants()
        self._tree_below = c.integer("algorithm_rule.tree_below_bytes")
        self._pat_below = c.integer("algorithm_rule.pat_below_bytes")
        self._default_bytes = c.integer("algorithm_rule.default_bytes")  # what the model reads for no size
        self._cache: dict[tuple[Any, ...], Breakdown] = {}
        self._shared = _breakdowns_of(profile)  # the process's, behind this run's own
        # Per member tuple (one object shared by a group's members): its node sizes, or its rank -> index map.
        self._sizes: dict[int, tuple[Sequence[int], tuple[int, ...]]] = {}
        # Per distinct node-sizes tuple: (the interned tuple, a small number standing for it in cache keys,
        # whether the layout is even) — so no member hashes or scans its group's node list (that was quadratic
        # in the world for world-wide groups). Per environment / options object: what the model reads of it.
        self._layouts: dict[tuple[int, ...], tuple[tuple[int, ...], int, bool]] = {}
        self._layout_of: dict[int, tuple[tuple[int, ...], int, bool]] = {}
        self._envs: dict[int, tuple[Mapping[str, str], tuple[tuple[str, str], ...]]] = {}
        self._options: dict[int, tuple[PgOptions, tuple[tuple[str, Any], ...], tuple[str, ...]]] = {}
        self._index: dict[int, tuple[Sequence[int], dict[int, int]]] = {}
        self._members_of: dict[tuple[int, int], tuple[Sequence[int], Sequence[int], tuple[int, ...]]] = {}
        # Per (sharing parent's breakdown, members) objects: what a split child's model reads of that parent.
        self._views: dict[tuple[int, int], tuple[Breakdown, tuple[int, ...], tuple[Any, ...], frozenset[Any]]] = {}
        # Per (environment, options) key: the settings the model reads of them, and those as a hashable key.
        self._settings: dict[tuple[Any, ...], tuple[NcclSettings, tuple[Any, ...]]] = {}
        # (id(breakdown held), what the model reads of a use) -> (that breakdown, the next, the parts it adds).
        self._steps: dict[tuple[int, tuple[Any, ...]], tuple[Breakdown, Breakdown, tuple[Part, ...]]] = {}
        # One CommMemory per rank class (``create(..., shareable=True)``), and the ids of those shared objects.
        self._classes: dict[tuple[int, int], CommMemory] = {}  # (prefix class number, representative rank)
        self._class_ids: set[int] = set()
        # Interned NCCL environment keys; (id(layout), id(env key), id(options)) -> what ``create`` reads of them;
        # (members count, layout number, env key, options, unmodelled) -> its class number.
        self._env_keys: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}
        self._prefixes: dict[tuple[int, int, int], _Prefix] = {}
        self._class_numbers: dict[tuple[Any, ...], int] = {}
        # (id(layout), id(env key), id(options)) -> (options, ``eager_group_bytes``): interned keys, kept options.
        self._eager_bytes: dict[tuple[int, int, int], tuple[PgOptions, int]] = {}
        self._representative_tables: dict[tuple[int, ...], tuple[int, ...]] = {}  # even layout -> its table

    # ------------------------------------------------------------------ creation

    def create(
        self,
        ranks: Sequence[int],
        rank_index: int,
        env: Mapping[str, str],
        options: PgOptions = NO_OPTIONS,
        parent: CommMemory | None = None,
        parent_ranks: Sequence[int] | None = None,
        *,
        shareable: bool = False,
    ) -> CommMemory:
        """A communicator of ``ranks`` (global, in group order) as rank ``rank_index`` holds it after init.

        ``parent``: the communicator it was split from; it shares only when the parent shares
        (``parent.share_resources``), and ``parent_ranks`` (the parent's global ranks) map the members then.
        ``shareable``: the caller may get one object shared by every rank the mechanics price alike (priced by
        class, nobody sharing resources); it must ask for its own copy (``own``) before a first use changes it.
        Why: a world-wide startup creates millions of communicators that are, per class, the same numbers.
        Raises NcclInputError for a bad NCCL knob or option.
        """
        prefix = self._prefix(ranks, env, options)
        sharing = parent if parent is not None and parent.share_resources else None
        exact = prefix.own_share or sharing is not None or not prefix.even
        if shareable and not exact:
            return self._class_memory(prefix, rank_index)
        shape = Shape(prefix.nranks, prefix.node_sizes, rank_index)
        members = None if sharing is None else self._members(ranks, parent_ranks or ())
        breakdown = self._priced(shape, exact, prefix.env, prefix.options, (), sharing, members)
        return CommMemory(
            shape, prefix.env, prefix.options, exact, sharing, members, breakdown, unmodelled=prefix.unmodelled
        )

    def _prefix(self, ranks: Sequence[int], env: Mapping[str, str], options: PgOptions) -> _Prefix:
        """What ``create`` reads of a member list, an environment and options, once per (layout, NCCL
        environment, options) objects: layouts and NCCL environments are interned (equal ones share one
        object), so a member hashes no tuple here, and groups of one layout share the entry (one per group was
        ~0.4 KiB a group at 131,072 ranks)."""
        env_key = self._env_key(env)
        node_sizes = self._node_sizes(ranks)  # interned: one object per layout
        key = (id(node_sizes), id(env_key), id(options))
        prefix = self._prefixes.get(key)
        if prefix is not None and prefix.options_object is options:
            return prefix
        _sizes, layout, even = self._layout(node_sizes)
        opts, unmodelled = self._model_options(options)
        representatives = self._representatives(node_sizes) if even else ()
        number = self._class_numbers.setdefault(
            (len(ranks), layout, env_key, opts, unmodelled), len(self._class_numbers)
        )
        prefix = self._prefixes[key] = _Prefix(
            options,
            len(ranks),
            node_sizes,
            even,
            env_key,
            opts,
            unmodelled,
            self._split_share(env_key, opts),
            number,
            representatives,
        )
        return prefix

    def for_members(self, ranks: Sequence[int]) -> MembersPricing:
        """``create`` for the members of one group (``ranks``), each asking once per environment object."""
        return MembersPricing(self, ranks)

    def _representatives(self, node_sizes: tuple[int, ...]) -> tuple[int, ...]:
        """``representative(node_sizes, i)`` for every group rank ``i`` of an even layout, once per layout."""
        table = self._representative_tables.get(node_sizes)
        if table is None:
            table = self._representative_tables[node_sizes] = tuple(
                representative(node_sizes, i) for i in range(sum(node_sizes))
            )
        return table

    def _class_memory(self, prefix: _Prefix, rank_index: int) -> CommMemory:
        """The one CommMemory of a rank class: the members of a layout (number) at the same representative rank."""
        rank = prefix.representatives[rank_index]
        key = (prefix.number, rank)
        memory = self._classes.get(key)
        if memory is None:
            shape = Shape(prefix.nranks, prefix.node_sizes, rank)
            breakdown = self._priced(shape, False, prefix.env, prefix.options, (), None, None)
            memory = self._classes[key] = CommMemory(
                shape, prefix.env, prefix.options, False, None, None, breakdown, unmodelled=prefix.unmodelled
            )
            self._class_ids.add(id(memory))
        return memory

    def eager_group_bytes(self, ranks: Sequence[int], env: Mapping[str, str], options: PgOptions = NO_OPTIONS) -> int:
        """What an eager creation of a group of ``ranks`` charges its most expensive member's device: the most
        any member's communicator holds after init, laid out on this pricer's nodes, and never less than the
        flat price of a one- or two-rank group on one node (``eager_group_mib``). The price ``budget(X)`` puts
        on a group.

        Why per layout: with connections made at first use (the default) the flat price bounds every group, so
        this is that price; with ``NCCL_RUNTIME_CONNECT=0`` init makes the connections, which grow with the
        layout (H100: 1,159 MiB for 3 ranks on a node, 2,181 MiB for 4 nodes x 1, against 901), and a flat price
        let a budget be exceeded. Rank-independent (every member asks about the same layout), so members decide
        alike. Priced without a sharing parent (sharing only lowers it). Once per (layout, NCCL environment,
        options) objects."""
        env_key = self._env_key(env)
        node_sizes = self._node_sizes(ranks)
        key = (id(node_sizes), id(env_key), id(options))
        known = self._eager_bytes.get(key)
        if known is not None and known[0] is options:
            return known[1]
        price = max(mib_to_bytes(eager_group_mib(self.profile, env)), self.most_init_bytes(ranks, env, options))
        self._eager_bytes[key] = (options, price)
        return price

    def most_init_bytes(self, ranks: Sequence[int], env: Mapping[str, str], options: PgOptions = NO_OPTIONS) -> int:
        """The most any member's communicator of a group of ``ranks`` holds on its device after init (no sharing
        parent): one member per representative where the layout is even (they price alike), every member
        otherwise."""
        node_sizes = self._node_sizes(ranks)
        even = self._layout(node_sizes)[2]
        indices = {representative(node_sizes, i) for i in range(len(ranks))} if even else range(len(ranks))
        return max((self.create(ranks, i, env, options).breakdown.init_device_bytes for i in indices), default=0)

    def is_shared(self, memory: CommMemory) -> bool:
        """Whether ``memory`` is a rank class's shared object (``create(..., shareable=True)``)."""
        return id(memory) in self._class_ids

    def own(self, memory: CommMemory, rank_index: int) -> CommMemory:
        """Rank ``rank_index``'s own copy of a class's shared ``memory``, to connect its uses on."""
        shape = Shape(memory.shape.nranks, memory.shape.node_sizes, rank_index)
        # Field by field, not ``dataclasses.replace`` (which inspects the fields on every call): every rank's
        # first collective on every group it uses makes one.
        return CommMemory(
            shape,
            memory.env,
            memory.options,
            memory.exact,
            memory.parent,
            memory.members,
            memory.breakdown,
            memory.uses,
            set(memory.use_keys),
            memory.unmodelled,
        )

    def _env_key(self, env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """``nccl_env(env)``, once per environment object (a rank's never changes)."""
        cached = self._envs.get(id(env))
        if cached is not None and cached[0] is env:
            return cached[1]
        key = nccl_env(env)
        key = self._env_keys.setdefault(key, key)  # interned: equal environments share one key object
        self._envs[id(env)] = (env, key)
        return key

    def _model_options(self, options: PgOptions) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
        """``model_options`` and ``unmodelled_for_memory`` of an options object, once per object."""
        cached = self._options.get(id(options))
        if cached is not None and cached[0] is options:
            return cached[1], cached[2]
        entry = self._options[id(options)] = (options, model_options(options), unmodelled_for_memory(options))
        return entry[1], entry[2]

    def _layout(self, sizes: tuple[int, ...]) -> tuple[tuple[int, ...], int, bool]:
        """(interned tuple, its number, even) for a node-sizes tuple, looked up by identity after the first time."""
        cached = self._layout_of.get(id(sizes))
        if cached is not None and cached[0] is sizes:
            return cached
        entry = self._layouts.get(sizes)
        if entry is None:
            entry = self._layouts[sizes] = (sizes, len(self._layouts), len(set(sizes)) == 1)
        if entry[0] is sizes:
            self._layout_of[id(sizes)] = entry
        return entry

    def _split_share(self, env: tuple[tuple[str, str], ...], options: tuple[tuple[str, Any], ...]) -> bool:
        """Whether a communicator created under ``env`` and ``options`` lets its split children share."""
        return self._settings_of(env, options)[0].split_share

    def _settings_of(
        self, env: tuple[tuple[str, str], ...], options: tuple[tuple[str, Any], ...]
    ) -> tuple[NcclSettings, tuple[Any, ...]]:
        """What the model reads of ``env`` and ``options`` (``settings_from``, all it reads of them), and that as
        a key: environments that mean the same to NCCL (a knob set to its default, or left unset) share the
        process's breakdowns (``_model``)."""
        key = (env, options)
        entry = self._settings.get(key)
        if entry is None:
            settings = settings_from(dict(env), dict(options))
            entry = self._settings[key] = (settings, settings_key(settings))
        return entry

    def _node_sizes(self, ranks: Sequence[int]) -> tuple[int, ...]:
        """The group's ranks per node, in rank order (a node counted where it first appears)."""
        if len(ranks) == 1:  # a one-rank group (46% of a Megatron startup's calls): nothing to count, nothing kept
            self.node_of(ranks[0])  # checked as a count would check it
            return self._layout(_ONE_NODE_ONE_RANK)[0]
        cached = self._sizes.get(id(ranks))
        if cached is not None and cached[0] is ranks:
            return cached[1]
        sizes = self.node_counts(ranks)  # in order of first appearance
        result = self._layout(tuple(sizes.values()))[0]  # interned: equal layouts share one tuple
        self._sizes[id(ranks)] = (ranks, result)
        return result

    def _members(self, ranks: Sequence[int], parent_ranks: Sequence[int]) -> tuple[int, ...]:
        """The group's ranks as the parent numbers them: one tuple per (group, parent) rank-list objects, so a
        group's members share it (and their parent views, ``_parent_view``, are looked up by its identity)."""
        key = (id(ranks), id(parent_ranks))
        cached = self._members_of.get(key)
        if cached is not None and cached[0] is ranks and cached[1] is parent_ranks:
            return cached[2]
        index = self._rank_index(parent_ranks)
        members = tuple(index[r] for r in ranks)
        self._members_of[key] = (ranks, parent_ranks, members)
        return members

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
        was_exact = memory.exact
        if collective in P2P_COLLECTIVES:
            new = Use(collective, peers=None if peer is None else (peer,))
            memory.exact = True  # explicit peers are priced on the real rank numbers
        else:
            new = Use(collective, nbytes)
        m = memory
        # Without a sharing parent (whose state moves) and with the pricing unchanged (a first send/recv makes it
        # exact), what the rank holds is what the model priced for its inputs so far: the step to the next
        # breakdown depends on that breakdown and what the model reads of the use only (``_model``'s key), and
        # is taken once per run.
        step_key = None
        if m.parent is None and m.exact == was_exact:
            step_key = (id(m.breakdown), self._read(new))
            step = self._steps.get(step_key)
            if step is not None and step[0] is m.breakdown:
                memory.uses = (*memory.uses, new)
                memory.breakdown = step[1]
                return step[2]
        before = self._priced(m.shape, m.exact, m.env, m.options, m.uses, m.parent, m.members)
        after = self._priced(m.shape, m.exact, m.env, m.options, (*m.uses, new), m.parent, m.members, before=before)
        if after.parts[: len(before.parts)] != before.parts:  # pragma: no cover - the model appends in order
            raise AssertionError("NCCL model: a first use changed what earlier phases paid")
        paid = after.parts[len(before.parts) :]
        if step_key is not None and before is m.breakdown:
            self._steps[step_key] = (before, after, paid)
        memory.uses = (*memory.uses, new)
        memory.breakdown = after
        return paid

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
        *,
        before: Breakdown | None = None,
    ) -> Breakdown:
        """The model's breakdown; cached unless a sharing parent (whose state moves) is involved. ``before``: the
        breakdown without the last of ``uses``, which the model then only extends (``_model``)."""
        rank = shape.rank if exact else shape.representative()
        sizes, layout, even = self._layout(shape.node_sizes)
        key = (shape.nranks, layout, rank, env, options, uses)
        if parent is None:
            cached = self._cache.get(key)
            if cached is not None:
                return cached
        result = self._model(shape, sizes, even, rank, env, options, uses, parent, members, before)
        if parent is None:
            self._cache[key] = result
        return result

    def _model(
        self,
        shape: Shape,
        sizes: tuple[int, ...],
        even: bool,
        rank: int,
        env: tuple[tuple[str, str], ...],
        options: tuple[tuple[str, Any], ...],
        uses: tuple[Use, ...],
        parent: CommMemory | None,
        members: tuple[int, ...] | None,
        before: Breakdown | None,
    ) -> Breakdown:
        """``communicator_bytes``, through the process's cache for this profile (``_BREAKDOWNS``): a pure
        function of the key, where a use enters as what the model reads of it (an all_reduce of 4 MiB and one
        of 64 MiB connect the same), the environment and options as the settings they make (the model reads
        them only through ``settings_from``), and a sharing parent as the very breakdown it holds, kept beside it.
        ``sizes``/``even``: the run's interned node sizes and whether they are even (``_layout``); the run's layout
        number cannot key a cache shared by runs, the interned tuple can, and this runs only on the run's misses."""
        settings = self._settings_of(env, options)[1]
        key: tuple[Any, ...] = (shape.nranks, sizes, rank, settings, tuple(map(self._read, uses)))
        view = None
        if parent is not None:
            assert members is not None
            view_key, connected = self._parent_view(parent.breakdown, members)
            key = (*key, view_key)
        shared = self._shared.get(key)
        if shared is not None:
            return shared
        if parent is not None:
            view = replace(parent.breakdown, connected=connected)  # built on a miss only
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
            parent=view,  # members: the view numbers the parent's ranks as this group does
            node_sizes=None if even else shape.node_sizes,
            fixed_overhead_bytes=self.fixed_bytes,
            fixed_overhead_source=self.fixed_source,
            resume=before,
        )
        if len(self._shared) >= _BREAKDOWNS_KEPT:  # full: the older half goes
            for old in list(itertools.islice(self._shared, _BREAKDOWNS_KEPT // 2)):
                del self._shared[old]
        result = _compact(result)
        self._shared[key] = result
        return result

    def _parent_view(
        self, parent: Breakdown, members: tuple[int, ...]
    ) -> tuple[tuple[Any, ...], frozenset[tuple[Any, ...]]]:
        """What a split child's model reads of its sharing parent (``simnccl.nccl.model``: its splitShare, NVLS
        state, local ranks, channel counts, NET pools and NVLS buffers paid, and the connections it made to the
        child's members), with the parent's ranks numbered as the child numbers them: as a hashable key, and the
        renumbered connections (the caller builds the Breakdown to hand the model, whose members are then the
        identity, only when the key is not priced yet).

        Why: the child's breakdown depends on the parent only through this view, and members at the same place
        in groups of the same shape see equal views (the parent is the world's, or a group's, communicator of
        a rank class); keyed by the view, they are priced once, not once per member (measured: Megatron
        TP8·PP4·DP16 under NCCL_COMM_SPLIT_SHARE_RESOURCES=1, 4,354 model calls before)."""
        cached = self._views.get((id(parent), id(members)))
        if cached is not None and cached[0] is parent and cached[1] is members:
            return cached[2], cached[3]
        index = self._rank_index(members)  # one per group's rank tuple, not one per member
        connected = frozenset(
            (channel, index[peer], direction, at) for channel, peer, direction, at in parent.connected if peer in index
        )
        layout, channels = parent.layout, parent.channels
        view_key = (
            "parent-view",
            parent.share_resources,
            layout.nranks,
            layout.local_ranks,
            parent.nvls_active,
            channels.coll,
            channels.p2p,
            channels.nvls,
            parent.nvls_buffers_paid,
            parent.net_pools_paid,
            connected,
        )
        self._views[(id(parent), id(members))] = (parent, members, view_key, connected)
        return view_key, connected

    def _read(self, use: Use) -> tuple[Any, ...]:
        """What the model reads of a use: its collective, its peers, and which side of the algorithm rule's size
        thresholds it falls (``simnccl.nccl.algorithms``; no size is the rule's default size)."""
        n = self._default_bytes if use.nbytes is None else use.nbytes
        return (use.collective, use.peers, n < self._tree_below, n < self._pat_below)


def settings_key(settings: NcclSettings) -> tuple[Any, ...]:
    """``settings`` as a hashable value, equal exactly when the settings are (sets and NCCL_ALGO's table sorted)."""

    def plain(value: Any) -> Any:
        if isinstance(value, frozenset | set):
            return tuple(sorted(value))
        if isinstance(value, Mapping):
            return tuple(sorted((k, plain(v)) for k, v in value.items()))
        return value

    return tuple(plain(getattr(settings, f.name)) for f in fields(settings))


# Breakdowns by profile, shared by every engine of the process: a property run simulates thousands of small
# programs whose communicators are mostly the same few shapes, and pricing one was most of a small simulation.
# Bounded (a breakdown with its connections is ~10 KiB): past the bound, the older half is dropped.
_BREAKDOWNS_KEPT = 10_000
_PROFILES_KEPT = 32
_BREAKDOWNS: dict[int, tuple[Profile, dict[tuple[Any, ...], Breakdown]]] = {}


def _compact(breakdown: Breakdown) -> Breakdown:
    """``breakdown`` holding the process's one object of each of its pieces (``shared_value``: equal values, so
    the same figures): cached breakdowns of different keys are mostly the same parts, connection sets and layouts
    (a 2,000-program property run kept 13,382 breakdowns holding 28,109 parts of 805 values), each walked by every
    full collection of the cyclic GC."""
    one = shared_value
    return replace(
        breakdown,
        parts=one(tuple(map(one, breakdown.parts))),
        layout=one(breakdown.layout),
        channels=one(breakdown.channels),
        connected=one(breakdown.connected),
        algorithms_connected=one(breakdown.algorithms_connected),
        net_pools_paid=one(breakdown.net_pools_paid),
        notes=one(breakdown.notes),
    )


def _breakdowns_of(profile: Profile) -> dict[tuple[Any, ...], Breakdown]:
    """The process's breakdown cache for this profile object (by identity: a profile file loaded twice is two
    profiles, and nothing holds a stale one whose id was reused)."""
    entry = _BREAKDOWNS.get(id(profile))
    if entry is None or entry[0] is not profile:
        if len(_BREAKDOWNS) >= _PROFILES_KEPT:  # profile files loaded afresh per run: keep the latest few
            _BREAKDOWNS.clear()
        entry = _BREAKDOWNS[id(profile)] = (profile, {})
    return entry[1]


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
    two-rank group on one node (the groups #199957 and sglang#35538 measured), at init under ``env``. With
    connections made at first use (``NCCL_RUNTIME_CONNECT=1``, the default) that bounds a group of any size
    and layout (``tests/test_policy.py`` checks 1-8 ranks on 1, 2 and 4 nodes for every GPU kind). With
    ``NCCL_RUNTIME_CONNECT=0`` init includes the connections, which grow with the layout (H100: 1,159 MiB for 3
    ranks on a node, 2,181 MiB for 4 nodes x 1, against 901): ``Pricer.eager_group_bytes`` prices a group by its
    layout, never below this. Raises NcclInputError for a bad NCCL knob in ``env``.
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


class MembersPricing:
    """``Pricer.create(ranks, index, env, options, parent, parent_ranks, shareable=True)`` for the members of one
    group, with what ``create`` reads of the member list, environment and options (``Pricer._prefix``) asked once
    per NCCL environment (``nccl_env``, interned) and options, and a member priced by its class taken straight
    from the class's entry.

    Why: at a world-wide startup every member of a call asked ``_prefix`` for the same member list (and, within
    a rank class, the same environment and options) and rebuilt the same cache key; the answer is that of
    ``create``, the same object, for every member."""

    __slots__ = ("_prefixes", "pricer", "ranks")

    def __init__(self, pricer: Pricer, ranks: Sequence[int]) -> None:
        self.pricer = pricer
        self.ranks = ranks
        # id(interned NCCL environment) -> it, the options, what ``_prefix`` answers for them
        self._prefixes: dict[int, tuple[tuple[tuple[str, str], ...], PgOptions, _Prefix]] = {}

    def create(
        self,
        index: int,
        env: Mapping[str, str],
        options: PgOptions,
        parent: CommMemory | None,
        parent_ranks: Sequence[int] | None,
    ) -> CommMemory:
        """``pricer.create(ranks, index, env, options, parent, parent_ranks, shareable=True)``."""
        pricer = self.pricer
        env_key = pricer._env_key(env)  # interned: the members of a rank class share it
        entry = self._prefixes.get(id(env_key))
        if entry is None or entry[0] is not env_key or entry[1] is not options:
            entry = self._prefixes[id(env_key)] = (env_key, options, pricer._prefix(self.ranks, env, options))
        prefix = entry[2]
        if prefix.even and not prefix.own_share and (parent is None or not parent.share_resources):
            memory = pricer._classes.get((prefix.number, prefix.representatives[index]))
            return memory if memory is not None else pricer._class_memory(prefix, index)
        return pricer.create(self.ranks, index, env, options, parent, parent_ranks, shareable=True)
