"""``communicator_bytes``: one rank's NCCL communicator memory from NCCL's own mechanics, itemised.

What is paid, in NCCL's order (src/init.cc initTransportsRank, v2.30.7):

* at init, always: the device communicator (2 allocations), every channel's peer tables (3 allocations per
  channel, 2 for a split child sharing its parent), NVLS's per-channel peers and credit region (when NVLS is
  active and not shared), the work FIFO (pinned host). Under cuMem (default since 2.19) each device
  allocation is rounded to the 2 MiB granularity, which is why a channel costs 6 MiB although its tables hold
  a few KiB, and why an idle 2-GPU H100 group costs 230 MiB.
* connections, at init when runtime connect is off (``NCCL_RUNTIME_CONNECT=0``, NCCL < 2.22, or no cuMem),
  else at the first call that needs each algorithm: ring, tree, PAT, NVLS buffers, CollNet; plus, at init with
  runtime connect off, the NET shared pool (also for one-rank communicators: the defect of NVIDIA/nccl#2363).
* send/recv connections, always at first use: ``per_peer`` channels to each peer, both directions; across
  nodes, the NET shared pool of each direction the first time a send (or a receive) goes over the network.
* NVLS only where NCCL enables it: multicast on an NVSwitch node of SM90+, and at least 2 GPUs of the
  communicator on the node (3 from NCCL 2.18 to 2.28.3, src/transport/nvls.cc ncclNvlsInit).

``fixed_overhead_bytes`` and ``process_overhead_bytes`` are what a profile must *measure*: per communicator
and once per process (the first communicator), beyond the mechanics above.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar

from simnccl.nccl import connections as conns
from simnccl.nccl.algorithms import P2P, Use, algorithm_for, p2p_peers
from simnccl.nccl.breakdown import INIT, MIB, Breakdown, Part
from simnccl.nccl.channels import Channels, ParentChannels, channel_counts
from simnccl.nccl.constants import NcclInputError, constants
from simnccl.nccl.hardware import Topology, topology_for
from simnccl.nccl.knobs import NcclSettings, settings_from
from simnccl.nccl.layout import Layout
from simnccl.nccl.transports import (
    ProtocolBuffers,
    connection_allocation,
    net_shared_pool_bytes,
    p2p_chunk_bytes,
    protocol_buffers,
    round_up,
)
from simnccl.nccl.version import NcclVersion

Phase = Literal["init", "used"]
# What each send/recv call connects (an all_to_all: both directions, every peer).
P2P_DIRECTIONS: dict[str, tuple[conns.Direction, ...]] = {"send": ("send",), "recv": ("recv",)}
PHASES: tuple[Phase, ...] = ("init", "used")


def nvls_min_gpus(version: NcclVersion) -> int:
    """GPUs a node needs for NVLS (src/transport/nvls.cc ncclNvlsInit): 2, except 3 from 2.18 to 2.28.3."""
    if version.feature("nvls_more_than_two_gpus_since") and not version.feature("nvls_two_gpus_since"):
        return 3
    return 2


def _mib(n: int) -> str:
    return f"{n / MIB:g} MiB"


@dataclass
class _Ledger:
    """The parts being collected for one communicator, and what is already connected."""

    parts: list[Part] = field(default_factory=list)
    connected: set[tuple[int, int, str, int]] = field(default_factory=set)
    algorithms: set[str] = field(default_factory=set)
    nvls_buffers_paid: bool = False
    net_pools_paid: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def add(self, part: Part) -> None:
        if part.count > 0 and part.bytes_each > 0:
            self.parts.append(part)


@dataclass(frozen=True)
class _Context:
    topology: Topology
    layout: Layout
    settings: NcclSettings
    version: NcclVersion
    buffers: ProtocolBuffers
    channels: Channels
    cumem: bool
    nvls_active: bool
    nvls_heads: int
    parent: Breakdown | None
    members: tuple[int, ...]
    nvls_shared: bool


def _init_parts(ctx: _Context, ledger: _Ledger) -> None:
    c = constants()
    granule = ctx.topology.granularity_bytes if ctx.cumem else 0
    shared = ctx.parent is not None
    if ctx.cumem:
        ledger.add(
            Part(
                "device-comm",
                f"device communicator: {c.integer('allocations.devcomm')} allocations x {_mib(granule)} granule",
                "device",
                c.integer("allocations.devcomm"),
                granule,
                INIT,
                False,
                "predicted",
                c.source("allocations.devcomm", "cumem.granularity_bytes"),
            )
        )
        per_channel = c.integer("allocations.per_channel")
        if shared:
            per_channel -= c.integer("allocations.per_channel_shared_with_parent")
        n = ctx.channels.initialized
        ledger.add(
            Part(
                "channels",
                f"{n} channels x {per_channel} allocations x {_mib(granule)} granule"
                + (" (peer table shared with the parent)" if shared else ""),
                "device",
                n * per_channel,
                granule,
                INIT,
                True,
                "predicted",
                c.source("allocations.per_channel", "cumem.granularity_bytes"),
            )
        )
    fifo = ctx.settings.work_fifo_bytes or c.integer("buffers.work_fifo_bytes")
    ledger.add(
        Part(
            "work-fifo",
            "work FIFO (pinned host)",
            "host",
            1,
            fifo,
            INIT,
            False,
            "predicted",
            c.source("buffers.work_fifo_bytes"),
        )
    )
    if ctx.nvls_active and not ctx.nvls_shared:
        nvls = ctx.channels.nvls
        ledger.add(
            Part(
                "nvls-channels",
                f"{nvls} NVLS channels x 1 allocation x {_mib(granule)} granule",
                "device",
                nvls * c.integer("allocations.per_nvls_channel"),
                granule,
                INIT,
                False,
                "predicted",
                c.source("allocations.per_nvls_channel"),
            )
        )
        credit = nvls * c.integer("buffers.nvls_directions") * c.integer("buffers.nvls_credit_bytes") * ctx.nvls_heads
        mc_granule = c.integer("cumem.multicast_granularity_bytes")
        ledger.add(
            Part(
                "nvls-credit",
                f"NVLS credit region {credit} B rounded to the {_mib(mc_granule)} multicast granularity "
                "(1 multicast object)",
                "device",
                1,
                round_up(credit, mc_granule),
                INIT,
                False,
                "predicted",
                c.source("buffers.nvls_credit_bytes", "cumem.multicast_granularity_bytes"),
                multicast_objects=1,
            )
        )


def _parent_has(ctx: _Context, key: tuple[int, int, str, int]) -> bool:
    """A split child sharing its parent reuses a connection the parent made (same top-parent peer)."""
    if ctx.parent is None:
        return False
    channel, peer, direction, index = key
    return (channel, ctx.members[peer], direction, index) in ctx.parent.connected


# One object per distinct immutable value the process's model caches hold (connections, and the parts, sets and
# layouts of cached breakdowns: ``simnccl.comm_memory``). Why: those caches are mostly equal values (a
# 2,000-program property run kept 30,630 connections of 1,629 values and 41,349 connection sets of 1,047), and
# every full collection of the cyclic GC walked each copy (~0.3 s a collection). Bounded: past the bound the table
# starts afresh (values already shared stay shared).
T = TypeVar("T")
_SHARED_KEPT = 100_000
_CONNECTIONS_KEPT = 512  # wanted-connection tuples each connection function keeps (lru)
_SHARED: dict[Any, Any] = {}
_SHARED_IDS: set[int] = set()  # ids of the values in _SHARED (each alive while there, so its id is its own)


def shared_value(value: T) -> T:
    """The process's one object equal to ``value`` (``value`` itself the first time). An object that already is
    the shared one is known by its id (``_SHARED_IDS``, alive while ``_SHARED`` holds it) without hashing it: a
    breakdown extended by a use is mostly its predecessor's parts, each a dataclass hashed field by field."""
    if id(value) in _SHARED_IDS:
        return value
    if len(_SHARED) >= _SHARED_KEPT:
        _SHARED.clear()
        _SHARED_IDS.clear()
    one = _SHARED.setdefault(value, value)
    _SHARED_IDS.add(id(one))
    return one


# The connections an algorithm wants, by layout and channel counts: pure functions of their arguments, asked
# again for every communicator of the same shape (a property run prices thousands), so computed once per process,
# each connection the process's one object of its value.
def _cached_connections(
    wanted: Callable[..., list[conns.Connection]],
) -> Callable[..., tuple[conns.Connection, ...]]:
    @functools.lru_cache(maxsize=_CONNECTIONS_KEPT)
    def cached(*args: Any) -> tuple[conns.Connection, ...]:
        return tuple(map(shared_value, wanted(*args)))

    return cached


_ring = _cached_connections(conns.ring)
_tree = _cached_connections(conns.tree)
_pat = _cached_connections(conns.pat)
_collnet_direct = _cached_connections(conns.collnet_direct)
_point_to_point = _cached_connections(conns.point_to_point)


class _Wanted(NamedTuple):
    """What ``_connect`` reads of one tuple of wanted connections, worked out once per tuple: the keys NCCL dedups
    on, and, were none of them connected yet, the connections made (first of each key) grouped by side and
    transport, and the channels they span."""

    keys: tuple[tuple[int, int, str, int], ...]
    key_set: frozenset[tuple[int, int, str, int]]
    groups: tuple[tuple[tuple[str, str], tuple[conns.Connection, ...]], ...]  # sorted by (direction, transport)
    channels: int
    net_directions: tuple[str, ...]  # sorted directions of the NET connections made


_WANTED: dict[int, tuple[tuple[conns.Connection, ...], _Wanted]] = {}  # id(wanted) -> (wanted, what it reads)
# A table is asked for again only while its tuple is still in a connection function's cache (a tuple made afresh
# is another object): as many as those caches hold together (_ring, _tree, _pat, _collnet_direct, _point_to_point).
# Each holds its tuple's keys (~0.15 MiB for a tuple of a thousand connections), so the bound is what keeps a long
# property run's memory flat.
_WANTED_KEPT = 5 * _CONNECTIONS_KEPT


# ``Connection.key`` in C: a table's keys are taken for every connection of every rank a sharing world prices.
_KEY = operator.attrgetter("channel", "peer", "direction", "conn_index")


def _wanted(wanted: Sequence[conns.Connection]) -> _Wanted:
    """``_Wanted`` of a tuple the connection caches return (one object per distinct value: keyed by identity)."""
    cached = _WANTED.get(id(wanted))
    if cached is not None and cached[0] is wanted:
        return cached[1]
    keys = tuple(map(_KEY, wanted))
    sides, channels, net_directions, _ = _walk(None, set(), keys, wanted)  # what a fresh, parentless one makes
    result = _Wanted(keys, frozenset(keys), sides, channels, net_directions)
    if isinstance(wanted, tuple):  # only an immutable tuple can be remembered by identity
        if len(_WANTED) >= _WANTED_KEPT:
            _WANTED.clear()
        _WANTED[id(wanted)] = (wanted, result)
    return result


def _takes_the_table(ctx: _Context, connected: set[tuple[int, int, str, int]], info: _Wanted) -> bool:
    """Whether ``_connect`` may take what it makes from ``info``'s table: nothing of it connected yet, and no
    sharing parent whose connections it would reuse."""
    return ctx.parent is None and connected.isdisjoint(info.key_set)


def _walk(
    ctx: _Context | None,
    connected: set[tuple[int, int, str, int]],
    keys: Sequence[tuple[int, int, str, int]],
    wanted: Sequence[conns.Connection],
) -> tuple[tuple[tuple[tuple[str, str], tuple[conns.Connection, ...]], ...], int, tuple[str, ...], int]:
    """``conns.unique(wanted, connected)``, connection by connection (``keys``: theirs), marking each one made as
    it goes (without copying what is connected already: a communicator's whole history, copied at each first
    use): the sides made that the sharing parent has not, the channels and NET directions of every one made,
    and how many the parent had. ``ctx`` None: no parent to ask (how ``_wanted`` makes its table)."""
    fresh = []
    groups: dict[tuple[str, str], list[conns.Connection]] = {}
    reused = 0
    for key, conn in zip(keys, wanted, strict=True):
        if key in connected:
            continue
        connected.add(key)
        fresh.append(conn)
        if ctx is not None and _parent_has(ctx, key):
            reused += 1
            continue
        groups.setdefault((conn.direction, conn.transport), []).append(conn)
    sides = tuple((side, tuple(group)) for side, group in sorted(groups.items()))
    net_directions = tuple(sorted({conn.direction for conn in fresh if conn.transport == "net"}))
    return sides, len({conn.channel for conn in fresh}), net_directions, reused


def _connect(ctx: _Context, ledger: _Ledger, algorithm: str, wanted: Sequence[conns.Connection], paid_at: str) -> None:
    """Charge the connections of ``wanted`` not made yet, grouped by side and transport.

    Why two ways: a communicator's first use of an algorithm usually finds none of its connections made and no
    sharing parent, and then what it makes is a function of ``wanted`` alone (``_wanted``, once per tuple, a
    third of a property run's pricing before); otherwise ``_walk`` checks each connection. Both give the same
    parts (``test_connect_takes_from_its_table_what_the_connection_by_connection_walk_makes``)."""
    c = constants()
    info = _wanted(wanted)
    connected = ledger.connected
    if _takes_the_table(ctx, connected, info):
        connected.update(info.key_set)
        sides, channels, net_directions, reused = info.groups, info.channels, info.net_directions, 0
    else:
        sides, channels, net_directions, reused = _walk(ctx, connected, info.keys, wanted)
    for (direction, transport), group in sides:
        alloc = connection_allocation(group[0], ctx.topology, ctx.buffers, cumem=ctx.cumem)
        peers = len({conn.peer for conn in group})
        what = (
            f"{len(group)} {direction} connection(s) over {transport.upper()} ({peers} peer(s), {channels} channel(s))"
        )
        source = c.source("buffers.ll_bytes", "buffers.ll128_bytes", "buffers.simple_bytes", "buffers.ipc_align_bytes")
        ledger.add(Part(algorithm, what, "device", len(group), alloc.device, paid_at, True, "predicted", source))
        ledger.add(
            Part(algorithm, what + ", host side", "host", len(group), alloc.host, paid_at, False, "predicted", source)
        )
    if reused:
        ledger.notes.append(f"{algorithm} at {paid_at}: {reused} connection(s) reused from the sharing parent")
    if algorithm == P2P:
        for direction in net_directions:
            _net_pool(ctx, ledger, paid_at, direction, device=ctx.topology.gdr)


def _net_pool(ctx: _Context, ledger: _Ledger, paid_at: str, direction: str, *, device: bool) -> None:
    """One NET shared p2p pool: the proxy keeps one per direction (src/transport/net.cc sharedNetBuffersInit,
    ``type == 0 ? &peer->send : &peer->recv``), allocated by the first send/recv connection of that direction,
    or for sends at init with runtime connect off (proxySharedInit, type 0)."""
    c = constants()
    if direction in ledger.net_pools_paid:
        return
    ledger.net_pools_paid.add(direction)
    if ctx.parent is not None and direction in ctx.parent.net_pools_paid:
        return  # the proxy (and its pool) is the parent's
    chunk = p2p_chunk_bytes(ctx.topology, ctx.layout.nranks, ctx.layout.nodes, ctx.buffers)
    size = net_shared_pool_bytes(ctx.channels.p2p, chunk)
    granule = ctx.topology.granularity_bytes if ctx.cumem else 1
    ledger.add(
        Part(
            "net-shared-buffers",
            f"NET shared p2p {direction} pool: {ctx.channels.p2p} channels x "
            f"{c.integer('buffers.net_shared_steps')} steps x {chunk} B chunk",
            "device" if device else "host",
            1,
            round_up(size, granule) if device else size,
            paid_at,
            False,
            "predicted",
            c.source(
                "buffers.net_shared_steps", "buffers.p2p_nvl_chunk_bytes", "versions.single_rank_net_shared_fixed_in"
            ),
        )
    )


def _nvls_buffers(ctx: _Context, ledger: _Ledger, paid_at: str) -> None:
    c = constants()
    if ledger.nvls_buffers_paid:
        return
    ledger.nvls_buffers_paid = True
    if ctx.nvls_shared and ctx.parent is not None and ctx.parent.nvls_buffers_paid:
        return
    size = ctx.channels.nvls * c.integer("buffers.nvls_directions") * c.integer("buffers.nvls_chunk_bytes")
    size *= c.integer("buffers.steps") * ctx.nvls_heads
    ledger.add(
        Part(
            "nvls-buffers",
            f"NVLS buffers: {ctx.channels.nvls} channels x 2 x {c.integer('buffers.nvls_chunk_bytes')} B x "
            f"{c.integer('buffers.steps')} steps x {ctx.nvls_heads} heads (1 multicast object)",
            "device",
            1,
            round_up(size, c.integer("cumem.multicast_granularity_bytes")),
            paid_at,
            False,
            "predicted",
            c.source("buffers.nvls_chunk_bytes", "cumem.multicast_granularity_bytes"),
            multicast_objects=1,
        )
    )


def _algorithm(ctx: _Context, ledger: _Ledger, algorithm: str, paid_at: str) -> None:
    """Connect one collective algorithm (ncclCollPreconnect / the init-time connect of runtime connect off)."""
    if algorithm in ledger.algorithms:
        return
    ledger.algorithms.add(algorithm)
    layout, ch = ctx.layout, ctx.channels
    if layout.nranks == 1:
        return
    c = constants()
    if algorithm == "ring":
        _connect(ctx, ledger, "ring", _ring(layout, ch.coll), paid_at)
    elif algorithm == "tree":
        _connect(ctx, ledger, "tree", _tree(layout, ch.coll, c.integer("channels.max_tree_arity") - 1), paid_at)
    elif algorithm == "pat":
        _connect(ctx, ledger, "pat", _pat(layout, ch.coll), paid_at)
    elif algorithm == "nvls":
        if ctx.nvls_active:
            _nvls_buffers(ctx, ledger, paid_at)
    elif algorithm == "collnetdirect":
        arity = min(layout.local_ranks - 1, c.integer("channels.max_direct_arity"))
        _connect(ctx, ledger, "collnet", _collnet_direct(layout, ch.coll, arity), paid_at)
    else:  # pragma: no cover - algorithm_for returns only the names above
        raise NcclInputError(f"unknown algorithm {algorithm!r}")


def _init_connect(ctx: _Context, ledger: _Ledger) -> None:
    """Runtime connect off: everything a collective could need is connected at init (src/init.cc)."""
    layout = ctx.layout
    _algorithm(ctx, ledger, "ring", INIT)
    _algorithm(ctx, ledger, "tree", INIT)
    if layout.max_local_ranks == 1 and layout.nodes > 1:  # NCCL: maxLocalRanks == 1
        _algorithm(ctx, ledger, "pat", INIT)
    if ctx.nvls_active:
        _algorithm(ctx, ledger, "nvls", INIT)
    if ctx.settings.collnet_enable and layout.nodes > 1:
        _algorithm(ctx, ledger, "collnetdirect", INIT)
    if layout.nranks > 1 or ctx.version.single_rank_net_shared_defect:
        _net_pool(ctx, ledger, INIT, "send", device=True)  # proxySharedInit: cuda = 1, type 0


def _use(ctx: _Context, ledger: _Ledger, use: Use) -> None:
    algorithm = algorithm_for(use, ctx.layout, ctx.settings, nvls_active=ctx.nvls_active)
    if algorithm is None:
        return
    paid_at = f"first {use.collective} ({algorithm})"
    if algorithm == P2P:
        peers = p2p_peers(use, ctx.layout)
        directions = P2P_DIRECTIONS.get(use.collective, ("recv", "send"))
        wanted = _point_to_point(ctx.layout, peers, ctx.channels.p2p_per_peer, ctx.channels.p2p, directions)
        _connect(ctx, ledger, P2P, wanted, paid_at)
    else:
        _algorithm(ctx, ledger, algorithm, paid_at)


def _settings(env: Mapping[str, str] | None, options: Mapping[str, Any] | None) -> NcclSettings:
    """``settings_from``, once per distinct environment and options (a property run prices thousands of
    communicators under a handful of them); unhashable input is read afresh."""
    try:
        key = (tuple(sorted(env.items())) if env else (), tuple(sorted(options.items())) if options else ())
        cached = _SETTINGS.get(key)
    except TypeError:
        return settings_from(env, options)
    if cached is None:
        cached = settings_from(env, options)
        if len(_SETTINGS) < 4096:
            _SETTINGS[key] = cached
    return cached


_SETTINGS: dict[tuple[Any, ...], NcclSettings] = {}


def _as_use(use: Use | str) -> Use:
    return use if isinstance(use, Use) else Use(str(use))


def communicator_bytes(
    topology: Topology | str,
    nranks: int,
    local_ranks: int,
    nodes: int,
    nccl_version: str,
    env: Mapping[str, str] | None = None,
    options: Mapping[str, Any] | None = None,
    phase: Phase = "init",
    uses: Sequence[Use | str] = (),
    *,
    rank: int = 0,
    parent: Breakdown | None = None,
    members: Sequence[int] | None = None,
    node_sizes: Sequence[int] | None = None,
    fixed_overhead_bytes: int = 0,
    fixed_overhead_source: str = "",
    process_overhead_bytes: int = 0,
    process_overhead_source: str = "",
    resume: Breakdown | None = None,
) -> Breakdown:
    """One rank's communicator memory, itemised, up to ``phase``.

    ``topology``: a GPU kind key (``h100-80gb``) or a Topology. ``env``: the NCCL_* environment the
    communicator is created under; ``options``: its config (``max_ctas``, ``min_ctas``, ``split_share``, ...).
    ``phase``: ``init`` (what ncclCommInitRank / ncclCommSplit allocates) or ``used`` (plus what the first
    call of each ``uses`` entry connects, in order; a ``Use`` or a collective name). ``parent``: the
    Breakdown of the communicator this one was split from; its ``share_resources`` (the parent's own
    splitShare) decides sharing, and ``members`` maps this communicator's ranks to the parent's (default:
    the same numbers). ``node_sizes``: ranks per node for an uneven group (``local_ranks`` is then the
    priced rank's node's count). ``resume``: this very call's result without the last of ``uses`` (same
    arguments otherwise); only the last use is then connected, on top of it — the same breakdown, without
    redoing what the earlier phases paid (a caller pricing uses one by one pays each once). Raises
    NcclInputError for bad input.
    """
    if phase not in PHASES:
        raise NcclInputError(f"phase: expected one of {', '.join(PHASES)}, got {phase!r}")
    for name, value in (
        ("fixed_overhead_bytes", fixed_overhead_bytes),
        ("process_overhead_bytes", process_overhead_bytes),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise NcclInputError(f"{name}: expected a byte count >= 0, got {value!r}")
    topo = topology_for(topology) if isinstance(topology, str) else topology
    layout = Layout(nranks, local_ranks, nodes, rank, tuple(node_sizes or ()))
    version = NcclVersion.parse(nccl_version)
    settings = _settings(env, options)
    cumem_default = version.feature("cumem_default_since")
    cumem = settings.cumem_supported and (settings.cumem_enable if settings.cumem_enable is not None else cumem_default)
    runtime_connect = version.feature("runtime_connect_since") and cumem and settings.runtime_connect
    nvls_active = (
        version.feature("nvls_since")
        and settings.nvls_enable != 0
        and settings.cumem_supported
        and topo.multicast
        and topo.interconnect == "nvswitch"
        and topo.compute_capability >= 90
        and layout.local_ranks >= nvls_min_gpus(version)
    )
    shared = parent is not None and parent.share_resources
    identity = members is None  # the parent's first nranks ranks: valid exactly when the parent has that many
    members = tuple(range(nranks)) if members is None else tuple(members)
    if parent is not None and (
        nranks > parent.layout.nranks
        if identity
        else len(members) != nranks or any(not 0 <= m < parent.layout.nranks for m in members)
    ):
        raise NcclInputError(
            f"members: expected {nranks} ranks of the parent (0..{parent.layout.nranks - 1}), got {members!r}"
        )
    nvls_shared = bool(
        shared and parent is not None and parent.nvls_active and parent.layout.local_ranks == local_ranks
    )
    parent_channels = None
    if shared and parent is not None:
        parent_channels = ParentChannels(parent.channels.coll, parent.channels.p2p, parent.channels.nvls)
    channels = channel_counts(topo, layout, settings, nvls_active=nvls_active, parent=parent_channels)
    heads = layout.local_ranks if layout.nodes == 1 else max(1, min(layout.local_ranks, topo.nics_per_node))
    ctx = _Context(
        topology=topo,
        layout=layout,
        settings=settings,
        version=version,
        buffers=protocol_buffers(settings),
        channels=channels,
        cumem=cumem,
        nvls_active=nvls_active,
        nvls_heads=heads,
        parent=parent if shared else None,
        members=members,
        nvls_shared=nvls_shared,
    )
    trailing = (not cumem) + (layout.nodes > 1)  # the notes added last, below
    if resume is not None:
        if phase != "used" or not uses:
            raise NcclInputError("resume: only with phase 'used' and at least one use (the one to add)")
        ledger = _Ledger(
            list(resume.parts),
            set(resume.connected),
            set(resume.algorithms_connected),
            resume.nvls_buffers_paid,
            set(resume.net_pools_paid),
            list(resume.notes[: len(resume.notes) - trailing]),
        )
        _use(ctx, ledger, _as_use(uses[-1]))
        return _breakdown(ctx, ledger, runtime_connect, shared, settings.split_share)
    ledger = _Ledger()
    _init_parts(ctx, ledger)
    if fixed_overhead_bytes:
        ledger.add(
            Part(
                "fixed-overhead",
                "fixed per-communicator overhead (profile)",
                "device",
                1,
                fixed_overhead_bytes,
                INIT,
                False,
                "measured",
                fixed_overhead_source,
            )
        )
    if process_overhead_bytes:
        ledger.add(
            Part(
                "process-overhead",
                "once per process, with its first communicator (profile)",
                "device",
                1,
                process_overhead_bytes,
                INIT,
                False,
                "measured",
                process_overhead_source,
            )
        )
    if not runtime_connect:
        _init_connect(ctx, ledger)
    if phase == "used":
        for use in uses:
            _use(ctx, ledger, _as_use(use))
    return _breakdown(ctx, ledger, runtime_connect, shared, settings.split_share)


def _breakdown(ctx: _Context, ledger: _Ledger, runtime_connect: bool, shared: bool, share_resources: bool) -> Breakdown:
    """The result: the ledger's parts and state, and the notes on what the model leaves out (added last)."""
    layout, topo, version, channels, cumem = ctx.layout, ctx.topology, ctx.version, ctx.channels, ctx.cumem
    notes = ledger.notes
    if not cumem:
        notes.append(
            "cuMem off: the device communicator and channel tables are small cudaMalloc allocations (KiB), not counted"
        )
    if layout.nodes > 1:
        notes.append(
            "multi-node channel counts approximate NCCL's inter-node search (one ring per NIC); "
            "PXN, NVLS tree and NVB paths are not modelled"
        )
    return Breakdown(
        parts=tuple(ledger.parts),
        layout=layout,
        topology=topo.name,
        nccl_version=version.text,
        channels=channels,
        runtime_connect=runtime_connect,
        cumem=cumem,
        nvls_active=ctx.nvls_active,
        split_shared=shared,
        nvls_shared=ctx.nvls_shared,
        share_resources=share_resources,
        connected=frozenset(ledger.connected),
        algorithms_connected=frozenset(ledger.algorithms),
        nvls_buffers_paid=ledger.nvls_buffers_paid,
        net_pools_paid=frozenset(ledger.net_pools_paid),
        notes=tuple(notes),
    )
