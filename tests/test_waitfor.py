"""The wait-for graph: cycles named as cycles, stragglers only for ranks that wait on nobody (simnccl.waitfor),
and ``simnccl explain`` telling the two apart on the shipped hang scenarios."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import SCENARIOS_DIR

from simnccl.cli import main
from simnccl.explain import explain
from simnccl.runner import run_scenario
from simnccl.scenario import load_scenario
from simnccl.waitfor import Cycle, Wait, WaitForGraph


def hang(rank: int, waiting_for: list[int], *, group: str = "g", kind: str = "split", seq: int = 1) -> dict[str, Any]:
    return {
        "rank": rank,
        "waiting_for": waiting_for,
        "op": f"op{rank}",
        "group": group,
        "kind": kind,
        "seq": seq,
        "since_s": 0.0,
    }


def variant(name: str, only: str) -> Any:
    return run_scenario(load_scenario(SCENARIOS_DIR / f"{name}.toml"), [only]).variants[0]


# ------------------------------------------------------------------------------------------------- the graph


def test_a_two_rank_cycle_in_different_calls_is_circular() -> None:
    graph = WaitForGraph.from_hangs([hang(0, [2], seq=2), hang(2, [0], kind="split-color", seq=1), hang(1, [2], seq=2)])
    [cycle] = graph.cycles()
    assert cycle.ranks == (0, 2)
    assert cycle.circular
    assert cycle.describe() == (
        "rank 0 waits for rank 2 in op0 (split #2 on group 'g') while "
        "rank 2 waits for rank 0 in op2 (split-color #1 on group 'g')"
    )
    assert graph.cycle_of(1) is None and graph.cycle_of(0) is cycle
    assert graph.reaches(1) == ((), (cycle,))


def test_ranks_waiting_on_each_other_inside_one_rendezvous_are_not_a_circular_wait() -> None:
    graph = WaitForGraph.from_hangs([hang(0, [1], kind="bootstrap", seq=0), hang(1, [0], kind="bootstrap", seq=0)])
    [cycle] = graph.cycles()
    assert not cycle.circular


def test_two_ranks_in_one_nccl_lazy_pair_bootstrap_under_different_attempts_are_not_a_circular_wait() -> None:
    # LazyBackend::nextPairAttempt is per process: two ranks may put different attempts in one pair's name
    pair = [hang(0, [2], group="1/p2p-0-1-1", kind="bootstrap", seq=0)]
    pair.append(hang(2, [0], group="1/p2p-0-1-0", kind="bootstrap", seq=0))
    [cycle] = WaitForGraph.from_hangs(pair).cycles()
    assert not cycle.circular
    other = [hang(0, [2], group="1/p2p-0-1-0", kind="bootstrap", seq=0), hang(2, [0], group="1/p2p-0-2-0")]
    assert WaitForGraph.from_hangs(other).cycles()[0].circular  # another pair, or another call, still is


def test_a_sink_is_the_straggler_behind_a_chain() -> None:
    # 0 waits for 1, 1 waits for 2, 2 waits for nobody (stalled: a hang entry without waiting_for), 3 for 5 (done).
    graph = WaitForGraph.from_hangs([hang(0, [1]), hang(1, [2], seq=2), hang(2, [], kind="stall"), hang(3, [5])])
    assert graph.cycles() == []
    assert graph.is_sink(2) and graph.is_sink(5) and not graph.is_sink(1)
    assert graph.reaches(0) == ((2,), ())
    assert graph.reaches(3) == ((5,), ())
    assert graph.blocked == (0, 1, 2, 3)
    assert graph.nodes() == (0, 1, 2, 3, 5)


def test_the_shortest_cycle_through_the_lowest_rank_is_named() -> None:
    # 0 -> 1 -> 2 -> 0 and the shortcut 0 -> 2: the shortest cycle through rank 0 is 0 -> 2 -> 0.
    graph = WaitForGraph.from_hangs([hang(0, [1, 2]), hang(1, [2], seq=2), hang(2, [0], seq=3)])
    [cycle] = graph.cycles()
    assert cycle.ranks == (0, 2)
    assert graph.cycle_of(1) is cycle  # in the same strongly connected group, though not on the named cycle


def test_cycles_are_found_per_component_and_ordered_by_lowest_rank() -> None:
    graph = WaitForGraph.from_hangs(
        [hang(3, [1], seq=1), hang(1, [3], seq=2), hang(0, [2], seq=1), hang(2, [0], seq=2)]
    )
    assert [c.ranks for c in graph.cycles()] == [(0, 2), (1, 3)]


def test_a_long_ring_is_found_without_recursion_and_described_elided() -> None:
    n = 5000
    graph = WaitForGraph.from_hangs([hang(r, [(r + 1) % n], seq=r) for r in range(n)])
    [cycle] = graph.cycles()
    assert len(cycle.waits) == n and cycle.ranks[0] == 0
    text = cycle.describe()
    assert f"… {n - 7} more waits …" in text
    assert text.endswith(f"while rank {n - 1} waits for rank 0 in op{n - 1} (split #{n - 1} on group 'g')")


def test_recovery_segments_get_one_graph_each() -> None:
    graphs = WaitForGraph.by_segment([{**hang(0, [1]), "segment": 1}, {**hang(1, [0], seq=2), "segment": 2}])
    assert sorted(graphs) == [1, 2]
    assert all(g.cycles() == [] for g in graphs.values())


def test_cycle_describe_with_one_wait_and_the_same_graph_twice_is_deterministic() -> None:
    one = Cycle((Wait(0, 0, "op", "", "p2p", 1, 0.0),))
    assert one.describe() == "rank 0 waits for rank 0 in op (p2p)"
    hangs = [hang(0, [2], seq=2), hang(2, [0], seq=1), hang(1, [2], seq=2), hang(3, [2], seq=2)]
    assert WaitForGraph.from_hangs(hangs).cycles() == WaitForGraph.from_hangs(list(reversed(hangs))).cycles()


# ------------------------------------------------------------------------------------------------- explain


@pytest.mark.parametrize("only", ["torch-2.15-default", "legacy"])
def test_explain_names_the_creation_order_deadlock_as_a_cycle(only: str) -> None:
    text = explain(variant("creation-order-hang", only))
    assert "Circular wait between ranks 0, 2: rank 0 waits for rank 2 in " in text
    assert " while rank 2 waits for rank 0 in " in text
    assert "straggler is" not in text and "stragglers are" not in text
    if only == "torch-2.15-default":
        assert (
            "rank 0 waits for rank 2 in new_group(ranks=[2, 3], bind='tp') (split #2 on group '0') while rank 2 "
            "waits for rank 0 in new_group(ranks=[0, 2], bind='dp') (split-color #1 on group '0')"
        ) in text
        assert "ranks 1, 3 wait on this cycle too" in text
    else:
        assert "Circular wait between ranks 1, 3" in text  # legacy: two store-key cycles


def test_explain_keeps_straggler_for_a_stalled_rank_and_for_ranks_that_never_joined() -> None:
    assert "waiting for rank 1: the straggler is rank 1" in explain(variant("hang-missing-rank", "nccl2-default"))
    text = explain(variant("local-sync-split-hang", "torch-2.15-default"))
    assert "waiting for ranks 2, 3: the stragglers are ranks 2, 3" in text
    assert "Circular" not in text


def test_explain_does_not_call_ranks_that_cannot_meet_stragglers() -> None:
    text = explain(variant("store-timeout", "default"))
    assert "straggler" not in text and "Circular" not in text
    assert "they are all in this call but cannot meet: see why" in text
    assert "injected fault: store-timeout" in text  # rank 1's own reason is told, not only rank 0's


def test_simnccl_explain_command_names_the_cycle(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", str(SCENARIOS_DIR / "creation-order-hang.toml"), "--variant", "torch-2.15-default"])
    out = " ".join(capsys.readouterr().out.split())  # undo the console's wrapping
    assert code == 0
    assert "Circular wait between ranks 0, 2: rank 0 waits for rank 2 in new_group(ranks=[2, 3], bind='tp')" in out


def test_explain_tells_ranks_that_ended_alike_once() -> None:
    # 8 ranks' all_reduce on a handle nobody bound: one sentence naming them all (65,536 ranks wrote 65,536
    # sentences, 8.5 MB on one line, where `simnccl run` prints a line)
    from simnccl.ops import AllReduce, InitProcessGroup, SetDevice
    from simnccl.result import VariantResult
    from simnccl.testing import simulate

    out = simulate([SetDevice(), InitProcessGroup(), AllReduce(group="w", size_bytes=4)], nodes=1, gpus_per_node=8)
    assert out.verdict == "error" and len(out.errors) == 8
    text = explain(VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", out))
    assert text.count(" raised at t=") == 1 and "Ranks 0-7 raised at t=" in text, text
