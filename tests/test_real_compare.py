"""real compare's per-rank error check: each rank that failed on both sides must fail with the same error kind and
exception type. Both sides are built here without processes or a GPU: the simulated side in the Result shape the
engine writes, the real side through ``build_variant_result`` from the final records the rank driver writes."""

from __future__ import annotations

from typing import Any

import pytest

from simnccl.backends.gloo import BARRIER_PEER_RACE, SINGLETON_RACE
from simnccl.real.compare import (
    INIT_OVERTAKEN_RACE,
    compare_variant,
    error_differences,
    race,
    real_error_type,
    render_comparison_variant,
)
from simnccl.real.measure import build_variant_result


def _sim(verdict: str, errors: list[dict[str, Any]], hangs: list[dict[str, Any]] = ()) -> dict[str, Any]:
    return {"verdict": verdict, "errors": errors, "hangs": list(hangs), "checkpoints": [], "env": {}}


def _sim_error(rank: int, kind: str, type_name: str, message: str = "it failed") -> dict[str, Any]:
    return {"rank": rank, "kind": kind, "type": type_name, "message": message, "op": "alloc(...)", "time_s": 1.0}


def _real(*states: dict[str, Any], notes: tuple[str, ...] = ()) -> dict[str, Any]:
    return build_variant_result(
        name="v",
        description="",
        lane="gpu",
        policy="torch-default",
        env={},
        release="2.15",
        torch_version="2.15.0",
        rank_states=list(states),
        reason="finished",
        started_at=0.0,
        notes=notes,
    )


def _failed(rank: int, kind: str, type_name: str, message: str = "it failed") -> dict[str, Any]:
    """A rank whose driver caught the exception and wrote its final record."""
    final = {"e": "final", "status": "error", "kind": kind, "type": type_name, "message": message, "t": 1.0}
    return {"rank": rank, "final": final, "exit_code": 1, "exit_t": 1.0}


def _died(rank: int, exit_code: int) -> dict[str, Any]:
    """A rank that died without a final record (the launcher's own record of it)."""
    return {"rank": rank, "exit_code": exit_code, "exit_t": 1.0, "log_tail": "terminate called ..."}


def _done(rank: int) -> dict[str, Any]:
    return {"rank": rank, "final": {"e": "final", "status": "done", "t": 1.0}, "exit_code": 0, "exit_t": 1.0}


def test_a_simulated_exception_type_torch_does_not_raise_is_a_disagreement() -> None:
    """The simulator names torch.OutOfMemoryError where NCCL's out-of-memory is a RuntimeError (nccl2): same
    verdict, same failed ranks — compare said AGREE before it compared types."""
    sim = _sim("fail", [_sim_error(0, "oom", "torch.OutOfMemoryError"), _sim_error(1, "oom", "RuntimeError")])
    real = _real(_failed(0, "oom", "RuntimeError"), _failed(1, "oom", "RuntimeError"))
    assert real["verdict"] == "fail"
    comparison = compare_variant("v", "gpu", sim, real, 2, 10.0)
    assert not comparison.agree
    assert comparison.reasons == ["rank 0 error: simulated oom torch.OutOfMemoryError, real oom RuntimeError"]
    assert [row["same_error"] for row in comparison.ranks] == [False, True]
    text = render_comparison_variant(comparison.to_dict(full=True))
    assert "(error differs)" in text and "! rank 0 error: simulated oom torch.OutOfMemoryError" in text


def test_a_different_error_kind_of_one_type_is_a_disagreement() -> None:
    sim = _sim("error", [_sim_error(0, "error", "RuntimeError"), _sim_error(1, "error", "RuntimeError")])
    real = _real(_failed(0, "error", "RuntimeError"), _failed(1, "peer-lost", "RuntimeError"))
    comparison = compare_variant("v", "cpu", sim, real, 2, 0.0)
    assert not comparison.agree
    assert comparison.reasons == ["rank 1 error: simulated error RuntimeError, real peer-lost RuntimeError"]
    assert comparison.known_gap is None


def test_messages_are_not_compared() -> None:
    """Real messages carry addresses, PIDs and build paths; only kind and type must match."""
    sim = _sim("fail", [_sim_error(0, "check", "ValueError", "free memory 10.0 GiB < 12.0 GiB")])
    real = _real(_failed(0, "check", "ValueError", "Free memory on device (9.87/79.1 GiB) on startup, pid 4242"))
    assert compare_variant("v", "gpu", sim, real, 1, 10.0).agree


def test_a_dead_process_is_named_by_its_signal_as_the_simulator_names_it() -> None:
    """The launcher types a process death ``signal`` and keeps the code; the simulator names the signal."""
    sim = _sim("error", [_sim_error(0, "abort", "SIGABRT")])
    assert compare_variant("v", "cpu", sim, _real(_died(0, -6)), 1, 0.0).agree
    killed = compare_variant("v", "cpu", sim, _real(_died(0, -9)), 1, 0.0)
    assert killed.reasons == ["rank 0 error: simulated abort SIGABRT, real abort SIGKILL"]
    exited = compare_variant("v", "cpu", _sim("error", [_sim_error(0, "crash", "SIGABRT")]), _real(_died(0, 3)), 1, 0)
    assert exited.reasons == ["rank 0 error: simulated crash SIGABRT, real crash exit"]
    assert real_error_type({"type": "signal", "exit_code": -250}) == "signal 250"
    assert real_error_type({"type": "signal"}) == "signal", "no code: nothing is made up"


def test_a_rank_hung_on_either_side_is_compared_as_a_hang_not_by_its_timeout_error() -> None:
    """Which timeout ends a stuck rank (the group's in the simulator, the launcher's in the real run) is a
    setting of the run: the hang is compared (stuck ranks), the error record of its timeout is not."""
    hang = {"rank": 0, "op": "all_reduce", "op_index": 1, "kind": "collective", "waiting_for": [1]}
    sim = _sim("hang", [_sim_error(0, "timeout", "torch.distributed.DistBackendError")], [hang])
    real = _real({"rank": 0, "current": {"op": "all_reduce", "i": 1}, "killed": True}, _done(1))
    assert real["verdict"] == "hang" and real["errors"] == []
    assert error_differences(sim, real) == []
    assert compare_variant("v", "cpu", sim, real, 2, 0.0).agree


_UNREGISTERED = "Process group <...> is not initialized in the world group map. Please initialize the group first."


def _destroyed_timeout() -> dict[str, Any]:
    """The simulator's rank 0: its all_reduce #3 on a destroyed gloo group timed out and torch raised ValueError."""
    waited = {"rank": 0, "op": "all_reduce(group='g')", "op_index": 3, "kind": "collective", "waiting_for": [1]}
    return {**_sim_error(0, "error", "ValueError", _UNREGISTERED), "replaced_timeout": waited}


def test_a_timeout_torch_replaced_by_an_error_agrees_with_the_real_error() -> None:
    """A gloo op on a destroyed group's handle times out and torch raises ValueError in its place: the real run
    that got there (the group's timeout under the stall window: seed23-case34) saw an error, as the simulator."""
    sim = _sim("error", [_destroyed_timeout()])
    failed = _failed(0, "error", "ValueError", _UNREGISTERED)
    failed["final"]["op"] = "all_reduce(group='g')"
    real = _real(failed, _done(1))
    assert real["verdict"] == "error"
    assert compare_variant("v", "cpu", sim, real, 2, 0.0).agree


def test_a_timeout_torch_replaced_by_an_error_is_a_hang_where_the_real_run_stopped_the_rank_first() -> None:
    """The simulator runs on to the group's timeout (an error); the real run's stall detector may kill the rank
    first (a hang). Which timeout ends a wait is a setting of the run: the simulated rank counts as the hang it
    was, verdict included; a rank that ended otherwise on the real side still differs."""
    sim = _sim("error", [_destroyed_timeout()])
    real = _real(_stuck(0, 3, "all_reduce", "all_reduce(group='g')"), _done(1))
    assert real["verdict"] == "hang"
    assert compare_variant("v", "cpu", sim, real, 2, 0.0).agree
    assert sim["verdict"] == "error" and sim["hangs"] == [], "the simulator's own result is left alone"
    finished = compare_variant("v", "cpu", sim, _real(_done(0), _done(1)), 2, 0.0)
    assert not finished.agree and finished.reasons[0] == "verdict: simulated error, real pass"


_ABORT = "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  Received data size ..."


def test_a_gloo_mismatch_survivor_aborted_by_the_simulator_is_a_plain_disagreement() -> None:
    """Real gloo aborts only the rank that receives too much; its peer fails as peer-lost. The simulator now does
    so too (agree); a simulator that aborts the peer as well is no longer excused by a known gap."""
    real = _real(_died(0, -6), _failed(1, "peer-lost", "RuntimeError", "Connection reset by peer"))
    sim = _sim("error", [_sim_error(0, "abort", "SIGABRT", _ABORT), _sim_error(1, "peer-lost", "RuntimeError")])
    assert compare_variant("v", "cpu", sim, real, 2, 0.0).agree
    both = _sim("error", [_sim_error(0, "abort", "SIGABRT", _ABORT), _sim_error(1, "abort", "SIGABRT", _ABORT)])
    comparison = compare_variant("v", "cpu", both, real, 2, 0.0)
    assert not comparison.agree and comparison.known_gap is None
    assert comparison.reasons == ["rank 1 error: simulated abort SIGABRT, real peer-lost RuntimeError"]


def test_a_rank_that_raised_on_one_side_and_hung_on_the_other_is_a_disagreement() -> None:
    """Verdict error on both sides and ranks 0 and 1 unfinished on both, but the simulator has rank 0 fail and
    rank 1 stuck, real torch the other way round: the rows said ``<>`` and compare said AGREE before."""
    hang = {"rank": 1, "op": "all_reduce(size_bytes=64)", "op_index": 2, "kind": "collective", "waiting_for": [0]}
    sim = _sim("error", [_sim_error(0, "peer-lost", "RuntimeError")], [hang])
    stuck = {"rank": 0, "current": {"name": "all_reduce", "op": "all_reduce(size_bytes=64)", "i": 2}, "killed": True}
    failed = _failed(1, "peer-lost", "RuntimeError")
    failed["final"]["op"] = "all_reduce(size_bytes=64)"
    real = _real(stuck, failed)
    assert real["verdict"] == "error"
    comparison = compare_variant("v", "cpu", sim, real, 2, 0.0)
    assert not comparison.agree
    assert comparison.blocked_agree, "the same ranks did not finish: the old checks all passed"
    assert comparison.reasons == [
        "rank 0: simulated error [peer-lost] at alloc(...), real hang [collective] at #2 all_reduce(size_bytes=64)",
        "rank 1: simulated hang [collective] at #2 all_reduce(size_bytes=64) waiting for [0], real error [peer-lost]"
        " at all_reduce(size_bytes=64)",
    ]
    assert comparison.known_gap is None


def _stuck(rank: int, index: int, name: str, op: str) -> dict[str, Any]:
    """A rank the launcher killed while it was in op ``index`` (its start record, no end)."""
    return {"rank": rank, "current": {"name": name, "op": op, "i": index}, "killed": True}


def test_a_rank_stuck_in_another_op_is_a_disagreement() -> None:
    """Both hang with rank 0 stuck, but the simulator has it in the bootstrap of new_group #1 where real torch has
    it in the all_reduce #2 after it: compare said AGREE before (the row said '(op differs)')."""
    hang = {"rank": 0, "op": "new_group(ranks=[0, 1])", "op_index": 1, "kind": "bootstrap", "waiting_for": [1]}
    sim = _sim("hang", [], [hang])
    real = _real(_stuck(0, 2, "all_reduce", "all_reduce(size_bytes=64)"), _done(1))
    assert real["verdict"] == "hang"
    comparison = compare_variant("v", "cpu", sim, real, 2, 0.0)
    assert not comparison.agree
    assert comparison.reasons == [
        "rank 0 stuck in another op: simulated #1 new_group(ranks=[0, 1]) [bootstrap], real #2"
        " all_reduce(size_bytes=64) [collective]"
    ]
    text = render_comparison_variant(comparison.to_dict(full=True))
    assert "(op differs)" in text and "! rank 0 stuck in another op" in text


def test_the_kind_of_a_hang_inside_the_same_op_is_not_compared() -> None:
    """What inside an op a rank waits for is beyond the real run: gloo's split_group is a members-only bootstrap
    in the simulator, and the real side can only name the op (split); an NCCL collective on a lazily initialized
    communicator is stuck in its bootstrap. The same op agrees, whatever the kinds."""
    hang = {"rank": 0, "op": "split_group(ranks=[[0, 1]])", "op_index": 1, "kind": "bootstrap", "waiting_for": [1]}
    real = _real(_stuck(0, 1, "split_group", "split_group(ranks=[[0, 1]])"), _done(1))
    assert real["hangs"][0]["kind"] == "split"
    assert compare_variant("v", "cpu", _sim("hang", [], [hang]), real, 2, 0.0).agree


def test_a_rank_stuck_between_ops_on_the_real_side_is_in_another_op() -> None:
    """A real rank killed between two ops is in none: no op index, and no kind (it said collective)."""
    hang = {"rank": 0, "op": "barrier()", "op_index": 3, "kind": "collective", "waiting_for": [1]}
    real = _real({"rank": 0, "current": None, "killed": True}, _done(1))
    comparison = compare_variant("v", "cpu", _sim("hang", [], [hang]), real, 2, 0.0)
    assert comparison.reasons == ["rank 0 stuck in another op: simulated #3 barrier() [collective], real <between ops>"]


_INIT = "init_process_group(backend='gloo')"


def _records(*names_and_outcomes: tuple[str, str | None]) -> list[dict[str, Any]]:
    """The driver's op records of a rank: each op it started, ``outcome`` "ok" where it ended (None: it did not)."""
    ops = []
    for i, (name, outcome) in enumerate(names_and_outcomes):
        record: dict[str, Any] = {"i": i, "name": name, "op": _INIT if name == "init_process_group" else name}
        if outcome is not None:
            record["outcome"] = outcome
        ops.append(record)
    return ops


_IN_INIT = ("init_process_group", None)
_PAST_INIT = ("init_process_group", "ok")


def _stuck_in_init(rank: int, *before: tuple[str, str | None]) -> dict[str, Any]:
    """A real rank killed while bootstrapping in init_process_group (its ``before`` ops ended)."""
    current = {"op": _INIT, "i": len(before), "name": "init_process_group"}
    return {"rank": rank, "current": current, "killed": True, "ops": _records(*before, _IN_INIT)}


def _init_overtaken_states() -> list[dict[str, Any]]:
    lost = _failed(0, "peer-lost", "RuntimeError", "Connection closed by peer")
    lost["final"]["op"] = _INIT
    lost["ops"] = _records(_IN_INIT)
    done = [{**_done(rank), "ops": _records(_PAST_INIT, ("all_reduce", "ok"))} for rank in (1, 2)]
    return [lost, *done, _stuck_in_init(3)]


def _init_overtaken_sides(sim_op: str = "all_reduce(size_bytes=96)") -> tuple[dict[str, Any], dict[str, Any]]:
    """The CI failure of 2026-12-06: rank 2 closed after its first collective; on a loaded machine real rank 0
    lost it inside init_process_group and rank 3 hung bootstrapping, where the simulator had both past init
    (``sim_op``: where the simulated ranks 0 and 3 stopped)."""
    sim_lost = {**_sim_error(0, "peer-lost", "RuntimeError"), "op": sim_op}
    sim_hang = {"rank": 3, "op": sim_op, "op_index": 2, "kind": "collective", "waiting_for": [2]}
    sim = _sim("error", [sim_lost], [sim_hang])
    return sim, _real(*_init_overtaken_states())


def test_a_rank_the_load_stopped_in_gloos_init_where_the_simulator_had_it_past_init_is_a_race() -> None:
    sim, real = _init_overtaken_sides()
    assert real["verdict"] == sim["verdict"] == "error"
    comparison = compare_variant("v", "cpu", sim, real, 4, 0.0)
    assert comparison.race == INIT_OVERTAKEN_RACE and comparison.excused == [0, 3]
    assert not comparison.racy  # ranks 1 and 2 are compared as they are, not only the verdict
    assert comparison.agree, comparison.reasons
    text = render_comparison_variant(comparison.to_dict(full=True))
    assert f"~ {INIT_OVERTAKEN_RACE}: rank(s) [0, 3] compared as the simulation has them" in text
    assert "hang [bootstrap] at #0 init_process_group" in text  # the table shows what the real rank did


def test_an_init_race_excuses_its_overtaken_ranks_only() -> None:
    """The race stood for the whole variant: only the verdict was compared, so another rank's difference (here
    rank 1, simulated done, real failed) was excused with it."""
    sim, real = _init_overtaken_sides()
    real = _real(*[_failed(1, "error", "RuntimeError") if s["rank"] == 1 else s for s in _init_overtaken_states()])
    comparison = compare_variant("v", "cpu", sim, real, 4, 0.0)
    assert comparison.race == INIT_OVERTAKEN_RACE and comparison.excused == [0, 3]
    assert not comparison.agree and any("ranks that did not finish" in r for r in comparison.reasons)


def test_ranks_that_all_stopped_in_init_are_no_race_whatever_the_simulator_names() -> None:
    """Found by a tester: one real rank frozen (SIGSTOP, as a starved rank) as it started, so neither got out of
    init_process_group; the simulator had rank 0 hang in an all_reduce alone and rank 1 finish. The init race
    excused it (ALL AGREE, exit 0). Nothing overtook anyone: compared as they are."""
    sim = _sim("hang", [], [{"rank": 0, "op": "all_reduce(size_bytes=64)", "op_index": 1, "kind": "collective"}])
    booting = [
        {"rank": r, "current": {"op": _INIT, "i": 0, "name": "init_process_group"}, "killed": True} for r in (0, 1)
    ]
    real = _real(*booting)
    assert race(sim, real) is None
    comparison = compare_variant("v", "cpu", sim, real, 2, 0.0)
    assert not comparison.agree and not comparison.racy and comparison.excused == []


_AR = "all_reduce(size_bytes=64)"


def _hung_in_all_reduce(*ranks: int, index: int = 1) -> list[dict[str, Any]]:
    return [{"rank": r, "op": _AR, "op_index": index, "kind": "collective", "waiting_for": []} for r in ranks]


def test_the_init_race_needs_a_peer_that_got_out_of_the_same_init() -> None:
    """Found by a tester (each was ALL AGREE, exit 0): the peer that overtook the stuck ranks was any rank done
    or stopped elsewhere — one that never called init_process_group, one that failed before it, or the ranks'
    own earlier init in a re-init program where both hung in the second."""
    never_called = {**_done(2), "ops": _records(("compute", "ok"))}
    failed_before = _failed(2, "error", "RuntimeError", "boom")
    failed_before["final"]["op"] = "compute(seconds=0.1)"
    failed_before["ops"] = _records(("compute", None))
    for third in (never_called, failed_before):
        sim = _sim("hang", [], _hung_in_all_reduce(0, 1))
        real = _real(_stuck_in_init(0), _stuck_in_init(1), third)
        comparison = compare_variant("v", "cpu", sim, real, 3, 0.0)
        assert comparison.excused == [] and not comparison.agree, comparison.reasons
    # a re-init: init, all_reduce, destroy, init; both ranks stuck in the second init, none got out of it
    earlier = (_PAST_INIT, ("all_reduce", "ok"), ("destroy_process_group", "ok"))
    sim = _sim("hang", [], _hung_in_all_reduce(0, 1, index=4))
    comparison = compare_variant(
        "v", "cpu", sim, _real(_stuck_in_init(0, *earlier), _stuck_in_init(1, *earlier)), 2, 0.0
    )
    assert comparison.race is None and not comparison.agree


def test_an_excused_ranks_own_outcome_does_not_decide_the_verdict_compared() -> None:
    """Found by a tester: real rank 1 finished early and rank 0 lost it inside init (real verdict error); the
    simulation has rank 0 hang in an all_reduce rank 1 skips (verdict hang). Rank 0 is excused, and the verdict
    compared is that of what is compared, not the excused rank's real one."""
    lost = _failed(0, "peer-lost", "RuntimeError", "Connection closed by peer")
    lost["final"]["op"] = _INIT
    lost["ops"] = _records(_IN_INIT)
    real = _real(lost, {**_done(1), "ops": _records(_PAST_INIT)})
    comparison = compare_variant("v", "cpu", _sim("hang", [], _hung_in_all_reduce(0)), real, 2, 0.0)
    assert comparison.excused == [0] and comparison.agree, comparison.reasons
    assert comparison.real["verdict"] == "error"  # shown as the real run ended


@pytest.mark.parametrize("said", [f"store key collision under name '1'; {SINGLETON_RACE}", "store key collision"])
def test_a_race_cannot_excuse_ranks_that_never_got_out_of_their_first_init(said: str) -> None:
    """Found by a tester: GLOO_SOCKET_IFNAME naming no interface failed every real rank in init_process_group, and
    a simulated store-key race in a later new_group made the variant NOT COMPARED (racy): ALL AGREE, exit 0.
    Every race compare excuses happens in or after a group's bootstrap; a rank that never got out of init was
    stopped by something else."""
    hang = {"rank": 0, "op": "new_group(ranks=[0])", "op_index": 2, "kind": "bootstrap", "explanation": said}
    sim = _sim("hang", [], [hang])
    failing = [_failed(r, "error", "RuntimeError", "no interface") for r in (0, 1)]
    for state in failing:
        state["final"]["op"] = _INIT
    real = _real(*failing)
    comparison = compare_variant("v", "cpu", sim, real, 2, 0.0)
    assert comparison.race is not None and not comparison.racy and not comparison.verdict_racy
    assert not comparison.agree
    assert "rank(s) [0, 1] did not get out of init_process_group" in comparison.reasons[0]
    text = render_comparison_variant(comparison.to_dict(full=True))
    assert "DISAGREE" in text and "NOT COMPARED" not in text


def test_a_rank_stopped_in_init_on_both_sides_or_done_in_the_simulation_is_no_init_race() -> None:
    # stopped in init on both sides: compared as usual (it agrees or not on its own)
    sim, real = _init_overtaken_sides(sim_op=_INIT)
    assert race(sim, real) is None
    # the simulated rank finished: a simulated pass is never excused by the real run's load
    sim, real = _init_overtaken_sides()
    sim["errors"] = []
    sim["hangs"] = []
    sim["verdict"] = "pass"
    comparison = compare_variant("v", "cpu", sim, real, 4, 0.0)
    assert race(sim, real) is None and not comparison.racy and not comparison.agree


def test_each_race_is_described_as_itself_not_as_a_store_key_collision() -> None:
    hang = {"rank": 0, "op": "barrier()", "op_index": 1, "kind": "collective", "waiting_for": [1]}
    sim = _sim("error", [_sim_error(1, "peer-lost", "RuntimeError", f"closed ({BARRIER_PEER_RACE})")], [hang])
    failed = [_failed(r, "peer-lost", "RuntimeError") for r in (0, 1)]
    for state in failed:
        state["final"]["op"] = "barrier()"
    comparison = compare_variant("v", "cpu", sim, _real(*failed), 2, 0.0)
    assert comparison.race == BARRIER_PEER_RACE
    text = render_comparison_variant(comparison.to_dict(full=True))
    assert f"~ {BARRIER_PEER_RACE}; only the verdict is compared" in text and "store-key" not in text


def test_what_the_ranks_could_not_check_is_a_note_of_the_run_once_with_its_ranks() -> None:
    # the data check's unchecked element type (simnccl.real.data_check), NVML missing: each rank's notes, gathered
    skipped = "data not checked: torch.bool cannot hold 3 exactly (moves of 3 ranks)"
    states = [
        {"rank": r, "final": {"e": "final", "status": "done", "t": 1.0, "notes": notes}, "exit_code": 0}
        for r, notes in enumerate(([skipped], [], [skipped, "NVML unavailable (ImportError)"]))
    ]
    variant = _real(*states, notes=("the lane's own",))
    assert variant["notes"] == ["the lane's own", f"ranks 0, 2: {skipped}", "rank 2: NVML unavailable (ImportError)"]


def test_a_workloads_own_check_quoting_a_race_does_not_make_the_variant_racy() -> None:
    """A ``raise`` op's message is the user's text: one quoting the words the simulator uses for a gloo race made
    compare excuse the variant as racy ("ALL AGREE", exit 0) where the two sides disagreed."""
    from simnccl.backends.gloo import SINGLETON_RACE
    from simnccl.real.compare import racy, verdict_racy

    quoting = _sim("fail", [_sim_error(1, "check", "AssertionError", f"framework check: {SINGLETON_RACE}")])
    assert not verdict_racy(quoting) and not racy(quoting)
    said = _sim("hang", [], [{"rank": 0, "kind": "bootstrap", "explanation": f"collision; {SINGLETON_RACE}"}])
    assert verdict_racy(said)  # the simulator's own words still name the race
