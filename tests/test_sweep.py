"""simnccl sweep: the same results in this process, a process pool, a loopback Dask cluster (a real scheduler and
workers started here) and a LocalCluster; resume; the CSV and JSON files; bad input; cells that crash or run
past their limit. And property campaigns on several pytest-xdist gateways with the program count summed."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from simnccl.cli import main
from simnccl.sweep import cell as cell_module
from simnccl.sweep import command, executors
from simnccl.sweep import matrix as matrix_module
from simnccl.sweep.deadline import CellTimeout, call_with_deadline
from simnccl.sweep.store import CSV_FIELDS, FIELDS, SCHEMA_VERSION, read_csv, read_json, result_of
from simnccl.testing.replay import plugin_registered

pytest_plugins = ["pytester"] if plugin_registered() else ["simnccl.testing.plugin", "pytester"]

REPO = Path(__file__).resolve().parent.parent
DASK = (sys.executable, "-m")  # `dask scheduler` / `dask worker`, from this interpreter
SCHEDULER_FLAGS = ("--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0")
WORKER_FLAGS = ("--nworkers", "2", "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1", "--memory-limit", "0")
WORKLOADS = ("megatron tp=2 pp=2 dp=2", "vllm tp=4", "torchtitan dp_shard=2 tp=4")
POLICIES = ("torch-default", "legacy", "dedupe", "lazy-single-rank")
RELEASES = ("2.14", "2.15")
MATRIX_3x4x2 = [
    *(a for w in WORKLOADS for a in ("--workload", w)),
    *(a for p in POLICIES for a in ("--policy", p)),
    *(a for r in RELEASES for a in ("--release", r)),
]
# A team's policies that go wrong: one raises (a bug: the cell crashes), one never returns (the cell's limit).
BAD_POLICIES = textwrap.dedent(
    """\
    import time
    from dataclasses import dataclass

    from simnccl.policy import BasePolicy


    @dataclass(frozen=True)
    class Raises(BasePolicy):
        name: str = "raises"

        def on_group(self, request, decision):
            raise RuntimeError("policy bug")


    @dataclass(frozen=True)
    class Spins(BasePolicy):
        name: str = "spins"

        def on_group(self, request, decision):
            while True:  # never returns; sleeps so that its cell's limit does not take a core from the suite
                time.sleep(0.01)
    """
)


def sweep(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["sweep", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def results(path: Path) -> dict[str, dict[str, object]]:
    _, _, rows = read_json(path)
    return {row["cell_id"]: result_of(row) for row in rows}


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("team")
    (folder / "team_policies.py").write_text(BAD_POLICIES, encoding="utf-8")
    return folder


def _wait_for(path: Path, processes: list[subprocess.Popen[bytes]], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            raise RuntimeError(f"the Dask scheduler did not start ({path} missing)")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def dask_scheduler(tmp_path_factory: pytest.TempPathFactory, policy_dir: Path) -> Iterator[str]:
    """A real Dask scheduler and two worker processes on loopback (``dask scheduler`` / ``dask worker``), their
    working folder the team's policies; yields the scheduler's tcp:// address."""
    pytest.importorskip("distributed")
    folder = tmp_path_factory.mktemp("dask")
    info = folder / "scheduler.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",  # as README 'Sweeps' advises
    }
    scheduler = subprocess.Popen(
        [*DASK, "distributed.cli.dask_scheduler", *SCHEDULER_FLAGS, "--scheduler-file", str(info)],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    processes = [scheduler]
    try:
        _wait_for(info, processes, 60)
        address = json.loads(info.read_text())["address"]
        worker = subprocess.Popen(
            [*DASK, "distributed.cli.dask_worker", address, *WORKER_FLAGS],
            cwd=policy_dir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        processes.append(worker)
        yield address
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in reversed(processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


# ---------------------------------------------------------------------------------------------- same results


def test_3x4x2_matrix_gives_the_same_results_here_in_a_pool_and_on_dask(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, dask_scheduler: str
) -> None:
    runs = {
        "local": ["--jobs", "1"],
        "pool": ["--jobs", "2"],
        "dask": ["--scheduler", dask_scheduler],
        "dask-local": ["--dask-local", "2"],
    }
    found = {}
    for name, where in runs.items():
        out = tmp_path / f"{name}.json"
        code, _, err = sweep(capsys, *MATRIX_3x4x2, *where, "--json", str(out))
        assert code == 0, err
        assert "24 cells (0 done, 24 to run)" in err
        found[name] = results(out)
        _, _, rows = read_json(out)
        workers = {row["worker"].rsplit(":", 1)[1] for row in rows}
        assert (workers == {str(os.getpid())}) == (name == "local")  # elsewhere: other processes ran the cells
    assert len(found["local"]) == 24
    assert {r["status"] for r in found["local"].values()} == {"ok"}
    for name in ("pool", "dask", "dask-local"):
        assert found[name] == found["local"], name
    # The axes change the simulation: 2.15 allocates every group at startup where 2.14 (lazy by default) creates
    # only the default group, at initialize_megatron's barrier.
    comms = {(r["workload"], r["policy"], r["release"]): r["comms"] for r in found["local"].values()}
    assert comms[("megatron dp=2 pp=2 tp=2", "torch-default", "2.15")] > 1
    assert comms[("megatron dp=2 pp=2 tp=2", "torch-default", "2.14")] == 1


def test_a_crash_and_a_runaway_cell_are_their_rows_on_dask_too(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    policy_dir: Path,
    dask_scheduler: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(policy_dir)  # policy import specs find modules in the current folder, as python -m does
    policies = ["--policy", "torch-default", "--policy", "team_policies:Raises", "--policy", "team_policies:Spins"]
    common = ["--workload", "megatron tp=2 pp=2 dp=2", *policies, "--cell-timeout", "5"]
    statuses = {}
    for name, where in {"local": ["--jobs", "1"], "dask": ["--scheduler", dask_scheduler]}.items():
        code, out, _ = sweep(capsys, *common, *where, "--json", str(tmp_path / f"{name}.json"))
        assert code == command.EXIT_BAD_INPUT  # the only crash is the user's policy raising: their input
        _, _, rows = read_json(tmp_path / f"{name}.json")
        statuses[name] = [(r["policy"], r["status"]) for r in rows]
        crashed = rows[1]
        raised = "UserPolicyError: policy 'raises': on_group raised RuntimeError: policy bug"
        assert crashed["check"].startswith(raised) and "team_policies.py" in crashed["error"], crashed["check"]
        assert "within the cell's wall-clock limit of 5 s" in rows[2]["check"]
        assert f"#1 crash: {raised}" in out
    assert (
        statuses["local"]
        == statuses["dask"]
        == [
            ("torch-default", "ok"),
            ("team_policies:Raises", "crash"),
            ("team_policies:Spins", "stopped"),
        ]
    )


def test_a_cell_past_its_wall_clock_limit_fails_the_sweep_with_exit_1(
    capsys: pytest.CaptureFixture[str], policy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(policy_dir)
    argv = ["--workload", "vllm tp=2", "--policy", "team_policies:Spins", "--policy", "dedupe", "--cell-timeout", "5"]
    code, out, _ = sweep(capsys, *argv, "--jobs", "2")
    assert code == command.EXIT_CHECK_FAILED
    assert "#0 stopped: no result within the cell's wall-clock limit of 5 s" in out
    assert "#1" not in out.split("\n\n")[1]  # the other cell is ok: no note


def test_a_cell_is_held_to_the_simulated_time_limit_the_user_set(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run`` stops a run that passes ``SIMNCCL_LIMIT_MAX_SIM_TIME_S`` (exit 2, checked nothing); a sweep kept the
    engine's default of 30 days and called the same hanging cell ok, its hang detected at 615 s."""
    from importlib.resources import files

    scenario = str(files("simnccl") / "scenarios" / "hang-missing-rank.toml")
    argv = ["--scenario", scenario, "--variant", "nccl2-default", "--accept-verdict", "hang"]
    code, _, _ = sweep(capsys, *argv)
    assert code == 0  # within the default limit, the hang it accepts
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_SIM_TIME_S", "100")
    code, out, _ = sweep(capsys, *argv)
    assert code == command.EXIT_CHECK_FAILED
    assert "simulated time would pass Limits.max_sim_time_s = 100 s" in out


def test_the_deadline_gives_up_on_a_call_blocked_in_c_soon_after_its_limit() -> None:
    """A policy's ``time.sleep(100)`` takes no exception until it returns: the call is abandoned (reported as
    stopped) a second after its limit; with ``--cell-timeout 3`` such a cell took 13 s."""
    start = time.monotonic()
    with pytest.raises(CellTimeout):
        call_with_deadline(lambda: time.sleep(60), 0.2)
    assert time.monotonic() - start < 5  # 10.2 s before; the sleep itself would be 60 s


def test_the_deadline_interrupts_a_loop_in_a_worker_thread_and_passes_results_through() -> None:
    """Dask runs cells in threads, where no signal arrives: the limit must hold there."""
    seen: dict[str, object] = {}

    def spin() -> None:
        while True:
            pass

    def in_thread() -> None:
        try:
            call_with_deadline(spin, 0.2)
        except CellTimeout as err:
            seen["timeout"] = str(err)
        seen["value"] = call_with_deadline(lambda: 42, 5)
        try:
            call_with_deadline(lambda: 1 / 0, 5)
        except ZeroDivisionError:
            seen["raised"] = True

    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join(30)
    assert seen == {"timeout": "still running after 0.2 s", "value": 42, "raised": True}


def test_a_failed_check_exits_1_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workload", "vllm tp=4", "--policy", "torch-default", "--policy", "legacy", "--max-used-mib", "1000"]
    code, out, _ = sweep(capsys, *argv, "--jobs", "1")
    assert code == command.EXIT_CHECK_FAILED
    assert "#0 fail: peak used 2,719.9 MiB/device > 1,000.0" in out  # legacy allocates nothing at startup: ok
    assert "#1 " not in out


def test_the_used_mib_cap_holds_over_the_whole_run(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's V2 model runner makes a communicator after its startup check: used MiB there is 2,561.9, the run's
    peak 2,792.4. A cap of 2,700 passed, read at the checkpoint; it holds over the whole run."""
    argv = ["--workload", "vllm tp=2 pp=2 v2-model-runner", "--max-used-mib", "2700", "--jobs", "1"]
    code, out, _ = sweep(capsys, *argv)
    assert code == command.EXIT_CHECK_FAILED, out
    assert "#0 fail: peak used 2,792.4 MiB/device > 2,700.0" in out


def test_a_cap_between_the_peak_and_its_rounding_reads_and_resumes_as_it_was_checked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """vLLM tp=2 peaks at 2,719.889 MiB. Under a cap of 2,719.89 the cell is ok, and its row said 2,719.9
    (rounded), over the cap: a CI script comparing the two saw a violation beside "ok", and --resume refused the
    sweep's own file as edited. Under 2,719.88 the message read "2,719.9 > 2,719.9"."""
    out = tmp_path / "s.json"
    argv = ["--workload", "vllm tp=2", "--jobs", "1", "--json", str(out)]
    code, _, err = sweep(capsys, *argv, "--max-used-mib", "2719.89")
    assert code == 0, err
    (row,) = read_json(out)[2]
    assert row["status"] == "ok" and 2719.88 < row["used_mib_max"] <= 2719.89, row
    code, _, err = sweep(capsys, *argv, "--max-used-mib", "2719.89", "--resume")
    assert code == 0, err
    code, text, _ = sweep(capsys, *argv, "--max-used-mib", "2719.88", "--overwrite")
    assert code == command.EXIT_CHECK_FAILED
    assert "#0 fail: peak used 2,719.89 MiB/device > 2,719.88" in text


def test_a_sweep_resumes_whatever_the_spelling_of_its_scenario_path_and_of_its_accepted_verdicts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scenario named relative to another folder, or the accepted verdicts given in another order, made another
    matrix hash and other cell_ids for the same cells: --resume refused the sweep's own file (exit 2)."""
    out = tmp_path / "s.json"
    monkeypatch.chdir(REPO)
    first = ["--scenario", "scenarios/idle-world-group.toml", "--accept-verdict", "pass", "--accept-verdict", "hang"]
    code, _, err = sweep(capsys, *first, "--jobs", "1", "--json", str(out))
    assert code == 0, err
    monkeypatch.chdir(REPO.parent)
    again = ["--scenario", f"{REPO.name}/scenarios/idle-world-group.toml", "--accept-verdict", "hang"]
    code, text, err = sweep(capsys, *again, "--accept-verdict", "pass", "--jobs", "1", "--json", str(out), "--resume")
    assert code == 0, err
    assert "0 run in" in text + err  # every cell taken from the file


def test_scenario_variants_are_cells_and_their_expectations_the_check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    scenario = str(REPO / "scenarios" / "pytorch-199957.toml")
    code, _, err = sweep(capsys, "--scenario", scenario, "--jobs", "1", "--json", str(tmp_path / "s.json"))
    assert code == 0, err
    _, _, rows = read_json(tmp_path / "s.json")
    assert [(r["kind"], r["variant"], r["policy"], r["env"]) for r in rows] == [
        ("scenario", "nccl2-default", "torch-default", {}),
        ("scenario", "legacy", "torch-default", {"TORCH_DIST_USE_NCCL2": "0"}),
        ("scenario", "share-resources", "torch-default", {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}),
    ]
    # Every variant under one policy: the variant whose expectation pins the default's memory now fails.
    code, out, _ = sweep(capsys, "--scenario", scenario, "--policy", "legacy", "--jobs", "1")
    assert code == command.EXIT_CHECK_FAILED
    assert " fail " in out


# ---------------------------------------------------------------------------------------------- files, resume


MATRIX_2x2 = ["--workload", "vllm tp=2", "--workload", "megatron tp=2 dp=2", "--policy", "dedupe", "--policy", "legacy"]


def test_csv_and_json_hold_the_same_rows_in_the_documented_shape(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    js, cs = tmp_path / "out.json", tmp_path / "out.csv"
    code, _, _ = sweep(
        capsys, *MATRIX_2x2, "--env", "NCCL_DEBUG=WARN", "--jobs", "1", "--json", str(js), "--csv", str(cs)
    )
    assert code == 0
    document = json.loads(js.read_text())
    assert document["schema"] == "simnccl.sweep" and document["schema_version"] == SCHEMA_VERSION
    assert document["cells"] == 4 and document["summary"] == {"ok": 4, "fail": 0, "stopped": 0, "crash": 0}
    assert document["matrix"]["policies"] == ["dedupe", "legacy"] and document["matrix"]["env"] == {
        "NCCL_DEBUG": "WARN"
    }
    row = document["rows"][0]
    assert list(row) == list(FIELDS)
    assert row["knobs"] == {"tp": 2, "local_world_size": 2} or row["knobs"] == {"local_world_size": 2, "tp": 2}
    assert row["env"] == {"NCCL_DEBUG": "WARN"} and isinstance(row["used_mib_max"], float)
    with cs.open(newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == CSV_FIELDS
        lines = list(reader)
    assert [int(r["index"]) for r in lines] == [0, 1, 2, 3]
    assert {r["matrix_hash"] for r in lines} == {document["matrix_hash"]}
    csv_hash, csv_rows = read_csv(cs)
    assert csv_hash == document["matrix_hash"]
    assert [result_of(r) for r in csv_rows] == [result_of(r) for r in document["rows"]]


def test_stdout_json_replaces_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = sweep(capsys, "--workload", "vllm tp=2", "--jobs", "1", "--json")
    assert code == 0
    assert json.loads(out)["rows"][0]["status"] == "ok" and "1/1 cells: 1 ok" in err


@pytest.mark.parametrize("kind", ["json", "csv"])
def test_resume_skips_the_rows_already_in_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    out = tmp_path / f"out.{kind}"
    assert sweep(capsys, *MATRIX_2x2, "--jobs", "1", f"--{kind}", str(out))[0] == 0
    before = (read_json(out) if kind == "json" else (None, None, read_csv(out)[1]))[2]
    # An interrupted sweep: only cells 0 and 2 made it to the file.
    if kind == "json":
        document = json.loads(out.read_text())
        document["rows"] = [r for r in document["rows"] if r["index"] in (0, 2)]
        out.write_text(json.dumps(document))
    else:
        lines = out.read_text().splitlines(keepends=True)
        out.write_text(lines[0] + lines[1] + lines[3])
    code, _, err = sweep(capsys, *MATRIX_2x2, "--jobs", "1", f"--{kind}", str(out), "--resume")
    assert code == 0
    assert "4 cells (2 done, 2 to run)" in err
    after = (read_json(out) if kind == "json" else (None, None, read_csv(out)[1]))[2]
    assert [r["index"] for r in after] == [0, 1, 2, 3]
    assert [result_of(r) for r in after] == [result_of(r) for r in before]
    # The kept rows were not run again: how they ran (their worker, their wall time) is the first run's.
    assert [(r["worker"], r["wall_s"]) for r in after if r["index"] in (0, 2)] == [
        (r["worker"], r["wall_s"]) for r in before if r["index"] in (0, 2)
    ]
    code, _, err = sweep(capsys, *MATRIX_2x2, "--jobs", "1", f"--{kind}", str(out), "--resume")
    assert code == 0 and "4 cells (4 done, 0 to run)" in err


@pytest.mark.parametrize(
    ("kind", "field", "value", "message"),
    [
        ("json", "verdict", 5, "rows[0]: verdict: expected text, got 5"),
        ("json", "workload", None, "rows[0]: workload: expected text, got None"),
        ("json", "used_mib", "lots", "rows[0]: used_mib: expected a number, got 'lots'"),
        ("json", "knobs", [1], "rows[0]: knobs: expected a table, got [1]"),
        ("csv", "knobs", "5", "line 2: knobs: expected a table, got 5"),
        # values no run writes: taken in, printed, and written back (NaN is not JSON) before
        (
            "json",
            "used_mib_max",
            float("nan"),
            "rows[0]: used_mib_max: expected a finite number from 0 to 2**63, got nan",
        ),
        ("json", "world", -7, "rows[0]: world: expected a finite number from 0 to 2**63, got -7"),
        ("json", "verdict", "banana", "rows[0]: verdict 'banana' is not one of pass, fail, hang, error"),
        ("csv", "verdict", "banana", "line 2: verdict 'banana' is not one of pass, fail, hang, error"),
    ],
)
def test_a_resume_file_with_a_wrongly_typed_field_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str, field: str, value: object, message: str
) -> None:
    """A damaged or hand-edited row once reached the table and crashed it (exit 70, a bug): bad input, exit 2."""
    out = tmp_path / f"out.{kind}"
    assert sweep(capsys, *MATRIX_2x2, "--jobs", "1", f"--{kind}", str(out))[0] == 0
    if kind == "json":
        document = json.loads(out.read_text())
        document["rows"][0][field] = value
        out.write_text(json.dumps(document))
    else:
        with out.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        rows[0][field] = str(value)
        with out.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    code, _, err = sweep(capsys, *MATRIX_2x2, "--jobs", "1", f"--{kind}", str(out), "--resume")
    assert code == 2 and err.startswith("error: ") and message in err and "\n" not in err.strip(), err


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("workload", "\x1b[2Jmegatron", "has workload '\\x1b[2Jmegatron' where its cell has"),
        ("gpu", "tpu-v9", "has gpu 'tpu-v9' where its cell has 'h100-80gb'"),
        ("policy", "torch-default", "has policy 'torch-default' where its cell has 'legacy'"),
        ("verdict", "hang", "is ok with verdict 'hang', which its checks do not accept"),
        ("check", "peak used 9,999.0 MiB/device > 5,000.0", "is ok with a failed check 'peak used 9,999.0"),
    ],
)
def test_a_resumed_row_that_is_not_its_cells_result_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, field: str, value: str, message: str
) -> None:
    """A row's ``cell_id`` is a hash of its cell, not of the row: an edited label, GPU, policy or verdict kept
    it, and the row was taken in (and printed) as that cell's result."""
    out = tmp_path / "out.json"
    assert sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--json", str(out))[0] == 0
    document = json.loads(out.read_text())
    document["rows"][1][field] = value
    out.write_text(json.dumps(document))
    code, _, err = sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--json", str(out), "--resume")
    assert code == 2 and err.startswith("error: --resume: row 1 (cell ") and message in err, err
    assert "\n" not in err.strip() and "\x1b" not in err


def test_a_failed_row_edited_to_ok_over_the_cap_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Fuzzing: the failed rows of a sweep with a memory cap, edited to ``ok`` (check text emptied), resumed to
    exit 0, "4 ok", although each row still showed its device's use over the cap. A row's own figures say it."""
    matrix = [*MATRIX_2x2, "--max-used-mib", "100"]
    out = tmp_path / "out.json"
    assert sweep(capsys, *matrix, "--jobs", "1", "--json", str(out))[0] == 1
    document = json.loads(out.read_text())
    failed = [r for r in document["rows"] if r["status"] == "fail"]
    assert failed
    for row in failed:
        row.update(status="ok", check="")
    out.write_text(json.dumps(document))
    code, _, err = sweep(capsys, *matrix, "--jobs", "1", "--json", str(out), "--resume")
    assert code == 2 and "used MiB/device, over the cap of 100.0" in err, err


def test_two_rows_for_one_cell_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An ``ok`` copy of a failed row put before it silently won: which row is the cell's result?"""
    out = tmp_path / "out.json"
    assert sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--json", str(out))[0] == 0
    document = json.loads(out.read_text())
    document["rows"].insert(0, dict(document["rows"][2]))
    out.write_text(json.dumps(document))
    code, _, err = sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--json", str(out), "--resume")
    assert code == 2 and f"has two rows for cell {document['rows'][0]['cell_id']}" in err, err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda text: text.replace('"index": 1,', '"index": 1' + "0" * 400 + ","), "expected a finite number"),
        (lambda text: text.replace('"index": 1,', '"index": 1' + "0" * 5000 + ","), "cannot read a sweep JSON"),
    ],
    ids=["index-of-401-digits", "index-of-5001-digits"],
)
def test_a_resume_file_that_crashed_the_reader_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, edit, message: str | None
) -> None:
    """OverflowError in math.isfinite, int() past 4,300 digits, a TypeError on a non-text matrix hash: exit 70."""
    out = tmp_path / "out.json"
    assert sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--json", str(out))[0] == 0
    out.write_text(edit(out.read_text()))
    code, _, err = sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--json", str(out), "--resume", "--accept-matrix-change")
    assert code == 2 and message in err, err


@pytest.mark.parametrize("file_hash", [12345, {"a": 1}, None, "not/a hash"])
def test_a_kept_files_name_never_takes_a_hash_that_is_not_one(file_hash: object) -> None:
    """A number there raised TypeError (exit 70) once the rows of cells left the matrix were kept aside."""
    from simnccl.sweep.command import _kept_path

    assert _kept_path(Path("out.json"), file_hash).name == "out.matrix-unknown.json"  # type: ignore[arg-type]


def test_a_resume_file_nested_too_deep_to_read_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    out.write_text("[" * 100_000 + "]" * 100_000)  # the decoder's recursion: exit 70 before
    code, _, err = sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--json", str(out), "--resume")
    assert code == 2 and "nested too deep to read" in err, err


def test_user_text_in_the_table_is_printed_on_its_line_with_its_controls_escaped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    matrix = tmp_path / "m.toml"
    matrix.write_text(
        '[[workload]]\ngenerator = "megatron"\nargs = { tp = 2 }\nworld = 2\n'
        'label = "\\u001b[31mRED\\u202e\\nx"\n[env]\nNCCL_DEBUG = "\\u001b[2J"\n'
    )
    code, out, _ = sweep(capsys, str(matrix), "--jobs", "1")
    assert code == 0
    row = out.splitlines()[2]
    assert "\\x1b[31mRED\\u202e\\nx" in row and "NCCL_DEBUG=\\x1b[2J" in row and "\x1b" not in out, out


def test_the_json_and_the_csv_file_must_be_two_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    (tmp_path / "alias").symlink_to(out)
    for csv_target in (out, tmp_path / "alias"):
        code, _, err = sweep(capsys, *MATRIX_2x2, "--json", str(out), "--csv", str(csv_target))
        assert code == 2 and "is the --json file too" in err and not out.exists(), err


def test_one_scenario_file_under_two_spellings_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = REPO / "simnccl" / "scenarios" / "pytorch-199957.toml"
    spelt = scenario.parent / ".." / "scenarios" / scenario.name
    code, _, err = sweep(capsys, "--scenario", str(scenario), "--scenario", str(spelt), "--dry-run")
    assert code == 2 and "are the same file: variant" in err, err


def test_resume_runs_stopped_and_crashed_cells_again(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--json", str(out))[0] == 0
    document = json.loads(out.read_text())
    document["rows"][1].update(status="crash", check="MemoryError: ")
    document["rows"][3].update(status="stopped", check="no result")
    out.write_text(json.dumps(document))
    code, _, err = sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--json", str(out), "--resume")
    assert code == 0
    assert "2 stopped or crashed cell(s) run again" in err and "(2 done, 2 to run)" in err
    assert [r["status"] for r in read_json(out)[2]] == ["ok"] * 4


def test_a_changed_matrix_is_refused_unless_accepted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--json", str(out))[0] == 0
    first = results(out)
    changed = [*MATRIX_2x2[:-2], "--policy", "lazy-init"]  # legacy out, lazy-init in
    code, _, err = sweep(capsys, *changed, "--jobs", "1", "--json", str(out), "--resume")
    assert code == 2
    assert err.startswith("error: --resume: ") and "another matrix" in err and "policies changed" in err
    assert results(out) == first  # the refused run wrote nothing
    code, _, err = sweep(capsys, *changed, "--jobs", "1", "--json", str(out), "--resume", "--accept-matrix-change")
    assert code == 0
    assert "(2 done, 2 to run)" in err
    now = results(out)
    kept = {cid for cid, r in first.items() if r["policy"] == "dedupe"}
    assert kept <= set(now) and all(now[cid] == first[cid] for cid in kept)
    assert sorted(r["policy"] for r in now.values()) == ["dedupe", "dedupe", "lazy-init", "lazy-init"]


def test_rows_a_changed_matrix_leaves_out_are_kept_beside_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--accept-matrix-change once rewrote the file without the rows of cells no longer in the matrix: their
    results were gone. The file as it was is kept beside it, named after its matrix, and never replaced."""
    out = tmp_path / "out.csv"
    assert sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--csv", str(out))[0] == 0
    old_hash, _ = read_csv(out)
    before = out.read_bytes()
    narrowed = MATRIX_2x2[:-2]  # legacy out
    kept = tmp_path / f"out.matrix-{old_hash}.csv"
    code, _, err = sweep(capsys, *narrowed, "--jobs", "1", "--csv", str(out), "--resume", "--accept-matrix-change")
    assert code == 0 and f"2 row(s) of cells no longer in the matrix left {out}; kept in {kept}" in err, err
    assert "(2 done, 0 to run)" in err
    assert kept.read_bytes() == before
    assert sorted(r["policy"] for r in read_csv(out)[1]) == ["dedupe", "dedupe"]
    out.write_bytes(before)  # the same change again: the kept copy is never replaced
    code, _, err = sweep(capsys, *narrowed, "--jobs", "1", "--csv", str(out), "--resume", "--accept-matrix-change")
    assert code == 2 and f"to be kept in {kept}, which already exists" in err and "\n" not in err.strip(), err
    assert out.read_bytes() == before and kept.read_bytes() == before


def test_a_row_not_in_the_matrix_it_was_written_for_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A row of a file whose matrix_hash is this matrix's, but whose cell is not in it (the file edited, or mixed
    with another sweep's), was dropped with a note and its result lost: refused, naming the file and the row."""
    out = tmp_path / "out.json"
    assert sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--json", str(out))[0] == 0
    document = json.loads(out.read_text())
    document["rows"][2]["cell_id"] = "0" * 16
    out.write_text(json.dumps(document))
    before = out.read_bytes()
    code, _, err = sweep(capsys, *MATRIX_2x2, "--jobs", "1", "--json", str(out), "--resume")
    assert code == 2 and err.startswith(f"error: --resume: {out}: row 2 (") and "\n" not in err.strip(), err
    assert "is not a cell of this matrix, though the file was written for it" in err
    assert out.read_bytes() == before


def test_an_existing_output_file_is_kept_unless_resumed_or_overwritten(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "out.csv"
    assert sweep(capsys, "--workload", "vllm tp=2", "--jobs", "1", "--csv", str(out))[0] == 0
    code, _, err = sweep(capsys, "--workload", "vllm tp=2", "--jobs", "1", "--csv", str(out))
    assert code == 2 and "already holds a sweep; pass --resume" in err
    assert sweep(capsys, "--workload", "vllm tp=2", "--jobs", "1", "--csv", str(out), "--overwrite")[0] == 0
    other = tmp_path / "notes.json"
    other.write_text('{"mine": true}')  # not a sweep's file: never replaced without --overwrite
    code, _, err = sweep(capsys, "--workload", "vllm tp=2", "--jobs", "1", "--json", str(other))
    assert code == 2 and "not a simnccl sweep JSON document" in err and "--overwrite" in err
    assert other.read_text() == '{"mine": true}'


def test_a_toml_matrix_is_the_same_matrix_as_the_same_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(
        textwrap.dedent(
            """\
            [[workload]]
            generator = "vllm"
            args = { tp = 2 }

            [[workload]]
            generator = "megatron"
            args = { tp = 2, dp = 2 }

            [axes]
            policy = ["dedupe", "legacy"]
            """
        )
    )
    code, out, _ = sweep(capsys, str(matrix), "--dry-run")
    flags_code, flags_out, _ = sweep(capsys, *MATRIX_2x2, "--dry-run")
    assert code == flags_code == 0
    assert out == flags_out and len(out.splitlines()) == 4  # the same cells, the same cell ids
    # A flag replaces the file's key of the same meaning.
    code, out, _ = sweep(capsys, str(matrix), "--policy", "lazy-init", "--dry-run")
    assert code == 0 and {line.split("\t")[3] for line in out.splitlines()} == {"lazy-init"}


def test_the_readme_matrix_example_is_valid(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Sweeps") :]
    example = section[section.index("```toml\n") + 8 : section.index("```", section.index("```toml\n") + 8)]
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(example.replace('"scenarios/', f'"{REPO}/scenarios/'))
    code, out, err = sweep(capsys, "--json", str(matrix), "--dry-run")  # --json then the matrix: an input
    assert code == 0, err
    # 1 workload x 3 policies x 2 releases x 2 GPUs x 2 env sets + 3 scenario variants x 3 policies x 2 env sets
    assert len(out.splitlines()) == 24 + 18 and "42 cells, 0 done, 42 to run" in err


# ---------------------------------------------------------------------------------------------- bad input


BAD_FLAGS = [
    (["--workload", "vllm tp=2", "--gpu", "h900"], "--gpu: unknown GPU kind 'h900'"),
    (["--workload", "vllm tp=2", "--release", "3.0"], "--release: unknown torch release '3.0'"),
    (["--workload", "vllm tp=2", "--policy", "no-such-policy"], "--policy: "),
    (["--workload", "vllm tp=2", "--policy", "dedupe", "--policy", "dedupe"], "--policy: 'dedupe' is given twice"),
    (["--workload", "vllm tpp=2"], "--workload 'vllm tpp=2': unknown knob tpp=2 for workload 'vllm'"),
    (["--workload", "jax tp=2"], "--workload 'jax tp=2': unknown workload generator 'jax'"),
    (["--workload", "megatron tp=2 dp=2 world=8"], "world=8 does not match the 4 ranks"),
    (["--workload", "vllm tp=2", "--env-set", "NCCL_MAX_NCHANNELS"], "--env-set: expected VAR=VALUE items"),
    # a misspelt knob swept torch's default under the knob's name; a launcher variable changed nothing
    (["--workload", "vllm tp=2", "--env-set", "TORCH_DIST_USE_NCL2=0"], "--env-set.TORCH_DIST_USE_NCL2: unknown"),
    (["--workload", "vllm tp=2", "--env", "RANK=1"], "--env.RANK: RANK is set per rank by the launcher"),
    (["--workload", "vllm tp=2", "--accept-verdict", "fine"], "--accept-verdict: unknown verdict 'fine'"),
    # one range, said as checked (it said "in [0, 604800]" for -1 and refused 0 with another message)
    (["--workload", "vllm tp=2", "--cell-timeout", "0"], "--cell-timeout: expected a number of seconds in (0, 604"),
    (["--workload", "vllm tp=2", "--cell-timeout", "-1"], "--cell-timeout: expected a number of seconds in (0, 604"),
    (["--workload", "vllm tp=2", "--jobs", "0"], "--jobs: expected 1 to 1024 processes"),
    (["--workload", "vllm tp=2", "--scheduler", "localhost"], "--scheduler: expected a scheduler address"),
    # each passed the check and crashed the client (exit 70): a port that is no number, none, another protocol
    *[
        (["--workload", "vllm tp=2", "--scheduler", address], "--scheduler: expected a scheduler address tcp://")
        for address in ("tcp://127.0.0.1:abc", "tcp://127.0.0.1", "tcp://h:70000", "inproc://x", "tls://h:1", "")
    ],
    # two spellings of one config, one policy, one file: the same simulations twice
    (
        ["--workload", "vllm tp=2", "--policy", "budget(2048)", "--policy", "budget(2048.0)"],
        "--policy: 'budget(2048)' and 'budget(2048.0)' are the same",
    ),
    (["--workload", "megatron tp=2 world=2", "--workload", "megatron tp=2 pp=1 world=2"], "--workload: 'megatron"),
    # --env's own error, named by --env (it said "--matrix: axes.env", a flag that does not exist)
    (["--workload", "vllm tp=2", "--env", "NCCL_MAX_NCHANNELS=abc"], "error: --env: NCCL_MAX_NCHANNELS: expected"),
    (
        ["--workload", "vllm tp=2", "--env", "NCCL_DEBUG=INFO", "--env", "NCCL_DEBUG=WARN"],
        "error: --env: NCCL_DEBUG is given twice ('INFO' and 'WARN')",
    ),
    (["--workload", "vllm tp=2", "--json", "-", "--csv", "-"], "--csv: only one of --json and --csv"),
    (["--workload", "vllm tp=2", "--scheduler", "tcp://h:1", "--jobs", "2"], "--jobs: choose one of"),
    (["--workload", "vllm tp=2", "--resume"], "--resume: needs the sweep's file"),
    (["--workload", "vllm tp=2", "--csv", "x.csv", "--resume", "--overwrite"], "--overwrite: choose one of"),
    (["--workload", "vllm tp=2", "--env", "A=1", "--env-set", "A=1", "--env-set", ""], "matrix: cells #0 and #1 are"),
    ([*MATRIX_3x4x2, "--max-cells", "20"], "--max-cells: the matrix has 24 cells, more than the limit of 20"),
    ([], "--workload: the matrix has no cells"),
    # the limit each cell's generator checks, named as cost names it (it said "more than the limit of 1048576")
    (["--workload", "megatron tp=8 pp=4 dp=4096"], "ranks exceeds the limit max_world_size = 65536"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_FLAGS, ids=[m.split(":")[0] for _, m in BAD_FLAGS])
def test_bad_input_exits_2_with_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = sweep(capsys, *argv)
    assert code == 2
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert "Traceback" not in err and out == ""


BAD_TOML = [
    ("[sweep]\ncells = 3\n", "m.toml: sweep.cells: unknown key"),
    ('[[workload]]\ngenerator = "vllm"\nargs = { tp = "two" }\n', "m.toml: workload[0]: tp: expected an integer"),
    (
        '[[workload]]\ngenerator = "vllm"\nargs = { tp = 2 }\n[axes]\ngpu = "h100-80gb"\n',
        "m.toml: axes.gpu: expected a list",
    ),
    (
        '[[workload]]\ngenerator = "vllm"\nargs = { tp = 2 }\n[axes]\nenv = [{ "1X" = "y" }]\n',
        "axes.env[0]: expected an environment",
    ),
    (
        '[[workload]]\ngenerator = "vllm"\nargs = { tp = 2 }\n[axes]\nenv = [{ NCCL_MAX_NCHANNEL = "4" }]\n',
        "axes.env[0].NCCL_MAX_NCHANNEL: unknown environment knob",
    ),
    ('[[scenario]]\nfile = "missing.toml"\n', "m.toml: scenario[0]: "),
    # a value that is not a table (exit 70), and empty or false values, taken as "not given" (exit 0)
    ('env = 5\n[[workload]]\ngenerator = "vllm"\nargs = { tp = 2 }\n', "m.toml: env: expected a table"),
    ('[[workload]]\ngenerator = "vllm"\nargs = { tp = 2 }\n[axes]\npolicy = []\n', "axes.policy: expected at least"),
    ('[[workload]]\ngenerator = "vllm"\nargs = { tp = 2 }\n[axes]\nrelease = ""\n', "axes.release: expected a list"),
    ('[[workload]]\ngenerator = "vllm"\nargs = { tp = 2 }\n[axes]\ngpu = 0\n', "axes.gpu: expected a list"),
    ('[[workload]]\ngenerator = "vllm"\nargs = { tp = 2 }\n[check]\nverdict = {}\n', "check.verdict: expected a"),
    # user text in an error stays on its one line, its control characters shown as escapes
    ('[sweep]\n"\\u001b[31mK\\nx" = 1\n', "m.toml: sweep.\\x1b[31mK\\nx: unknown key"),
    ("[axes\n", "m.toml: not valid TOML"),
]


@pytest.mark.parametrize(("text", "message"), BAD_TOML, ids=[m.split(": ")[1] for _, m in BAD_TOML])
def test_a_bad_matrix_file_exits_2_naming_the_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "m.toml"
    path.write_text(text)
    code, _, err = sweep(capsys, str(path))
    assert code == 2
    assert message in err.replace(str(tmp_path) + os.sep, "") and err.count("\n") == 1, err


@pytest.mark.parametrize("kind", ["device", "fifo", "deep", "huge"])
def test_a_matrix_file_that_is_not_a_small_regular_toml_file_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    """``simnccl sweep /dev/zero`` read until the process was killed, a FIFO blocked forever: a matrix file is
    read only when it is a regular file within max_file_bytes, nested within max_nesting_depth (as a scenario
    file is)."""
    path = tmp_path / "m.toml"
    if kind == "device":
        path = Path("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "deep":
        path.write_text("a = " + "[" * 40 + "]" * 40 + "\n")
    else:
        path.write_text("# " + "x" * (2 << 20) + "\n")
    code, _, err = sweep(capsys, str(path))
    expected = {
        "device": "cannot read: not a regular file",
        "fifo": "cannot read: not a regular file",
        "deep": "exceeds the limit max_nesting_depth",
        "huge": "exceeds the limit max_file_bytes",
    }[kind]
    assert code == 2 and expected in err and err.count("\n") == 1, err


@pytest.mark.parametrize("flag", ["--csv", "--json"])
def test_an_output_that_is_not_a_regular_file_is_refused_and_left_as_it_was(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str
) -> None:
    """A sweep rewrites its output whole (a temporary file renamed over it). Over a FIFO or a device that rename
    replaced the node itself: run as root, ``--csv /dev/zero`` left /dev/zero a CSV file. Refused now (exit 2),
    the node untouched; nothing else could end, as a FIFO without a reader blocks the writer forever."""
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    code, _, err = sweep(capsys, "--workload", "vllm tp=2", flag, str(fifo))
    assert code == 2 and f"{flag}: " in err and "is not a regular file" in err, err
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.mark.parametrize("kind", ["dangling", "loop", "long"])
def test_an_output_path_that_cannot_be_written_is_refused_before_any_cell(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    """A link into a folder that is not there, a loop of links, a name longer than the file system takes: each
    failed when the first row was written (exit 70)."""
    path = tmp_path / ("x" * 300 if kind == "long" else "out.json")
    if kind == "dangling":
        path.symlink_to(tmp_path / "missing" / "out.json")
    elif kind == "loop":
        path.symlink_to(path)
    code, _, err = sweep(capsys, *MATRIX_2x2, "--json", str(path))
    expected = {"dangling": "no such directory", "loop": "cannot follow", "long": "File name too long"}[kind]
    assert code == 2 and err.startswith("error: --json: ") and expected in err and err.count("\n") == 1, err


def test_an_output_behind_a_symbolic_link_is_written_through_the_link(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target, link = tmp_path / "results.csv", tmp_path / "latest.csv"
    link.symlink_to(target)
    code, _, err = sweep(capsys, "--workload", "vllm tp=2", "--csv", str(link), "-q")
    assert code == 0, err
    assert link.is_symlink() and target.is_file() and target.read_text().startswith("index,cell_id")


def test_a_matrix_too_large_is_refused_before_any_cell_exists(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_expansion(matrix: object) -> None:
        raise AssertionError("expanded a matrix that is over the limit")

    monkeypatch.setattr(command, "expand", no_expansion)
    releases = [a for r in ("2.14", "2.15", "2.15-dev", "2.15a0", "2.16-dev") for a in ("--release", r)]
    gpus = [a for g in ("h100-80gb", "a100-80gb", "l4", "h200-141gb") for a in ("--gpu", g)]
    sets = [a for n in range(1, 600) for a in ("--env-set", f"NCCL_MAX_NCHANNELS={n}")]
    code, _, err = sweep(capsys, *MATRIX_3x4x2[:6], *releases, *gpus, *sets)
    assert code == 2 and "the matrix has 35940 cells, more than the limit of 10000" in err


def test_without_distributed_a_dask_sweep_exits_2_naming_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` now raises ImportError
    code, _, err = sweep(capsys, "--workload", "vllm tp=2", "--dask-local", "1")
    assert code == 2 and "pip install 'simnccl[sweep]'" in err


def test_a_scheduler_that_does_not_answer_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("distributed")
    monkeypatch.setattr(executors, "DASK_CONNECT_TIMEOUT_S", 1.0)
    code, _, err = sweep(capsys, "--workload", "vllm tp=2", "--scheduler", "tcp://127.0.0.1:1")
    assert code == 2 and "error: --scheduler tcp://127.0.0.1:1: cannot reach the scheduler" in err


def test_a_refused_connection_is_said_at_once_not_after_dasks_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    """Dask retried a refused connection for its whole timeout (30 s) before the one line (found by fuzzing)."""
    start = time.monotonic()
    code, _, err = sweep(capsys, "--workload", "vllm tp=2", "--scheduler", "tcp://127.0.0.1:1")
    assert code == 2 and "cannot reach the scheduler: Connection refused" in err, err
    assert time.monotonic() - start < 10


def test_importing_simnccl_and_its_cli_does_not_import_dask() -> None:
    probe = "import sys, simnccl, simnccl.cli, simnccl.sweep; print(sorted({m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out.replace("'", '"')))
    assert not loaded & {"dask", "distributed", "torch"}


# ---------------------------------------------------------------------------------------------- progress


class _Terminal:
    """A stderr that says it is a terminal (and keeps what was written)."""

    def __init__(self) -> None:
        self.text: list[str] = []

    def write(self, text: str) -> int:
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("quiet", [False, True], ids=["terminal", "quiet"])
def test_a_progress_bar_on_a_terminal_unless_quiet(quiet: bool) -> None:
    parser = __import__("argparse").ArgumentParser()
    command.add_sweep_parser(parser.add_subparsers())
    args = parser.parse_args(["sweep", "--workload", "vllm tp=2", "--jobs", "1", *(["--quiet"] if quiet else [])])
    err, out = _Terminal(), _Terminal()
    assert command.run_sweep(args, out=out, err=err) == 0  # type: ignore[arg-type]
    drawn = "".join(err.text)
    assert ("━" in drawn) != quiet  # rich's bar
    assert ("".join(out.text) == "") == quiet  # quiet: no table when every cell is ok


# ---------------------------------------------------------------------------------------------- xdist gateways


def _plugin_args() -> tuple[str, ...]:
    installed = any(ep.value == "simnccl.testing.plugin" for ep in entry_points(group="pytest11"))
    return ("-p", "simnccl") if installed else ("-p", "simnccl.testing.plugin")


def test_property_campaign_on_several_xdist_gateways_sums_the_program_count(pytester: pytest.Pytester) -> None:
    """The README's recipe for a campaign beyond one machine: explicit ``--tx`` gateways (``ssh=host`` in
    production; ``popen`` here, in both spellings: ``2*popen`` and one more ``popen``, three gateways). Every
    gateway's programs are counted once in the total the plugin prints and checks."""
    pytester.makepyfile(
        textwrap.dedent(
            """\
            import os

            import pytest
            from simnccl.ops import Checkpoint, InitProcessGroup, SetDevice
            from simnccl.testing.replay import SimCase, generated

            @pytest.mark.parametrize("n", range(9))
            def test_programs(n):
                for i in range(n + 1):
                    ops = (SetDevice(), InitProcessGroup(), Checkpoint(label=f"{n}.{i}"))  # each its own program
                    generated(SimCase(programs=(ops,) * 2)).run()  # as drawn
                with open(f"ran-on-{os.environ['PYTEST_XDIST_WORKER']}", "a") as handle:
                    handle.write(f"{n}\\n")
            """
        )
    )
    gateways = ("--dist", "load", "--tx", "2*popen", "--tx", "popen")
    result = pytester.runpytest_subprocess(*_plugin_args(), *gateways, "--simnccl-min-programs", "45")
    result.assert_outcomes(passed=9)
    assert result.ret == 0  # --simnccl-min-programs 45 holds: the sum is over every gateway
    result.stdout.fnmatch_lines(["simnccl: 45 generated programs simulated (45 simulations)*"])
    ran = {p.name: p.read_text().split() for p in pytester.path.glob("ran-on-*")}
    assert len(ran) >= 2, ran  # tests ran on more than one gateway, and each test's programs once
    assert sorted(int(n) for ns in ran.values() for n in ns) == list(range(9))
    assert set(ran) <= {"ran-on-gw0", "ran-on-gw1", "ran-on-gw2"}


def test_a_cell_whose_rank_raised_with_an_empty_message_says_why_by_its_type() -> None:
    # a bare ``assert`` raises AssertionError with no message: its first line raised IndexError in the sweep
    from simnccl.ops import InitProcessGroup, Raise
    from simnccl.sweep.cell import _why
    from simnccl.testing import simulate

    out = simulate([[InitProcessGroup(backend="gloo")], [InitProcessGroup(backend="gloo"), Raise()]])
    assert _why(out) == " (rank 1: AssertionError)"


@pytest.mark.parametrize("answer", ["nothing", "garbage"])
def test_an_address_that_is_not_a_dask_scheduler_is_bad_input_in_bounded_time(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    """Fuzzing: a port that takes the connection and never answers hung ``--scheduler`` with no end (Dask's
    connect timeout does not cover its handshake); one that answers garbage raised ValueError (exit 70)."""
    import socket
    import threading

    from simnccl.sweep import executors

    monkeypatch.setattr(executors, "DASK_CONNECT_TIMEOUT_S", 2.0)
    monkeypatch.setattr(executors, "DASK_CONNECT_GRACE_S", 1.0)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            if answer == "garbage":
                with contextlib.suppress(OSError):
                    conn.sendall(b"\xff" * 65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        port = server.getsockname()[1]
        start = time.monotonic()
        code, _, err = sweep(capsys, "--workload", "vllm tp=2", "--scheduler", f"tcp://127.0.0.1:{port}")
        assert time.monotonic() - start < 30
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()
    assert code == 2, err
    assert err.splitlines()[-1].startswith(f"error: --scheduler tcp://127.0.0.1:{port}: "), err


_SLEEPING_POLICY = """
import time
from dataclasses import dataclass
from simnccl.policy import BasePolicy

@dataclass(frozen=True)
class Sleeps(BasePolicy):
    name: str = "sleeps"

    def on_group(self, request, decision):
        time.sleep(600)
        return decision
"""


def test_sigint_to_the_sweeps_own_process_does_not_wait_for_its_running_cells(tmp_path: Path) -> None:
    """``kill -INT`` to the sweep alone (a terminal's Ctrl-C reaches its whole process group) waited for every
    running cell to end, up to its wall-clock limit: 57 s with --cell-timeout 60, ~10 min by default."""
    import signal

    (tmp_path / "sleepy.py").write_text(_SLEEPING_POLICY)
    out = tmp_path / "out.json"
    argv = ["sweep", "--workload", "vllm tp=2", "--workload", "vllm tp=1", "--policy", "sleepy:Sleeps", "--jobs", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "simnccl.cli", *argv, "--json", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()  # "simnccl sweep: 2 cells ... on 2 local processes": the pool is starting
    assert "2 cells" in first, first
    time.sleep(3)  # the workers take their cells and sleep in the policy
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert time.monotonic() - start < 20
    err = proc.stderr.read()
    assert "--resume continues from the output file" in err
    # The summary counts the cells that ran, not those there were to run ("0/2 cells: ... 2 run" before).
    summary = re.search(r"(\d+)/2 cells: .*; (\d+) run in ", err)
    assert summary is not None and summary.group(1) == summary.group(2), err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "megatron tp=2 tp=4"], "knob 'tp' is given twice"),
        (["--workload", "vllm tp=2", "--env-set", "NCCL_DEBUG=INFO NCCL_DEBUG=WARN"], "NCCL_DEBUG is given twice"),
        (["--workload", "vllm world=-8"], "world: expected an integer in [1, 1048576], got -8"),
    ],
)
def test_a_value_given_twice_or_out_of_range_in_a_flag_says_so(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Found by fuzzing: the last of two values silently won; world=-8 was "expected an integer"."""
    code, _, err = sweep(capsys, *argv, "--dry-run")
    assert code == 2 and message in err, err


# ------------------------------------------------------------------------- what a resumed row was computed from

SAFE_POLICY = """
from dataclasses import dataclass
from simnccl.policy import BasePolicy

@dataclass(frozen=True)
class Evolving(BasePolicy):
    name: str = "evolving"

    def on_group(self, request, decision):
        return decision
"""

RANK_DEPENDENT_POLICY = """
from dataclasses import dataclass, replace
from simnccl.policy import BasePolicy

@dataclass(frozen=True)
class Evolving(BasePolicy):
    name: str = "evolving"

    def on_group(self, request, decision):
        if request.rank % 2 and (decision.backend or request.effective_backend).startswith("nccl"):
            return replace(decision, pg_options=replace(decision.pg_options, lazy_init=True), explanation="odd")
        return decision
"""


def test_a_resume_after_the_user_s_policy_changed_never_keeps_its_old_rows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CI job caching its sweep file: the policy was safe, then an edit made it decide by rank. Resuming kept
    # the safe rows and said "2 ok", exit 0 (the policy's code was in no hash), where a fresh sweep fails.
    module = tmp_path / "team_evolving.py"
    module.write_text(SAFE_POLICY, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "sweep.json"
    common = ["--workload", "megatron tp=2 pp=2 dp=2", "--workload", "vllm tp=2", "--policy", "team_evolving:Evolving"]
    assert sweep(capsys, *common, "--jobs", "1", "--json", str(out))[0] == 0
    module.write_text(RANK_DEPENDENT_POLICY, encoding="utf-8")
    monkeypatch.delitem(sys.modules, "team_evolving")  # as a new process imports it
    code, _, err = sweep(capsys, *common, "--jobs", "1", "--json", str(out), "--resume")
    assert code == command.EXIT_BAD_INPUT, err
    assert "was written for another matrix" in err and "policy_sources changed" in err
    code, _, err = sweep(capsys, *common, "--jobs", "1", "--json", str(out), "--resume", "--accept-matrix-change")
    assert code == command.EXIT_CHECK_FAILED, err
    assert "2 cells (0 done, 2 to run)" in err
    _, _, rows = read_json(out)
    assert [r["status"] for r in rows] == ["fail", "fail"]
    assert all("PolicyInconsistency" in r["check"] for r in rows), [r["check"] for r in rows]


def test_a_process_running_an_edited_policy_s_old_code_refuses_the_cell_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived process (a Dask worker kept between sweeps) imported the policy, then the file was edited:
    the digest of the file on disk was the edited one's while the old code ran, and the rows were the old code's
    under the new identity (found by a tester: exit 0 on a cluster for an edit that fails locally). Now the cell
    says the code here is stale (exit 2); a process that imports the module afresh runs it."""
    module = tmp_path / "team_stale.py"
    module.write_text(SAFE_POLICY, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    common = ["--workload", "megatron tp=2 pp=2 dp=2", "--policy", "team_stale:Evolving", "--jobs", "1"]
    assert sweep(capsys, *common)[0] == 0  # this process imported it
    module.write_text(RANK_DEPENDENT_POLICY, encoding="utf-8")
    code, out, err = sweep(capsys, *common)
    assert code == command.EXIT_BAD_INPUT, out + err
    assert "PolicyCodeMismatch" in out + err and "changed after this process" in out + err
    monkeypatch.delitem(sys.modules, "team_stale")  # imported afresh: the edited code runs, and fails its check
    assert sweep(capsys, *common)[0] == command.EXIT_CHECK_FAILED


def test_a_worker_without_the_planned_policy_files_gives_a_prerequisite_row_not_a_bug(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker in another folder (another policies.py, or none): its rows were another policy's under this
    cell's identity, or a crash exiting 70. Now a ``PolicyCodeMismatch`` row: exit 2, a missing prerequisite."""
    module = tmp_path / "team_elsewhere.py"
    module.write_text(SAFE_POLICY, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    ran: list[cell_module.Cell] = []
    real_run_cell = cell_module.run_cell

    def recording(cell: cell_module.Cell, timeout_s: float) -> cell_module.Row:
        ran.append(cell)
        return real_run_cell(cell, timeout_s)

    monkeypatch.setattr(executors, "run_cell", recording)
    assert sweep(capsys, "--workload", "vllm tp=2", "--policy", "team_elsewhere:Evolving", "--jobs", "1")[0] == 0
    planned = next(c for c in ran if c.policy == "team_elsewhere:Evolving")
    other = cell_module.run_cell(replace(planned, policy_source="0" * 16), 60.0)
    assert other["status"] == "crash" and other["check"].startswith("PolicyCodeMismatch: "), other["check"]
    assert "other source files here" in other["check"]
    missing = cell_module.run_cell(replace(planned, policy="team_nowhere:Evolving"), 60.0)
    assert missing["check"].startswith("PolicyCodeMismatch: ") and "does not load here" in missing["check"]
    assert command.exit_code([other, missing]) == command.EXIT_BAD_INPUT
    assert command.exit_code([other, {**missing, "check": "RuntimeError: boom"}]) == command.EXIT_BUG


def test_a_resume_across_a_simnccl_upgrade_runs_every_cell_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model and the built-in policies are simnccl's: a file written by another version was resumed, its rows
    kept ("1 done, 0 to run", exit 0) and the file relabelled with this version. Now another matrix (exit 2,
    naming it); with --accept-matrix-change every cell runs again."""
    out = tmp_path / "sweep.json"
    common = ["--workload", "vllm tp=2", "--jobs", "1", "--json", str(out)]
    assert sweep(capsys, *common)[0] == 0
    monkeypatch.setattr(matrix_module, "__version__", "99.0")
    monkeypatch.setattr(cell_module, "__version__", "99.0")
    code, _, err = sweep(capsys, *common, "--resume")
    assert code == command.EXIT_BAD_INPUT and "simnccl changed" in err, err
    code, _, err = sweep(capsys, *common, "--resume", "--accept-matrix-change")
    assert code == 0 and "1 cells (0 done, 1 to run)" in err, err


@pytest.mark.parametrize("policy", ["user_policies:LastMemberLazy", "user_policies:EverythingFake"])
def test_accepting_error_verdicts_does_not_accept_a_defect_of_the_policy(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """``--accept-verdict error`` takes torch's errors as findings; a PolicyInconsistency or PolicyFakeBackend is
    the policy breaking production (``cost`` fails it whatever torch's default does), and its cell read ok."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    argv = ["--workload", "vllm tp=4", "--policy", policy, "--jobs", "1"]
    code, out, err = sweep(capsys, *argv, "--accept-verdict", "pass", "--accept-verdict", "error")
    assert code == command.EXIT_CHECK_FAILED, out + err
    assert "a defect of the policy" in out, out


def test_a_cell_that_kills_its_pool_worker_is_named_and_the_others_give_their_results(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that dies breaks the whole process pool: every cell not finished failed with BrokenProcessPool,
    the innocent ones too ("8 of 9 crashed", none named, no "please report"). They run again, each in a process
    of its own: only the killer's cells crash, the rest are ok, and exit 70 says where to report it."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    argv = ["--workload", "vllm tp=2", "--workload", "vllm tp=4", "--policy", "torch-default"]
    code, out, err = sweep(capsys, *argv, "--policy", "user_policies:KillsItsProcess", "--jobs", "2")
    assert code == command.EXIT_BUG, out + err
    statuses = [line.split()[7] for line in out.splitlines()[2:6]]
    assert statuses == ["ok", "crash", "ok", "crash"], out
    assert out.count("died running this cell alone") == 2, out
    assert "cell(s) #1, #3 crashed" in err and "please report" in err, err


@pytest.mark.parametrize("where", ["builtin-class", "class-in-another-file"])
def test_a_resume_after_the_module_that_makes_the_policy_object_changed_never_keeps_its_old_rows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A spec naming an object (``conf:P``) made in the user's file from a class defined elsewhere (simnccl's
    BudgetPolicy, or the team's class in another module): only the class's file was digested, so raising the
    object's budget in conf.py (every group eager, over the cap) kept the old "ok" row on --resume, exit 0."""
    module = tmp_path / f"conf_{where.replace('-', '_')}.py"
    if where == "builtin-class":
        make = (
            "from simnccl.policy.builtins import BudgetPolicy\nP = BudgetPolicy(name='acme', max_mib_per_device={})\n"
        )
    else:
        (tmp_path / "team_budget_classes.py").write_text(
            "from simnccl.policy.builtins import BudgetPolicy\nclass Team(BudgetPolicy):\n    pass\n", encoding="utf-8"
        )
        make = "from team_budget_classes import Team\nP = Team(name='acme', max_mib_per_device={})\n"
    module.write_text(make.format(0.0), encoding="utf-8")  # every group lazy: under the cap
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "sweep.json"
    common = ["--workload", "vllm tp=2", "--policy", f"{module.stem}:P", "--max-used-mib", "1000", "--jobs", "1"]
    assert sweep(capsys, *common, "--json", str(out))[0] == 0
    module.write_text(make.format(100000.0), encoding="utf-8")  # every group eager: over the cap
    monkeypatch.delitem(sys.modules, module.stem)
    code, _, err = sweep(capsys, *common, "--json", str(out), "--resume")
    assert code == command.EXIT_BAD_INPUT, err
    assert "policy_sources changed" in err
    code, _, err = sweep(capsys, *common, "--json", str(out), "--resume", "--accept-matrix-change")
    assert code == command.EXIT_CHECK_FAILED and "1 cells (0 done, 1 to run)" in err, err


def test_a_resume_after_a_scenario_s_own_profile_changed_is_another_matrix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The scenario file unchanged, the profile it names edited (its per-communicator overhead 0.56 -> 50 MiB):
    # every variant now fails its expectations, and resuming said "3 ok", exit 0.
    shipped = REPO / "simnccl" / "scenarios" / "pytorch-199957.toml"
    text = shipped.read_text(encoding="utf-8")
    assert "\n[torch]\n" in text
    (tmp_path / "s.toml").write_text(text.replace("\n[torch]\n", '\n[torch]\nprofile = "prof.toml"\n'), "utf-8")
    profile = REPO / "simnccl" / "profiles" / "h100-96gb-torch2.15-dev.toml"
    (tmp_path / "prof.toml").write_text(profile.read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "sweep.json"
    common = ["--scenario", str(tmp_path / "s.toml"), "--jobs", "1", "--json", str(out)]
    assert sweep(capsys, *common)[0] == 0
    edited = (
        (tmp_path / "prof.toml").read_text(encoding="utf-8").replace("comm_fixed_mib = 0.5556", "comm_fixed_mib = 50.0")
    )
    assert edited != profile.read_text(encoding="utf-8")
    (tmp_path / "prof.toml").write_text(edited, encoding="utf-8")
    code, _, err = sweep(capsys, *common, "--resume")
    assert code == command.EXIT_BAD_INPUT and "scenarios changed" in err, err
    code, _, err = sweep(capsys, *common, "--resume", "--accept-matrix-change")
    assert code == command.EXIT_CHECK_FAILED, err
    assert [r["status"] for r in read_json(out)[2]] == ["fail", "fail", "fail"]


@pytest.mark.parametrize("flag", [["--dask-local", "2"], ["--scheduler", "tcp://127.0.0.1:8786"]])
def test_a_dask_sweep_without_dask_is_a_missing_prerequisite_even_in_a_dry_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flag: list[str]
) -> None:
    # Found by a tester: --dry-run said exit 0 to a sweep that cannot run, and the real run printed its "on a local
    # Dask cluster" banner before the error (two lines on stderr)
    monkeypatch.setattr(executors, "dask_installed", lambda: False)
    for extra in (["--dry-run"], []):
        code, _, err = sweep(capsys, "--workload", "vllm tp=2", *flag, *extra)
        assert code == command.EXIT_BAD_INPUT
        assert (
            err == f"error: {flag[0]}: Dask is not installed; install the sweep extra: pip install 'simnccl[sweep]'\n"
        )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full (every write: ENOSPC)")
def test_a_sweep_whose_output_cannot_be_written_says_which_cells_finished(tmp_path: Path) -> None:
    """A sweep whose cells had all finished when its table could not be written (stdout on a full disk) said
    "nothing had finished"; its rows were in --csv all along."""
    with open("/dev/full", "w", encoding="utf-8") as full:
        done = subprocess.run(
            [sys.executable, "-m", "simnccl", "sweep", "--workload", "vllm tp=2", "--jobs", "1"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert done.returncode == command.EXIT_BAD_INPUT, done.stderr
    assert "nothing had finished" not in done.stderr and "finished  sweep: 1/1 cells have rows" in done.stderr


def test_a_scenario_cell_s_failed_check_names_the_sweep_s_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A scenario cell's failed check quoted the run command's remedy, "run with --allow unacted", a flag sweep
    does not take: it is ``--accept-verdict unacted`` there."""
    path = tmp_path / "late.toml"
    path.write_text(
        '[scenario]\nname = "late"\n[cluster]\ngpu = "h100-80gb"\ngpus_per_node = 2\n[torch]\nrelease = "2.15"\n'
        '[workload]\nsteps = [{ op = "set_device" }, { op = "init_process_group" }, { op = "all_reduce" }]\n'
        '[faults]\ninject = [{ kind = "crash", rank = 1, at_s = 500 }]\n',
        encoding="utf-8",
    )
    code, out, err = sweep(capsys, "--scenario", str(path), "--jobs", "1")
    assert code == command.EXIT_CHECK_FAILED, out + err
    assert "--accept-verdict unacted" in out and "--allow" not in out, out
    assert (
        sweep(
            capsys, "--scenario", str(path), "--jobs", "1", "--accept-verdict", "pass", "--accept-verdict", "unacted"
        )[0]
        == 0
    )
