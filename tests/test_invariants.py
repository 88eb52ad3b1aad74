"""Every invariant checker passes on a good outcome and FAILS on a bad one (a check that can't fail is no check).

Also pins the facts the generators rely on: why valid programs warm a group up with a collective before a
send/recv (lazy communicators are a rendezvous of every member), and what ``budget(X)`` really bounds.
"""

from __future__ import annotations

import pytest

from simnccl.ops import (
    AllReduce,
    Barrier,
    Checkpoint,
    Compute,
    InitProcessGroup,
    NewGroup,
    Recv,
    Send,
    SetDevice,
    SplitGroup,
)
from simnccl.testing import invariants as inv
from simnccl.testing.replay import SimCase, plugin_registered, share_identical
from simnccl.testing.strategies import CHECKPOINT_GROUPS, CHECKPOINT_INIT

if not plugin_registered():  # not yet loaded by -p or the pytest11 entry point
    pytest_plugins = ["simnccl.testing.plugin"]

pytestmark = pytest.mark.property  # run with the property suite (pytest -m property), though cheap

START = [SetDevice(), InitProcessGroup(backend="nccl"), Checkpoint(label=CHECKPOINT_INIT)]


def case(programs, **kwargs) -> SimCase:  # type: ignore[no-untyped-def]
    """One program for every rank, or one per rank; ``gpus_per_node`` defaults to the rank count."""
    if programs and not isinstance(programs[0], list | tuple):
        programs = [programs] * kwargs.pop("world", 2)
    kwargs.setdefault("gpus_per_node", len(programs))
    return SimCase(programs=share_identical(programs), **kwargs)


def groups(n: int, ranks: tuple[int, ...] = (0, 1)) -> list[NewGroup]:
    return [NewGroup(ranks=ranks, bind=f"g{i}") for i in range(n)]


def test_verdict_is_truthy_only_when_ok() -> None:
    assert inv.Verdict(True, "fine")
    assert not inv.Verdict(False, "broken")


# ------------------------------------------------------------------------------------------ liveness


def test_passes_accepts_a_finished_program_and_rejects_a_hang() -> None:
    good = case([*START, *groups(1), AllReduce(group="g0")]).run()
    assert inv.passes(good)
    hang = case([[*START, *groups(1), AllReduce(group="g0")], [*START, *groups(1)]]).run()
    verdict = inv.passes(hang)
    assert not verdict
    assert "rank 0" in verdict.explanation and "[1]" in verdict.explanation


def test_names_culprit_needs_a_detection_and_the_right_rank() -> None:
    program = [*START, NewGroup(ranks=(0, 1), bind="g"), AllReduce(group="g")]
    skipped = [*START, NewGroup(ranks=(0, 1), bind="g")]
    out = case([program, skipped, program]).run()  # rank 1 skips the collective; rank 2 is not in g
    assert out.verdict != "pass"
    assert inv.names_culprit(out, [1])
    assert not inv.names_culprit(out, [2]), "an innocent bystander must not count as named"
    assert not inv.names_culprit(case(program).run(), [0]), "a passing run names nobody"


def test_watchdog_timeouts_blame_nobody_by_themselves() -> None:
    """Every hung rank gets a watchdog timeout error; those are symptoms, not culprits."""
    program = [*START, NewGroup(ranks=(0, 1), bind="g"), AllReduce(group="g")]
    out = case([program, [*START, NewGroup(ranks=(0, 1), bind="g")]]).run()
    timed_out = {e["rank"] for e in out.errors if e["kind"] == "timeout"}
    assert 0 in timed_out
    assert 0 not in inv.blamed_ranks(out)
    assert 1 in inv.blamed_ranks(out)


def _straggler(seconds: float, timeout_s: float | None) -> SimCase:
    """Rank 1 computes for ``seconds`` before an all_reduce on a group of timeout ``timeout_s``."""
    head = [*START, NewGroup(ranks=(0, 1), bind="g", timeout_s=timeout_s)]
    return case([[*head, AllReduce(group="g")], [*head, Compute(seconds=seconds), AllReduce(group="g")]])


def test_may_time_out_only_where_a_timeout_is_within_reach_of_the_computes() -> None:
    assert inv.may_time_out(_straggler(5.0, 1.0).programs)
    assert inv.may_time_out(_straggler(0.0, 1.0).programs)  # within the intrinsic margin
    assert not inv.may_time_out(_straggler(5.0, 30.0).programs)
    assert not inv.may_time_out(_straggler(5.0, None).programs)  # a default timeout is 10 minutes at least
    assert inv.may_time_out(_straggler(700.0, None).programs)


def test_passes_or_times_out_accepts_a_straggler_past_a_short_timeout_and_rejects_a_deadlock() -> None:
    timed = _straggler(5.0, 1.0)
    untimed = timed.with_(programs=inv.without_timeouts(timed.programs))
    assert not any(getattr(op, "timeout_s", None) for p in untimed.programs for op in p)
    out = timed.run()
    assert not inv.passes(out)
    assert inv.passes_or_times_out(out, untimed.run())
    assert inv.passes_or_times_out(_straggler(0.5, 1.0).run(), untimed.run())  # it passed
    # rank 1 skips the all_reduce: its peer times out too, but the run without short timeouts does not pass
    head = [*START, NewGroup(ranks=(0, 1), bind="g", timeout_s=1.0)]
    deadlock = case([[*head, AllReduce(group="g")], head])
    verdict = inv.passes_or_times_out(
        deadlock.run(), deadlock.with_(programs=inv.without_timeouts(deadlock.programs)).run()
    )
    assert not verdict and "defaults" in verdict.explanation


def test_a_send_recv_first_use_of_a_lazy_group_hangs() -> None:
    """Why valid programs warm a group up with a collective (``first_use_is_collective``): under
    ``lazy-init`` a communicator is created at its first op, a rendezvous of every member (§B.5), so a
    send/recv between two of four members waits for two members that never come."""
    family = [NewGroup(ranks=(0, 1, 2, 3), bind="pp", purpose="pp")]
    p0 = [*START, *family, Send(peer=1, group="pp")]
    p1 = [*START, *family, Recv(peer=0, group="pp")]
    idle = [*START, *family]
    p2p_first = case([p0, p1, idle, idle])
    assert inv.passes(p2p_first.run(policy="torch-default"))  # eager (2.15): the communicator exists
    lazy = p2p_first.run(policy="lazy-init")
    assert not inv.passes(lazy)
    assert inv.names_culprit(lazy, [2, 3])
    warm = Barrier(group="pp")
    warmed = case([[*p0[:-1], warm, p0[-1]], [*p1[:-1], warm, p1[-1]], [*idle, warm], [*idle, warm]])
    assert inv.passes(warmed.run(policy="lazy-init"))


# ------------------------------------------------------------------------------------------ memory


def test_within_capacity_rejects_a_peak_over_the_device() -> None:
    out = case([*START, *groups(2)]).run()
    assert inv.within_capacity(out)
    ledger = next(iter(out.ledgers.values()))
    ledger.peak_bytes = ledger.total_bytes + 1
    verdict = inv.within_capacity(out)
    assert not verdict and ledger.device in verdict.explanation


def test_within_capacity_on_a_run_that_did_not_pass_says_how_far_it_judged() -> None:
    """It holds on a run that ended before allocating the rest (found by a tester: every rank raised at its
    first op, and it said "2 device(s) within capacity"): its text now says so, and ``passes`` fails beside it."""
    out = case([*START, AllReduce(group="nope")]).run()
    assert out.verdict != "pass" and not inv.passes(out)
    verdict = inv.within_capacity(out)
    assert verdict and f"as far as the run got (it ended {out.verdict})" in verdict.explanation
    assert "as far as" not in inv.within_capacity(case([*START, *groups(2)]).run()).explanation


def test_within_budget_bounds_eager_groups_at_creation() -> None:
    program = [*START, *groups(4), Checkpoint(label=CHECKPOINT_GROUPS)]
    group_bytes = inv.eager_group_bytes("h100-80gb", "2.15", {})
    budgeted = case(program).run(policy="budget(500)")
    assert inv.within_budget(budgeted, budget_mib=500, per_group_mib=231.1, group_bytes=group_bytes)
    unbounded = case(program).run(policy="torch-default")  # 4 eager groups > floor(500 / 231.1) = 2
    verdict = inv.within_budget(unbounded, budget_mib=500, per_group_mib=231.1, group_bytes=group_bytes)
    assert not verdict and "2 eager group(s)" in verdict.explanation
    assert not inv.within_budget(unbounded, budget_mib=500, per_group_mib=231.1, group_bytes=group_bytes, after="x")


def test_budget_x_keeps_creation_within_x_mib_on_every_gpu() -> None:
    program = [*START, *groups(4), Checkpoint(label=CHECKPOINT_GROUPS)]
    out = case(program, gpu="rtx3060-12gb").run(policy="budget(500)")
    for device, snap in out.checkpoints[CHECKPOINT_GROUPS].items():
        grown = snap.used_bytes - out.checkpoints[CHECKPOINT_INIT][device].used_bytes
        assert grown <= 500 * 2**20


def test_eager_group_bytes_adds_connect_buffers_without_runtime_connect() -> None:
    plain = inv.eager_group_bytes("h100-80gb", "2.15", {})
    connected = inv.eager_group_bytes("h100-80gb", "2.15", {"NCCL_RUNTIME_CONNECT": "0"})
    assert connected > plain > 0


def test_lazy_unused_allocate_nothing_catches_an_eager_unused_group() -> None:
    program = [*START, *groups(2), AllReduce(group="g0")]  # g1 never communicates
    lazy = case(program).run(policy="lazy-init")
    assert inv.lazy_unused_allocate_nothing(lazy, case(program).programs)
    eager = case(program).run(policy="torch-default")
    verdict = inv.lazy_unused_allocate_nothing(eager, case(program).programs)
    assert not verdict and "unused group '2'" in verdict.explanation


def test_lazy_unused_allocate_nothing_leaves_out_split_group_children() -> None:
    """A split child is made by ncclCommSplit at the call whatever lazy_init says: an unused one allocating is
    no broken promise of lazy-init (the check failed every generated program that split and never used it)."""
    program = [*START, *groups(1), AllReduce(group="g0"), AllReduce(), SplitGroup(split_ranks=((0, 1),), bind="s")]
    lazy = case(program).run(policy="lazy-init")
    assert inv.passes(lazy)
    assert (v := inv.lazy_unused_allocate_nothing(lazy, case(program).programs)), v.explanation


def test_lazy_unused_allocate_nothing_counts_the_default_group() -> None:
    program = [*START, *groups(1), AllReduce(group="g0")]
    eager_world = case(program).run(policy="torch-default")  # the world communicator is eager, never used
    verdict = inv.lazy_unused_allocate_nothing(eager_world, case(program).programs)
    assert not verdict and "'0'" in verdict.explanation


def test_same_final_memory_needs_every_group_used() -> None:
    used = [*START, *groups(2), AllReduce(group="g0"), AllReduce(group="g1"), AllReduce()]
    c = case(used)
    assert inv.same_final_memory(c.run(policy="torch-default"), c.run(policy="lazy-init"))
    unused = case([*START, *groups(2), AllReduce(group="g0"), AllReduce()])
    verdict = inv.same_final_memory(unused.run(policy="torch-default"), unused.run(policy="lazy-init"))
    assert not verdict and "eager" in verdict.explanation


def test_same_membership_compares_every_handle_on_every_rank() -> None:
    a = case([*START, NewGroup(ranks=(0, 1), bind="g"), NewGroup(ranks=(2, 3), bind="g")], world=4).run()
    b = case([*START, NewGroup(ranks=(0, 2), bind="g"), NewGroup(ranks=(1, 3), bind="g")], world=4).run()
    assert inv.same_membership(a, a)
    verdict = inv.same_membership(a, b)
    assert not verdict and "handle 'g'" in verdict.explanation
    assert inv.membership(a)[0]["g"] == (0, 1)
    partial = case([*START, NewGroup(ranks=(0, 1), bind="g")], world=4).run()
    assert inv.membership(partial)[2]["g"] == -100  # NON_GROUP_MEMBER


def test_same_membership_refuses_handles_it_would_not_compare() -> None:
    """A misspelt handle (``"TP"`` for ``"tp"``) and an empty list were "agreed on", never compared: ok."""
    a = case([*START, NewGroup(ranks=(0, 1), bind="tp")]).run()
    b = case([*START, NewGroup(ranks=(0,), bind="tp")]).run()
    assert not inv.same_membership(a, b, handles=["tp"])
    with pytest.raises(ValueError, match="handles: 'TP' bound on no rank of either run; bound: tp"):
        inv.same_membership(a, b, handles=["TP"])
    with pytest.raises(ValueError, match="handles: empty, so nothing would be compared"):
        inv.same_membership(a, b, handles=[])
    with pytest.raises(TypeError, match="got the string 'tp'"):
        inv.same_membership(a, b, handles="tp")
    assert "agree on handle(s) tp" in inv.same_membership(a, a, handles=["tp"]).explanation


def test_within_budget_refuses_a_budget_it_cannot_state() -> None:
    out = case([*START, Checkpoint(CHECKPOINT_INIT), Checkpoint(CHECKPOINT_GROUPS)]).run()
    for budget, per, message in [
        (1000, 0, "per_group_mib: expected a per-group cost > 0"),
        (float("inf"), 231, "budget_mib: expected a finite number of MiB >= 0, got inf"),
        (float("nan"), 231, "budget_mib: expected a finite number of MiB >= 0, got nan"),
        (1000, -1, "per_group_mib: expected a finite number of MiB >= 0, got -1"),
    ]:
        with pytest.raises(ValueError) as raised:
            inv.within_budget(out, budget_mib=budget, per_group_mib=per, group_bytes=1)
        assert message in str(raised.value)


def test_lazy_unused_takes_the_programs_as_simulate_does() -> None:
    """One op list (what ``simulate`` takes for every rank) failed on its first op; fewer lists than ranks raised
    IndexError, more passed with the extra ones unchecked."""
    program = [*START, NewGroup(ranks=(0, 1), bind="g"), AllReduce()]
    out = case(program).run(policy="lazy-init")
    assert inv.lazy_unused_allocate_nothing(out, program)
    assert inv.lazy_unused_allocate_nothing(out, [program, program])
    for programs in ([program], [program] * 3):
        with pytest.raises(ValueError, match=f"programs: {len(programs)} op lists for a run of 2 ranks"):
            inv.lazy_unused_allocate_nothing(out, programs)


def test_dedupe_binds_a_duplicate_handle_to_identical_members() -> None:
    program = [*START, NewGroup(ranks=(0, 1), bind="a"), NewGroup(ranks=(0, 1), bind="b"), AllReduce(group="b")]
    c = case(program)
    assert inv.same_membership(c.run(policy="torch-default"), c.run(policy="dedupe"))


def test_deterministic_compares_trace_hashes() -> None:
    c = case([*START, *groups(2), AllReduce(group="g1")])
    assert inv.deterministic(c.run(), c.run())
    other = case([*START, *groups(2), AllReduce(group="g0")])
    verdict = inv.deterministic(c.run(), other.run())
    assert not verdict and "trace hash" in verdict.explanation


def test_within_budget_does_not_count_the_process_overhead_a_lazy_default_group_leaves_to_a_group() -> None:
    """``TORCH_DIST_USE_NCCL2=0`` (legacy: the default group is lazy): the process's first communicator is the
    first eager group's, so NCCL's once-per-process overhead (82 MiB) lands between ``init`` and ``groups``.
    It is the world's cost, not a group's: ``within_budget`` counted it and failed a budget that held
    (470.6 MiB = one 388.6 MiB group + 82 MiB). Found by the thorough profile."""
    from simnccl.ops import Checkpoint, InitProcessGroup, NewGroup, SetDevice
    from simnccl.testing import simulate

    groups = [
        NewGroup(ranks=(r,), bind=f"{purpose}{i}", purpose=purpose)
        for i, purpose in enumerate(("tp", "tp", "pp"))
        for r in (0, 1)
    ]
    program = [SetDevice(), InitProcessGroup(), Checkpoint(label="init"), *groups, Checkpoint(label="groups")]
    env = {"TORCH_DIST_USE_NCCL2": "0"}
    priced = inv.eager_group_bytes("a100-80gb", "2.15", env)
    out = simulate(program, gpu="a100-80gb", env=env, policy="nccl-lazy-p2p+budget(500)")
    assert (v := inv.passes(out)), v.explanation
    paid_by_a_group = [
        e
        for e in out.ledgers["n0:cuda:0"].timeline
        if e.owner.phase == "process-first-comm" and isinstance(e.op, NewGroup)
    ]
    assert paid_by_a_group, "the overhead is paid by a group creation here (the case this test is about)"
    verdict = inv.within_budget(out, budget_mib=500, per_group_mib=priced / 2**20, group_bytes=priced)
    assert verdict, verdict.explanation
    assert not inv.within_budget(out, budget_mib=500, per_group_mib=priced / 2**20, group_bytes=priced // 2)


def test_within_capacity_fails_a_run_where_a_rank_ran_out_of_memory() -> None:
    """The allocator raises before a device passes its capacity, so no peak ever does: the check passed a run
    whose rank 1 asked for 200,000 MiB of an 80 GB device."""
    from simnccl.ops import Alloc

    base = [SetDevice(), InitProcessGroup()]
    out = SimCase(programs=share_identical([[*base, AllReduce()], [*base, Alloc(mib=200_000), AllReduce()]])).run()
    verdict = inv.within_capacity(out)
    assert not verdict and verdict.explanation.startswith("rank 1: torch.OutOfMemoryError: CUDA out of memory.")


def test_within_budget_fails_where_a_rank_ended_before_the_after_checkpoint() -> None:
    """Rank 1 grows by five eager groups' worth and raises before ``groups``: its device was skipped, and the
    check said every device grew within the budget."""
    from simnccl.ops import Raise

    start = [SetDevice(), InitProcessGroup(), Checkpoint(CHECKPOINT_INIT)]
    groups = [NewGroup(ranks=(0, 1), bind=f"g{i}") for i in range(5)]
    dies = [*start, *groups, Raise(message="gives up"), Checkpoint(CHECKPOINT_GROUPS)]
    lives = [*start, *groups, Checkpoint(CHECKPOINT_GROUPS)]
    out = SimCase(programs=(tuple(lives), tuple(dies)), release="2.15", policy="lazy-init").run()
    per = inv.eager_group_bytes("h100-80gb", "2.15", {})
    verdict = inv.within_budget(out, budget_mib=per / 2**20, per_group_mib=per / 2**20, group_bytes=per)
    assert not verdict
    assert "n0:cuda:1: no 'groups' checkpoint (rank 1 ended before it)" in verdict.explanation


def test_a_gloo_peer_lost_error_blames_the_peer_that_went_away_not_the_rank() -> None:
    """Rank 1 destroys its groups while rank 0 waits on its recv: rank 0's peer-lost error is a symptom, and the
    report blamed rank 0 (``names_culprit(out, [0])`` said ok for the victim)."""
    from simnccl.ops import DestroyProcessGroup

    base = [SetDevice(), InitProcessGroup(backend="gloo")]
    out = SimCase(programs=((*base, Recv(peer=1, size_bytes=8)), (*base, DestroyProcessGroup()))).run()
    assert [e["kind"] for e in out.errors] == ["peer-lost"]
    assert inv.blamed_ranks(out) == {1}
    assert inv.names_culprit(out, [1]) and not inv.names_culprit(out, [0])


def test_a_checkpoint_met_twice_is_not_read_as_one_moment() -> None:
    """``init``, six eager groups, ``groups``, then ``init`` again: within_budget read the second ``init`` and
    passed a one-group budget; used_mib read the last moment silently (a scenario refuses such a program; a
    generated one meets its checkpoints c0..c3 more than once by design)."""
    from simnccl.testing import used_mib

    start = [SetDevice(), InitProcessGroup(), Checkpoint(CHECKPOINT_INIT)]
    groups = [NewGroup(ranks=(0, 1), bind=f"g{i}") for i in range(6)]
    program = (*start, *groups, Checkpoint(CHECKPOINT_GROUPS), Checkpoint(CHECKPOINT_INIT))
    out = SimCase(programs=(program, program), release="2.15").run()
    per = inv.eager_group_bytes("h100-80gb", "2.15", {})
    verdict = inv.within_budget(out, budget_mib=per / 2**20, per_group_mib=per / 2**20, group_bytes=per)
    assert not verdict and "checkpoint 'init' was met more than once by a rank" in verdict.explanation
    with pytest.raises(ValueError, match="checkpoint 'init' was met more than once by a rank"):
        used_mib(out, CHECKPOINT_INIT)
    assert set(used_mib(out, CHECKPOINT_GROUPS)) == {"n0:cuda:0", "n0:cuda:1"}  # met once: read as ever
