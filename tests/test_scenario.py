"""Scenario loading: programs per rank, templating, variants, and errors that name the file, the key and the
expectation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import TINY

from simnccl.ops import AllReduce, Checkpoint, InitProcessGroup, NewGroup, Program, SetDevice
from simnccl.scenario import Scenario, ScenarioError, load_scenario


def _with_steps(steps: str, *, gpus: int = 2, extra: str = "") -> str:
    """TINY with its steps replaced (``steps`` is the inside of the TOML array) and ``extra`` appended."""
    head = TINY.split("[workload]")[0].replace("gpus_per_node = 2", f"gpus_per_node = {gpus}")
    return f"{head}[workload]\nsteps = [\n{steps}\n]\n{extra}"


def _load(write_scenario, text: str) -> Scenario:
    return load_scenario(write_scenario(text))


# ---------------------------------------------------------------------------------------------- valid input


def test_minimal_scenario_loads(write_scenario) -> None:
    path = write_scenario(TINY)
    scenario = load_scenario(path)
    assert scenario.name == "tiny"
    assert scenario.source == str(path)
    assert scenario.seed == 0
    assert scenario.launcher == "torchrun"
    assert scenario.cluster.world_size == 2
    assert scenario.cluster.gpu.key == "h100-96gb"
    assert len(scenario.programs) == 2
    ops = scenario.programs[0].ops
    assert [type(op) for op in ops] == [SetDevice, InitProcessGroup, Checkpoint]
    assert ops[1].backend == "nccl"
    assert ops[2].label == "after_init"
    # No [[variants]]: one implicit variant with the [torch] settings.
    assert [v.name for v in scenario.variants] == ["default"]
    assert scenario.variants[0].release == "2.15"
    assert scenario.variants[0].profile.gpu == "h100-96gb"
    assert "2.15" in scenario.variants[0].profile.releases
    assert scenario.expectations == ()


def test_identical_ranks_share_one_program_object(write_scenario) -> None:
    scenario = _load(write_scenario, _with_steps('{ op = "set_device" },\n{ op = "init_process_group" }', gpus=4))
    first = scenario.programs[0]
    assert isinstance(first, Program)
    assert all(p is first for p in scenario.programs)


def test_repeat_expands_i_template(write_scenario) -> None:
    steps = """
  { op = "set_device" },
  { op = "init_process_group" },
  { op = "new_group", ranks = [0, 1], bind = "g{i}", repeat = 3 },
  { op = "all_reduce", group = "g{i}", size_mib = 2, repeat = 3 },
"""
    scenario = _load(write_scenario, _with_steps(steps))
    ops = scenario.programs[0].ops
    new_groups = [op for op in ops if isinstance(op, NewGroup)]
    assert [op.bind for op in new_groups] == ["g0", "g1", "g2"]
    assert all(op.ranks == (0, 1) for op in new_groups)
    reduces = [op for op in ops if isinstance(op, AllReduce)]
    assert [op.group for op in reduces] == ["g0", "g1", "g2"]
    assert all(op.size_bytes == 2 * 1024 * 1024 for op in reduces)
    assert scenario.programs[1] is scenario.programs[0]


def test_on_ranks_filters_and_splits_programs(write_scenario) -> None:
    steps = """
  { op = "set_device" },
  { op = "init_process_group" },
  { op = "new_group", ranks = [0, 1], bind = "a", on_ranks = [0, 1] },
  { op = "new_group", ranks = [2, 3], bind = "b", on_ranks = [2, 3] },
"""
    scenario = _load(write_scenario, _with_steps(steps, gpus=4))
    progs = scenario.programs
    assert [op.bind for op in progs[0].ops if isinstance(op, NewGroup)] == ["a"]
    assert [op.bind for op in progs[2].ops if isinstance(op, NewGroup)] == ["b"]
    assert progs[0] is progs[1]
    assert progs[2] is progs[3]
    assert progs[0] is not progs[2]
    assert progs[0] != progs[2]


def test_rank_template_gives_per_rank_programs(write_scenario) -> None:
    steps = """
  { op = "set_device" },
  { op = "init_process_group" },
  { op = "checkpoint", name = "rank{rank}" },
"""
    scenario = _load(write_scenario, _with_steps(steps, gpus=3))
    labels = [p.ops[-1].label for p in scenario.programs]
    assert labels == ["rank0", "rank1", "rank2"]
    assert len({id(p) for p in scenario.programs}) == 3


def test_rank_and_i_templates_combine_with_on_ranks(write_scenario) -> None:
    steps = """
  { op = "set_device" },
  { op = "checkpoint", name = "r{rank}-{i}", repeat = 2, on_ranks = [1] },
"""
    scenario = _load(write_scenario, _with_steps(steps))
    assert [op.label for op in scenario.programs[1].ops[1:]] == ["r1-0", "r1-1"]
    assert len(scenario.programs[0].ops) == 1


def test_variants_inherit_and_override_env(write_scenario) -> None:
    text = (
        TINY.replace('release = "2.15"', 'release = "2.15"\nenv = { A = "1", B = "base" }')
        + """
[[variants]]
name = "inherits"

[[variants]]
name = "overrides"
env = { B = "variant", C = "new" }
"""
    )
    scenario = _load(write_scenario, text)
    inherits, overrides = scenario.variants
    assert dict(inherits.env) == {"A": "1", "B": "base"}
    assert dict(overrides.env) == {"A": "1", "B": "variant", "C": "new"}
    assert inherits.release == overrides.release == "2.15"
    assert scenario.variant("overrides") is overrides


def test_variant_with_another_release_picks_that_releases_profile(write_scenario) -> None:
    text = (
        TINY
        + """
[[variants]]
name = "new"

[[variants]]
name = "old"
release = "2.14"
"""
    )
    scenario = _load(write_scenario, text)
    new, old = scenario.variants
    assert new.release == "2.15"
    assert old.release == "2.14"
    assert "2.15" in new.profile.releases
    assert "2.14" in old.profile.releases
    assert "2.15" not in old.profile.releases
    assert old.profile.name != new.profile.name
    assert old.profile.gpu == new.profile.gpu == "h100-96gb"


def test_expectations_are_parsed(write_scenario) -> None:
    text = (
        TINY
        + """
[[variants]]
name = "a"

[[variants]]
name = "b"

[[expect]]
variants = ["b"]
checkpoint = "after_init"
used_mib = 600
tolerance_mib = 5

[[expect]]
verdict = "pass"
"""
    )
    scenario = _load(write_scenario, text)
    first, second = scenario.expectations
    assert first.variants == ("b",)
    assert first.checkpoint == "after_init"
    assert first.used_mib == 600.0
    assert first.tolerance_mib == 5.0
    assert first.key == "expect[0]"
    assert second.variants == ("a", "b")  # no variants key: every variant
    assert second.verdict == "pass"


def test_unknown_variant_lookup_names_it(write_scenario) -> None:
    scenario = _load(write_scenario, TINY)
    with pytest.raises(ScenarioError, match=r"no variant 'nope'; this scenario has: default"):
        scenario.variant("nope")


# ---------------------------------------------------------------------------------------------- bad input


def _assert_error(path: Path, key: str, *expected: str) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    message = str(info.value)
    assert str(path) in message, message
    if key:
        assert f": {key}: " in message, message
        assert info.value.key == key
    for text in expected:
        assert re.search(text, message), f"{text!r} not in {message!r}"
    return info.value


def test_missing_file(tmp_path: Path) -> None:
    _assert_error(tmp_path / "absent.toml", "", "no such file")


def test_malformed_toml(write_scenario) -> None:
    _assert_error(write_scenario('[scenario\nname = "x"\n'), "", "malformed TOML")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfe[scenario]\n")
    _assert_error(path, "", "UTF-8")


def test_missing_scenario_name(write_scenario) -> None:
    _assert_error(write_scenario(TINY.replace('name = "tiny"\n', "")), "scenario.name", "missing", "a string")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ('""', "expected a name, got ''"),
        ('"  "', "expected a name"),
        ('"two\\nlines"', r"without control characters, got \\n in"),
        ('"\\u001b[31mred"', r"got \\x1b in"),
        ('"right\\u202eleft"', r"got \\u202e in"),
    ],
)
@pytest.mark.parametrize("where", ["scenario", "variant"])
def test_a_name_a_summary_prints_is_one_visible_line(write_scenario, where: str, name: str, expected: str) -> None:
    """An empty name printed an empty column, a newline split the summary's one line per variant, an ESC
    coloured the terminal."""
    if where == "scenario":
        text, key = TINY.replace('name = "tiny"', f"name = {name}"), "scenario.name"
    else:
        text, key = TINY + f"\n[[variants]]\nname = {name}\n", "variants[0].name"
    _assert_error(write_scenario(text), key, expected)


def test_missing_table(write_scenario) -> None:
    text = TINY.replace('[torch]\nrelease = "2.15"\n', "")
    _assert_error(write_scenario(text), "torch", "missing", "a table")


def test_unknown_top_level_key(write_scenario) -> None:
    _assert_error(write_scenario(TINY + "\n[extra]\nx = 1\n"), "extra", "unknown key", "expected one of", "cluster")


def test_unknown_key_in_cluster(write_scenario) -> None:
    text = TINY.replace("gpus_per_node = 2", "gpus_per_node = 2\ngpus = 2")
    _assert_error(write_scenario(text), "cluster.gpus", "unknown key", "expected one of", "gpus_per_node")


def test_string_where_int_expected(write_scenario) -> None:
    text = TINY.replace("gpus_per_node = 2", 'gpus_per_node = "2"')
    _assert_error(write_scenario(text), "cluster.gpus_per_node", "expected an integer", "got a string")


def test_boolean_where_int_expected(write_scenario) -> None:
    text = TINY.replace("gpus_per_node = 2", "gpus_per_node = true")
    _assert_error(write_scenario(text), "cluster.gpus_per_node", "expected an integer", "got a boolean")


def test_boolean_seed_rejected(write_scenario) -> None:
    text = TINY.replace('name = "tiny"', 'name = "tiny"\nseed = false')
    _assert_error(write_scenario(text), "scenario.seed", "expected an integer", "got a boolean")


def test_unknown_gpu_kind(write_scenario) -> None:
    text = TINY.replace('gpu = "h100-96gb"', 'gpu = "h999"')
    _assert_error(write_scenario(text), "cluster.gpu", "unknown GPU kind 'h999'", "expected one of", "h100-80gb")


def test_unknown_release(write_scenario) -> None:
    text = TINY.replace('release = "2.15"', 'release = "3.0"')
    _assert_error(write_scenario(text), "torch.release", r"unknown torch release '3\.0'", "expected one of", r"2\.14")


def test_unknown_release_in_variant(write_scenario) -> None:
    text = TINY + '\n[[variants]]\nname = "a"\n\n[[variants]]\nname = "b"\nrelease = "1.0"\n'
    _assert_error(write_scenario(text), "variants[1].release", r"unknown torch release '1\.0'", "expected one of")


def test_unknown_launcher(write_scenario) -> None:
    text = TINY.replace('release = "2.15"', 'release = "2.15"\nlauncher = "mpirun"')
    _assert_error(write_scenario(text), "torch.launcher", "expected one of torchrun, spawn", "mpirun")


@pytest.mark.parametrize("op", ["new_group", "init_process_group"])
def test_unknown_backend_name_in_step(write_scenario, op: str) -> None:
    extra = ", ranks = [0, 1]" if op == "new_group" else ""
    steps = f'{{ op = "set_device" }},\n{{ op = "{op}", backend = "ncl"{extra} }}'
    _assert_error(
        write_scenario(_with_steps(steps)),
        "workload.steps[1].backend",
        "unknown backend name 'ncl'",
        "expected one of",
        "nccl",
    )


def test_unknown_backend_in_device_list(write_scenario) -> None:
    steps = '{ op = "set_device" },\n{ op = "init_process_group", backend = "cpu:gloo,cuda:nccx" }'
    _assert_error(write_scenario(_with_steps(steps)), "workload.steps[1].backend", "unknown backend name 'nccx'")


def test_unknown_op(write_scenario) -> None:
    steps = '{ op = "set_device" },\n{ op = "all_reduse" }'
    _assert_error(
        write_scenario(_with_steps(steps)),
        "workload.steps[1].op",
        "unknown op 'all_reduse'",
        "expected one of",
        "all_reduce",
    )


def test_missing_op(write_scenario) -> None:
    steps = '{ op = "set_device" },\n{ group = "world" }'
    _assert_error(write_scenario(_with_steps(steps)), "workload.steps[1].op", "missing", "a string")


def test_unknown_field_for_op(write_scenario) -> None:
    steps = '{ op = "set_device" },\n{ op = "init_process_group" },\n{ op = "all_reduce", groop = "world" }'
    _assert_error(
        write_scenario(_with_steps(steps)),
        "workload.steps[2].groop",
        "unknown field for op 'all_reduce'",
        "expected one of",
        "group",
        "size_mib",
    )


def test_unknown_field_for_op_with_rank_template(write_scenario) -> None:
    steps = '{ op = "set_device" },\n{ op = "checkpoint", name = "r{rank}", colour = "red" }'
    _assert_error(write_scenario(_with_steps(steps)), "workload.steps[1].colour", "unknown field for op 'checkpoint'")


def test_wrong_type_for_op_field(write_scenario) -> None:
    steps = '{ op = "set_device" },\n{ op = "new_group", ranks = [0, "1"] }'
    _assert_error(write_scenario(_with_steps(steps)), "workload.steps[1].ranks", "expected a list of integers")


def test_negative_size_mib(write_scenario) -> None:
    steps = '{ op = "set_device" },\n{ op = "all_reduce", size_mib = -1 }'
    _assert_error(write_scenario(_with_steps(steps)), "workload.steps[1].size_mib", "non-negative number of MiB")


@pytest.mark.parametrize(
    ("op", "field", "value"),
    [
        ("new_group", "max_ctas", -1),
        ("new_group", "min_ctas", 0),
        ("new_group", "nvls_ctas", -1),
        ("init_process_group", "max_ctas", 0),
    ],
)
def test_an_nccl_config_field_nccl_rejects_is_refused_at_load(write_scenario, op: str, field: str, value: int) -> None:
    """The model's own rule, asked at load: it once stopped the simulation as "a bug in simnccl" (exit 70)."""
    steps = f'{{ op = "set_device" }},\n{{ op = "{op}", {field} = {value} }}'
    _assert_error(
        write_scenario(_with_steps(steps)), f"workload.steps[1].{field}", "expected an integer >= 1", f"got {value}"
    )


@pytest.mark.parametrize("repeat", [-1, 0])
def test_non_positive_repeat(write_scenario, repeat: int) -> None:
    steps = f'{{ op = "set_device" }},\n{{ op = "barrier", repeat = {repeat} }}'
    _assert_error(
        write_scenario(_with_steps(steps)), "workload.steps[1].repeat", "expected an integer >= 1", f"got {repeat}"
    )


def test_on_ranks_outside_world(write_scenario) -> None:
    steps = '{ op = "set_device" },\n{ op = "barrier", on_ranks = [1, 2] }'
    _assert_error(
        write_scenario(_with_steps(steps)), "workload.steps[1].on_ranks", r"ranks \[2\]", "outside the world of 2"
    )


def test_on_ranks_not_integers(write_scenario) -> None:
    steps = '{ op = "set_device" },\n{ op = "barrier", on_ranks = [true] }'
    _assert_error(write_scenario(_with_steps(steps)), "workload.steps[1].on_ranks", "expected a list of integers")


def test_empty_steps(write_scenario) -> None:
    _assert_error(write_scenario(_with_steps("")), "workload.steps", "at least one step")


def test_env_value_not_a_string_in_torch(write_scenario) -> None:
    text = TINY.replace('release = "2.15"', 'release = "2.15"\nenv = { NCCL_DEBUG = 1 }')
    _assert_error(write_scenario(text), "torch.env.NCCL_DEBUG", "expected a string", "got an integer")


def test_env_value_not_a_string_in_variant(write_scenario) -> None:
    text = TINY + '\n[[variants]]\nname = "a"\nenv = { X = true }\n'
    _assert_error(write_scenario(text), "variants[0].env.X", "expected a string", "got a boolean")


@pytest.mark.parametrize("where", ["torch", "variant"])
def test_bad_nccl_knob_is_input_error(write_scenario, where: str) -> None:
    """Every NCCL_* knob the memory model parses is checked at load, naming the knob (NCCL itself takes
    NCCL_MAX_NCHANNELS=0 as 1, so that one is not an error)."""
    if where == "torch":
        text = TINY.replace('release = "2.15"', 'release = "2.15"\nenv = { NCCL_MAX_NCHANNELS = "abc" }')
        key = "torch.env.NCCL_MAX_NCHANNELS"
        expected = "expected an integer"
    else:
        text = TINY + '\n[[variants]]\nname = "a"\n\n[[variants]]\nname = "b"\nenv = { NCCL_BUFFSIZE = "0" }\n'
        key = "variants[1].env.NCCL_BUFFSIZE"
        expected = "expected an integer >= 1"
    _assert_error(write_scenario(text), key, expected)


def test_duplicate_variant_name(write_scenario) -> None:
    text = TINY + '\n[[variants]]\nname = "a"\n\n[[variants]]\nname = "a"\n'
    _assert_error(write_scenario(text), "variants[1].name", "duplicate variant name 'a'")


def test_unknown_key_in_variant(write_scenario) -> None:
    text = TINY + '\n[[variants]]\nname = "a"\nenvironment = { X = "1" }\n'
    _assert_error(write_scenario(text), "variants[0].environment", "unknown key", "expected one of", "env")


def test_variants_not_an_array(write_scenario) -> None:
    text = TINY + '\n[variants]\nname = "a"\n'
    _assert_error(write_scenario(text), "variants", r"an array of tables \[\[variants\]\]", "got a table")


def test_expect_referencing_unknown_variant(write_scenario) -> None:
    text = TINY + '\n[[variants]]\nname = "a"\n\n[[expect]]\nvariants = ["a", "zz"]\nverdict = "pass"\n'
    _assert_error(write_scenario(text), "expect[0].variants", "unknown variant 'zz'", "expected one of a")


def test_expect_that_asserts_nothing(write_scenario) -> None:
    text = TINY + '\n[[expect]]\nverdict = "pass"\n\n[[expect]]\ncheckpoint = "after_init"\ntolerance_pct = 2\n'
    _assert_error(
        write_scenario(text), "expect[1]", "asserts nothing", "expected used_mib, verdict, error_contains or hang_ranks"
    )


def test_expect_unknown_verdict(write_scenario) -> None:
    text = TINY + '\n[[expect]]\nverdict = "ok"\n'
    _assert_error(write_scenario(text), "expect[0].verdict", "expected one of pass, fail, hang, error", "'ok'")


def test_expect_used_mib_without_checkpoint(write_scenario) -> None:
    text = TINY + "\n[[expect]]\nused_mib = 10\n"
    _assert_error(write_scenario(text), "expect[0].used_mib", "needs a checkpoint")


def test_expect_unknown_key(write_scenario) -> None:
    text = TINY + '\n[[expect]]\nverdict = "pass"\ntolerance = 1\n'
    _assert_error(write_scenario(text), "expect[0].tolerance", "unknown key", "expected one of", "tolerance_pct")


@pytest.mark.parametrize("where", ["scenario", "variant"])
def test_unknown_policy(write_scenario, where: str) -> None:
    if where == "scenario":
        text = TINY.replace('name = "tiny"', 'name = "tiny"\npolicy = "lazy-everything"')
        key = "scenario.policy"
    else:
        text = TINY + '\n[[variants]]\nname = "a"\npolicy = "lazy-everything"\n'
        key = "variants[0].policy"
    _assert_error(write_scenario(text), key, "unknown policy 'lazy-everything'", "expected one of torch-default")


def test_unknown_workload_generator(write_scenario) -> None:
    text = TINY.split("[workload]")[0] + '[workload]\ngenerator = "jax"\nargs = { tp = 2 }\n'
    _assert_error(write_scenario(text), "workload.generator", "unknown workload generator 'jax'", "megatron")


@pytest.mark.parametrize(
    ("extra", "key", "fragment"),
    [
        ('checkpoint = "a"\nused_mib = 1\ntolerance_pct = -1\n', "tolerance_pct", "non-negative"),
        ('verdict = "pass"\ntolerance_mib = 3\n', "tolerance_mib", "only meaningful with used_mib"),
        ('checkpoint = "a"\nused_mib = 1\ndevices = [0]\n', "devices", "device keys"),
        # keys that change nothing without their partner looked like checks and measured nothing (fuzzing)
        ('verdict = "pass"\ndevices = ["n0:cuda:1"]\n', "devices", "only meaningful with used_mib"),
        ('verdict = "pass"\ncheckpoint = "after_init"\n', "checkpoint", "only meaningful with used_mib"),
        ('verdict = "pass"\ntolerance_s = 0.5\n', "tolerance_s", "only meaningful with detected_at_s, error_at_s"),
    ],
)
def test_expect_tolerance_and_devices_are_checked(write_scenario, extra, key, fragment) -> None:
    text = TINY + "\n[[expect]]\n" + extra
    _assert_error(write_scenario(text), f"expect[0].{key}", fragment)


def test_empty_on_ranks_and_missing_peer_are_errors(write_scenario) -> None:
    empty = TINY.replace('{ op = "set_device" }', '{ op = "set_device", on_ranks = [] }')
    _assert_error(write_scenario(empty), "workload.steps[0].on_ranks", "at least one rank")
    nopeer = TINY.replace('{ op = "set_device" }', '{ op = "send", group = "world" }')
    _assert_error(write_scenario(nopeer), "workload.steps[0].peer", "missing")


def test_named_profile_must_cover_the_release(write_scenario) -> None:
    text = TINY.replace("[workload]", 'profile = "h100-96gb-torch2.14"\n\n[workload]')
    _assert_error(write_scenario(text), "torch.profile", "does not cover torch release")


def test_matrix_expands_to_the_cartesian_product(write_scenario) -> None:
    text = TINY + '\n[matrix]\nrelease = ["2.14", "2.15"]\nenv = { TORCH_DIST_USE_NCCL2 = ["0", "1"] }\n'
    scenario = load_scenario(write_scenario(text))
    assert [v.name for v in scenario.variants] == [
        "release=2.14,TORCH_DIST_USE_NCCL2=0",
        "release=2.14,TORCH_DIST_USE_NCCL2=1",
        "release=2.15,TORCH_DIST_USE_NCCL2=0",
        "release=2.15,TORCH_DIST_USE_NCCL2=1",
    ]
    assert scenario.variants[1].env["TORCH_DIST_USE_NCCL2"] == "1"
    assert scenario.variants[0].release == "2.14" and "2.14" in scenario.variants[0].profile.releases


def test_matrix_values_are_checked(write_scenario) -> None:
    _assert_error(write_scenario(TINY + '\n[matrix]\nrelease = ["2.99"]\n'), "matrix.release", "unknown torch release")
    _assert_error(write_scenario(TINY + '\n[matrix]\nenv = { X = "1" }\n'), "matrix.env.X", "list of strings")


@pytest.mark.parametrize("name", ["nccl_from_the_future", "Nccl_New", "NCCL-NEW", "1NCCL", "", "NCCL NEW"])
def test_extra_env_knobs_must_be_upper_case_env_var_names(write_scenario, name: str) -> None:
    """torch and NCCL read their variables in upper case, as written: a lowercase knob declared (and set) was
    accepted and did nothing in production."""
    text = TINY.replace('release = "2.15"', f'release = "2.15"\nextra_env_knobs = ["NCCL_OK", "{name}"]')
    _assert_error(write_scenario(text), "torch.extra_env_knobs", "expected upper-case environment variable names")
    assert repr(name) in str(_assert_error(write_scenario(text), "torch.extra_env_knobs"))


@pytest.mark.parametrize("table", ["[matrix]\n", "[matrix]\nenv = {}\n", "[matrix.env]\n"])
def test_a_matrix_that_varies_nothing_is_refused(write_scenario, table: str) -> None:
    """An empty [matrix] once added a variant named "matrix": the scenario's own settings renamed."""
    _assert_error(write_scenario(TINY + "\n" + table), "matrix", "varies nothing; expected release, policy or env")
