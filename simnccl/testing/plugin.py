"""simnccl's pytest plugin: fixtures, markers, hypothesis profiles, replayable failures, a program count.

Load it with ``-p simnccl.testing.plugin`` or through the ``pytest11`` entry point::

    [project.entry-points.pytest11]
    simnccl = "simnccl.testing.plugin"

What it gives a suite:

* fixtures ``simnccl_cluster`` (a ``Cluster`` factory), ``simnccl_simulate`` (``simnccl.testing.simulate``),
  ``simnccl_scenario`` (load and run a scenario file), ``simnccl_seed`` (the ``--simnccl-seed`` value);
* markers ``gpu``, ``real``, ``slow``, ``property``;
* hypothesis profiles ``ci`` (derandomized: the same examples every run, whatever a test imports:
  ``simnccl.testing.stable_examples``), ``dev`` (few), ``thorough`` (many),
  registered as ``simnccl-ci`` etc. (hypothesis has a ``ci`` of its own), chosen by
  ``SIMNCCL_HYPOTHESIS_PROFILE`` (default ``ci``) unless ``--hypothesis-profile`` names one;
  ``--simnccl-seed N`` (or hypothesis' ``--hypothesis-seed N``) turns derandomization off and seeds every
  hypothesis test with ``N``;
* on a failing test that simulated something, the case its failed check judged (else the last simulated
  case; hypothesis replays the shrunk example last) as a Python snippet, dumped as JSON, with the one
  command that replays it;
* a count of generated programs simulated, summed over xdist workers, printed at the end of the session;
  ``--simnccl-min-programs N`` fails the session when fewer were simulated (so "N programs" is checked).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from simnccl import __version__
from simnccl.limits import current as current_limits
from simnccl.policy.sources import policy_sources
from simnccl.testing import replay

try:  # hypothesis is a test extra: without it the plugin still gives fixtures, markers and replay dumps
    from hypothesis import settings

    from simnccl.testing import hypothesis_profiles
    from simnccl.testing.hypothesis_profiles import (
        PROFILE_ENV,
        PROFILES,
        load_profile,
        register_profiles,
        seeded,
        untouched,
    )
    from simnccl.testing.stable_examples import freeze_local_constants
except ImportError:  # pragma: no cover - exercised only in an environment without hypothesis
    settings = None  # type: ignore[assignment]
    PROFILE_ENV, PROFILES = "SIMNCCL_HYPOTHESIS_PROFILE", {}
    load_profile = register_profiles = seeded = untouched = freeze_local_constants = None  # type: ignore[assignment]
    hypothesis_profiles = None  # type: ignore[assignment]

__all__ = ["PROFILES", "PROFILE_ENV", "is_registered", "load_profile", "register_profiles"]

MARKERS = {
    "gpu": "needs a CUDA device",
    "real": "runs real torch.distributed processes",
    "slow": "long-running",
    "property": "hypothesis property tests (sized by the SIMNCCL_HYPOTHESIS_PROFILE profile)",
}

_state: dict[str, Any] = {"worker_counts": [], "shortfall": None}


def is_registered() -> bool:
    """Whether pytest has registered this plugin (see ``simnccl.testing.replay.plugin_registered``)."""
    return replay.plugin_registered()


def active_profile() -> str:
    return settings.get_current_profile_name() if settings is not None else "(hypothesis not installed)"


# ---------------------------------------------------------------------- pytest hooks


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simnccl")
    group.addoption(
        "--simnccl-seed",
        type=seed_value,
        default=None,
        help="seed every hypothesis test with this integer (turns the ci profile's derandomization off)",
    )
    group.addoption(
        "--simnccl-min-programs",
        type=program_count,
        default=None,
        help="fail the session if fewer generated programs were simulated (env SIMNCCL_MIN_PROGRAMS)",
    )


def seed_value(text: str) -> int:
    """``--simnccl-seed``: a whole number >= 0. Why not any integer: hypothesis seeds Python's ``random`` with the
    seed's absolute value, so ``-1`` drew exactly what ``1`` draws, and a nightly job passing "another seed" did
    not get other examples."""
    return _whole_number(text, "a whole number >= 0 (-N draws what N draws)")


def program_count(text: str) -> int:
    """``--simnccl-min-programs`` / ``SIMNCCL_MIN_PROGRAMS``: a whole number >= 0. A bad value is a usage error,
    not a traceback at plugin load (the environment variable was read with a bare ``int()``) nor a silent -1."""
    return _whole_number(text, "a whole number of programs >= 0")


def _whole_number(text: str, wanted: str) -> int:
    """``text`` as an integer >= 0, else argparse's usage error saying ``expected {wanted}``."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
    return value


def _min_programs(config: pytest.Config) -> int:
    """The minimum asked for: the flag, else ``SIMNCCL_MIN_PROGRAMS``, else 0 (a bad variable: a usage error)."""
    given = _option(config, "simnccl_min_programs")
    if given is not None:
        return int(given)
    raw = os.environ.get("SIMNCCL_MIN_PROGRAMS")
    if raw is None:
        return 0
    try:
        return program_count(raw)
    except argparse.ArgumentTypeError as err:
        raise pytest.UsageError(f"SIMNCCL_MIN_PROGRAMS: {err}") from None


def _option(config: pytest.Config, name: str) -> Any:
    try:
        return config.getoption(name)
    except ValueError:  # registered after the command line was parsed (pytest_plugins in a test module)
        return None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    replay.PLUGIN_STATE["registered"] = True
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if settings is None:
        return
    from hypothesis import core

    # As found, before this plugin or hypothesis' own changes them (pytest_unconfigure gives them back).
    _state["restore"] = (settings.get_current_profile_name(), core.global_force_seed)
    hypothesis_profiles.CHOSEN_ON_THE_COMMAND_LINE[0] = _option(config, "hypothesis_profile") is not None
    # Registered always; loaded only when asked for, so a session that merely has simnccl installed keeps its
    # own hypothesis settings (importing simnccl.testing.strategies loads ``ci`` if nothing else was loaded).
    register_profiles()
    if os.environ.get(PROFILE_ENV) and untouched():
        try:
            load_profile()
        except ValueError as err:  # a misspelt profile name: the session's input, not an internal error
            raise pytest.UsageError(str(err)) from None
    _min_programs(config)  # a bad SIMNCCL_MIN_PROGRAMS stops the session here, before any test runs


def pytest_collection_finish(session: pytest.Session) -> None:
    # Every test module is imported now, the same in every xdist worker: a derandomized profile, or a seed given
    # to reproduce a run (--simnccl-seed, --hypothesis-seed), draws the same examples whatever a test imports
    # later (``simnccl.testing.stable_examples``).
    if settings is not None and (settings.default.derandomize or _forced_seed() is not None):
        freeze_local_constants()


def _forced_seed() -> object:
    from hypothesis import core

    return getattr(core, "global_force_seed", None)


def pytest_sessionstart(session: pytest.Session) -> None:
    # After every pytest_configure, hypothesis' own included (it loads --hypothesis-profile and sets
    # --hypothesis-seed there), and before collection builds the tests' settings.
    if settings is None:
        return
    from hypothesis import core

    seed = _option(session.config, "simnccl_seed")
    if seed is not None:
        core.global_force_seed = seed
        registered_name_for_session()  # simnccl's own flag: simnccl's profile unless another was chosen
    _seed_profile()


def _seed_profile() -> None:
    """A forced seed (``--simnccl-seed N``, ``--hypothesis-seed N``) changes the seed only: the profile the
    session runs with, with derandomization off where it was on (a derandomized profile ignores any seed:
    ``hypothesis_profiles.seeded``). Everything else (examples, deadline, health checks) stays as it was. A
    session whose profile nobody chose yet gets it when the strategies are imported (``load_profile`` seeds it
    there): loading ``ci`` here would change the settings of a suite that never uses simnccl's strategies."""
    if _forced_seed() is None or untouched():
        return
    settings.load_profile(seeded(settings.get_current_profile_name()))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Give back the profile and forced seed the session found. Why: hypothesis keeps both in module globals,
    so in one process (pytester's in-process runs, a tool calling ``pytest.main`` twice) a seeded session left
    its seed behind, and the next session, given no seed, drew the seeded examples instead of the ci ones."""
    restore = _state.pop("restore", None)
    if restore is None or settings is None:
        return
    from hypothesis import core

    profile, seed = restore
    settings.load_profile(profile)
    core.global_force_seed = seed
    hypothesis_profiles.CHOSEN_ON_THE_COMMAND_LINE[0] = False


def registered_name_for_session() -> str:
    """The profile this session runs with: hypothesis' current one if somebody chose it, else simnccl's."""
    if untouched():
        return load_profile()
    return settings.get_current_profile_name()


def pytest_report_header(config: pytest.Config) -> str:
    seed = _option(config, "simnccl_seed")
    return f"simnccl: hypothesis profile {active_profile()!r}" + (f", seed {seed}" if seed is not None else "")


def pytest_runtest_setup(item: pytest.Item) -> None:
    replay.reset_last_case()
    replay.test_started()
    _state["simulations_before_test"] = replay.COUNTS["simulations"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "call" and report.skipped:
        # An expected failure (or a test that skipped itself) checked nothing the session can count on: what it
        # simulated, its shrinking too, is taken back, so --simnccl-min-programs is met by tests that ran.
        replay.take_back_test_counts(_state.get("simulations_before_test", 0))
    if report.when != "call" or not report.failed:
        return
    # Nothing here may raise: an exception in this hook is an INTERNALERROR that, under xdist, loses the
    # failing test altogether (the session can even exit 0). Whatever goes wrong is written into the report.
    try:
        title, text, command = _failure_section(item, str(report.longrepr))
    except Exception as error:  # a bug in simnccl's reporting must never hide the user's failure
        title, text, command = "simnccl: could not report the failing case", f"{type(error).__name__}: {error}", None
    if title is None:
        return
    _attach(report, title, text)
    if command is not None:
        # JUnit XML writes the properties of the test's last (teardown) report, which copies the item's.
        item.user_properties.append(("simnccl_replay", command))


def _failure_section(item: pytest.Item, failure_text: str) -> tuple[str | None, str, str | None]:
    """(section title, text, replay command) for a failed test that simulated a case; (None, "", None) else.
    The case is the one the failed check judged (``replay.failing_case``), not merely the last one simulated."""
    case, outcome, checks = replay.failing_case(failure_text)
    if case is None:
        return None, "", None
    title = (
        "simnccl: minimal failing case (the one the failed check judged, else the last one simulated; "
        "hypothesis replays the shrunk example last)"
    )
    failure = {
        "test": item.nodeid,
        "rootdir": str(item.config.rootpath),
        "checks": checks,
        "profile_env": os.environ.get(PROFILE_ENV, ""),
        # the failing simulation, so a replay that passes can tell a fix from a case that is not deterministic
        "trace_hash": outcome.trace_hash if outcome is not None else None,
        "simnccl_version": __version__,
        # what chose the examples, so a test re-run by the replay draws the ones that failed
        "rerun_args": _seed_args(item.config),
        "examples_reproducible": _examples_reproducible(item),
        # the user's policy modules as they were, so a replay can tell a fix from a case that is not deterministic
        "policy_sources": policy_sources(case.policy),
    }
    try:
        snippet = case.snippet()
    except Exception as error:  # e.g. a policy no other process can rebuild (a class defined in a function)
        return title, f"(the case cannot be written down: {type(error).__name__}: {error})", None
    path = _failure_path(item)
    try:
        case.dump(path, failure)
    except Exception as error:
        return title, f"{snippet}\n\n# could not write {path}: {type(error).__name__}: {error}\n", None
    command = f"python -m simnccl.testing.replay {path}"
    checks = ", ".join(n["check"] for n in failure["checks"]) or "the test's own assertion (re-runs the test)"
    return title, f"{snippet}\n\n# failed check: {checks}\n# replay: {command}\n", command


def _examples_reproducible(item: pytest.Item) -> bool:
    """Whether running the test again draws the examples it drew (a derandomized profile or a forced seed), so a
    re-run that passes means the failure is gone. Why: under ``dev`` or ``thorough`` without a seed the replay's
    re-run drew new random examples and said "passes now" (exit 0) for a test that failed one time in 30."""
    if settings is None or hypothesis_profiles.forced_seed() is not None:
        return True
    test = getattr(item, "obj", None)
    if not getattr(test, "is_hypothesis_test", False):
        return True
    used = getattr(test, "_hypothesis_internal_use_settings", None) or settings.default
    return bool(getattr(used, "derandomize", False))


def _seed_args(config: pytest.Config) -> list[str]:
    """The options of this session that choose a test's examples (``--simnccl-seed``, hypothesis' seed and
    profile), as a command line: the replay of a failed assertion runs the test again with them."""
    args: list[str] = []
    for flag, dest in (
        ("--simnccl-seed", "simnccl_seed"),
        ("--hypothesis-seed", "hypothesis_seed"),
        ("--hypothesis-profile", "hypothesis_profile"),
    ):
        value = _option(config, dest)
        if value is not None:
            args += [flag, str(value)]
    return args


def _attach(report: pytest.TestReport, title: str, text: str) -> None:
    """Into the failure's long representation (shown by xdist and written to JUnit XML), else a section."""
    addsection = getattr(report.longrepr, "addsection", None)
    if callable(addsection):
        addsection(title, text)
    else:
        report.sections.append((title, text))


def _failure_path(item: pytest.Item) -> Path:
    """The test's case file: its node id made safe for a file name, and a digest of the whole id. Why the digest:
    ``test[tp 2]`` and ``test[tp/2]`` (and ids that differ only before their last 150 characters) made one
    name, and the replay printed for one test's failure ran the other test's case."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid)[-150:]
    digest = hashlib.blake2b(item.nodeid.encode(), digest_size=4).hexdigest()
    cache = getattr(item.config, "cache", None)
    base = cache.mkdir("simnccl-failures") if cache is not None else Path(".simnccl-failures")
    return Path(base) / f"{safe}-{digest}.json"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the counts to the controller
        workeroutput["simnccl_counts"] = dict(replay.COUNTS)
        workeroutput["simnccl_programs"] = b"".join(sorted(replay.DISTINCT_PROGRAMS))  # 8 bytes each
        workeroutput["simnccl_profile"] = active_profile()
        return
    minimum = _min_programs(config)
    programs = _totals()["programs"]
    if minimum and programs < minimum and session.testscollected:
        _state["shortfall"] = f"simnccl: only {programs} generated programs simulated, fewer than {minimum}"
        # A shortfall fails a session that passed; any other status is kept: an interrupted session, a collection
        # error or pytest's own crash (2, 3) made to look like failed tests (1) was a crash read as a failed check.
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    output = getattr(node, "workeroutput", {})
    counts = output.get("simnccl_counts")
    if counts:
        _state["worker_counts"].append(counts)
    programs = output.get("simnccl_programs")
    if isinstance(programs, bytes):
        _state.setdefault("worker_programs", set()).update(programs[i : i + 8] for i in range(0, len(programs), 8))
    if output.get("simnccl_profile"):
        _state.setdefault("worker_profiles", set()).add(output["simnccl_profile"])


def _totals() -> dict[str, int]:
    """Simulations summed over this process and every worker; programs counted once per content over them all
    (two gateways drawing one case count it once: ``replay.case_digest``)."""
    total = dict(replay.COUNTS)
    for counts in _state["worker_counts"]:
        total["simulations"] = total.get("simulations", 0) + counts.get("simulations", 0)
    total["programs"] = len(replay.DISTINCT_PROGRAMS | _state.get("worker_programs", set()))
    return total


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if getattr(config, "workeroutput", None) is not None:
        return
    total = _totals()
    if total["simulations"]:
        # Under xdist the tests ran in the workers: their profile is the one that sized the examples.
        profiles = sorted(_state.get("worker_profiles", ())) or [active_profile()]
        terminalreporter.write_line(
            f"simnccl: {total['programs']} generated programs simulated ({total['simulations']} simulations), "
            f"hypothesis profile {', '.join(map(repr, profiles))}"
        )
    if _state["shortfall"]:
        terminalreporter.write_line(_state["shortfall"], red=True)


# ---------------------------------------------------------------------- fixtures


# The fixtures are session-scoped factories without state, so ``@given`` tests may use them (hypothesis refuses
# function-scoped fixtures there: they would not be reset between examples).


@pytest.fixture(scope="session")
def simnccl_seed(request: pytest.FixtureRequest) -> int | None:
    """The ``--simnccl-seed`` value, or None (derandomized ``ci`` runs, or a random seed)."""
    return _option(request.config, "simnccl_seed")


@pytest.fixture(scope="session")
def simnccl_cluster() -> Callable[..., Any]:
    """``simnccl_cluster(gpu="h100-80gb", nodes=1, gpus_per_node=2, ranks_per_node=None)`` -> Cluster, bounded by
    ``max_world_size`` as ``simulate``'s is (``nodes=10**9`` made a cluster whose ``placements()`` took the machine)."""
    from simnccl.cluster import Cluster
    from simnccl.testing.harness import bounded_cluster

    def make(
        gpu: str = "h100-80gb", nodes: int = 1, gpus_per_node: int = 2, ranks_per_node: int | None = None
    ) -> Cluster:
        return bounded_cluster(gpu, nodes, gpus_per_node, ranks_per_node)

    return make


@pytest.fixture(scope="session")
def simnccl_simulate() -> Callable[..., Any]:
    """``simnccl.testing.simulate``; a failing test's report then shows the case and how to replay it."""
    from simnccl.ops import Op
    from simnccl.testing.harness import simulate

    def run(program: Any, **kwargs: Any) -> Any:
        case = _as_case(program, kwargs, Op)
        if case is not None:
            return case.run(keep_trace=kwargs.get("keep_trace", False), limits=kwargs.get("limits"))
        return simulate(program, **kwargs)

    return run


_CASE_KWARGS = {"gpu", "nodes", "gpus_per_node", "release", "env", "policy", "keep_trace", "limits"}


def _as_case(program: Any, kwargs: dict[str, Any], op_type: type) -> replay.SimCase | None:
    """The call as a SimCase when it is one (default launcher and profile), else None. A policy object (a
    user's own) is kept as it is: the case file records how to rebuild it."""
    if set(kwargs) - _CASE_KWARGS:
        return None
    if not program or not isinstance(program, list | tuple):
        return None
    nodes, per_node = kwargs.get("nodes", 1), kwargs.get("gpus_per_node", 2)
    env = kwargs.get("env")
    sizes_ok = all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (nodes, per_node))
    if not sizes_ok or nodes * per_node > current_limits().max_world_size or not isinstance(env, Mapping | None):
        return None  # ``simulate`` says what is wrong, before anything is made for the world
    if isinstance(program[0], op_type):
        shared = tuple(program)
        programs = (shared,) * (nodes * per_node)
    else:
        programs = replay.share_identical(program)
        if len(programs) != nodes * per_node:
            return None
    return replay.SimCase(
        programs=programs,
        gpu=kwargs.get("gpu", "h100-80gb"),
        nodes=nodes,
        gpus_per_node=per_node,
        release=kwargs.get("release", "2.15"),
        env=tuple(sorted((kwargs.get("env") or {}).items())),
        policy=kwargs.get("policy"),
    )


@pytest.fixture(scope="session")
def simnccl_scenario() -> Callable[..., Any]:
    """``simnccl_scenario(path, variants=None, **run_options)`` -> ScenarioResult (load, validate, run)."""
    from simnccl.runner import run_scenario
    from simnccl.scenario import load_scenario

    def run(path: str | os.PathLike[str], variants: list[str] | None = None, **options: Any) -> Any:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"simnccl_scenario: path: expected a scenario file's path, got {type(path).__name__}")
        if variants is not None and (isinstance(variants, str) or not all(isinstance(v, str) for v in variants)):
            raise TypeError(f"simnccl_scenario: variants: expected a list of variant names, got {variants!r}")
        return run_scenario(load_scenario(path), variants, **options)

    return run
