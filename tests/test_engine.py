"""Engine behaviour: memory timing per lifecycle, hangs and their explanations, errors with torch's texts."""

from __future__ import annotations

import pytest

from simnccl.comm_memory import one_node_mib
from simnccl.engine import EngineGuardError, Limits
from simnccl.explain import explain
from simnccl.nccl import communicator_bytes
from simnccl.ops import (
    WORLD,
    Alloc,
    AllReduce,
    Broadcast,
    Checkpoint,
    Compute,
    DestroyProcessGroup,
    InitProcessGroup,
    MemoryCheck,
    NewGroup,
    Op,
    PgOptions,
    Raise,
    Recv,
    Send,
    SetDevice,
    SplitGroup,
)
from simnccl.profiles import find_profile
from simnccl.release import LEGACY_NO_CUDA, NCCL2_NO_CUDA, NO_SPLIT_PARENT, SPLIT_PARENT_NOT_INITIALIZED
from simnccl.result import VariantResult
from simnccl.testing import simulate, used_mib

START = [SetDevice(), InitProcessGroup(backend="nccl")]
LEGACY = {"TORCH_DIST_USE_NCCL2": "0"}


def costs(gpu: str = "h100-80gb", release: str = "2.15"):
    """The profile's measured overheads (comm_fixed_mib, process_mib, process_first_collective_mib)."""
    return find_profile(gpu, release).comm


def model_mib(
    uses: tuple[str, ...] = (), nranks: int = 2, gpu: str = "h100-80gb", env: dict | None = None, **kw
) -> float:
    """One communicator's device MiB as NCCL's mechanics price it, with the profile's per-communicator overhead:
    at init (no ``uses``) or after the first call of each of ``uses``."""
    return one_node_mib(find_profile(gpu, "2.15"), nranks, env, uses, **kw)


def connect_mib(uses: tuple[str, ...], **kw) -> float:
    """What the first call of each of ``uses`` adds to an initialised communicator."""
    return model_mib(uses, **kw) - model_mib((), **kw)


def comm_mib(outcome, rank: int = 0) -> float:
    ledger = next(iter(outcome.ledgers.values())) if rank == 0 else list(outcome.ledgers.values())[rank]
    return ledger.used_by_kind().get("comm", 0) / 2**20


# ------------------------------------------------------------------------------------------- memory timing


def test_nccl2_charges_every_group_at_creation_and_legacy_at_first_use() -> None:
    program = [
        *START,
        Checkpoint(label="a"),
        *[NewGroup(ranks=(0, 1), bind=f"g{i}") for i in range(3)],
        Checkpoint(label="b"),
        *[AllReduce(group=f"g{i}") for i in range(3)],
        Checkpoint(label="c"),
    ]
    c = costs()
    nccl2 = simulate(program)
    legacy = simulate(program, env=LEGACY)
    delta = {k: used_mib(nccl2, "b")[k] - used_mib(nccl2, "a")[k] for k in used_mib(nccl2, "a")}
    assert all(v == pytest.approx(3 * model_mib(), abs=0.01) for v in delta.values())
    assert used_mib(legacy, "b") == used_mib(legacy, "a")
    # legacy pays init + connect at the first collective (and the process's first-communicator cost: its world
    # group is never used); nccl2 only the connect, having paid init already. Both pay the process's first
    # collective once.
    legacy_c = used_mib(legacy, "c")["n0:cuda:0"] - used_mib(legacy, "b")["n0:cuda:0"]
    nccl2_c = used_mib(nccl2, "c")["n0:cuda:0"] - used_mib(nccl2, "b")["n0:cuda:0"]
    first = c.process_first_collective_mib
    assert legacy_c == pytest.approx(c.process_mib + first + 3 * model_mib(("all_reduce",)), abs=0.01)
    assert nccl2_c == pytest.approx(first + 3 * connect_mib(("all_reduce",)), abs=0.01)


def test_share_resources_makes_split_children_cheap() -> None:
    program = [*START, Checkpoint(label="a"), NewGroup(ranks=(0, 1), bind="g"), Checkpoint(label="b")]
    share = {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}
    profile = find_profile("h100-80gb", "2.15")
    parent = communicator_bytes(profile.topology, 2, 2, 1, profile.nccl_version, env=share)
    for env in (share, {}):
        out = simulate(program, env=env)
        delta = used_mib(out, "b")["n0:cuda:0"] - used_mib(out, "a")["n0:cuda:0"]
        expected = model_mib(env=env, parent=parent) if env else model_mib()
        assert delta == pytest.approx(expected, abs=0.01)
    assert model_mib(env=share, parent=parent) < model_mib() - 90  # 132 vs 230 MiB: no peer tables, no NVLS


def test_lazy_init_group_that_never_communicates_allocates_nothing() -> None:
    lazy = NewGroup(ranks=(0, 1), bind="g", pg_options=PgOptions(lazy_init=True))
    out = simulate([*START, Checkpoint(label="a"), lazy, Checkpoint(label="b")])
    assert used_mib(out, "a") == used_mib(out, "b")
    used = simulate([*START, lazy, Checkpoint(label="a"), AllReduce(group="g"), Checkpoint(label="b")])
    c = costs()
    delta = used_mib(used, "b")["n0:cuda:0"] - used_mib(used, "a")["n0:cuda:0"]
    assert delta == pytest.approx(model_mib(("all_reduce",)) + c.process_first_collective_mib, abs=0.01)


def test_nccl_runtime_connect_0_moves_connection_buffers_to_init() -> None:
    program = [*START, Checkpoint(label="a"), NewGroup(ranks=(0, 1), bind="g"), Checkpoint(label="b")]
    off = {"NCCL_RUNTIME_CONNECT": "0"}
    out = simulate(program, env=off)
    delta = used_mib(out, "b")["n0:cuda:0"] - used_mib(out, "a")["n0:cuda:0"]
    assert delta == pytest.approx(model_mib(env=off), abs=0.01)
    # every algorithm and the NET shared pool at init: more than what the first all_reduce connects lazily
    assert model_mib(env=off) > model_mib(("all_reduce",)) + 500


def test_2_14_nccl2_opt_in_is_lazy_without_device_id() -> None:
    program = [*START, Checkpoint(label="a"), NewGroup(ranks=(0, 1), bind="g"), Checkpoint(label="b")]
    out = simulate(program, release="2.14", env={"TORCH_DIST_USE_NCCL2": "1"})
    assert out.verdict == "pass"
    assert used_mib(out, "a") == used_mib(out, "b")
    assert out.ranks[0].world.comms["cuda"].impl.value == "nccl2"


def test_destroy_process_group_frees_communicator_memory() -> None:
    program = [
        *START,
        NewGroup(ranks=(0, 1), bind="g"),
        AllReduce(group="g"),
        Checkpoint(label="a"),
        DestroyProcessGroup(group="g"),
        Checkpoint(label="b"),
        DestroyProcessGroup(),
        Checkpoint(label="c"),
    ]
    out = simulate(program)
    freed = used_mib(out, "a")["n0:cuda:0"] - used_mib(out, "b")["n0:cuda:0"]
    assert freed == pytest.approx(model_mib(("all_reduce",)), abs=0.01)
    ledger = out.ledgers["n0:cuda:0"]
    # what stays is the process's, not a communicator's (NCCL's kernels and state outlive its communicators)
    c = costs()
    held = {owner.phase: n / 2**20 for owner, n in ledger.by_owner.items() if owner.kind == "comm"}
    assert held == pytest.approx(
        {"process-first-comm": c.process_mib, "process-first-collective": c.process_first_collective_mib}, abs=0.01
    )


def test_single_rank_groups_use_the_single_rank_cost_and_first_comm_overhead() -> None:
    out = simulate(
        [*START, Checkpoint(label="a"), NewGroup(ranks=(0,), bind="s"), Checkpoint(label="b")],
        gpu="rtx3060-12gb",
        gpus_per_node=1,
    )
    c = costs("rtx3060-12gb")
    at_a = used_mib(out, "a")["n0:cuda:0"]
    assert at_a == pytest.approx(114 + c.process_mib + 388, abs=0.01)  # sglang PR #35538: 584 MiB
    assert used_mib(out, "b")["n0:cuda:0"] - at_a == pytest.approx(388, abs=0.01)
    assert model_mib(nranks=1, gpu="rtx3060-12gb") == 388


# ------------------------------------------------------------------------------------------- p2p


def test_nccl_lazy_creates_a_pair_communicator_at_the_first_send_recv() -> None:
    program = [
        [
            SetDevice(),
            InitProcessGroup(backend="nccl-lazy"),
            Checkpoint(label="a"),
            Send(peer=1),
            Send(peer=1),
            Checkpoint(label="b"),
        ],
        [
            SetDevice(),
            InitProcessGroup(backend="nccl-lazy"),
            Checkpoint(label="a"),
            Recv(peer=0),
            Recv(peer=0),
            Checkpoint(label="b"),
        ],
    ]
    out = simulate(program)
    assert out.verdict == "pass"
    c = costs()
    # a fresh 2-rank communicator, connected in the direction each rank uses it (the sender's side, the receiver's)
    for device, call in (("n0:cuda:0", "send"), ("n0:cuda:1", "recv")):
        pair = model_mib((call,)) + c.process_first_collective_mib
        assert used_mib(out, "b")[device] - used_mib(out, "a")[device] == pytest.approx(pair, abs=0.01)


def test_nccl_lazy_first_send_is_a_rendezvous_with_the_peer() -> None:
    program = [
        [SetDevice(), InitProcessGroup(backend="nccl-lazy"), Send(peer=1)],
        [SetDevice(), InitProcessGroup(backend="nccl-lazy"), Compute(seconds=1.0)],
    ]
    out = simulate(program)
    assert out.verdict == "hang"
    (hang,) = out.hangs
    assert hang["rank"] == 0 and hang["waiting_for"] == [1]
    assert "rank 1 finished its program without joining" in hang["explanation"]


def _lazy_pairs_then_group_0_2(*earlier: tuple[int, int]) -> list[list[Op]]:
    """World of 4 on nccl-lazy, then new_group([0, 2]) (nccl-lazy, lazy_init: a fresh nccl-lazy group, not a split
    nccl2 child; timeout 120 s) where global 0 sends to global 2, group ranks 0 and 1. Before it, each pair in
    ``earlier`` makes a pair communicator, global ranks: in the world when ``(0, 1)``, else in a new_group of
    the two (also ``(0, 1)`` in group ranks)."""
    programs: list[list[Op]] = [[SetDevice(), InitProcessGroup(backend="nccl-lazy")] for _ in range(4)]
    options = PgOptions(lazy_init=True)
    for i, (a, b) in enumerate(earlier):
        handle = WORLD
        if (a, b) != (0, 1):
            handle = f"e{i}"
            for program in programs:
                program.append(NewGroup((a, b), backend="nccl-lazy", bind=handle, pg_options=options))
        programs[a].append(Send(peer=b, group=handle))
        programs[b].append(Recv(peer=a, group=handle))
    for program in programs:
        program.append(NewGroup((0, 2), backend="nccl-lazy", bind="g", timeout_s=120, pg_options=options))
    programs[0].append(Send(peer=2, group="g"))
    programs[2].append(Recv(peer=0, group="g"))
    return programs


def test_nccl_lazy_pair_names_differ_when_the_ranks_process_wide_counters_differ() -> None:
    """torch 2.15's LazyBackend names a pair '<group>/p2p-<lo>-<hi>-<n>' of group ranks, n from nextPairAttempt: a
    process-wide static keyed by the two group ranks alone, shared by every group. Global 0 made a (0, 1) pair in
    the world, global 2 none: in group [0, 2] (group ranks 0, 1 again) rank 0 publishes under '1/p2p-0-1-1' and
    rank 2 reads '1/p2p-0-1-0', so rank 2 times out in the store after the group's timeout and rank 0 stays in
    ncclCommInitRank. The simulator used to count attempts per group, and passed."""
    out = simulate(_lazy_pairs_then_group_0_2((0, 1)), gpus_per_node=4)
    assert out.verdict == "hang"
    (error,) = out.errors
    assert (error["rank"], error["kind"], error["type"]) == (2, "timeout", "torch.distributed.DistStoreError")
    assert error["message"] == (
        "wait timeout after 120000ms, keys: /default_pg/1//cuda//1/p2p-0-1-0/1/p2p-0-1-0/nccl_storekey_0"
    )
    hangs = {h["rank"]: h for h in out.hangs}
    assert (hangs[0]["group"], hangs[2]["group"]) == ("1/p2p-0-1-1", "1/p2p-0-1-0")
    assert hangs[0]["timeout_s"] is None and "ncclCommInitRank" in hangs[0]["watchdog"]
    assert out.ranks[0].status == "blocked"
    for rank in (0, 2):
        assert "rank 0 (pair rank 0, which publishes the unique id) '1/p2p-0-1-1'" in hangs[rank]["explanation"]
        assert "rank 2 (pair rank 1, which reads it) '1/p2p-0-1-0'" in hangs[rank]["explanation"]
        assert "LazyBackend::nextPairAttempt" in hangs[rank]["explanation"]
    text = explain(VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", out))
    assert "LazyBackend::nextPairAttempt" in text and "Circular wait" not in text


def test_nccl_lazy_pair_names_agree_when_both_ranks_made_as_many_earlier_pairs() -> None:
    """Global 0 made its (0, 1) pair in the world and global 2 its own in group [2, 3] (group ranks 0, 1 too):
    both counters stand at 1, so both name the pair '2/p2p-0-1-1' ([0, 2] is group '2', made after [2, 3])."""
    out = simulate(_lazy_pairs_then_group_0_2((0, 1), (2, 3)), gpus_per_node=4)
    assert out.verdict == "pass" and not out.errors


def test_a_nccl_lazy_pair_of_a_subgroup_is_named_by_its_group_ranks() -> None:
    """Global ranks 1 and 2 are group ranks 0 and 1 of new_group([1, 2]): the pair is '1/p2p-0-1-0', as
    LazyBackend names it, not '1/p2p-1-2-0'."""
    options = PgOptions(lazy_init=True)
    head = [SetDevice(), InitProcessGroup(backend="nccl-lazy"), NewGroup((1, 2), bind="g", pg_options=options)]
    out = simulate([head, [*head, Send(peer=2, group="g")], head], gpus_per_node=3)
    assert out.verdict == "hang"
    (hang,) = out.hangs
    assert (hang["rank"], hang["group"], hang["waiting_for"]) == (1, "1/p2p-0-1-0", [2])


def test_a_peer_that_raised_with_an_empty_message_is_named_by_its_type_in_the_hang_report() -> None:
    # a bare ``assert`` raises AssertionError with no message: the report's first line of it raised IndexError
    out = simulate(
        [[InitProcessGroup(backend="gloo"), AllReduce(size_bytes=96)], [InitProcessGroup(backend="gloo"), Raise()]]
    )
    (hang,) = out.hangs
    assert hang["explanation"] == "rank 1 raised AssertionError"


def test_nccl2_send_recv_ride_the_group_communicator() -> None:
    program = [
        [*START, Checkpoint(label="a"), Send(peer=1), Checkpoint(label="b")],
        [*START, Checkpoint(label="a"), Recv(peer=0), Checkpoint(label="b")],
    ]
    out = simulate(program)
    c = costs()
    assert out.verdict == "pass"
    assert used_mib(out, "b")["n0:cuda:0"] - used_mib(out, "a")["n0:cuda:0"] == pytest.approx(
        connect_mib(("send",)) + c.process_first_collective_mib, abs=0.01
    )


def test_legacy_unbound_p2p_creates_a_pair_comm_but_bound_does_not() -> None:
    def program(device_id):
        init = InitProcessGroup(backend="nccl", device_id=device_id)
        return [
            [SetDevice(), init, Checkpoint(label="a"), Send(peer=1), Checkpoint(label="b")],
            [
                SetDevice(),
                InitProcessGroup(backend="nccl", device_id=1 if device_id is not None else None),
                Checkpoint(label="a"),
                Recv(peer=0),
                Checkpoint(label="b"),
            ],
        ]

    c = costs()
    lazy = simulate(program(None), env=LEGACY)
    bound = simulate(program(0), env=LEGACY)
    assert lazy.verdict == bound.verdict == "pass"
    first = c.process_first_collective_mib
    # unbound: the world communicator never exists; the pair is the process's first communicator
    assert used_mib(lazy, "b")["n0:cuda:0"] - used_mib(lazy, "a")["n0:cuda:0"] == pytest.approx(
        c.process_mib + first + model_mib(("send",)), abs=0.01
    )
    assert used_mib(bound, "b")["n0:cuda:0"] - used_mib(bound, "a")["n0:cuda:0"] == pytest.approx(
        first + connect_mib(("send",)), abs=0.01
    )


# ------------------------------------------------------------------------------------------- hangs


def test_a_rank_that_skips_new_group_hangs_the_2_15_world_split_and_is_named() -> None:
    full = [*START, NewGroup(ranks=(0, 1), bind="a"), NewGroup(ranks=(2, 3), bind="b"), Checkpoint(label="x")]
    skipper = [*START, NewGroup(ranks=(2, 3), bind="b"), Checkpoint(label="x")]
    out = simulate([full, full, full, skipper], gpus_per_node=4)
    assert out.verdict == "hang"
    waiting = {h["rank"]: h for h in out.hangs}
    # rank 3 entered the second split as a member while the others are still in the first: nobody completes.
    assert set(waiting) == {0, 1, 2, 3}
    assert waiting[0]["waiting_for"] == [3] and waiting[0]["seq"] == 2
    assert "rank 3 is blocked in new_group(ranks=[2, 3]" in waiting[0]["explanation"]
    assert waiting[3]["kind"] == "split-color" and waiting[3]["waiting_for"] == [2]
    assert "rank 2 issued new_group(ranks=[0, 1]" in waiting[3]["explanation"]


def test_legacy_does_not_hang_at_creation_when_a_rank_skips_an_unused_group() -> None:
    full = [*START, NewGroup(ranks=(0, 1), bind="a"), Checkpoint(label="x")]
    skipper = [*START, Checkpoint(label="x")]
    assert simulate([full, skipper], env=LEGACY).verdict == "pass"
    assert simulate([full, skipper]).verdict == "hang"


def test_non_members_run_ahead_but_observable_ops_wait_for_the_split() -> None:
    program = [*START, *[NewGroup(ranks=(0, 1), bind=f"g{i}") for i in range(5)], Checkpoint(label="x")]
    out = simulate(program, gpus_per_node=4)
    times = {s.rank: s.time_s for s in out.checkpoints["x"].values()}
    assert out.verdict == "pass"
    assert len(set(times.values())) == 1, times  # non-members 2,3 leave the last split when members do


def test_size_mismatch_hangs_nccl_and_aborts_gloo() -> None:
    def program(backend):
        return [
            [SetDevice(), InitProcessGroup(backend=backend), AllReduce(size_bytes=1024)],
            [SetDevice(), InitProcessGroup(backend=backend), AllReduce(size_bytes=2048)],
        ]

    nccl = simulate(program("nccl"))
    assert nccl.verdict == "hang"
    assert "size mismatch at sequence number 1" in nccl.hangs[0]["explanation"]
    # detection = the NCCL timeout (10 min) + the modelled flight-recorder dump wait (15 s)
    assert nccl.hangs[0]["detected_at_s"] == pytest.approx(nccl.hangs[0]["since_s"] + 600 + 15)
    gloo = simulate(program("gloo"))
    assert gloo.verdict == "error"
    assert {e["rank"] for e in gloo.errors} == {0, 1}
    assert "Received data size doesn't match expected size" in gloo.errors[0]["message"]


def test_collective_type_mismatch_is_a_hang_naming_both_ops() -> None:
    out = simulate([[*START, AllReduce()], [*START, Broadcast()]])
    assert out.verdict == "hang"
    assert "rank 0 issued all_reduce" in out.hangs[0]["explanation"]
    assert "rank 1 issued broadcast" in out.hangs[0]["explanation"]


@pytest.mark.parametrize("backend", [None, "gloo"])
def test_a_broadcast_from_outside_its_group_is_torchs_value_error(backend: str | None) -> None:
    """torch 2.15's broadcast turns ``src`` (a global rank) into a group rank before anything else, and raises
    for a source outside the group; the engine used to broadcast from the group's first member instead, so a
    program real torch refuses passed (``simnccl real compare`` on it: sim pass, real error)."""
    group = NewGroup(ranks=(2, 3), bind="g", backend=backend)
    program = [*START, group, Broadcast(group="g", src=0, size_bytes=16)]
    out = simulate(program, gpus_per_node=4)
    assert out.verdict == "error"
    assert {e["rank"] for e in out.errors} == {2, 3}
    assert all(e["type"] == "ValueError" and "Global rank 0 is not part of group" in e["message"] for e in out.errors)
    fine = simulate([*START, group, Broadcast(group="g", src=3, size_bytes=16)], gpus_per_node=4)
    assert fine.verdict == "pass"


def test_lazy_init_first_op_is_a_rendezvous_of_all_members() -> None:
    lazy = NewGroup(ranks=(0, 1, 2, 3), bind="g", pg_options=PgOptions(lazy_init=True))
    sender = [*START, lazy, Send(peer=1, group="g")]
    receiver = [*START, lazy, Recv(peer=0, group="g")]
    idle = [*START, lazy]
    out = simulate([sender, receiver, idle, idle], gpus_per_node=4)
    assert out.verdict == "hang"
    assert sorted(out.hangs[0]["waiting_for"]) == [2, 3]
    assert out.hangs[0]["kind"] == "bootstrap"


def test_lazy_init_new_group_takes_no_split_so_non_members_may_skip_it() -> None:
    lazy = NewGroup(ranks=(0, 1), bind="g", pg_options=PgOptions(lazy_init=True))
    out = simulate(
        [[*START, lazy, AllReduce(group="g")], [*START, lazy, AllReduce(group="g")], [*START], [*START]],
        gpus_per_node=4,
    )
    assert out.verdict == "pass"


def test_fake_backend_never_hangs() -> None:
    out = simulate(
        [
            [SetDevice(), InitProcessGroup(backend="fake"), AllReduce()],
            [SetDevice(), InitProcessGroup(backend="fake")],
        ]
    )
    assert out.verdict == "pass"
    assert out.ledgers["n0:cuda:0"].used_by_kind().get("comm", 0) == 0


# ------------------------------------------------------------------------------------------- errors


def test_oom_is_reported_at_the_op_that_caused_it() -> None:
    program = [*START, *[NewGroup(ranks=(0,), bind=f"s{i}") for i in range(60)]]
    out = simulate(program, gpu="rtx3060-12gb", gpus_per_node=1)
    assert out.verdict == "fail"
    (error,) = out.errors
    assert error["kind"] == "oom" and error["op"].startswith("new_group(ranks=[0], bind='s")
    assert "Failed to CUDA calloc" in error["message"]


@pytest.mark.parametrize(
    ("env", "with_collectives", "type_name"),
    [({}, False, "RuntimeError"), (LEGACY, True, "torch.distributed.DistBackendError")],
    ids=["nccl2", "legacy"],
)
def test_an_nccl_oom_is_raised_as_the_backends_nccl_error_not_torchs_oom(
    env: dict[str, str], with_collectives: bool, type_name: str
) -> None:
    # torch 2.15 raises NCCL's failed calloc as nccl2's NCCLException (a std::exception: RuntimeError) or legacy's
    # DistBackendError; torch.OutOfMemoryError is a tensor's (startup code catching one misses the other).
    program: list[Op] = [*START]
    for i in range(60):  # legacy pays a group's communicator at its first collective
        program += [NewGroup(ranks=(0,), bind=f"s{i}"), *([AllReduce(group=f"s{i}")] if with_collectives else [])]
    out = simulate(program, gpu="rtx3060-12gb", gpus_per_node=1, env=env)
    (error,) = out.errors
    assert error["kind"] == "oom" and "Failed to CUDA calloc" in error["message"]
    assert error["type"] == type_name


def test_a_tensor_oom_is_torchs_out_of_memory_error() -> None:
    out = simulate([*START, Alloc(mib=1e6)], gpus_per_node=1)
    (error,) = out.errors
    assert (error["kind"], error["type"]) == ("oom", "torch.OutOfMemoryError")


def test_memory_check_uses_vllms_formula_and_message() -> None:
    out = simulate([*START, MemoryCheck(gpu_memory_utilization=0.999)], gpus_per_node=2)
    assert out.verdict == "fail"
    assert "on startup is less than desired GPU memory utilization (0.999" in out.errors[0]["message"]
    assert simulate([*START, MemoryCheck(gpu_memory_utilization=0.5)]).verdict == "pass"


def test_group_bound_to_another_device_errors_with_torchs_text() -> None:
    out = simulate([InitProcessGroup(backend="nccl"), AllReduce()])  # no set_device: tensors on cuda:0
    assert out.verdict == "error"
    (error,) = [e for e in out.errors if e["kind"] == "error"]
    assert error["rank"] == 1
    # rank 0 waits for rank 1 in the all_reduce until its watchdog aborts it: a timeout, not a second error
    assert [e["rank"] for e in out.errors if e["kind"] == "timeout"] == [0]
    assert error["message"] == "ProcessGroupNCCL is bound to device cuda:1 but an operation was issued on cuda:0"


@pytest.mark.parametrize(
    ("backend", "env", "type_name", "message"),
    [
        ("nccl", {}, "RuntimeError", NCCL2_NO_CUDA),
        ("nccl-lazy", {}, "RuntimeError", NCCL2_NO_CUDA),
        ("cpu:gloo,cuda:nccl", {}, "RuntimeError", NCCL2_NO_CUDA),
        ("nccl", LEGACY, "ValueError", LEGACY_NO_CUDA),
        ("nccl-legacy", {}, "ValueError", LEGACY_NO_CUDA),
    ],
)
def test_no_cuda_errors_match_torch(backend, env, type_name, message) -> None:
    out = simulate([InitProcessGroup(backend=backend)], gpus_per_node=0, ranks_per_node=2, env=env)
    assert out.verdict == "error"
    assert {(e["type"], e["message"]) for e in out.errors} == {(type_name, message)}


def test_gloo_works_without_cuda() -> None:
    out = simulate([InitProcessGroup(backend="gloo"), AllReduce()], gpus_per_node=0, ranks_per_node=2)
    assert out.verdict == "pass"


def test_cudamallocasync_aborts_nccl2_groups_only() -> None:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}
    out = simulate([*START, AllReduce()], env=env)
    assert out.verdict == "error" and {e["kind"] for e in out.errors} == {"abort"}
    assert simulate([*START, AllReduce()], env={**env, **LEGACY}).verdict == "pass"
    assert simulate([*START, AllReduce()], env=env, release="2.14").verdict == "pass"


def test_split_group_on_an_uninitialised_lazy_parent_is_refused() -> None:
    lazy_world = [
        SetDevice(),
        InitProcessGroup(backend="nccl", pg_options=PgOptions(lazy_init=True)),
        SplitGroup(split_ranks=((0,), (1,)), bind="s"),
    ]
    out = simulate(lazy_world)
    assert out.verdict == "error"
    assert out.errors[0]["message"] == NO_SPLIT_PARENT


@pytest.mark.parametrize(("backend", "env"), [("nccl-legacy", {}), ("nccl", LEGACY)])
def test_split_group_before_a_legacy_parents_first_collective_raises_torchs_not_initialized_error(backend, env) -> None:
    # legacy supportsSplitting() is true (ProcessGroupNCCL.hpp:837-839); C++ ProcessGroup::splitGroup then checks
    # isInitialized(), false until the lazy communicator exists, on every parent rank, non-members included.
    start = [SetDevice(), InitProcessGroup(backend=backend)]
    split = SplitGroup(split_ranks=((0, 1),), bind="s")
    out = simulate([*start, split], gpus_per_node=3, env=env)
    assert out.verdict == "error"
    assert {(e["rank"], e["type"], e["message"]) for e in out.errors} == {
        (r, "RuntimeError", SPLIT_PARENT_NOT_INITIALIZED) for r in range(3)
    }
    assert simulate([*start, AllReduce(), split], gpus_per_node=3, env=env).verdict == "pass"


def test_split_group_members_split_and_the_rank_in_no_split_joins_with_nocolor() -> None:
    program = [
        *START,
        Checkpoint(label="a"),
        SplitGroup(split_ranks=((0, 1),), bind="s"),
        Checkpoint(label="b"),
    ]
    out = simulate(program, gpus_per_node=4)
    assert out.verdict == "pass"
    mib = {d: used_mib(out, "b")[d] - used_mib(out, "a")[d] for d in used_mib(out, "a")}
    assert mib["n0:cuda:0"] == pytest.approx(model_mib(), abs=0.01)
    assert mib["n0:cuda:3"] == 0
    assert simulate([program, program, program, [*START]], gpus_per_node=4).verdict == "hang"


# ------------------------------------------------------------------------------------------- c10d state


def test_device_fallback_uses_local_rank_under_torchrun_and_global_rank_otherwise() -> None:
    program = [InitProcessGroup(backend="nccl")]
    torchrun = simulate(program, nodes=2, gpus_per_node=4, ranks_per_node=2)
    spawn = simulate(program, nodes=2, gpus_per_node=4, ranks_per_node=2, launcher="spawn")
    assert torchrun.ranks[2].world.bound_device == 0
    assert spawn.ranks[2].world.bound_device == 2


def test_local_synchronization_non_members_do_not_advance_the_group_counter() -> None:
    program = [
        *START,
        NewGroup(ranks=(0, 1), bind="l", use_local_synchronization=True, pg_options=PgOptions(lazy_init=True)),
        NewGroup(ranks=(0, 1, 2), bind="n", backend="gloo"),
    ]
    out = simulate(program, gpus_per_node=4, env=LEGACY)
    names = {rt.rank: rt.handles["n"].name for rt in out.ranks if not isinstance(rt.handles["n"], int)}
    assert names == {0: "2", 1: "2", 2: "1"}
    # gloo bootstraps at construction, keyed by name: the divergent names never meet.
    assert out.verdict == "hang"


# ------------------------------------------------------------------------------------------- harness


def test_same_input_gives_the_same_trace_hash_and_different_env_does_not() -> None:
    program = [*START, *[NewGroup(ranks=(0, 1), bind=f"g{i}") for i in range(4)], AllReduce(group="g0")]
    a, b = simulate(program), simulate(program)
    assert a.trace_hash == b.trace_hash and a.event_count == b.event_count
    assert simulate(program, env=LEGACY).trace_hash != a.trace_hash


def test_the_trace_hash_is_the_hash_of_every_event_in_order_across_batches() -> None:
    """Events are hashed in batches: the digest must be the streaming hash of each event's repr, in order, over
    more events than one batch holds (and a digest read mid-run must not change what follows)."""
    import hashlib

    from simnccl.engine.sim import Trace

    trace = Trace(keep=False)
    expected = hashlib.blake2b(digest_size=16)
    events = [(i * 0.25, i % 7, "alloc", f"node0/cuda:{i % 8}", "3", "init", 1 << (i % 20)) for i in range(10_000)]
    for i, event in enumerate(events):
        trace.record(*event)
        expected.update(repr(event).encode())
        if i == 5000:
            assert trace.digest() == expected.hexdigest()
    assert trace.digest() == expected.hexdigest() and trace.count == len(events)


def test_an_event_recorded_as_text_hashes_as_its_repr_and_a_wrong_text_fails_a_kept_trace() -> None:
    """``Trace.record_text``: a caller that builds an event's repr from parts (a call's tail, the clock's text)
    hashes exactly what ``record`` would; where the trace is kept (every test that reads one), a text that is
    not the event's repr is an error, not a silently different hash."""
    from simnccl.engine.sim import Trace

    plain, texted = Trace(keep=False), Trace(keep=True)
    now = 70.89999999999984
    for rank in range(3):
        event = (now, rank, "alloc", "n1:cuda:1", "471", "init", 407430077)
        plain.record(*event)
        text = f"({texted.time_text(now)}, {rank!r}, 'alloc', 'n1:cuda:1', '471', 'init', 407430077)"
        texted.record_text(text, event)
    assert texted.digest() == plain.digest() and texted.count == plain.count == 3
    assert texted.time_text(0) == "0" and texted.time_text(0.0) == "0.0"  # an int clock is not a float's
    with pytest.raises(AssertionError, match="is not the repr"):
        texted.record_text("(0.0, 1)", (0, 1))


def test_runaway_simulation_is_stopped_by_the_guard() -> None:
    program = [*START, *[Compute(seconds=0.0)] * 70_000]
    with pytest.raises(EngineGuardError, match="exceeded 1000 ops"):
        simulate(program, gpus_per_node=1, limits=Limits(max_ops=1000))


# ------------------------------------------------------------------------------------------- cohorts


def _observable(outcome):
    checkpoints = {
        label: {d: (s.used_bytes, round(s.time_s, 9)) for d, s in snaps.items()}
        for label, snaps in outcome.checkpoints.items()
    }
    errors = sorted((e["rank"], e["kind"], e["op"], e["message"]) for e in outcome.errors)
    hangs = sorted((h["rank"], h["op"], tuple(h["waiting_for"])) for h in outcome.hangs)
    groups = {
        (name, ranks): {r: m["bytes"] for r, m in rec.members.items()} for (name, ranks), rec in outcome.groups.items()
    }
    return outcome.verdict, checkpoints, errors, hangs, groups


COHORT_CASES = {
    "199957": (
        [
            *START,
            Checkpoint(label="a"),
            *[NewGroup(ranks=(0, 1), bind=f"g{i}") for i in range(9)],
            Checkpoint(label="b"),
            AllReduce(),
            *[AllReduce(group=f"g{i}") for i in range(9)],
            Checkpoint(label="c"),
        ],
        {},
        2,
    ),
    "legacy": (
        [
            *START,
            *[NewGroup(ranks=(i % 4, (i + 1) % 4), bind="p") for i in range(6)],
            AllReduce(group="p"),
            Checkpoint(label="x"),
        ],
        LEGACY,
        4,
    ),
    "mixed-gloo-twins": (
        [
            *START,
            NewGroup(ranks=(0, 1), bind="t"),
            NewGroup(ranks=(0, 1), backend="gloo", bind="tc"),
            NewGroup(ranks=(2, 3), bind="t"),
            NewGroup(ranks=(2, 3), backend="gloo", bind="tc"),
            AllReduce(group="t"),
            Checkpoint(label="x"),
        ],
        {},
        4,
    ),
    "split-group": (
        [
            *START,
            SplitGroup(split_ranks=((0, 1), (2, 3)), bind="s"),
            AllReduce(group="s"),
            NewGroup(ranks=(1, 2), bind="m"),
            Checkpoint(label="x"),
        ],
        {},
        4,
    ),
    "shared": (
        [*START, *[NewGroup(ranks=(0, 1, 2, 3), bind=f"w{i}") for i in range(3)], Checkpoint(label="x")],
        {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"},
        4,
    ),
}


@pytest.mark.parametrize("case", sorted(COHORT_CASES))
def test_cohort_path_and_rank_by_rank_path_agree(case) -> None:
    program, env, gpus = COHORT_CASES[case]
    shared = simulate(program, env=env, gpus_per_node=gpus)  # one Program object: cohorts
    separate = simulate([list(program) for _ in range(gpus)], env=env, gpus_per_node=gpus)  # rank by rank
    assert _observable(shared) == _observable(separate)


def test_cohort_path_and_rank_by_rank_path_agree_on_oom() -> None:
    # 2-rank groups on an RTX 3060 pair cost 28 MiB each (PCIe: 4 channels): 500 exceed its 12 GiB
    program = [*START, *[NewGroup(ranks=(0, 1), bind=f"s{i}") for i in range(500)], Checkpoint(label="x")]
    shared = simulate(program, gpu="rtx3060-12gb", gpus_per_node=2)
    separate = simulate([list(program), list(program)], gpu="rtx3060-12gb", gpus_per_node=2)
    assert shared.verdict == "fail"
    assert _observable(shared) == _observable(separate)


@pytest.mark.parametrize(
    "policy", ["torch-default", "legacy", "lazy-init", "dedupe", "skip-single-rank", "budget(700)"]
)
def test_cohort_and_rank_by_rank_agree_on_a_megatron_startup_under_policies(policy) -> None:
    """gloo twins break blocks and policies keep per-rank histories: the fast path must still agree."""
    from simnccl.workloads import GENERATORS

    programs = GENERATORS["megatron"]({"tp": 2, "pp": 2}, 16)
    shared = simulate([p.ops for p in programs], nodes=2, gpus_per_node=8, policy=policy)
    separate = simulate([list(p.ops) for p in programs], nodes=2, gpus_per_node=8, policy=policy)
    assert shared.verdict == "pass"
    assert _observable(shared) == _observable(separate)
    handles = {r: sorted(rt.handles) for r, rt in enumerate(shared.ranks)}
    assert all("dp_gloo" in names for names in handles.values())  # gloo twins exist under every policy


@pytest.mark.parametrize("policy", [None, "dedupe"])
def test_a_finished_engine_is_freed_without_the_cyclic_gc(policy) -> None:
    """Rooms hold the rooms they call, never the Engine (simnccl/engine/core.py): a run leaves no reference
    cycle, so a dropped engine is freed at once (cycles here were most of a small run's GC time)."""
    import gc
    import weakref

    from simnccl.cluster import Cluster, get_gpu_kind
    from simnccl.engine import Engine, SimConfig
    from simnccl.ops import Program
    from simnccl.policy import get_policy
    from simnccl.release import get_release

    common = (
        *START,
        NewGroup(ranks=(0, 1), bind="tp"),
        NewGroup(ranks=(2, 3), bind="tp"),
        NewGroup(ranks=(0, 1, 2, 3), backend="gloo", bind="cpu"),
        AllReduce(group="tp"),
        AllReduce(group="cpu"),
        Compute(seconds=0.5),
    )
    p2p = [Send(peer=1, group="world"), Recv(peer=0, group="world"), Send(peer=3, group="world")]
    p2p.append(Recv(peer=2, group="world"))
    programs = [Program((*common, op, Checkpoint(label="end"))) for op in p2p]
    config = SimConfig(
        cluster=Cluster(get_gpu_kind("h100-80gb"), 1, 4),
        release=get_release("2.15"),
        profile=find_profile("h100-80gb", "2.15"),
        programs=programs,
        policy=get_policy(policy) if policy else None,
    )
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        engine = Engine(config)
        outcome = engine.run()
        rooms = [engine, engine.loop, engine.memory, engine.timing, engine.watchdogs, engine.injection, engine.fast]
        refs = [weakref.ref(room) for room in (*rooms, engine.fast.cohorts, engine.fast.outsiders)]
        del engine, rooms
        assert [ref() for ref in refs] == [None] * len(refs)
    finally:
        if was_enabled:
            gc.enable()
    assert outcome.verdict == "pass"


def _p2p_then_split(sends: dict[int, int], world: int) -> list[list[Op]]:
    """Legacy world of ``world`` ranks: each ``src: dst`` of ``sends`` is one unbatched send/recv (a lazy pair
    communicator; the parent's own communicator is never made), then ``split_group([[0, 1]])`` and an
    all_reduce on the child where a rank is in it."""
    programs: list[list[Op]] = [[SetDevice(), InitProcessGroup(backend="nccl-legacy")] for _ in range(world)]
    for src, dst in sends.items():
        programs[src].append(Send(peer=dst))
        programs[dst].append(Recv(peer=src))
    for rank, program in enumerate(programs):
        program.append(SplitGroup(split_ranks=((0, 1),), bind="s"))
        if rank in (0, 1):
            program.append(AllReduce(group="s"))
    return programs


def test_split_group_of_a_legacy_parent_holding_only_p2p_pair_communicators_bootstraps_the_child_fresh() -> None:
    # ProcessGroupNCCL::isInitialized() (2.15) is "devNCCLCommMap_ non-empty and every communicator in it
    # initialized"; a send/recv's pair communicator lives in that map under "lo:hi", so the parent counts as
    # initialized and split() goes on. The child's eagerConnectSingleDevice finds no parent communicator under
    # the device key, so it splits nothing: a fresh members-only bootstrap over the child's store.
    out = simulate(_p2p_then_split({0: 1}, 2))
    assert out.verdict == "pass", out.errors
    for rt in out.ranks:
        child = rt.handles["s"].comm_for("cuda")
        assert child.ready and not child.via_split and child.parent is None
        assert rt.handles["s"].desc == "default_pg:split:0"  # comm_split_count(): no ncclCommSplit made yet
        parent = rt.world.comm_for("cuda")
        assert not parent.ready and parent.splits == 0 and parent.pair_comms


def test_split_group_of_a_legacy_parent_checks_initialization_per_rank() -> None:
    # Rank 2 made no communicator of the parent: its isInitialized() is false and it raises, alone; ranks 0 and 1
    # (pair communicator) make the child between them.
    out = simulate(_p2p_then_split({0: 1}, 3), gpus_per_node=3)
    assert out.verdict == "error"
    assert [(e["rank"], e["type"], e["message"]) for e in out.errors] == [
        (2, "RuntimeError", SPLIT_PARENT_NOT_INITIALIZED)
    ]
    assert [rt.status for rt in out.ranks] == ["done", "done", "error"]


def test_a_non_member_whose_legacy_parent_holds_only_pair_communicators_dies_in_the_nocolor_split() -> None:
    # 2.15's performNocolorSplit finds no communicator under the device key, logs it, and calls NCCLComm::split
    # on the null pointer, which reads source->rank_ first (libtorch_cuda.so 2.15: the null check only logs):
    # the process dies of SIGSEGV. The members' child does not need it.
    out = simulate(_p2p_then_split({0: 1, 1: 2}, 3), gpus_per_node=3)
    assert out.verdict == "error"
    (error,) = out.errors
    assert (error["rank"], error["kind"], error["type"]) == (2, "abort", "SIGSEGV")
    assert error["message"].startswith("No parent communicator exists for nocolor split")
    assert [rt.status for rt in out.ranks] == ["done", "done", "aborted"]


@pytest.mark.parametrize(
    ("backend", "op", "error"),
    [
        ("gloo", Send(peer=0, size_bytes=8), ("ValueError", "SEND_TO_SELF")),
        ("nccl", Send(peer=0, size_bytes=8), ("ValueError", "SEND_TO_SELF")),
        ("gloo", Recv(peer=0, size_bytes=8), ("RuntimeError", "RECV_FROM_SELF")),
        (
            "nccl",
            Recv(peer=0, size_bytes=8),
            ("SimulatorLimit", "a send or recv with the rank itself on NCCL is not modelled"),
        ),
    ],
)
def test_a_send_or_recv_to_the_rank_itself_fails_as_torch_does(backend: str, op, error) -> None:
    """torch checks only a send's destination against the rank itself (``_check_not_self_rank``); a recv from
    itself reaches the backend, and gloo has no pair to itself. The simulator raised its own ValueError for both
    (real compare: DISAGREE on the recv)."""
    from simnccl.backends import gloo
    from simnccl.engine import collectives

    texts = {"SEND_TO_SELF": collectives.SEND_TO_SELF, "RECV_FROM_SELF": gloo.RECV_FROM_SELF}
    out = simulate(
        [[SetDevice(), InitProcessGroup(backend=backend), op], [SetDevice(), InitProcessGroup(backend=backend)]]
    )
    assert [(e["rank"], e["type"], e["message"]) for e in out.errors] == [(0, error[0], texts.get(error[1], error[1]))]


def test_a_send_to_the_rank_itself_is_refused_in_torchs_words() -> None:
    c10d = pytest.importorskip("torch.distributed.distributed_c10d")

    from simnccl.engine.collectives import SEND_TO_SELF

    class Itself:  # all torch's send check reads of the group: the caller's rank in it
        def rank(self) -> int:
            return 0

    with pytest.raises(ValueError) as raised:
        c10d._check_not_self_rank(Itself(), 0, "destination")
    assert str(raised.value) == SEND_TO_SELF


def test_a_rank_that_runs_out_at_its_first_collective_holds_no_part_of_that_use() -> None:
    """Rank 0 runs out of memory at the all_reduce's once-per-process allocation, before its NVLS buffers: its
    communicator's breakdown had the first use's 64 MiB already, so the report's nccl_paid_mib showed buffers the
    rank never paid (and ``cost --breakdown`` added them up)."""
    program = [
        SetDevice(),
        InitProcessGroup(backend="nccl"),
        Alloc(mib=79_000, tag="x"),
        NewGroup(ranks=(0, 1), bind="g"),
        AllReduce(group="g", size_bytes=4 * 2**20),
    ]
    out = simulate([program, [op for op in program if not isinstance(op, Alloc)]], release="2.15")
    assert (out.errors[0]["rank"], out.errors[0]["kind"]) == (0, "oom")  # (rank 1 then times out waiting)
    record = next(r for (name, _), r in out.groups.items() if name == "1")
    (mine,) = record.members[0]["memory"].values()
    (theirs,) = record.members[1]["memory"].values()
    assert set(mine.breakdown.by_paid_at()) == {"init"}
    assert set(theirs.breakdown.by_paid_at()) == {"init", "first all_reduce (nvls)"}


@pytest.mark.parametrize("backend", ["cpu:gloo,cuda:nccl", "cuda:nccl,cpu:gloo", "nccl"])
def test_a_groups_record_names_its_nccl_communicator_whatever_the_backend_strings_order(backend: str) -> None:
    """torch treats "cpu:gloo,cuda:nccl" as "cuda:nccl,cpu:gloo"; the record took the first communicator attached,
    so the groups table said gloo, no split, for a group whose memory is an eager nccl2 split (vLLM's spelling)."""
    from simnccl.ops import AllReduce, InitProcessGroup, NewGroup, SetDevice
    from simnccl.testing import simulate

    program = [SetDevice(), InitProcessGroup(backend=backend), NewGroup(ranks=(0, 1), bind="g"), AllReduce(group="g")]
    out = simulate(program, gpus_per_node=2)
    assert [(r.name, r.impl, r.via_split) for r in out.groups.values()] == [("0", "nccl2", False), ("1", "nccl2", True)]
