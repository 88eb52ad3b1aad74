"""The c10d decision model as pure functions: names, membership, split sources, device binding, errors."""

from __future__ import annotations

import hashlib

import pytest

from simnccl.backends import Comm, CommState
from simnccl.c10d import (
    SPLIT_LARGER_THAN_PARENT,
    SPLIT_LARGER_THAN_WORLD,
    Group,
    ProcessContext,
    TorchError,
    group_name_for,
    nccl_device_fallback,
    plan_init,
    plan_new_group,
    plan_split_group,
    split_source,
)
from simnccl.ops import AllReduce, Compute, InitProcessGroup, NewGroup, PgOptions, SetDevice, SplitGroup
from simnccl.release import MISMATCHED_BOUND_DEVICE, Impl, get_release, resolve_backend
from simnccl.testing import simulate

R215 = get_release("2.15")
R214 = get_release("2.14")
NO_OPTS = PgOptions()


def ctx(rank: int = 0, world: int = 4, local: int | None = None, gpus: int = 4, env=None) -> ProcessContext:
    env = {"LOCAL_RANK": str(rank if local is None else local)} if env is None else env
    return ProcessContext(
        rank=rank, world_size=world, local_rank=rank if local is None else local, device_count=gpus, env=env
    )


def world_group(release=R215, backend: str = "nccl", c: ProcessContext | None = None, options=NO_OPTS) -> Group:
    c = c or ctx()
    plan = plan_init(release, c, backend, None, None, options)
    group = Group(plan.name, plan.desc, plan.ranks, c.rank, plan.backend, plan.bound_device, plan.timeout_s, options)
    for comm_plan in plan.comms:
        comm = Comm(comm_plan.pair.impl, "0", len(plan.ranks), comm_plan.device, lazy_init=options.lazy_init)
        if comm_plan.eager:
            comm.state = CommState.READY
            comm.comm_id = 1
        group.comms[comm_plan.pair.device_type] = comm
    return group


def new_group(
    world: Group,
    ranks,
    c=None,
    release=R215,
    backend=None,
    options=NO_OPTS,
    local_sync=False,
    counter: int = 1,
    device_id=None,
):
    return plan_new_group(
        release, c or ctx(), world, counter, ranks, backend, options, local_sync, None, device_id, None
    )


def test_a_plan_and_its_communicator_plans_cannot_be_changed_once_made() -> None:
    """Members of one rank class share plan pieces (``relabel_member_plan`` builds each member's from one
    template): a plan changed in place would change every member's, so no field of either can be set."""
    plan = new_group(world_group(), (0, 1))
    assert plan.member and plan.comms
    with pytest.raises(AttributeError):
        plan.rank_in_group = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        plan.comms[0].device = 2  # type: ignore[misc]


def test_group_names_are_the_counter_or_a_sha1_of_ranks_and_counter() -> None:
    assert group_name_for(3, (0, 1), False) == "3"
    expected = hashlib.sha1(b"0_1_3").hexdigest()
    assert group_name_for(3, (0, 1), True) == expected


def test_2_15_world_is_bound_by_the_nccl2_fallback_so_new_group_splits() -> None:
    world = world_group()
    assert world.bound_device == 0
    member = new_group(world, (0, 1))
    assert member.member and member.comms[0].split_from is world.comms["cuda"]
    outsider = new_group(world, (2, 3))
    assert not outsider.member and outsider.nocolor_split_on is world.comms["cuda"]


def test_legacy_world_is_unbound_so_new_group_bootstraps_fresh_and_lazily() -> None:
    world = world_group(c=ctx(env={"LOCAL_RANK": "0", "TORCH_DIST_USE_NCCL2": "0"}))
    assert world.bound_device is None
    plan = new_group(world, (0, 1), c=ctx(env={"TORCH_DIST_USE_NCCL2": "0"}))
    (comm,) = plan.comms
    assert comm.pair.impl is Impl.LEGACY and comm.split_from is None and not comm.eager
    assert new_group(world, (2, 3), c=ctx(env={"TORCH_DIST_USE_NCCL2": "0"})).nocolor_split_on is None


def test_split_source_requires_the_same_backend_name_on_2_15_but_not_2_14() -> None:
    world = world_group()
    assert split_source(R215, world, resolve_backend(R215, "nccl2", {}), NO_OPTS) is None
    assert split_source(R215, world, resolve_backend(R215, "nccl", {}), NO_OPTS) is world.comms["cuda"]
    assert split_source(R215, world, resolve_backend(R215, "nccl", {}), PgOptions(lazy_init=True)) is None
    # A different name creates a fresh communicator, and non-members then issue no NOCOLOR split.
    fresh = new_group(world, (0, 1), backend="nccl-lazy")
    assert fresh.comms[0].split_from is None and fresh.comms[0].eager
    assert new_group(world, (2, 3), backend="nccl-lazy").nocolor_split_on is None


def test_a_lazy_init_default_group_is_no_split_source_until_used() -> None:
    world = world_group(options=PgOptions(lazy_init=True))
    assert world.comms["cuda"].state is CommState.UNINITIALIZED
    assert split_source(R215, world, world.backend, NO_OPTS) is None


def test_nccl_lazy_split_children_are_plain_nccl2() -> None:
    world = world_group(backend="nccl-lazy")
    (comm,) = new_group(world, (0, 1)).comms
    assert comm.split_from is not None and comm.pair.impl is Impl.NCCL2


def test_local_synchronization_non_members_return_early_without_a_name() -> None:
    world = world_group()
    plan = new_group(world, (2, 3), local_sync=True, counter=5)
    assert not plan.member and plan.counter_advance == 0 and plan.nocolor_split_on is None
    member = new_group(world, (0, 1), local_sync=True, counter=5)
    assert member.name == group_name_for(5, (0, 1), True) and member.counter_advance == 1


@pytest.mark.parametrize(
    ("ranks", "type_name", "text"),
    [
        ((0, 0), "ValueError", "ranks list must not contain duplicate entries, got [0, 0]"),
        ((0, 7), "ValueError", "Rank 7 is out of range. Valid ranks are 0 to 3 (world_size=4)"),
        ((0, 1, 2, 3, 4), "ValueError", "the new group's world size should be less or equal"),
        ((), "AssertionError", "Group rank must be specified for group members"),
    ],
)
def test_new_group_rank_errors_use_torchs_texts(ranks, type_name, text) -> None:
    with pytest.raises(TorchError) as err:
        new_group(world_group(), ranks)
    assert err.value.type_name == type_name and text in err.value.message


def test_device_id_mismatch_with_the_default_group_is_torchs_assertion() -> None:
    with pytest.raises(TorchError, match="Mismatched bound device") as err:
        new_group(world_group(), (0, 1), device_id=3)
    assert err.value.message == MISMATCHED_BOUND_DEVICE


def test_device_fallback_prefers_local_rank() -> None:
    assert nccl_device_fallback(ctx(rank=6, local=2, gpus=4), {"LOCAL_RANK": "2"}) == 2
    assert nccl_device_fallback(ctx(rank=6, local=2, gpus=4), {}) == 2  # 6 % 4
    assert nccl_device_fallback(ctx(rank=5, local=1, gpus=8), {}) == 5


def test_device_id_out_of_range_message() -> None:
    with pytest.raises(TorchError) as err:
        plan_init(R215, ctx(gpus=2), "nccl", 3, None, NO_OPTS)
    assert err.value.message == (
        "device_id cuda:3 is out of range. Please use a device index less than the number of accelerators available: 2."
    )


def test_lazy_init_is_unknown_before_2_15() -> None:
    with pytest.raises(TorchError, match="lazy_init"):
        plan_init(R214, ctx(), "nccl", None, None, PgOptions(lazy_init=True))


def test_2_15_default_timeouts_follow_the_backend_name() -> None:
    assert plan_init(R215, ctx(), "nccl-lazy", None, None, NO_OPTS).timeout_s == 600
    assert plan_init(R214, ctx(), "nccl-lazy", None, None, NO_OPTS).timeout_s == 1800
    assert plan_init(R215, ctx(), "gloo", None, None, NO_OPTS).timeout_s == 1800


def test_split_group_names_hash_the_own_split_and_non_members_join_with_nocolor() -> None:
    world = world_group()
    mine = plan_split_group(R215, ctx(rank=0), 4, world, ((1, 0), (2,)), NO_OPTS, None, None)
    assert mine.member and mine.ranks == (1, 0) and mine.name == group_name_for(4, (1, 0), True)
    world3 = world_group(c=ctx(rank=3))
    outsider = plan_split_group(R215, ctx(rank=3), 4, world3, ((1, 0), (2,)), NO_OPTS, None, None)
    assert not outsider.member and outsider.nocolor_split_on is world3.comms["cuda"]
    assert outsider.name == group_name_for(4, (1, 0), True)  # a rank in no split names split_ranks[0]
    with pytest.raises(TorchError, match="cannot have duplicate ranks"):
        plan_split_group(R215, ctx(rank=0), 4, world, ((1, 1, 0),), NO_OPTS, None, None)


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_split_group_without_a_desc_names_the_child_parent_desc_split_n(backend: str) -> None:
    # C++ ProcessGroup::splitGroup; real gloo (2 ranks): default_pg:split:0, an explicit desc counts nothing,
    # then :split:1 on both ranks, the one left out of the first split included.
    world, world1 = world_group(backend=backend), world_group(backend=backend, c=ctx(rank=1))
    first = plan_split_group(R215, ctx(rank=0), 4, world, ((0,),), NO_OPTS, None, None)
    plan_split_group(R215, ctx(rank=1), 4, world1, ((0,),), NO_OPTS, None, None)  # rank 1 is in no split
    assert first.desc == "default_pg:split:0"
    assert plan_split_group(R215, ctx(rank=0), 5, world, ((0, 1),), NO_OPTS, "given", None).desc == "given"
    again = plan_split_group(R215, ctx(rank=0), 6, world, ((0, 1),), NO_OPTS, None, None)
    assert again.desc == plan_split_group(R215, ctx(rank=1), 6, world1, ((0, 1),), NO_OPTS, None, None).desc
    assert again.desc == "default_pg:split:1"
    # planning one call again (a cohort that gave the call back to the ordinary path) counts it once
    assert plan_split_group(R215, ctx(rank=0), 6, world, ((0, 1),), NO_OPTS, None, None).desc == again.desc


@pytest.mark.parametrize("shared", [True, False], ids=["cohort-block", "rank-by-rank"])
def test_a_legacy_split_group_without_a_desc_is_named_after_the_parents_ncclcommsplit_count(shared: bool) -> None:
    # distributed_c10d.py:6889-6890: legacy's comm_split_count(), the ncclCommSplit calls this rank's parent
    # communicator made (NCCLComm::split counts each on its source): new_group splits and NOCOLOR splits count, a
    # split_group with a desc too. One op list for every rank takes the calls as one cohort block; distinct
    # lists take them rank by rank: both must count alike.
    program = [
        SetDevice(),
        InitProcessGroup(backend="nccl-legacy", device_id=0),  # bound: every group below splits the world
        NewGroup(ranks=(0, 1), bind="a"),  # rank 2 joins with NOCOLOR
        NewGroup(ranks=(1, 2), bind="b"),
        SplitGroup(split_ranks=((0, 1, 2),), bind="s"),
        SplitGroup(split_ranks=((0,),), group_desc="given"),
        SplitGroup(split_ranks=((0, 1, 2),), bind="t"),
    ]
    out = simulate(program if shared else [list(program) for _ in range(3)], nodes=3, gpus_per_node=1)
    assert out.verdict == "pass"
    descs = {(rt.handles["s"].desc, rt.handles["t"].desc) for rt in out.ranks}
    assert descs == {("default_pg:split:2", "default_pg:split:4")}


def test_communicators_share_one_empty_peer_table_until_their_own_first_send() -> None:
    """A world-wide startup makes millions of communicators that never send: they share one read-only empty
    table (an empty dict each was ~6% of the engine's memory). A send gives that communicator tables of its own,
    never touching the shared one or another communicator's."""
    first, second = (Comm(impl=Impl.NCCL2, group="g", size=2, device=0) for _ in range(2))
    assert first.pair_comms is second.pair_comms and first.p2p_seq is second.p2p_seq and not first.pair_comms
    first.add_pair(1, 7)
    assert [first.next_p2p_seq(0, 1), first.next_p2p_seq(0, 1), first.next_p2p_seq(1, 0)] == [1, 2, 1]
    assert dict(first.pair_comms) == {1: 7} and dict(first.p2p_seq) == {(0, 1): 2, (1, 0): 1}
    assert not second.pair_comms and not second.p2p_seq and second.next_p2p_seq(0, 1) == 1
    assert not Comm(impl=Impl.NCCL2, group="h", size=2, device=0).p2p_seq  # the shared table stayed empty
    with pytest.raises(TypeError):
        Comm(impl=Impl.NCCL2, group="h", size=2, device=0).pair_comms[1] = 2  # type: ignore[index]


def test_split_group_children_take_the_backends_default_timeout_not_the_parents() -> None:
    # torch l.6964: _get_default_timeout(parent backend name); real gloo: a 7 s or 3600 s parent, a 0:30:00 child.
    world = world_group()
    world.timeout_s = 7200.0
    assert plan_split_group(R215, ctx(), 4, world, ((0, 1),), NO_OPTS, None, None).timeout_s == 600
    assert plan_split_group(R215, ctx(), 4, world, ((0, 1),), NO_OPTS, None, 42.0).timeout_s == 42
    gloo = world_group(backend="gloo")
    gloo.timeout_s = 7.0
    assert plan_split_group(R215, ctx(), 4, gloo, ((0, 1),), NO_OPTS, None, None).timeout_s == 1800


def test_a_late_rank_on_a_split_child_of_a_long_timeout_world_times_out_at_the_nccl_default() -> None:
    # The child's 600 s, not the world's 7200 s: rank 1 arriving at 1000 s is too late.
    split = SplitGroup(split_ranks=((0, 1),), bind="g")
    start = [SetDevice(), InitProcessGroup(timeout_s=7200), split]
    out = simulate([[*start, AllReduce(group="g")], [*start, Compute(seconds=1000), AllReduce(group="g")]])
    assert out.verdict != "pass"
    assert out.errors[0]["rank"] == 0 and out.errors[0]["kind"] == "timeout"
    assert "Timeout(ms)=600000" in out.errors[0]["message"]


@pytest.mark.parametrize("device_id", [1, "cuda:1"])
def test_init_without_a_backend_but_with_a_cuda_device_id_is_nccl(device_id) -> None:
    # torch l.2632-2635: default_device_backend_map["cuda"] = "nccl": get_backend() == "nccl", 10 minutes.
    plan = plan_init(R215, ctx(), None, device_id, None, NO_OPTS)
    assert plan.backend.requested == "nccl" and plan.timeout_s == 600
    assert plan.bound_device == 1 and [c.pair.impl for c in plan.comms] == [Impl.NCCL2]


def test_init_without_a_backend_but_with_a_cpu_device_id_is_gloo() -> None:
    plan = plan_init(R215, ctx(gpus=0), None, "cpu:0", None, NO_OPTS)
    assert plan.backend.requested == "gloo" and plan.timeout_s == 1800
    assert [c.pair.impl for c in plan.comms] == [Impl.GLOO]


def test_init_without_a_backend_or_device_id_is_undefined_with_the_30_minute_default() -> None:
    plan = plan_init(R215, ctx(), None, None, None, NO_OPTS)
    assert plan.backend.requested == "undefined" and plan.timeout_s == 1800
    assert [(c.pair.name, c.pair.impl) for c in plan.comms] == [("nccl", Impl.NCCL2)]


def test_a_split_child_of_an_unbound_legacy_parent_is_a_communicator_on_the_guessed_device() -> None:
    # legacy ProcessGroupNCCL::split: supportsSplitting() is true and the child connects eagerly on
    # guessDeviceId(): the device the parent's communicator was made on, else global rank % GPU count.
    world = world_group(backend="nccl-legacy", c=ctx(rank=1))
    assert world.bound_device is None
    world.comms["cuda"].state = CommState.READY  # its first collective made it, on cuda:3
    world.comms["cuda"].device = 3
    plan = plan_split_group(R215, ctx(rank=1), 4, world, ((0, 1),), NO_OPTS, None, None)
    assert plan.bound_device is None and [c.device for c in plan.comms] == [3]
    world.comms["cuda"].device = None
    plan = plan_split_group(R215, ctx(rank=1), 4, world, ((0, 1),), NO_OPTS, None, None)
    assert [c.device for c in plan.comms] == [1]


def test_a_collective_on_a_split_child_of_an_unbound_legacy_world_runs_and_is_charged() -> None:
    start = [SetDevice(), InitProcessGroup(backend="nccl-legacy"), AllReduce()]
    program = [*start, SplitGroup(split_ranks=((0, 1),), bind="g"), AllReduce(group="g")]
    out = simulate([program, program])
    assert out.verdict == "pass"
    child = next(g for g in out.groups.values() if g.via_split)
    assert all(m["bytes"] > 0 for m in child.members.values())


def test_a_collective_on_a_split_child_of_an_unbound_2_14_nccl2_world_runs_on_the_parents_device() -> None:
    # 2.14's nccl2 binds no device without device_id; its first collective makes the communicator, which
    # ncclCommSplit splits on its own device. The child had no device, and its collective crashed the simulator.
    start = [SetDevice(), InitProcessGroup(), AllReduce()]
    program = [*start, SplitGroup(split_ranks=((0, 1),), bind="g"), AllReduce(group="g")]
    out = simulate([program, program], release="2.14", env={"TORCH_DIST_USE_NCCL2": "1"})
    assert out.verdict == "pass"
    child = next(g for g in out.groups.values() if g.via_split)
    assert all(m["bytes"] > 0 for m in child.members.values())


@pytest.mark.parametrize("device_id", ["cpu:0", 1])
def test_a_device_bound_gloo_world_is_a_split_source_that_cannot_nocolor_split(device_id) -> None:
    c = ctx(rank=3)
    plan = plan_init(R215, c, "gloo", device_id, None, NO_OPTS)
    world = Group(plan.name, plan.desc, plan.ranks, 3, plan.backend, plan.bound_device, plan.timeout_s, NO_OPTS)
    world.bound_cpu = plan.bound_cpu
    world.comms["cuda"] = Comm(Impl.GLOO, "0", 4, None)
    world.comms["cuda"].state = CommState.READY
    with pytest.raises(TorchError) as err:
        new_group(world, (0, 1), c=c)
    assert err.value.type_name == "AttributeError" and "perform_nocolor_split" in err.value.message
    member = new_group(world, (2, 3), c=c)  # gloo's creator ignores split_from: a fresh bootstrap
    assert member.member and [cp.split_from for cp in member.comms] == [None]


def test_new_group_device_id_on_an_unbound_default_group_binds_the_new_group() -> None:
    # torch l.7170-7175: the mismatch is checked only against a bound default group; the new group is bound to
    # device_id (l.3044), and legacy connects it eagerly there (l.3204).
    world = world_group(release=R215, backend="nccl-legacy")
    assert world.bound_device is None
    plan = new_group(world, (0, 1), device_id=2)
    assert plan.bound_device == 2 and [(c.device, c.eager) for c in plan.comms] == [(2, True)]
    assert not new_group(world, (1, 2), device_id=2).member  # a non-member: no split source, no error


def test_new_group_device_id_on_a_cpu_bound_default_group_is_a_mismatch() -> None:
    plan = plan_init(R215, ctx(gpus=0), "gloo", "cpu:0", None, NO_OPTS)
    world = Group(plan.name, plan.desc, plan.ranks, 0, plan.backend, plan.bound_device, plan.timeout_s, NO_OPTS)
    world.bound_cpu = plan.bound_cpu
    with pytest.raises(TorchError, match="Mismatched bound device"):
        new_group(world, (0, 1), c=ctx(gpus=0), device_id=0)


def test_a_cpu_device_id_without_an_index_is_torchs_value_error() -> None:
    # torch l.2966 (real gloo: device_id=torch.device("cpu") fails init on every rank with this text)
    for backend in ("gloo", None):
        with pytest.raises(TorchError) as err:
            plan_init(R215, ctx(gpus=0), backend, "cpu", None, NO_OPTS)
        assert err.value.type_name == "ValueError"
        assert err.value.message == (
            "init_process_group device_id parameter must be a device with a valid index, e.g. cpu:0 or cuda:0"
        )


@pytest.mark.parametrize("ranks", [(0, 0, 9), ()])
def test_local_synchronization_non_members_return_before_the_ranks_are_validated(ranks) -> None:
    # torch l.7206 (real gloo, world 3, ranks [0, 0, 9]: rank 0 raises the duplicate error, ranks 1 and 2 get -100)
    world = world_group(c=ctx(rank=1))
    plan = new_group(world, ranks, c=ctx(rank=1), local_sync=True)
    assert not plan.member and plan.counter_advance == 0 and plan.nocolor_split_on is None
    if ranks:
        with pytest.raises(TorchError, match="must not contain duplicate entries"):
            new_group(world_group(), ranks, local_sync=True)


GLOO_PAIR = [InitProcessGroup(backend="gloo"), NewGroup(ranks=(0, 1), bind="g")]


def test_a_gloo_split_naming_a_rank_its_parent_lacks_waits_for_it() -> None:
    """split_ranks are ranks of the parent: [0, 2] of a 2-rank parent names nobody. torch checks its size only;
    rank 0 waits in the child's full mesh (real 2.15 gloo: until the split's timeout), rank 1 is in no split. The
    simulator raised a ValueError of its own (real compare: sim error, real hang)."""
    split = SplitGroup(parent="g", split_ranks=((0, 2),), bind="s")
    out = simulate([[*GLOO_PAIR, split], [*GLOO_PAIR, split], GLOO_PAIR], gpus_per_node=3, release="2.15")
    assert out.verdict == "hang" and out.errors == []
    assert [h["rank"] for h in out.hangs] == [0]
    assert "split ranks [2] name no rank of the parent group of size 2" in out.hangs[0]["explanation"]


@pytest.mark.parametrize(
    ("world", "splits", "error"),
    [
        # torch's Python check, against init_process_group's world: every rank up to its own split
        (2, ((0, 1, 2),), ("ValueError", SPLIT_LARGER_THAN_WORLD)),
        # C++ ProcessGroup::splitGroup's, against the parent group's size, on every parent rank
        (3, ((0, 1, 2),), ("RuntimeError", SPLIT_LARGER_THAN_PARENT)),
    ],
)
def test_a_split_larger_than_the_world_or_its_parent_raises_torchs_error(world: int, splits, error) -> None:
    split = SplitGroup(parent="g", split_ranks=splits, bind="s")
    programs = [[*GLOO_PAIR, split], [*GLOO_PAIR, split], *([GLOO_PAIR] * (world - 2))]
    out = simulate(programs, gpus_per_node=world, release="2.15")
    assert {(e["rank"], e["type"], e["message"]) for e in out.errors} == {(r, *error) for r in (0, 1)}


def test_a_gloo_group_under_a_bound_2_14_nccl_world_is_gloo_on_both_device_types() -> None:
    """2.14 finds the default group's NCCL communicator as a split source whatever the new group's backend; gloo's
    creator ignores it (its members bootstrap fresh). The plan made the gloo group's cuda side an NCCL split child:
    a CPU-side all_gather of vLLM's cpu group on a rank whose current device was not its bound one failed with
    legacy's "backend constrained to cuda:1"."""
    programs = [
        [
            InitProcessGroup(backend="cpu:gloo,cuda:nccl", device_id=rank),
            NewGroup(ranks=(0, 1), bind="g", backend="gloo"),
            SetDevice(device=0),
            AllReduce(group="g", size_bytes=8),
        ]
        for rank in range(2)
    ]
    out = simulate(programs, nodes=1, gpus_per_node=2, release="2.14")
    assert out.verdict == "pass", out.errors
    assert {g.impl for g in out.groups.values() if g.name != "0"} == {"gloo"}
