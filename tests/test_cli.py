"""``simnccl run``: the default #199957 table, the JSON contract, --variant, and exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TINY

from simnccl.cli import EXIT_BAD_INPUT, EXIT_EXPECTATIONS, EXIT_OK, main

ANSI = re.compile(r"\x1b\[[0-9;]*m")
VARIANTS_199957 = ["nccl2-default", "legacy", "share-resources"]


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, ANSI.sub("", out), ANSI.sub("", err)


def _subprocess(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "simnccl.cli", "run", *argv], capture_output=True, text=True, timeout=120, cwd=REPO
    )


# ---------------------------------------------------------------------------------------------- default run


def test_no_argument_run_prints_the_199957_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys)
    assert code == EXIT_OK == 0, err
    for name in VARIANTS_199957:
        assert name in out
    assert "after_new_groups" in out
    assert "+2,080.0" in out
    assert "4,672.0" in out
    assert "all expectations hold" in out
    assert "FAIL" not in out


def test_no_argument_run_as_subprocess() -> None:
    proc = _subprocess()
    assert proc.returncode == 0, proc.stderr
    out = ANSI.sub("", proc.stdout)
    for name in VARIANTS_199957:
        assert name in out
    assert "after_new_groups" in out and "+2,080.0" in out and "4,672.0" in out
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------------------- JSON


def _check_variant_schema(variant: dict) -> None:
    for key in ("name", "verdict", "checkpoints", "groups", "hangs"):
        assert key in variant, key
    assert isinstance(variant["name"], str)
    assert variant["verdict"] in ("pass", "fail", "hang", "error")
    assert isinstance(variant["checkpoints"], list)
    for checkpoint in variant["checkpoints"]:
        assert isinstance(checkpoint["name"], str)
        assert checkpoint["devices"]
        for device in checkpoint["devices"]:
            assert isinstance(device["device"], str)
            assert isinstance(device["used_mib"], (int, float))
            assert isinstance(device["free_mib"], (int, float))
    assert isinstance(variant["groups"], list)
    assert isinstance(variant["hangs"], list)
    for hang in variant["hangs"]:
        assert isinstance(hang["rank"], int)
        assert isinstance(hang["op"], str)
        assert isinstance(hang["group"], str)
        assert isinstance(hang["seq"], int)
        assert isinstance(hang["waiting_for"], list)
        assert all(isinstance(r, int) for r in hang["waiting_for"])


def test_json_matches_documented_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--json")
    assert code == EXIT_OK
    payload = json.loads(out)
    assert payload["scenario"] == "pytorch-199957"
    assert isinstance(payload["trace_hash"], str) and payload["trace_hash"]
    assert payload["ok"] is True
    assert [v["name"] for v in payload["variants"]] == VARIANTS_199957
    for variant in payload["variants"]:
        _check_variant_schema(variant)
    nccl2 = payload["variants"][0]
    names = [c["name"] for c in nccl2["checkpoints"]]
    assert names == ["after_init", "after_new_groups", "after_all_reduce"]
    last = nccl2["checkpoints"][-1]["devices"]
    assert [d["device"] for d in last] == ["n0:cuda:0", "n0:cuda:1"]
    assert all(d["used_mib"] == pytest.approx(4672, rel=0.01) for d in last)
    assert all(d["used_mib"] + d["free_mib"] == pytest.approx(96 * 1024, rel=0.05) for d in last)
    assert len(nccl2["groups"]) >= 10  # the default group and nine new_groups
    assert nccl2["hangs"] == []


def test_json_hangs_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys, str(REPO / "scenarios" / "creation-order-hang.toml"), "--json", "--variant", "torch-2.15-default"
    )
    assert code == EXIT_OK
    variant = json.loads(out)["variants"][0]
    _check_variant_schema(variant)
    assert variant["verdict"] == "hang"
    assert sorted(h["rank"] for h in variant["hangs"]) == [0, 1, 2, 3]


def test_json_for_two_scenarios_is_a_list(capsys: pytest.CaptureFixture[str]) -> None:
    scenarios = REPO / "scenarios"
    code, out, _ = _run(
        capsys, str(scenarios / "pytorch-199957.toml"), str(scenarios / "local-sync-split-hang.toml"), "--json"
    )
    assert code == EXIT_OK
    payload = json.loads(out)
    assert [p["scenario"] for p in payload] == ["pytorch-199957", "local-sync-split-hang"]


def test_json_as_subprocess() -> None:
    proc = _subprocess("--json", "--variant", "share-resources")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert [v["name"] for v in payload["variants"]] == ["share-resources"]


# ---------------------------------------------------------------------------------------------- --variant


def test_variant_runs_only_that_variant(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--variant", "legacy", "--json")
    assert code == EXIT_OK
    assert [v["name"] for v in json.loads(out)["variants"]] == ["legacy"]
    code, out, _ = _run(capsys, "--variant", "legacy")
    assert code == EXIT_OK
    assert "legacy" in out
    assert "nccl2-default" not in out and "share-resources" not in out


def test_unknown_variant_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--variant", "nope")
    assert code == EXIT_BAD_INPUT == 2
    assert "'nope'" in err
    assert "nccl2-default" in err  # the variants it does have
    assert out == ""
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------------- bad input


BAD_INPUTS = {
    "malformed": ("[scenario\n", "malformed TOML"),
    "unknown-key": (TINY.replace("gpus_per_node = 2", "gpus_per_node = 2\nspeed = 1"), "cluster.speed: unknown key"),
    "wrong-type": (
        TINY.replace("gpus_per_node = 2", 'gpus_per_node = "two"'),
        "cluster.gpus_per_node: expected an integer",
    ),
    "gpu-kind": (TINY.replace('gpu = "h100-96gb"', 'gpu = "tpu-v5"'), "cluster.gpu: unknown GPU kind 'tpu-v5'"),
    "backend": (
        TINY.replace('backend = "nccl"', 'backend = "mpi"'),
        "workload.steps[1].backend: unknown backend name 'mpi'",
    ),
    "nchannels": (
        TINY.replace('release = "2.15"', 'release = "2.15"\nenv = { NCCL_MAX_NCHANNELS = "x" }'),
        "torch.env.NCCL_MAX_NCHANNELS",
    ),
}


def _one_line(text: str) -> str:
    """rich wraps long messages at 160 columns; undo it for substring checks."""
    return " ".join(text.split())


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_scenario_exits_2_with_message(capsys: pytest.CaptureFixture[str], write_scenario, case: str) -> None:
    text, message = BAD_INPUTS[case]
    path = write_scenario(text, f"{case}.toml")
    code, out, err = _run(capsys, str(path))
    assert code == EXIT_BAD_INPUT
    assert out == ""
    flat = _one_line(err)
    assert flat.startswith("error:")
    assert f"{case}.toml" in flat
    assert _one_line(message) in flat
    assert "Traceback" not in err


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = _run(capsys, str(tmp_path / "nowhere.toml"))
    assert code == EXIT_BAD_INPUT
    assert "nowhere.toml" in err and "no such file" in err
    assert out == ""


def test_directory_path_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, str(tmp_path))
    assert code == EXIT_BAD_INPUT
    assert "cannot read" in err


def test_one_bad_file_among_good_ones_runs_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = _run(capsys, str(REPO / "scenarios" / "pytorch-199957.toml"), str(tmp_path / "absent.toml"))
    assert code == EXIT_BAD_INPUT
    assert out == ""
    assert "absent.toml" in err


@pytest.mark.parametrize("case", ["malformed", "gpu-kind", "nchannels"])
def test_bad_input_as_subprocess_has_no_traceback(write_scenario, case: str) -> None:
    path = write_scenario(BAD_INPUTS[case][0], f"{case}.toml")
    proc = _subprocess(str(path))
    assert proc.returncode == 2
    assert f"{case}.toml" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_non_utf8_file_as_subprocess(tmp_path: Path) -> None:
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfe\x00[scenario]")
    proc = _subprocess(str(path))
    assert proc.returncode == 2
    assert "binary.toml" in proc.stderr and "UTF-8" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------------------- exit 1


def test_failing_expectation_exits_1(capsys: pytest.CaptureFixture[str], write_scenario) -> None:
    path = write_scenario(TINY + '\n[[expect]]\ncheckpoint = "after_init"\nused_mib = 12345\n')
    code, out, err = _run(capsys, str(path))
    assert code == EXIT_EXPECTATIONS == 1, err
    assert "FAIL" in out and "EXPECTATIONS FAILED" in out
    assert "expected 12345" in out
    code, out, _ = _run(capsys, str(path), "--json")
    assert code == EXIT_EXPECTATIONS
    payload = json.loads(out)
    assert payload["ok"] is False
    assert [e["ok"] for e in payload["variants"][0]["expectations"]] == [False, False]


def test_failing_expectation_exits_1_as_subprocess(write_scenario) -> None:
    path = write_scenario(TINY + '\n[[expect]]\nverdict = "hang"\n')
    proc = _subprocess(str(path))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_holding_expectation_exits_0(capsys: pytest.CaptureFixture[str], write_scenario) -> None:
    path = write_scenario(TINY + '\n[[expect]]\nverdict = "pass"\n')
    code, _, err = _run(capsys, str(path))
    assert code == EXIT_OK, err
