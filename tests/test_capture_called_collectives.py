"""Captured reduce, gather, scatter and monitored_barrier keep the torch call they are (``ops.CALLS``); send/recv
keep their tags; object gathers are padded as torch pads them.

The capture ran each as its nearest op (an all_reduce, an all_gather, a broadcast, a barrier) and recorded it so,
which dropped what gloo matches on: the call's algorithm and its root. Ranks that named different roots, or mixed
reduce with all_reduce, scatter with broadcast, monitored_barrier with barrier, then passed in the simulator where
real gloo times out (found by a tester, torch 2.15 CPU, 3 ranks: 3 runs of 3 for roots, scatter/broadcast and
monitored/plain barrier; 1 of 1 for reduce/all_reduce and gather/all_gather). The same calls with one root still
run as their ops do; ``tests/test_real_gloo_semantics.py`` checks both on real gloo.
"""

from __future__ import annotations

import functools
import re

import pytest

pytest.importorskip("torch")

import capture_examples as examples

from simnccl import capture as cap
from simnccl.ops import AllGather, AllReduce, Barrier, Broadcast, Recv, Send


def _captured(kind: str) -> cap.CapturedRun:
    return cap.capture(functools.partial(examples.rooted_calls, kind), 3, gpus_per_node=3, final_checkpoint=None)


def test_rooted_calls_are_recorded_with_their_call_and_root() -> None:
    run = _captured("same-roots")
    ops = [op for op in run.programs[0].ops if isinstance(op, (AllReduce, AllGather, Broadcast, Barrier))]
    assert ops == [
        AllReduce(size_bytes=16, call="reduce", root=1),
        AllGather(size_bytes=16, call="gather", root=2),
        Broadcast(size_bytes=16, src=0, call="scatter"),
        Barrier(call="monitored_barrier", timeout_s=10.0),  # its own timeout, the code's
    ]
    assert run.simulate().verdict == "pass"


@pytest.mark.parametrize(
    "kind",
    ["reduce-own-root", "gather-own-root", "reduce-vs-all-reduce", "scatter-vs-broadcast", "monitored-vs-barrier"],
)
def test_ranks_that_call_different_rooted_collectives_do_not_pass(kind: str) -> None:
    out = _captured(kind).simulate()
    # stuck until a timeout: each rank's own, or (monitored-vs-barrier) rank 0's 10 s one, whose gloo timeout
    # closes its pairs: ranks 1 and 2 then fail as peer-lost, keeping the wait they were in (``ended_by``)
    ended = {e["rank"] for e in out.errors if (e.get("replaced_timeout") or {}).get("ended_by")}
    assert out.verdict == ("error" if ended else "hang"), out.errors
    assert {h["rank"] for h in out.hangs} | ended == {0, 1, 2}
    assert bool(ended) == (kind == "monitored-vs-barrier")


def test_a_root_mismatch_is_explained_as_one() -> None:
    out = _captured("reduce-own-root").simulate()
    assert "reduce root mismatch at sequence number 1" in str(out.hangs)


@pytest.mark.parametrize(("recv_tag", "verdict"), [(1, "pass"), (2, "hang")])
def test_a_captured_send_and_recv_keep_their_tags(recv_tag: int, verdict: str) -> None:
    """gloo matches a recv to a send by its tag (real, 2 ranks: tags 1 and 2 time out on both sides, 3 runs of 3);
    the capture dropped the tag and the simulation passed."""
    run = cap.capture(functools.partial(examples.tagged_p2p, recv_tag), 2, gpus_per_node=2, final_checkpoint=None)
    assert Send(peer=1, size_bytes=16, tag=1) in run.programs[0].ops
    assert Recv(peer=0, size_bytes=16, tag=recv_tag) in run.programs[1].ops
    assert run.simulate().verdict == verdict


def test_a_recv_from_any_rank_says_what_the_capture_lacks() -> None:
    """Real gloo runs ``recv(t)`` without ``src`` (3 runs of 3); the capture said torch's "Backend gloo does not
    support recvAnysource", which blamed the code for what simnccl lacks."""
    with pytest.raises(cap.CaptureError, match="simnccl capture cannot record a recv without src"):
        cap.capture(examples.recv_from_any, 2, gpus_per_node=2, final_checkpoint=None)


def test_object_gathers_of_objects_of_different_sizes_run() -> None:
    """torch pads each rank's pickled object to the largest (the size gather finds it); the stand-in fills that
    gather with the rank's own size, so each rank recorded its own, and the simulator failed what real gloo runs
    (a tester: objects of 34 and 134 bytes, 3 runs of 3 passed)."""
    run = cap.capture(examples.object_gathers_of_different_sizes, 3, gpus_per_node=3, final_checkpoint=None)
    padded = [[op for op in p.ops if isinstance(op, AllGather) and op.padded] for p in run.programs]
    assert [len(ops) for ops in padded] == [2, 2, 2]
    assert len({ops[0].size_bytes for ops in padded}) == 3  # each rank's own size
    assert all(ops[1].call == "gather" and ops[1].root == 0 for ops in padded)
    assert run.simulate().verdict == "pass"


def test_a_padded_gather_takes_the_time_of_the_largest_object() -> None:
    from simnccl.ops import InitProcessGroup
    from simnccl.profiles import gloo_defaults
    from simnccl.testing import simulate

    gloo = InitProcessGroup(backend="gloo")
    sizes = (2**20, 8 * 2**20)
    programs = [[gloo, AllGather(size_bytes=s, dtype="Byte", padded=True)] for s in sizes]
    start = simulate([[gloo]] * 2, gpus_per_node=0, ranks_per_node=2).end_time_s
    taken = simulate(programs, gpus_per_node=0, ranks_per_node=2).end_time_s - start
    figures = gloo_defaults()
    expected = figures["gloo_collective_latency_s"] + max(sizes) / (figures["gloo_bus_bandwidth_gbps"] * 1e9)
    assert taken == pytest.approx(expected)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("premul-sum", "Cannot use ReduceOp.PREMUL_SUM with Gloo"),
        ("band-float", "Cannot use ReduceOp.BAND with non-integral dtype"),
        (
            "all-gather-list",
            "ProcessGroupGloo::allgather: invalid output tensor list at index 0 (expected length 2, got 3)",
        ),
    ],
)
def test_what_gloo_refuses_on_the_calling_rank_is_refused_in_the_capture(kind: str, message: str) -> None:
    """The stand-in completed these and the capture passed; real gloo raises on every rank (a tester, torch 2.15
    CPU, 3 runs of 3 each; the texts are real gloo's)."""
    with pytest.raises(cap.CaptureError, match=re.escape(message)):
        cap.capture(functools.partial(examples.gloo_refused, kind), 2, gpus_per_node=2, final_checkpoint=None)


def test_a_bitwise_reduction_of_integers_runs_on_gloo() -> None:
    run = cap.capture(functools.partial(examples.gloo_refused, "band-int"), 2, gpus_per_node=2, final_checkpoint=None)
    assert run.simulate().verdict == "pass"


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("gather-list", "ProcessGroupGloo::gather: Incorrect output list size 3. Output list size should be 2"),
        ("scatter-list", "ProcessGroupGloo::scatter: Incorrect input list size 3. Input list size should be 2"),
        ("all-gather-sizes", "ProcessGroupGloo::allgather: invalid tensor size at index 1 (expected (4), got (8))"),
        ("negative-tag", "Tag must be nonnegative"),
        ("batch-tag", "simnccl capture cannot record the tag of a batch_isend_irecv op"),
    ],
)
def test_what_gloo_checks_of_lists_and_tags_is_checked_in_the_capture(kind: str, message: str) -> None:
    """Found by a tester: each passed the capture; real gloo raises (3 runs of 3; its texts), and a batch's tags
    would be dropped (a simulated batch has none)."""
    with pytest.raises(cap.CaptureError, match=re.escape(message)):
        cap.capture(functools.partial(examples.gloo_list_checks, kind), 2, gpus_per_node=2, final_checkpoint=None)
