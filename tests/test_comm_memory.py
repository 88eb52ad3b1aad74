"""The engine charges every communicator from NCCL's mechanics (simnccl.comm_memory): init at creation, each
collective kind's connections at its first use, split sharing decided by the parent, env knobs and pg_options,
pinned host memory on its own ledger, and the breakdown reachable from the outcome."""

from __future__ import annotations

import dataclasses

import pytest

from simnccl.cluster import Cluster, get_gpu_kind
from simnccl.comm_memory import (
    MODEL_OPTION_FIELDS,
    CommMemory,
    Pricer,
    eager_group_mib,
    model_options,
    one_node_mib,
    unmodelled_for_memory,
)
from simnccl.engine.nvls import multicast_data
from simnccl.memory import HostLedger
from simnccl.nccl import Use, communicator_bytes
from simnccl.ops import (
    MODELLED_OPTION_FIELDS,
    AllGather,
    AllReduce,
    AllToAll,
    Barrier,
    Checkpoint,
    DestroyProcessGroup,
    InitProcessGroup,
    NewGroup,
    PgOptions,
    Program,
    Recv,
    Send,
    SetDevice,
)
from simnccl.profiles import find_profile
from simnccl.release import get_release
from simnccl.testing import simulate, used_mib

START = [SetDevice(), InitProcessGroup(backend="nccl")]
PROFILE = find_profile("h100-80gb", "2.15")
SLOTS = multicast_data().integer("per_communicator.slots")  # NVLS slots the multicast ledger charges a communicator
MIB = 2**20


def _delta(out, a: str, b: str, device: str = "n0:cuda:0") -> float:
    return used_mib(out, b)[device] - used_mib(out, a)[device]


def _model(uses=(), env=None, options=None, nranks=2, **kw) -> float:
    return one_node_mib(PROFILE, nranks, env, uses, options=options, **kw)


# ------------------------------------------------------------------------------------------- first use per kind


def test_each_collective_kind_pays_its_connections_at_its_first_use_only() -> None:
    program = [
        *START,
        NewGroup(ranks=(0, 1), bind="g"),
        AllReduce(group="world"),  # the process's first collective: its overhead is paid here, not below
        Checkpoint(label="a"),
        AllReduce(group="g"),
        Checkpoint(label="b"),
        AllReduce(group="g"),
        Barrier(group="g"),  # a one-element all_reduce: NVLS is connected already
        Checkpoint(label="c"),
        AllGather(group="g"),
        Checkpoint(label="d"),
        AllGather(group="g"),
        AllToAll(group="g"),
        Checkpoint(label="e"),
    ]
    out = simulate(program)
    assert out.verdict == "pass"
    nvls = _model(("all_reduce",)) - _model()
    ring = _model(("all_reduce", "all_gather")) - _model(("all_reduce",))
    p2p = _model(("all_reduce", "all_gather", "all_to_all")) - _model(("all_reduce", "all_gather"))
    assert nvls == 64  # NVLS buffers: 16 channels x 2 x 128 KiB x 8 steps x 2 heads
    assert ring > 200 and p2p > 200
    assert _delta(out, "a", "b") == pytest.approx(nvls, abs=0.01)
    assert _delta(out, "b", "c") == 0
    assert _delta(out, "c", "d") == pytest.approx(ring, abs=0.01)
    assert _delta(out, "d", "e") == pytest.approx(p2p, abs=0.01)  # the second all_gather: nothing new


def test_send_recv_connect_per_peer_and_not_again() -> None:
    pair = [
        [*START, Checkpoint(label="a"), Send(peer=1), Checkpoint(label="b"), Send(peer=1), Checkpoint(label="c")],
        [*START, Checkpoint(label="a"), Recv(peer=0), Checkpoint(label="b"), Recv(peer=0), Checkpoint(label="c")],
    ]
    out = simulate(pair)
    assert out.verdict == "pass"
    first = PROFILE.comm.process_first_collective_mib
    assert _delta(out, "a", "b") == pytest.approx(first + _model(("send",)) - _model(), abs=0.01)
    assert _delta(out, "b", "c") == 0


# ------------------------------------------------------------------------------------------- split sharing


def test_split_sharing_is_decided_by_the_parent() -> None:
    shared_world = simulate(
        [*START, Checkpoint(label="a"), NewGroup(ranks=(0, 1), bind="g"), Checkpoint(label="b")],
        env={"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"},
    )
    child_asks = simulate(
        [
            *START,
            Checkpoint(label="a"),
            NewGroup(ranks=(0, 1), bind="g", pg_options=PgOptions(split_share=True)),
            Checkpoint(label="b"),
        ]
    )
    assert _delta(shared_world, "a", "b") == pytest.approx(132 + PROFILE.comm.comm_fixed_mib, abs=0.01)
    # the child's own split_share is for *its* children: its parent (the world) did not share
    assert _delta(child_asks, "a", "b") == pytest.approx(_model(), abs=0.01)
    record = next(r for (name, _), r in child_asks.groups.items() if name != "0")
    (memory,) = record.members[0]["memory"].values()
    assert memory.share_resources and not memory.breakdown.split_shared


def test_a_sharing_child_pays_nothing_for_nvls_its_parent_connected() -> None:
    program = [
        *START,
        AllReduce(group="world"),
        NewGroup(ranks=(0, 1), bind="g"),
        Checkpoint(label="a"),
        AllReduce(group="g"),
        Checkpoint(label="b"),
    ]
    shared = simulate(program, env={"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"})
    plain = simulate(program)
    assert _delta(shared, "a", "b") == 0
    assert _delta(plain, "a", "b") == 64


# ------------------------------------------------------------------------------------------- knobs and options


def test_nccl_buffsize_moves_the_connection_charge_not_the_init() -> None:
    program = [
        *START,
        AllReduce(group="world"),
        Checkpoint(label="a"),
        NewGroup(ranks=(0, 1), bind="g"),
        Checkpoint(label="b"),
        AllGather(group="g"),
        Checkpoint(label="c"),
    ]
    default = simulate(program)
    small = simulate(program, env={"NCCL_BUFFSIZE": str(1 * MIB)})
    assert _delta(small, "a", "b") == _delta(default, "a", "b")
    # ring connections: each receive's buffers (LL 0.5 + LL128 4.69 + Simple NCCL_BUFFSIZE) shrink from 9.19 to
    # 6.19 MiB, i.e. from 10 to 8 MiB in cuMem's 2 MiB granules: 2 MiB less per ring channel
    saved = _delta(default, "b", "c") - _delta(small, "b", "c")
    channels = communicator_bytes(PROFILE.topology, 2, 2, 1, PROFILE.nccl_version).channels.coll
    assert saved == pytest.approx(2 * channels, abs=0.01)
    assert _delta(small, "b", "c") == pytest.approx(
        _model(("all_gather",), env={"NCCL_BUFFSIZE": str(MIB)}) - _model(env={"NCCL_BUFFSIZE": str(MIB)}), abs=0.01
    )


def test_max_nchannels_and_max_ctas_cap_the_init() -> None:
    program = [*START, Checkpoint(label="a"), NewGroup(ranks=(0, 1), bind="g"), Checkpoint(label="b")]
    capped_env = simulate(program, env={"NCCL_MAX_NCHANNELS": "2"})
    capped_option = simulate(
        [
            *START,
            Checkpoint(label="a"),
            NewGroup(ranks=(0, 1), bind="g", pg_options=PgOptions(max_ctas=2)),
            Checkpoint(label="b"),
        ]
    )
    full = simulate(program)
    assert _delta(capped_env, "a", "b") < _delta(full, "a", "b") / 2
    assert _delta(capped_option, "a", "b") == pytest.approx(_model(options={"max_ctas": 2}), abs=0.01)


def test_pg_options_map_to_the_model_or_are_listed_unmodelled() -> None:
    options = PgOptions(lazy_init=True, max_ctas=8, min_ctas=2, split_share=True, cga_cluster_size=4, net_name="IB")
    assert dict(model_options(options)) == {"max_ctas": 8, "min_ctas": 2, "split_share": True}
    assert unmodelled_for_memory(options) == ("cga_cluster_size", "net_name")
    assert set(MODEL_OPTION_FIELDS) | {"lazy_init"} == set(MODELLED_OPTION_FIELDS)


# ------------------------------------------------------------------------------------------- what the outcome holds


def test_slots_charged_holds_exactly_the_communicators_that_took_slots() -> None:
    """Two nodes of 8: a node-local group binds NVLS on its node; a group of one rank per node binds nothing
    (no entry, read as 0), and all such bindings are one shared object that no run changes."""
    from simnccl.engine import nvls

    local = NewGroup(ranks=tuple(range(8)), bind="local")
    spread = NewGroup(ranks=(0, 8), bind="spread")
    out = simulate([*START, local, spread, AllReduce(group="local")], nodes=2, gpus_per_node=8)
    names = {r.name: set(r.ranks) for (_, ranks), r in out.groups.items() if r.ranks in (local.ranks, spread.ranks)}
    local_name = next(n for n, members in names.items() if members == set(local.ranks))
    spread_name = next(n for n, members in names.items() if members == set(spread.ranks))
    took = {key for key, slots in out.slots_charged.items() if slots}
    assert set(out.slots_charged) == took  # no zero entries
    assert {(r, local_name) for r in range(8)} <= took
    assert not any(name == spread_name for _, name in out.slots_charged)
    assert out.slots_charged.get((0, spread_name), 0) == 0
    assert (nvls._NO_SLOTS.slots, nvls._NO_SLOTS.holders, nvls._NO_SLOTS.failure) == (0, frozenset(), None)


def test_a_binding_of_nothing_is_kept_only_where_another_member_on_the_node_asks_for_it() -> None:
    """A communicator's NVLS binding on a node is shared by its members there. One alone on its node is the
    only one to ask, so a binding of nothing is not kept for it (most memberships of a large startup); a
    node-local group's binding is kept, its slots held by its members until the group is destroyed."""
    from simnccl.engine import Engine, SimConfig

    local = NewGroup(ranks=tuple(range(8)), bind="local")
    spread = NewGroup(ranks=(0, 8), bind="spread")
    program = Program((*START, local, spread, DestroyProcessGroup(group="local")))
    cluster = Cluster(get_gpu_kind("h100-80gb"), 2, 8)
    config = SimConfig(cluster, get_release("2.15"), find_profile("h100-80gb", "2.15"), [program] * 16)
    engine = Engine(config)
    out = engine.run()
    assert out.verdict == "pass"
    kept = engine.nvls._bindings
    ids = {g.name: g.comms["cuda"].comm_id for g in out.ranks[0].groups}
    names = {r.name: set(r.ranks) for r in out.groups.values()}
    local_id = ids[next(n for n, m in names.items() if m == set(local.ranks))]
    spread_id = ids[next(n for n, m in names.items() if m == set(spread.ranks))]
    assert (0, spread_id) not in kept and (1, spread_id) not in kept
    local_name = next(n for n, m in names.items() if m == set(local.ranks))
    assert all(out.slots_charged[(r, local_name)] == SLOTS for r in range(8))  # it took slots on node 0 ...
    assert (kept[(0, local_id)].slots, kept[(0, local_id)].holders) == (0, set())  # ... all 8 released them
    world_slots = kept[(0, out.ranks[0].world.comms["cuda"].comm_id)].slots
    assert engine.nvls.used == {0: world_slots, 1: world_slots}  # the local group's slots are free again


def test_breakdown_and_multicast_slots_are_reachable_from_the_outcome() -> None:
    out = simulate([*START, NewGroup(ranks=(0, 1), bind="g"), AllReduce(group="g"), Checkpoint(label="x")])
    record = next(r for (name, _), r in out.groups.items() if name != "0")
    ((name, memory),) = record.members[1]["memory"].items()
    breakdown = memory.breakdown
    assert breakdown.multicast_objects == 2  # the model's own count: NVLS credit region + NVLS buffers
    assert out.slots_charged[(1, name)] == SLOTS  # the slots: what the multicast ledger charged, not the model's 2
    assert breakdown.device_bytes == record.members[1]["bytes"]
    assert {p.mechanism for p in breakdown.parts} >= {"channels", "nvls-buffers", "fixed-overhead"}
    assert {p.paid_at for p in breakdown.parts} == {"init", "first all_reduce (nvls)"}
    world = out.ranks[0].world.comms["cuda"].memory
    assert world is not None and world.breakdown.nvls_active


def test_pinned_host_memory_is_its_own_ledger() -> None:
    out = simulate([*START, NewGroup(ranks=(0, 1), bind="g"), Checkpoint(label="x")])
    (host,) = out.host_ledgers.values()
    assert host.device == "n0:host"
    fifo = communicator_bytes(PROFILE.topology, 2, 2, 1, PROFILE.nccl_version).host_bytes
    assert host.used_bytes == 2 * 2 * fifo  # 2 ranks x (world + g)
    assert "host" not in "".join(out.ledgers)
    # What each owner holds and the peak, but no timeline: nothing reads one, and a large startup changes the host
    # ledger once per membership.
    assert isinstance(host, HostLedger) and host.timeline == []
    assert host.peak_bytes == host.used_bytes == sum(host.by_owner.values())
    assert {(o.rank, o.group) for o in host.by_owner} == {(0, "0"), (1, "0"), (0, "1"), (1, "1")}
    assert all(ledger.timeline for ledger in out.ledgers.values())  # the devices keep theirs


def test_eager_group_price_is_the_larger_of_a_one_and_a_two_rank_group() -> None:
    one, two = _model(nranks=1), _model(nranks=2)
    assert eager_group_mib(PROFILE, {}) == pytest.approx(max(one, two), abs=1e-6)
    assert eager_group_mib(PROFILE, {"NCCL_RUNTIME_CONNECT": "0"}) > eager_group_mib(PROFILE, {}) + 500


# ------------------------------------------------------------------------------------------- pricing by class


@pytest.mark.parametrize(("nodes", "per_node"), [(1, 8), (4, 8), (7, 2), (3, 1)])
def test_a_rank_priced_by_its_class_costs_what_it_costs_priced_as_itself(nodes: int, per_node: int) -> None:
    cluster = Cluster(get_gpu_kind("h100-80gb"), nodes, per_node)
    pricer = Pricer(PROFILE, cluster.node_of)
    world = tuple(range(nodes * per_node))
    for rank in world:
        by_class = pricer.create(world, rank, {})
        exact = pricer.create(world, rank, {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"})  # sharing: priced exactly
        assert exact.exact and not by_class.exact
        for use in ("all_reduce", "all_gather", "all_to_all"):
            pricer.use(by_class, use, 4 * MIB)
            pricer.use(exact, use, 4 * MIB)
        assert by_class.breakdown.device_bytes == exact.breakdown.device_bytes, rank
        assert by_class.breakdown.host_bytes == exact.breakdown.host_bytes, rank


def test_a_ranks_own_copy_of_a_class_breakdown_keeps_every_field_but_its_place() -> None:
    """``Pricer.own`` copies a class's shared breakdown field by field (no ``dataclasses.replace``, for speed):
    a field added to ``CommMemory`` and not copied there would make every first use read its default."""
    cluster = Cluster(get_gpu_kind("h100-80gb"), 2, 8)
    pricer = Pricer(PROFILE, cluster.node_of)
    shared = pricer.create(tuple(range(16)), 3, {"NCCL_MAX_CTAS": "8"}, shareable=True)
    assert pricer.is_shared(shared)
    pricer.use(shared, "all_reduce", 4 * MIB)  # uses and use keys that are not their defaults
    assert shared.uses and shared.use_keys
    own = pricer.own(shared, 11)
    assert own.shape == shared.shape._replace(rank=11)
    assert own.use_keys == shared.use_keys and own.use_keys is not shared.use_keys
    for f in dataclasses.fields(CommMemory):
        if f.name not in ("shape", "use_keys"):
            assert getattr(own, f.name) is getattr(shared, f.name), f.name


def test_destroy_gives_back_host_memory_and_multicast_slots() -> None:
    program = [
        *START,
        NewGroup(ranks=(0, 1), bind="g"),
        AllReduce(group="g"),
        Checkpoint(label="a"),
        DestroyProcessGroup(group="g"),
        Checkpoint(label="b"),
    ]
    held = simulate(program[:-2])
    assert held.multicast_slots == {"n0": 2 * SLOTS}  # the world's binding and g's, on the node's switches
    out = simulate(program)
    assert out.verdict == "pass"
    (host,) = out.host_ledgers.values()
    fifo = communicator_bytes(PROFILE.topology, 2, 2, 1, PROFILE.nccl_version).host_bytes
    assert host.used_bytes == 2 * fifo  # only the world communicators' work FIFOs remain
    assert out.multicast_slots == {"n0": SLOTS}  # g's binding freed once neither member holds it
    (name,) = (name for name, _ in out.groups if name != "0")
    assert out.slots_charged[(0, name)] == SLOTS  # what g took at its init stays on record


# ------------------------------------------------------------------------------------------- pricing across runs


def test_runs_of_one_process_share_breakdowns_keyed_by_what_the_model_reads() -> None:
    """Two runs (two pricers) on one profile get the very same breakdown objects for the same communicator, and
    uses the algorithm rule cannot tell apart (4 vs 64 MiB) share one; a size across the rule's threshold gets its
    own, and a child sharing its parent is priced on the breakdown its own parent holds — each equal to pricing it
    from scratch."""
    cluster = Cluster(get_gpu_kind("h100-80gb"), 2, 8)
    first, second = Pricer(PROFILE, cluster.node_of), Pricer(PROFILE, cluster.node_of)
    ranks = (0, 1, 8, 9)
    a, b = first.create(ranks, 1, {}), second.create(ranks, 1, {})
    assert b.breakdown is a.breakdown
    first.use(a, "all_reduce", 4 * MIB)
    second.use(b, "all_reduce", 64 * MIB)
    assert b.breakdown is a.breakdown
    small = second.create(ranks, 1, {})
    second.use(small, "all_reduce", 1024)  # below the tree threshold across nodes: tree, not ring
    assert small.breakdown != a.breakdown
    for memory, nbytes in ((a, 4 * MIB), (small, 1024)):
        scratch = communicator_bytes(
            PROFILE.topology,
            4,
            2,
            2,
            PROFILE.nccl_version,
            env={},
            phase="used",
            uses=[Use("all_reduce", nbytes)],
            rank=1,
            fixed_overhead_bytes=first.fixed_bytes,
            fixed_overhead_source=first.fixed_source,
        )
        assert memory.breakdown == scratch
    # One node, rings only: a child of ranks 1 and 2 reuses the ring its sharing parent connected, if it did.
    one_node = Cluster(get_gpu_kind("h100-80gb"), 1, 8)
    first, second = Pricer(PROFILE, one_node.node_of), Pricer(PROFILE, one_node.node_of)
    share = {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1", "NCCL_ALGO": "Ring"}
    parents = (0, 1, 2, 3)
    parent_one, parent_two = first.create(parents, 1, share), second.create(parents, 1, share)
    second.use(parent_two, "all_reduce", 4 * MIB)  # only the second parent has connected its ring
    children = []
    for pricer, parent in ((first, parent_one), (second, parent_two)):
        child = pricer.create((1, 2), 0, share, parent=parent, parent_ranks=parents)
        pricer.use(child, "all_reduce", 4 * MIB)
        scratch = communicator_bytes(
            PROFILE.topology,
            2,
            2,
            1,
            PROFILE.nccl_version,
            env=share,
            phase="used",
            uses=[Use("all_reduce", 4 * MIB)],
            parent=parent.breakdown,
            members=(1, 2),
            fixed_overhead_bytes=first.fixed_bytes,
            fixed_overhead_source=first.fixed_source,
        )
        assert child.breakdown == scratch
        children.append(child.breakdown.device_bytes)
    assert children[1] < children[0]  # the second child reused its parent's ring


def test_environments_that_mean_the_same_to_nccl_share_one_breakdown(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model reads the environment only through the settings it makes (``settings_from``): knobs set to
    their defaults price as unset — the very same breakdown, before and after a use — while a knob that
    changes a setting gets its own, equal to pricing it from scratch."""
    import simnccl.comm_memory as comm_memory

    monkeypatch.setattr(comm_memory, "_BREAKDOWNS", {})
    node_of = Cluster(get_gpu_kind("h100-80gb"), 1, 8).node_of
    defaults = {"NCCL_RUNTIME_CONNECT": "1", "NCCL_COMM_SPLIT_SHARE_RESOURCES": "0"}
    unset, spelled = Pricer(PROFILE, node_of).create((0, 1), 0, {}), Pricer(PROFILE, node_of)
    same = spelled.create((0, 1), 0, defaults)
    assert same.breakdown is unset.breakdown
    Pricer(PROFILE, node_of).use(unset, "all_reduce", MIB)
    spelled.use(same, "all_reduce", MIB)
    assert same.breakdown is unset.breakdown
    eager_env = {"NCCL_RUNTIME_CONNECT": "0"}
    eager = Pricer(PROFILE, node_of).create((0, 1), 0, eager_env)
    assert eager.breakdown != unset.breakdown
    scratch = communicator_bytes(
        PROFILE.topology,
        2,
        2,
        1,
        PROFILE.nccl_version,
        env=eager_env,
        fixed_overhead_bytes=spelled.fixed_bytes,
        fixed_overhead_source=spelled.fixed_source,
    )
    assert eager.breakdown == scratch


def test_a_first_use_from_a_breakdown_already_stepped_is_taken_without_pricing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ranks of one class holding the same breakdown step to the same next one on the same kind of first use
    (what the model reads of it: 4 and 64 MiB alike); after the first, a run takes the step without pricing,
    paying the same parts. A first send/recv changes the pricing (exact ranks) and is priced afresh."""
    pricer = Pricer(PROFILE, Cluster(get_gpu_kind("h100-80gb"), 3, 2).node_of)
    world = tuple(range(6))  # ranks 2 and 4: first on a leaf node each, one class
    first, second = (pricer.own(pricer.create(world, r, {}, shareable=True), r) for r in (2, 4))
    assert first.breakdown is second.breakdown
    paid = pricer.use(first, "all_reduce", 4 * MIB)
    priced = []
    real = pricer._priced
    monkeypatch.setattr(pricer, "_priced", lambda *a, **kw: priced.append(1) or real(*a, **kw))
    assert pricer.use(second, "all_reduce", 64 * MIB) == paid
    assert second.breakdown is first.breakdown and priced == []
    assert second.uses[-1] == Use("all_reduce", 64 * MIB)
    pricer.use(second, "send", peer=3)
    assert priced and second.exact


def test_sharing_children_alike_up_to_relabelling_are_priced_once_from_their_parents_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Split children that share their parents' resources depend on the parent only through what the model
    reads of it, numbered as the child numbers its ranks (``Pricer._parent_view``): the first member of four
    pairs, split from four ranks' own communicators of one world that connected the same ring, is priced by one
    model call, and each child still costs exactly what pricing it from its very parent costs."""
    import simnccl.comm_memory as comm_memory

    monkeypatch.setattr(comm_memory, "_BREAKDOWNS", {})
    one_node = Cluster(get_gpu_kind("h100-80gb"), 1, 8)
    pricer = Pricer(PROFILE, one_node.node_of)
    share = {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1", "NCCL_ALGO": "Ring"}
    world = tuple(range(8))
    parents = {rank: pricer.create(world, rank, share) for rank in (0, 2, 4, 6)}
    for parent in parents.values():
        pricer.use(parent, "all_reduce", 4 * MIB)
    calls = []
    real = comm_memory.communicator_bytes
    monkeypatch.setattr(comm_memory, "communicator_bytes", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    children = {
        rank: pricer.create((rank, rank + 1), 0, share, parent=parents[rank], parent_ranks=world) for rank in parents
    }
    assert len(calls) == 1
    for rank, child in children.items():
        scratch = real(
            PROFILE.topology,
            2,
            2,
            1,
            PROFILE.nccl_version,
            env=share,
            rank=0,
            parent=parents[rank].breakdown,
            members=(rank, rank + 1),
            fixed_overhead_bytes=pricer.fixed_bytes,
            fixed_overhead_source=pricer.fixed_source,
        )
        assert child.breakdown == scratch


def test_the_process_cache_is_bounded_and_drops_its_older_half(monkeypatch: pytest.MonkeyPatch) -> None:
    import simnccl.comm_memory as comm_memory

    monkeypatch.setattr(comm_memory, "_BREAKDOWNS", {})
    monkeypatch.setattr(comm_memory, "_BREAKDOWNS_KEPT", 4)
    pricer = Pricer(PROFILE, Cluster(get_gpu_kind("h100-80gb"), 1, 8).node_of)
    priced = [pricer.create(tuple(range(n)), 0, {}) for n in range(1, 8)]  # seven distinct communicators
    shared = comm_memory._breakdowns_of(PROFILE)
    assert 2 <= len(shared) <= 4
    assert [key[0] for key in shared] == sorted(key[0] for key in shared)[-len(shared) :]  # the latest kept
    again = Pricer(PROFILE, Cluster(get_gpu_kind("h100-80gb"), 1, 8).node_of)
    assert [again.create(tuple(range(n)), 0, {}).breakdown for n in range(1, 8)] == [m.breakdown for m in priced]


def test_shared_values_are_one_object_per_value_and_known_again_after_the_table_starts_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``shared_value`` knows a value it already shares by its id, without hashing it; an equal value made later
    gets that one object; when the bounded table starts afresh, the ids it knew go with it."""
    from simnccl.nccl import model

    monkeypatch.setattr(model, "_SHARED", {})
    monkeypatch.setattr(model, "_SHARED_IDS", set())
    monkeypatch.setattr(model, "_SHARED_KEPT", 3)
    first = (1, "a")
    assert model.shared_value(first) is first
    copy = tuple([1, "a"])  # equal, another object
    assert copy is not first and model.shared_value(copy) is first and model.shared_value(first) is first
    values = [(n, "b") for n in range(3)]
    assert [model.shared_value(v) for v in values] == values  # the third one found the table full: afresh
    assert len(model._SHARED) == len(model._SHARED_IDS) <= 3
    assert set(model._SHARED_IDS) == {id(v) for v in model._SHARED}
    later = tuple([1, "a"])
    assert model.shared_value(later) is later  # first went with the old table


def _pair_program(rank: int, destroy: bool) -> list:
    """A nccl-lazy group of 4 on one node whose ranks 0 and 1 exchange one send/recv: torch's lazily made 2-rank
    pair communicator for them (store key ``{group}/p2p-0-1-0``)."""
    ops = [*START, NewGroup(ranks=(0, 1, 2, 3), backend="nccl-lazy", bind="g")]
    if rank in (0, 1):
        ops.append(Send(group="g", peer=1) if rank == 0 else Recv(group="g", peer=0))
    ops.append(Checkpoint(label="a"))
    if destroy:
        ops += [DestroyProcessGroup(group="g"), Checkpoint(label="b")]
    return ops


def test_a_send_recv_pair_communicator_binds_its_nvls_slots_and_gives_them_back() -> None:
    """NCCL sets NVLS up at every init (src/init.cc -> ncclNvlsSetup), not knowing the communicator will only
    send and receive: a 2-rank pair on one NVSwitch node (NCCL >= 2.28.7) binds multicast slots like any
    communicator, the same ledger charges them, and destroying the group frees them with the pair."""
    held = simulate([_pair_program(r, False) for r in range(4)], gpus_per_node=4)
    assert held.verdict == "pass"
    pair = next(name for (rank, name) in held.slots_charged if rank == 0 and "/p2p-0-1" in name)
    assert held.slots_charged[(0, pair)] == held.slots_charged[(1, pair)] == SLOTS
    assert held.multicast_slots == {"n0": 3 * SLOTS}  # the world, g's primary communicator, the 0-1 pair
    memory = next(m for m in held.ranks[0].groups if m.name != "0").comms["cuda"]
    assert list(memory.pair_comms) == [1]
    out = simulate([_pair_program(r, True) for r in range(4)], gpus_per_node=4)
    assert out.verdict == "pass"
    assert out.multicast_slots == {"n0": SLOTS}  # only the world's binding is left


def test_a_send_recv_pair_across_nodes_has_no_nvls_and_no_slots() -> None:
    held = simulate([_pair_program(r, False) for r in range(4)], nodes=4, gpus_per_node=1)
    assert held.verdict == "pass"
    assert not [name for (rank, name), n in held.slots_charged.items() if "/p2p-" in name and n]


def test_a_nodes_class_representative_is_the_first_node_with_its_tree_role() -> None:
    """A member is priced as its class's representative: the first node of the binary tree over the group's
    nodes with the same role (root or not, how many child nodes). Pinned against the definition read literally
    (a scan from node 0), which the one-pass table replaced (that scan was quadratic in the nodes)."""
    from simnccl.comm_memory import _first_node_like

    def scanned(nodes: int, node: int) -> int:
        def role(n: int) -> tuple[bool, int]:
            return n > 0, sum(1 for child in (2 * n + 1, 2 * n + 2) if child < nodes)

        return next(n for n in range(nodes) if role(n) == role(node))

    for nodes in (*range(1, 70), 255, 256, 257):
        assert [_first_node_like(nodes, node) for node in range(nodes)] == [
            scanned(nodes, node) for node in range(nodes)
        ], nodes


def test_a_one_rank_groups_layout_is_the_counted_one_and_its_rank_is_checked_alike() -> None:
    # One-rank groups skip the count per node (a third of a large startup's calls): the same answers, the same errors.
    from simnccl.cluster import ClusterError
    from simnccl.engine import SimConfig
    from simnccl.engine.nvls import MulticastSlots
    from simnccl.engine.sim import Sim

    cluster = Cluster(get_gpu_kind("h100-80gb"), nodes=2, gpus_per_node=8)
    config = SimConfig(
        cluster=cluster,
        release=get_release("2.15"),
        profile=find_profile("h100-80gb", "2.15"),
        programs=[Program(())] * 16,
    )
    slots = MulticastSlots(Sim(config, keep_trace=False))
    counted = slots._layout_of((9, 10))  # counted: two ranks on node 1
    one = slots._layout_of((9,))
    assert one[1:] == (None, 1, (1,), slots._layout_of((3,))[4]) and counted[1:4] == ({1: 2}, 1, (2,))
    pricer = Pricer(config.profile, cluster.node_of, cluster.nodes_of)
    assert pricer._node_sizes((9,)) == (1,) and pricer._node_sizes((9,)) is pricer._node_sizes((2,))
    for bad in ((16,), (-1,), (True,)):
        with pytest.raises(ClusterError):
            slots._layout_of(bad)
        with pytest.raises(ClusterError):
            pricer._node_sizes(bad)
