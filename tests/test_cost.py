"""``simnccl cost``: per-rank startup cost tables for each framework, computed by simulation; bad input exits 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import at_a_terminal, communicate_or_kill

from simnccl import cost
from simnccl.cli import EXIT_BAD_INPUT, main
from simnccl.comm_memory import one_node_mib
from simnccl.engine import Engine
from simnccl.profiles import find_profile
from simnccl.workloads import GENERATORS


def cost_json(capsys, *argv: str) -> dict:
    assert main(["cost", *argv, "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]  # the document every command writes
    return result


def column(payload: dict, name: str) -> dict:
    (found,) = [c for c in payload["columns"] if c["column"] == name]
    return found


def typical(col: dict, row: str) -> float:
    return col["summary"][row]["typical"]


def test_megatron_table_side_by_side(capsys) -> None:
    assert (
        main(
            [
                "cost",
                "--workload",
                "megatron",
                "--tp",
                "8",
                "--pp",
                "2",
                "--dp",
                "2",
                "--gpu",
                "h100-80gb",
                "--release",
                "2.15",
                "--policy",
                "dedupe",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("simnccl cost: Megatron-Core (dp=2 pp=2 tp=8) on 32 x h100-80gb (4 nodes x 8)")
    header = lines[1].split()
    assert header[-3:] == ["torch-default", "legacy", "dedupe"]
    rows = {line[:21].strip(): line[21:].split() for line in lines[3:12]}
    assert rows["new_group calls"] == ["299", "299", "299"]
    # 19 NCCL groups (the EGTP family included) + the default group; first-stage ranks add the position-embedding
    # singleton. initialize_megatron's barrier uses the default group (legacy: creates it)
    assert rows["NCCL comms at startup"] == ["20", "[20-21]", "1", "8"]
    assert rows["used MiB / device"] == [
        "7,551.6",
        "[7,551.6-8,020.1]",
        "2,709",
        "[2,709-2,789]",
        "4,412.9",
        "[4,412.9-4,492.9]",
    ]
    assert rows["verdict"] == ["pass", "pass", "pass"]
    assert "MiB at checkpoint 'startup'" in out


def test_megatron_json_rows_from_the_simulation(capsys) -> None:
    # initialize_model_parallel alone (--training false: no initialize_megatron barrier), whose groups this prices
    argv = [
        "--workload",
        "megatron",
        "--tp",
        "4",
        "--training",
        "false",
        "--policy",
        "skip-single-rank",
        "--world",
        "8",
    ]
    payload = cost_json(capsys, *argv)
    assert payload["world"] == 8 and payload["knobs"]["tp"] == 4
    default, legacy, skip = payload["columns"]
    assert [default["column"], legacy["column"], skip["column"]] == ["torch-default", "legacy", "skip-single-rank"]
    assert legacy["env"] == {"TORCH_DIST_USE_NCCL2": "0"}
    assert typical(default, "calls") == 97
    assert typical(default, "groups") == 23 and typical(default, "singletons") == 7
    assert typical(default, "duplicates") == 19
    assert typical(default, "comms") == 21 and typical(legacy, "comms") == 0
    assert typical(skip, "comms") == 14  # the 7 singletons are fake
    # context + NCCL's per-process cost + 14 multi-rank communicators + the 7 one-rank ones, as NCCL's mechanics
    # price them (a one-rank communicator gets 32 channels: 388 MiB)
    profile = find_profile("h100-80gb", "2.15")
    multi, single = one_node_mib(profile, 8), one_node_mib(profile, 1)
    assert typical(default, "used_mib") == pytest.approx(
        392 + profile.comm.process_mib + 14 * multi + 7 * single, abs=0.1
    )


def test_every_framework_has_a_cost_table(capsys) -> None:
    cases = {
        "vllm": (["--tp", "8"], 7, "before_memory_check"),
        "sglang": (["--tp", "8"], 8, "startup"),
        "megatron": (["--tp", "8", "--dp", "1"], 21, "startup"),
        "torchtitan": (["--tp", "2", "--world", "8"], 8, "startup"),
        "deepspeed": (["--world", "8"], 2, "startup"),
    }
    assert sorted(cases) == sorted(GENERATORS)
    for name, (knobs, comms, checkpoint) in cases.items():
        payload = cost_json(capsys, "--workload", name, *knobs, "--policy", "dedupe")
        default = column(payload, "torch-default")
        assert default["verdict"] == "pass", name
        assert default["checkpoint"] == checkpoint, name
        assert typical(default, "comms") == comms, name
        assert column(payload, "dedupe")["summary"]["comms"]["max"] <= comms, name


@pytest.mark.parametrize(
    "knobs", [["--tp", "2", "--tp", "4"], ["--tp=2", "--tp", "4"], ["--gloo", "--no-gloo"], ["--no-gloo", "--no-gloo"]]
)
def test_a_framework_knob_given_twice_is_bad_input(capsys, knobs: list[str]) -> None:
    assert main(["cost", "--workload", "megatron", *knobs]) == EXIT_BAD_INPUT
    name = "--tp" if "2" in "".join(knobs) else "--gloo"
    assert f"{name} is given twice; give each framework knob once" in capsys.readouterr().err


def test_boolean_knobs_and_lists(capsys) -> None:
    base = cost_json(
        capsys, "--workload", "vllm", "--dp", "8", "--tp", "1", "--moe", "--enable-eplb", "--policy", "torch-default"
    )
    assert [c["column"] for c in base["columns"]] == ["torch-default", "legacy"]
    assert typical(column(base, "torch-default"), "comms") == 9  # default + world, tp, dcp, pcp, pp, dp, ep, eplb
    no_gloo = cost_json(
        capsys,
        "--workload",
        "megatron",
        "--tp",
        "2",
        "--cp",
        "4",
        "--hierarchical-cp",
        "2,2",
        "--no-gloo",
        "--world",
        "8",
        "--policy",
        "torch-default",
    )
    assert no_gloo["knobs"]["gloo"] is False and no_gloo["knobs"]["hierarchical_cp"] == [2, 2]
    # 22 groups, no gloo twins: GTP, DP-CP, DP, CP, HCP L0, HCP L1, MP, TP, PP, EMB, POS, TP-DP-CP, TP-DP, TP-CP,
    # expert GTP, EP, ETP, TP-EP, TP-EP-PP, TP-EP-PP with EGTP, expert DP, INTRA
    assert typical(column(no_gloo, "torch-default"), "groups") == 22
    assert typical(column(no_gloo, "torch-default"), "comms") == 23


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--workload", "megatron", "--tp", "8", "--frobnicate", "3"], "unknown option --frobnicate"),
        (["--workload", "megatron", "--tp", "8"], "add --world"),
        (["--workload", "megatron", "--tp", "eight", "--dp", "1"], "--tp: expected an integer"),
        (["--workload", "megatron", "--tp", "8", "--dp", "2", "--pp", "3", "--world", "16"], "does not match"),
        (["--workload", "megatron", "--tp", "3", "--world", "8"], "--tp: world_size (8) is not divisible"),
        (["--workload", "vllm", "--tp", "8", "--policy", "fastest"], "--policy: unknown policy 'fastest'"),
        (["--workload", "vllm", "--tp", "8", "--release", "3.0"], "unknown torch release '3.0'"),
        (["--workload", "vllm", "--tp", "8", "--gpu", "tpu"], "--gpu"),
        (["--workload", "vllm", "--tp", "12"], "not whole nodes of 8"),
        (["--workload", "vllm", "--tp"], "needs a value"),
        (["--workload", "vllm", "stray"], "unexpected argument 'stray'"),
        (  # a size past max_alloc_mib, as a scenario's alloc is refused (it simulated an OOM, exit 0)
            ["--workload", "vllm", "--tp", "2", "--pynccl-mib", "1e30"],
            "error: --pynccl-mib: 1e+30 MiB exceeds the limit max_alloc_mib = 1048576",
        ),
        (  # the knobs that imply the world together are named (the message named none)
            ["--workload", "megatron", "--tp", "8", "--pp", "4", "--dp", "4096"],
            "error: --tp 8 --pp 4 --dp 4096: a world of 131072 ranks exceeds the limit max_world_size = 65536",
        ),
        (  # no upper bound: a node of 10**20 GPUs went on to be simulated (exit 0)
            ["--workload", "vllm", "--tp", "2", "--gpus-per-node", "100000000000000000000"],
            "error: --gpus-per-node: expected an integer in [1, 65536] (max_world_size), got 100000000000000000000",
        ),
        (  # a world given outright is named so (the message said "arguments")
            ["--workload", "deepspeed", "--world", "1000000000"],
            "error: --world: a world of 1000000000 ranks exceeds the limit max_world_size = 65536",
        ),
    ],
)
def test_bad_input_exits_2_with_a_message(capsys, argv: list[str], text: str) -> None:
    assert main(["cost", *argv]) == cost.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert text in err, err


def test_unknown_workload_and_other_commands_keep_argparse_errors(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["cost", "--workload", "jax"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["run", "--tp", "8"])
    assert info.value.code == 2
    assert "unrecognized arguments: --tp" in capsys.readouterr().err


def test_parallel_columns_match_serial(capsys) -> None:
    argv = ["--workload", "sglang", "--tp", "8", "--policy", "dedupe", "--policy", "lazy-init"]
    serial = cost_json(capsys, *argv)
    parallel = cost_json(capsys, *argv, "--jobs", "2")
    strip = [{k: v for k, v in c.items() if k != "wall_s"} for c in serial["columns"]]
    assert strip == [{k: v for k, v in c.items() if k != "wall_s"} for c in parallel["columns"]]


def test_summarise_is_typical_min_max() -> None:
    assert cost.summarise([21, 21, 22, 20, 21]) == (21, 20, 22)
    assert cost.summarise([1, 2]) == (1, 1, 2)  # a tie takes the smaller value


# ---------------------------------------------------------------------------------------------- progress, Ctrl-C


SMALL = ["cost", "--workload", "vllm", "--tp", "2", "--policy", "lazy-init"]
SMALL_COLUMNS = ("torch-default", "legacy", "lazy-init")


def test_a_bar_per_column_at_a_terminal_only(capsys, monkeypatch) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    assert main(SMALL) == 0
    assert capsys.readouterr().err == ""  # stderr is not a terminal here: no bar
    at_a_terminal(monkeypatch)
    assert main(SMALL) == 0
    out, err = capsys.readouterr()
    assert all(name in err for name in SMALL_COLUMNS) and "100%" in err  # one bar per column, on stderr
    assert "100%" not in out
    for quiet_or_json in ("--quiet", "--json"):
        assert main([*SMALL, quiet_or_json]) == 0
        out, err = capsys.readouterr()
        assert err == "", quiet_or_json  # scripts read stdout: nothing drawn anywhere
    json.loads(out)  # the document alone


def test_ctrl_c_leaves_the_columns_that_finished(capsys, monkeypatch, tmp_path) -> None:
    """The table and the --json document of what finished; the document is not ok and names what did not
    finish (it said ``"ok": true`` with no columns and no interrupted marker)."""
    real = cost.run_column

    def legacy_is_interrupted(programs, cluster, release, column, seed):
        if column.name == "legacy":
            raise KeyboardInterrupt
        return real(programs, cluster, release, column, seed)

    monkeypatch.setattr(cost, "run_column", legacy_is_interrupted)
    target = tmp_path / "cost.json"
    assert main([*SMALL, "--jobs", "1", "--json", str(target)]) == 130
    out, err = capsys.readouterr()
    header = next(line for line in out.splitlines() if line.startswith("per rank"))
    assert header.split()[2:] == ["torch-default"]  # the partial table: the column that finished
    assert "interrupted (Ctrl-C): not finished: legacy, lazy-init" in out
    assert "finished  cost  torch-default: pass" in err and "stopped   cost  legacy: not finished" in err
    assert "Traceback" not in err
    doc = json.loads(target.read_text())
    (result,) = doc["results"]
    assert doc["ok"] is False and result["interrupted"] is True
    assert result["not_finished"] == ["legacy", "lazy-init"]
    assert [c["column"] for c in result["columns"]] == ["torch-default"]
    assert [(line["variant"], line["ok"]) for line in doc["summary"]] == [
        ("torch-default", True),
        ("legacy", False),
        ("lazy-init", False),
    ]


def test_ctrl_c_stops_parallel_columns_and_their_workers() -> None:
    """A real SIGINT while worker processes simulate: exit 130, what finished is kept, no traceback."""
    argv = [sys.executable, "-m", "simnccl", "cost", "--workload", "megatron", "--tp", "8", "--pp", "4", "--dp", "4"]
    proc = subprocess.Popen(
        [*argv, "--jobs", "2", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # --quiet streams a column's line as it finishes
    workers = _worker_children(proc.pid)
    proc.send_signal(signal.SIGINT)
    rest, err = communicate_or_kill(proc, 120)
    assert "torch-default" in first
    assert proc.returncode == 130, err
    assert "finished  cost  torch-default" in err and "Traceback" not in err
    assert "not finished" in err
    lines = (first + rest).splitlines()  # --quiet: a line per column, those not finished FAIL
    assert any("  interrupted  FAIL  not finished (Ctrl-C)" in line for line in lines), lines
    # a line per column, once each (a Ctrl-C mid-print once repeated one), and one that finished is never
    # missing from stdout (a Ctrl-C while it was reported once left it out of both kinds of line)
    named = [line.split("  ")[1] for line in lines]
    assert sorted(named) == sorted(column.name for column in cost.columns_for(None)), lines
    # every column is accounted for: finished, stopped (it was running, or sent to a worker), or not started
    kinds = (["finished", "cost"], ["stopped", "cost"], ["skipped", "cost"])
    accounted = [line.split()[2].rstrip(":") for line in err.splitlines() if line.split()[:2] in kinds]
    assert sorted(accounted) == sorted(column.name for column in cost.columns_for(None)), err
    journal_finished = [line.split()[2].rstrip(":") for line in err.splitlines() if line.split()[:2] == kinds[0]]
    printed_finished = [line.split("  ")[1] for line in lines if "  interrupted  FAIL  " not in line]
    assert sorted(journal_finished) == sorted(printed_finished), (lines, err)
    assert len(workers) == 2 and not [pid for pid in workers if _alive(pid)]  # stopped, none left behind


def _worker_children(parent: int) -> list[int]:
    """The worker processes whose parent is ``parent`` (Linux /proc): its children, forked or spawned (a
    spawned worker's command line names ``spawn_main``, a forked one's is the parent's), multiprocessing's
    resource tracker aside."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat, open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
                command = cmdline.read()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == parent and b"resource_tracker" not in command:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_column_stopped_at_a_limit_is_exit_2_naming_it(capsys, monkeypatch, tmp_path) -> None:
    """A column the engine's guard stopped has no figures: the table says so, the exit status is 2 (too large an
    input for a limit, as for run), and the message names the limit to raise."""
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_SIM_TIME_S", "0.001")
    target = tmp_path / "cost.json"
    assert main([*SMALL, "--variant", "legacy", "--json", str(target)]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(target.read_text())  # the document agrees with the exit code: the column is not ok
    assert doc["ok"] is False and [line["ok"] for line in doc["summary"]] == [False]
    assert "legacy  error  FAIL" in out
    assert "verdict" in out and "legacy: simulation stopped: simulated time would pass" in " ".join(out.split())
    flat = " ".join(err.split())
    assert "column legacy: simulation stopped" in flat and "set SIMNCCL_LIMIT_MAX_SIM_TIME_S" in flat


# ---------------------------------------------------------------------------------------------- the same figures


def test_columns_equal_the_ordinary_engine_path() -> None:
    """The command's figures (its fast paths, its column runner) equal a run of every rank through every call."""
    programs = tuple(GENERATORS["megatron"]({"tp": 4, "pp": 2, "dp": 2}, 16))
    cluster = cost.build_cluster("h100-80gb", 16, 8)
    for column in cost.columns_for(None):
        fast = cost.run_column(programs, cluster, "2.15", column)
        slow = Engine(cost.column_config(programs, cluster, "2.15", column), fast_path=False).run()
        per_rank, checkpoint = cost.measure(slow, programs)
        assert (fast.verdict, fast.per_rank, fast.checkpoint) == (slow.verdict, per_rank, checkpoint), column.name


@pytest.mark.parametrize("source", [["--workload", "megatron", "--tp", "2", "--dp", "1"], ["--scenario", "x.toml"]])
def test_jobs_below_one_is_bad_input_for_a_workload_and_a_scenario(capsys, source) -> None:
    """One check of --jobs, before either source is read (the scenario file need not exist)."""
    assert main(["cost", *source, "--jobs", "0"]) == 2
    assert "--jobs: expected a positive integer, got 0" in capsys.readouterr().err


def test_a_recovery_scenario_is_refused_not_priced_as_its_bare_steps(capsys) -> None:
    """A [recovery] scenario's groups come from simnccl.recovery, which cost does not run: pricing its bare
    steps met groups never created and printed 0 MiB per device with exit 0, a startup cost of nothing."""
    from conftest import SCENARIOS_DIR

    assert main(["cost", "--scenario", str(SCENARIOS_DIR / "crash-replaced.toml")]) == 2
    err = capsys.readouterr().err
    assert "crash-replaced.toml: recovery: a [recovery] scenario's groups are re-formed by simnccl.recovery" in err


def test_a_policy_whose_members_disagree_fails_cost(capsys, monkeypatch) -> None:
    """``cost`` checks nothing of torch's, but a PolicyInconsistency is a defect of the policy (real torch hangs):
    its line said ``error  ok`` and the command exited 0, so a CI step running ``cost --policy mine`` passed it."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    argv = ["cost", "--workload", "vllm", "--tp", "4", "--gpu", "h100-80gb", "--jobs", "1", "-q"]
    assert main([*argv, "--policy", "user_policies:LastMemberLazy"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[4:6] for line in lines] == [["pass", "ok"], ["pass", "ok"], ["error", "FAIL"]], lines
    assert main([*argv, "--policy", "user_policies:LazyAbove"]) == 0


REINIT = ["cost", "--workload", "megatron", "--tp", "2", "--dp", "2", "--reinit-cycles", "2", "--jobs", "1"]


BROKEN = "user_policies:ReusesDestroyed"


@pytest.mark.parametrize("only", [[], ["--variant", BROKEN]], ids=["all-columns", "policy-column-only"])
def test_a_policy_that_breaks_a_startup_torch_passes_fails_cost(capsys, monkeypatch, only) -> None:
    """A policy column that dies where torch's default on the same startup passes is a defect of the policy:
    it read ``error  ok`` with smaller MiB than torch's default (it died before allocating the rest), exit 0.
    Now FAIL, exit 1, its figures marked as the moment it died; judged against torch's default also when
    ``--variant`` leaves that column out (run, not shown). (The built-in dedupe broke this startup until it
    recorded destroys; a team's policy that reuses a destroyed group still does.)"""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    assert main([*REINIT, "--policy", BROKEN, *only, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    by_name = {line["variant"]: line for line in doc["summary"]}
    assert doc["ok"] is False and by_name[BROKEN]["ok"] is False and by_name[BROKEN]["verdict"] == "error"
    assert "(died) MiB/device" in by_name[BROKEN]["figure"]
    (broken,) = [c for c in doc["results"][0]["columns"] if c["column"] == BROKEN]
    assert broken["policy_defect"] and broken["partial"]
    shown = [c["column"] for c in doc["results"][0]["columns"]]
    assert shown == ([BROKEN] if only else ["torch-default", "legacy", BROKEN])
    if not only:  # torch's own columns pass: not judged
        assert by_name["torch-default"]["ok"] and by_name["legacy"]["ok"]


def test_a_policy_that_makes_a_communicating_group_fake_fails_cost_even_where_torch_s_default_fails(
    capsys, monkeypatch
) -> None:
    """A PolicyFakeBackend is a defect of the policy (production goes on without communicating) as a
    PolicyInconsistency is; it was judged only against torch's default, so on a startup the default fails itself
    (DeepSpeed ZeRO-2 with pipeline parallelism) its line read ``error  ok``, exit 0."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    argv = ["cost", "--workload", "deepspeed", "--pp", "2", "--dp", "2", "--zero-stage", "2", "--gpu", "h100-80gb"]
    assert main([*argv, "--jobs", "1", "--policy", "user_policies:EverythingFake", "-q"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[2:4] for line in lines] == [["fail", "ok"], ["fail", "ok"], ["error", "FAIL"]], lines
    assert "PolicyFakeBackend" in lines[2]


def test_torch_hanging_or_dying_under_its_defaults_is_a_finding_not_a_failure(capsys) -> None:
    """The same rule does not judge torch: where torch's default itself dies, a policy column dying too is no
    defect of the policy (exit 0), only its figures are marked."""
    argv = ["cost", "--scenario", str(Path(__file__).resolve().parents[1] / "scenarios" / "lazy-first-step-oom.toml")]
    assert main([*argv, "--variant", "legacy", "-q"]) == 0
    line = capsys.readouterr().out
    assert "legacy  fail  ok" in line and "(died) MiB/device" in line


_STEPS = """[scenario]
name = "{name}"
[cluster]
gpu = "h100-80gb"
nodes = 1
gpus_per_node = 4
[torch]
release = "2.15"
[workload]
steps = [
  {{ op = "set_device" }},
  {{ op = "init_process_group", backend = "nccl" }},
{steps}
]
[[variants]]
name = "default"
"""
LATE = """  { op = "checkpoint", name = "startup" },
  { op = "new_group", ranks = [0, 1, 2, 3], bind = "w{i}", repeat = 6 },
  { op = "checkpoint", name = "after" },"""
DESTROY = """  { op = "new_group", ranks = [0, 1], bind = "a" },
  { op = "new_group", ranks = [2, 3], bind = "a" },
  { op = "new_group", ranks = [0, 1, 2, 3], bind = "w{i}", repeat = 6 },
  { op = "all_reduce", group = "a", size_mib = 8 },
  { op = "checkpoint", name = "after_groups" },
  { op = "destroy_process_group" },"""


def _one_column(capsys, tmp_path, name: str, steps: str) -> dict:
    path = tmp_path / f"{name}.toml"
    path.write_text(_STEPS.format(name=name, steps=steps))
    (col,) = cost_json(capsys, "--scenario", str(path))["columns"]
    return {key: row["typical"] for key, row in col["summary"].items()} | {"read_at": col["read_at"]}


def test_every_row_is_read_at_one_moment_and_the_peak_is_shown(capsys, tmp_path) -> None:
    """The rows were read at different moments: used MiB at the checkpoint, NCCL MiB and comms at the end of
    the run (groups made after the checkpoint read 1,695.9 NCCL MiB beside 704.6 used), and with no checkpoint
    everything was the end of the run's current use, below the run's peak without a word (groups destroyed at
    the end: 1,726.4 MiB and 0 comms for a run that peaked at 3,634.9). Now one moment per column, named, and
    the run's peak beside it (what ``simnccl run`` reports)."""
    late = _one_column(capsys, tmp_path, "late-groups", LATE)
    assert late["read_at"] == "checkpoint startup"
    assert (late["comms"], late["nccl_mib"], late["used_mib"], late["peak_mib"]) == (1, 312.6, 704.6, 2087.9)
    destroy = _one_column(capsys, tmp_path, "destroy-at-end", DESTROY)
    assert destroy["read_at"] == "end of run"
    assert (destroy["used_mib"], destroy["peak_mib"]) == (1726.4, 3634.9)


def test_the_peak_row_holds_a_communicator_made_after_the_checkpoint(capsys) -> None:
    """vLLM's V2 model runner makes a communicator after the startup checkpoint: the table said 2,561.9 used MiB
    for a run whose peak (``simnccl run``) is 2,792.4."""
    argv = ["--workload", "vllm", "--tp", "2", "--pp", "2", "--v2-model-runner", "--variant", "torch-default"]
    (col,) = cost_json(capsys, *argv)["columns"]
    assert (typical(col, "used_mib"), typical(col, "peak_mib")) == (2561.9, 2792.4)
    assert col["read_at"] == "checkpoint before_memory_check"


def test_a_rank_that_never_set_a_device_is_measured_on_cuda_0() -> None:
    """``cost`` and a sweep's ``--max-used-mib`` read each rank's device only where it called set_device: a gloo
    or legacy startup that never did read 0 MiB per device, and a 1,000 MiB cap passed 60 GB."""
    from simnccl.cost import measure
    from simnccl.ops import Alloc, InitProcessGroup
    from simnccl.testing import simulate

    out = simulate([InitProcessGroup(backend="gloo"), Alloc(mib=3000)], gpus_per_node=2)
    per_rank, _ = measure(out, [rt.program for rt in out.ranks])
    assert min(per_rank["used_mib"]) >= 6000.0  # both ranks' 3,000 MiB went to cuda:0, CUDA's current device


def test_a_policy_column_of_a_scenario_says_whose_settings_it_runs_on(capsys) -> None:
    """A ``--policy`` column runs on the first variant's settings: for a file whose first variant is its legacy
    workaround the policy was priced on legacy, and nothing in the text said so."""
    scenario = str(Path(__file__).resolve().parent.parent / "scenarios" / "lazy-first-step-oom.toml")
    main(["cost", "--scenario", scenario, "--policy", "dedupe", "--variant", "legacy", "--variant", "dedupe"])
    title = capsys.readouterr().out.splitlines()[0]
    said = "--policy columns run on the settings of variant 'legacy' (TORCH_DIST_USE_NCCL2=0, torch 2.15)"
    assert title.endswith(said), title
