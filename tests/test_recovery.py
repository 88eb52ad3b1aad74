"""Recovery orchestration (simnccl.recovery): the pure quorum, and whole recovery runs through the engine.

What must hold: the quorum is a pure function of (time, state) that excludes crashed and slow GPUs and picks
spares deterministically, or refuses clearly; a recovered run never re-runs or loses a committed step; the
replacement's communicators are charged to the replacement's own device; every run ends; the same scenario
gives the same decisions and trace twice.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace

import pytest
from conftest import SCENARIOS_DIR, TINY

from simnccl.cluster import Device
from simnccl.engine.memory import PROCESS_OWNER
from simnccl.faults import Fault, FaultSchedule
from simnccl.memory import Owner
from simnccl.ops import AllReduce
from simnccl.recovery import (
    Observation,
    QuorumState,
    RecoveryConfig,
    StepSample,
    initial_devices,
    orchestrate,
    quorum,
    segment_programs,
)
from simnccl.result import VariantResult
from simnccl.runner import config_for, run_scenario
from simnccl.scenario import Scenario, ScenarioError, load_scenario, parse_scenario

N0 = [Device(0, i) for i in range(8)]

# 4 ranks in 2 replicas of 2 on a 6-GPU node (spares n0:cuda:4 and n0:cuda:5), 8 steps, a commit every 4.
TOML = """
[scenario]
name = "recovery-test"

[cluster]
gpu = "h100-80gb"
gpus_per_node = {gpus}
ranks_per_node = 4

[torch]
release = "2.15"

[workload]
steps = [
  {{ op = "compute", seconds = 0.25 }},
  {{ op = "all_reduce", group = "replica", size_mib = 64 }},
  {{ op = "all_reduce", group = "dp", size_mib = 64 }},
]

[recovery]
replicas = 2
steps = 8
commit_every = 4
timeout_s = 30
{recovery}

{faults}
"""


def _scenario(faults: str = "", *, gpus: int = 6, recovery: str = "") -> Scenario:
    text = TOML.format(gpus=gpus, recovery=recovery, faults=f"[faults]\ninject = [{faults}]" if faults else "")
    return parse_scenario(tomllib.loads(text), "recovery-test.toml")


def _run(scenario: Scenario) -> VariantResult:
    (variant,) = run_scenario(scenario).variants
    return variant


def _state(*observations: Observation, spares: tuple[Device, ...] = (N0[4], N0[5])) -> QuorumState:
    return QuorumState(replicas=2, ranks=observations, spares=spares, slow_factor=2.0)


def _healthy(rank: int, local_s: float = 0.25, steps: int = 4) -> Observation:
    return Observation(rank, N0[rank], samples=tuple(StepSample(s, 1.0 + s, local_s) for s in range(1, steps + 1)))


# ---------------------------------------------------------------------------------------------- the quorum


def test_quorum_is_pure_same_inputs_same_decision_and_explanation() -> None:
    crashed = Observation(2, N0[2], failed_at_s=3.1, failure="its process died at t=3.000 s")
    state = _state(_healthy(0), _healthy(1), crashed, _healthy(3))
    first, second = quorum(3.5, state), quorum(3.5, state)
    assert first == second
    assert first.explanation == second.explanation
    # The spares' order as given does not matter: the quorum sorts them.
    assert quorum(3.5, _state(*state.ranks, spares=(N0[5], N0[4]))) == first


def test_quorum_excludes_a_crashed_gpu_once_its_failure_is_known() -> None:
    crashed = Observation(2, N0[2], failed_at_s=3.1, failure="its process died at t=3.000 s")
    state = _state(_healthy(0), _healthy(1), crashed, _healthy(3))
    before = quorum(3.0, state)  # the failure is detected at 3.1: not known yet
    assert not before.changed and before.members == tuple(N0[:4])
    assert "all 4 ranks healthy" in before.explanation
    after = quorum(3.1, state)
    assert after.ok and [(e.rank, e.device) for e in after.excluded] == [(2, N0[2])]
    assert [(r.rank, r.old, r.new) for r in after.replacements] == [(2, N0[2], N0[4])]
    assert after.members == (N0[0], N0[1], N0[4], N0[3])
    assert "exclude rank 2 on n0:cuda:2 (its process died" in after.explanation
    assert "bring in spare n0:cuda:4 as rank 2" in after.explanation


def test_quorum_excludes_a_slow_gpu_by_step_time_against_the_median() -> None:
    state = _state(_healthy(0), _healthy(1), _healthy(2), _healthy(3, local_s=0.75))
    decision = quorum(10.0, state)
    assert [e.rank for e in decision.excluded] == [3]
    assert "slow: 0.750 s of local work per step over steps 1-4, 3.0x the median 0.250 s" in decision.explanation
    assert decision.members[3] == N0[4]
    # Samples observed after time_s do not count: before step 1's local work ended nothing is known.
    assert not quorum(1.5, state).changed
    # Below the factor, nobody is excluded.
    assert not quorum(10.0, _state(_healthy(0), _healthy(1), _healthy(2), _healthy(3, local_s=0.45))).changed


def test_quorum_picks_spares_deterministically_same_node_first() -> None:
    n1 = Device(1, 0)
    crashed = [Observation(r, N0[r], failed_at_s=1.0, failure="died") for r in (1, 3)]
    decision = quorum(2.0, _state(_healthy(0), crashed[0], _healthy(2), crashed[1], spares=(n1, N0[7], N0[5])))
    # Rank order, each taking the lowest free GPU of its own node; the other node's spare is never used.
    assert [(r.rank, r.new) for r in decision.replacements] == [(1, N0[5]), (3, N0[7])]


def test_quorum_without_a_spare_refuses_clearly() -> None:
    crashed = Observation(1, N0[1], failed_at_s=1.0, failure="its process died at t=0.900 s")
    decision = quorum(2.0, _state(_healthy(0), crashed, _healthy(2), _healthy(3), spares=(Device(1, 0),)))
    assert not decision.ok
    assert decision.members == ()
    assert "no spare GPU is left on node 0" in decision.explanation
    assert decision.plan() == "no quorum"


def test_no_spare_gives_a_failure_verdict_that_says_why() -> None:
    variant = _run(_scenario('{ kind = "crash", rank = 1, at_s = 2.0 }', gpus=4))
    assert variant.verdict == "fail"
    report = variant.outcome.recovery
    assert report is not None
    assert "no spare GPU is left on node 0" in report.reason
    assert report.committed_steps == 4
    assert report.replacement_devices == ()


# ---------------------------------------------------------------------------------------------- whole runs


@pytest.mark.parametrize("kind", ["crash", "gpu-crash"])
def test_a_crash_is_replaced_and_no_committed_step_is_lost(kind: str) -> None:
    variant = _run(_scenario(f'{{ kind = "{kind}", rank = 2, at_s = 2.2 }}'))
    assert variant.verdict == "pass"
    report = variant.outcome.recovery
    assert report is not None
    assert report.committed_steps == 8 and report.recoveries == 1
    first, second = report.segments
    # Step 4 was committed before the crash; the next segment starts right after it, never earlier.
    assert (first.first_step, first.committed_step) == (1, 4)
    assert second.first_step == first.committed_step + 1
    assert first.lost_steps == report.lost_steps > 0
    # Every commit is durable exactly once, on the membership of its time.
    commits = variant.outcome.checkpoints
    assert sorted(commits) == ["commit:4", "commit:8"]
    assert "n0:cuda:2" in commits["commit:4"] and "n0:cuda:4" not in commits["commit:4"]
    assert "n0:cuda:4" in commits["commit:8"] and "n0:cuda:2" not in commits["commit:8"]
    # The crash was seen at the launcher's next poll, 0.1 s later.
    assert report.fault_detected_at_s == pytest.approx(2.2 + 0.1)
    assert second.devices == ("n0:cuda:0", "n0:cuda:1", "n0:cuda:4", "n0:cuda:3")


def test_replacement_communicators_are_charged_to_the_spare_device() -> None:
    variant = _run(_scenario('{ kind = "crash", rank = 2, at_s = 2.2 }'))
    ledgers = variant.outcome.ledgers
    spare = ledgers["n0:cuda:4"]
    comm_owners = sorted((o.group, o.phase) for o in spare.by_owner if o.kind == "comm")
    assert {o.rank for o in spare.by_owner} == {2}
    groups = {group for group, _ in comm_owners if group != PROCESS_OWNER}
    # Rank 2 is in the default group, replica 1 (ranks 2,3) and dp group 0 (ranks 0,2): three communicators,
    # besides what NCCL holds once per process.
    assert len(groups) == 3
    assert {phase for group, phase in comm_owners if group == PROCESS_OWNER} >= {"process-first-comm"}
    assert Owner("cuda_context", 2) in spare.by_owner
    assert sum(b for o, b in spare.by_owner.items() if o.kind == "comm") > 0
    # Nothing of the final membership is left on the excluded GPU, and every group records rank 2 on the spare.
    assert not ledgers["n0:cuda:2"].by_owner
    for record in variant.outcome.groups.values():
        if 2 in record.members:
            assert record.members[2]["device"] == "n0:cuda:4"


def test_a_straggler_is_excluded_at_the_first_commit_without_losing_a_step() -> None:
    variant = _run(_scenario('{ kind = "straggler", rank = 1, factor = 3.0 }'))
    assert variant.verdict == "pass"
    report = variant.outcome.recovery
    assert report is not None
    assert report.lost_steps == 0 and report.committed_steps == 8
    assert report.replacement_devices == ("n0:cuda:4",)
    (decision,) = [d for d in report.decisions if d.changed]
    assert decision.time_s == report.segments[0].end_s == report.fault_detected_at_s
    assert "slow: 0.750 s" in decision.excluded[0].reason


def test_a_stall_is_found_by_the_watchdog_and_its_gpu_replaced() -> None:
    variant = _run(_scenario('{ kind = "stall", rank = 3, at_s = 2.2 }'))
    assert variant.verdict == "pass"
    report = variant.outcome.recovery
    assert report is not None
    (decision,) = [d for d in report.decisions if d.changed]
    assert [e.rank for e in decision.excluded] == [3]
    assert decision.excluded[0].reason.startswith("unresponsive: rank ")
    # Detected by a waiting rank's watchdog: the group timeout (30 s) plus the flight-recorder dump wait (15 s).
    hang = min(variant.outcome.hangs, key=lambda h: h["detected_at_s"])
    assert report.fault_detected_at_s == pytest.approx(hang["detected_at_s"])
    assert report.fault_detected_at_s == pytest.approx(hang["since_s"] + 30 + 15)
    assert report.replacement_devices == ("n0:cuda:4",)


def test_a_failure_nobody_can_be_blamed_for_restarts_the_same_members() -> None:
    scenario = _scenario()
    cfg = RecoveryConfig(replicas=2, steps=8, commit_every=4, timeout_s=30)
    base = config_for(scenario, scenario.variants[0])
    program = segment_programs(cfg, base.programs, initial_devices(base.cluster), 1)[0]
    at_op = [i for i, op in enumerate(program.ops) if isinstance(op, AllReduce)][8]  # step 5's replica all_reduce
    faults = FaultSchedule(None, ("mismatch",), (Fault("mismatch", 0, at_op=at_op),))
    outcome = orchestrate(cfg, replace(base, faults=faults))
    assert outcome.verdict == "pass"
    report = outcome.recovery
    assert report is not None
    assert report.recoveries == 1 and report.replacement_devices == ()
    assert report.segments[1].devices == report.segments[0].devices
    assert "a failure no rank can be blamed for" in report.segments[0].ended_by


def test_every_run_ends_when_recoveries_run_out() -> None:
    variant = _run(_scenario('{ kind = "crash", rank = 0, at_s = 2.2 }', recovery="max_recoveries = 0"))
    assert variant.verdict == "fail"
    report = variant.outcome.recovery
    assert report is not None and len(report.segments) == 1
    assert "gave up after 0 recoveries" in report.reason


def test_same_scenario_twice_same_trace_and_decisions() -> None:
    path = SCENARIOS_DIR / "crash-replaced.toml"
    first, second = run_scenario(load_scenario(path)), run_scenario(load_scenario(path))
    assert first.trace_hash == second.trace_hash
    assert first.variants[0].explanations == second.variants[0].explanations
    assert first.to_dict() == second.to_dict()


def test_the_result_json_carries_the_recovery_story() -> None:
    variant = run_scenario(load_scenario(SCENARIOS_DIR / "slow-gpu-replaced.toml"), ["nccl2-default"]).variants[0]
    decisions = variant.to_dict()["decisions"]
    summary = decisions[-1]
    assert summary["call"] == "recovery"
    assert summary["committed_steps"] == 12 and summary["lost_steps"] == 0
    assert summary["replacement_devices"] == ["n0:cuda:6"]
    quorums = [d for d in decisions if d["call"].startswith("quorum") and d["replacements"]]
    assert quorums[0]["replacements"] == [{"rank": 3, "from": "n0:cuda:3", "to": "n0:cuda:6"}]
    assert [d["call"] for d in decisions if d["call"].startswith("segment")] == ["segment 1", "segment 2"]


def test_explain_tells_what_a_recovered_run_went_through() -> None:
    """A crash the recovery replaced was "nothing to explain", though a rank died and steps were re-done."""
    from simnccl.explain import explain

    variant = run_scenario(load_scenario(SCENARIOS_DIR / "crash-replaced.toml")).variants[0]
    text = explain(variant)
    assert variant.verdict == "pass" and "nothing to explain" not in text, text
    assert "after a recovery: rank 2 failed at t=2.600 s (Crash: injected fault: crash rank 2" in text, text
    assert "12/12 steps committed, 2 lost and re-done, 1 recovery; replacement device n0:cuda:6." in text, text


def test_explain_names_a_recovered_failure_with_an_empty_message_by_its_type() -> None:
    """A bare ``assert`` fails with no message; its first line raised IndexError in the recovery story."""
    from types import SimpleNamespace

    from simnccl.explain import _recovery

    error = {"rank": 2, "time_s": 2.6, "type": "AssertionError", "message": ""}
    variant = SimpleNamespace(
        explanations=[{"call": "recovery", "recoveries": 1, "plan": "1 recovery"}],
        outcome=SimpleNamespace(errors=[error]),
    )
    assert _recovery(variant) == "rank 2 failed at t=2.600 s (AssertionError); 1 recovery."


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("recovery", "key", "message"),
    [
        ("replicas = 3", "recovery.replicas", "expected a divisor of the world of 4 ranks"),
        ("commit_every = 0", "recovery.commit_every", "expected an integer >= 1"),
        ("slow_factor = 1", "recovery.slow_factor", "expected a number > 1"),
        ("checkpoint_every = 2", "recovery.checkpoint_every", "unknown key"),
    ],
)
def test_bad_recovery_tables_name_the_key(recovery: str, key: str, message: str) -> None:
    """Checked when the scenario is read, before anything is simulated."""
    text = TOML.format(gpus=6, recovery="", faults="")
    name = recovery.split(" =")[0]
    lines = [line for line in text.splitlines() if not line.startswith(f"{name} =")]
    with pytest.raises(ScenarioError) as err:
        parse_scenario(tomllib.loads("\n".join(lines).replace("[recovery]", f"[recovery]\n{recovery}")), "x")
    assert err.value.key == key
    assert message in str(err.value)


def test_recovery_expectations_say_what_they_compared(write_scenario) -> None:
    text = (SCENARIOS_DIR / "crash-replaced.toml").read_text(encoding="utf-8")
    wrong = text.replace('replacement_devices = ["n0:cuda:6"]', 'replacement_devices = ["n0:cuda:7"]')
    (variant,) = run_scenario(load_scenario(write_scenario(wrong))).variants
    (failed,) = [e for e in variant.expectations if not e.ok]
    assert "replacements ['n0:cuda:6'] (n0:cuda:6 holds" in failed.message
    assert "MiB of communicators of ranks [2]), expected ['n0:cuda:7']" in failed.message


def test_a_recovery_fault_that_never_acted_fails_the_job_as_any_run(write_scenario) -> None:
    """The combined job's outcome dropped its first segment's faults_unacted: a crash timed after the job's end
    passed ("all expectations hold", exit 0) as a crash the job had survived."""
    text = (SCENARIOS_DIR / "crash-replaced.toml").read_text(encoding="utf-8")
    late = text.replace("at_s = 2.6", "at_s = 5000")
    assert late != text
    (variant,) = run_scenario(load_scenario(write_scenario(late))).variants
    assert variant.outcome.faults_unacted == ["crash rank 2 at t=5000s: never acted (the rank had ended before then)"]
    assert "unacted" in [e.key for e in variant.expectations if not e.ok]
    (variant,) = run_scenario(load_scenario(write_scenario(text))).variants
    assert variant.ok and variant.outcome.faults_unacted == []


def test_recovery_expectations_on_a_plain_run_fail_clearly(write_scenario) -> None:
    (variant,) = run_scenario(load_scenario(write_scenario(TINY + "\n[[expect]]\ncommitted_steps = 1\n"))).variants
    assert [e.message for e in variant.expectations] == ["not a recovery run (the scenario has no [recovery] table)"]


def test_a_recovery_expectation_key_is_validated(write_scenario) -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(write_scenario(TOML.format(gpus=6, recovery="", faults="") + "[[expect]]\nlost_steps = 'x'\n"))
    assert err.value.key == "expect[0].lost_steps"
