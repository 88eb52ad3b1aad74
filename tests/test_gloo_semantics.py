"""gloo semantics where they differ from NCCL's, pinned against what real torch 2.15.0 gloo does.

Every simulator test names the real figure it reproduces (measured with 2-4 CPU processes over a FileStore, torch
timeout 4 s; see ``simnccl/backends/gloo.py``). The ``real`` tests at the end run the same programs on real gloo
through the differential harness and check that both sides agree, plus the real error text.
"""

from __future__ import annotations

from typing import Any

import pytest

from simnccl.backends.gloo import (
    CROSS_WIRED_TYPE,
    FOREIGN_RANKS,
    SINGLETON_RACE,
    allreduce_waits,
    broadcast_leavers,
    broadcast_needs,
    direct_peers,
    wire_mismatch,
)
from simnccl.engine import RunOutcome
from simnccl.explain import explain
from simnccl.ops import (
    AllGather,
    AllReduce,
    AllToAll,
    Barrier,
    Broadcast,
    Compute,
    DestroyProcessGroup,
    InitProcessGroup,
    NewGroup,
    Op,
    Program,
    Recv,
    ReduceScatter,
    Send,
    SetDevice,
    SplitGroup,
)
from simnccl.real.differential import Case
from simnccl.real.programs import share_identical
from simnccl.report import error_lines
from simnccl.result import VariantResult
from simnccl.testing import simulate

GLOO = InitProcessGroup(backend="gloo")
SIZE = 96


def run(programs: list[list[Op]], *, keep_trace: bool = False) -> RunOutcome:
    return simulate(programs, gpus_per_node=0, ranks_per_node=len(programs), keep_trace=keep_trace)


def _case(programs: list[list[Op]], step: str, index: int = 0) -> Case:
    """``programs`` as a real diff case (seed 0, ``index``), one program object per distinct program, as generated
    cases share them: what ``simulate_case`` and ``compare_variant`` take."""
    return Case(0, index, len(programs), share_identical([Program(tuple(p)) for p in programs]), (step,))


def status(out: RunOutcome, rank: int) -> str:
    """hang (a wait that ended, if at all, in the gloo timeout: its own, or a peer's that closed the pairs it
    waited on, ``replaced_timeout.ended_by``) | the error kind of ``rank`` | done."""
    if any(h["rank"] == rank for h in out.hangs):
        return "hang"
    error = next((e for e in out.errors if e["rank"] == rank), None)
    if error is not None and (error.get("replaced_timeout") or {}).get("ended_by"):
        return "hang"
    return "done" if error is None else error["kind"]


def stuck(out: RunOutcome) -> list[dict[str, Any]]:
    """Every wait that ended, if at all, in a gloo timeout (``status`` "hang"): the hangs, and the waits a peer's
    timeout ended by closing its pairs, by rank."""
    ended = [e["replaced_timeout"] for e in out.errors if (e.get("replaced_timeout") or {}).get("ended_by")]
    return sorted([*out.hangs, *ended], key=lambda h: h["rank"])


# ------------------------------------------------------------------------------------------- closed peers


def test_a_peer_that_destroys_its_groups_fails_a_pending_send_at_once() -> None:
    # real (seed2-case39): rank 1's second send fails "[.../tcp/pair.cc:561] Connection closed by peer" when
    # rank 0, which left out that recv, runs destroy_process_group; nothing hangs.
    out = run(
        [
            [GLOO, Recv(peer=1, size_bytes=SIZE), DestroyProcessGroup()],
            [GLOO, Send(peer=0, size_bytes=SIZE), Send(peer=0, size_bytes=SIZE), DestroyProcessGroup()],
        ]
    )
    assert out.verdict == "error"
    assert [status(out, r) for r in (0, 1)] == ["done", "peer-lost"]
    assert "Connection closed by peer" in out.errors[0]["message"]
    assert out.errors[0]["type"] == "RuntimeError"


def test_an_operation_posted_after_the_peer_closed_fails_at_once() -> None:
    # real: rank 1 destroys first, rank 0 all_reduces a second later -> Connection closed by peer at once
    out = run(
        [
            [GLOO, Barrier(size_bytes=0), AllReduce(size_bytes=SIZE)],
            [GLOO, Barrier(size_bytes=0), DestroyProcessGroup()],
        ]
    )
    assert [status(out, r) for r in (0, 1)] == ["peer-lost", "done"]


def test_only_ring_neighbours_of_the_closed_rank_fail_the_rest_keep_waiting() -> None:
    # real, 4 ranks, rank 3 destroys while 0-2 all_reduce: ranks 0 and 2 "Connection closed by peer", rank 1
    # "Timed out waiting 4000ms for recv operation to complete" (a hang)
    ring = [GLOO, AllReduce(size_bytes=SIZE)]
    out = run([ring, ring, ring, [GLOO, DestroyProcessGroup()]])
    assert [status(out, r) for r in range(4)] == ["peer-lost", "hang", "peer-lost", "done"]


@pytest.mark.parametrize("closes_first", [False, True])
@pytest.mark.parametrize("ring_op", [AllReduce(size_bytes=SIZE), ReduceScatter(size_bytes=SIZE)])
def test_a_ring_member_waiting_on_its_recv_is_not_failed_by_its_send_peer_closing(
    ring_op: Op, closes_first: bool
) -> None:
    # real (torch 2.15 gloo, 4 ranks, rank 0 never joins, rank 2 destroys before or after 1 and 3 joined): gloo's
    # ring receives from rank + 1 and sends to rank - 1, waiting on the recv first; rank 1 (recv from 2) fails,
    # rank 3 (recv from 0, which never sends; its send to 2 is on another buffer) waits until its timeout
    late = [Compute(seconds=1.0)] if closes_first else []
    destroy = [GLOO, *([] if closes_first else [Compute(seconds=1.0)]), DestroyProcessGroup()]
    out = run([[GLOO], [GLOO, *late, ring_op], destroy, [GLOO, *late, ring_op]])
    assert [status(out, r) for r in range(4)] == ["done", "peer-lost", "done", "hang"]


def test_a_ring_member_with_no_first_recv_waits_on_its_send_and_misses_its_recv_peer_closing() -> None:
    # real diff seed25-case19, reduced: rank 1 roots a broadcast of twice the bytes ranks 2 and 3 expect; they
    # abort, rank 0 loses its parent (3). 48 bytes of Int on 4 ranks leave rank 1's first reduce-scatter segment
    # past the end: it posts no recv from 2, waits on its send to 0 (alive, never joining) and hangs on real gloo
    small, big = Broadcast(size_bytes=48, src=1), Broadcast(size_bytes=96, src=1)
    rs = ReduceScatter(size_bytes=48, dtype="Int")
    out = run([[GLOO, small, rs], [GLOO, big, rs], [GLOO, small, rs], [GLOO, small, rs]])
    assert [status(out, r) for r in range(4)] == ["peer-lost", "hang", "abort", "abort"]


def test_allreduce_waits_follow_gloo_s_ring_and_its_segments() -> None:
    assert [allreduce_waits(SIZE, 4, i, 4) for i in range(4)] == [(1, 3), (2, 0), (3, 1), (0, 2)]
    assert allreduce_waits(48, 4, 1, 4) == (0, 2)  # its reduce-scatter segments lie past the end: send first
    assert allreduce_waits(SIZE, 4, 0, 2) == (1, 1)
    assert allreduce_waits(SIZE, 4, 0, 1) == ()


def test_broadcast_fails_the_closed_root_s_children_only() -> None:
    # real, 4 ranks, the root (0) destroys: ranks 1 and 2 (its tree children) fail, rank 3 (1's child) times out
    bcast = [GLOO, Broadcast(size_bytes=SIZE, src=0)]
    out = run([[GLOO, DestroyProcessGroup()], bcast, bcast, bcast])
    assert [status(out, r) for r in range(4)] == ["done", "peer-lost", "peer-lost", "hang"]


def test_broadcast_fails_the_parent_of_a_closed_leaf_and_the_rest_of_the_tree_completes() -> None:
    # real, 4 ranks, rank 2 destroys instead of joining a broadcast from 0: rank 0 (its parent) fails
    # "Connection closed by peer", ranks 1 and 3 complete
    bcast = [GLOO, Broadcast(size_bytes=SIZE, src=0)]
    out = run([bcast, bcast, [GLOO, DestroyProcessGroup()], bcast])
    assert [status(out, r) for r in range(4)] == ["peer-lost", "done", "done", "done"]


def test_a_partial_broadcast_completes_where_the_tree_does_not_need_the_missing_rank() -> None:
    # real (seed3-case17): 4 ranks, rank 2 skips a broadcast from 0: the root hangs in its send to 2, rank 1 and
    # its child 3 complete; rank 1 then hangs in a recv from the root
    bcast = Broadcast(size_bytes=SIZE, src=0)
    out = run(
        [
            [GLOO, bcast, Send(peer=1, size_bytes=SIZE)],
            [GLOO, bcast, Recv(peer=0, size_bytes=SIZE)],
            [GLOO],
            [GLOO, bcast],
        ]
    )
    assert [status(out, r) for r in range(4)] == ["hang", "hang", "done", "done"]
    assert next(h for h in stuck(out) if h["rank"] == 1)["op"].startswith("recv")


def test_a_member_running_another_algorithm_at_the_broadcast_s_tag_is_missing_to_the_tree() -> None:
    # real (seed104-case33): 4 ranks, rank 2 skips a broadcast from 0 and all_to_alls at its tag (another slot):
    # the root hangs in its send to 2, ranks 1 and 3 complete the broadcast and hang in the next all_to_all
    bcast, a2a = Broadcast(size_bytes=SIZE, src=0), AllToAll(size_bytes=SIZE)
    out = run([[GLOO, bcast, a2a], [GLOO, bcast, a2a], [GLOO, a2a], [GLOO, bcast, a2a]])
    assert {h["rank"]: h["op"].split("(")[0] for h in stuck(out)} == {
        0: "broadcast",
        1: "all_to_all",
        2: "all_to_all",
        3: "all_to_all",
    }
    # real, the same with the odd rank arriving first and root 1 (virtual ranks 3, 0, 1, 2): only rank 2, rank 0's
    # parent, waits on it; the root and rank 3 complete
    bcast = Broadcast(size_bytes=SIZE, src=1)
    out = run([[GLOO, a2a], [GLOO, bcast, a2a], [GLOO, bcast, a2a], [GLOO, bcast, a2a]])
    assert {h["rank"]: h["op"].split("(")[0] for h in stuck(out)} == {
        0: "all_to_all",
        1: "all_to_all",
        2: "broadcast",
        3: "all_to_all",
    }


@pytest.mark.parametrize("other", [AllReduce(size_bytes=96), ReduceScatter(size_bytes=48, dtype="Int")])
@pytest.mark.parametrize("late", [(), (0, 3)])
def test_broadcasters_of_different_sizes_beside_another_algorithm_end_by_their_messages(
    other: Op, late: tuple[int, ...]
) -> None:
    # real (torch 2.15 gloo, probes bc-only2-ar and bc-only2-rs-int): ranks 0 and 3 run another algorithm at the
    # tag of a broadcast from 1 (another slot: missing to the tree); rank 1 broadcasts 96 B, rank 2 posts 48 B.
    # Rank 2 receives 96 B from its parent, the root (SIGABRT); rank 3's ring sends to rank 2 and loses it; the
    # root waits on its send to rank 3, rank 0 on its ring recv from rank 1: both hang. ``late``: those ranks
    # arrive after the broadcasters, so the size mismatch is found before the other algorithm is.
    delay = [Compute(seconds=1.0)] if late else []
    out = run(
        [
            [GLOO, *delay, other],
            [GLOO, Broadcast(size_bytes=96, dtype="BFloat16", src=1), other],
            [GLOO, Broadcast(size_bytes=48, dtype="BFloat16", src=1), other],
            [GLOO, *delay, other],
        ]
    )
    assert [status(out, r) for r in range(4)] == ["hang", "hang", "abort", "peer-lost"]
    assert {h["rank"]: h["op"].split("(")[0] for h in stuck(out)} == {0: other.name, 1: "broadcast"}


def test_a_size_mismatch_beside_another_algorithm_ends_by_its_messages() -> None:
    # real (tests/test_real_gloo_semantics.py, 5 runs of 5): ranks 0 to 2 all_gather 96, 192 and 96 B at the tag
    # of rank 3's barrier. The barrier is on another slot, missing to the ring: rank 2 receives 192 B into 96 and
    # aborts, rank 1 (its ring neighbour) and rank 3 (its barrier peer) lose it, rank 0 waits on rank 3. The
    # simulator ran the barrier member as one of the all_gather's and aborted it too. Then the ring allreduce
    # (4 runs of 4): rank 0's 192 B abort rank 3, rank 2's barrier loses its peer 3 (it aborted rank 2 before).
    out = run(
        [
            [GLOO, AllGather(size_bytes=96)],
            [GLOO, AllGather(size_bytes=192)],
            [GLOO, AllGather(size_bytes=96)],
            [GLOO, Barrier()],
        ]
    )
    assert [status(out, r) for r in range(4)] == ["hang", "peer-lost", "abort", "peer-lost"]
    assert "and among the members of all_gather, size mismatch" in out.hangs[0]["explanation"]
    out = run(
        [
            [GLOO, AllReduce(size_bytes=192)],
            [GLOO, AllReduce(size_bytes=96)],
            [GLOO, Barrier()],
            [GLOO, AllReduce(size_bytes=96)],
        ]
    )
    assert [status(out, r) for r in (2, 3)] == ["peer-lost", "abort"]


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_a_full_gloo_broadcast_still_completes_together(ranks: int) -> None:
    out = run([[GLOO, Broadcast(size_bytes=SIZE, src=ranks - 1), AllReduce(size_bytes=SIZE)]] * ranks)
    assert out.verdict == "pass"
    assert len({round(rt.finished_at, 9) for rt in out.ranks}) == 1


def test_broadcast_needs_is_the_parent_chain_and_the_children() -> None:
    assert [broadcast_needs(i, 4) for i in range(4)] == [(1, 2), (0, 3), (0,), (0, 1)]
    assert broadcast_needs(3, 4, root=3) == (0, 1)  # the root's children: virtual ranks 1 and 2


def test_broadcast_leavers_with_one_root_are_the_ranks_whose_needs_joined() -> None:
    # one root: a rank completes exactly when its parent chain and children are in (``broadcast_needs``)
    for size in range(1, 7):
        for root in range(size):
            for joined_bits in range(1 << size):
                joined = [i for i in range(size) if joined_bits >> i & 1]
                expected = {i for i in joined if all(n in joined for n in broadcast_needs(i, size, root))}
                assert broadcast_leavers(dict.fromkeys(joined, root), size) == expected, (size, root, joined)


@pytest.mark.parametrize(
    ("roots", "hung"),
    [
        ((0, 0, 0, 1), []),  # real: rank 3's parent in root 1's tree is rank 1, which sends to it in root 0's
        ((0, 0, 0, 2), [1, 3]),  # real: rank 3 waits on rank 2; rank 1's send to rank 3 is never received
        ((0, 2, 0, 3), [0, 3]),  # real
        ((1, 0, 0, 0), [0, 1, 2, 3]),  # real: the root waits to receive, nobody sends
        ((0, 1), [0, 1]),  # real: both send, neither receives
        ((1, 0, 0), [0, 1, 2]),  # real diff seed0-case21: the simulator passed it
    ],
)
def test_a_broadcast_whose_members_name_different_roots_runs_each_ones_tree(roots: tuple[int, ...], hung) -> None:
    # Each member runs the binomial tree of the root it names (measured, tests/test_real_gloo_semantics.py): the
    # simulator ignored the root and passed every such broadcast.
    out = run([[GLOO, Broadcast(size_bytes=SIZE, src=root)] for root in roots])
    assert [r for r in range(len(roots)) if status(out, r) == "hang"] == hung
    assert out.verdict == ("hang" if hung else "pass")
    if hung:
        assert "broadcast root mismatch at sequence number 1 of group '0'" in str(out.hangs)


def test_an_nccl_broadcast_whose_members_name_different_roots_hangs() -> None:
    # NCCL lays the broadcast out from the root each rank names: not measured (no GPU), reported as a hang of
    # every member with the reason, never a pass
    programs = [
        [SetDevice(rank), InitProcessGroup(), Broadcast(size_bytes=SIZE, src=root)] for rank, root in ((0, 0), (1, 1))
    ]
    out = simulate(programs, gpu="h100-80gb")
    assert out.verdict == "hang"
    assert sorted(h["rank"] for h in out.hangs) == [0, 1]
    assert "broadcast root mismatch" in str(out.hangs) and "NCCL" in str(out.hangs)


def test_an_all_to_all_size_mismatch_is_compared_as_racy() -> None:
    # real (seed2-case11, 6 runs): ranks 0 and 1 abort every time; rank 2, which sent twice the bytes, lost a
    # peer 5 times and completed once. The simulator reports peer-lost and says the outcome is timing, so
    # ``real diff`` compares only the verdict there.
    from simnccl.real.compare import racy
    from simnccl.real.differential import simulate_case

    programs = [[GLOO, AllToAll(size_bytes=SIZE * (2 if rank == 2 else 1))] for rank in range(3)]
    sim = simulate_case(_case(programs, "a2a"))
    assert [(e["rank"], e["kind"]) for e in sim["errors"]] == [(0, "abort"), (1, "abort"), (2, "peer-lost")]
    assert racy(sim)
    pair = [[GLOO, AllReduce(size_bytes=SIZE * (2 if rank == 1 else 1))] for rank in range(2)]
    assert not racy(simulate_case(_case(pair, "ar", 1)))


def test_a_two_member_all_gather_size_mismatch_is_compared_as_racy() -> None:
    # real (seed67-case27, 8 runs): in a 2-rank group, the rank gathering half the bytes aborts every time; its
    # peer, which sent twice the bytes, completed 4 times and lost the peer 4 times. The simulator reports it
    # completing and says the outcome is timing, so ``real diff`` compares only the verdict there; three members
    # are not measured and stay compared rank by rank.
    from simnccl.real.compare import racy
    from simnccl.real.differential import simulate_case

    def gather(world: int, big: int) -> dict[str, Any]:
        programs = [[GLOO, AllGather(size_bytes=SIZE * (2 if rank == big else 1))] for rank in range(world)]
        return simulate_case(_case(programs, "ag", world))

    two = gather(2, 0)
    assert [(e["rank"], e["kind"]) for e in two["errors"]] == [(1, "abort")]
    assert racy(two)
    assert not racy(gather(3, 2))


@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.parametrize("op", [AllReduce, ReduceScatter])
def test_a_ring_allreduce_size_mismatch_of_three_or_more_is_compared_as_racy(
    op: type[AllReduce | ReduceScatter], world: int
) -> None:
    # real: seed94-case7 (3 ranks, 4 runs), rank 2 reduce_scattering twice the bytes hung 3 times and lost its
    # peer once; seed116-case4 (4 ranks, 3 runs), rank 1 all_reducing twice the bytes hung twice and lost its peer
    # once; the others aborted or lost a peer every time. The simulator reports the peer lost and says the
    # outcome is timing; two members are not measured and stay compared rank by rank (the all_to_all test).
    from simnccl.real.compare import racy
    from simnccl.real.differential import simulate_case

    programs = [[GLOO, op(size_bytes=2 * SIZE if rank == 1 else SIZE)] for rank in range(world)]
    sim = simulate_case(_case(programs, "ring"))
    kinds = {e["rank"]: e["kind"] for e in sim["errors"]}
    assert kinds[1] == "peer-lost" and "abort" in kinds.values()
    assert racy(sim)


def test_a_barrier_a_member_left_for_good_is_compared_as_racy() -> None:
    # real (seed27-case3, 6 runs): rank 0 skips the barrier and destroys the world; ranks 1 and 3 lose the peer
    # every time, rank 2 loses it 3 times and hangs 3 times. The simulator reports every member losing it and
    # says the outcome is timing, so ``real diff`` compares only the verdict there.
    from simnccl.real.compare import racy
    from simnccl.real.differential import simulate_case

    programs = [[GLOO, DestroyProcessGroup()]] + [[GLOO, Barrier(), DestroyProcessGroup()]] * 3
    sim = simulate_case(_case(programs, "barrier"))
    assert [(e["rank"], e["kind"]) for e in sim["errors"]] == [(1, "peer-lost"), (2, "peer-lost"), (3, "peer-lost")]
    assert racy(sim)
    # a collective other than a barrier stays compared rank by rank
    reduced = [[GLOO, DestroyProcessGroup()]] + [[GLOO, AllReduce(size_bytes=SIZE), DestroyProcessGroup()]] * 3
    assert not racy(simulate_case(_case(reduced, "ar", 1)))


def test_members_timing_out_together_are_compared_as_racy() -> None:
    # real (seed3-case41, 7 runs): ranks 0 and 1 both root a broadcast on a 2 s group and wait for each other;
    # both time out in 4 runs, one of them loses the peer (its closed pairs) in 3. The simulator reports both
    # timing out and says which is timing; one member timing out alone is not racy.
    from simnccl.real.compare import racy
    from simnccl.real.differential import simulate_case

    group = NewGroup(ranks=(0, 1), bind="g", timeout_s=2.0)
    both = [[GLOO, group, Broadcast(group="g", size_bytes=SIZE, src=r)] for r in range(2)]
    sim = simulate_case(_case(both, "both"))
    ended = {"end_reason": "finished"}  # a real run that went on until the timeouts fired
    assert [h["rank"] for h in sim["hangs"]] == [0, 1] and racy(sim, ended)
    assert not racy(sim, {"end_reason": "no progress for 5s"}), "stopped before any timeout fired: compared"
    alone = [[GLOO, group, AllReduce(group="g", size_bytes=SIZE)], [GLOO, group]]
    sim = simulate_case(_case(alone, "alone", 1))
    assert [h["rank"] for h in sim["hangs"]] == [0] and not racy(sim, ended)


def test_a_peer_that_failed_with_an_exception_keeps_its_sockets_open() -> None:
    # real, 3 ranks: rank 1 destroys; rank 0 (recv from 1) fails Connection closed by peer; rank 2, receiving from
    # rank 0, times out ("Timed out waiting 4000ms for recv operation"): rank 0 is alive, its sockets open
    out = run(
        [
            [GLOO, Recv(peer=1, size_bytes=SIZE), Send(peer=2, size_bytes=SIZE)],
            [GLOO, DestroyProcessGroup()],
            [GLOO, Recv(peer=0, size_bytes=SIZE)],
        ]
    )
    assert [status(out, r) for r in range(3)] == ["peer-lost", "done", "hang"]


def test_destroy_closes_the_default_group_only_subgroups_live_on_in_their_handles() -> None:
    # real (seed3-case47, driver keeping its groups as frameworks do): rank 2 destroys every group while rank 3
    # waits on it in a reduce_scatter of their split group: gloo has no shutdown, the split's ProcessGroupGloo
    # is still referenced, its sockets stay open: rank 3 hangs
    split = SplitGroup(split_ranks=((0, 1),), bind="s")
    out = run([[GLOO, split, ReduceScatter(group="s", size_bytes=SIZE)], [GLOO, split, DestroyProcessGroup()]])
    assert [status(out, r) for r in (0, 1)] == ["hang", "done"]


def test_an_aborted_process_closes_its_sockets_too() -> None:
    # a size mismatch aborts rank 0 (it receives 2 x SIZE / 4 bytes into SIZE / 4: gloo::EnforceNotMet, SIGABRT),
    # rank 1 loses it; rank 2 waits on rank 0 on the world group and fails as its peer's sockets close too
    pair = NewGroup(ranks=(0, 1), bind="g")
    out = run(
        [
            [GLOO, pair, AllReduce(group="g", size_bytes=SIZE), Send(peer=2, size_bytes=SIZE)],
            [GLOO, pair, AllReduce(group="g", size_bytes=2 * SIZE)],
            [GLOO, pair, Recv(peer=0, size_bytes=SIZE)],
        ]
    )
    assert [status(out, r) for r in range(3)] == ["abort", "peer-lost", "peer-lost"]


def test_direct_peers_follow_gloo_s_algorithms() -> None:
    assert [direct_peers("all_reduce", i, 4) for i in range(4)] == [(1, 3), (0, 2), (1, 3), (0, 2)]
    assert [direct_peers("broadcast", i, 4) for i in range(4)] == [(1, 2), (0, 3), (0,), (1,)]
    assert direct_peers("broadcast", 0, 4, root=2) == (2,)  # virtual rank 2 under root 2: child of the root
    assert direct_peers("barrier", 1, 4) == direct_peers("all_to_all", 1, 4) == (0, 2, 3)
    assert direct_peers("all_reduce", 0, 1) == ()


# ------------------------------------------------------------------------------------------- mismatches


@pytest.mark.parametrize(
    ("a", "b", "verdict"),
    [
        # real: both ranks "Timed out waiting 4000ms for recv/send operation to complete" (different slots)
        (AllReduce(size_bytes=SIZE), Broadcast(size_bytes=SIZE), "hang"),
        (AllReduce(size_bytes=SIZE), AllGather(size_bytes=SIZE), "hang"),
        (AllReduce(size_bytes=SIZE), Barrier(size_bytes=SIZE), "hang"),
        (AllReduce(size_bytes=SIZE), AllToAll(size_bytes=SIZE), "hang"),
        (Broadcast(size_bytes=SIZE), Barrier(size_bytes=SIZE), "hang"),
        (AllGather(size_bytes=SIZE), ReduceScatter(size_bytes=SIZE), "hang"),
        # real: both complete (torch's gloo reduce_scatter is an allreduce)
        (AllReduce(size_bytes=SIZE), ReduceScatter(size_bytes=SIZE), "pass"),
        # real: "[enforce fail at .../tcp/pair.cc:464] op.preamble.length <= op.nbytes. 48 vs 24. Received data
        # size doesn't match expected size" (SIGABRT) on the smaller rank; the other: Connection reset by peer
        (AllReduce(size_bytes=SIZE), AllReduce(size_bytes=2 * SIZE), "error"),
    ],
)
def test_gloo_collective_mismatches_end_as_real_gloo_does(a: Op, b: Op, verdict: str) -> None:
    out = run([[GLOO, a], [GLOO, b]])
    assert out.verdict == verdict
    if verdict == "hang":
        assert "different gloo algorithms" in out.hangs[0]["explanation"]


# Measured on torch 2.15.0 gloo (CPU, FileStore, timeout 8 s): one op per rank, each rank's buffer in floats, and
# how each rank left it. abort: SIGABRT, "[enforce fail at .../tcp/pair.cc:464] op.preamble.length <= op.nbytes. 8
# vs 4. Received data size doesn't match expected size"; peer-lost: RuntimeError "Read error ...: Connection reset
# by peer" (or, for some neighbours, "Connection closed by peer") within 0.1 s; hang: "Timed out waiting 8000ms".
MEASURED = [
    (AllReduce, (4, 8), "abort peer-lost"),
    (AllReduce, (8, 4), "peer-lost abort"),
    (AllReduce, (4, 4, 8), "peer-lost abort peer-lost"),
    (AllReduce, (8, 4, 4), "peer-lost peer-lost abort"),
    (AllReduce, (4, 8, 4), "abort peer-lost peer-lost"),
    (AllReduce, (8, 8, 4), "peer-lost peer-lost abort"),
    (AllReduce, (4, 4, 4, 8), "done done done hang"),  # same segments: rank 3 waits on messages never sent
    (AllReduce, (8, 4, 4, 4), "hang done done done"),
    (AllReduce, (1000, 2000), "abort peer-lost"),
    (AllReduce, (2000, 1000, 1000), "peer-lost peer-lost abort"),
    (Broadcast, (4, 8), "done done"),  # a recv larger than the message completes
    (Broadcast, (8, 4), "done abort"),
    (Broadcast, (8, 4, 4), "done abort abort"),
    (Broadcast, (4, 4, 8), "done done done"),
    (Broadcast, (4, 8, 8, 8), "done done done done"),
    (Broadcast, (8, 4, 4, 4), "done abort abort peer-lost"),  # rank 3's parent is rank 1
    (AllGather, (4, 8), "abort done"),
    (AllGather, (8, 4), "done abort"),
    (AllGather, (4, 4, 8), "abort peer-lost peer-lost"),
    (AllGather, (8, 4, 4), "peer-lost abort peer-lost"),
    (ReduceScatter, (8, 16), "abort peer-lost"),  # torch's input: an allreduce of it
    (AllToAll, (8, 16), "abort peer-lost"),  # inputs; every chunk of the larger rank is too large
    (AllToAll, (12, 12, 24), "abort abort peer-lost"),
]


@pytest.mark.parametrize(("op", "floats", "expected"), MEASURED)
def test_a_gloo_size_mismatch_ends_each_rank_as_real_gloo_does(
    op: type, floats: tuple[int, ...], expected: str
) -> None:
    """Real gloo checks sizes per message: only a rank that receives more than it posted aborts, its peers still
    waiting on it lose it, and members whose messages all fit complete (the simulator aborted every rank)."""
    out = run([[GLOO, op(size_bytes=4 * n)] for n in floats])
    assert " ".join(status(out, r) for r in range(len(floats))) == expected
    for error in out.errors:
        if error["kind"] == "abort":
            assert "op.preamble.length <= op.nbytes" in error["message"] and error["type"] == "SIGABRT"
        if error["kind"] == "peer-lost":
            assert error["type"] == "RuntimeError"
            assert "Connection reset by peer" in error["message"] or "Connection closed by peer" in error["message"]


@pytest.mark.parametrize(("sent", "posted", "expected"), [(32, 16, "done abort"), (16, 32, "done done")])
def test_a_gloo_recv_smaller_than_its_send_aborts_the_receiver(sent: int, posted: int, expected: str) -> None:
    # real: send 8 floats into a recv of 4: the receiver aborts (EnforceNotMet), the sender completes; a recv
    # larger than the message completes (the simulator left both waiting: a hang)
    out = run([[GLOO, Send(peer=1, size_bytes=sent)], [GLOO, Recv(peer=0, size_bytes=posted)]])
    assert " ".join(status(out, r) for r in range(2)) == expected


def test_wire_mismatch_rules() -> None:
    assert wire_mismatch(("all_reduce", 96, "Float"), ("reduce_scatter", 96, "Float")) is None
    assert wire_mismatch(("barrier", 96, "Float"), ("barrier", 8, "Float")) is None  # a barrier carries no data
    assert wire_mismatch(("all_reduce", 96, "Float"), ("broadcast", 96, "Float")) == "hang"
    assert wire_mismatch(("broadcast", 96, "Float"), ("broadcast", 192, "Float")) == "abort"


# ------------------------------------------------------------------------------------------- split_group


def test_gloo_split_is_a_members_only_bootstrap() -> None:
    # real: ranks 0 and 1 split [[0, 1]] and all_reduce on it while rank 2 never calls split_group: all done
    split = SplitGroup(split_ranks=((0, 1),), bind="s")
    out = run(
        [
            [GLOO, split, AllReduce(group="s", size_bytes=SIZE)],
            [GLOO, split, AllReduce(group="s", size_bytes=SIZE)],
            [GLOO],
        ]
    )
    assert out.verdict == "pass"


def test_gloo_split_non_member_does_not_wait_and_the_split_takes_no_parent_tag() -> None:
    # real: a non-member's split_group returns NON_GROUP_MEMBER at once (0.00 s while members wait 1 s for a
    # late member); the split is no operation on the parent, so world collectives after it still line up
    split = SplitGroup(split_ranks=((0, 1),), bind="s")
    member = [GLOO, split, AllReduce(size_bytes=SIZE)]
    out = run([member, member, [GLOO, AllReduce(size_bytes=SIZE), split]])
    assert out.verdict == "pass"


def test_gloo_split_in_a_shared_program_does_not_synchronise_non_members() -> None:
    # every rank runs one Program object (the engine's cohort fast path): the non-member must still leave at once
    program = [GLOO, SplitGroup(split_ranks=((0, 1),), bind="s")]
    out = run([program, program, program])
    assert out.verdict == "pass"
    finished = {rt.rank: rt.finished_at for rt in out.ranks}
    assert finished[2] < finished[0] == finished[1]


def test_gloo_split_members_with_diverged_counters_never_meet() -> None:
    # the name hashes the group counter: a rank that skipped a new_group bootstraps under another name
    split = SplitGroup(split_ranks=((0, 1),), bind="s")
    family = NewGroup(ranks=(0, 1), bind="g")
    out = run([[GLOO, family, split], [GLOO, split]])
    assert out.verdict == "hang"
    assert {h["kind"] for h in out.hangs} == {"bootstrap"}


def test_split_group_of_a_parent_the_rank_is_not_in_is_torchs_value_error() -> None:
    # real (world 3): rank 2 holds -100 for g; split_group(parent_pg=g) raises
    # "ValueError: Global rank 2 is not part of the parent group -100"; ranks 0 and 1 split g.
    program = [GLOO, NewGroup(ranks=(0, 1), bind="g"), SplitGroup(parent="g", split_ranks=((0,), (1,)))]
    out = run([program] * 3)
    assert [status(out, r) for r in range(3)] == ["done", "done", "error"]
    assert (out.errors[0]["type"], out.errors[0]["message"]) == (
        "ValueError",
        "Global rank 2 is not part of the parent group -100",
    )


def test_splits_of_two_parents_under_one_hashed_name_do_not_collide() -> None:
    # real (seed23-case11, 3 of 3 runs): family g = [[0, 1], [2, 3]], each part splits its own group by [[0, 1]]:
    # one hashed name on every rank (same group ranks, same counter), yet all complete and the all_reduce on the
    # split passes: the child's store is prefixed on its parent's, whose names differ. The simulator keyed both
    # bootstraps by the bare name and hung ranks 2 and 3 as a store-key collision.
    family = [NewGroup(ranks=(0, 1), bind="g"), NewGroup(ranks=(2, 3), bind="g")]
    split = SplitGroup(parent="g", split_ranks=((0, 1),), bind="s")
    out = run([[GLOO, *family, split, AllReduce(group="s", size_bytes=SIZE)]] * 4)
    assert out.verdict == "pass", out.hangs


# ------------------------------------------------------------------------------------------- after a destroy

G = NewGroup(ranks=(0, 1), bind="g")
DESTROY_G = DestroyProcessGroup(group="g")


def test_an_all_reduce_on_a_destroyed_gloo_group_runs_on_its_pairs() -> None:
    # real (3 of 3 runs): both members all_reduce on g after destroying it: both complete. The simulator raised
    # torch's "Invalid process group specified", which only destroy/get_backend raise for an unregistered group.
    out = run([[GLOO, G, DESTROY_G, AllReduce(group="g", size_bytes=SIZE)]] * 2)
    assert out.verdict == "pass", out.errors


def test_an_all_reduce_on_a_destroyed_gloo_group_by_one_member_waits_for_the_other() -> None:
    # real (3 of 3 runs, stopped by the stall detector before the timeout): rank 0 all_reduces on g after
    # destroying it, rank 1 does not: rank 0 waits there, and a world all_reduce after it leaves rank 1 waiting
    # for rank 0. The simulator runs on to g's timeout, where torch raises its ValueError on rank 0 (a Python
    # error keeps rank 0's sockets open: rank 1 still waits)
    out = run(
        [
            [GLOO, G, DESTROY_G, AllReduce(group="g", size_bytes=SIZE), AllReduce(size_bytes=SIZE)],
            [GLOO, G, DESTROY_G, AllReduce(size_bytes=SIZE)],
        ]
    )
    assert [status(out, r) for r in range(2)] == ["error", "hang"]
    assert out.errors[0]["replaced_timeout"]["waiting_for"] == [1]
    assert out.hangs[0]["waiting_for"] == [0]


def test_a_timeout_on_a_destroyed_gloo_group_is_torchs_value_error_not_a_hang() -> None:
    # real (seed23-case34, 2 of 2 runs; a 2-process probe: all_reduce, all_gather_into_tensor, reduce_scatter_tensor and
    # all_to_all_single alike): rank 0's op on a destroyed 1 s group times out, and torch's @_exception_logger,
    # asking get_backend(group=...) for the unregistered group, raises "ValueError: Process group <...> is not
    # initialized in the world group map" in place of gloo's timeout: the rank raised (an error the program could
    # catch), it is not stuck. What it waited for stays with the error.
    group = NewGroup(ranks=(0, 1), bind="g", timeout_s=1.0)
    out = run([[GLOO, group, DESTROY_G, AllReduce(group="g", size_bytes=SIZE)], [GLOO, group, DESTROY_G]])
    assert out.verdict == "error" and out.hangs == []
    assert [(e["rank"], e["kind"], e["type"]) for e in out.errors] == [(0, "error", "ValueError")]
    assert "is not initialized in the world group map" in out.errors[0]["message"]
    waited = out.errors[0]["replaced_timeout"]
    assert (waited["op_index"], waited["waiting_for"], waited["timeout_s"]) == (3, [1], 1.0)
    assert waited["explanation"] == "rank 1 finished its program without joining"


def test_the_report_and_explain_say_what_a_destroyed_group_s_timeout_waited_for() -> None:
    # torch's ValueError names only a group object: the run report and explain add the wait it replaced
    group = NewGroup(ranks=(0, 1), bind="g", timeout_s=1.0)
    out = run([[GLOO, group, DESTROY_G, AllReduce(group="g", size_bytes=SIZE)], [GLOO, group, DESTROY_G]])
    why = (
        "raised in place of its timeout, after 1 s in collective 1 on group '1', waiting for rank 1: rank 1 "
        "finished its program without joining"
    )
    [line] = error_lines(out.errors)
    assert line.endswith(f"Please initialize the group first. ({why})")
    text = explain(VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", out))
    assert f"Please initialize the group first. torch {why}." in text and ".." not in text


def test_explain_says_died_only_of_a_process_that_died() -> None:
    # a size mismatch: the rank that receives more than it posted aborts (SIGABRT, its process dies); its peer
    # raises "Connection reset by peer", an exception its program could catch; and the destroyed handle's
    # ValueError above is raised too
    out = run([[GLOO, AllReduce(size_bytes=SIZE)], [GLOO, AllReduce(size_bytes=2 * SIZE)]])
    kinds = {e["rank"]: e["kind"] for e in out.errors}
    assert sorted(kinds.values()) == ["abort", "peer-lost"]
    text = explain(VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", out))
    for rank, kind in kinds.items():
        assert f"Rank {rank} {'died' if kind == 'abort' else 'raised'} at t=" in text, text
    group = NewGroup(ranks=(0, 1), bind="g", timeout_s=1.0)
    out = run([[GLOO, group, DESTROY_G, AllReduce(group="g", size_bytes=SIZE)], [GLOO, group, DESTROY_G]])
    text = explain(VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", out))
    assert "Rank 0 raised at t=" in text and "died" not in text, text


def test_a_timeout_on_a_live_gloo_group_stays_a_hang() -> None:
    # the same wait on a group nobody destroyed: gloo's own timeout, a hang
    group = NewGroup(ranks=(0, 1), bind="g", timeout_s=1.0)
    out = run([[GLOO, group, AllReduce(group="g", size_bytes=SIZE)], [GLOO, group]])
    assert out.verdict == "hang" and [h["rank"] for h in out.hangs] == [0]
    assert [(e["kind"], e["type"]) for e in out.errors] == [("timeout", "RuntimeError")]
    assert "replaced_timeout" not in out.errors[0]


@pytest.mark.parametrize(
    "op", [Broadcast(group="g", size_bytes=SIZE, src=0), Send(peer=1, group="g", size_bytes=SIZE)], ids=str
)
def test_a_broadcast_or_send_on_a_destroyed_group_is_torchs_value_error(op: Op) -> None:
    # real (3 of 3 runs): broadcast's src and send's peer are looked up in the unregistered group: ValueError
    out = run([[GLOO, G, DESTROY_G, op], [GLOO, G, DESTROY_G]])
    assert [(e["rank"], e["type"]) for e in out.errors] == [(0, "ValueError")]


def test_a_monitored_barrier_waits_the_backends_default_timeout_not_the_groups() -> None:
    # Found by a tester (real 2.15 gloo, 3 runs): a peer 1.5 s late to a monitored_barrier on a group of timeout
    # 1 s passes; torch's monitored_barrier(timeout=None) waits _get_default_timeout(get_backend(group)), 30
    # minutes for gloo. The simulator timed rank 0 out at the group's 1 s. A plain barrier keeps the group's (rank
    # 0 times out, closing its pairs: the late rank 1 fails as peer-lost, an error).
    group = NewGroup(ranks=(0, 1), bind="g", timeout_s=1.0)
    for call, verdict in (("monitored_barrier", "pass"), ("", "error")):
        barrier = Barrier(group="g", call=call)
        out = run([[GLOO, group, barrier], [GLOO, group, Compute(seconds=1.5), barrier]])
        assert out.verdict == verdict, (call, out.hangs, out.errors)
    late = run([[GLOO, group, Barrier(group="g", call="monitored_barrier")], [GLOO, group, Compute(seconds=1801.0)]])
    assert late.verdict == "hang" and late.hangs[0]["timeout_s"] == 1800.0, late.hangs
    # its own timeout (monitored_barrier(timeout=...), what a capture records) is its wait's, however long the
    # group's: 1 s under a group of 60 s times the late peer out (real gloo: an error on both ranks, 1 run)
    slow_group = NewGroup(ranks=(0, 1), bind="g", timeout_s=60.0)
    own = Barrier(group="g", call="monitored_barrier", timeout_s=1.0)
    out = run([[GLOO, slow_group, own], [GLOO, slow_group, Compute(seconds=1.5), own]])
    assert [(e["rank"], e["kind"]) for e in out.errors] == [(0, "timeout"), (1, "peer-lost")], out.errors
    with pytest.raises(ValueError, match="only a monitored_barrier has one"):
        Barrier(group="g", timeout_s=1.0)


@pytest.mark.parametrize(
    "op",
    [AllReduce(size_bytes=SIZE), Broadcast(size_bytes=SIZE, src=0), Barrier(), AllGather(size_bytes=SIZE)],
    ids=lambda op: op.name,
)
def test_a_rank_late_past_its_peers_gloo_timeout_fails_as_peer_lost_not_done(op: Op) -> None:
    # Found by a tester (real 2.15 gloo, 2 ranks, 2 runs each; all_reduce, broadcast, barrier alike): rank 0 times
    # out at 1 s, and gloo closes every pair of its context before torch raises; rank 1, 1.8 s late, fails with
    # "Connection closed by peer" at its op. The simulator completed rank 1's op with a rank that had left it.
    init = InitProcessGroup(backend="gloo", timeout_s=1.0)
    out = run([[init, op], [init, Compute(seconds=1.8), op]])
    assert [(e["rank"], e["kind"]) for e in out.errors] == [(0, "timeout"), (1, "peer-lost")], out.errors
    assert "Connection closed by peer (rank 0)" in out.errors[1]["message"]
    assert out.errors[1]["time_s"] == pytest.approx(1.8, abs=0.01)


def test_members_timing_out_together_are_reported_waiting_for_the_rank_that_never_came() -> None:
    # Found by a tester: the timed-out rank left the operation as it fired, before the next member's hang entry
    # was built, so ranks 0-2 read as waiting for each other ("waiting for ranks 0-1, 3")
    init = InitProcessGroup(backend="gloo", timeout_s=1.0)
    gather = AllGather(size_bytes=SIZE)
    out = run([[init, gather]] * 3 + [[init, Compute(seconds=2.0), gather]])
    assert {h["rank"]: h["waiting_for"] for h in out.hangs} == {0: [3], 1: [3], 2: [3]}
    assert [(e["rank"], e["kind"]) for e in out.errors if e["kind"] != "timeout"] == [(3, "peer-lost")]


def test_a_peer_still_waiting_when_another_member_times_out_fails_as_peer_lost_then() -> None:
    # real (a tester's s19, 2 runs): rank 1 made g with a 2 s timeout, rank 0 with the default; each receives from
    # the other, so both wait: rank 1 times out at 2 s and closes its pairs, and rank 0 fails then with
    # "Connection closed by peer" instead of waiting its 30 minutes. What rank 0 waited for stays with its error
    # (``ended_by``): a real run stopped before that timeout saw it stuck.
    out = run(
        [
            [GLOO, NewGroup(ranks=(0, 1), bind="g"), Recv(peer=1, group="g", size_bytes=SIZE)],
            [GLOO, NewGroup(ranks=(0, 1), bind="g", timeout_s=2.0), Recv(peer=0, group="g", size_bytes=SIZE)],
        ]
    )
    assert [(e["rank"], e["kind"]) for e in out.errors] == [(0, "peer-lost"), (1, "timeout")], out.errors
    lost = out.errors[0]
    assert lost["time_s"] == pytest.approx(2.0, abs=0.05)
    assert lost["replaced_timeout"]["waiting_for"] == [1]
    assert lost["replaced_timeout"]["ended_by"] == "rank 1's timeout closed its gloo pairs"
    assert status(out, 0) == "hang"


REDUCE_G = AllReduce(group="g", size_bytes=SIZE, call="reduce", root=0)
GATHER_G = AllGather(group="g", size_bytes=SIZE, call="gather", root=0)
MONITORED_G = Barrier(group="g", call="monitored_barrier")


@pytest.mark.parametrize(
    ("op", "world_destroyed", "says"),
    [
        (REDUCE_G, False, "is not initialized in the world group map"),
        (GATHER_G, False, "is not initialized in the world group map"),
        (MONITORED_G, False, "is not initialized in the world group map"),
        (REDUCE_G, True, "is not registered, please create group with torch.distributed.new_group API"),
        (GATHER_G, True, "Default process group has not been initialized"),
        (MONITORED_G, True, "is not initialized in the world group map"),
    ],
    ids=str,
)
def test_a_call_that_looks_its_destroyed_group_up_is_torchs_value_error(
    op: Op, world_destroyed: bool, says: str
) -> None:
    # Found by a tester (real 2.15 gloo, 2 ranks, each case compared: sim pass | real error): a reduce's or
    # gather's root and a monitored_barrier's backend are looked up in the unregistered group, where the
    # all_reduce, all_gather and barrier they are simulated as run on its pairs.
    destroy = DestroyProcessGroup() if world_destroyed else DESTROY_G
    out = run([[GLOO, G, destroy, op]] * 2)
    assert [(e["rank"], e["type"]) for e in out.errors] == [(0, "ValueError"), (1, "ValueError")], out.errors
    assert says in out.errors[0]["message"]


def test_a_subgroup_kept_past_the_world_s_destroy_still_runs_an_all_reduce() -> None:
    # Found by a tester: the simulator (and the real driver) dropped every handle at destroy_process_group(), so
    # the kept subgroup was "never bound" (NameError). Real (2.15 gloo, 4 runs): all_reduce, all_gather and
    # barrier on it complete after the world's destroy; a broadcast raises ValueError.
    world_destroy = DestroyProcessGroup()
    out = run(
        [[GLOO, G, world_destroy, AllReduce(group="g", size_bytes=SIZE), AllGather(group="g", size_bytes=SIZE)]] * 2
    )
    assert out.verdict == "pass", out.errors
    out = run([[GLOO, G, world_destroy, Broadcast(group="g", size_bytes=SIZE, src=0)]] * 2)
    assert [e["type"] for e in out.errors] == ["ValueError", "ValueError"]


def test_a_barrier_on_a_destroyed_gloo_group_runs_on_a_cpu_only_host_and_raises_beside_a_gpu() -> None:
    # torch 2.15's barrier asks the group for its device only where an accelerator is present
    # (``device.type == "cpu" or _get_object_coll_device(group)``). Found by a tester: the simulator raised on a
    # CPU-only cluster, where real gloo (CPU build, 5 runs) completes the barrier.
    programs = [[GLOO, G, DESTROY_G, Barrier(group="g")]] * 2
    assert run(programs).verdict == "pass"
    beside_gpus = simulate(programs, gpus_per_node=2)
    assert [e["type"] for e in beside_gpus.errors] == ["ValueError", "ValueError"]


# ------------------------------------------------------------------------------------------- bound gloo world


@pytest.mark.parametrize("device_id", ["cpu:0", 0])
def test_new_group_under_a_device_bound_gloo_world_fails_its_non_members_only(device_id: str | int) -> None:
    # real (world 3, device_id=cpu:0): _get_split_source returns the ProcessGroupGloo, so rank 2, outside
    # new_group([0, 1]), gets AttributeError: '...ProcessGroupGloo' object has no attribute 'perform_nocolor_split';
    # ranks 0 and 1 build group "1" (a fresh gloo bootstrap) and use it.
    init = InitProcessGroup(backend="gloo", device_id=device_id)
    new = NewGroup(ranks=(0, 1), bind="g")
    member = [init, new, AllReduce(group="g")]
    out = simulate([member, member, [init, new]], gpus_per_node=1 if device_id == 0 else 0, ranks_per_node=3)
    assert [status(out, r) for r in range(3)] == ["done", "done", "error"]
    assert out.errors[0]["type"] == "AttributeError"
    assert out.errors[0]["message"] == (
        "'torch._C._distributed_c10d.ProcessGroupGloo' object has no attribute 'perform_nocolor_split'"
    )


def test_new_group_under_an_unbound_gloo_world_leaves_non_members_alone() -> None:
    new = NewGroup(ranks=(0, 1), bind="g")
    member = [GLOO, new, AllReduce(group="g")]
    assert run([member, member, [GLOO, new]]).verdict == "pass"


# ------------------------------------------------------------------------------------------- one-rank groups


def test_a_one_rank_group_s_key_colliding_with_a_real_group_is_a_verdict_race() -> None:
    # seed2-case27: rank 1 creates [1] under the name ranks 0 and 2 give [0, 2] (swapped creation order); a
    # one-rank gloo group still writes its key (measured: new_group([0]) adds one store key). Real runs of this
    # program hung once and passed twice: the order of the two writes decides.
    from simnccl.real.compare import compare_variant
    from simnccl.real.differential import CaseResult, classify, simulate_case

    pair, single = NewGroup(ranks=(0, 2), bind="g"), NewGroup(ranks=(1,), bind="g")
    programs = [[GLOO, pair, single, Barrier(group="g")], [GLOO, single, pair, Barrier(group="g")]]
    programs.append(programs[0])
    out = run(programs)
    assert out.verdict == "hang"
    assert any("one-rank group's key" in h["explanation"] for h in out.hangs)
    case = _case(programs, "singleton")
    sim = simulate_case(case)
    for real_verdict in ("pass", "hang"):
        real = {"verdict": real_verdict, "hangs": [], "errors": []}
        if real_verdict == "hang":
            real["hangs"] = [{"rank": 0, "op": "new_group", "kind": "bootstrap"}]
        comparison = compare_variant("singleton", "cpu", sim, real, 3, 0.0)
        assert classify(CaseResult(case, comparison)) == "racy"


@pytest.mark.parametrize("together", [True, False])
def test_a_later_group_complete_under_a_name_taken_before_is_a_verdict_race(together: bool) -> None:
    # seed92-case29: a local-synchronization group advances ranks 0 and 2's counter, so their new_group([0, 2])
    # takes the name [1, 3] already bootstrapped under. Both leave an all_reduce together and each writes its
    # address over the earlier key just before reading its peer's: real runs passed 4 times in 8 and hung 4.
    # A member coming later reads the earlier group's key before its peer writes: the hang is certain.
    from simnccl.backends.gloo import COMPLETE_COLLISION_RACE
    from simnccl.real.compare import verdict_racy
    from simnccl.real.differential import simulate_case

    local = NewGroup(ranks=(0, 2), bind="l1", use_local_synchronization=True)
    pair, odds = NewGroup(ranks=(0, 2), bind="g2"), NewGroup(ranks=(1, 3), bind="g2")
    late = [] if together else [Compute(seconds=1.0)]
    evens = [GLOO, local, AllReduce(group="l1", size_bytes=SIZE)]
    programs = [[*evens, pair, odds], [GLOO, pair, odds], [*evens, *late, pair, odds], [GLOO, pair, odds]]
    out = run(programs)
    assert out.verdict == "hang" and sorted(h["rank"] for h in out.hangs) == [0, 2]
    assert all("already bootstrapped ranks [1, 3]" in h["explanation"] for h in out.hangs)
    assert all((COMPLETE_COLLISION_RACE in h["explanation"]) is together for h in out.hangs)
    case = _case(programs, "late")
    assert verdict_racy(simulate_case(case)) is together


def test_a_collision_of_groups_complete_under_one_name_is_a_verdict_race() -> None:
    # seed124-case38: [0, 2] and [1, 3] both bootstrap under one name (ranks 1 and 3 skipped a new_group), every
    # member of each there; each writes its group-rank key, then reads its peers'. Real runs of that program
    # passed 4 times in 10 and hung 6: a member reads its own group's address or the other's, by the order of the
    # writes. With rank 3 not skipping, [1, 3] lacks a member under that name and the hang is certain.
    from simnccl.backends.gloo import COMPLETE_COLLISION_RACE
    from simnccl.real.compare import compare_variant
    from simnccl.real.differential import CaseResult, classify, simulate_case

    evens, odds = NewGroup(ranks=(0, 2), bind="g"), NewGroup(ranks=(1, 3), bind="g")
    both, odd_only = [GLOO, evens, odds], [GLOO, odds]
    for programs, race in (([both, odd_only, both, odd_only], True), ([both, odd_only, both, both], False)):
        out = run(programs)
        assert out.verdict == "hang"
        assert any(COMPLETE_COLLISION_RACE in h["explanation"] for h in out.hangs) is race
        case = _case(programs, "collision")
        real = {"verdict": "pass", "hangs": [], "errors": []}
        comparison = compare_variant("collision", "cpu", simulate_case(case), real, 4, 0.0)
        assert classify(CaseResult(case, comparison)) == ("racy" if race else "disagree")


# ------------------------------------------------------------------------------------------- cross-wired groups

# seed111-case9's shape: ranks 0, 2 and 3 make a local-synchronization group, so their counter runs one ahead of
# rank 1's, and rank 0 makes [1, 3] before [0, 2]. Under name '2' rank 1 bootstraps [1, 3] as group rank 0 and
# rank 2 [0, 2] as group rank 1; under '3' ranks 0 and 3 the same: each group-rank key is written once.
_LOCAL = NewGroup(ranks=(0, 2, 3), bind="l", use_local_synchronization=True)
_ODDS, _EVENS = NewGroup(ranks=(1, 3), bind="g"), NewGroup(ranks=(0, 2), bind="g")


def _wired(out: RunOutcome) -> list[tuple[Any, ...]]:
    """The trace's cross-wired events: (time, rank, "cross-wired", name, the ranks wired in group-rank order)."""
    return [e for e in out.trace if len(e) > 2 and e[2] == "cross-wired"]


def _cross_wired(*tail: list[Op]) -> list[list[Op]]:
    heads = [[GLOO, _LOCAL, _ODDS, _EVENS], [GLOO, _EVENS, _ODDS], [GLOO, _LOCAL, _EVENS, _ODDS]]
    heads.append(heads[2])
    return [[*head, *ops] for head, ops in zip(heads, tail, strict=True)]


def test_two_groups_of_one_size_whose_group_ranks_differ_bootstrap_cross_wired() -> None:
    # real (seed111-case9, 4 runs of 4, and tests/test_real_gloo_cross_wiring.py): both bootstraps complete, gloo
    # connecting ranks 1 and 2 under '2' and 0 and 3 under '3'. The simulator reported a store-key collision hang.
    out = run(_cross_wired([], [], [], []), keep_trace=True)
    assert out.verdict == "pass", out.hangs
    wired = sorted((e[1], e[3], tuple(e[4])) for e in _wired(out))
    assert wired == [(0, "3", (0, 3)), (1, "2", (1, 2)), (2, "2", (1, 2)), (3, "3", (0, 3))]


@pytest.mark.parametrize(
    "ops",
    [
        [[AllReduce(group="g", size_bytes=SIZE)]] * 4,
        [[Broadcast(group="g", size_bytes=SIZE, src=0)], [Broadcast(group="g", size_bytes=SIZE, src=1)]] * 2,
    ],
    ids=["all_reduce", "broadcast"],
)
def test_a_collective_on_a_cross_wired_group_is_the_simulator_s_check(ops: list[list[Op]]) -> None:
    # real gloo runs each of these between 1 and 2 and between 0 and 3, on their data, and raises nothing
    # (tests/test_real_gloo_cross_wiring.py): the simulator stops every rank there, naming whom it is wired to

    out = run(_cross_wired(*ops))
    assert out.verdict == "fail" and not out.hangs
    assert [(e["rank"], e["kind"], e["type"]) for e in out.errors] == [(r, "check", CROSS_WIRED_TYPE) for r in range(4)]
    wires = {0: "[0, 3]", 1: "[1, 2]", 2: "[1, 2]", 3: "[0, 3]"}
    for error in out.errors:
        assert f"gloo connected this rank to ranks {wires[error['rank']]}" in error["message"]
        assert f"this {error['op'].split('(')[0]} runs between those ranks" in error["message"]
    # the ranks outside its group it is wired to, beside the text: what real compare checks the real data against
    assert {e["rank"]: e[FOREIGN_RANKS] for e in out.errors} == {0: [3], 1: [2], 2: [1], 3: [0]}
    text = explain(VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", out))
    assert text.count("was stopped by simnccl's check at t=") == 4 and "raised" not in text, text


_SENDS = [Send(group="g", peer=2, size_bytes=SIZE)], [Send(group="g", peer=3, size_bytes=SIZE)]
_RECVS = [Recv(group="g", peer=0, size_bytes=SIZE)], [Recv(group="g", peer=1, size_bytes=SIZE)]


def test_a_send_on_a_cross_wired_group_goes_to_the_rank_wired_at_its_peers_group_rank() -> None:
    # real gloo (tests/test_real_gloo_semantics.py, cross-wired-send-recv): rank 0's send to its group rank 1 (rank 2)
    # reaches rank 3, wired there under '3', whose recv from its group rank 0 (rank 1) gets it; the same for 1 and 2.
    # The data check stops the receivers (data of ranks 0 and 1, outside their groups); the senders run on. The
    # simulator stopped all four at once.
    out = run(_cross_wired(*_SENDS, *_RECVS), keep_trace=True)
    assert out.verdict == "fail" and not out.hangs
    assert [(e["rank"], e["kind"], e["type"]) for e in out.errors] == [(r, "check", CROSS_WIRED_TYPE) for r in (2, 3)]
    assert {e["rank"]: e[FOREIGN_RANKS] for e in out.errors} == {2: [1], 3: [0]}
    assert all("this recv runs between those ranks" in e["message"] for e in out.errors)
    assert [rt.status for rt in out.ranks] == ["done", "done", "error", "error"]
    # the trace keeps torch's view of each message (the peers named), as the flight recorder does
    sends = sorted(e[1:] for e in out.trace if len(e) > 2 and e[2] in ("send", "recv"))
    named = [(0, "send", 0, 2), (1, "send", 1, 3), (2, "recv", 0, 2), (3, "recv", 1, 3)]
    assert [(e[0], e[1], e[3], e[4]) for e in sends] == named


def test_a_message_between_members_of_a_cross_wired_group_is_not_stopped() -> None:
    # [0, 1, 2] and [3, 4, 5] under one name, ranks 0 and 2 of the first and rank 4 of the second there (group
    # ranks 0, 2 and 1): gloo connects (0, 4, 2). Rank 0's send to rank 2 reaches rank 2, whose recv from rank 0 gets
    # it: members of the group, nothing for any check to see. Its send to rank 1 reaches rank 4, whose recv from
    # rank 3 (group rank 0) gets rank 0's data: rank 4 is stopped, naming rank 0.
    first, second = NewGroup(ranks=(0, 1, 2), bind="g"), NewGroup(ranks=(3, 4, 5), bind="g")
    sender = [GLOO, first, Send(group="g", peer=1, size_bytes=SIZE), Send(group="g", peer=2, size_bytes=SIZE)]
    programs = [sender, [GLOO], [GLOO, first, Recv(group="g", peer=0, size_bytes=SIZE)], [GLOO]]
    programs += [[GLOO, second, Recv(group="g", peer=3, size_bytes=SIZE)], [GLOO]]
    out = run(programs, keep_trace=True)
    assert sorted({(e[1], tuple(e[4])) for e in _wired(out)}) == [(0, (0, 4, 2)), (2, (0, 4, 2)), (4, (0, 4, 2))]
    assert out.verdict == "fail" and not out.hangs
    assert [(e["rank"], e["type"], e[FOREIGN_RANKS]) for e in out.errors] == [(4, CROSS_WIRED_TYPE, [0])]
    assert [rt.status for rt in out.ranks] == ["done", "done", "done", "done", "error", "done"]


def test_a_recv_wired_to_a_rank_that_never_sends_waits_for_that_rank() -> None:
    # rank 3's recv from its group rank 0 is wired to rank 0, which sends nothing: it waits for rank 0, and its hang
    # names the wiring (rank 1, the peer torch was told, never comes into it)
    out = run(_cross_wired([], [], [], _RECVS[1]))
    assert out.verdict == "hang" and [(h["rank"], h["waiting_for"]) for h in out.hangs] == [(3, [0])]
    assert "gloo connected ranks [0, 3], and this recv goes between ranks 0 and 3" in out.hangs[0]["explanation"]


def test_a_second_writer_of_a_group_rank_a_cross_wired_member_wrote_is_a_collision() -> None:
    # [0, 1, 2] and [3, 4, 5] under one name (rank 4 skipped the first new_group): rank 4 writes group rank 1's key
    # next to rank 0's group rank 0, then rank 1, a second later, writes group rank 1's key again. Its payload is
    # the first arrival's, which the rendezvous alone would take as no disagreement and complete the meeting.
    first, second = NewGroup(ranks=(0, 1, 2), bind="a"), NewGroup(ranks=(3, 4, 5), bind="b")
    late = [GLOO, Compute(seconds=1.0), first, second]
    programs = [[GLOO, first, second], late, late, [GLOO, first, second], [GLOO, second], [GLOO, first, second]]
    out = run(programs, keep_trace=True)
    assert out.verdict == "hang"
    assert not _wired(out)
    problems = {h["rank"]: h["explanation"] for h in out.hangs}
    assert "rank 4 bootstraps ranks [3, 4, 5], rank 1 bootstraps ranks [0, 1, 2], both as group rank 1" in problems[0]


def test_a_joined_bootstrap_waits_for_the_writer_of_each_key_still_unwritten() -> None:
    # [0, 1, 2] and [3, 4, 5] under one name, only rank 0 (group rank 0) and rank 4 (group rank 1 of the other)
    # there: the meeting waits for group rank 2's key, rank 2's; rank 1's key is written (by rank 4). (Rank 4's
    # entry, made at its own timeout after rank 0 left at its own, names rank 0 too, as any gloo bootstrap's.)
    first, second = NewGroup(ranks=(0, 1, 2), bind="a"), NewGroup(ranks=(3, 4, 5), bind="b")
    programs = [[GLOO, first, second], [GLOO, second], [GLOO, second], [GLOO, first, second]]
    programs += [[GLOO, second], [GLOO, first, second]]
    out = run(programs)
    assert out.verdict == "hang"
    waits = {h["rank"]: h["waiting_for"] for h in out.hangs}
    assert waits[0] == [2], out.hangs
    assert "rank 2 finished its program without joining" in next(h for h in out.hangs if h["rank"] == 0)["explanation"]


def test_groups_of_different_sizes_under_one_name_stay_a_collision() -> None:
    # a 3-rank and a 2-rank group under one name: gloo's keys do not pair them (unmeasured): a collision, as before
    first, second = NewGroup(ranks=(0, 1, 2), bind="a"), NewGroup(ranks=(3, 4), bind="b")
    programs = [[GLOO, first, second]] * 3 + [[GLOO, second], [GLOO, first, second]]
    out = run(programs, keep_trace=True)
    assert out.verdict == "hang"
    assert any("store key collision" in h["explanation"] for h in out.hangs)
    assert not _wired(out)


def test_real_diff_counts_a_cross_wired_op_as_a_known_gap_not_an_agreement() -> None:
    # real gloo runs the op (pass); the simulator's verdict is fail. Not an agreement, not a disagreement either:
    # the known gap ``gloo-cross-wired``; a real rank failing at that same op is no longer that gap.
    from simnccl.real.compare import compare_variant
    from simnccl.real.differential import CaseResult, classify, simulate_case

    programs = _cross_wired(*[[AllReduce(group="g", size_bytes=SIZE)]] * 4)
    case = _case(programs, "cross-wired")
    sim = simulate_case(case)
    assert sim["verdict"] == "fail"
    comparison = compare_variant("x", "cpu", sim, {"verdict": "pass", "hangs": [], "errors": []}, 4, 0.0)
    assert classify(CaseResult(case, comparison)) == "known-gap" and comparison.known_gap == "gloo-cross-wired"
    failed = {"rank": 1, "kind": "error", "type": "RuntimeError", "op": sim["errors"][1]["op"], "message": "x"}
    real = {"verdict": "error", "hangs": [], "errors": [failed]}
    comparison = compare_variant("x", "cpu", sim, real, 4, 0.0)
    assert classify(CaseResult(case, comparison)) == "disagree"


def test_real_diff_compares_a_cross_wired_send_recv_rank_by_rank_and_by_its_wiring() -> None:
    # The real driver's data check stops a receiver whose data came from outside its group with the simulator's own
    # check type, and nothing comes back to a sender: where it stopped the receivers the simulator stopped, with
    # data from the ranks the simulator wired them to, the two agree; where the real receivers ran on (an element
    # type that cannot carry the check), the known gap; anything else is a disagreement.
    from simnccl.real.compare import compare_variant
    from simnccl.real.differential import CaseResult, classify, simulate_case

    case = _case(_cross_wired(*_SENDS, *_RECVS), "cross-wired")
    sim = simulate_case(case)
    assert [(e["rank"], e["type"], e[FOREIGN_RANKS]) for e in sim["errors"]] == [
        (2, CROSS_WIRED_TYPE, [1]),
        (3, CROSS_WIRED_TYPE, [0]),
    ]
    ops = {e["rank"]: e["op"] for e in sim["errors"]}

    def real(*errors: tuple[int, str, list[int]]) -> dict:
        made = [
            {"rank": r, "kind": "check", "type": t, "op": ops[r], "message": "data check", FOREIGN_RANKS: f}
            for r, t, f in errors
        ]
        everyone = [{"rank": r} for r in range(4)]  # a real result lists every rank it ran
        return {"verdict": "fail" if made else "pass", "hangs": [], "errors": made, "ranks": everyone}

    def verdict(real_result: dict) -> str:
        return classify(CaseResult(case, compare_variant("x", "cpu", sim, real_result, 4, 0.0)))

    assert verdict(real((2, CROSS_WIRED_TYPE, [1]), (3, CROSS_WIRED_TYPE, [0]))) == "agree"
    ran_on = compare_variant("x", "cpu", sim, real(), 4, 0.0)
    assert classify(CaseResult(case, ran_on)) == "known-gap" and ran_on.known_gap == "gloo-cross-wired"
    # a receiver stopped by anything else at that op is neither
    assert verdict(real((2, CROSS_WIRED_TYPE, [1]), (3, "ValueError", []))) == "disagree"
    # data from a rank the simulator did not wire it to: the model's wiring is wrong, a disagreement, named
    comparison = compare_variant("x", "cpu", sim, real((2, CROSS_WIRED_TYPE, [1]), (3, CROSS_WIRED_TYPE, [1])), 4, 0.0)
    assert classify(CaseResult(case, comparison)) == "disagree" and comparison.known_gap is None
    assert "rank 3 cross-wired: simulated to ranks [0] outside its group, real data from [1]" in comparison.reasons


def test_a_one_rank_groups_key_written_under_a_name_another_group_bootstraps_under_is_a_race() -> None:
    # real diff seed132-case33: rank 0's counter runs one ahead (a local group of its own), so its [0] takes the
    # name ranks 1 and 2 bootstrap [1, 2] under, 0.2 s after they came. In the simulated timing they read their
    # peers' keys first and pass; real rank 1 hung in that bootstrap: the order of the writes decides. No hang or
    # error carries it, so the run reports it beside the verdict, and real compare compares nothing there.
    from simnccl.real.compare import racy, verdict_racy

    late = [GLOO, Compute(seconds=0.2), NewGroup(ranks=(0,), use_local_synchronization=True), NewGroup(ranks=(0,))]
    pair = [GLOO, NewGroup(ranks=(0,)), NewGroup(ranks=(1, 2))]
    out = run([late, pair, pair], keep_trace=True)
    assert out.verdict == "pass"
    assert len(out.races) == 1 and SINGLETON_RACE in out.races[0]
    assert "rank 0 wrote its one-rank group's key under that name" in out.races[0]
    assert "ranks [1, 2]" in out.races[0] and "under group name '2'" in out.races[0]
    assert [e[1:] for e in out.trace if len(e) > 2 and e[2] == "collision-late"] == [(0, "collision-late", "2")]
    variant = VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", out)
    result = variant.to_dict()
    assert result["races"] == out.races and racy(result) and verdict_racy(result)
    from rich.console import Console

    from simnccl.report import print_variant

    console = Console(record=True, width=400)
    print_variant(console, variant)
    assert f"race: {out.races[0]}" in console.export_text()  # what `simnccl run` prints under the variant


def test_no_race_where_no_member_reads_the_key_a_one_rank_group_writes() -> None:
    # the earlier group under the name is one rank's (it read nothing), or the writer's own group made again
    first, second = [GLOO, NewGroup(ranks=(1,)), NewGroup(ranks=(0,))], [GLOO, NewGroup(ranks=(1,))]
    out = run([[GLOO, Compute(seconds=0.2), NewGroup(ranks=(0,), use_local_synchronization=True), *first[1:]], second])
    assert out.races == []
    assert run([[GLOO, NewGroup(ranks=(0,))], [GLOO, NewGroup(ranks=(0,))]]).races == []


def test_a_cross_wired_op_waits_for_the_ranks_it_is_wired_to_and_agrees_with_real_gloo() -> None:
    # real diff seed135-case36: rank 3, wired to rank 0, runs an op on its group; rank 0 never runs one there, so
    # real rank 3 waits (a hang). The simulator stopped it with the check at once (a disagreement); the op now runs
    # between the wired ranks, so it waits for rank 0 too, its hang naming the wiring, and the check stops a rank
    # only once the op ran. Compared with that real outcome: agreement; a difference elsewhere is a disagreement.
    from simnccl.real.compare import compare_variant
    from simnccl.real.differential import CaseResult, classify, simulate_case

    programs = _cross_wired([], [], [], [AllReduce(group="g", size_bytes=SIZE)])
    out = run(programs)
    assert out.verdict == "hang" and [(h["rank"], h["waiting_for"]) for h in out.hangs] == [(3, [0])]
    assert (
        "groups under name '3' are cross-wired (a store-key collision): gloo connected ranks [0, 3]"
        in (out.hangs[0]["explanation"])
    )
    case = _case(programs, "cross-wired")
    sim = simulate_case(case)
    op = sim["hangs"][0]["op"]
    waiting = {"rank": 3, "op": op, "op_index": 4, "kind": "collective", "waiting_for": [0]}
    real = {"verdict": "hang", "hangs": [waiting], "errors": []}
    assert classify(CaseResult(case, compare_variant("x", "cpu", sim, real, 4, 0.0))) == "agree"
    elsewhere = {"rank": 1, "op": "<between ops>", "op_index": None, "kind": "", "waiting_for": []}
    real = {"verdict": "hang", "hangs": [waiting, elsewhere], "errors": []}
    assert classify(CaseResult(case, compare_variant("x", "cpu", sim, real, 4, 0.0))) == "disagree"


@pytest.mark.parametrize("op", [AllReduce, ReduceScatter, AllGather])
@pytest.mark.parametrize("ranks", [2, 3])
def test_an_empty_all_reduce_returns_at_once_and_leaves_its_peers_waiting(op: type, ranks: int) -> None:
    # Found by a tester: simnccl crashed (exit 70, ZeroDivisionError laying out gloo's ring segments of 0 bytes).
    # Real (torch 2.15 gloo, 2 and 3 ranks, 3 runs of 3): gloo's allreduce of no elements returns at once
    # (allreduce.cc: elements == 0), so rank 0 goes on; the others wait for its segments until their timeout.
    # All_gather alike (a tester, 2 and 3 ranks, 2 runs each, once the real driver sent an empty tensor): the
    # simulator had the empty rank abort on its peer's message.
    programs = [[GLOO, op(size_bytes=0), Barrier()]] + [[GLOO, op(size_bytes=64)] for _ in range(ranks - 1)]
    out = run(programs)
    assert out.verdict == "hang"
    where = {h["rank"]: h["op"] for h in out.hangs}
    assert where[0] == "barrier()"
    assert all(where[r].startswith(op.name) for r in range(1, ranks))


@pytest.mark.parametrize(
    ("ranks", "size", "verdict"),
    [(3, 64, "error"), (2, 64, "pass"), (3, 96, "pass")],
    ids=["3-ranks-segments-differ", "2-ranks-segments-agree", "3-ranks-96-bytes-segments-agree"],
)
def test_an_all_reduce_of_equal_bytes_in_types_of_different_widths_is_decided_by_its_segments(
    ranks: int, size: int, verdict: str
) -> None:
    # gloo's ring cuts segments by element count (roundUp(ceil(bytes / 2n), element size)): 64 bytes on 3 ranks
    # are segments of 12 bytes of Float and 16 of Double, and a rank receives more than it posted. Found by a
    # tester: the simulator passed (it compared total bytes); real gloo, 3 runs of 3: one rank SIGABRT, the
    # others "Connection reset by peer". On 2 ranks, and for 96 bytes on 3, the segments agree: both pass.
    floats = [GLOO, AllReduce(size_bytes=size, dtype="Float")]
    programs = [floats] * (ranks - 1) + [[GLOO, AllReduce(size_bytes=size, dtype="Double")]]
    out = run(programs)
    assert out.verdict == verdict, (out.errors, out.hangs)
    if verdict == "error":
        assert "abort" in {e["kind"] for e in out.errors}


def test_a_gloo_recv_of_another_tag_than_the_send_never_completes() -> None:
    """Found by a tester (torch 2.15 gloo, 2 ranks, 3 runs of 3): ``send(tag=1)`` against ``recv(tag=2)`` times out
    on both sides; the capture dropped the tag and the simulator passed. NCCL ignores tags."""
    from simnccl.ops import Recv, Send, SetDevice
    from simnccl.testing import simulate

    gloo = InitProcessGroup(backend="gloo")
    send, recv = Send(peer=1, size_bytes=16, tag=1), Recv(peer=0, size_bytes=16, tag=2)
    out = simulate([[gloo, send], [gloo, recv]], gpus_per_node=0, ranks_per_node=2)
    assert out.verdict == "hang" and {(e["rank"], e["kind"]) for e in out.errors} == {(0, "timeout"), (1, "timeout")}
    assert "gloo send/recv tag mismatch between ranks" in str(out.hangs)
    same = simulate([[gloo, send], [gloo, Recv(peer=0, size_bytes=16, tag=1)]], gpus_per_node=0, ranks_per_node=2)
    assert same.verdict == "pass"
    nccl = [SetDevice(), InitProcessGroup(backend="nccl")]
    assert simulate([[*nccl, send], [*nccl, recv]], gpus_per_node=2).verdict == "pass"


def test_a_negative_gloo_tag_is_refused_on_the_rank() -> None:
    """ProcessGroupGloo refuses a negative tag on the calling rank (found by a tester: it passed; real gloo, 2 ranks,
    3 runs of 3: both raise "Tag must be nonnegative")."""
    from simnccl.ops import Recv, Send
    from simnccl.testing import simulate

    gloo = InitProcessGroup(backend="gloo")
    out = simulate(
        [[gloo, Send(peer=1, size_bytes=16, tag=-1)], [gloo, Recv(peer=0, size_bytes=16, tag=-1)]],
        gpus_per_node=0,
        ranks_per_node=2,
    )
    assert {(e["rank"], e["type"], e["message"]) for e in out.errors} == {
        (r, "RuntimeError", "Tag must be nonnegative") for r in (0, 1)
    }


@pytest.mark.parametrize(
    ("call", "sizes", "verdict"),
    [
        ("gather", (32, 16), "pass"),
        ("gather", (16, 32), "error"),
        ("scatter", (16, 32), "pass"),
        ("scatter", (32, 16), "error"),
    ],
)
def test_a_gloo_gather_or_scatter_of_different_sizes_is_decided_per_message(call, sizes, verdict) -> None:
    """Each message is one member's buffer: a smaller one than the recv posted completes it, a larger one aborts the
    receiver (found by a tester: every size difference hung; real compare agrees on all four, root rank 0)."""
    from simnccl.ops import AllGather, Broadcast
    from simnccl.testing import simulate

    gloo = InitProcessGroup(backend="gloo")

    def op(size: int):
        if call == "gather":
            return AllGather(call="gather", root=0, size_bytes=size)
        return Broadcast(call="scatter", src=0, size_bytes=size)

    out = simulate([[gloo, op(size)] for size in sizes], gpus_per_node=0, ranks_per_node=2)
    assert out.verdict == verdict, (out.errors, out.hangs)


def test_a_monitored_barrier_needs_a_gloo_cpu_backend() -> None:
    """torch raises on a group without a CPU backend (a capture did; a file's monitored barrier on NCCL passed)."""
    from simnccl.ops import SetDevice
    from simnccl.testing import simulate

    out = simulate([SetDevice(), InitProcessGroup(backend="nccl"), Barrier(call="monitored_barrier")], gpus_per_node=2)
    assert {(e["type"], e["message"]) for e in out.errors} == {
        ("ValueError", "monitored_barrier requires a group with a CPU-capable backend (e.g. GLOO).")
    }
