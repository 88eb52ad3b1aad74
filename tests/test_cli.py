"""``simnccl run``: the default #199957 table, the JSON contract, --variant, exit codes 0 / 1 / 2, streamed output
that stays readable at scale (summaries at 16+ ranks, one line per hang site, no hard wraps when piped), --quiet."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, TINY, at_a_terminal

from simnccl.cli import EXIT_BAD_INPUT, EXIT_EXPECTATIONS, EXIT_OK, main
from simnccl.result import SCHEMA_VERSION

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
    assert "+2,075.0" in out  # the issue's +2080 within 1 %: NCCL's mechanics plus the fitted 0.56 MiB
    assert "4,672.0" in out
    assert "all expectations hold" in out
    assert "FAIL" not in out


def test_no_argument_run_as_subprocess() -> None:
    proc = _subprocess()
    assert proc.returncode == 0, proc.stderr
    out = ANSI.sub("", proc.stdout)
    for name in VARIANTS_199957:
        assert name in out
    assert "after_new_groups" in out and "+2,075.0" in out and "4,672.0" in out
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


def _document(out: str, command: str = "run") -> dict:
    """The one JSON document every command writes; checks its envelope."""
    doc = json.loads(out)
    assert doc["schema"] == SCHEMA_VERSION and doc["command"] == command
    assert isinstance(doc["version"], str) and isinstance(doc["ok"], bool)
    assert doc["ok"] == all(line["ok"] for line in doc["summary"])
    for line in doc["summary"]:
        assert set(line) == {"scenario", "variant", "verdict", "ok", "figure"}
    assert isinstance(doc["results"], list)
    return doc


def _result(out: str) -> dict:
    (result,) = _document(out)["results"]
    return result


def test_json_matches_documented_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--json")
    assert code == EXIT_OK
    doc = _document(out)
    assert [line["variant"] for line in doc["summary"]] == VARIANTS_199957
    (payload,) = doc["results"]
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
    variant = _result(out)["variants"][0]
    _check_variant_schema(variant)
    assert variant["verdict"] == "hang"
    assert sorted(h["rank"] for h in variant["hangs"]) == [0, 1, 2, 3]


def test_json_is_one_document_for_one_scenario_or_several(capsys: pytest.CaptureFixture[str]) -> None:
    scenarios = REPO / "scenarios"
    code, out, _ = _run(
        capsys, str(scenarios / "pytorch-199957.toml"), str(scenarios / "local-sync-split-hang.toml"), "--json"
    )
    assert code == EXIT_OK
    doc = _document(out)
    assert [p["scenario"] for p in doc["results"]] == ["pytorch-199957", "local-sync-split-hang"]
    assert {line["scenario"] for line in doc["summary"]} == {"pytorch-199957", "local-sync-split-hang"}
    code, out, _ = _run(capsys, str(scenarios / "local-sync-split-hang.toml"), "--json")
    assert [p["scenario"] for p in _document(out)["results"]] == ["local-sync-split-hang"]


def test_json_to_a_file_keeps_the_text(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    code, out, _ = _run(capsys, "--variant", "legacy", "--json", str(target))
    assert code == EXIT_OK
    assert "all expectations hold" in out and "summary:" in out
    assert [v["name"] for v in _document(target.read_text())["results"][0]["variants"]] == ["legacy"]


def test_json_right_before_a_scenario_reads_the_scenario(capsys: pytest.CaptureFixture[str], write_scenario) -> None:
    path = write_scenario(TINY)
    before = path.read_text()
    code, out, _ = _run(capsys, "--json", str(path))
    assert code == EXIT_OK
    assert _result(out)["scenario"] == "tiny"
    assert path.read_text() == before  # never overwritten with the JSON


def test_json_as_subprocess() -> None:
    proc = _subprocess("--json", "--variant", "share-resources")
    assert proc.returncode == 0, proc.stderr
    payload = _result(proc.stdout)
    assert [v["name"] for v in payload["variants"]] == ["share-resources"]


# ---------------------------------------------------------------------------------------------- --variant


def test_variant_runs_only_that_variant(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--variant", "legacy", "--json")
    assert code == EXIT_OK
    assert [v["name"] for v in _result(out)["variants"]] == ["legacy"]
    code, out, _ = _run(capsys, "--variant", "legacy")
    assert code == EXIT_OK
    assert "legacy" in out
    assert "nccl2-default" not in out and "share-resources" not in out


def test_expectations_of_variants_left_out_are_named_as_not_checked(
    capsys: pytest.CaptureFixture[str], write_scenario: Callable[..., Path]
) -> None:
    """``--variant a`` with an expectation only on variant b printed "all expectations hold", exit 0: b's failing
    expectation was skipped without a word."""
    variants = '[[variants]]\nname = "a"\n[[variants]]\nname = "b"\n'
    path = write_scenario(TINY + variants + '[[expect]]\nvariants = ["b"]\ncheckpoint = "after_init"\nused_mib = 1\n')
    assert main(["run", str(path), "--variant", "a", "-q"]) == EXIT_OK
    err = capsys.readouterr().err
    assert "expect[0] not checked: --variant left out every variant it names" in err, err
    assert main(["run", str(path), "-q"]) == EXIT_EXPECTATIONS  # b's expectation fails where b runs
    assert "not checked" not in capsys.readouterr().err


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
    doc = _document(out)
    assert doc["ok"] is False and [line["ok"] for line in doc["summary"]] == [False]
    payload = doc["results"][0]
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


# ---------------------------------------------------------------------------------------------- --quiet, summary


VLLM_CHECK = REPO / "scenarios" / "vllm-startup-check.toml"


def test_quiet_prints_one_line_per_variant(capsys: pytest.CaptureFixture[str]) -> None:
    from simnccl.scenario import load_scenario

    names = [v.name for v in load_scenario(VLLM_CHECK).variants]
    code, out, err = _run(capsys, str(VLLM_CHECK), "--quiet")
    assert code == EXIT_OK, err
    lines = out.splitlines()
    assert len(lines) == len(names) == 13
    for line, name in zip(lines, names, strict=True):
        scenario, variant, verdict, ok, figure = line.split("  ", 4)
        assert (scenario, variant, ok) == ("vllm-startup-check", name, "ok")
        assert verdict in ("pass", "fail")
        assert "MiB/GPU" in figure
    assert lines[0].startswith("vllm-startup-check  torch-2.15-default  fail  ok  peak 2,912.0 MiB/GPU")
    assert err == ""  # no progress bar, no notes


def test_quiet_line_says_fail_and_names_the_failed_expectation(
    capsys: pytest.CaptureFixture[str], write_scenario
) -> None:
    path = write_scenario(TINY + '\n[[expect]]\ncheckpoint = "after_init"\nused_mib = 12345\n')
    code, out, _ = _run(capsys, str(path), "--quiet")
    assert code == EXIT_EXPECTATIONS
    (line,) = out.splitlines()
    assert line.startswith("tiny  default  pass  FAIL  peak ")
    assert "expect[0]:" in line and "expected 12345" in line


def test_normal_output_ends_with_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys)
    assert code == EXIT_OK
    tail = out.splitlines()[-4:]
    assert tail[0] == "summary:"
    assert [line.split()[1] for line in tail[1:]] == VARIANTS_199957
    assert all(line.startswith("  pytorch-199957  ") for line in tail[1:])


def test_each_variant_is_printed_as_soon_as_it_finishes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streaming: when a variant starts, the previous one's block is already on stdout."""
    import simnccl.runner as runner

    seen_before: dict[str, str] = {}
    original = runner.run_variant

    def spying(scenario, variant, **kwargs):
        seen_before[variant.name] = capsys.readouterr().out
        return original(scenario, variant, **kwargs)

    monkeypatch.setattr(runner, "run_variant", spying)
    assert main(["run"]) == EXIT_OK
    assert "pytorch-199957" in seen_before["nccl2-default"]  # the header comes first
    assert "nccl2-default" in seen_before["legacy"] and "+2,075.0" in seen_before["legacy"]
    assert "legacy" in seen_before["share-resources"]


# ---------------------------------------------------------------------------------------------- scale


def _ranks_scenario(nodes: int, gpus: int, extra: str = "", steps: str = "") -> str:
    return f"""\
[scenario]
name = "wide"

[cluster]
gpu = "h100-80gb"
nodes = {nodes}
gpus_per_node = {gpus}

[torch]
release = "2.15"

[workload]
steps = [
  {{ op = "set_device" }},
  {{ op = "init_process_group", backend = "nccl" }},
  {{ op = "new_group", ranks = [0, 1, 2, 3, 4, 5, 6, 7], bind = "tp", group_desc = "tp" }},
  {{ op = "checkpoint", name = "after_tp" }},
  {steps}
]
{extra}
"""


def test_sixteen_rank_table_is_summarised_not_truncated(capsys: pytest.CaptureFixture[str], write_scenario) -> None:
    path = write_scenario(_ranks_scenario(2, 8))
    code, out, _ = _run(capsys, str(path))
    assert code == EXIT_OK
    assert "…" not in out  # no cell cut short
    assert "used MiB over 16 devices" in out
    row = next(line for line in out.splitlines() if "after_tp" in line and "│" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == ["after_tp", "16", "704.6", "704.6", "935.1", "", "n0:cuda:0 (+7)"]
    assert "n0:cuda:[0-7]" in out and "n1:cuda:[0-7]" in out  # the two device classes
    assert max(len(line) for line in out.splitlines()) < 200


def test_wide_run_json_keeps_every_device(capsys: pytest.CaptureFixture[str], write_scenario) -> None:
    path = write_scenario(_ranks_scenario(2, 8))
    code, out, _ = _run(capsys, str(path), "--json")
    assert code == EXIT_OK
    (checkpoint,) = _result(out)["variants"][0]["checkpoints"]
    assert len(checkpoint["devices"]) == 16


def test_32_rank_hang_is_summarised(capsys: pytest.CaptureFixture[str], write_scenario) -> None:
    """A stalled rank in a 32-rank world: one line per place ranks wait, one per kind of abort — not 64 lines."""
    path = write_scenario(
        _ranks_scenario(
            4,
            8,
            extra='[faults]\ninject = [{ kind = "stall", rank = 5, at_op = 5 }]\n',
            steps='{ op = "all_reduce", size_bytes = 32, repeat = 3 },',
        )
    )
    code, out, err = _run(capsys, str(path), "--allow", "hang,error")  # the stall is the point, not a failure
    assert code == EXIT_OK, err
    hangs = [line for line in out.splitlines() if line.startswith("  hang:")]
    timeouts = [line for line in out.splitlines() if line.startswith("  timeout:")]
    assert len(hangs) == 2 and len(timeouts) == 1
    assert hangs[0].startswith("  hang: ranks 0-4, 6-31 in all_reduce(size_bytes=32)")
    assert "waiting for rank 5" in hangs[0]
    assert hangs[1].startswith("  hang: rank 5 in all_reduce")
    assert timeouts[0].startswith("  timeout: ranks 0-4, 6-31 in all_reduce")
    assert "rank 0's message; the others' alike" in timeouts[0]
    assert len(out.splitlines()) < 40


def test_per_device_expectations_at_scale_are_one_line(capsys: pytest.CaptureFixture[str], write_scenario) -> None:
    path = write_scenario(_ranks_scenario(2, 8, extra='[[expect]]\ncheckpoint = "after_tp"\nused_mib = 704.6\n'))
    code, out, _ = _run(capsys, str(path))
    assert code == EXIT_EXPECTATIONS  # node 0 holds the tp group: 8 devices fail, 8 hold
    lines = [line for line in out.splitlines() if line.startswith(("  FAIL expect[0]", "  ok   expect[0]"))]
    assert len(lines) == 6  # 4 failures, "... and 4 more", one line for the 8 that hold
    assert lines[4] == "  FAIL expect[0]: ... and 4 more (every check: --json)"
    assert lines[5].startswith("  ok   expect[0]: 8 of 16 checks hold, e.g. n1:cuda:0")


def test_piped_output_is_not_hard_wrapped() -> None:
    """A long message stays on one line when stdout is a pipe, so grep finds it."""
    proc = _subprocess(str(VLLM_CHECK), "--variant", "torch-2.15-default")
    assert proc.returncode == 0, proc.stderr
    message = (
        "Free memory on device cuda:0 (8.92/11.76 GiB) on startup is less than desired GPU memory utilization "
        "(0.9, 10.58 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
    )
    assert any(message in line for line in proc.stdout.splitlines())


# ---------------------------------------------------------------------------------------------- progress


def test_progress_bar_on_stderr_only_at_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = _run(capsys, str(VLLM_CHECK))
    assert code == EXIT_OK and err == ""  # stderr is not a terminal here: no bar
    at_a_terminal(monkeypatch)
    code, out, err = _run(capsys, str(VLLM_CHECK))
    assert code == EXIT_OK
    assert "variants" in err and "13/13" in err
    assert "variants" not in out.replace("13 variants", "")  # the bar never goes to stdout
    code, out, err = _run(capsys, str(VLLM_CHECK), "--quiet")
    assert err == "" and len(out.splitlines()) == 13  # --quiet: no bar even at a terminal


# ---------------------------------------------------------------------------------------------- help texts


def test_fr_dir_writes_the_layout_its_help_names(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from simnccl.cli import command_parsers

    help_text = " ".join(command_parsers()["run"].format_help().split())
    assert "FR_DIR/<scenario>-<variant>/rank_<r>" in help_text
    scenario = REPO / "scenarios" / "hang-missing-rank.toml"
    code, _, err = _run(capsys, str(scenario), "--variant", "nccl2-default", "--fr-dir", str(tmp_path))
    assert code == EXIT_OK, err
    assert sorted(p.name for p in (tmp_path / "hang-missing-rank-nccl2-default").iterdir()) == [
        f"rank_{r}" for r in range(4)
    ]


# ------------------------------------------------------------------------------------ stdout is the document's

_PRINTING_POLICY = """
import dataclasses
from simnccl.policy import BasePolicy

print("IMPORT NOISE")

@dataclasses.dataclass(frozen=True)
class Prints(BasePolicy):
    name: str = "prints"

    def on_group(self, request, decision):
        print("HOOK NOISE")
        return decision
"""


def _cli(tmp_path: Path, *argv: str, **kwargs) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    (tmp_path / "noisy_policy.py").write_text(_PRINTING_POLICY)
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "simnccl.cli", *argv], text=True, timeout=300, cwd=REPO, env=env, **kwargs
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--policy", "noisy_policy:Prints", "--variant", "legacy", "--json", "-"],
        ["sweep", "--workload", "vllm tp=2", "--policy", "noisy_policy:Prints", "--jobs", "2", "--json", "-"],
        ["sweep", "--workload", "vllm tp=2", "--policy", "noisy_policy:Prints", "--jobs", "1", "--csv", "-"],
    ],
    ids=["run", "sweep-worker-processes", "sweep-csv"],
)
def test_what_a_policy_prints_goes_to_stderr_when_the_document_takes_stdout(tmp_path: Path, argv: list[str]) -> None:
    """A policy that prints (at import, in a hook, in a sweep's worker process) once put its lines before the
    document, and the command exited 0 with stdout no reader could parse."""
    proc = _cli(tmp_path, *argv, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert "NOISE" not in proc.stdout
    assert "HOOK NOISE" in proc.stderr
    if "--csv" in argv:
        assert proc.stdout.splitlines()[0].startswith("#") or "," in proc.stdout.splitlines()[0]
    else:
        document = json.loads(proc.stdout)
        assert document["results"] if argv[0] == "run" else document["rows"]


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--variant", "legacy", "--json", "-"],
        # capture and real: dispatched before the other commands' stdout handling, they exited 0, the document lost
        ["capture", "--world", "2", "--json", "-", str(REPO / "tests" / "capture_examples.py"), "mesh2d"],
        ["real", "run", "--json", "-", "tiny.toml"],
    ],
    ids=["run", "capture", "real-run"],
)
def test_a_closed_stdout_with_the_document_on_it_is_bad_input(tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "tiny.toml").write_text(TINY)
    argv = [str(tmp_path / a) if a == "tiny.toml" else a for a in argv]
    proc = _cli(
        tmp_path,
        *argv,
        stdout=None,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        close_fds=True,
        preexec_fn=lambda: __import__("os").close(1),
    )
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: stdout is closed, so the document has nowhere to go; give --json (or --csv) a FILE"
    )


@pytest.mark.parametrize(
    "argv", [["validate", "--json", "-"], ["cost", "--workload", "vllm", "--tp", "2", "--json", "-"]]
)
def test_every_commands_document_reaches_stdout_while_it_owns_stdout(tmp_path: Path, argv: list[str]) -> None:
    """validate wrote its document through the stdout that ``document_owns_stdout`` points at stderr."""
    proc = _cli(tmp_path, *argv, capture_output=True)
    assert proc.returncode in (0, 1), proc.stderr  # validate: 1 while two published points miss its goal
    assert json.loads(proc.stdout)


@pytest.mark.parametrize(
    "argv",
    [["validate"], ["run", "--variant", "legacy"], ["explain"], ["cost", "--workload", "vllm", "--tp", "2"]],
    ids=["validate", "run", "explain", "cost"],
)
def test_json_never_writes_over_a_script(tmp_path: Path, argv: list[str]) -> None:
    """``--help`` says a script right after ``--json`` is an input; only capture read it so, and the other
    commands wrote their document over the user's ``train.py``."""
    script = tmp_path / "train.py"
    script.write_text("print('the user's training script')\n")
    proc = _cli(tmp_path, *argv, "--json", str(script), capture_output=True)
    assert proc.returncode == 2, proc.stderr
    assert "names a script or a scenario, not the JSON file" in proc.stderr
    assert script.read_text() == "print('the user's training script')\n"


def test_a_policys_explanation_stays_one_line_in_its_explain_table_cell(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newline in an explanation made its cell two lines, and an ESC (escaped only when printed) pushed the cell
    past its border (found by fuzzing)."""
    (tmp_path / "talky_policy.py").write_text(
        "import dataclasses\nfrom simnccl.policy import BasePolicy\n\n"
        "@dataclasses.dataclass(frozen=True)\nclass Talky(BasePolicy):\n    name: str = 'talky'\n\n"
        "    def on_group(self, request, decision):\n"
        "        return dataclasses.replace(decision, explanation='first\\nsecond \\x1b[31mred')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = _run(capsys, "--variant", "legacy", "--policy", "talky_policy:Talky", "--explain")
    assert code in (0, 1), err
    rows = [line for line in out.splitlines() if "first" in line]
    assert rows and all("first\\nsecond \\x1b[31mred" in row for row in rows), out
    assert "\x1b" not in out and not any(line.strip().startswith("second") for line in out.splitlines())


def test_a_multi_line_error_message_is_one_line_that_says_lines_were_left_out() -> None:
    """The report's error line is the message's last line (torch's most specific): a ``raise`` op's message of
    several lines lost its headline without a word."""
    from simnccl.report import error_lines

    errors = [
        {"rank": r, "kind": "check", "type": "AssertionError", "message": "headline\ndetail", "op": "raise(...)"}
        for r in (0, 1)
    ]
    (line,) = error_lines(errors)
    assert line == (
        "check: ranks 0-1 in raise(...): AssertionError: detail (the last of its 2 lines; --json has them all) "
        "(rank 0's message; the others' alike)"
    )
    single = [{**errors[0], "message": "one line"}]
    assert error_lines(single) == ["check: rank 0 in raise(...): AssertionError: one line"]
