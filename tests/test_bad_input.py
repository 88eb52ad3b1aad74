"""Bad input never crashes, stalls or exhausts memory: each signature issue 10 measured ends as exit 2 naming
the file, the key and what was expected — plus the exit codes of the guard (70 a bug, 130 Ctrl-C, 141 a reader
that went away) and of verdicts nobody asked for (1 unless allowed).

Each test runs ``simnccl run`` in-process on a small scenario with one thing wrong; every one is fast (the
limits are checked before anything is expanded or simulated).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SCENARIOS_DIR, TINY, communicate_or_kill

from simnccl import runner
from simnccl.cli import main
from simnccl.cli_guard import EXIT_INTERRUPTED, EXIT_OUTPUT_CLOSED, EXIT_SOFTWARE, guarded
from simnccl.engine import Engine, EngineGuardError, Limits
from simnccl.faults import Fault, FaultSchedule
from simnccl.limits import current as current_limits
from simnccl.ops import AllGather
from simnccl.report import print_result
from simnccl.scenario import ScenarioError, load_scenario

WriteScenario = Callable[..., Path]


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("SIMNCCL_LIMIT_"):
            monkeypatch.delenv(name)


def _steps(*steps: str, gpus: int = 2, extra: str = "", cluster: str = "") -> str:
    """TINY with its steps replaced, ``cluster`` lines added to [cluster] and ``extra`` appended."""
    head = TINY.split("[workload]")[0].replace("gpus_per_node = 2", f"gpus_per_node = {gpus}\n{cluster}")
    return f"{head}[workload]\nsteps = [\n" + ",\n".join(steps) + f"\n]\n{extra}"


BASE_STEPS = ('{ op = "set_device" }', '{ op = "init_process_group", backend = "nccl" }')


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, re.sub(r"\s+", " ", err)  # rich wraps long lines when output is captured


def _bad(capsys: pytest.CaptureFixture[str], write_scenario: WriteScenario, text: str, key: str, *expected: str) -> str:
    """Exit 2, one message naming the file and ``key`` (``file: key: ...``) and every ``expected`` text."""
    path = write_scenario(text)
    code, out, err = _run(capsys, str(path))
    assert code == 2, (out, err)
    assert "Traceback" not in err, err
    assert f"{path}: {key}: " in err if key else str(path) in err, err
    for wanted in expected:
        assert wanted in err, f"{wanted!r} not in {err!r}"
    return err


# ---------------------------------------------------------------------------------------------- parsing


def test_deeply_nested_toml_is_exit_2_naming_the_nesting_limit(capsys, write_scenario) -> None:
    deep = "x = " + "[" * 5000 + "1" + "]" * 5000 + "\n"
    _bad(capsys, write_scenario, deep + TINY, "", "max_nesting_depth")


def test_nesting_past_the_limit_but_parseable_is_exit_2(capsys, write_scenario) -> None:
    deep = "x = " + "[" * 40 + "1" + "]" * 40 + "\n"
    _bad(capsys, write_scenario, deep + TINY, "", "nested 41 deep", "max_nesting_depth = 32")


def test_a_file_past_the_size_limit_is_refused_before_reading(capsys, write_scenario, monkeypatch) -> None:
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_FILE_BYTES", "100")
    _bad(capsys, write_scenario, TINY, "", "max_file_bytes = 100", "SIMNCCL_LIMIT_MAX_FILE_BYTES")


def test_limits_and_values_are_printed_with_every_digit(capsys, write_scenario, monkeypatch) -> None:
    """``%g`` printed a limit of 1,048,576 as 1.04858e+06, and a value one second past a limit as equal to it."""
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_FILE_BYTES", "1048576")
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_SIM_TIME_S", "2592000")
    big = TINY + "#" * 1_048_600 + "\n"
    _bad(capsys, write_scenario, big, "", "max_file_bytes = 1048576 (")
    text = _steps(*BASE_STEPS, '{ op = "compute", seconds = 2592001 }')
    _bad(capsys, write_scenario, text, "workload.steps[2].seconds", "2592001 of seconds exceeds", "= 2592000 (")
    text = _steps(*BASE_STEPS, '{ op = "memory_check", gpu_memory_utilization = 1.0000001 }')
    _bad(capsys, write_scenario, text, "workload.steps[2].gpu_memory_utilization", "got 1.0000001")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/stdin"])
def test_a_device_as_the_scenario_file_is_exit_2(capsys, device: str) -> None:
    code, _, err = _run(capsys, device)
    assert code == 2
    assert f"{device}: cannot read: not a regular file" in err


def test_an_integer_of_thousands_of_digits_is_exit_2(capsys, write_scenario) -> None:
    _bad(capsys, write_scenario, TINY.replace('name = "tiny"', 'name = "tiny"\nseed = ' + "9" * 5000), "", "digits")


# ---------------------------------------------------------------------------------------------- markup


def test_markup_in_a_value_is_printed_literally(capsys, write_scenario) -> None:
    _bad(capsys, write_scenario, TINY.replace('gpu = "h100-96gb"', 'gpu = "[/x]"'), "cluster.gpu", "'[/x]'")


def test_markup_that_would_style_is_not_eaten(capsys, write_scenario) -> None:
    err = _bad(capsys, write_scenario, TINY.replace('gpu = "h100-96gb"', 'gpu = "[bold]h100"'), "cluster.gpu")
    assert "'[bold]h100'" in err


def test_markup_in_the_file_name_is_printed_literally(capsys, tmp_path: Path) -> None:
    folder = tmp_path / "["
    folder.mkdir()
    path = folder / "x].toml"  # the path contains "[/x]"
    path.write_text(TINY.replace('gpu = "h100-96gb"', 'gpu = "nope"'), encoding="utf-8")
    code, _, err = _run(capsys, str(path))
    assert code == 2 and f"{path}: cluster.gpu:" in err


def test_markup_in_names_and_labels_prints_in_the_report(capsys, write_scenario) -> None:
    text = TINY.replace('name = "tiny"', 'name = "[/x]"').replace('name = "after_init"', 'name = "[bold]x[/y]"')
    code, out, err = _run(capsys, str(write_scenario(text)))
    assert code == 0, err
    assert "[/x]" in out and "[bold]x[/y]" in out


def test_markup_in_explain_output_is_printed_literally(capsys, write_scenario) -> None:
    text = _steps(
        *BASE_STEPS,
        '{ op = "new_group", ranks = [0, 1], bind = "[/x]", group_desc = "[/x]" }',
        '{ op = "all_reduce", group = "[/x]", on_ranks = [0] }',
    )
    code = main(["explain", str(write_scenario(text))])
    out = capsys.readouterr().out
    assert code == 1 and "[/x]" in out  # 1: rank 1 never joins the all_reduce, a hang nobody asked for


# ---------------------------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("value", ["1e308", "inf", "nan", "-1", "-1e14"])
def test_size_mib_out_of_range_is_exit_2(capsys, write_scenario, value: str) -> None:
    text = _steps(*BASE_STEPS, f'{{ op = "all_reduce", size_mib = {value} }}')
    _bad(capsys, write_scenario, text, "workload.steps[2].size_mib")


@pytest.mark.parametrize("value", ["-100000000000000", "-1"])
def test_negative_size_bytes_is_exit_2(capsys, write_scenario, value: str) -> None:
    text = _steps(*BASE_STEPS, f'{{ op = "all_reduce", size_bytes = {value} }}')
    _bad(capsys, write_scenario, text, "workload.steps[2].size_bytes", "non-negative")


def test_size_bytes_as_a_float_is_exit_2(capsys, write_scenario) -> None:
    text = _steps(*BASE_STEPS, '{ op = "all_reduce", size_bytes = -1e14 }')
    _bad(capsys, write_scenario, text, "workload.steps[2].size_bytes", "expected an integer")


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        ('{ op = "all_reduce", dtype = "fp16" }', "got 'fp16'"),  # torch's name is Half
        ('{ op = "broadcast", dtype = "float32" }', "got 'float32'"),  # a torch attribute, not the dump's name
        ('{ op = "send", peer = 1, dtype = "Float4_e2m1fn_x2" }', "BFloat16"),  # no collective takes it
    ],
)
def test_an_unknown_dtype_is_exit_2_listing_the_names(capsys, write_scenario, step: str, expected: str) -> None:
    """A dtype no torch type has simulated as a type nobody else sends and ran on the real tier as float32."""
    text = _steps(*BASE_STEPS, step)
    _bad(capsys, write_scenario, text, "workload.steps[2].dtype", "expected one of", "Float,", expected)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ('"\\u001b[31mEvil"', "'\\x1b[31mEvil'"),  # a terminal control sequence, shown escaped
        ('""', "got ''"),
        ('"a..b"', "got 'a..b'"),
        (f'"{"E" * 201}"', "..."),  # past the length limit: shown cut
    ],
)
def test_a_raise_op_whose_error_type_is_not_a_python_name_is_exit_2(capsys, write_scenario, value, shown) -> None:
    """A raise op's error_type is reported as the rank's error type: anything but a dotted name is refused at
    load, not an internal error (exit 70) from the op's own check."""
    text = _steps(*BASE_STEPS, f'{{ op = "raise", error_type = {value}, message = "m" }}')
    _bad(capsys, write_scenario, text, "workload.steps[2].error_type", "dotted Python name", shown)


@pytest.mark.parametrize("op", ["init_process_group", "new_group"])
@pytest.mark.parametrize("value", ["inf", "nan", "0", "-5", "1e12"])
def test_op_timeout_out_of_range_is_exit_2(capsys, write_scenario, op: str, value: str) -> None:
    step = f'{{ op = "{op}", backend = "nccl", timeout_s = {value} }}'
    if op == "new_group":
        step = f'{{ op = "new_group", ranks = [0, 1], timeout_s = {value} }}'
    steps = (BASE_STEPS[0], step) if op == "init_process_group" else (*BASE_STEPS, step)
    _bad(capsys, write_scenario, _steps(*steps), f"workload.steps[{len(steps) - 1}].timeout_s")


def test_recovery_timeout_inf_is_exit_2(capsys, write_scenario) -> None:
    text = (SCENARIOS_DIR / "crash-replaced.toml").read_text(encoding="utf-8")
    text = re.sub(r"timeout_s = [0-9.]+", "timeout_s = inf", text, count=1)
    assert "timeout_s = inf" in text
    _bad(capsys, write_scenario, text, "recovery.timeout_s", "finite")


@pytest.mark.parametrize("value", ["-5", "inf", "1e9"])
def test_alloc_mib_out_of_range_is_exit_2(capsys, write_scenario, value: str) -> None:
    _bad(capsys, write_scenario, _steps(*BASE_STEPS, f'{{ op = "alloc", mib = {value} }}'), "workload.steps[2].mib")


def test_free_with_mib_from_an_older_file_is_refused_naming_empty_cache(capsys, write_scenario) -> None:
    """``free`` + ``mib`` once meant ``torch.cuda.empty_cache()``: refused, never read as a plain ``free``."""
    steps = ('{ op = "alloc", mib = 100, tag = "t" }', '{ op = "free", mib = 60, tag = "t" }')
    err = _bad(capsys, write_scenario, _steps(*BASE_STEPS, *steps), "workload.steps[3].mib", "'free'")
    assert "op 'empty_cache' with the same mib and tag" in err


@pytest.mark.parametrize(
    ("step", "key", "expected"),
    [
        ('{ op = "empty_cache", tag = "t" }', "mib", "missing"),
        ('{ op = "empty_cache", mib = -1 }', "mib", "-1"),
        ('{ op = "empty_cache", mib = 1, colour = "red" }', "colour", "unknown field for op 'empty_cache'"),
    ],
)
def test_bad_empty_cache_steps_are_exit_2(capsys, write_scenario, step: str, key: str, expected: str) -> None:
    _bad(capsys, write_scenario, _steps(*BASE_STEPS, step), f"workload.steps[2].{key}", expected)


@pytest.mark.parametrize(
    ("value", "expected"), [("nan", "finite"), ("90", "(0, 1], got 90"), ("0", "(0, 1]"), ("-0.5", "(0, 1]")]
)
def test_gpu_memory_utilization_outside_0_1_is_exit_2(capsys, write_scenario, value: str, expected: str) -> None:
    text = _steps(*BASE_STEPS, f'{{ op = "memory_check", gpu_memory_utilization = {value} }}')
    _bad(capsys, write_scenario, text, "workload.steps[2].gpu_memory_utilization", expected)


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e12"])
def test_compute_seconds_out_of_range_is_exit_2(capsys, write_scenario, value: str) -> None:
    _bad(
        capsys,
        write_scenario,
        _steps(*BASE_STEPS, f'{{ op = "compute", seconds = {value} }}'),
        "workload.steps[2].seconds",
    )


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_fault_time_out_of_range_is_exit_2(capsys, write_scenario, value: str) -> None:
    extra = f'[faults]\ninject = [{{ kind = "crash", rank = 0, at_s = {value} }}]\n'
    _bad(capsys, write_scenario, _steps(*BASE_STEPS, extra=extra), "faults.inject[0].at_s")


@pytest.mark.parametrize(
    ("fault", "field"),
    [
        ('kind = "oom-at-init", rank = 0, at_op = 1', "at_op"),
        ('kind = "oom-at-init", rank = 0, at_s = 1.0', "at_s"),
        ('kind = "store-timeout", rank = 0, at_s = 1.0', "at_s"),
        ('kind = "crash", rank = 0, at_op = 1, factor = 3', "factor"),
        ('kind = "crash", rank = 0, at_op = 1, factor = 1', "factor"),
        ('kind = "skip", rank = 0, at_op = 2, at_s = 1.0', "at_s"),
        ('kind = "crash", rank = 0, at_op = 1, at_s = 1.0', "at_s"),
    ],
)
def test_a_fault_field_its_kind_does_not_use_is_exit_2(capsys, write_scenario, fault: str, field: str) -> None:
    """A field the fault's kind ignores read as a fault the run never had (an OOM at op 1, a crash at both an op
    and a time): refused, naming the fault and the field."""
    steps = (*BASE_STEPS, '{ op = "all_reduce" }')
    extra = f'[faults]\ninject = [{{ kind = "stall", rank = 1, at_op = 2 }}, {{ {fault} }}]\n'
    _bad(capsys, write_scenario, _steps(*steps, extra=extra), f"faults.inject[1].{field}")


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_expectation_numbers_must_be_finite(capsys, write_scenario, value: str) -> None:
    extra = f'[[expect]]\ncheckpoint = "after_init"\nused_mib = {value}\n'
    _bad(capsys, write_scenario, TINY + extra, "expect[0].used_mib", "finite")


@pytest.mark.parametrize("value", ["nan", "inf", str(10**400)])
def test_a_generator_number_past_float_range_is_exit_2(capsys, write_scenario, value: str) -> None:
    text = (SCENARIOS_DIR / "vllm-tp8-h100.toml").read_text(encoding="utf-8")
    text = re.sub(r"gpu_memory_utilization = [0-9.]+", f"gpu_memory_utilization = {value}", text, count=1)
    _bad(capsys, write_scenario, text, "workload.args.gpu_memory_utilization", "finite")


@pytest.mark.parametrize("value", [str(10**400), str(-(10**21))])
def test_a_generator_integer_past_exact_float_range_is_exit_2(capsys, write_scenario, value: str) -> None:
    """An integer knob (minutes, counts) past 2**53 was an OverflowError (exit 70) where it met float arithmetic:
    ``distributed_timeout_minutes = 10**400`` in a fuzzed Megatron scenario."""
    text = (SCENARIOS_DIR / "megatron-reinit-fixed.toml").read_text(encoding="utf-8")
    text = re.sub(r"distributed_timeout_minutes = \d+", f"distributed_timeout_minutes = {value}", text, count=1)
    _bad(capsys, write_scenario, text, "workload.args.distributed_timeout_minutes", "magnitude <= 2**53")


# ---------------------------------------------------------------------------------------------- limits


def test_nodes_past_the_world_limit_with_a_generator_is_exit_2(capsys, write_scenario) -> None:
    text = (SCENARIOS_DIR / "vllm-tp8-h100.toml").read_text(encoding="utf-8")
    text = re.sub(r"\nnodes = \d+", "", text).replace("[cluster]", f"[cluster]\nnodes = {10**21}")
    _bad(capsys, write_scenario, text, "cluster", "max_world_size = 65536")


def test_gpus_per_node_past_the_limit_is_exit_2(capsys, write_scenario) -> None:
    text = TINY.replace("gpus_per_node = 2", "gpus_per_node = 1000000000\nranks_per_node = 1")
    _bad(capsys, write_scenario, text, "cluster", "1000000000 GPUs", "max_world_size")


def test_repeat_past_the_program_limit_is_exit_2(capsys, write_scenario) -> None:
    text = _steps(*BASE_STEPS, '{ op = "barrier", repeat = 1000000000 }')
    _bad(capsys, write_scenario, text, "workload.steps", "max_program_ops = 200000")


def test_per_rank_templated_steps_count_against_the_expanded_limit(capsys, write_scenario, monkeypatch) -> None:
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_EXPANDED_OPS", "100")
    text = _steps(*BASE_STEPS, '{ op = "checkpoint", name = "c{rank}-{i}", repeat = 40 }', gpus=4)
    _bad(capsys, write_scenario, text, "workload.steps", "max_expanded_ops = 100")


@pytest.mark.parametrize(
    ("value", "text"),
    [("-1", "expected an integer >= 1"), ("0", "0 draws no fault"), ("1000000000", "max_faults = 1000")],
)
def test_max_faults_out_of_range_is_exit_2(capsys, write_scenario, value: str, text: str) -> None:
    extra = f"[faults]\nseed = 1\nmax_faults = {value}\n"
    _bad(capsys, write_scenario, _steps(*BASE_STEPS, extra=extra), "faults.max_faults", text)


def test_a_100_by_100_matrix_is_refused_before_it_is_expanded(capsys, write_scenario) -> None:
    values = ", ".join(f'"{i}"' for i in range(100))
    extra = f"[matrix]\nenv = {{ NCCL_DEBUG = [{values}], NCCL_DEBUG_SUBSYS = [{values}] }}\n"
    _bad(capsys, write_scenario, TINY + extra, "matrix", "10000 variants", "max_variants = 256")


@pytest.mark.parametrize("value", ["INFO\\nWARN", "INFO\\u001b[31m", "INFO\\r"])
def test_a_matrix_value_that_would_break_its_variants_one_line_name_is_exit_2(capsys, write_scenario, value) -> None:
    """A matrix value names its variant (``NCCL_DEBUG=INFO``): a newline in one split the summary's one line per
    variant in two, as a [[variants]] name with one would have (which the reader refuses)."""
    extra = f'[matrix]\nenv = {{ NCCL_DEBUG = ["WARN", "{value}"] }}\n'
    _bad(capsys, write_scenario, TINY + extra, "matrix.env.NCCL_DEBUG", "on one line without control characters")


def test_a_matrix_beside_variants_names_the_configured_limit(capsys, write_scenario) -> None:
    """It named the room the [[variants]] left (``max_variants = 254``) as if it were the limit."""
    values = ", ".join(f'"{i}"' for i in range(255))
    extra = f'[[variants]]\nname = "a"\n[[variants]]\nname = "b"\n[matrix]\nenv = {{ NCCL_DEBUG = [{values}] }}\n'
    _bad(
        capsys,
        write_scenario,
        TINY + extra,
        "matrix",
        "255 = 255 variants beside 2 [[variants]]",
        "max_variants = 256 (",
    )


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/stdin"])
def test_a_device_as_the_profile_is_exit_2(capsys, write_scenario, device: str) -> None:
    text = TINY.replace('release = "2.15"', f'release = "2.15"\nprofile = "{device}"')
    _bad(capsys, write_scenario, text, "torch.profile", "not a regular file")


def test_a_malformed_limit_override_is_exit_2(capsys, write_scenario, monkeypatch) -> None:
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_WORLD_SIZE", "lots")
    code, _, err = _run(capsys, str(write_scenario(TINY)))
    assert code == 2 and "SIMNCCL_LIMIT_MAX_WORLD_SIZE: expected a positive integer" in err


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        # found by a tester: a misspelt limit was ignored, so a CI job ran without the limit it set
        ("SIMNCCL_LIMIT_MAX_WROLD_SIZE", "3", "no such limit; did you mean SIMNCCL_LIMIT_MAX_WORLD_SIZE?"),
        ("SIMNCCL_LIMIT_LOTS", "3", "no such limit; the limits are SIMNCCL_LIMIT_MAX_ALLOC_MIB, "),
        # found by a tester: a name in another case was taken as a limit's and never read
        ("SIMNCCL_LIMIT_max_world_size", "1", "no such limit; did you mean SIMNCCL_LIMIT_MAX_WORLD_SIZE?"),
        # found by a tester: the OS's interval timer overflowed (an internal error, exit 70)
        ("SIMNCCL_LIMIT_MAX_WALL_S", "1e11", "expected a positive value up to 31536000 (its ceiling in"),
        ("SIMNCCL_LIMIT_MAX_NESTING_DEPTH", "100000", "expected a positive value up to 512"),
        ("SIMNCCL_LIMIT_MAX_WORLD_SIZE", "99999999999999999999999", "expected a positive value up to 1048576"),
    ],
)
def test_a_limit_override_naming_no_limit_or_past_its_ceiling_is_exit_2(
    capsys, write_scenario, monkeypatch, var: str, value: str, message: str
) -> None:
    monkeypatch.setenv(var, value)
    code, _, err = _run(capsys, str(write_scenario(TINY)))
    assert code == 2 and message in err and var in err and "Traceback" not in err, err


def test_every_limit_has_a_ceiling_above_it() -> None:
    from simnccl.limits import _tables

    limits, ceilings = _tables()
    assert all(ceilings[name] >= value for name, value in limits.items())


def test_a_limit_override_raises_the_limit(write_scenario, monkeypatch) -> None:
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_WORLD_SIZE", "70000")
    assert current_limits().max_world_size == 70000


# ---------------------------------------------------------------------------------------------- names and ranges


def test_a_typod_checkpoint_in_expect_is_exit_2_up_front(capsys, write_scenario) -> None:
    extra = '[[expect]]\ncheckpoint = "after_inti"\nused_mib = 1\n'
    _bad(capsys, write_scenario, TINY + extra, "expect[0].checkpoint", "did you mean 'after_init'?")


def test_recovery_markers_are_known_checkpoints(write_scenario) -> None:
    text = (SCENARIOS_DIR / "crash-replaced.toml").read_text(encoding="utf-8")
    good = text + '[[expect]]\ncheckpoint = "commit:4"\nused_mib = 1\n'
    assert load_scenario(write_scenario(good)).expectations[-1].checkpoint == "commit:4"
    with pytest.raises(ScenarioError, match="no checkpoint 'comit:4'"):
        load_scenario(write_scenario(good.replace('"commit:4"', '"comit:4"')))


def test_a_typod_device_in_expect_is_exit_2_up_front(capsys, write_scenario) -> None:
    extra = '[[expect]]\ncheckpoint = "after_init"\nused_mib = 1\ndevices = ["n0:cuda:9"]\n'
    _bad(capsys, write_scenario, TINY + extra, "expect[0].devices", "no device 'n0:cuda:9'")


def test_an_unknown_env_knob_names_the_nearest_known_one(capsys, write_scenario) -> None:
    text = TINY.replace('release = "2.15"', 'release = "2.15"\nenv = { TORCH_DIST_USE_NCL2 = "0" }')
    _bad(capsys, write_scenario, text, "torch.env.TORCH_DIST_USE_NCL2", "did you mean TORCH_DIST_USE_NCCL2?")


def test_a_message_past_its_limit_is_said_in_the_limits_unit(capsys, write_scenario) -> None:
    # The size is in bytes, max_message_mib in MiB: the message said "exceeds the limit max_message_mib =
    # 1099511627776", the limit in bytes under the name of the one in MiB.
    step = '  { op = "all_reduce", size_bytes = 99999999999999999999 },\n]'
    text = TINY.replace("\n]", "\n" + step, 1)
    message = "99999999999999999999 bytes (95367431640625 MiB) exceeds the limit max_message_mib = 1048576 ("
    _bad(capsys, write_scenario, text, "workload.steps[3].size_bytes", message)


def test_a_nul_in_an_env_value_is_bad_input(capsys, write_scenario) -> None:
    # No process environment holds one: a real rank died on it (ValueError: embedded null byte) where the
    # simulation had passed.
    text = TINY.replace('release = "2.15"', 'release = "2.15"\nenv = { NCCL_DEBUG = "WA\\u0000RN" }')
    _bad(capsys, write_scenario, text, "torch.env.NCCL_DEBUG", "a NUL character in the value")


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("NCCL_FOOBAR", "no known knob is close"),  # was "did you mean NCCL_IB_OOO_RQ?": the prefix alone matched
        ("NCCL_NVLS_ENABL", "did you mean NCCL_NVLS_ENABLE?"),
        ("PYTORCH_CUDA_ALLOC_CONFF", "did you mean PYTORCH_CUDA_ALLOC_CONF?"),
    ],
)
def test_the_nearest_knob_is_judged_on_the_name_after_its_prefix(name: str, hint: str) -> None:
    from simnccl.env_knobs import unknown_knob_message

    assert f"unknown environment knob {name!r}: {hint} (" in (unknown_knob_message(name) or "")


@pytest.mark.parametrize(
    "table",
    [
        '[[variants]]\nname = "v"\nenv = { NCCL_MAX_NCHANNEL = "4" }\n',
        '[matrix]\nenv = { NCCL_MAX_NCHANNEL = ["4"] }\n',
    ],
)
def test_unknown_env_knobs_in_variants_and_matrix_are_exit_2(capsys, write_scenario, table: str) -> None:
    _bad(capsys, write_scenario, TINY + table, "", "NCCL_MAX_NCHANNEL", "did you mean NCCL_MAX_NCHANNELS?")


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"])
def test_a_launcher_variable_in_an_env_table_is_exit_2(capsys, write_scenario, name: str) -> None:
    """torchrun sets these per rank; one value for every rank was accepted and changed nothing."""
    text = TINY.replace('release = "2.15"', f'release = "2.15"\nenv = {{ {name} = "3" }}')
    _bad(capsys, write_scenario, text, f"torch.env.{name}", "set per rank by the launcher")


def test_other_prefixes_are_not_checked_and_extra_knobs_can_be_declared(capsys, write_scenario) -> None:
    env = 'env = { VLLM_WHATEVER = "1", NCCL_FROM_THE_FUTURE = "1" }\nextra_env_knobs = ["NCCL_FROM_THE_FUTURE"]'
    code, _, err = _run(capsys, str(write_scenario(TINY.replace('release = "2.15"', f'release = "2.15"\n{env}'))))
    assert code == 0, err


@pytest.mark.parametrize("name", ["nccl_comm_split_share_resources", "Torch_Dist_Use_Nccl2", "pytorch_cuda_alloc_conf"])
def test_a_lower_case_knob_is_exit_2_as_production_ignores_it(capsys, write_scenario, name: str) -> None:
    """torch and NCCL read upper-case names: a lower-case one changed nothing in production, and was accepted."""
    text = TINY.replace('release = "2.15"', f'release = "2.15"\nenv = {{ {name} = "1" }}')
    _bad(capsys, write_scenario, text, f"torch.env.{name}", f"torch and NCCL read {name.upper()!r}")


def test_simulate_refuses_a_lower_case_knob_even_when_declared() -> None:
    from simnccl.testing import simulate

    with pytest.raises(ValueError, match="case-sensitive"):
        simulate([], env={"nccl_new": "1"}, extra_env_knobs=["nccl_new"])


@pytest.mark.parametrize("value", ["abc", "99999999999999", "-3"])
def test_an_integer_knob_with_a_value_simnccl_cannot_use_is_exit_2(capsys, write_scenario, value: str) -> None:
    text = TINY.replace(
        'release = "2.15"', f'release = "2.15"\nenv = {{ TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC = "{value}" }}'
    )
    _bad(capsys, write_scenario, text, "torch.env.TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "expected an integer in 1..")


@pytest.mark.parametrize(
    ("extra", "key", "message"),
    [
        # found by a tester: a key given with a false value (0, []) was taken as not given
        ('verdict = "pass"\ntolerance_pct = 0\n', "expect[0].tolerance_pct", "only meaningful with used_mib"),
        ('verdict = "pass"\ndevices = []\n', "expect[0].devices", "only meaningful with used_mib"),
        ('verdict = "pass"\ntolerance_mib = 0\n', "expect[0].tolerance_mib", "only meaningful with used_mib"),
        (
            'checkpoint = "after_init"\nused_mib = 1\ndevices = []\n',
            "expect[0].devices",
            "expected at least one device (omit the key for every device)",
        ),
        # a tolerance no measurement can leave: the check cannot fail
        (
            'checkpoint = "after_init"\nused_mib = 1\ntolerance_pct = 1e300\n',
            "expect[0].tolerance_pct",
            "expected less than 100 (percent), got 1e+300",
        ),
        (
            'checkpoint = "after_init"\nused_mib = 1\ntolerance_mib = 1e308\n',
            "expect[0].tolerance_mib",
            "expected less than one GPU's memory",
        ),
        # found by a tester: a text every message contains, a time tolerance longer than any run
        ('verdict = "pass"\nerror_contains = ""\n', "expect[0].error_contains", "not a blank one, got ''"),
        ('verdict = "pass"\nerror_contains = " \\t"\n', "expect[0].error_contains", "not a blank one"),
        (
            'verdict = "pass"\nerror_at_s = 0\ntolerance_s = 1e300\n',
            "expect[0].tolerance_s",
            "expected less than the longest simulated run (max_sim_time_s, 2,592,000 s), got 1e+300",
        ),
    ],
)
def test_an_expectation_that_checks_nothing_is_exit_2(capsys, write_scenario, extra: str, key: str, message: str):
    _bad(capsys, write_scenario, TINY + "[[expect]]\n" + extra, key, message)


def test_tolerance_pct_with_tolerance_mib_is_exit_2(capsys, write_scenario) -> None:
    extra = '[[expect]]\ncheckpoint = "after_init"\nused_mib = 1\ntolerance_pct = 1\ntolerance_mib = 1\n'
    _bad(capsys, write_scenario, TINY + extra, "expect[0].tolerance_mib", "not both")


@pytest.mark.parametrize(("ranks", "text"), [("[2, 4]", "outside the world of 4"), ("[1, 1]", "more than once")])
def test_new_group_ranks_are_checked_against_the_world(capsys, write_scenario, ranks: str, text: str) -> None:
    steps = _steps(*BASE_STEPS, f'{{ op = "new_group", ranks = {ranks} }}', gpus=4)
    _bad(capsys, write_scenario, steps, "workload.steps[2].ranks", text)


@pytest.mark.parametrize("splits", ["[[0, 9]]", "[[0, -1]]", "[[]]", "[[0, 0]]"])
def test_split_ranks_out_of_range_is_exit_2(capsys, write_scenario, splits: str) -> None:
    steps = _steps(*BASE_STEPS, f'{{ op = "split_group", split_ranks = {splits} }}', gpus=4)
    _bad(capsys, write_scenario, steps, "workload.steps[2].split_ranks")


def test_split_ranks_outside_a_smaller_nccl_parent_fail_the_rank_saying_it_is_not_modelled(write_scenario) -> None:
    """A rank valid in the world but not in the parent group: NCCL's split of it is not measured (no GPU here), so
    the rank fails saying so, never an IndexError, never a pass (gloo's wait: tests/test_c10d.py)."""
    steps = _steps(
        *BASE_STEPS,
        '{ op = "new_group", ranks = [0, 1], bind = "pair" }',
        '{ op = "split_group", parent = "pair", split_ranks = [[0, 3]], bind = "s" }',
        gpus=4,
    )
    (variant,) = runner.run_scenario(load_scenario(write_scenario(steps)), allow=frozenset({"error"})).variants
    assert variant.verdict == "error"
    errors = {e["rank"]: (e["type"], e["message"]) for e in variant.outcome.errors}
    assert errors[0] == (
        "SimulatorLimit",
        "split ranks [3] name no rank of the parent group of size 2: what NCCL's split makes of them is not modelled",
    )
    assert errors[2] == ("ValueError", "Global rank 2 is not part of the parent group -100")  # torch's, outside


def test_the_checkpoint_field_is_reported_as_the_user_wrote_it(capsys, write_scenario) -> None:
    text = _steps(*BASE_STEPS, '{ op = "checkpoint", name = 5 }')
    err = _bad(capsys, write_scenario, text, "workload.steps[2].name", "expected a string")
    assert "label" not in err


def test_an_injected_fault_schedule_does_not_print_seed_none() -> None:
    schedule = FaultSchedule(None, ("crash",), (Fault("crash", 0, at_op=1),))
    assert "seed=None" not in schedule.describe()
    assert schedule.describe().startswith("fault schedule: 1 injected, none generated")


# ---------------------------------------------------------------------------------------------- report


def test_the_report_prints_a_hang_without_a_meeting(capsys, write_scenario) -> None:
    """The simulated-time-cap entry has no kind/seq: printing it was a KeyError."""
    result = runner.run_scenario(load_scenario(write_scenario(TINY)))
    result.variants[0].outcome.hangs.append(
        {"rank": 0, "op": "<running>", "group": "", "waiting_for": [], "since_s": 1.0, "explanation": "cap"}
    )
    print_result(result)
    assert "hang: rank 0 in <running>" in capsys.readouterr().out


def test_the_engine_enforces_max_sim_time(write_scenario) -> None:
    scenario = load_scenario(write_scenario(_steps(*BASE_STEPS, '{ op = "compute", seconds = 100 }')))
    config = runner.config_for(scenario, scenario.variants[0], Limits(max_sim_time_s=10.0))
    with pytest.raises(EngineGuardError, match=r"max_sim_time_s = 10 s"):
        Engine(config).run()


# ---------------------------------------------------------------------------------------------- verdicts


HANG = _steps(
    *BASE_STEPS,
    '{ op = "new_group", ranks = [0, 1], bind = "g" }',
    '{ op = "all_reduce", group = "g", on_ranks = [0] }',
)


def test_a_hang_nobody_asked_for_fails_the_run(capsys, write_scenario) -> None:
    code, out, _ = _run(capsys, str(write_scenario(HANG)))
    assert code == 1
    flat = re.sub(r"\s+", " ", out)
    assert "ended 'hang' and no expectation asks for it" in flat and "--allow hang" in flat


def test_allow_makes_an_unasked_verdict_pass(capsys, write_scenario) -> None:
    code, _, err = _run(capsys, str(write_scenario(HANG)), "--allow", "hang,error")
    assert code == 0, err


def test_a_verdict_expectation_asks_for_it(capsys, write_scenario) -> None:
    code, _, err = _run(capsys, str(write_scenario(HANG + '[[expect]]\nverdict = "hang"\n')))
    assert code == 0, err


def test_allow_rejects_an_unknown_verdict(capsys, write_scenario) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(write_scenario(HANG)), "--allow", "hnag"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_allow_rejects_an_empty_list(capsys, write_scenario, value: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(write_scenario(HANG)), "--allow", value])
    assert exit_info.value.code == 2
    assert "expected one or more of" in capsys.readouterr().err


def test_explain_exits_as_run_does_on_expectations(capsys, write_scenario) -> None:
    """explain tells the same run in words and checks the same expectations: 1 when one fails."""
    path = str(write_scenario(HANG))
    assert main(["explain", path]) == 1
    assert "no expectation asks for it" in capsys.readouterr().out
    assert main(["explain", path, "--allow", "hang"]) == 0
    assert main(["explain", str(write_scenario(HANG + '[[expect]]\nverdict = "hang"\n'))]) == 0


def test_a_run_stopped_by_the_engine_guard_is_exit_2_naming_the_limit(capsys, write_scenario, monkeypatch) -> None:
    """Each step is within max_sim_time_s, the run is not: the engine's guard stops it; nothing was checked."""
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_SIM_TIME_S", "10")
    path = write_scenario(_steps(*BASE_STEPS, *['{ op = "compute", seconds = 6 }'] * 2))
    for command in ("run", "explain"):
        code = main([command, str(path)])
        err = re.sub(r"\s+", " ", capsys.readouterr().err)
        assert code == 2, err
        assert "Traceback" not in err
        assert f"{path} (variant 'default'): simulation stopped: simulated time would pass" in err
        assert (
            "max_sim_time_s in simnccl/data/limits.toml; to raise it for one run, set SIMNCCL_LIMIT_MAX_SIM_TIME_S"
            in err
        )


def test_run_scenario_allow_keyword(write_scenario) -> None:
    scenario = load_scenario(write_scenario(HANG))
    assert not runner.run_scenario(scenario).ok
    assert runner.run_scenario(scenario, allow=frozenset({"hang"})).ok


# ---------------------------------------------------------------------------------------------- the guard


def test_an_uncaught_exception_is_exit_70_saying_please_report(capsys, write_scenario, monkeypatch) -> None:
    def boom(self: Engine) -> None:
        raise RuntimeError("engine defect")

    monkeypatch.setattr(Engine, "run", boom)
    path = write_scenario(TINY)
    code = main(["run", str(path)])
    err = re.sub(r"\s+", " ", capsys.readouterr().err)
    assert code == EXIT_SOFTWARE == 70
    assert "please report" in err and "RuntimeError: engine defect" in err
    assert f"while running {path} (variant 'default')" in err


def test_the_replay_module_entry_point_is_guarded_too(tmp_path: Path) -> None:
    """``python -m simnccl.testing.replay`` (the command a failing property test prints) ran unguarded: a crash
    exited 1, which this command means as "the check still fails". Broken from outside (a ``sitecustomize``
    that makes the simulation raise), it must say internal error and exit 70."""
    from simnccl.ops import Checkpoint, InitProcessGroup, Program, SetDevice
    from simnccl.testing.replay import SimCase

    program = Program((SetDevice(0), InitProcessGroup(), Checkpoint(label="x")))
    case = SimCase(programs=(program.ops, program.ops)).dump(tmp_path / "case.json")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "from simnccl.engine import Engine\n"
        "def boom(self, *args, **kwargs):\n    raise RuntimeError('simulator defect')\n"
        "Engine.run = boom\n",
        encoding="utf-8",
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "simnccl.testing.replay", str(case), "--simulate-only"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == EXIT_SOFTWARE, done.stderr
    assert "RuntimeError: simulator defect" in done.stderr and "please report" in done.stderr
    healthy = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert healthy.returncode == 0, healthy.stderr  # the same case, unbroken, passes


def test_ctrl_c_is_exit_130_with_what_finished(capsys, write_scenario, monkeypatch) -> None:
    real = runner.run_variant
    calls = []

    def second_is_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "run_variant", second_is_interrupted)
    path = write_scenario(TINY + '[[variants]]\nname = "first"\n[[variants]]\nname = "second"\n')
    code = main(["run", str(path)])
    err = capsys.readouterr().err
    assert code == EXIT_INTERRUPTED == 130
    assert f"finished  {path}  first: pass (expectations hold)" in err
    assert f"stopped   {path}  second: not finished" in err


def test_a_ctrl_c_while_a_variant_is_reported_lets_its_line_finish(capsys, write_scenario, monkeypatch) -> None:
    """A variant the journal says finished has its --quiet line: a Ctrl-C landing while it was reported (here a
    real SIGINT while its summary line is made) kept it in the journal with no line on stdout."""
    import simnccl.report as report

    real = report.variant_summary
    sent: list[str] = []

    def interrupted_summary(scenario_name, variant):
        if not sent:
            sent.append(variant.name)
            os.kill(os.getpid(), signal.SIGINT)
        return real(scenario_name, variant)

    monkeypatch.setattr(report, "variant_summary", interrupted_summary)  # the CLI imports it when it runs
    path = write_scenario(TINY + '[[variants]]\nname = "first"\n[[variants]]\nname = "second"\n')
    code = main(["run", str(path), "--quiet"])
    out, err = capsys.readouterr()
    assert code == EXIT_INTERRUPTED
    assert f"finished  {path}  first: pass (expectations hold)" in err
    assert [line.split("  ")[1] for line in out.splitlines()] == ["first"], out


def test_the_wall_clock_limit_covers_the_whole_command(capsys, write_scenario, monkeypatch) -> None:
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_WALL_S", "0.2")

    def slow_load(path: Path) -> None:
        while True:  # a parse that never ends: the limit must stop it, not only the engine's own guard
            time.sleep(0.01)

    monkeypatch.setattr("simnccl.scenario.load_scenario", slow_load)  # the CLI imports it when a command runs
    path = write_scenario(TINY)
    code = main(["run", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: {path}: the command ran past its wall-clock limit max_wall_s = 0.2 s" in err


def test_children_are_reaped_when_a_command_is_interrupted() -> None:
    started: list[subprocess.Popen[bytes]] = []

    def command(argv: list[str] | None) -> int:
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        raise KeyboardInterrupt

    assert guarded(command)(["run"]) == EXIT_INTERRUPTED
    (child,) = started
    with pytest.raises(ChildProcessError):  # already reaped by the guard: no zombie left
        os.waitpid(child.pid, os.WNOHANG)
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)


def test_ctrl_c_on_a_real_process_exits_130() -> None:
    """The command as a user runs it: SIGINT while it works ends it with 130 and no traceback."""
    script = (
        "import sys, time\nfrom simnccl.cli_guard import guarded\n"
        "def work(argv):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        "sys.exit(guarded(work)(['run']))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    _, err = communicate_or_kill(proc, 60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted (Ctrl-C)" in err


# A few shipped scenarios, several seconds of simulation after the first line is printed.
_SEVERAL = [str(SCENARIOS_DIR / f"{name}.toml") for name in ("crash-replaced", "pytorch-199957", "vllm-startup-check")]


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "PYTHONUNBUFFERED"])
@pytest.mark.parametrize("json_out", [False, True], ids=["table", "json"])
def test_a_reader_that_goes_away_ends_the_command_with_141_and_what_finished(unbuffered, json_out) -> None:
    """``simnccl run ... | head -1``: the scenarios after the reader left never ran, so 0 would be a lie and 1
    ("an expectation failed", rich's own answer) a wrong one. The shell's code for a command a closed pipe
    ended, what finished on stderr, no traceback. The JSON document too (written whole at the end: ~250 KB for
    these three, more than a pipe holds, so the write is still going when the reader leaves), and under
    PYTHONUNBUFFERED=1, where a partial write was dropped without a word (exit 0)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    argv = [sys.executable, "-m", "simnccl", "run", *_SEVERAL, *(["--json"] if json_out else [])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdout.readline()  # the first line, then the reader goes away
    proc.stdout.close()
    try:
        err = proc.stderr.read().decode() if proc.stderr is not None else ""
        proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == EXIT_OUTPUT_CLOSED == 141, err
    assert "stopped: the output was closed (broken pipe) during simnccl run" in err and "Traceback" not in err
    if not json_out:  # the table streams: the first scenario had finished when its line was read
        assert "  finished  " in err and "crash-replaced.toml  default: pass" in err


_RAISES = {
    "user-policy": "from simnccl.policy.plans import UserPolicyError as E\n"
    "try:\n    raise RuntimeError('the policy')\nexcept RuntimeError as c:\n    raise E('boom') from c",
    "limit": "from simnccl.limits import LimitError as E\nraise E('bad limit')",
    "output": "from simnccl.cli_options import OutputError as E\nraise E('cannot write')",
    "ctrl-c": "raise KeyboardInterrupt",
    "bug": "raise RuntimeError('a bug')",
}


@pytest.mark.parametrize(
    ("raised", "code"),
    [("user-policy", 2), ("limit", 2), ("output", 2), ("ctrl-c", EXIT_INTERRUPTED), ("bug", EXIT_SOFTWARE)],
)
def test_a_closed_stderr_keeps_the_errors_own_exit_code(raised: str, code: int) -> None:
    """``simnccl explain ... --policy mine:Raises 2>&1 | head -3``: the guard's lines about the error met a closed
    stderr, the BrokenPipeError escaped its handler and the command exited 1 ("a check failed") instead of 2.
    The error's own code wins; what cannot be said is dropped."""
    body = "\n".join(f"    {line}" for line in _RAISES[raised].splitlines())
    script = "import sys\nfrom simnccl.cli_guard import guarded\ndef work(argv):\n"
    script += f"{body}\nsys.exit(guarded(work)(['run']))\n"
    read, write = os.pipe()
    os.close(read)  # the reader went away before the command said anything
    try:
        proc = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=write, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == code, proc.stdout


@pytest.mark.parametrize(
    ("step", "shown"),
    [
        ('{ op = "all_reduce", group = "wrold" }', "all_reduce's group 'wrold'"),
        ('{ op = "split_group", parent = "tp", split_ranks = [[0], [1]] }', "split_group's parent 'tp'"),
        ('{ op = "destroy_process_group", group = "g{i}", repeat = 2 }', "destroy_process_group's group 'g0'"),
    ],
)
def test_a_group_handle_no_step_binds_is_bad_input(capsys, write_scenario, step: str, shown: str) -> None:
    """A typo'd handle ran, failed every rank with NameError and ended as a failed expectation (exit 1)."""
    _bad(capsys, write_scenario, _steps(*BASE_STEPS, step), "workload.steps", shown, "no step binds", "world")


def test_a_handle_bound_on_some_ranks_only_is_still_the_programs_business(capsys, write_scenario) -> None:
    steps = (
        *BASE_STEPS,
        '{ op = "new_group", ranks = [0], bind = "solo", on_ranks = [0] }',
        '{ op = "barrier", group = "solo" }',
    )
    code, _, err = _run(capsys, str(write_scenario(_steps(*steps))))
    assert code != 2, err  # simulated: rank 1 never bound "solo" (torch's NameError there), not a load error


def test_running_out_of_memory_is_one_line_and_exit_2(capsys) -> None:
    """A workload within every limit (65,536 ranks, a {rank} step repeated 300 times) ran out of memory while
    expanding, and the command ended with exit 1 (a failed check, to a script) and bare MemoryError tracebacks."""

    def command(argv: object) -> int:
        raise MemoryError

    assert guarded(command)(["run"]) == 2
    err = capsys.readouterr().err
    assert "ran out of memory (MemoryError)" in err and "Traceback" not in err


def test_per_rank_templated_op_objects_are_bounded_before_they_are_built(capsys, write_scenario) -> None:
    """That workload: 19.7 M op objects (~600 B each) passed max_expanded_ops (20 M references)."""
    step = '{ op = "checkpoint", name = "c{rank}-{i}", repeat = 300 }'
    text = _steps(*BASE_STEPS, step, gpus=8, cluster="nodes = 8192")
    _bad(capsys, write_scenario, text, "workload.steps", "19660802 op objects", "max_built_ops = 2000000")


def test_a_broken_pipe_that_is_not_the_output_is_a_bug(capsys) -> None:
    """Only a closed stdout or stderr is the reader going away: a pipe to a worker process that broke is a
    defect like any other (exit 70, the traceback), not a quiet 141."""

    def command(argv: object) -> int:
        raise BrokenPipeError(32, "Broken pipe (a worker's)")

    assert guarded(command)(["run"]) == EXIT_SOFTWARE
    assert "BrokenPipeError" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- wall-clock flags

_SCENARIO = str(SCENARIOS_DIR / "crash-replaced.toml")


@pytest.mark.parametrize(
    "argv",
    [
        ["capture", "--world", "2", "--timeout", "{value}", "missing.py"],
        ["real", "run", _SCENARIO, "--timeout", "{value}"],
        ["real", "run", _SCENARIO, "--stall", "{value}"],
        ["real", "compare", _SCENARIO, "--torch-timeout", "{value}"],
        ["real", "diff", "--timeout", "{value}"],
        ["real", "diff", "--stall", "{value}"],
        ["real", "calibrate", "--out", "x.toml", "--timeout", "{value}"],
    ],
    ids=lambda argv: " ".join(a for a in argv if a != _SCENARIO)[:40],
)
@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0", "1e12", "soon"])
def test_a_wall_clock_flag_out_of_range_is_a_usage_error(capsys, argv: list[str], value: str) -> None:
    """A timeout that is not a positive finite number of seconds within ``max_timeout_s`` is exit 2 naming the
    flag, before anything runs: ``real run --timeout inf`` ran every rank into an error and exited 1 (a failed
    run, as if the scenario had failed), ``capture --timeout 1e12`` and ``real diff --timeout 1e12`` overflowed the
    OS's clocks (exit 70)."""
    flag = argv[argv.index("{value}") - 1]
    with pytest.raises(SystemExit) as exited:
        main([value if a == "{value}" else a for a in argv])
    err = re.sub(r"\s+", " ", capsys.readouterr().err)
    assert exited.value.code == 2, err
    assert f"argument {flag}: " in err and "Traceback" not in err, err
    if value == "1e12":
        assert "1e12 s exceeds the limit max_timeout_s = 86400" in err, err


@pytest.mark.parametrize(
    "argv", [["real", "run", _SCENARIO, "--compute-scale"], ["real", "compare", _SCENARIO, "--tolerance-pct"]]
)
@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_a_factor_flag_that_is_not_finite_and_non_negative_is_a_usage_error(
    capsys, argv: list[str], value: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, value])
    err = re.sub(r"\s+", " ", capsys.readouterr().err)
    assert exited.value.code == 2 and f"argument {argv[-1]}: expected a finite number >= 0" in err, err


def test_the_capture_api_refuses_a_timeout_past_the_limit() -> None:
    pytest.importorskip("torch")
    from simnccl import capture as cap

    for value in (float("inf"), float("nan"), 0, 10**12, True):
        with pytest.raises(cap.CaptureError, match="timeout_s: "):
            cap.capture(lambda: None, 2, timeout_s=value)


@pytest.mark.parametrize("where", ["file", "under-a-file", "device"])
def test_fr_dir_that_cannot_be_a_folder_is_exit_2_before_anything_runs(capsys, tmp_path: Path, where: str) -> None:
    """The dumps were written at the end of a variant: into a file or a device that was an internal error
    (exit 70) after the simulation had run."""
    target = {
        "file": tmp_path / "dumps.txt",
        "under-a-file": tmp_path / "dumps.txt" / "sub",
        "device": Path("/dev/null"),
    }[where]
    (tmp_path / "dumps.txt").write_text("not a folder\n")
    code, _, err = _run(capsys, str(SCENARIOS_DIR / "hang-missing-rank.toml"), "--fr-dir", str(target))
    assert code == 2 and "--fr-dir: " in err and "Traceback" not in err, err
    assert "not a folder" in err


@pytest.mark.parametrize("case", ["/dev/zero", "fifo"])
def test_replay_of_a_case_that_is_not_a_regular_file_is_exit_2(tmp_path: Path, case: str) -> None:
    """``python -m simnccl.testing.replay /dev/zero`` read until it was killed; a FIFO blocked forever."""
    if case == "fifo":
        case = str(tmp_path / "case.json")
        os.mkfifo(case)
    done = subprocess.run(
        [sys.executable, "-m", "simnccl.testing.replay", case], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and "cannot read: not a regular file" in done.stderr, done.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full (every write: ENOSPC)")
@pytest.mark.parametrize("command", ["run", "explain"])
def test_a_json_output_that_cannot_be_written_is_exit_2_naming_it(capsys, command: str) -> None:
    """A full disk under ``--json`` was an internal error (exit 70, "a bug in simnccl"); it is the output's
    problem: exit 2 naming the flag, the file and the reason."""
    code = main([command, str(SCENARIOS_DIR / "hang-missing-rank.toml"), "--json", "/dev/full", "-q"])
    err = re.sub(r"\s+", " ", capsys.readouterr().err)
    assert code == 2, err
    assert "--json: cannot write '/dev/full': No space left on device" in err and "internal error" not in err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full (every write: ENOSPC)")
@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "PYTHONUNBUFFERED"])
@pytest.mark.parametrize("json_out", [False, True], ids=["table", "json"])
def test_a_full_disk_under_stdout_is_exit_2_naming_it_not_a_bug_report(unbuffered: str, json_out: bool) -> None:
    """``simnccl run > /dev/full`` (a CI runner's disk filled by its logs) asked the user to report a bug in
    simnccl (exit 70, the traceback). The machine's problem, as for a ``--json`` file: exit 2, one line saying
    what could not be written, no traceback, and no second failure at the interpreter's last flush (exit 120)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    with open("/dev/full", "w", encoding="utf-8") as full:
        done = subprocess.run(
            [sys.executable, "-m", "simnccl", "run", _SEVERAL[0], *(["--json"] if json_out else [])],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr
    assert "cannot write its output: No space left on device" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr and "Exception" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--count", "100000000"], "--count: 100000000 cases exceeds the limit max_real_cases"),
        (["--count", "0"], "--count: expected at least 1 case, got 0"),
        (["--count", "1", "--parallel", "0"], "--parallel: expected at least 1 world at a time"),
        (
            ["--count", "1", "--parallel", "1000"],
            "--parallel: 1000 worlds at a time exceeds the limit max_real_parallel",
        ),
        (["--only", "-3"], "--only: expected case indices >= 0, got -3"),
    ],
)
def test_real_diff_sizes_are_bounded_before_any_case_is_generated(capsys, argv: list[str], message: str) -> None:
    """``--count 100000000`` generated every case into memory before the first ran; ``--parallel 1000`` would
    start a thousand real worlds of torch processes at once."""
    pytest.importorskip("torch")  # without it the command stops earlier, at the missing prerequisite
    assert main(["real", "diff", *argv]) == 2
    err = re.sub(r"\s+", " ", capsys.readouterr().err)
    assert message in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("cluster", "shown"),
    [({"gpus_per_node": 10**8}, "a cluster of 100000000 ranks"), ({"nodes": 10**7, "gpus_per_node": 8}, "80000000")],
)
def test_the_python_harness_bounds_the_cluster_before_making_anything(cluster: dict, shown: str) -> None:
    """``simnccl.testing.simulate(..., nodes=10**7)`` ran until the machine gave out (a scenario's cluster was
    bounded, the harness's was not): a user's test with a typo must fail at once, naming the limit."""
    from simnccl.ops import InitProcessGroup, SetDevice
    from simnccl.testing import simulate

    with pytest.raises(ValueError, match="exceeds the limit max_world_size = 65536") as raised:
        simulate([SetDevice(), InitProcessGroup(backend="nccl")], **cluster)
    assert shown in str(raised.value)


# ---------------------------------------------------------------------------------------------- found by fuzzing


def test_a_newline_in_a_key_or_a_file_name_keeps_the_error_on_one_line(capsys, write_scenario, tmp_path) -> None:
    # the key's ESC was escaped, its newline split the error in two
    text = TINY.replace('name = "tiny"', 'name = "tiny"\n"bad\\nkey" = 1')
    code, _, err = _run_raw(capsys, str(write_scenario(text)))
    assert code == 2 and "scenario.bad\\nkey: unknown key" in err and err.count("\n") == 1, err
    code, _, err = _run_raw(capsys, str(tmp_path / "missing\nZ.toml"))
    assert code == 2 and "missing\\nZ.toml: no such file" in err and err.count("\n") == 1, err


def _run_raw(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("step", "key", "expected"),
    [
        # a typo changed what the nccl-lazy-p2p policy decides, silently
        ('{ op = "new_group", ranks = [0, 1], traffic = "bogus" }', "traffic", "expected one of collectives, p2p"),
        # [[expect]] quotes a checkpoint's name: a newline in it printed the expectation as two
        ('{ op = "checkpoint", name = "a\\nINJECTED" }', "name", "without control characters, got \\n"),
        ('{ op = "checkpoint", name = "x", on_ranks = [0, 0, 1] }', "on_ranks", "rank(s) [0] listed more than once"),
    ],
)
def test_step_fields_fuzzing_found_unchecked_are_exit_2(capsys, write_scenario, step, key, expected) -> None:
    _bad(capsys, write_scenario, _steps(*BASE_STEPS, step), f"workload.steps[2].{key}", expected)


def test_an_expectation_over_no_variant_is_exit_2(capsys, write_scenario) -> None:
    # it checked nothing and passed (verdict = "hang" on a run that passes: exit 0)
    extra = '[[expect]]\nvariants = []\nverdict = "hang"\n'
    _bad(capsys, write_scenario, TINY + extra, "expect[0].variants", "expected at least one variant")


def test_an_env_name_that_is_no_variable_name_is_exit_2(capsys, write_scenario) -> None:
    text = TINY.replace('release = "2.15"', 'release = "2.15"\nenv = { "MY\\nVAR" = "v" }')
    _bad(capsys, write_scenario, text, "torch.env.MY\\nVAR", "expected an environment variable name")
    scenario = str(SCENARIOS_DIR / "pytorch-199957.toml")
    with pytest.raises(SystemExit) as stopped:  # argparse's own exit 2
        main(["run", scenario, "--env", "X\nY=1"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "--env: expected VAR=VALUE with VAR a variable name" in err, err


def test_an_env_value_with_a_newline_is_printed_on_the_variant_s_line(capsys, write_scenario) -> None:
    text = TINY.replace('release = "2.15"', 'release = "2.15"\nenv = { NCCL_DEBUG = "INFO\\nFAKE-LINE" }')
    code, out, _ = _run_raw(capsys, str(write_scenario(text)))
    assert code == 0 and "NCCL_DEBUG=INFO\\nFAKE-LINE" in out and "\nFAKE-LINE" not in out, out


def test_a_file_name_too_long_for_the_file_system_is_bad_input(capsys) -> None:
    def opens_a_long_name(argv: object) -> int:
        open("x" * 300 + ".py")  # noqa: SIM115 - raises before anything is opened
        return 0

    assert guarded(opens_a_long_name)([]) == 2
    err = capsys.readouterr().err
    assert "a file name too long for the file system: xxx" in err and "internal error" not in err, err
    assert err.count("\n") == 1, err  # the error alone: nothing ran to report on


def test_two_outputs_on_one_file_or_a_file_named_as_a_folder_are_exit_2(capsys, tmp_path) -> None:
    scenario = str(SCENARIOS_DIR / "idle-world-group.toml")
    out = tmp_path / "t.json"
    code, _, err = _run_raw(capsys, scenario, "--trace", str(out), "--json", str(out))
    assert code == 2 and "the file --json writes too" in err and not out.exists(), err  # the trace was overwritten
    code, _, err = _run_raw(capsys, scenario, "--json", f"{tmp_path}/x.json/")
    assert code == 2 and "names a folder (it ends in '/')" in err and err.count("\n") == 1, err


def test_a_rank_listed_twice_in_a_long_list_is_found_in_one_pass(capsys, write_scenario) -> None:
    # the duplicates were found by counting each rank in the whole list (about 3.6e9 steps for this one)
    ranks = ", ".join(map(str, [*range(60_000), 7]))
    steps = (*BASE_STEPS, f'{{ op = "checkpoint", name = "x", on_ranks = [{ranks}] }}')
    _bad(capsys, write_scenario, _steps(*steps, cluster="nodes = 30000"), "workload.steps[2].on_ranks", "[7] listed")


def _closed(argv: list[str], *, stdout: object = subprocess.DEVNULL, close: int | None = None, full_stderr=False):  # type: ignore[no-untyped-def]
    """``simnccl ARGV`` with fd ``close`` closed (``>&-``, ``2>&-``) or stderr on /dev/full."""
    stderr = open("/dev/full", "w") if full_stderr else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        return subprocess.run(
            [sys.executable, "-m", "simnccl.cli", *argv],
            stdout=stdout,
            stderr=stderr,
            timeout=300,
            preexec_fn=(lambda: os.close(close)) if close is not None else None,
        )
    finally:
        if full_stderr:
            stderr.close()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    ("argv", "how", "code"),
    [
        (["run", "--variant", "legacy"], "stderr-closed", 0),
        (["run", "--variant", "legacy"], "stdout-closed", 0),
        (["validate"], "stdout-closed", 1),  # its own verdict (two published points miss its goal), not a crash
        (["run", "--gpu", "tpu-v9"], "stderr-full", 2),
        (["run", "--gpu", "tpu-v9"], "stderr-closed", 2),
        (["cost", "--workload", "vllm", "--tp", "0"], "stderr-full", 2),
    ],
)
def test_a_closed_or_full_standard_stream_keeps_the_commands_own_exit_code(
    argv: list[str], how: str, code: int
) -> None:
    """Started with stderr closed (``2>&-``) a sweep exited 1; with stdout closed, sweep and validate crashed
    (exit 70); bad input with stderr on a full disk exited 1. What cannot be written is dropped; the code stays."""
    if how == "stderr-closed":
        proc = _closed(argv, close=2)
    elif how == "stdout-closed":
        proc = _closed(argv, close=1, stdout=None)
    else:
        proc = _closed(argv, full_stderr=True)
    assert proc.returncode == code


_SLEEPY = """
import time
from dataclasses import dataclass
from simnccl.policy import BasePolicy

@dataclass(frozen=True)
class Sleeps(BasePolicy):
    name: str = "sleeps"

    def on_init(self, request):
        print("asleep", flush=True)
        time.sleep(600)
        return super().on_init(request)
"""


@pytest.mark.parametrize(("target", "sent"), [("file", "SIGINT"), ("stdout", "SIGINT"), ("file", "SIGTERM")])
def test_ctrl_c_during_run_still_writes_the_document_of_what_finished(tmp_path: Path, target: str, sent: str) -> None:
    """Ctrl-C ended ``run --json FILE`` with 130 and the partial report on stderr, but no document: the file was
    never written (``--json -``: stdout empty), unlike cost and real. Now the document holds what finished, each
    variant not finished is a summary line that is not ok, and its ``ok`` is false. SIGTERM (``timeout``, a CI
    job's limit) ended it with status 143 and nothing at all (found by a tester): now it ends as Ctrl-C does."""
    (tmp_path / "sleepy.py").write_text(_SLEEPY)
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        TINY.replace(
            "[workload]",
            "[[variants]]\nname = 'fast'\n\n[[variants]]\nname = 'slow'\npolicy = 'sleepy:Sleeps'\n\n[workload]",
            1,
        )
        + '\n[[expect]]\nverdict = "pass"\n'
    )
    out = tmp_path / "out.json"
    json_args = ["--json", str(out)] if target == "file" else ["--json", "-"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "simnccl", "run", str(scenario), *json_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    # The policy's print: on stdout beside the text, on stderr while the document owns stdout.
    talks = proc.stdout if target == "file" else proc.stderr
    assert talks is not None
    while "asleep" not in (line := talks.readline()):  # the fast variant's text comes first
        assert line, "the policy never ran"
    proc.send_signal(getattr(signal, sent))
    stdout, err = communicate_or_kill(proc, 60)
    assert proc.returncode == 130, err
    assert f"interrupted ({'SIGTERM' if sent == 'SIGTERM' else 'Ctrl-C'})" in err, err
    document = json.loads(out.read_text() if target == "file" else stdout)
    assert document["ok"] is False
    summary = {line["variant"]: line for line in document["summary"]}
    assert summary["fast"]["ok"] and summary["slow"]["verdict"] == "interrupted" and not summary["slow"]["ok"]


def test_sigterm_still_stops_a_command_started_with_sigint_ignored(tmp_path: Path) -> None:
    """A background job of a non-interactive shell starts with SIGINT ignored: handed on as a SIGINT there, a
    SIGTERM was dropped and nothing but SIGKILL stopped the command (found by a tester). It ends as before."""
    (tmp_path / "sleepy.py").write_text(_SLEEPY)
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        TINY.replace("[workload]", "[[variants]]\nname = 'slow'\npolicy = 'sleepy:Sleeps'\n\n[workload]", 1)
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "simnccl", "run", str(scenario)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert proc.stdout is not None
    while "asleep" not in (line := proc.stdout.readline()):
        assert line, "the policy never ran"
    proc.send_signal(signal.SIGTERM)
    communicate_or_kill(proc, 60)
    assert proc.returncode == -signal.SIGTERM


@pytest.mark.parametrize(
    ("step", "key", "shown"),
    [
        ('{ op = "checkpoint", name = "c", repeat = 2 }', "workload.steps", "checkpoint 'c' is met twice"),
        ('{ op = "all_reduce", size_mib = 4, size_bytes = 16 }', "workload.steps[2].size_mib", "not both"),
    ],
)
def test_a_step_whose_meaning_one_key_silently_overrode_is_bad_input(
    capsys, write_scenario, step: str, key: str, shown: str
) -> None:
    """Found by fuzzing: an [[expect]] at a label met twice measured the last one; of size_mib and size_bytes one
    silently won."""
    _bad(capsys, write_scenario, _steps(*BASE_STEPS, step), key, shown)


@pytest.mark.parametrize(
    ("matrix", "key"),
    [
        ('release = ["2.15", "2.15"]', "matrix.release"),
        ('env = { NCCL_DEBUG = ["INFO", "INFO"] }', "matrix.env.NCCL_DEBUG"),
    ],
)
def test_a_matrix_value_given_twice_is_named_as_such(capsys, write_scenario, matrix: str, key: str) -> None:
    """It made two variants of one name, reported as "also defined in [[variants]]" in a file that had none."""
    _bad(capsys, write_scenario, TINY + f"[matrix]\n{matrix}\n", key, "is given twice")


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc (a folder no one can write in)")
def test_fr_dir_in_a_folder_no_one_can_write_is_exit_2_before_anything_runs(capsys) -> None:
    """Found by fuzzing: it was found only when the dumps were written, after the simulation had run."""
    code, out, err = _run(capsys, str(SCENARIOS_DIR / "hang-missing-rank.toml"), "--fr-dir", "/proc/simnccl-dumps")
    assert code == 2 and "--fr-dir: cannot write in '/proc'" in err, err
    assert "hang-missing-rank" not in out  # nothing ran


def test_a_seed_on_the_command_line_that_draws_a_clashing_fault_is_bad_input(capsys, write_scenario) -> None:
    """``[faults] seed = 2`` refuses a drawn straggler beside an injected one on the same rank (exit 2); the same
    draw by ``--seed 2`` (the file's seed 0) reached the engine: exit 70, "a bug in simnccl"."""
    text = _steps(
        *BASE_STEPS,
        '{ op = "new_group", ranks = [0, 1, 2, 3], bind = "tp" }',
        '{ op = "all_reduce", group = "tp", size_bytes = 32, repeat = 3 }',
        gpus=4,
    )
    faults = (
        '[faults]\nseed = {}\nmax_faults = 6\nclasses = ["straggler", "oom-at-init", "store-timeout"]\n'
        'inject = [{{ kind = "straggler", rank = 0, factor = 2.0 }},\n'
        '          {{ kind = "straggler", rank = 1, factor = 2.0 }}]\n'
    )
    allow = ("--allow", "hang,error,fail,unacted")  # its stragglers slow no compute
    loads = (write_scenario(text + faults.format(seed)) for seed in range(40))  # a file its own seed loads
    path = next(p for p in loads if _run(capsys, str(p), *allow)[0] == 0)
    clashing = next(seed for seed in range(40) if _run(capsys, str(path), "--seed", str(seed), *allow)[0])
    code, _, err = _run(capsys, str(path), "--seed", str(clashing), *allow)
    assert code == 2 and err.startswith("error: --seed: faults straggler rank"), err
    assert "internal error" not in err


@pytest.mark.parametrize(
    ("step", "key", "message"),
    [
        ('{ op = "all_reduce", call = "gather", root = 1 }', "call", "expected one of reduce (or none), got 'gather'"),
        ('{ op = "all_reduce", call = "reduce" }', "root", "reduce needs its root, a global rank >= 0, got None"),
        ('{ op = "all_gather", call = "gather", root = 2 }', "root", "ranks [2] are outside the world of 2"),
        ('{ op = "all_reduce", root = 1 }', "root", "only a call of reduce, gather names one, got 1"),
        ('{ op = "barrier", call = "reduce" }', "call", "expected one of monitored_barrier (or none)"),
        ('{ op = "send", peer = 1, tag = 2147483648 }', "tag", "expected an integer in -2147483648..2147483647"),
    ],
)
def test_a_collectives_torch_call_and_root_are_checked(capsys, write_scenario, step: str, key: str, message: str):
    _bad(capsys, write_scenario, _steps(*BASE_STEPS, step), f"workload.steps[2].{key}", message)


@pytest.mark.parametrize("dtype", ["", ', dtype = "Float"', ', dtype = "Half"'])
def test_a_padded_gather_of_anything_but_bytes_is_bad_input(capsys, write_scenario, dtype: str) -> None:
    """``padded`` stands for torch's object gathers, whose tensors are bytes; a padded Float gather of unequal
    sizes passed in the simulation, a gather gloo aborts as a tensor gather (and the real tier ran it as an
    object gather, so nothing compared the two)."""
    step = f'{{ op = "all_gather", size_bytes = 16, padded = true{dtype} }}'
    _bad(capsys, write_scenario, _steps(*BASE_STEPS, step), "workload.steps[2].padded", 'dtype "Byte"')
    with pytest.raises(ValueError, match='dtype "Byte"'):
        AllGather(size_bytes=16, padded=True)
    assert AllGather(size_bytes=16, dtype="Byte", padded=True).padded  # the object gather itself is accepted
