"""The real tier on the CPU lane: gloo processes, the simulator with gloo semantics, and no process left behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY, ended_by_ctrl_c, marked_processes

pytest.importorskip("torch")

from simnccl.ops import (
    AllGather,
    Alloc,
    AllReduce,
    AllToAll,
    Barrier,
    Broadcast,
    Checkpoint,
    Compute,
    DestroyProcessGroup,
    InitProcessGroup,
    MemoryCheck,
    NewGroup,
    PgOptions,
    Program,
    Recv,
    ReduceScatter,
    Send,
    SetDevice,
    SplitGroup,
)
from simnccl.policy import get_policy
from simnccl.real.compare import compare_variant
from simnccl.real.lanes import NO_CUDA, CpuLanePolicy, LaneError, check_gpu_lane, cpu_programs, cpu_substitutions
from simnccl.real.launch import INHERITED_PREFIXES, Launcher, RunSettings, compute_notes, compute_problem
from simnccl.real.report import rank_outcomes
from simnccl.real.zygote import pid_alive

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
FAST = RunSettings.for_lane("cpu", torch_timeout_s=3.0, stall_s=5.0, timeout_s=40.0)


def run_cli(*args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, str]:
    mark = uuid.uuid4().hex
    env = dict(os.environ, REAL_TEST_MARK=mark, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [PYTHON, "-m", "simnccl.real", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    return done, mark


@pytest.fixture(scope="module")
def launcher():
    with Launcher() as shared:
        yield shared
    time.sleep(0.1)
    assert not [p for p in shared.all_pids if pid_alive(p)], "a rank process outlived its launcher"
    assert not [p for p in shared.store_host_pids if pid_alive(p)], "a store host outlived its launcher"


# ---------------------------------------------------------------------------------------------- the lane rewrite


def test_cpu_programs_substitute_gloo_and_drop_nccl_only_parts() -> None:
    program = Program(
        (
            SetDevice(),
            InitProcessGroup(backend="cpu:gloo,cuda:nccl", device_id=0, pg_options=PgOptions(lazy_init=True)),
            NewGroup(ranks=(0, 1), bind="a", backend="nccl-lazy", pg_options=PgOptions(split_share=True)),
            NewGroup(ranks=(0, 1), bind="b"),
            SplitGroup(split_ranks=((0,), (1,)), bind="s", pg_options=PgOptions(lazy_init=True)),
            Alloc(mib=10),
            MemoryCheck(),
            AllReduce(group="a"),
        )
    )
    rewritten = cpu_programs([program, program])
    assert rewritten[0] is rewritten[1], "identical programs stay one shared object"
    ops = rewritten[0].ops
    assert len(ops) == len(program.ops), "op indices are the scenario's"
    assert isinstance(ops[0], Compute) and isinstance(ops[5], Compute) and isinstance(ops[6], Compute)
    assert ops[1] == InitProcessGroup(backend="gloo")
    assert ops[2] == NewGroup(ranks=(0, 1), bind="a", backend="gloo")
    assert ops[3] == NewGroup(ranks=(0, 1), bind="b"), "None keeps meaning: the default group's backend"
    assert ops[4] == SplitGroup(split_ranks=((0,), (1,)), bind="s")
    assert ops[7] == program.ops[7]
    text = "\n".join(cpu_substitutions([program]))
    assert "cpu:gloo,cuda:nccl -> gloo" in text and "nccl-lazy -> gloo" in text and "device_id" in text


def test_cpu_lane_policy_keeps_decisions_on_gloo() -> None:
    from simnccl.policy import GroupRequest, History, InitRequest, decide_group

    policy = CpuLanePolicy(get_policy("lazy-init+nccl-lazy-p2p"))
    plan = policy.on_init(InitRequest(0, 2, "2.15", {}, "gloo", None))
    assert plan.backend == "gloo" and plan.pg_options == PgOptions()
    request = GroupRequest("new_group", (0, 1), 0, 2, "2.15", {}, "nccl", PgOptions(), False, "pp", None, History())
    decision = decide_group(policy, request)
    assert decision.backend == "gloo" and decision.pg_options == PgOptions()


def test_gpu_lane_refuses_clearly() -> None:
    with pytest.raises(LaneError, match="no CUDA device: the GPU lane needs one"):
        check_gpu_lane(1, gpus=0)
    with pytest.raises(LaneError, match="4 ranks but 1 visible GPU"):
        check_gpu_lane(4, gpus=1)


@pytest.mark.skipif(bool(os.environ.get("CUDA_VISIBLE_DEVICES")), reason="checks the no-CUDA path")
def test_cli_gpu_lane_and_calibrate_refuse_without_cuda(tmp_path: Path) -> None:
    from simnccl.real.lanes import visible_gpus

    if visible_gpus():
        pytest.skip("this machine has a CUDA device")
    done, _ = run_cli("run", "scenarios/creation-order-hang.toml", "--lane", "gpu", timeout=60)
    assert done.returncode == 2 and NO_CUDA in done.stderr
    done, _ = run_cli("calibrate", "--out", str(tmp_path / "p.toml"), timeout=60)
    assert done.returncode == 2 and NO_CUDA in done.stderr
    assert not (tmp_path / "p.toml").exists()


@pytest.mark.parametrize("command", ["run", "compare"])
def test_a_recovery_scenario_is_refused_not_run_into_errors(command: str) -> None:
    """A [recovery] scenario's groups are made by simnccl.recovery, which the real lanes do not run: the real
    tier refuses it (exit 2, naming the file and the key) instead of running the bare steps, where every rank
    met a group that was never created and the run "failed" (exit 1) for a reason that is not the scenario's."""
    done, _ = run_cli(command, "scenarios/crash-replaced.toml", timeout=60)
    assert done.returncode == 2, done.stderr
    assert "crash-replaced.toml: recovery: a [recovery] scenario is simulated only" in done.stderr


@pytest.mark.parametrize("command", ["run", "compare"])
def test_a_world_past_the_launchers_limit_is_refused_not_an_internal_error(command: str) -> None:
    """32 ranks on a launcher of 16 local processes is a lane that cannot run here (exit 2, saying what to do),
    not an internal error (it was exit 70: the LaunchError escaped the command)."""
    done, _ = run_cli(command, "scenarios/megatron-tp8-pp2-dp2-4nodes.toml", timeout=120)
    assert done.returncode == 2, done.stderr
    assert "32 ranks exceed the real tier's limit of 16 local processes" in done.stderr
    assert "internal error" not in done.stderr


def test_a_world_past_the_launchers_limit_is_refused_before_the_simulated_side_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``real compare`` simulated the whole scenario before its real side refused it: minutes and 17 GB for a
    65,536-rank scenario within every input limit, then exit 2 (or killed for memory)."""
    from simnccl.real import __main__ as real_main
    from simnccl.real import compare

    def simulated(*args: object, **kwargs: object) -> None:
        raise AssertionError("the simulated side ran")

    monkeypatch.setattr(compare, "compare_scenario", simulated)
    assert real_main.main(["compare", str(REPO / "scenarios/megatron-tp8-pp2-dp2-4nodes.toml")]) == 2
    assert "32 ranks exceed the real tier's limit of 16 local processes" in capsys.readouterr().err


def test_under_torchrun_a_world_past_the_local_limit_is_torchruns_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local launcher's limit (16 processes on this machine) is not torchrun's: its world spans machines."""
    from simnccl.real import __main__ as real_main
    from simnccl.real import torchrun_mode

    reached: list[int] = []
    monkeypatch.setattr(torchrun_mode, "torchrun_main", lambda scenario, *args: reached.append(len(scenario.programs)))
    for name, value in {"RANK": "0", "WORLD_SIZE": "32", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    real_main.main(["run", str(REPO / "scenarios/megatron-tp8-pp2-dp2-4nodes.toml"), "--variant", "legacy"])
    assert reached == [32]


@pytest.mark.parametrize("command", ["run", "compare"])
def test_a_user_policy_that_raises_on_the_real_ranks_is_bad_input(command: str, tmp_path: Path) -> None:
    """A user's policy that raises is a defect of the user's input: ``simnccl run`` exits 2 naming the policy,
    the hook and the exception. On the real ranks it only ended the ranks: ``real run`` reported an "error"
    (exit 1, a failed check) and ``real compare`` a disagreement (exit 1). The policy here raises on real torch
    only (the simulation passes), so compare's real side is what must say it."""
    scenario = tmp_path / "two.toml"
    scenario.write_text(_TWO_RANKS)
    done = subprocess.run(
        [PYTHON, "-m", "simnccl.real", command, str(scenario), "--policy", "user_policies:NcclOnlyUnderTorch"],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "policy 'nccl-only-under-torch': on_group raised RuntimeError: expected an NCCL world, got gloo (rank 0, "
        "new_group(ranks=[0, 1], backend='gloo'))"
    ) in done.stderr, done.stderr


def _three_variants() -> str:
    """Two ranks that pass; variants quick, slow (a policy that sleeps 60 s) and never."""
    return _TWO_RANKS.replace('name = "two-ranks"', 'name = "three-variants"') + (
        '\n[[variants]]\nname = "quick"\n\n[[variants]]\nname = "slow"\npolicy = "user_policies:SleepsOnGroup"\n'
        '\n[[variants]]\nname = "never"\n'
    )


@pytest.mark.parametrize("command", ["run", "compare"])
def test_ctrl_c_after_a_variant_finished_reports_it_in_text_and_json(command: str, tmp_path: Path) -> None:
    """Ctrl-C leaves a partial report: the real tier said "nothing had finished" and wrote no JSON after a
    variant had finished. Now the text names what finished, what was stopped and what never started, and the
    JSON holds the finished variant, marked ``interrupted`` and not ok; exit 130, no traceback."""
    import signal as signals

    scenario = tmp_path / "three.toml"
    scenario.write_text(_three_variants())
    report = tmp_path / "out.json"
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(
        [PYTHON, "-m", "simnccl.real", command, str(scenario), "--stall", "100", "--json", str(report)],
        cwd=REPO,
        env=dict(
            os.environ, REAL_TEST_MARK=mark, PYTHONUNBUFFERED="1", PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        while not (line := proc.stdout.readline()).startswith("variant quick:"):
            assert line, "the command ended before its first variant finished"
        proc.send_signal(signals.SIGINT)  # the slow variant's policy sleeps 60 s: it is running now
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "nothing had finished" not in err, err
    assert f"finished  {scenario}  quick: " in err, err
    assert f"stopped   {scenario}  slow: not finished" in err and f"skipped   {scenario}  never: not started" in err
    document = json.loads(report.read_text())
    (result,) = document["results"]
    assert result["interrupted"] is True and result["not_finished"] == ["slow", "never"]
    assert [v["name"] for v in result["variants"]] == ["quick"]
    assert document["ok"] is False and result["ok"] is False, "an interrupted run never reads as passing"
    deadline = time.monotonic() + 10
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked_processes(mark) == []


def test_compute_the_settings_would_stop_as_a_hang_is_named_before_anything_runs() -> None:
    """A compute sleep as long as --stall, or a rank's sleeps adding up to --timeout, made the watcher kill a
    healthy run and report a hang (exit 1); the settings are at fault, not the program."""
    programs = [Program((Compute(seconds=100.0), Compute(seconds=100.0))), Program((Compute(seconds=50.0),))]
    settings = RunSettings.for_lane("cpu", compute_scale=0.01, stall_s=5.0, timeout_s=30.0)  # sleeps of 1 s
    assert compute_problem(programs, settings) is None
    too_slow = replace(settings, compute_scale=0.1)  # a 10 s sleep, capped at 2 s: fine for stall 5 s
    assert compute_problem(programs, too_slow) is None
    stall = compute_problem(programs, replace(settings, stall_s=0.5))
    assert stall is not None and "a compute op sleeps 1 s" in stall and "--stall 0.5 s" in stall
    timeout = compute_problem(programs, replace(settings, compute_scale=0.1, timeout_s=4.0))
    assert timeout is not None and "rank 0's compute ops sleep 4 s in all" in timeout and "--timeout 4 s" in timeout
    assert compute_problem(programs, replace(settings, compute_scale=0.0, stall_s=0.1, timeout_s=0.1)) is None
    # torchrun mode stops a rank on its timeout only: a long sleep is fine there, sleeps past the timeout are not
    assert compute_problem(programs, replace(settings, stall_s=0.5), stall_watched=False) is None
    timeout_there = compute_problem(programs, replace(settings, compute_scale=0.1, timeout_s=4.0), stall_watched=False)
    assert timeout_there == timeout


def test_compute_the_real_ranks_do_not_sleep_is_said_in_the_notes() -> None:
    """On the CPU lane compute is not slept by default: a straggler scenario compared "sim hang | real pass" with
    nothing to say the real ranks were never late."""
    programs = [Program((Compute(seconds=1.8),)), Program(())]
    settings = RunSettings.for_lane("cpu")
    (skipped,) = compute_notes(programs, replace(settings, compute_scale=0.0))
    assert skipped.startswith("compute steps were not slept (--compute-scale 0)")
    (scaled,) = compute_notes(programs, replace(settings, compute_scale=0.5))
    assert scaled.startswith("compute steps slept seconds x 0.5 (--compute-scale), each at most")
    (capped,) = compute_notes([Program((Compute(seconds=30.0),))], replace(settings, compute_scale=1.0))
    assert "each at most 2 s" in capped
    assert compute_notes(programs, replace(settings, compute_scale=1.0)) == []  # slept as written
    assert compute_notes([Program(())], replace(settings, compute_scale=0.0)) == []  # nothing to sleep


def test_a_run_its_own_settings_would_call_hung_is_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "computes.toml"
    path.write_text(
        TINY.replace('{ op = "checkpoint", name = "after_init" },', '{ op = "compute", seconds = 300 },'),
        encoding="utf-8",
    )
    done, mark = run_cli("run", str(path), "--compute-scale", "1", "--stall", "1", timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "a compute op sleeps 2 s" in done.stderr and "--stall 1 s" in done.stderr
    assert not marked_processes(mark)


# ---------------------------------------------------------------------------------------------- acceptance


def test_compare_creation_order_hang_agrees_and_leaves_no_process(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    done, mark = run_cli("compare", "scenarios/creation-order-hang.toml", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ALL AGREE" in done.stdout
    doc = json.loads(out.read_text())  # the document every simnccl command writes
    assert doc["command"] == "real compare" and doc["ok"] is True
    assert [line["verdict"] for line in doc["summary"]] == ["agree"] * len(doc["summary"])
    (report,) = doc["results"]
    assert report["lane"] == "cpu" and "init_process_group: backend nccl -> gloo" in report["substitutions"]
    for variant in report["variants"]:
        assert variant["agree"], variant["reasons"]
        assert variant["sim_verdict"] == variant["real_verdict"] == "hang"
        sim_stuck = [h["rank"] for h in variant["sim"]["hangs"]]
        real_stuck = [h["rank"] for h in variant["real"]["hangs"]]
        assert sim_stuck == real_stuck == [0, 1, 2, 3]
        for rank in variant["real"]["ranks"]:
            assert not pid_alive(rank["pid"]), f"rank {rank['rank']} (pid {rank['pid']}) survived"
    assert marked_processes(mark) == [], "a process started by the run is still alive"


# ---------------------------------------------------------------------------------------------- passing runs


def _pass_program(rank: int) -> Program:
    ops = [
        SetDevice(),
        InitProcessGroup(backend="nccl"),
        NewGroup(ranks=(0, 1), bind="tp", purpose="tp"),
        NewGroup(ranks=(2,), bind="tp", purpose="tp"),
        NewGroup(ranks=(0, 2), bind="pair"),
        AllReduce(group="tp", size_bytes=1000),
        Broadcast(size_bytes=256, src=0),
        AllGather(group="tp", size_bytes=64),
        ReduceScatter(size_bytes=96),
        AllToAll(size_bytes=96),
        AllReduce(group="pair", size_bytes=64),  # rank 1 is not a member: torch warns, nothing runs
        SplitGroup(split_ranks=((0, 1), (2,)), bind="split"),
        Barrier(group="split"),
        Compute(seconds=5.0),
        Checkpoint(label="end"),
    ]
    if rank == 0:
        ops.append(Send(peer=2, size_bytes=128))
    elif rank == 2:
        ops.append(Recv(peer=0, size_bytes=128))
    ops.append(DestroyProcessGroup())
    return Program(tuple(ops))


def test_a_program_that_completes_passes_on_both(launcher: Launcher) -> None:
    programs = cpu_programs([_pass_program(r) for r in range(3)])
    real = launcher.run_programs(programs, FAST, name="pass")
    assert real["verdict"] == "pass", json.dumps(real["errors"] + real["hangs"], indent=1)
    assert real["end_reason"] == "finished"
    rank1 = real["ranks"][1]
    by_name = {op["op"]: op for op in rank1["ops"]}
    assert all(op["outcome"] == "ok" and op["end"] >= op["start"] for op in rank1["ops"])
    assert "not a member" in by_name["all_reduce(group='pair', size_bytes=64)"]["detail"]
    assert "skipped" in rank1["ops"][13]["detail"], "compute is skipped on the CPU lane by default, and says so"
    assert [c["name"] for c in real["checkpoints"]] == ["end"] and real["checkpoints"][0]["devices"] == []
    assert {r["status"] for r in real["ranks"]} == {"done"} and all(r["exit_code"] == 0 for r in real["ranks"])
    sim = _simulate(programs)
    assert sim["verdict"] == "pass"
    assert compare_variant("pass", "cpu", sim, real, 3, 0.0).agree


def _simulate(programs) -> dict:
    from simnccl.real.differential import Case, simulate_case

    return simulate_case(Case(0, 0, len(programs), tuple(programs), ()))


def test_policy_is_routed_through_apply_on_the_cpu_lane(launcher: Launcher) -> None:
    """dedupe: the second identical new_group is answered from the first, without a torch call."""
    program = Program(
        (
            InitProcessGroup(backend="gloo"),
            NewGroup(ranks=(0, 1), bind="a"),
            NewGroup(ranks=(0, 1), bind="b"),
            AllReduce(group="a", size_bytes=64),
            AllReduce(group="b", size_bytes=64),
        )
    )
    real = launcher.run_programs([program, program], FAST, policy="dedupe", name="dedupe")
    assert real["verdict"] == "pass"
    calls = [d for d in real["decisions"] if d["call"] == "new_group"]
    assert [d["torch_called"] for d in calls] == [True, False]
    assert "reuse" in calls[1]["plan"]
    group_of = [op["detail"] for op in real["ranks"][0]["ops"] if op["name"] == "new_group"]
    assert group_of[0] == group_of[1], "both handles are the same torch group"


_BUDGET_ON_A_GPU = """\
[scenario]
name = "budget-on-a-gpu"
policy = "budget(100)"

[cluster]
gpu = "h100-80gb"
gpus_per_node = 1

[torch]
release = "2.15"

[workload]
steps = [
  { op = "init_process_group", backend = "gloo" },
  { op = "new_group", ranks = [0], backend = "nccl", bind = "g" },
]
"""


def test_the_gpu_lanes_ranks_price_budget_groups_as_the_simulation_does(
    launcher: Launcher, write_scenario: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU lane's ranks applied their policy without the GPU kind: ``budget(X)`` raised PolicyError ("needs
    the cost of one eager communicator") at the first eager NCCL group, a real "error" where the simulation,
    pricing from the variant's profile, decided. Run here with CUDA faked visible: the rank's policy decides
    before torch is called (torch's CPU build then refuses the NCCL group, which is not what is checked)."""
    import simnccl.real.lanes as lanes
    from simnccl.real.compare import simulate
    from simnccl.real.launch import run_scenario_real
    from simnccl.scenario import load_scenario

    monkeypatch.setattr(lanes, "visible_gpus", lambda: 1)
    scenario = load_scenario(write_scenario(_BUDGET_ON_A_GPU))
    (real,) = run_scenario_real(scenario, RunSettings.for_lane("gpu", timeout_s=60.0), launcher=launcher)["variants"]
    assert "PolicyError" not in json.dumps(real["errors"]), real["errors"]
    sim = simulate(scenario, scenario.variants[0], "gpu")
    expected = [d["explanation"] for d in sim["decisions"] if d["call"].startswith("new_group")]
    assert expected and "budget: 1 x " in expected[0] and "lazy_init" in expected[0], expected
    assert [d["explanation"] for d in real["decisions"] if d["call"] == "new_group"] == expected


def test_the_gpu_lanes_ranks_price_budget_groups_by_the_variants_calibrated_profile(
    launcher: Launcher, write_scenario: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant run with a calibrated profile (here the built-in one with 300 MiB more per communicator, so
    ``budget(400)`` goes lazy where the built-in prices would keep the group eager): the real ranks decide by that
    profile, as the simulation does. Priced by the kind's built-in profile they decided otherwise."""
    import simnccl.real.lanes as lanes
    from simnccl.profiles import find_profile
    from simnccl.real.compare import simulate
    from simnccl.real.launch import run_scenario_real
    from simnccl.scenario import load_scenario

    builtin = Path(find_profile("h100-80gb", "2.15").path).read_text(encoding="utf-8")
    calibrated = builtin.replace('name = "h100-80gb-extrapolated"', 'name = "calibrated"', 1)
    calibrated = calibrated.replace("comm_fixed_mib = 0.5556", "comm_fixed_mib = 300.5556", 1)
    assert calibrated.count("calibrated") == 1 and "300.5556" in calibrated
    write_scenario(calibrated, "calibrated.toml")
    text = _BUDGET_ON_A_GPU.replace('policy = "budget(100)"', 'policy = "budget(400)"').replace(
        'release = "2.15"', 'release = "2.15"\nprofile = "calibrated.toml"'
    )
    monkeypatch.setattr(lanes, "visible_gpus", lambda: 1)
    scenario = load_scenario(write_scenario(text))
    (real,) = run_scenario_real(scenario, RunSettings.for_lane("gpu", timeout_s=60.0), launcher=launcher)["variants"]
    sim = simulate(scenario, scenario.variants[0], "gpu")
    expected = [d["explanation"] for d in sim["decisions"] if d["call"].startswith("new_group")]
    assert expected and "would exceed 400 MiB: lazy_init" in expected[0], expected
    assert [d["explanation"] for d in real["decisions"] if d["call"] == "new_group"] == expected


# ---------------------------------------------------------------------------------------------- failing runs


def test_timeout_kills_reaps_and_reports_last_ops(launcher: Launcher) -> None:
    programs = [
        Program((InitProcessGroup(backend="gloo"), AllReduce(size_bytes=64), Checkpoint(label="never"))),
        # stuck in a receive rank 0 never sends (a compute op longer than --timeout is refused before the run:
        # the settings, not the program, would make that a hang)
        Program((InitProcessGroup(backend="gloo"), Recv(peer=0, size_bytes=64), AllReduce(size_bytes=64))),
    ]
    settings = RunSettings.for_lane("cpu", timeout_s=6.0, stall_s=100.0, torch_timeout_s=100.0)
    started = time.monotonic()
    real = launcher.run_programs(programs, settings, name="timeout")
    assert time.monotonic() - started < 30
    assert real["verdict"] == "hang"
    assert real["end_reason"] == "wall-clock timeout of 6s"
    hangs = {h["rank"]: h for h in real["hangs"]}
    assert hangs[0]["op"] == "all_reduce(size_bytes=64)" and hangs[0]["op_index"] == 1
    assert hangs[0]["waiting_for"] == [1]
    assert hangs[1]["op"].startswith("recv(") and hangs[1]["op_index"] == 1
    assert all("killed by the launcher" in h["watchdog"] for h in hangs.values())
    for rank in real["ranks"]:
        assert rank["killed"] and rank["exit_code"] == -9
        assert not pid_alive(rank["pid"])


def test_torch_timeout_ends_a_missing_collective_as_a_hang(launcher: Launcher) -> None:
    programs = [
        Program((InitProcessGroup(backend="gloo"), AllReduce(size_bytes=64))),
        Program((InitProcessGroup(backend="gloo"),)),
    ]
    real = launcher.run_programs(programs, FAST, name="missing")
    assert real["verdict"] == "hang" and real["end_reason"] == "finished"
    (hang,) = real["hangs"]
    assert hang["rank"] == 0 and hang["waiting_for"] == [1] and hang["watchdog"].startswith("torch/gloo timeout")
    sim = _simulate(cpu_programs(programs))
    assert [r for r, o in rank_outcomes(sim, 2).items() if o["status"] == "hang"] == [0]
    assert compare_variant("missing", "cpu", sim, real, 2, 0.0).agree


def test_gloo_size_overflow_aborts_and_is_an_error_on_both(launcher: Launcher) -> None:
    programs = [
        Program((InitProcessGroup(backend="gloo"), AllReduce(size_bytes=16))),
        Program((InitProcessGroup(backend="gloo"), AllReduce(size_bytes=32))),
    ]
    real = launcher.run_programs(programs, FAST, name="abort")
    assert real["verdict"] == "error"
    kinds = {e["rank"]: e["kind"] for e in real["errors"]}
    assert "abort" in kinds.values(), real["errors"]
    aborted = next(e for e in real["errors"] if e["kind"] == "abort")
    assert "EnforceNotMet" in aborted["log_tail"] and "signal 6" in aborted["message"]
    sim = _simulate(cpu_programs(programs))
    assert sim["verdict"] == "error"
    comparison = compare_variant("abort", "cpu", sim, real, 2, 0.0)
    assert comparison.blocked_agree
    # rank 0 (it receives 8 floats into 4) dies of SIGABRT on both sides; rank 1 then loses its peer on both
    # (the simulator aborted it too before it ran gloo's messages)
    by_rank = {e["rank"]: e for e in real["errors"]}
    assert (by_rank[0]["kind"], by_rank[0]["exit_code"]) == ("abort", -6)
    assert (by_rank[1]["kind"], by_rank[1]["type"]) == ("peer-lost", "RuntimeError"), real["errors"]
    assert comparison.agree and comparison.known_gap is None, comparison.reasons


# ---------------------------------------------------------------------------------------------- torchrun


_TWO_RANK_STEPS = """\
  { op = "new_group", ranks = [0, 1], bind = "tp" },
  { op = "all_reduce", group = "tp", size_mib = 1 },"""


def _run_two_ranks_under_torchrun(
    tmp_path: Path, pythonpath: str, steps: str = _TWO_RANK_STEPS, *flags: str
) -> tuple[subprocess.CompletedProcess, str, Path]:
    """``torchrun --standalone --nproc-per-node 2 -m simnccl.real run`` on a two-rank scenario, with
    ``NCCL_DEBUG=WARN`` exported around torchrun; the completed torchrun, its processes' mark and the report."""
    torchrun = Path(PYTHON).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun not installed next to this interpreter")
    scenario = tmp_path / "two.toml"
    scenario.write_text(
        """
[scenario]
name = "two"
[cluster]
gpu = "h100-80gb"
gpus_per_node = 2
[torch]
release = "2.15"
[workload]
steps = [
  { op = "set_device" },
  { op = "init_process_group", backend = "nccl" },
"""
        + steps
        + """
  { op = "checkpoint", name = "end" },
]
""",
        encoding="utf-8",
    )
    mark = uuid.uuid4().hex
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED_PREFIXES)}
    env.update(REAL_TEST_MARK=mark, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1", NCCL_DEBUG="WARN")
    done = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "simnccl.real",
            "run",
            str(scenario),
            "--json",
            str(out),
            *flags,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return done, mark, out


def test_run_under_torchrun(tmp_path: Path) -> None:
    done, mark, out = _run_two_ranks_under_torchrun(tmp_path, str(REPO))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (report,) = json.loads(out.read_text())["results"]
    (variant,) = report["variants"]
    assert variant["verdict"] == "pass" and "launched by torchrun" in variant["notes"]
    assert len(variant["ranks"]) == 2 and all(r["status"] == "done" for r in variant["ranks"])
    assert marked_processes(mark) == []
    # the knob exported around torchrun reached the ranks, and the report says so (torchrun adds its own:
    # TORCH_NCCL_ASYNC_ERROR_HANDLING=1)
    assert variant["inherited_env"]["NCCL_DEBUG"] == "WARN"
    assert [n for n in variant["notes"] if "NCCL_DEBUG=WARN" in n and "inherited" in n]


def test_a_run_under_torchrun_stopped_past_its_timeout_exits_1_and_says_its_wall_time(tmp_path: Path) -> None:
    """Rank 0 alone in an all_reduce: the watchdog reports the hang and the ranks exit 1 (a failed run). They
    exited 124, none of simnccl's codes, and the report's figure said "? s wall"."""
    steps = '  { op = "all_reduce", size_mib = 1, on_ranks = [0] },'
    done, mark, out = _run_two_ranks_under_torchrun(tmp_path, str(REPO), steps, "--timeout", "8")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "124" not in re.findall(r"exitcode\s*:\s*(\d+)", done.stderr)
    (report,) = json.loads(out.read_text())["results"]
    (variant,) = report["variants"]
    # a hang, or gloo's own timeout error when the load lets it fire before the watchdog: never a pass
    assert variant["verdict"] in ("hang", "error") and isinstance(variant["wall_s"], float)
    assert marked_processes(mark) == []


def test_a_torchrun_rank_ends_without_the_interpreters_teardown(tmp_path: Path) -> None:
    """A rank under torchrun ends with its exit code once its report is out, before the interpreter's teardown.
    Why: torch's C++ teardown of the groups a rank keeps to the end aborted rank 0 in CI ("terminate called
    without an active exception") after a passing report, and torchrun failed the run. The stand-in here is an
    exit handler in every rank that ends it with 134, as that abort did."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import atexit, os\n"
        "if 'RANK' in os.environ and 'LOCAL_RANK' in os.environ:  # the ranks, not torchrun's agent\n"
        "    atexit.register(os._exit, 134)\n",
        encoding="utf-8",
    )
    done, mark, out = _run_two_ranks_under_torchrun(tmp_path, f"{hook}{os.pathsep}{REPO}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (report,) = json.loads(out.read_text())["results"]
    assert report["variants"][0]["verdict"] == "pass"
    assert marked_processes(mark) == []


def test_knobs_inherited_from_the_launchers_environment_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch/NCCL/gloo variable in the launcher's environment reaches every real rank: the real result names
    each one the variant does not set (``inherited_env``), and its note says so; a variable the variant sets is
    the variant's, not inherited."""
    for name in [n for n in os.environ if n.startswith(INHERITED_PREFIXES)]:
        # this worker's own (importing deepspeed, as a framework test may have, sets PYTORCH_NVML_BASED_CUDA_CHECK)
        monkeypatch.delenv(name)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    programs = cpu_programs([_pass_program(r) for r in range(3)])
    with Launcher() as fresh:  # its zygote starts from this environment
        real = fresh.run_programs(programs, FAST, env={"TORCH_DISTRIBUTED_DEBUG": "OFF"}, name="inherits")
    assert real["verdict"] == "pass", json.dumps(real["errors"] + real["hangs"], indent=1)
    assert real["inherited_env"] == {"NCCL_DEBUG": "WARN"}
    assert [n for n in real["notes"] if "inherited 1 torch/NCCL/gloo variable(s)" in n and "NCCL_DEBUG=WARN" in n]


def test_a_comparison_simulates_the_knobs_its_real_ranks_inherit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``real compare``'s simulated side runs the inherited knobs it can (a comparison of two configurations
    would call the knob's effect the model's), under the variant's own; the one it cannot run (a name simnccl
    does not know) is named in the comparison's note. The launcher's environment is read when its zygote starts:
    a variable set in this process afterwards reaches neither side."""
    from simnccl.real.compare import compare_scenario, render_comparison_variant
    from simnccl.scenario import load_scenario

    for name in [n for n in os.environ if n.startswith(INHERITED_PREFIXES)]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")  # a knob simnccl knows
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # gloo's: not a checked prefix, runs on both sides
    monkeypatch.setenv("NCCL_NOT_A_KNOB_SIMNCCL_KNOWS", "1")
    path = tmp_path / "two-ranks.toml"
    path.write_text(
        '[scenario]\nname = "two-ranks"\n[cluster]\ngpu = "h100-80gb"\nnodes = 1\ngpus_per_node = 2\n'
        '[torch]\nrelease = "2.15"\n[workload]\nsteps = [\n  { op = "set_device" },\n'
        '  { op = "init_process_group", backend = "nccl" },\n  { op = "all_reduce", size_mib = 1 },\n]\n'
        '[[variants]]\nname = "debug-off"\nenv = { TORCH_DISTRIBUTED_DEBUG = "OFF" }\n'
    )
    scenario = load_scenario(path)
    variant = scenario.variants[0]
    with Launcher() as fresh:
        inherited = fresh.inherited_env(variant.env)
        monkeypatch.setenv("NCCL_SET_AFTER_THE_ZYGOTE_STARTED", "1")
        assert fresh.inherited_env(variant.env) == inherited
        report = compare_scenario(scenario, FAST, variants=[variant.name], launcher=fresh)
    (compared,) = report["variants"]
    assert (
        compared["real"]["inherited_env"]
        == inherited
        == {
            "GLOO_SOCKET_IFNAME": "lo",
            "NCCL_DEBUG": "WARN",
            "NCCL_NOT_A_KNOB_SIMNCCL_KNOWS": "1",
        }
    )
    assert compared["agree"], compared["reasons"]
    assert compared["sim"]["env"] == {
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_DEBUG": "WARN",
        "TORCH_DISTRIBUTED_DEBUG": "OFF",
    }
    text = render_comparison_variant(compared)
    assert "the simulated side ran without NCCL_NOT_A_KNOB_SIMNCCL_KNOWS (a name simnccl does not know" in text


def test_inherited_knobs_the_simulator_cannot_run_are_set_apart() -> None:
    from simnccl.real.launch import inherited_note, simulated_knobs

    inherited = {
        "NCCL_BUFFSIZE": "8388608",
        "NCCL_TYPO_KNOB": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "9",  # outside the range simnccl reads
        "GLOO_DEVICE_TRANSPORT": "TCP",
        "NCCL_NCHANNELS_PER_NET_PEER": "abc",  # a known knob whose value NCCL's memory model cannot read
    }
    runs = simulated_knobs(inherited)
    assert runs == {"NCCL_BUFFSIZE": "8388608", "GLOO_DEVICE_TRANSPORT": "TCP"}
    assert {k: v for k, v in inherited.items() if k not in runs} == {
        "NCCL_TYPO_KNOB": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "9",
        "NCCL_NCHANNELS_PER_NET_PEER": "abc",
    }
    assert inherited_note(inherited, runs) is not None
    assert "ran without NCCL_TYPO_KNOB, TORCH_NCCL_ASYNC_ERROR_HANDLING, NCCL_NCHANNELS_PER_NET_PEER (" in str(
        inherited_note(inherited, runs)
    )
    assert str(inherited_note(runs, runs)).endswith("the simulated side ran with them too")
    assert "simulated side" not in str(inherited_note(inherited))  # a real run alone has no simulated side


def test_the_inherited_knobs_note_is_bounded() -> None:
    from simnccl.real.launch import inherited_knobs, inherited_note

    environ = {f"NCCL_KNOB_{i:02d}": "x" * 500 for i in range(40)} | {"PATH": "/bin", "NCCL_SET": "1"}
    knobs = inherited_knobs(environ, {"NCCL_SET": "2"})
    assert len(knobs) == 40 and "PATH" not in knobs and "NCCL_SET" not in knobs
    note = inherited_note(knobs)
    assert note is not None and len(note) < 1500 and note.endswith("(and 28 more)")
    assert inherited_note({}) is None


def test_a_reused_pid_does_not_inherit_an_earlier_ranks_exit() -> None:
    """With pid_max at 32,768 (this CI machine's), a long-lived zygote forks a new rank with the pid of one it
    reaped runs ago. The launcher read that old exit as the new rank's: a live rank counted as exited (left out of
    the stop, and reported with another rank's exit code). A spawn now clears the pid's earlier exit."""
    import io
    import threading

    from simnccl.real.zygote import Zygote

    lines = [{"exited": 4242, "code": 0}, {"spawned": 4242, "tag": "run0007/rank1"}, {"spawned": 4343, "tag": "x"}]
    zygote = Zygote.__new__(Zygote)  # its reader alone, fed the messages a real zygote writes
    zygote.proc = type("Proc", (), {"stdout": io.BytesIO(b"".join(json.dumps(m).encode() + b"\n" for m in lines))})()
    zygote._lock = threading.Condition()
    zygote.exited, zygote._spawned, zygote.ready = {}, {}, False
    zygote._read()
    assert zygote._spawned == {"run0007/rank1": 4242, "x": 4343}
    assert zygote.exit_of(4242) is None
    zygote.proc.stdout = io.BytesIO(json.dumps({"exited": 4242, "code": -9}).encode() + b"\n")
    zygote._read()
    assert zygote.exit_of(4242) is not None and zygote.exit_of(4242)[0] == -9


def _run_in_thread(launcher: Launcher, programs: list[Program], settings: RunSettings) -> tuple[Any, dict[str, Any]]:
    """``run_programs`` in a thread of its own; (the thread, a dict that gets its "result" or its "error")."""
    import threading

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = launcher.run_programs(programs, settings, name="threaded")
        except Exception as err:  # handed to the test
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _wait_for_ranks(launcher: Launcher, count: int) -> None:
    deadline = time.monotonic() + 60
    while len(launcher.all_pids) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(launcher.all_pids) >= count


def test_the_zygote_outlives_the_thread_that_started_it() -> None:
    """``real diff`` runs each case in a pool thread of its own, on one launcher. The zygote had
    ``PR_SET_PDEATHSIG``, which follows the *thread* that started it: when that thread's case finished first, the
    kernel killed the zygote and the ranks of the world another thread still ran. They vanished mid-op and the run
    ended as a hang it never had (the ``real diff`` flake: 5 in 154 runs of its command under load). A world that
    runs while the starting thread ends must pass, on the zygote that thread started."""
    import threading

    programs = [Program((InitProcessGroup(backend="gloo"), Compute(seconds=1.5), AllReduce(size_bytes=64)))] * 2
    settings = RunSettings.for_lane("cpu", compute_scale=1.0, stall_s=30.0, timeout_s=60.0)
    with Launcher() as fresh:
        leave = threading.Event()
        starter = threading.Thread(target=lambda: (fresh.zygote, leave.wait(60)))
        starter.start()
        while fresh.zygote_pid is None:
            time.sleep(0.01)
        zygote = fresh.zygote_pid
        runner, outcome = _run_in_thread(fresh, programs, settings)
        _wait_for_ranks(fresh, 2)
        leave.set()  # the starting thread ends while the ranks compute
        starter.join()
        runner.join(90)
        assert "error" not in outcome, outcome.get("error")
        assert outcome["result"]["verdict"] == "pass", outcome["result"]["end_reason"]
        assert fresh.zygote_pid == zygote  # the same zygote ran it, not one started again


def test_a_zygote_that_dies_mid_run_is_a_launcher_failure_not_a_hang() -> None:
    """If the zygote dies anyway (the OOM killer, a signal), its ranks die with it, unreported: the run must end
    as the launcher's failure (LaunchError: exit 70), never wait for the stall and report a hang (exit 1)."""
    import signal as signals

    from simnccl.real.zygote import LaunchError

    programs = [
        Program((InitProcessGroup(backend="gloo"), AllReduce(size_bytes=64))),
        Program((InitProcessGroup(backend="gloo"),)),  # rank 0 waits on it: a hang the stall would report
    ]
    settings = RunSettings.for_lane("cpu", stall_s=120.0, timeout_s=150.0, torch_timeout_s=140.0)
    with Launcher() as fresh:
        runner, outcome = _run_in_thread(fresh, programs, settings)
        _wait_for_ranks(fresh, 2)
        zygote = fresh.zygote_pid
        assert zygote is not None
        os.kill(zygote, signals.SIGKILL)
        runner.join(60)
        assert not runner.is_alive(), "the run waited on ranks that died with their zygote"
        assert isinstance(outcome.get("error"), LaunchError), outcome
        assert f"rank zygote (pid {zygote}) exited with code -9" in str(outcome["error"])
        for pid in fresh.all_pids:
            assert not pid_alive(pid)


def _start_hung_run(tmp_path: Path, *options: str, **popen: Any) -> tuple[subprocess.Popen, str]:
    """``python -m simnccl.real run`` of a scenario that hangs (4 ranks, a long stall), marked as ``run_cli``
    marks its processes; its temporary folder under ``tmp_path`` (``TMPDIR``), where a test can look for it."""
    mark = uuid.uuid4().hex
    env = dict(os.environ, REAL_TEST_MARK=mark, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path))
    command = [PYTHON, "-m", "simnccl.real", "run", "scenarios/creation-order-hang.toml", "--stall", "100", *options]
    return subprocess.Popen(command, cwd=REPO, env=env, **popen), mark


def test_ctrl_c_pressed_again_and_again_ends_with_130_no_traceback_and_no_folder(tmp_path: Path) -> None:
    """Five SIGINTs 50 ms apart in a running ``real run``: the later ones landed in the first one's cleanup (the
    launcher waiting for its zygote, the guard reaping), a KeyboardInterrupt traceback came out, and the run's
    $TMPDIR/real-* folder was left behind."""
    import signal as signals

    proc, mark = _start_hung_run(tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _all_past_init(tmp_path, 4):
            time.sleep(0.1)
        assert _all_past_init(tmp_path, 4)
        for _ in range(5):
            proc.send_signal(signals.SIGINT)
            time.sleep(0.05)
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise
    ended_by_ctrl_c(proc)
    assert list(tmp_path.glob("real-*")) == []
    deadline = time.monotonic() + 10
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked_processes(mark) == []


def _kill_launcher_mid_run(tmp_path: Path, *options: str) -> None:
    """Start a hung run, SIGKILL its launcher once the launcher, its zygote and 4 ranks are up and every rank is
    past its init (so each has written its progress file), and wait until every process it started is gone
    (failing if one outlives it)."""
    proc, mark = _start_hung_run(tmp_path, *options, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (_all_past_init(tmp_path, 4) and len(marked_processes(mark)) >= 6):
            time.sleep(0.1)  # launcher, zygote, 4 ranks
        assert _all_past_init(tmp_path, 4) and len(marked_processes(mark)) >= 6
    finally:
        proc.kill()
        proc.wait(30)
    deadline = time.monotonic() + 10
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked_processes(mark) == [], "a zygote or rank outlived its launcher"


@pytest.mark.parametrize("policy", ["StartsADaemon", "StartsADetachedDaemon"])
@pytest.mark.parametrize("ends", ["passes", "hangs"])
def test_a_process_a_rank_starts_in_a_session_of_its_own_does_not_outlive_the_run(
    policy: str, ends: str, tmp_path: Path
) -> None:
    """Out of the rank's process group, such a process escaped the killpg, was re-parented to init and ran on
    after ``real run`` exited. Each rank is a child subreaper now and kills its tree before it ends (passes),
    and the zygote, a subreaper too, kills what a rank killed by the launcher left (hangs: rank 0 waits in an
    all_reduce rank 1 skips). The run still ends on time, with its verdict (nothing waits on the daemon's copy
    of the rank's output: it is the rank's log file)."""
    scenario = tmp_path / "two.toml"
    both = '{ op = "all_reduce", group = "g", size_mib = 1 },'
    hang = '{ op = "all_reduce", group = "g", size_mib = 1, on_ranks = [0] },'
    assert both in _TWO_RANKS
    scenario.write_text(_TWO_RANKS if ends == "passes" else _TWO_RANKS.replace(both, hang))
    mark = uuid.uuid4().hex
    try:
        done = subprocess.run(
            [PYTHON, "-m", "simnccl.real", "run", str(scenario), "--policy", f"user_policies:{policy}", "--stall", "2"],
            cwd=REPO,
            env=dict(os.environ, REAL_TEST_MARK=mark, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == (0 if ends == "passes" else 1), done.stdout + done.stderr
        deadline = time.monotonic() + 5
        while marked_processes(mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marked_processes(mark) == [], "a process a rank started outlived the run"
    finally:
        for pid in marked_processes(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_launcher_killed_mid_run_leaves_no_zygote_or_rank_or_folder(tmp_path: Path) -> None:
    """SIGKILL gives the launcher no chance to stop anything: its zygote sees its stdin close (or its parent
    change) and kills its ranks; the ranks die with the zygote (their own PR_SET_PDEATHSIG). The launcher's
    temporary folder goes too (the zygote removes it once its ranks are reaped): a CI runner whose pytest
    workers are killed at a timeout must not fill ``/tmp`` with one folder per killed run."""
    _kill_launcher_mid_run(tmp_path)
    assert list(tmp_path.glob("real-*")) == [], "the killed launcher's temporary folder was left behind"


def test_a_killed_launcher_asked_to_keep_its_files_keeps_them(tmp_path: Path) -> None:
    """``--keep``: the run's files are what the user asked for; the zygote must not remove them."""
    _kill_launcher_mid_run(tmp_path, "--keep")
    kept = list(tmp_path.glob("real-*/run*/rank*.jsonl"))
    assert len(kept) == 4, kept


def test_the_cli_exits_70_when_its_rank_zygote_dies_mid_run(tmp_path: Path) -> None:
    """Exit codes in a shell script: the zygote's death is simnccl's failure (70), not a hang (1). Through
    ``python -m simnccl.real`` (the entry torchrun launches), which ran unguarded: its crashes exited 1."""
    proc, mark = _start_hung_run(tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _all_past_init(tmp_path, 4) and time.monotonic() < deadline:  # every rank spawned and running
            time.sleep(0.1)
        zygotes = [pid for pid in marked_processes(mark) if _parent(pid) == proc.pid]  # the ranks are its children
        assert len(zygotes) == 1
        os.kill(zygotes[0], 9)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == 70, err
    assert f"LaunchError: the rank zygote (pid {zygotes[0]}) exited with code -9 during the run" in err
    assert marked_processes(mark) == []


def _all_past_init(tmp_path: Path, world: int) -> bool:
    """Whether each of a run's ranks has finished its init_process_group (so the zygote has forked them all)."""
    ended = 0
    for progress in tmp_path.glob("real-*/run*/rank*.jsonl"):
        records = [json.loads(line) for line in progress.read_text().splitlines() if line.endswith("}")]
        ended += any(r.get("e") == "end" and r.get("i") == 1 for r in records)
    return ended == world


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("PPid:"))
    except (OSError, StopIteration, ValueError):
        return None


# ---------------------------------------------------------------------------------------------- honest verdicts

_TWO_RANKS = TINY.replace('name = "tiny"', 'name = "two-ranks"').replace(
    '{ op = "checkpoint", name = "after_init" },',
    '{ op = "checkpoint", name = "after_init" },\n  { op = "new_group", ranks = [0, 1], bind = "g" },\n'
    '  { op = "all_reduce", group = "g", size_mib = 1 },',
)


def _compare_two_ranks(tmp_path: Path, policy: str, *flags: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """``simnccl real compare`` of ``_TWO_RANKS`` under ``policy`` (from tests/), in a process of its own: what
    it did, and the mark its ranks carry (``marked_processes``)."""
    scenario = tmp_path / "two.toml"
    scenario.write_text(_TWO_RANKS)
    env_path = f"{REPO}{os.pathsep}{REPO / 'tests'}"
    mark = uuid.uuid4().hex
    done = subprocess.run(
        [PYTHON, "-m", "simnccl.real", "compare", str(scenario), "--policy", policy, *flags],
        cwd=REPO,
        env=dict(os.environ, REAL_TEST_MARK=mark, PYTHONPATH=env_path),
        capture_output=True,
        text=True,
        timeout=240,
    )
    return done, mark


def test_compare_on_the_cpu_lane_fails_a_policy_whose_members_disagree(tmp_path: Path) -> None:
    """The CPU lane hands gloo the policy's plans without NCCL options: a policy that sets lazy_init on the
    last member only looked alike on every rank, passed in gloo and in the simulation of it, and compare said
    ALL AGREE (exit 0) for a policy that hangs NCCL. ``simnccl run`` reports it; so does compare now."""
    done, mark = _compare_two_ranks(tmp_path, "user_policies:LastMemberLazy")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DISAGREEMENT" in done.stdout and "the policy's members disagree under NCCL" in done.stdout
    assert not marked_processes(mark)


def test_a_policy_error_both_sides_raise_alike_agrees(tmp_path: Path) -> None:
    """A policy's reuse of a group no one made fails every rank with torch_apply's ApplyError, real and simulated.
    The simulator named it "ApplyError" and the real side "simnccl.torch_apply.ApplyError": compare said DISAGREE
    (exit 1) where both failed alike."""
    done, mark = _compare_two_ranks(tmp_path, "user_policies:ReusesAGroupNeverMade")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sim error | real error" in done.stdout and "ALL AGREE" in done.stdout
    assert not marked_processes(mark)


def test_json_to_stdout_is_the_document_alone_when_the_real_ranks_policy_prints(tmp_path: Path) -> None:
    """``real compare --json -`` with a policy that prints on the real ranks: its lines went to stdout before the
    document (exit 0, no JSON reader could parse it). They go to stderr, as under every other command."""
    done, mark = _compare_two_ranks(tmp_path, "user_policies:PrintsOnStdout", "--json", "-")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["command"] == "real compare"
    assert "prints-on-stdout: rank 1 init" in done.stderr
    assert not marked_processes(mark)


def test_the_simulators_apply_error_is_named_as_the_real_driver_names_it() -> None:
    from simnccl.engine.policy_gate import APPLY_ERROR_TYPE
    from simnccl.real.driver import _qualified
    from simnccl.torch_apply import ApplyError

    assert _qualified(ApplyError("x")) == APPLY_ERROR_TYPE


def test_under_torchrun_a_run_of_several_variants_is_refused(tmp_path: Path) -> None:
    """torchrun mode ran the first variant only and reported PASS (exit 0) for the run."""
    scenario = tmp_path / "two.toml"
    scenario.write_text(_TWO_RANKS + '\n[[variants]]\nname = "a"\n\n[[variants]]\nname = "b"\n')
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [PYTHON, "-m", "simnccl.real", "run", str(scenario)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "under torchrun a launch runs one variant, and this run has 2 (a, b)" in done.stderr
    assert "choose one with --variant NAME" in done.stderr


def test_a_racy_variant_is_not_reported_as_agreeing() -> None:
    """A variant whose verdict depends on a store-key race compares nothing; it said AGREE and ALL AGREE."""
    from simnccl.real.__main__ import _closing_line, _comparison_line
    from simnccl.real.compare import render_comparison_variant

    variant = {
        "name": "v",
        "agree": True,
        "verdict_racy": True,
        "sim_verdict": "hang",
        "real_verdict": "pass",
        "reasons": [],
        "ranks": [],
        "memory": [],
        "sim": {},
        "real": {},
    }
    assert "-> NOT COMPARED (racy)" in render_comparison_variant(variant)
    line = _comparison_line("s", variant)
    assert line.verdict == "not-compared" and line.ok and "nothing compared" in line.figure
    assert _closing_line(True, [variant, {**variant, "verdict_racy": False}]) == (
        "ALL AGREE (1 of 2 variant(s) not compared: racy)"
    )
    assert _closing_line(False, [variant]) == "DISAGREEMENT"


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        ("raise ImportError('libtorch_cuda.so: cannot open shared object file')\n", "libtorch_cuda.so"),
        # Found by a tester: an import that ends the process (as OpenBLAS does under ``ulimit -v``) raised nothing
        # the log names, and the run ended as a bug in simnccl (exit 70) naming a log already removed.
        (
            "import sys\nprint('OpenBLAS error: Memory allocation still failed', file=sys.stderr)\nsys.exit(1)\n",
            "OpenBLAS",
        ),
        ("import sys\nsys.exit(0)\n", "exit code 0"),
    ],
)
def test_a_torch_that_does_not_import_is_a_missing_prerequisite(tmp_path: Path, body: str, shown: str) -> None:
    """A broken torch install stopped the rank zygote and was reported as a bug in simnccl (exit 70)."""
    broken = tmp_path / "site" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(body)
    scenario = tmp_path / "two.toml"
    scenario.write_text(_TWO_RANKS)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{REPO}")
    done = subprocess.run(
        [PYTHON, "-m", "simnccl.real", "run", str(scenario)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs a PyTorch that imports" in done.stderr and shown in done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


_RAISES = _TWO_RANKS.replace('name = "two-ranks"', 'name = "raises"').replace(
    '{ op = "all_reduce", group = "g", size_mib = 1 },',
    '{ op = "all_reduce", group = "g", size_mib = 1 },\n'
    '  { op = "raise", on_ranks = [0], message = "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" },\n'
    '  { op = "raise", on_ranks = [1], error_type = "torch.distributed.DistBackendError", message = "pp: 2 of 3" },\n'
    '  { op = "checkpoint", name = "never" },',
)


def test_a_raise_op_ends_the_real_rank_as_the_simulators_check_with_its_type_and_message(tmp_path: Path) -> None:
    """The real driver reported a ``raise`` op's rank with type ``CheckFailure`` and the message
    ``'<error_type>: <message>'``, where the simulator reports the op's own type and message: the real run, and
    the real side of a comparison, did not say which exception the framework raised. Both sides now say the same,
    and the run ends as the simulator's does (verdict fail, exit 1; compare agrees, exit 0)."""
    scenario = tmp_path / "raises.toml"
    scenario.write_text(_RAISES)
    expected = [
        (0, "check", "AssertionError", "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"),
        (1, "check", "torch.distributed.DistBackendError", "pp: 2 of 3"),
    ]

    def errors(result: dict) -> list[tuple]:
        return [(e["rank"], e["kind"], e["type"], e["message"]) for e in result["errors"]]

    sim = subprocess.run(
        [PYTHON, "-m", "simnccl", "run", str(scenario), "--json", str(tmp_path / "sim.json")],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    (sim_variant,) = json.loads((tmp_path / "sim.json").read_text())["results"][0]["variants"]
    assert (sim_variant["verdict"], errors(sim_variant)) == ("fail", expected)

    real, mark = run_cli("run", str(scenario), "--json", str(tmp_path / "real.json"))
    assert real.returncode == sim.returncode == 1, real.stdout + real.stderr
    (real_variant,) = json.loads((tmp_path / "real.json").read_text())["results"][0]["variants"]
    assert (real_variant["verdict"], real_variant["end_reason"]) == ("fail", "finished")
    assert errors(real_variant) == expected and real_variant["hangs"] == []
    assert "error rank 1 (check): torch.distributed.DistBackendError: pp: 2 of 3" in real.stdout
    assert not marked_processes(mark)

    compared, mark = run_cli("compare", str(scenario), "--json", str(tmp_path / "compare.json"))
    assert compared.returncode == 0 and "ALL AGREE" in compared.stdout, compared.stdout + compared.stderr
    (variant,) = json.loads((tmp_path / "compare.json").read_text())["results"][0]["variants"]
    assert errors(variant["sim"]) == errors(variant["real"]) == expected
    assert not marked_processes(mark)
    for done in (sim, real, compared):
        assert "Traceback" not in done.stdout + done.stderr


_SIZE_MISMATCH = TINY.replace('name = "tiny"', 'name = "size-mismatch"').replace(
    '{ op = "checkpoint", name = "after_init" },',
    '{ op = "all_reduce", size_bytes = 16, on_ranks = [0] },\n'
    '  { op = "all_reduce", size_bytes = 32, on_ranks = [1] },',
)


def test_compare_agrees_rank_by_rank_on_a_gloo_size_mismatch(tmp_path: Path) -> None:
    """Real gloo aborts rank 0 (it receives 32 bytes into 16) and rank 1 fails as peer-lost; the simulator
    aborted both, so compare said DISAGREEMENT (a known gap, exit 1). Now each rank's kind and type agree."""
    scenario = tmp_path / "mismatch.toml"
    scenario.write_text(_SIZE_MISMATCH)
    done, mark = run_cli("compare", str(scenario), "--json", str(tmp_path / "compare.json"))
    assert done.returncode == 0 and "ALL AGREE" in done.stdout, done.stdout + done.stderr
    assert "known gap" not in done.stdout
    (variant,) = json.loads((tmp_path / "compare.json").read_text())["results"][0]["variants"]
    assert (variant["sim_verdict"], variant["real_verdict"], variant["agree"]) == ("error", "error", True)
    assert [row["same_error"] for row in variant["ranks"]] == [True, True]
    assert "Traceback" not in done.stdout + done.stderr
    assert not marked_processes(mark)


def test_a_groups_own_shorter_timeout_wins_over_the_runs_torch_timeout(launcher: Launcher) -> None:
    """The driver passed the run's torch timeout (CPU lane: 90 s) to every group, so a program's own short
    ``new_group(timeout=...)`` never ran on the real side: its rank stalled until the launcher killed it where
    the simulator had it end with gloo's timeout. The op's own timeout now wins where it is shorter."""
    group = NewGroup(ranks=(0, 1), bind="g", timeout_s=1.0)
    programs = [
        Program((InitProcessGroup(backend="gloo"), group, AllReduce(group="g", size_bytes=64))),
        Program((InitProcessGroup(backend="gloo"), group)),
    ]
    settings = RunSettings.for_lane("cpu", stall_s=20.0, timeout_s=40.0)
    assert settings.torch_timeout_s is not None and settings.torch_timeout_s > settings.stall_s
    real = launcher.run_programs(programs, settings, name="own-timeout")
    assert real["verdict"] == "hang" and real["end_reason"] == "finished"
    (hang,) = real["hangs"]
    assert hang["rank"] == 0 and hang["watchdog"].startswith("torch/gloo timeout"), hang


_INIT = '  { op = "init_process_group", backend = "gloo" },\n'
_SPLIT = '  { op = "split_group", split_ranks = [[1, 0]], bind = "s" },\n  { op = "all_reduce", group = "s" },\n'


def _compare_spawn_reinit(
    tmp_path: Path, steps: str, compute_scale: float | None = None, world: int = 2
) -> dict[str, Any]:
    """Real compare of a ``world``-rank gloo scenario under ``launcher = "spawn"`` with these ``steps`` (TOML
    lines)."""
    from simnccl.real.compare import compare_scenario
    from simnccl.scenario import load_scenario

    path = tmp_path / "reinit.toml"
    path.write_text(
        f'[scenario]\nname = "reinit"\n[cluster]\ngpu = "h100-80gb"\nnodes = 1\ngpus_per_node = {world}\n'
        f'[torch]\nrelease = "2.15"\nlauncher = "spawn"\n[workload]\nsteps = [\n{steps}]\n'
    )
    settings = FAST if compute_scale is None else replace(FAST, compute_scale=compute_scale)
    with Launcher() as fresh:
        (compared,) = compare_scenario(load_scenario(path), settings, launcher=fresh)["variants"]
    return compared


def test_a_reinit_under_spawn_is_compared_over_spawns_store(tmp_path: Path) -> None:
    """Under spawn each init_process_group rendezvous over a store rank 0 hosts and its destroy drops; the real
    lane kept one file store for the whole run (torchrun's agent store's lifetime), so a re-init followed by a
    split under spawn hung on the real side where the simulator, modelling spawn, passed: DISAGREE for a correct
    simulation. (Under torchrun the kept store's old keys make it fail, racily: the simulator says so.) Rank 1
    re-inits a second after its destroy: one that came first would reach rank 0's old store before rank 0 dropped
    it, a race of the real processes (measured: 2 runs of 6 with no delay) that the simulated clock does not have.
    """
    late = '  { op = "destroy_process_group" },\n  { op = "compute", seconds = 1.0, on_ranks = [1] },\n'
    compared = _compare_spawn_reinit(tmp_path, _INIT + late + _INIT + _SPLIT, compute_scale=1.0)
    assert compared["agree"], compared["reasons"]
    assert compared["sim"]["verdict"] == compared["real"]["verdict"] == "pass"


def test_a_reinit_under_spawn_at_rank_0s_destroy_is_compared_as_a_race(tmp_path: Path) -> None:
    """With no delay, rank 1 re-initialises as rank 0's destroy drops the store rank 0 hosts: which store it
    reaches is timing (measured: it reached the old one in 3 runs of 14). The simulator passed it, so
    every failing real run was a DISAGREE (CI failed on it once); it now reports the race and compare compares
    nothing that the race decides, whichever way the real processes went."""
    from simnccl.engine.reinit_store import SPAWN_STORE_RACE

    compared = _compare_spawn_reinit(tmp_path, _INIT + '  { op = "destroy_process_group" },\n' + _INIT + _SPLIT)
    assert compared["sim"]["verdict"] == "pass" and SPAWN_STORE_RACE in compared["sim"]["races"][0]
    assert compared["agree"], (compared["reasons"], compared["real"]["verdict"])
    assert compared["verdict_racy"], compared


def test_under_spawn_a_bootstrap_after_rank_0_dropped_the_store_is_compared_as_a_lost_peer(tmp_path: Path) -> None:
    """Rank 0, not a member, destroys the default group at once; ranks 1 and 2 make their group a second later.
    Real gloo: "DistNetworkError: Broken pipe" on both. The simulator passed it (exit 0): DISAGREE."""
    late = (
        '  { op = "compute", seconds = 1.0, on_ranks = [1, 2] },\n'
        '  { op = "new_group", ranks = [1, 2], bind = "g" },\n'
        '  { op = "destroy_process_group", on_ranks = [0] },\n'
        '  { op = "all_reduce", group = "g", on_ranks = [1, 2] },\n'
    )
    compared = _compare_spawn_reinit(tmp_path, _INIT + late, compute_scale=1.0, world=3)
    assert compared["sim"]["verdict"] == compared["real"]["verdict"] == "error"
    assert compared["agree"], compared["reasons"]


def test_a_reinit_under_spawn_with_a_subgroup_kept_is_compared_as_a_stale_key_race(tmp_path: Path) -> None:
    """A subgroup kept across the destroy keeps rank 0's store alive (a prefix store of it; the TCPStore is
    multi-tenant): the re-init reads the destroyed incarnation's keys, as under torchrun. The simulator passed it
    (exit 0) where real gloo failed in 5 runs of 9: every failing run a DISAGREE. It now reports the stale-key
    error, racy, and compare compares nothing the race decides, however the real processes went."""
    from simnccl.engine.reinit_store import STALE_RACE

    kept = (
        '  { op = "new_group", ranks = [0, 1], bind = "a" },\n  { op = "all_reduce", group = "a" },\n'
        '  { op = "destroy_process_group" },\n  { op = "compute", seconds = 0.5, on_ranks = [1] },\n'
    )
    again = '  { op = "new_group", ranks = [0, 1], bind = "b" },\n  { op = "all_reduce", group = "b" },\n'
    compared = _compare_spawn_reinit(tmp_path, _INIT + kept + _INIT + again, compute_scale=1.0)
    assert compared["sim"]["verdict"] == "error"
    assert any(STALE_RACE in e["message"] for e in compared["sim"]["errors"])
    assert compared["agree"] and compared["verdict_racy"], (compared["reasons"], compared["real"]["verdict"])


_ZERO_BYTES = (
    '  { op = "all_gather", size_bytes = 0 },\n  { op = "broadcast", size_bytes = 0, src = 0 },\n'
    '  { op = "reduce_scatter", size_bytes = 0 },\n  { op = "all_to_all", size_bytes = 0 },\n'
    '  { op = "send", peer = 1, size_bytes = 0, on_ranks = [0] },\n'
    '  { op = "recv", peer = 0, size_bytes = 0, on_ranks = [1] },\n'
    '  { op = "all_reduce", call = "reduce", root = 0, size_bytes = 0 },\n'
    '  { op = "all_gather", call = "gather", root = 0, size_bytes = 0 },\n'
)
# One rank's all_reduce of nothing returns at once (gloo sends nothing); its peer's of 64 bytes waits for it.
_ONE_EMPTY = (
    '  { op = "all_reduce", size_bytes = 0, on_ranks = [0] },\n'
    '  { op = "all_reduce", size_bytes = 64, on_ranks = [1] },\n  { op = "barrier" },\n'
)


@pytest.mark.parametrize(("steps", "verdict"), [(_ZERO_BYTES, "pass"), (_ONE_EMPTY, "hang")], ids=["all", "one"])
def test_an_op_of_zero_bytes_is_an_empty_tensor_on_the_real_side(
    tmp_path: Path, launcher: Launcher, steps: str, verdict: str
) -> None:
    """Found by a tester: the driver sent at least one element, so a rank's all_reduce of 0 bytes beside a peer's of
    64 aborted on the real side (a size mismatch) where real torch, given an empty tensor, returns at once and
    leaves the peer waiting, as the simulator has it (measured with an empty tensor directly): DISAGREE."""
    from simnccl.real.compare import compare_scenario
    from simnccl.scenario import load_scenario

    path = tmp_path / "zero.toml"
    path.write_text(
        '[scenario]\nname = "zero"\n[cluster]\ngpu = "h100-80gb"\nnodes = 1\ngpus_per_node = 0\nranks_per_node = 2\n'
        '[torch]\nrelease = "2.15"\n[workload]\nsteps = [\n  { op = "init_process_group", backend = "gloo" },\n'
        f"{steps}]\n"
    )
    # torch's own timeout as the command has it: FAST's 3 s timed the waiting peer out, and gloo's timeout closes
    # its pairs (the other rank then fails as peer-lost), which is not what this compares
    settings = RunSettings.for_lane("cpu", stall_s=5.0, timeout_s=40.0)
    (compared,) = compare_scenario(load_scenario(path), settings, launcher=launcher)["variants"]
    assert compared["sim"]["verdict"] == compared["real"]["verdict"] == verdict, compared["reasons"]
    assert compared["agree"], compared["reasons"]


# ---------------------------------------------------------------------------------------------- the run's store

GLOO = InitProcessGroup(backend="gloo")


@pytest.mark.parametrize(
    ("late_s", "op", "verdict"),
    [
        (1.6, SplitGroup(split_ranks=((0, 1),), bind="s", timeout_s=1.0), "hang"),
        (0.8, NewGroup(ranks=(0, 1), bind="s", timeout_s=0.3), "hang"),
        (0.0, NewGroup(ranks=(0, 1), bind="s", timeout_s=1.0), "pass"),
    ],
)
def test_the_local_launcher_s_store_times_out_as_torchrun_s_agent_store_does(
    launcher: Launcher, late_s: float, op: NewGroup | SplitGroup, verdict: str
) -> None:
    """The ranks rendezvous over a TCPStore a store host holds, as torchrun's workers over their agent's. They used
    a FileStore, whose waits ran late: a peer 1.6 s late under a 1 s split_group timeout got through, and a 0.3 s
    timeout became ~1 s, so ``real compare`` disagreed with the simulator (which models torchrun's TCPStore) where
    both were right. Rank 0 now times out in the op, as the simulator has it (the verdicts tell the stores apart:
    the FileStore passed both late peers)."""
    programs = [
        Program((GLOO, op, AllReduce(group="s", size_bytes=64))),
        Program((GLOO, Compute(seconds=late_s), op, AllReduce(group="s", size_bytes=64))),
    ]
    settings = RunSettings.for_lane("cpu", compute_scale=1.0, timeout_s=40.0, stall_s=5.0)
    result = launcher.run_programs(programs, settings)
    assert result["verdict"] == verdict, json.dumps(result)[:2000]
    if verdict == "hang":
        hang = next(h for h in result["hangs"] if h["rank"] == 0)
        assert hang["watchdog"] == "torch/gloo timeout raised in the op", hang
