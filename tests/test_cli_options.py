"""The flags every command shares (``simnccl.cli_options``): parity across commands, overrides that change the
result and are checked like scenario input (exit 2 naming the flag), one JSON document shape, --quiet,
--version, and help that never imports torch."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TINY

from simnccl import __version__
from simnccl.cli import EXIT_BAD_INPUT, EXIT_EXPECTATIONS, EXIT_OK, command_parsers, main
from simnccl.cli_options import OUTPUT_FLAGS, OVERRIDE_FLAGS, OverrideError, apply_overrides, normalise_argv
from simnccl.result import SCHEMA_VERSION
from simnccl.scenario import ScenarioError, load_scenario

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SCENARIOS = REPO / "scenarios"
P199957 = SCENARIOS / "pytorch-199957.toml"
SCENARIO_COMMANDS = ("run", "explain", "cost", "capture", "real run", "real compare")
OUTPUT_COMMANDS = (*SCENARIO_COMMANDS, "real diff")
HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, ANSI.sub("", out), ANSI.sub("", err)


def _document(text: str, command: str) -> dict:
    doc = json.loads(text)
    assert list(doc) == ["schema", "command", "version", "ok", "summary", "results"]
    assert doc["schema"] == SCHEMA_VERSION and doc["command"] == command and doc["version"] == __version__
    assert doc["ok"] == all(line["ok"] for line in doc["summary"])
    for line in doc["summary"]:
        assert list(line) == ["scenario", "variant", "verdict", "ok", "figure"]
    return doc


def _json_run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = _main(capsys, "run", *argv, "--json")
    assert code in (EXIT_OK, EXIT_EXPECTATIONS), err
    (result,) = _document(out, "run")["results"]
    return result


def _used(variant: dict, checkpoint: str) -> float:
    (found,) = [c for c in variant["checkpoints"] if c["name"] == checkpoint]
    return found["devices"][0]["used_mib"]


def _spec(action: argparse.Action) -> tuple:
    return (type(action), action.dest, action.nargs, action.const, action.default, action.type, action.metavar)


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


# ---------------------------------------------------------------------------------------------- given twice


def test_every_option_of_every_command_that_takes_one_value_refuses_a_second() -> None:
    """argparse keeps the last of ``--world 4 --world 8``; every command refuses it instead (``_StoreOnce``),
    argument groups and the capture and real commands included."""
    one_value = 0
    for command, parser in command_parsers().items():
        for action in parser._actions:
            if action.option_strings and isinstance(action, argparse._StoreAction):
                assert type(action).__name__ == "_StoreOnce", f"{command} {action.option_strings[0]}"
                one_value += 1
    assert one_value > 50  # the walk saw the commands' options, not an empty list


@pytest.mark.parametrize(
    "argv",
    [
        ["run", str(TINY), "--seed", "1", "--seed", "2"],
        ["run", str(TINY), "--release=2.15", "--release", "2.14"],
        ["cost", "--workload", "megatron", "--world", "8", "--world", "16"],
        ["sweep", "--cell-timeout", "5", "--cell-timeout", "6"],
        ["validate", "--json", "a.json", "--json", "b.json"],
        ["capture", "--world", "2", "--world", "4", "x.py"],
        ["real", "run", "--timeout", "3", "--timeout", "4"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_a_one_value_option_given_twice_is_bad_input(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == EXIT_BAD_INPUT
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert re.search(r"error: argument --[a-z-]+: given twice; give it once \(see simnccl [a-z ]+ --help\)$", line)


def test_the_same_option_in_two_parses_is_not_given_twice() -> None:
    parser = command_parsers()["run"]
    for _ in range(2):
        assert parser.parse_args([str(TINY), "--seed", "3"]).seed == 3


# ---------------------------------------------------------------------------------------------- parity


def test_every_scenario_command_takes_every_override_the_same_way() -> None:
    parsers = command_parsers()
    reference = _actions(parsers["run"])
    for command in SCENARIO_COMMANDS:
        actions = _actions(parsers[command])
        for flag in OVERRIDE_FLAGS:
            assert flag in actions, f"{command} lacks {flag}"
            assert _spec(actions[flag]) == _spec(reference[flag]), f"{command} {flag} differs from run's"


def test_every_command_takes_the_output_options_the_same_way() -> None:
    parsers = command_parsers()
    reference = _actions(parsers["run"])
    assert reference["--json"].nargs == "?" and reference["--json"].const == "-"
    for command in OUTPUT_COMMANDS:
        actions = _actions(parsers[command])
        for flag in OUTPUT_FLAGS:
            assert flag in actions, f"{command} lacks {flag}"
            assert _spec(actions[flag]) == _spec(reference[flag]), f"{command} {flag} differs from run's"
        assert actions["-q"] is actions["--quiet"]
    diff = _actions(parsers["real diff"])
    assert _spec(diff["--seed"]) == _spec(reference["--seed"])
    for command in ("real calibrate", "real gpu-scenarios"):
        assert "--version" in _actions(parsers[command])


@pytest.mark.parametrize("argv", [["--version"], ["run", "--version"], ["cost", "--version"], ["explain", "--version"]])
def test_version(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    assert capsys.readouterr().out == f"simnccl {__version__}\n"


@pytest.mark.parametrize("argv", [["capture", "--version"], ["real", "--version"], ["real", "diff", "--version"]])
def test_version_of_the_torch_commands_needs_no_torch(argv: list[str]) -> None:
    code = f"""
import sys
from simnccl.cli import main
try:
    main({argv!r})
except SystemExit as done:
    assert done.code == 0, done.code
print("torch" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"simnccl {__version__}", "False"]


def test_help_does_not_import_torch() -> None:
    """``simnccl capture --help`` and ``simnccl real ... --help`` answer without torch (it takes seconds)."""
    code = """
import sys
from simnccl.cli import main
for argv in (["capture", "--help"], ["real", "--help"], ["real", "run", "--help"], ["real", "diff", "--help"],
             ["run", "--help"], ["cost", "--help"]):
    try:
        main(argv)
    except SystemExit as done:
        assert done.code == 0, (argv, done.code)
print("TORCH", "torch" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "TORCH False"
    assert "usage: simnccl capture" in proc.stdout and "usage: simnccl real run" in proc.stdout
    assert "NumPy" not in proc.stderr


def test_stall_help_matches_the_default() -> None:
    from simnccl.real.launch import RunSettings

    text = " ".join(command_parsers()["real run"].format_help().split())
    assert f"cpu {RunSettings.for_lane('cpu').stall_s:g} s, gpu {RunSettings.for_lane('gpu').stall_s:g} s" in text
    assert "cpu 5 s" in text


# ---------------------------------------------------------------------------------------------- --json placement


def test_json_before_a_scenario_is_not_its_target() -> None:
    assert normalise_argv(["run", "--json", "a.toml", "b.toml"]) == ["run", "--json=-", "a.toml", "b.toml"]
    assert normalise_argv(["run", "a.toml", "--json", "out.json"]) == ["run", "a.toml", "--json", "out.json"]
    assert normalise_argv(["run", "--", "--json", "a.toml"]) == ["run", "--", "--json", "a.toml"]
    stop = lambda token: token.endswith(".py")  # noqa: E731 - capture's rule: the script's own flags are its own
    assert normalise_argv(["--json", "s.py", "--json", "x.toml"], (".py", ".toml"), stop) == [
        "--json=-",
        "s.py",
        "--json",
        "x.toml",
    ]


# ---------------------------------------------------------------------------------------------- overrides


def test_policy_override_changes_the_memory(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _json_run(capsys, str(P199957), "--variant", "nccl2-default")["variants"][0]
    lazy = _json_run(capsys, str(P199957), "--variant", "nccl2-default", "--policy", "lazy-init")["variants"][0]
    assert lazy["policy"] == "lazy-init" and plain["policy"] == "torch-default"
    assert _used(plain, "after_new_groups") - _used(plain, "after_init") == pytest.approx(2080, rel=0.01)
    assert _used(lazy, "after_new_groups") == pytest.approx(_used(lazy, "after_init"))


def test_several_policies_make_one_variant_each_and_expectations_follow(capsys: pytest.CaptureFixture[str]) -> None:
    result = _json_run(capsys, str(P199957), "--variant", "legacy", "--policy", "dedupe", "--policy", "lazy-init")
    names = [v["name"] for v in result["variants"]]
    assert names == ["legacy,policy=dedupe", "legacy,policy=lazy-init"]
    assert [v["policy"] for v in result["variants"]] == ["dedupe", "lazy-init"]
    for variant in result["variants"]:
        assert variant["env"] == {"TORCH_DIST_USE_NCCL2": "0"}
        assert variant["expectations"], "the legacy variant's expectations apply to both"


def test_release_override(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = SCENARIOS / "vllm-startup-check.toml"
    result = _json_run(capsys, str(scenario), "--variant", "torch-2.15-default", "--release", "2.14")
    (variant,) = result["variants"]
    assert variant["release"] == "2.14" and variant["torch_version"] == "2.14.0"
    assert variant["verdict"] == "pass"  # 2.14's lazy communicators leave the margin vLLM checks
    assert _used(variant, "before_memory_check") == pytest.approx(114, abs=1)


def test_gpu_override_changes_the_device_and_its_profile(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _json_run(capsys, str(P199957), "--variant", "legacy")["variants"][0]
    other = _json_run(capsys, str(P199957), "--variant", "legacy", "--gpu", "h100-80gb")["variants"][0]
    assert other["profile"] != plain["profile"] and "h100-80gb" in other["profile"]
    (device,) = [d for d in other["checkpoints"][0]["devices"] if d["device"] == "n0:cuda:0"]
    assert device["used_mib"] + device["free_mib"] == pytest.approx(80 * 1024, rel=0.05)


def test_env_override_is_added_to_every_variant(capsys: pytest.CaptureFixture[str]) -> None:
    result = _json_run(capsys, str(P199957), "--env", "TORCH_DIST_USE_NCCL2=0")
    legacy = next(v for v in result["variants"] if v["name"] == "legacy")
    for variant in result["variants"]:
        assert variant["env"]["TORCH_DIST_USE_NCCL2"] == "0"
        assert _used(variant, "after_new_groups") == pytest.approx(_used(legacy, "after_new_groups"))


SWARM = (
    TINY.replace(
        '  { op = "checkpoint", name = "after_init" },\n',
        '  { op = "checkpoint", name = "after_init" },\n  { op = "all_reduce", size_bytes = 64, repeat = 4 },\n',
    )
    + '\n[faults]\nseed = {seed}\nclasses = ["crash", "stall", "skip"]\nmax_faults = 3\n'
)


def test_seed_override_draws_the_swarm_a_file_with_that_seed_draws(write_scenario) -> None:
    drawn = {}
    for seed in range(1, 8):
        from_file = load_scenario(write_scenario(SWARM.replace("{seed}", str(seed)), f"s{seed}.toml"))
        overridden = apply_overrides(
            load_scenario(write_scenario(SWARM.replace("{seed}", "99"), "base.toml")), argparse.Namespace(seed=seed)
        )
        assert overridden.seed == seed and overridden.faults == from_file.faults
        drawn[seed] = overridden.faults.faults
    assert len(set(drawn.values())) > 1  # the seed really changes the schedule


def test_seed_override_prints_the_new_schedule(capsys: pytest.CaptureFixture[str], write_scenario) -> None:
    path = write_scenario(SWARM.replace("{seed}", "99"))
    code, out, err = _main(capsys, "run", str(path), "--seed", "3", "--json", "--allow", "fail,hang,error")
    assert code == EXIT_OK, err
    assert "fault schedule seed=3" in err
    assert _document(out, "run")["results"][0]["seed"] == 3


def test_variant_override_keeps_the_order_given_once_each(write_scenario) -> None:
    scenario = load_scenario(P199957)
    chosen = apply_overrides(scenario, argparse.Namespace(variant=["share-resources", "legacy", "share-resources"]))
    assert [v.name for v in chosen.variants] == ["share-resources", "legacy"]
    assert [v.name for v in scenario.variants] == ["nccl2-default", "legacy", "share-resources"]  # unchanged


# ---------------------------------------------------------------------------------------------- bad overrides

BAD_OVERRIDES = {
    "policy": (["--policy", "no-such-policy"], "--policy"),
    "release": (["--release", "3.0"], "--release: unknown torch release '3.0'"),
    "gpu": (["--gpu", "tpu-v9"], "--gpu: unknown GPU kind 'tpu-v9'"),
    "seed": (["--seed", "x"], "argument --seed: invalid int value: 'x'"),
    "env-form": (["--env", "NOEQUALS"], "argument --env: expected VAR=VALUE, got 'NOEQUALS'"),
    "env-value": (["--env", "NCCL_MAX_NCHANNELS=x"], "--env: "),
    # a misspelt knob ran torch's default and exited 0; a launcher variable was accepted and changed nothing
    "env-knob": (["--env", "TORCH_DIST_USE_NCL2=0"], "--env: TORCH_DIST_USE_NCL2: unknown environment knob"),
    "env-launcher": (["--env", "RANK=3"], "--env: RANK: RANK is set per rank by the launcher"),
    "variant": (["--variant", "nope"], "no variant 'nope'"),
}


@pytest.mark.parametrize("command", ["run", "explain"])
@pytest.mark.parametrize("case", sorted(BAD_OVERRIDES))
def test_bad_override_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str], command: str, case: str) -> None:
    argv, message = BAD_OVERRIDES[case]
    try:
        code, out, err = _main(capsys, command, str(P199957), *argv)
    except SystemExit as done:  # argparse's own errors
        code, out, err = done.code, *capsys.readouterr()
    assert code == EXIT_BAD_INPUT
    assert out == ""
    assert message in " ".join(err.split())
    assert "Traceback" not in err


@pytest.mark.parametrize("case", ["policy", "release", "gpu", "env-value", "env-knob", "env-launcher"])
def test_bad_cost_override_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str], case: str) -> None:
    argv, message = BAD_OVERRIDES[case]
    code, out, err = _main(capsys, "cost", "--workload", "vllm", "--tp", "2", *argv)
    assert code == EXIT_BAD_INPUT and out == ""
    assert message.split(":")[0] in err


def test_env_may_set_a_knob_the_scenario_declares(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``[torch] extra_env_knobs`` (a knob newer than simnccl's list) applies to ``--env`` as to the file."""
    path = tmp_path / "s.toml"
    path.write_text(TINY.replace('release = "2.15"', 'release = "2.15"\nextra_env_knobs = ["NCCL_FROM_THE_FUTURE"]'))
    code, _, err = _main(capsys, "run", str(path), "--env", "NCCL_FROM_THE_FUTURE=1")
    assert code == EXIT_OK, err
    code, _, err = _main(capsys, "run", str(path), "--env", "NCCL_FROM_THE_PAST=1")
    assert code == EXIT_BAD_INPUT and "--env: NCCL_FROM_THE_PAST: unknown environment knob" in " ".join(err.split())


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["run", str(P199957)], "declare a newer one with [torch] extra_env_knobs in the scenario file"),
        (["cost", "--workload", "vllm", "--tp", "2"], "a newer one can only be set in a scenario file"),
        (["sweep", "--workload", "vllm tp=2"], "a newer one can only be set in a scenario file's own env"),
        (["capture", "--world", "2", str(REPO / "tests" / "capture_examples.py")], "every rank inherits"),
    ],
    ids=["run", "cost", "sweep", "capture"],
)
def test_an_unknown_knob_in_env_says_how_this_command_takes_a_newer_one(
    capsys: pytest.CaptureFixture[str], argv: list[str], hint: str
) -> None:
    """The hint fits the command: only a scenario file has [torch] extra_env_knobs; a capture's ranks inherit
    the environment it runs in."""
    if argv[0] == "capture" and not HAS_TORCH:
        pytest.skip("the capture command checks torch is installed first")
    at = 3 if argv[0] == "capture" else len(argv)  # capture: flags before the script
    code, out, err = _main(capsys, *argv[:at], "--env", "NCCL_FROM_THE_FUTURE=1", *argv[at:])
    assert code == EXIT_BAD_INPUT and out == ""
    assert "unknown environment knob 'NCCL_FROM_THE_FUTURE'" in err and hint in " ".join(err.split()), err


def test_bad_json_target_exits_2_before_running(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = _main(capsys, "run", str(P199957), "--json", str(tmp_path / "missing" / "out.json"))
    assert code == EXIT_BAD_INPUT and out == ""
    assert "--json: no such directory" in err


@pytest.mark.skipif(not HAS_TORCH, reason="the torch commands check torch is installed first")
@pytest.mark.parametrize("case", ["policy", "release", "gpu", "env-knob", "env-launcher"])
def test_bad_capture_and_real_overrides_exit_2(capsys: pytest.CaptureFixture[str], case: str) -> None:
    argv, message = BAD_OVERRIDES[case]
    script = str(REPO / "tests" / "capture_examples.py")
    for argv_of_command in (["capture", "--world", "2", *argv, script, "mesh2d"], ["real", "run", str(P199957), *argv]):
        code, out, err = _main(capsys, *argv_of_command)
        assert code == EXIT_BAD_INPUT and out == ""
        assert message.split(":")[0] in err and "Traceback" not in err


def test_override_error_names_its_flag() -> None:
    with pytest.raises(OverrideError, match=r"^--gpu: unknown GPU kind"):
        apply_overrides(load_scenario(P199957), argparse.Namespace(gpu="nope"))
    with pytest.raises(ScenarioError, match="--variant: no variant 'x'"):
        apply_overrides(load_scenario(P199957), argparse.Namespace(variant=["x"]))


# ---------------------------------------------------------------------------------------------- every command's JSON


def test_explain_json_and_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = SCENARIOS / "creation-order-hang.toml"
    code, out, err = _main(capsys, "explain", str(scenario), "--json")
    assert code == EXIT_OK, err
    doc = _document(out, "explain")
    (result,) = doc["results"]
    for variant in result["variants"]:
        assert set(variant) == {"name", "verdict", "ok", "explanation", "hangs", "errors", "slowdowns"}
        assert variant["explanation"].startswith(variant["name"])
    assert [line["variant"] for line in doc["summary"]] == [v["name"] for v in result["variants"]]
    code, out, _ = _main(capsys, "explain", str(scenario), "--quiet")
    assert len(out.splitlines()) == len(result["variants"])


def test_cost_json_quiet_variant_env_and_seed(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["cost", "--workload", "vllm", "--tp", "2", "--policy", "lazy-init"]
    code, out, err = _main(capsys, *base, "--json")
    assert code == EXIT_OK, err
    doc = _document(out, "cost")
    assert [line["variant"] for line in doc["summary"]] == ["torch-default", "legacy", "lazy-init"]
    (result,) = doc["results"]
    assert [c["column"] for c in result["columns"]] == ["torch-default", "legacy", "lazy-init"]
    code, out, _ = _main(capsys, *base, "--quiet", "--variant", "legacy", "--variant", "lazy-init")
    assert [line.split("  ")[1] for line in out.splitlines()] == ["legacy", "lazy-init"]
    code, out, _ = _main(capsys, *base, "--json", "--env", "TORCH_DIST_USE_NCCL2=0", "--seed", "7")
    (result,) = _document(out, "cost")["results"]
    default, legacy, _ = result["columns"]
    assert default["env"] == {"TORCH_DIST_USE_NCCL2": "0"} and result["seed"] == 7
    assert default["summary"]["nccl_mib"] == legacy["summary"]["nccl_mib"]  # the env made the default legacy
    code, _, err = _main(capsys, *base, "--variant", "dedupe")
    assert code == EXIT_BAD_INPUT and "--variant: no column 'dedupe'" in err


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_capture_json_document_and_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    script = str(REPO / "tests" / "capture_examples.py")
    knobs = ["mesh2d", "--dp", "2", "--tp", "2"]
    argv = ["capture", "--world", "4", "--simulate", "--policy", "dedupe", "--seed", "5", "--json", script, *knobs]
    code, out, err = _main(capsys, *argv)
    assert code == EXIT_OK, err
    doc = _document(out, "capture")
    (record,) = doc["results"]
    assert record["capture"]["world_size"] == 4
    assert record["simulated"]["seed"] == 5
    assert [v["policy"] for v in record["simulated"]["variants"]] == [
        "as-captured(dedupe)"
    ]  # its decisions, replayed as made
    assert [line["variant"] for line in doc["summary"]] == ["default"]
    code, out, err = _main(capsys, "capture", "--world", "4", "--quiet", script, *knobs)
    assert code == EXIT_OK, err
    assert out.splitlines() == ["captured  capture  captured  ok  4 ranks, 1 distinct program(s)"]


@pytest.mark.real
@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_real_diff_json_document_and_quiet(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Generous real-side limits: this test pins the output's shape, not how fast a loaded CI machine runs gloo.
    slack = ("--stall", "60", "--timeout", "120")
    record = tmp_path / "diff.json"
    code, out, err = _main(
        capsys, "real", "diff", "--seed", "2", "--only", "0", "--only", "2", "--quiet", f"--json={record}", *slack
    )
    # On failure, the whole document (both sides of a disagreeing case) is the message: a loaded CI machine's
    # timeout and a simulator bug must be told apart from the CI log alone.
    assert code == EXIT_OK, out + err + (record.read_text() if record.exists() else "")
    assert [line.split("  ")[:2] for line in out.splitlines()] == [
        ["diff seed 2", "seed2-case0"],
        ["diff seed 2", "seed2-case2"],
    ]
    code, out, err = _main(capsys, "real", "diff", "--seed", "2", "--only", "0", "--json", *slack)
    assert code == EXIT_OK, err
    doc = _document(out, "real diff")
    (result,) = doc["results"]
    assert result["seed"] == 2 and [c["case"] for c in result["cases"]] == ["seed2-case0"]
    assert doc["summary"][0]["verdict"] == result["cases"][0]["kind"]


@pytest.mark.parametrize(
    ("argv", "prog", "message"),
    [
        ([], "simnccl", "the following arguments are required: command"),
        (["bogus"], "simnccl", "argument command: invalid choice: 'bogus'"),
        (["run", "--bogus"], "simnccl run", "unrecognized arguments: --bogus"),
        (["run", "--allow", "nope"], "simnccl run", "argument --allow: unknown verdict(s) nope"),
        (["validate", "--zzz"], "simnccl validate", "unrecognized arguments: --zzz"),
        (["sweep", "--jobs", "x"], "simnccl sweep", "argument --jobs: invalid int value: 'x'"),
        (["capture", "x.py"], "simnccl capture", "the following arguments are required: --world"),
        (["capture", "--world", "2"], "simnccl capture", "expected -m MODULE or a script path"),
        (["real"], "simnccl real", "the following arguments are required: command"),
        (["real", "compare"], "simnccl real compare", "the following arguments are required: scenario"),
    ],
)
def test_a_usage_error_is_one_line_pointing_at_help(
    capsys: pytest.CaptureFixture[str], argv: list[str], prog: str, message: str
) -> None:
    """Bad input is one line: argparse printed the whole usage before the error (eleven lines for sweep)."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == EXIT_BAD_INPUT and out == "", err
    assert err.startswith(f"{prog}: error: {message}") and err.endswith(f" (see {prog} --help)\n"), err
    assert err.count("\n") == 1 and "usage:" not in err, err


@pytest.mark.parametrize("argv", [["--help"], ["sweep", "--help"], ["real", "compare", "-h"], ["capture", "--help"]])
def test_help_is_still_the_whole_usage(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 0 and out.startswith("usage: simnccl") and "options:" in out and err == "", err


def test_the_replays_usage_error_is_one_line_too(capsys: pytest.CaptureFixture[str]) -> None:
    from simnccl.testing.replay import main as replay_main

    with pytest.raises(SystemExit) as exited:
        replay_main(["case.json", "--bogus"])
    err = capsys.readouterr().err
    prog = "python -m simnccl.testing.replay"
    assert exited.value.code == EXIT_BAD_INPUT and err.startswith(f"{prog}: error: unrecognized arguments: --bogus")
    assert err.count("\n") == 1 and "usage:" not in err, err


def test_policies_given_past_the_variant_limit_are_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Each ``--policy`` of several is one variant per scenario variant: 300 of them ran 300 variants (the real
    tier a real run each) past ``max_variants``, which a [matrix]'s product is held to before it is taken."""
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(TINY)
    policies = [flag for n in range(1, 301) for flag in ("--policy", f"budget({n})")]
    code, _, err = _main(capsys, "run", str(scenario), *policies)
    assert code == EXIT_BAD_INPUT
    assert "--policy: 1 variant(s) x 300 policies = 300 variants exceeds the limit max_variants = 256" in err
