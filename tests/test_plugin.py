"""The pytest plugin, exercised in fresh pytest processes (pytester): markers, fixtures, options, profiles,
the replayable failure report, the program count summed over xdist workers, and the replay command."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis._settings import _CI_VARS

from simnccl.ops import Alloc, AllReduce, InitProcessGroup, NewGroup, PgOptions, SetDevice, SplitGroup
from simnccl.testing import replay
from simnccl.testing.replay import SimCase, plugin_registered, share_identical

# Name the plugin only when -p or the pytest11 entry point has not loaded it already.
pytest_plugins = ["pytester"] if plugin_registered() else ["simnccl.testing.plugin", "pytester"]

pytestmark = pytest.mark.property  # run with the property suite (pytest -m property)


def _entry_point_installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == "simnccl.testing.plugin" for ep in entry_points(group="pytest11"))


ENTRY_POINT = _entry_point_installed()
# Installed (pip install -e .), the pytest11 entry point loads the plugin into every session under the name
# "simnccl", and "-p simnccl" names that same plugin; from a bare source tree only the module path works.
PLUGIN = ("-p", "simnccl") if ENTRY_POINT else ("-p", "simnccl.testing.plugin")


def run(pytester: pytest.Pytester, *args: str, plugin: bool = True) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*(PLUGIN if plugin else ()), *args)


# The variables by which hypothesis decides it runs on a CI machine (and then loads its own ``ci`` profile):
# its own table, so a variable hypothesis adds later is cleared too.
CI_VARIABLES = tuple(_CI_VARS)


@pytest.fixture(params=[False, True], ids=["laptop", "ci-machine"])
def ci_machine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Run the test as on a laptop and as on a CI machine (``CI=true``), where hypothesis loads its own ``ci``
    profile at import: simnccl's profiles must behave the same on both."""
    for name in CI_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if request.param:
        monkeypatch.setenv("CI", "true")
    return bool(request.param)


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--markers")
    for marker in ("gpu", "real", "slow", "property"):
        result.stdout.fnmatch_lines([f"@pytest.mark.{marker}:*"])


def test_fixtures_simulate_clusters_and_scenarios(pytester: pytest.Pytester) -> None:
    pytester.makefile(
        ".toml",
        tiny=textwrap.dedent(
            """\
            [scenario]
            name = "tiny"
            [cluster]
            gpu = "h100-96gb"
            gpus_per_node = 2
            [torch]
            release = "2.15"
            [workload]
            steps = [{ op = "set_device" }, { op = "init_process_group", backend = "nccl" }]
            """
        ),
    )
    pytester.makepyfile(
        textwrap.dedent(
            """\
            import pytest
            from simnccl.ops import AllReduce, InitProcessGroup, SetDevice

            @pytest.mark.property
            def test_fixtures(simnccl_cluster, simnccl_simulate, simnccl_scenario, simnccl_seed):
                assert simnccl_cluster("l4", nodes=2, gpus_per_node=4).world_size == 8
                out = simnccl_simulate([SetDevice(), InitProcessGroup(), AllReduce()], gpus_per_node=4)
                assert out.verdict == "pass" and len(out.ranks) == 4
                result = simnccl_scenario("tiny.toml")
                assert [v.outcome.verdict for v in result.variants] == ["pass"]
                assert simnccl_seed is None
            """
        )
    )
    run(pytester, "--strict-markers").assert_outcomes(passed=1)


def test_simnccl_seed_seeds_hypothesis(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        textwrap.dedent(
            """\
            from hypothesis import core, given, settings, strategies as st

            def test_seed(simnccl_seed):
                assert simnccl_seed == 1234
                assert core.global_force_seed == 1234
                assert settings.default.derandomize is False

            @given(st.integers())
            def test_runs(x):
                pass
            """
        )
    )
    run(pytester, "--simnccl-seed", "1234").assert_outcomes(passed=2)


@pytest.mark.parametrize(
    ("env", "profile", "examples", "derandomize"), [(None, "simnccl-ci", 100, True), ("dev", "simnccl-dev", 25, False)]
)
def test_profile_is_chosen_by_environment(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    ci_machine: bool,
    env: str | None,
    profile: str,
    examples: int,
    derandomize: bool,
) -> None:
    if env is None:
        monkeypatch.delenv("SIMNCCL_HYPOTHESIS_PROFILE", raising=False)
    else:
        monkeypatch.setenv("SIMNCCL_HYPOTHESIS_PROFILE", env)
    pytester.makepyfile(
        textwrap.dedent(
            f"""\
            from hypothesis import settings
            import simnccl.testing.strategies  # a suite that uses simnccl's strategies gets ``ci`` by default

            def test_profile():
                assert settings.get_current_profile_name() == {profile!r}
                assert settings.default.max_examples == {examples}
                assert settings.default.derandomize is {derandomize}
                assert settings.default.deadline is None
            """
        )
    )
    result = run(pytester)
    result.assert_outcomes(passed=1)
    if env is not None:  # loaded at configure (the header says so); else when the module imports the strategies
        result.stdout.fnmatch_lines([f"simnccl: hypothesis profile '{profile}'*"])


def test_hypothesis_profile_option_wins(pytester: pytest.Pytester, ci_machine: bool) -> None:
    pytester.makepyfile(
        "from hypothesis import settings\n"
        "def test_profile():\n"
        "    assert settings.get_current_profile_name() == 'simnccl-thorough'\n"
    )
    run(pytester, "--hypothesis-profile", "simnccl-thorough").assert_outcomes(passed=1)


def test_naming_hypothesis_own_profile_on_the_command_line_is_a_choice(
    pytester: pytest.Pytester, ci_machine: bool
) -> None:
    """``--hypothesis-profile default`` (``ci`` on a CI machine: the name hypothesis loads by itself) looked like
    nobody's choice, and importing the strategies loaded simnccl's ``ci`` over it (100 examples where the user's
    ``default`` asks for more)."""
    own = "ci" if ci_machine else "default"
    pytester.makepyfile(
        "from hypothesis import settings\n"
        "import simnccl.testing.strategies\n"
        "def test_profile():\n"
        f"    assert settings.get_current_profile_name() == {own!r}\n"
    )
    run(pytester, "--hypothesis-profile", own).assert_outcomes(passed=1)


FAILING = textwrap.dedent(
    """\
    import pytest
    from hypothesis import given
    from simnccl.testing.strategies import cases

    @pytest.mark.property
    @given(cases(policy="torch-default"))
    def test_valid_programs_hang(case):
        assert case.run().verdict == "hang"  # false: valid programs pass
    """
)


def test_failure_prints_the_shrunk_case_and_the_replay_command(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(FAILING)
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*simnccl: minimal failing case*",
            "from simnccl.ops import *",
            "out = simulate(*",
            "# replay: python -m simnccl.testing.replay *.json",
        ]
    )
    line = next(x for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay "))
    path = Path(line.split()[-1])
    case = SimCase.load(path)
    # Shrunk: one rank, the smallest program the generator makes (set_device, init, one new_group of the rank,
    # three checkpoints: the simplest family count is one, see simnccl.testing.strategies).
    assert case.world_size == 1
    assert len(case.programs[0]) == 6
    assert replay.main([str(path), "--simulate-only"]) == 0  # it passes: the property, not the program, was wrong
    data = json.loads(path.read_text())
    assert data["failure"]["test"].endswith("::test_valid_programs_hang") and data["failure"]["checks"] == []
    # The replay re-runs the failed check, the test's own assertion here: it still fails.
    assert replay.main([str(path)]) == 1


def test_program_count_is_summed_over_xdist_workers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        textwrap.dedent(
            """\
            import pytest
            from simnccl.ops import Checkpoint, InitProcessGroup, SetDevice
            from simnccl.testing.replay import SimCase, generated

            @pytest.mark.parametrize("n", range(4))
            def test_five_programs(n):
                for i in range(5):  # as a strategy draws them (only drawn cases count)
                    ops = (SetDevice(), InitProcessGroup(), Checkpoint(label=f"{n}.{i}"))
                    case = generated(SimCase(programs=(ops,) * 2))
                    case.run()
                    case.run(policy="lazy-init")  # the same program again: one program, two simulations
                    generated(SimCase(programs=(ops,) * 2)).run()  # drawn again, the same content: counted once
            """
        )
    )
    result = run(pytester, "-n", "2")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["simnccl: 20 generated programs simulated (60 simulations)*"])
    short = run(pytester, "-n", "2", "--simnccl-min-programs", "21")
    assert short.ret == pytest.ExitCode.TESTS_FAILED
    short.stdout.fnmatch_lines(["simnccl: only 20 generated programs simulated, fewer than 21"])


def test_a_program_every_worker_draws_counts_once(pytester: pytest.Pytester) -> None:
    """``--dist each`` runs every test on every worker: derandomized, each draws the same examples. Counted per
    worker, two workers' 5 programs made 10 and met ``--simnccl-min-programs 10``."""
    pytester.makepyfile(
        textwrap.dedent(
            """\
            from simnccl.ops import Checkpoint, InitProcessGroup, SetDevice
            from simnccl.testing.replay import SimCase, generated

            def test_five_programs():
                for i in range(5):
                    ops = (SetDevice(), InitProcessGroup(), Checkpoint(label=str(i)))
                    generated(SimCase(programs=(ops,) * 2)).run()
            """
        )
    )
    result = run(pytester, "-n", "2", "--dist", "each", "--simnccl-min-programs", "10")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["simnccl: 5 generated programs simulated (10 simulations)*"])


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_a_shortfall_keeps_an_interrupted_sessions_own_exit_status(pytester: pytest.Pytester, xdist: tuple) -> None:
    """A collection error interrupts a serial session (exit 2; xdist's controller goes on and exits 1); with
    ``--simnccl-min-programs`` the serial one exited 1, a crash read as failed tests. The session exits as it
    would without the option, and the shortfall is still said."""
    pytester.makepyfile(test_fine="def test_fine():\n    pass\n", test_broken="import no_such_module_xyz\n")
    without = run(pytester, *xdist)
    result = run(pytester, *xdist, "--simnccl-min-programs", "5")
    assert without.ret == (pytest.ExitCode.TESTS_FAILED if xdist else pytest.ExitCode.INTERRUPTED)
    assert result.ret == without.ret, result.stdout.str()
    result.stdout.fnmatch_lines(["simnccl: only 0 generated programs simulated, fewer than 5"])


@pytest.mark.parametrize(("where", "value"), [("flag", "-1"), ("flag", "many"), ("env", "abc"), ("env", "-5")])
def test_a_bad_minimum_is_a_usage_error(pytester: pytest.Pytester, monkeypatch, where: str, value: str) -> None:
    """``SIMNCCL_MIN_PROGRAMS=abc`` was read with a bare ``int()`` while the plugin registered its options: a
    traceback before any test; ``--simnccl-min-programs -1`` was accepted (no minimum). Both: a usage error."""
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    if where == "env":
        monkeypatch.setenv("SIMNCCL_MIN_PROGRAMS", value)
        result = run(pytester)
    else:
        result = run(pytester, "--simnccl-min-programs", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "expected a whole number of programs >= 0" in result.stderr.str()
    assert "Traceback" not in result.stderr.str()


@pytest.mark.parametrize("value", ["-1", "seven"])
def test_a_negative_seed_is_a_usage_error(pytester: pytest.Pytester, value: str) -> None:
    """``--simnccl-seed -1`` drew exactly what ``1`` draws (hypothesis seeds Python's random with the absolute
    value): a nightly job passing "another seed" got the same examples."""
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    result = run(pytester, "--simnccl-seed", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--simnccl-seed: expected a whole number >= 0" in result.stderr.str()


def test_test_modules_register_the_plugin_once(pytester: pytest.Pytester) -> None:
    """The guard test modules use: name the plugin in pytest_plugins only when -p/the entry point didn't."""
    body = textwrap.dedent(
        """\
        from simnccl.testing.replay import plugin_registered
        if not plugin_registered():
            pytest_plugins = ["simnccl.testing.plugin"]

        def test_fixture(simnccl_cluster):
            assert simnccl_cluster().world_size == 2
        """
    )
    pytester.makepyfile(test_a=body, test_b=body)
    run(pytester, plugin=True).assert_outcomes(passed=2)
    run(pytester, plugin=False).assert_outcomes(passed=2)
    if ENTRY_POINT:  # and naming the module path on top of the entry point is refused by pytest, not by us
        result = pytester.runpytest_subprocess("-p", "no:simnccl", "-p", "simnccl.testing.plugin")
        result.assert_outcomes(passed=2)


@pytest.mark.skipif(not ENTRY_POINT, reason="simnccl is not installed: no pytest11 entry point")
def test_entry_point_loads_the_plugin_without_touching_hypothesis_settings(
    pytester: pytest.Pytester, ci_machine: bool
) -> None:
    """Installed, the plugin is in every session (markers, fixtures); a suite that never imports simnccl's
    strategies and sets no SIMNCCL_HYPOTHESIS_PROFILE keeps hypothesis' own default profile."""
    pytester.makepyfile(
        textwrap.dedent(
            """\
            from hypothesis import settings

            def test_untouched(simnccl_cluster):
                assert simnccl_cluster().world_size == 2
                # hypothesis' own choice: its built-in ``ci`` on a CI machine, else ``default``
                assert settings.get_current_profile_name() == {expected!r}
                assert "simnccl-ci" in settings._profiles  # registered, not loaded
            """
        ).format(expected="ci" if ci_machine else "default")
    )
    monkey = pytest.MonkeyPatch()
    monkey.delenv("SIMNCCL_HYPOTHESIS_PROFILE", raising=False)
    try:
        result = pytester.runpytest_subprocess()
    finally:
        monkey.undo()
    result.assert_outcomes(passed=1)
    pytester.runpytest_subprocess("--markers").stdout.fnmatch_lines(["@pytest.mark.real:*"])


# ------------------------------------------------------------------------------------------ replay


def test_case_json_round_trip_keeps_ops_and_sharing(tmp_path: Path) -> None:
    programs = share_identical(
        [
            [SetDevice(), InitProcessGroup(pg_options=PgOptions(lazy_init=True)), NewGroup(ranks=(0, 1), bind="g")],
            [SetDevice(), InitProcessGroup(pg_options=PgOptions(lazy_init=True)), NewGroup(ranks=(0, 1), bind="g")],
            [SetDevice(), SplitGroup(split_ranks=((0, 1), (2,)), bind="s"), AllReduce(group="s", size_bytes=8)],
        ]
    )
    case = SimCase(programs=programs, gpus_per_node=3, release="2.16-dev", env=(("X", "1"),), policy="dedupe")
    loaded = SimCase.load(case.dump(tmp_path / "case.json"))
    assert loaded == case
    assert loaded.programs[0] is loaded.programs[1] and loaded.programs[2] is not loaded.programs[0]
    data = json.loads((tmp_path / "case.json").read_text())
    assert data["rank_program"] == [0, 0, 1]
    namespace: dict[str, object] = {}
    exec(case.snippet().replace("print(", "_ = ("), namespace)  # the snippet is runnable Python
    assert namespace["out"].verdict == case.run().verdict  # type: ignore[attr-defined]


def test_replay_command_reports_a_hang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    start = [SetDevice(), InitProcessGroup()]
    hang = SimCase(programs=share_identical([[*start, AllReduce()], start]))
    path = hang.dump(tmp_path / "hang.json")
    assert replay.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "verdict: hang" in out and "waiting for [1]" in out
    assert replay.main([str(path), "--snippet"]) == 0
    assert "simulate([p0, p1]" in capsys.readouterr().out
    assert replay.main([str(path), "--policy", "lazy-init"]) == 1
    with pytest.raises(ValueError, match="not a simnccl case"):
        SimCase.from_json({"schema": "other"})


def test_replay_refuses_a_case_whose_free_has_mib_naming_empty_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = [SetDevice(), Alloc(mib=100, tag="t")]
    path = SimCase(programs=share_identical([program, program])).dump(tmp_path / "old.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    data["programs"][0].append({"op": "free", "mib": 60.0, "tag": "t"})  # written before empty_cache existed
    path.write_text(json.dumps(data), encoding="utf-8")
    assert replay.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "free op: mib:" in err and "op 'empty_cache'" in err


def _edited_case(tmp_path: Path, edit: object) -> Path:
    """A valid 2-rank case (init, a group, an all_reduce on it) with ``edit(data)`` applied to its JSON."""
    program = [SetDevice(), InitProcessGroup(), NewGroup(ranks=(0, 1), bind="g"), AllReduce(group="g")]
    path = SimCase(programs=share_identical([program, program])).dump(tmp_path / "case.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)  # type: ignore[operator]
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # each crashed the replay (exit 70) or ran something the file does not say
        (lambda d: d.update(env=None), "env: expected an object of strings"),
        (lambda d: d.update(gpu="tpu-v9"), "gpu: unknown GPU kind 'tpu-v9'"),
        (lambda d: d.update(release="9.9"), "release: expected one of"),
        (lambda d: d.update(nodes="\x1b[31mRED"), "nodes: expected an integer >= 1, got '\\x1b[31mRED'"),
        (lambda d: d.update(programs=[]), "programs: expected 1 to 2 lists of ops"),
        (lambda d: d["programs"][0][2].update(ranks=[None, 1]), "programs[0][2].ranks: expected a list of integers"),
        (lambda d: d["programs"][0][3].update(size_bytes=-1), "programs[0][3].size_bytes: expected a non-negative"),
        (lambda d: d["programs"][0][3].update(size_bytes=float("nan")), "programs[0][3].size_bytes: expected an"),
        (lambda d: d["programs"][0][3].update(op="teleport"), "programs[0][3]: expected an op object"),
        (lambda d: d.update(rank_program=[0, -1]), "rank_program: expected 2 indexes (one per rank) in 0..0"),
        (lambda d: d.update(note=5), "note: expected text"),
        # a scenario's spelling passed the check, then the loader raised a raw TypeError (exit 70)
        (lambda d: d["programs"][0][3].update(size_mib=4), "programs[0][3]: 'size_mib': unknown field for op"),
        (lambda d: d["programs"][0][2].update(lazy_init=True), "programs[0][2]: 'lazy_init': unknown field for op"),
        (lambda d: d["programs"][0][3].update(pg_options={}), "programs[0][3]: 'pg_options': unknown field for op"),
    ],
)
def test_replay_refuses_a_case_file_field_it_cannot_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: object, message: str
) -> None:
    path = _edited_case(tmp_path, edit)
    assert replay.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and message in err and err.count("\n") == 1, err


def test_replay_prints_a_case_file_s_text_with_its_controls_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _edited_case(tmp_path, lambda d: d.update(note="\x1b[2Jline\nnext \u202e"))
    assert replay.main([str(path), "--simulate-only"]) == 0
    out = capsys.readouterr().out
    assert "note: \\x1b[2Jline\\nnext \\u202e" in out and "\x1b" not in out, out
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")  # the decoder's recursion: exit 70 before
    assert replay.main([str(deep)]) == 2
    assert "nested too deep to read" in capsys.readouterr().err
    test = _edited_case(tmp_path, lambda d: d.update(failure={"test": "\x1b[31mRED::t"}))
    assert replay.main([str(test)]) == 2  # pytest was run on it and echoed it raw
    assert "failure.test: expected a pytest node id" in capsys.readouterr().err


# ---------------------------------------------------------------------- a team's own policy, as a user meets it

TEAM_SUITE = textwrap.dedent(
    """\
    from dataclasses import dataclass, replace

    from hypothesis import given, settings
    from simnccl.policy import BasePolicy
    from simnccl.testing import invariants as inv
    from simnccl.testing.strategies import cases


    @dataclass(frozen=True)
    class LastMemberLazy(BasePolicy):
        name: str = "last-member-lazy"
        rank_independent = True  # a bare promise the harness must not trust

        def on_group(self, request, decision):
            if len(request.ranks) > 1 and request.rank == request.ranks[-1]:
                return replace(decision, pg_options=replace(decision.pg_options, lazy_init=True))
            return decision


    @given(cases(policy=LastMemberLazy(), min_world=2, release="2.15", env={}))
    @settings(max_examples=30)
    def test_team_policy_passes(case):
        out = case.run()
        assert (v := inv.passes(out)), v.explanation


    @given(case=cases(policy="torch-default", min_world=2, max_world=2, release="2.15", env={}))
    @settings(max_examples=10)
    def test_fixtures_work_inside_given(case, simnccl_simulate, simnccl_cluster):
        assert simnccl_cluster().world_size == 2
        assert simnccl_simulate(list(case.programs), policy=case.policy).verdict == "pass"
    """
)


@pytest.mark.parametrize("workers", [None, "2"], ids=["serial", "xdist"])
def test_a_rank_dependent_team_policy_fails_with_both_plans_and_a_replay(
    pytester: pytest.Pytester, workers: str | None
) -> None:
    pytester.makepyfile(test_team=TEAM_SUITE)
    junit = pytester.path / "junit.xml"
    args = ["-n", workers] if workers else []
    result = run(pytester, *args, f"--junitxml={junit}")
    result.assert_outcomes(failed=1, passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    text = result.stdout.str()
    assert "PolicyInconsistency" in text and "planned differently for group" in text
    assert "lazy_init" in text  # both plans are shown
    assert "INTERNALERROR" not in text and "HealthCheck" not in text
    line = next(x for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay "))
    path = Path(line.split()[-1])
    assert "simnccl_replay" in junit.read_text() and str(path) in junit.read_text()
    data = json.loads(path.read_text())
    assert data["policy"]["import"] == "test_team:LastMemberLazy"
    assert [c["check"] for c in data["failure"]["checks"]] == ["passes"]
    # The replay, from another folder: rebuilds the policy from the recorded file, re-checks, still fails.
    done = pytester.run(sys.executable, "-m", "simnccl.testing.replay", str(path))
    assert done.ret == 1, done.stdout.str()
    done.stdout.fnmatch_lines(["*check passes: FAILS*PolicyInconsistency*", "still fails: passes"])


PROCESS_DEPENDENT = textwrap.dedent(
    """\
    import os
    from dataclasses import dataclass, replace

    from simnccl.ops import InitProcessGroup, NewGroup, SetDevice
    from simnccl.policy import BasePolicy
    from simnccl.testing import invariants as inv
    from simnccl.testing.replay import SimCase


    @dataclass(frozen=True)
    class LazyWhereFlagged(BasePolicy):
        name: str = "lazy-where-flagged"

        def on_group(self, request, decision):  # state of the process, not of the request: wrong
            if os.environ.get("TEAM_FLAG") == "1" and request.rank == 1:
                return replace(decision, pg_options=replace(decision.pg_options, lazy_init=True))
            return decision


    def test_flagged_process(monkeypatch):
        monkeypatch.setenv("TEAM_FLAG", "1")
        ops = (SetDevice(), InitProcessGroup(backend="nccl"), NewGroup(ranks=(0, 1), bind="g"))
        out = SimCase(programs=(ops, ops), policy=LazyWhereFlagged()).run()
        assert (v := inv.passes(out)), v.explanation
    """
)


CHECKED_AFTER_A_BASELINE = textwrap.dedent(
    """\
    from simnccl.ops import AllReduce, InitProcessGroup, SetDevice
    from simnccl.testing import invariants as inv
    from simnccl.testing.replay import SimCase

    START = (SetDevice(), InitProcessGroup(backend="nccl"))
    HANGS = (START + (AllReduce(),), START)  # rank 1 never joins rank 0's all_reduce


    def test_checked_after_a_baseline():
        out = SimCase(programs=HANGS).run()
        baseline = SimCase(programs=(START, START)).run()
        assert baseline.verdict == "pass"
        assert (v := inv.passes(out)), v.explanation


    def test_own_assertion_after_an_expected_failure():
        assert not inv.passes(SimCase(programs=HANGS).run())  # the test expects this one to fail
        assert SimCase(programs=(START, START)).run().verdict == "hang"
    """
)


def test_the_report_names_the_case_the_failed_check_judged(pytester: pytest.Pytester) -> None:
    """The report and the case file held the last simulation of the test, not the failing one: a test that
    simulated a passing baseline after the failing case printed the baseline, whose replay passes. A check
    that failed as the test expected, before the test's own assertion failed on another case, is not it."""
    pytester.makepyfile(test_baseline=CHECKED_AFTER_A_BASELINE)
    result = run(pytester)
    result.assert_outcomes(failed=2)
    files = [
        Path(x.split()[-1]) for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay ")
    ]
    data = {json.loads(path.read_text())["failure"]["test"].split("::")[-1]: path for path in files}
    hangs = (
        (SetDevice(), InitProcessGroup(backend="nccl"), AllReduce()),
        (SetDevice(), InitProcessGroup(backend="nccl")),
    )
    checked = data["test_checked_after_a_baseline"]
    assert SimCase.load(checked).programs == hangs
    assert [c["check"] for c in json.loads(checked.read_text())["failure"]["checks"]] == ["passes"]
    assert replay.main([str(checked)]) == 1  # the recorded check fails again on the recorded case
    own = data["test_own_assertion_after_an_expected_failure"]
    assert SimCase.load(own).programs == (hangs[1], hangs[1])
    assert json.loads(own.read_text())["failure"]["checks"] == []


def test_the_record_of_recent_simulations_keeps_no_outcome_alive() -> None:
    """It kept the last 64 outcomes: a test simulating in a loop held them all, and the cyclic GC walked them
    again and again (a plain loop of 2,000 generated cases ran 20% slower). Only ``last_outcome()`` is kept."""
    import gc
    import weakref

    start = (SetDevice(), InitProcessGroup(backend="nccl"))
    refs = [weakref.ref(SimCase(programs=(start, start)).run()) for _ in range(3)]
    gc.collect()
    assert [r() is None for r in refs] == [True, True, False]
    assert replay.last_outcome() is refs[2]()


def test_an_own_assertion_after_a_control_failed_its_check_is_the_tests_own(pytester: pytest.Pytester) -> None:
    """``if not passes(control): assert mine.verdict == "pass"``: the check failed on the control, simulated
    last, as the test meant it to; the failure, the test's own assertion about ``mine``, was recorded as the
    control's failed check, whose replay kept saying "still fails" after the user's policy was fixed."""
    pytester.makepyfile(
        test_control=textwrap.dedent(
            """\
            from simnccl.ops import AllReduce, InitProcessGroup, SetDevice
            from simnccl.testing import invariants as inv
            from simnccl.testing.replay import SimCase

            START = (SetDevice(), InitProcessGroup(backend="nccl"))

            def test_mine_against_a_control():
                mine = SimCase(programs=(START + (AllReduce(),), START)).run()
                control = SimCase(programs=(START + (AllReduce(size_bytes=8),), START)).run()
                if not inv.passes(control):
                    assert mine.verdict == "pass"
            """
        )
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["# failed check: the test's own assertion (re-runs the test)"])
    line = next(x for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay "))
    assert json.loads(Path(line.split()[-1]).read_text())["failure"]["checks"] == []


def test_tests_whose_ids_make_one_safe_name_keep_their_own_case_files(pytester: pytest.Pytester) -> None:
    """``test[tp 2]`` and ``test[tp/2]`` both wrote ``..._test_tp_2_.json``: each failure printed the same replay
    command, and the file held the last one's case."""
    pytester.makepyfile(
        test_collide=textwrap.dedent(
            """\
            import pytest
            from simnccl.ops import AllReduce, InitProcessGroup, SetDevice
            from simnccl.testing import invariants as inv
            from simnccl.testing.replay import SimCase

            START = (SetDevice(), InitProcessGroup(backend="nccl"))

            @pytest.mark.parametrize("label", ["tp 2", "tp/2"])
            def test_hangs(label):
                program = START + (AllReduce(size_bytes=8 if label == "tp 2" else 16),)
                out = SimCase(programs=(program, START)).run()
                assert (v := inv.passes(out)), v.explanation
            """
        )
    )
    result = run(pytester)
    result.assert_outcomes(failed=2)
    files = [
        Path(x.split()[-1]) for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay ")
    ]
    assert len(set(files)) == 2, files
    sizes = {json.loads(path.read_text())["failure"]["test"]: SimCase.load(path).programs[0][-1] for path in files}
    assert sizes == {
        "test_collide.py::test_hangs[tp 2]": AllReduce(size_bytes=8),
        "test_collide.py::test_hangs[tp/2]": AllReduce(size_bytes=16),
    }


def test_a_replay_that_passes_a_different_simulation_is_not_a_pass(pytester: pytest.Pytester) -> None:
    """A policy that reads the process's state failed in the test and passes in the replay's fresh process. The
    replay said "the recorded check(s) pass now", exit 0: a failure that vanished. The trace hash the plugin
    records tells the two simulations apart."""
    pytester.makepyfile(test_flag=PROCESS_DEPENDENT)
    result = run(pytester)
    result.assert_outcomes(failed=1)
    line = next(x for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay "))
    path = Path(line.split()[-1])
    data = json.loads(path.read_text())
    assert isinstance(data["failure"]["trace_hash"], str) and data["failure"]["simnccl_version"]
    done = pytester.run(sys.executable, "-m", "simnccl.testing.replay", str(path))
    assert done.ret == 1, done.stdout.str()
    done.stdout.fnmatch_lines(["check passes: ok*", "*pass now, but this simulation is not the one that failed*"])
    # Recorded by another simnccl, a different trace is expected: a note, and the replay judges the check alone.
    data["failure"]["simnccl_version"] = "0.0.0"
    path.write_text(json.dumps(data))
    done = pytester.run(sys.executable, "-m", "simnccl.testing.replay", str(path))
    assert done.ret == 0, done.stdout.str()
    done.stdout.fnmatch_lines(["note: the failure was recorded by simnccl 0.0.0*", "the recorded check(s) pass now"])


def test_a_replay_after_the_policy_was_fixed_passes(pytester: pytest.Pytester) -> None:
    """Fixing the policy changes the simulation, so its trace hash is not the recorded one: the replay said "not
    deterministic", exit 1, after every fix. The policy's source, recorded with the failure, tells a fix apart."""
    module = pytester.makepyfile(test_flag=PROCESS_DEPENDENT.replace('os.environ.get("TEAM_FLAG") == "1" and ', ""))
    result = run(pytester)
    result.assert_outcomes(failed=1)
    line = next(x for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay "))
    path = Path(line.split()[-1])
    assert list(json.loads(path.read_text())["failure"]["policy_sources"]) == [str(module.resolve())]
    done = pytester.run(sys.executable, "-m", "simnccl.testing.replay", str(path))
    assert done.ret == 1, done.stdout.str()  # unchanged: still fails
    module.write_text(module.read_text().replace("request.rank == 1", "request.rank == 99"))  # the fix
    done = pytester.run(sys.executable, "-m", "simnccl.testing.replay", str(path))
    assert done.ret == 0, done.stdout.str()
    done.stdout.fnmatch_lines(
        ["note: the policy's source changed since the failure*", "the recorded check(s) pass now"]
    )


def test_a_replay_refuses_a_policy_module_of_the_same_name_from_another_folder(pytester: pytest.Pytester) -> None:
    """Replayed from another project's folder, whose module of the same name holds a correct policy of the same
    name, the case was judged with that one: ``--simulate-only`` said pass (exit 0) for the policy that failed."""
    pytester.makepyfile(test_flag=PROCESS_DEPENDENT.replace('os.environ.get("TEAM_FLAG") == "1" and ', ""))
    result = run(pytester)
    result.assert_outcomes(failed=1)
    line = next(x for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay "))
    path = Path(line.split()[-1]).resolve()
    other = pytester.mkdir("other")
    (other / "test_flag.py").write_text(PROCESS_DEPENDENT)  # the same names; the flag is unset there: correct
    for extra in ((), ("--simulate-only",)):
        done = subprocess.run(
            [sys.executable, "-m", "simnccl.testing.replay", str(path), *extra],
            cwd=other,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2, (extra, done.stdout, done.stderr)
        assert f"module 'test_flag' here is {(other / 'test_flag.py').resolve()}, not " in done.stderr


def test_the_rerun_selects_a_test_the_suites_own_marker_filter_leaves_out(pytester: pytest.Pytester) -> None:
    """``addopts = -m 'not slow'``, a ``slow`` test run with ``-m slow`` failing on its own assertion: the replay's
    rerun deselected it (pytest exit 5) and the replay exited 2, "could not run"."""
    pytester.makeini("[pytest]\naddopts = -m 'not slow'\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(
        test_slow=textwrap.dedent(
            """\
            import pytest
            from simnccl.ops import InitProcessGroup, SetDevice
            from simnccl.testing.replay import SimCase

            @pytest.mark.slow
            def test_own_assertion():
                assert SimCase(programs=((SetDevice(), InitProcessGroup()),) * 2).run().verdict == "hang"
            """
        )
    )
    result = run(pytester, "-m", "slow")
    result.assert_outcomes(failed=1)
    line = next(x for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay "))
    done = pytester.run(sys.executable, "-m", "simnccl.testing.replay", line.split()[-1])
    assert done.ret == 1, done.stdout.str() + done.stderr.str()
    done.stdout.fnmatch_lines(["*1 failed*"])


def test_a_rerun_that_runs_nothing_is_no_pass(pytester: pytest.Pytester) -> None:
    """pytest's own ``--runslow`` pattern: the re-run lacked the option, the test was skipped, pytest exited 0, and
    the replay said "passes now", exit 0, of a policy that still fails. Now exit 2: it did not run."""
    pytester.makeconftest(
        textwrap.dedent(
            """\
            import pytest

            def pytest_addoption(parser):
                parser.addoption("--runslow", action="store_true")

            def pytest_collection_modifyitems(config, items):
                if not config.getoption("--runslow"):
                    for item in items:
                        item.add_marker(pytest.mark.skip(reason="needs --runslow"))
            """
        )
    )
    pytester.makepyfile(
        test_gated=textwrap.dedent(
            """\
            from simnccl.ops import InitProcessGroup, SetDevice
            from simnccl.testing.replay import SimCase

            def test_own_assertion():
                assert SimCase(programs=((SetDevice(), InitProcessGroup()),) * 2).run().verdict == "hang"
            """
        )
    )
    result = run(pytester, "--runslow")
    result.assert_outcomes(failed=1)
    line = next(x for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay "))
    done = pytester.run(sys.executable, "-m", "simnccl.testing.replay", line.split()[-1])
    assert done.ret == 2, done.stdout.str() + done.stderr.str()
    assert "did not run (1 of 1 skipped)" in done.stderr.str()
    assert "passes now" not in done.stdout.str()


def test_a_rerun_is_not_asked_where_the_case_no_longer_simulates_as_it_failed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy reading the test process's environment: the case failed under it, the replay's own simulation
    differed from the recorded one (same simnccl, same policy source), and the re-run's pass said "passes now",
    exit 0. Now "not deterministic", exit 1, before anything is re-run."""
    pytester.makepyfile(
        env_policy=textwrap.dedent(
            """\
            import os
            from dataclasses import dataclass, replace
            from simnccl.policy import BasePolicy

            @dataclass(frozen=True)
            class EnvGated(BasePolicy):
                name: str = "env-gated"

                def on_group(self, request, decision):
                    if os.environ.get("FZ_BAD") and request.rank == request.world_size - 1:
                        return replace(decision, pg_options=replace(decision.pg_options, lazy_init=True))
                    return decision
            """
        ),
        test_env=textwrap.dedent(
            """\
            from simnccl.ops import AllReduce, InitProcessGroup, NewGroup, SetDevice
            from simnccl.testing.replay import SimCase

            def test_own_assertion():
                ops = (SetDevice(), InitProcessGroup(), NewGroup(ranks=(0, 1), bind="g"), AllReduce(group="g"))
                case = SimCase(programs=(ops,) * 2, policy="env_policy:EnvGated")
                assert case.run().verdict == "pass"
            """
        ),
    )
    monkeypatch.setenv("FZ_BAD", "1")
    result = run(pytester)
    result.assert_outcomes(failed=1)
    line = next(x for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay "))
    monkeypatch.delenv("FZ_BAD")
    done = pytester.run(sys.executable, "-m", "simnccl.testing.replay", line.split()[-1])
    assert done.ret == 1, done.stdout.str() + done.stderr.str()
    done.stdout.fnmatch_lines(["*is not the one that failed*not deterministic*"])
    assert "re-running" not in done.stdout.str()


@pytest.mark.parametrize("derandomize", [False, True])
def test_a_rerun_that_passes_is_a_pass_only_where_it_draws_the_same_examples(
    pytester: pytest.Pytester, derandomize: bool
) -> None:
    """The failure was the test's own assertion, so the replay runs the test again. Drawing at random (``dev``,
    ``thorough``, no seed), a rerun that passed said "passes now", exit 0, for a test that failed one time in 30."""
    pytester.makepyfile(
        test_once=textwrap.dedent(
            f"""\
            import os
            from hypothesis import given, settings, HealthCheck
            from simnccl.testing.strategies import cases

            @settings(derandomize={derandomize}, database=None, max_examples=3, suppress_health_check=list(HealthCheck))
            @given(cases(max_world=2, max_ops=6, policy="torch-default"))
            def test_fails_the_first_time(case):
                case.run()
                if not os.path.exists("failed-once"):
                    open("failed-once", "w").close()
                    assert False, "the first example fails"
            """
        )
    )
    result = run(pytester, "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    line = next(x for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay "))
    done = pytester.run(sys.executable, "-m", "simnccl.testing.replay", line.split()[-1])
    if derandomize:
        assert done.ret == 0, done.stdout.str()
        done.stdout.fnmatch_lines(["*passes now"])
    else:
        assert done.ret == 1, done.stdout.str()
        done.stdout.fnmatch_lines(["*passed this time, but it draws its examples at random*"])


def test_a_failed_memory_property_replays_as_a_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_budget=textwrap.dedent(
            """\
            from simnccl.ops import Checkpoint, InitProcessGroup, NewGroup, SetDevice
            from simnccl.testing import invariants as inv
            from simnccl.testing.replay import SimCase

            def test_tight_budget():
                ops = (SetDevice(), InitProcessGroup(backend="nccl"), Checkpoint("init"),
                       NewGroup(ranks=(0, 1), bind="a"), NewGroup(ranks=(0, 1), bind="b"), Checkpoint("groups"))
                case = SimCase(programs=(ops, ops), release="2.15")
                out = case.run()
                assert out.verdict == "pass"
                v = inv.within_budget(out, budget_mib=100, per_group_mib=100, group_bytes=100 * 2**20)
                assert v, v.explanation
            """
        )
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    line = next(x for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay "))
    done = pytester.run(sys.executable, "-m", "simnccl.testing.replay", line.split()[-1])
    assert done.ret == 1
    done.stdout.fnmatch_lines(["verdict: pass*", "check within_budget: FAILS*", "still fails: within_budget"])


def test_reporting_errors_never_hide_the_failure(pytester: pytest.Pytester) -> None:
    """A case whose policy cannot be written down (a class inside the test) still fails, serially and under
    xdist, and says why there is no replay file."""
    pytester.makepyfile(
        test_local=textwrap.dedent(
            """\
            from dataclasses import dataclass
            from simnccl.ops import InitProcessGroup, SetDevice
            from simnccl.policy import BasePolicy
            from simnccl.testing.replay import SimCase

            def test_local_policy():
                @dataclass(frozen=True)
                class Local(BasePolicy):
                    name: str = "local"

                SimCase(programs=((SetDevice(), InitProcessGroup()),) * 2, policy=Local()).run()
                assert False, "the user's own assertion"
            """
        )
    )
    for args in ((), ("-n", "2")):
        result = run(pytester, *args)
        result.assert_outcomes(failed=1)
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["*the case cannot be written down*defined inside a function*"])
        assert "INTERNALERROR" not in result.stdout.str()


def test_simnccl_seed_changes_the_seed_only(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIMNCCL_HYPOTHESIS_PROFILE", raising=False)
    pytester.makepyfile(
        textwrap.dedent(
            """\
            from hypothesis import HealthCheck, core, settings
            import simnccl.testing.strategies

            def test_profile_kept():
                assert core.global_force_seed == 99
                assert settings.get_current_profile_name().startswith("simnccl-ci")
                assert settings.default.max_examples == 100 and settings.default.deadline is None
                assert HealthCheck.too_slow in settings.default.suppress_health_check
                assert settings.default.derandomize is False  # a derandomized run would ignore the seed
            """
        )
    )
    run(pytester, "--simnccl-seed", "99").assert_outcomes(passed=1)
    run(pytester, "--simnccl-seed", "99", "-n", "2").assert_outcomes(passed=1)


_DRAWS_AROUND_AN_IMPORT = """\
import json, os
from hypothesis import given, settings, strategies as st

def test_imports_a_module_of_constants():
    import acme_constants  # noqa: F401  -- lazily, as a team's startup code is imported by some tests only

@settings(derandomize=DERANDOMIZE, database=None)
@given(st.lists(st.integers(0, 10_000), min_size=30, max_size=30))
def test_draws(values):
    with open(os.environ["DRAWN"], "a", encoding="utf-8") as out:
        out.write(json.dumps(values) + "\\n")
"""


@pytest.mark.parametrize(
    ("profile", "seed"), [("ci", ()), ("", ("--simnccl-seed", "7")), ("", ())], ids=["simnccl-ci", "seed", "neither"]
)
def test_derandomized_examples_are_the_same_whichever_test_ran_first(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, profile: str, seed: tuple[str, ...]
) -> None:
    """hypothesis draws now and then a constant found in the local modules imported so far, so a derandomized
    test drew other examples once another test had imported one more module; under xdist which tests ran
    first in a worker changes every run. With a derandomized session profile (simnccl's ``ci``) the plugin
    freezes that pool when collection ends (``simnccl.testing.stable_examples``): either order draws the same
    examples. So it does under ``--simnccl-seed`` (a seed given to reproduce a run). With neither (control)
    the orders differ, which shows the check can fail."""
    # A seed is ignored by a derandomized test: under --simnccl-seed the test leaves derandomization off.
    pytester.makepyfile(test_order=f"DERANDOMIZE = {not seed}\n" + _DRAWS_AROUND_AN_IMPORT)
    pytester.makepyfile(acme_constants=f"VALUES = {list(range(7, 10_000, 97))}\n")
    for name in CI_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if profile:
        monkeypatch.setenv("SIMNCCL_HYPOTHESIS_PROFILE", profile)
    else:
        monkeypatch.delenv("SIMNCCL_HYPOTHESIS_PROFILE", raising=False)
    drawn = []
    imports, draws = "test_imports_a_module_of_constants", "test_draws"
    for order in ([imports, draws], [draws, imports]):
        path = pytester.path / f"drawn-{len(drawn)}.jsonl"
        monkeypatch.setenv("DRAWN", str(path))
        names = [f"test_order.py::{name}" for name in order]
        run(pytester, "-p", "no:cacheprovider", *seed, *names).assert_outcomes(passed=2)
        drawn.append(path.read_text(encoding="utf-8").splitlines())
    assert len(drawn[0]) == len(drawn[1]) == 100
    if profile or seed:
        assert drawn[0] == drawn[1]
    else:
        assert drawn[0] != drawn[1], "hypothesis no longer draws local constants: the freeze may be moot"


@pytest.mark.parametrize("seed", [(), ("--simnccl-seed", "7")], ids=["simnccl-ci", "seed"])
def test_a_test_run_alone_draws_what_it_drew_in_the_whole_suite(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, seed: tuple[str, ...]
) -> None:
    """The pool was frozen as the collected modules made it, so a test run alone (``pytest NODEID``: what the
    replay of a failed assertion runs) drew other examples than beside a test module that imports a team's
    constants, passed, and the replay said "passes now" for a failure that had not gone. Frozen empty, the
    examples depend on the test and the seed alone."""
    pytester.makepyfile(test_draws=f"DERANDOMIZE = {not seed}\n" + _DRAWS_AROUND_AN_IMPORT)
    pytester.makepyfile(test_team="import acme_constants  # noqa: F401\n\ndef test_nothing():\n    pass\n")
    pytester.makepyfile(acme_constants=f"VALUES = {list(range(7, 10_000, 97))}\n")
    for name in CI_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if seed:
        monkeypatch.delenv("SIMNCCL_HYPOTHESIS_PROFILE", raising=False)
    else:  # as importing simnccl.testing.strategies loads it
        monkeypatch.setenv("SIMNCCL_HYPOTHESIS_PROFILE", "ci")
    drawn = []
    for selection in (["test_team.py", "test_draws.py"], ["test_draws.py::test_draws"]):
        path = pytester.path / f"drawn-{len(drawn)}.jsonl"
        monkeypatch.setenv("DRAWN", str(path))
        run(pytester, "-p", "no:cacheprovider", *seed, *selection)
        drawn.append(path.read_text(encoding="utf-8").splitlines())
    assert len(drawn[0]) == len(drawn[1]) == 100
    assert drawn[0] == drawn[1]


_DRAWS_CASES = """\
import json, os
from hypothesis import given
from simnccl.testing.strategies import cases

@given(cases())
def test_draws(case):
    with open(os.environ["DRAWN"], "a", encoding="utf-8") as out:
        out.write(json.dumps(case.to_json()) + "\\n")
"""


def test_a_hypothesis_seed_chooses_the_examples_of_the_ci_profile(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the derandomized ``ci`` profile (loaded when the test module imports the strategies) hypothesis
    ignored ``--hypothesis-seed``: a nightly job passing a new seed each night drew the same examples every
    night. Now the same seed draws the same examples (also under xdist, and in a later session of the same
    process), another seed other ones, and no seed the ci examples as before."""
    pytester.makepyfile(test_draws=_DRAWS_CASES)
    for name in CI_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SIMNCCL_HYPOTHESIS_PROFILE", raising=False)

    def drawn(*args: str, in_process: bool = False) -> list[str]:
        path = pytester.path / f"drawn-{len(list(pytester.path.glob('drawn-*')))}.jsonl"
        monkeypatch.setenv("DRAWN", str(path))
        if in_process:  # hypothesis keeps the profile and the forced seed in module globals
            result = pytester.runpytest("-p", "no:cacheprovider", *args)
        else:
            result = run(pytester, "-p", "no:cacheprovider", *args)
        result.assert_outcomes(passed=1)
        return path.read_text(encoding="utf-8").splitlines()

    ci = drawn()
    seed_1 = drawn("--hypothesis-seed", "1")
    assert len(ci) == len(seed_1) == 100
    assert drawn() == ci
    assert drawn("--hypothesis-seed", "1", "-n", "2") == seed_1
    assert drawn("--hypothesis-seed", "2") != seed_1
    assert seed_1 != ci
    assert drawn("--hypothesis-seed", "1", in_process=True) == seed_1
    assert drawn(in_process=True) == ci, "a seeded session left its seed behind in the process"


def test_the_replay_reruns_a_failed_assertion_with_the_sessions_seed(pytester: pytest.Pytester) -> None:
    """A failure found under ``--simnccl-seed`` was re-run without it (other examples: "passes now")."""
    pytester.makepyfile(
        test_seeded=textwrap.dedent(
            """\
            from hypothesis import given
            from simnccl.testing.strategies import cases

            @given(cases(min_world=2, max_world=2, release="2.15", env={}))
            def test_own_assertion(case):
                out = case.run()
                assert len(out.trace_hash) < 0, "always fails: the test's own assertion"
            """
        )
    )
    result = run(pytester, "--simnccl-seed", "9")
    result.assert_outcomes(failed=1)
    line = next(x for x in result.outlines if x.startswith("# replay: python -m simnccl.testing.replay "))
    data = json.loads(Path(line.split()[-1]).read_text())
    assert data["failure"]["rerun_args"] == ["--simnccl-seed", "9"]
    done = pytester.run(sys.executable, "-m", "simnccl.testing.replay", line.split()[-1])
    assert done.ret == 1
    done.stdout.fnmatch_lines(["*re-running test_seeded.py::test_own_assertion (*--simnccl-seed 9*"])


def test_only_programs_drawn_by_a_strategy_in_tests_that_ran_are_counted(pytester: pytest.Pytester) -> None:
    """A fixed program run 300 times through the fixture counted 300 "generated programs", and an xfailed test's
    examples and shrinking counted too: --simnccl-min-programs was met with nothing generated that passed."""
    pytester.makepyfile(
        test_counts=textwrap.dedent(
            """\
            import pytest
            from hypothesis import given, settings
            from simnccl.ops import InitProcessGroup, SetDevice
            from simnccl.testing.strategies import cases

            def test_handwritten_loop(simnccl_simulate):
                for _ in range(30):
                    assert simnccl_simulate([SetDevice(), InitProcessGroup()]).verdict == "pass"

            @pytest.mark.xfail(strict=True)
            @settings(max_examples=10)
            @given(cases(min_world=2, max_world=2, release="2.15", env={}))
            def test_expected_to_fail(case):
                case.run()
                assert False

            @settings(max_examples=7)
            @given(cases(min_world=2, max_world=2, release="2.15", env={}))
            def test_generated(case):
                case.run()
                case.with_(policy=None).run()  # a baseline between (it counted the case again after it)
                case.run(policy="legacy")  # the same program under another policy: still one program
            """
        )
    )
    result = run(pytester, "-p", "no:cacheprovider", "--simnccl-min-programs", "8")
    result.assert_outcomes(passed=2, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["simnccl: 7 generated programs simulated (51 simulations)*", "*only 7 generated programs simulated*"]
    )


def test_a_misspelt_profile_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    monkeypatch.setenv("SIMNCCL_HYPOTHESIS_PROFILE", "thorugh")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(["*SIMNCCL_HYPOTHESIS_PROFILE='thorugh': expected one of ci, dev, thorough*"])
