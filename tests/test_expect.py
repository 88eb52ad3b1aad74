"""expect.check: tolerance boundaries, baselines, unreached checkpoints, verdict/hang/error mismatches."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import TINY

from simnccl.engine import RunOutcome, Snapshot
from simnccl.expect import DEFAULT_TOLERANCE_PCT, check
from simnccl.ops import MIB
from simnccl.result import VariantResult
from simnccl.runner import run_scenario
from simnccl.scenario import Expectation, ScenarioError, load_scenario

TOTAL = 80_000 * MIB
DEV0, DEV1 = "n0:cuda:0", "n0:cuda:1"


def _variant(
    checkpoints: dict[str, dict[str, float]] | None = None,
    *,
    verdict: str = "pass",
    hangs: list[dict[str, Any]] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> VariantResult:
    """A VariantResult whose checkpoints are ``{label: {device: used MiB}}``."""
    snaps = {
        label: {
            device: Snapshot(device, round(mib * MIB), TOTAL - round(mib * MIB), 0.0, rank)
            for rank, (device, mib) in enumerate(sorted(per_device.items()))
        }
        for label, per_device in (checkpoints or {}).items()
    }
    outcome = RunOutcome(
        verdict=verdict,
        ranks=[],
        ledgers={},
        checkpoints=snaps,
        groups={},
        hangs=hangs or [],
        errors=errors or [],
        event_count=0,
        trace_hash="0",
        end_time_s=0.0,
        ops_executed=0,
        trace=[],
    )
    return VariantResult(
        name="v",
        description="",
        release="2.15",
        torch_version="2.15.0",
        profile="p",
        env={},
        policy="torch-default",
        outcome=outcome,
    )


def _exp(**kwargs: Any) -> Expectation:
    return Expectation(variants=("v",), key="expect[7]", **kwargs)


def _oks(results) -> list[bool]:
    return [r.ok for r in results]


# ---------------------------------------------------------------------------------------------- memory


@pytest.mark.parametrize(
    ("measured", "ok"),
    [(1000.0, True), (1010.0, True), (990.0, True), (1010.01, False), (989.99, False), (0.0, False)],
)
def test_tolerance_pct_boundaries(measured: float, ok: bool) -> None:
    variant = _variant({"c": {DEV0: measured}})
    results = check(_exp(checkpoint="c", used_mib=1000.0, tolerance_pct=1.0), variant)
    assert _oks(results) == [ok]
    assert results[0].key == "expect[7]"
    assert "± 1%" in results[0].message
    assert DEV0 in results[0].message


@pytest.mark.parametrize(
    ("measured", "ok"),
    [(1005.0, True), (995.0, True), (1005.01, False), (994.99, False)],
)
def test_tolerance_mib_boundaries(measured: float, ok: bool) -> None:
    variant = _variant({"c": {DEV0: measured}})
    # tolerance_mib wins over tolerance_pct (10% would accept everything here).
    results = check(_exp(checkpoint="c", used_mib=1000.0, tolerance_mib=5.0, tolerance_pct=10.0), variant)
    assert _oks(results) == [ok]
    assert "± 5 MiB" in results[0].message


def test_zero_tolerance_mib_is_exact() -> None:
    assert _oks(check(_exp(checkpoint="c", used_mib=0.0, tolerance_mib=0.0), _variant({"c": {DEV0: 0.0}}))) == [True]
    assert _oks(check(_exp(checkpoint="c", used_mib=0.0, tolerance_mib=0.0), _variant({"c": {DEV0: 0.01}}))) == [False]


def test_default_tolerance_is_one_percent() -> None:
    assert DEFAULT_TOLERANCE_PCT == 1.0
    inside = _variant({"c": {DEV0: 2000.0 * 1.0099}})
    outside = _variant({"c": {DEV0: 2000.0 * 1.0101}})
    assert _oks(check(_exp(checkpoint="c", used_mib=2000.0), inside)) == [True]
    assert _oks(check(_exp(checkpoint="c", used_mib=2000.0), outside)) == [False]


def test_every_device_is_checked_and_failure_message_diagnoses() -> None:
    variant = _variant({"c": {DEV0: 500.0, DEV1: 620.0}})
    results = check(_exp(checkpoint="c", used_mib=500.0, tolerance_pct=1.0), variant)
    assert _oks(results) == [True, False]
    bad = results[1].message
    assert DEV1 in bad and "'c'" in bad and "620.0 MiB used" in bad and "expected 500" in bad


def test_devices_filter() -> None:
    variant = _variant({"c": {DEV0: 500.0, DEV1: 620.0}})
    assert _oks(check(_exp(checkpoint="c", used_mib=620.0, devices=(DEV1,)), variant)) == [True]


def test_device_without_measurement_fails() -> None:
    variant = _variant({"c": {DEV0: 500.0}})
    results = check(_exp(checkpoint="c", used_mib=500.0, devices=("n0:cuda:5",)), variant)
    assert _oks(results) == [False]
    assert "n0:cuda:5 has no measurement at 'c'" in results[0].message


def test_baseline_delta() -> None:
    variant = _variant({"a": {DEV0: 600.0, DEV1: 700.0}, "b": {DEV0: 2680.0, DEV1: 2780.0}})
    results = check(_exp(checkpoint="b", baseline="a", used_mib=2080.0, tolerance_pct=1.0), variant)
    assert _oks(results) == [True, True]
    assert "2080.0 MiB above 'a'" in results[0].message
    # The absolute figure is not the delta: the same expectation without the baseline fails.
    assert _oks(check(_exp(checkpoint="b", used_mib=2080.0, tolerance_pct=1.0), variant)) == [False, False]


def test_baseline_delta_boundary() -> None:
    variant = _variant({"a": {DEV0: 100.0}, "b": {DEV0: 110.0}})
    assert _oks(check(_exp(checkpoint="b", baseline="a", used_mib=12.0, tolerance_mib=2.0), variant)) == [True]
    assert _oks(check(_exp(checkpoint="b", baseline="a", used_mib=12.0, tolerance_mib=1.99), variant)) == [False]


def test_checkpoint_never_reached() -> None:
    results = check(_exp(checkpoint="after_new_groups", used_mib=10.0), _variant({"after_init": {DEV0: 1.0}}))
    assert _oks(results) == [False]
    assert results[0].message == "checkpoint 'after_new_groups' was never reached"


def test_baseline_never_reached() -> None:
    results = check(_exp(checkpoint="b", baseline="nope", used_mib=10.0), _variant({"b": {DEV0: 10.0}}))
    assert _oks(results) == [False]
    assert "baseline checkpoint 'nope' was never reached" in results[0].message


# ---------------------------------------------------------------------------------------------- verdicts


def test_verdict_match_and_mismatch() -> None:
    assert _oks(check(_exp(verdict="pass"), _variant(verdict="pass"))) == [True]
    results = check(_exp(verdict="pass"), _variant(verdict="hang"))
    assert _oks(results) == [False]
    assert "verdict 'hang', expected 'pass'" in results[0].message


def _hang(rank: int, explanation: str = "waiting") -> dict[str, Any]:
    return {"rank": rank, "op": "barrier()", "group": "0", "seq": 1, "waiting_for": [], "explanation": explanation}


def test_hang_ranks_match_in_any_order() -> None:
    variant = _variant(verdict="hang", hangs=[_hang(2), _hang(0)])
    assert _oks(check(_exp(hang_ranks=(0, 2)), variant)) == [True]
    assert _oks(check(_exp(hang_ranks=(2, 0)), variant)) == [True]


@pytest.mark.parametrize("expected", [(0,), (0, 1, 2), (), (1, 3)])
def test_hang_ranks_mismatch(expected: tuple[int, ...]) -> None:
    results = check(_exp(hang_ranks=expected), _variant(verdict="hang", hangs=[_hang(0), _hang(2)]))
    assert _oks(results) == [False]
    assert results[0].message == f"hung ranks [0, 2], expected {sorted(expected)}"


def test_empty_hang_ranks_means_no_hang() -> None:
    assert _oks(check(_exp(hang_ranks=()), _variant())) == [True]


def test_error_contains_matches_errors_and_hang_explanations() -> None:
    errors = [{"rank": 0, "type": "ValueError", "message": "Rank 5 is out of range"}]
    with_error = _variant(verdict="error", errors=errors)
    assert _oks(check(_exp(error_contains="ValueError: Rank 5"), with_error)) == [True]
    with_hang = _variant(verdict="hang", hangs=[_hang(1, "store key collision under group name '1'")])
    assert _oks(check(_exp(error_contains="store key collision"), with_hang)) == [True]


def test_error_contains_mismatch() -> None:
    errors = [{"rank": 0, "type": "ValueError", "message": "Rank 5 is out of range\nsecond line"}]
    results = check(_exp(error_contains="out of memory"), _variant(verdict="error", errors=errors))
    assert _oks(results) == [False]
    message = results[0].message
    assert "lacks 'out of memory'" in message
    assert "ValueError: Rank 5 is out of range" in message and "second line" not in message


def test_error_contains_without_any_error() -> None:
    results = check(_exp(error_contains="boom"), _variant())
    assert _oks(results) == [False]
    assert "no error or hang" in results[0].message


def test_one_expectation_reports_each_assertion() -> None:
    variant = _variant({"c": {DEV0: 10.0}}, verdict="hang", hangs=[_hang(0, "stuck")])
    exp = _exp(verdict="pass", checkpoint="c", used_mib=10.0, error_contains="stuck", hang_ranks=(1,))
    assert _oks(check(exp, variant)) == [False, True, True, False]


# ---------------------------------------------------------------------------------------------- via a run


def test_expectations_apply_only_to_their_variants(write_scenario) -> None:
    text = (
        TINY
        + """
[[variants]]
name = "nccl2"

[[variants]]
name = "legacy"
env = { TORCH_DIST_USE_NCCL2 = "0" }

[[expect]]
verdict = "pass"

[[expect]]
variants = ["legacy"]
checkpoint = "after_init"
used_mib = 1
tolerance_mib = 0
"""
    )
    result = run_scenario(load_scenario(write_scenario(text)))
    nccl2, legacy = result.variants
    assert [e.key for e in nccl2.expectations] == ["expect[0]"]
    assert nccl2.ok
    assert [e.key for e in legacy.expectations] == ["expect[0]", "expect[1]", "expect[1]"]
    assert not legacy.ok
    assert not result.ok
    failing = [e.message for e in legacy.expectations if not e.ok]
    assert len(failing) == 2
    assert all("at 'after_init'" in m and "expected 1 ± 0 MiB" in m for m in failing)


# ---------------------------------------------------------------------------------------------- failure time, dumps


def _error(rank: int, time_s: float) -> dict[str, Any]:
    return {"rank": rank, "kind": "abort", "type": "SIGABRT", "message": "boom", "op": "x", "time_s": time_s}


def test_error_at_s_pins_the_first_failure_within_tolerance() -> None:
    variant = _variant(verdict="error", errors=[_error(1, 0.5), _error(0, 0.25)])
    assert _oks(check(_exp(error_at_s=0.25), variant)) == [True]
    assert _oks(check(_exp(error_at_s=0.2500009, tolerance_s=1e-6), variant)) == [True]
    (late,) = check(_exp(error_at_s=0.26, tolerance_s=0.001), variant)
    assert not late.ok and late.message == "first failure at 0.250000 s, expected 0.26 s ± 0.001"


def test_error_at_s_without_any_failure() -> None:
    (result,) = check(_exp(error_at_s=1.0), _variant())
    assert not result.ok and result.message.startswith("no rank failed")


def test_fr_dump_ranks_empty_asserts_no_dump() -> None:
    quiet = _variant(verdict="error")
    assert _oks(check(_exp(fr_dump_ranks=()), quiet)) == [True]
    dumped = _variant(verdict="hang")
    dumped.outcome.fr_dumps = {2: {}, 0: {}}
    assert _oks(check(_exp(fr_dump_ranks=(0, 2)), dumped)) == [True]
    (result,) = check(_exp(fr_dump_ranks=()), dumped)
    assert not result.ok and result.message == "flight-recorder dumps from ranks [0, 2], expected []"


def test_new_keys_parse_and_count_as_assertions(write_scenario) -> None:
    text = TINY + "\n[[expect]]\nfr_dump_ranks = []\n\n[[expect]]\nerror_at_s = 0.25\ntolerance_s = 0.01\n"
    first, second = load_scenario(write_scenario(text)).expectations
    assert first.fr_dump_ranks == () and second.error_at_s == 0.25 and second.tolerance_s == 0.01
    with pytest.raises(ScenarioError, match=r"expect\[0\]\.fr_dump_ranks: expected a list of integers"):
        load_scenario(write_scenario(TINY + "\n[[expect]]\nfr_dump_ranks = ['0']\n"))
    with pytest.raises(ScenarioError, match=r"expect\[0\]\.error_at_s: expected an integer or a number"):
        load_scenario(write_scenario(TINY + "\n[[expect]]\nerror_at_s = 'soon'\n"))


# ---------------------------------------------------------------------------------------------- devices measured

NO_SET_DEVICE = """
[scenario]
name = "no-set-device"
[cluster]
gpu = "h100-80gb"
nodes = 1
gpus_per_node = 2
[torch]
release = "2.15"
[workload]
steps = [
  { op = "init_process_group", backend = "gloo" },
  { op = "alloc", mib = 3000 },
  { op = "checkpoint", label = "x" },
]
[[expect]]
checkpoint = "x"
used_mib = 0
tolerance_mib = 0
"""


def test_a_checkpoint_of_ranks_that_never_set_a_device_measures_cuda_0(write_scenario) -> None:
    """A gloo (or legacy) rank that never called set_device allocates on cuda:0, CUDA's current device, but its
    checkpoint recorded no device: a memory expectation without ``devices`` checked nothing and passed (exit 0)
    with 6,000 MiB on cuda:0 where it asked for 0."""
    (variant,) = run_scenario(load_scenario(write_scenario(NO_SET_DEVICE))).variants
    used = variant.checkpoint_used_mib("x")
    assert list(used) == [DEV0] and used[DEV0] >= 6000.0  # both ranks' allocations, and their CUDA contexts
    assert [(e.ok, e.message) for e in variant.expectations] == [
        (False, f"n0:cuda:0 at 'x': {used[DEV0]:.1f} MiB used, expected 0 ± 0 MiB")
    ]


def test_without_devices_a_rank_that_ended_before_the_checkpoint_leaves_no_device_out(write_scenario) -> None:
    """Rank 1 allocates 20,000 MiB and raises before ``x``: its device had no measurement, and an expectation
    naming no devices read cuda:0 alone and said ok."""
    text = (
        NO_SET_DEVICE.replace(
            '  { op = "init_process_group", backend = "gloo" },',
            '  { op = "set_device" },\n  { op = "init_process_group", backend = "gloo" },',
        )
        .replace(
            '{ op = "alloc", mib = 3000 },',
            '{ op = "alloc", mib = 20000, on_ranks = [1] },\n'
            '  { op = "raise", message = "rank 1 gives up", on_ranks = [1] },',
        )
        .replace("used_mib = 0", 'verdict = "fail"\nused_mib = 0')
    )
    (variant,) = run_scenario(load_scenario(write_scenario(text))).variants
    failed = [e.message for e in variant.expectations if not e.ok and DEV1 in e.message]
    assert failed == ["n0:cuda:1 has no measurement at 'x' (rank 1 ended before it)"]


@pytest.mark.parametrize(
    ("measured", "expected", "tolerance", "ok", "shown"),
    [
        (704.556, 704.6, 0.0, False, "704.56 MiB used, expected 704.6 ± 0 MiB"),  # at 0.1: "704.6 ... 704.6"
        (704.556, 704.5, 0.056, True, "704.556 MiB used, expected 704.5 ± 0.056 MiB"),  # at 0.1: "704.6, 704.5"
        (704.5, 704.5, 0.0, True, "704.5 MiB used, expected 704.5 ± 0 MiB"),
    ],
)
def test_a_memory_message_shows_the_figure_as_precisely_as_its_check(
    measured: float, expected: float, tolerance: float, ok: bool, shown: str
) -> None:
    exp = _exp(checkpoint="init", used_mib=expected, tolerance_mib=tolerance)
    (result,) = check(exp, _variant({"init": {DEV0: measured}}))
    assert result.ok is ok and result.message == f"{DEV0} at 'init': {shown}"


# ---------------------------------------------------------------------------------------------- faults that never acted


@pytest.mark.parametrize("verdict", ["pass", "error"])
def test_a_fault_that_never_acted_is_a_failed_check_unless_allowed(verdict) -> None:
    """A run whose scheduled fault never acted passed (exit 0) with the fault merely listed: CI read "survived"
    where nothing was tested. It fails as a pass a race decided does, whatever the verdict, unless --allow unacted."""
    from simnccl.expect import ACCEPTABLE, unacted_faults

    variant = _variant(verdict=verdict)
    assert unacted_faults(variant) is None, "nothing scheduled, nothing unacted"
    variant.outcome.faults_unacted = ["crash rank 1 at t=500s: never acted (the rank had ended before then)"]
    failed = unacted_faults(variant)
    assert failed is not None and not failed.ok and failed.key == "unacted"
    assert "1 scheduled fault never acted" in failed.message and "--allow unacted" in failed.message
    assert unacted_faults(variant, frozenset({"unacted"})) is None
    assert unacted_faults(variant, frozenset({"race", "hang"})) is not None, "only unacted accepts it"
    assert "unacted" in ACCEPTABLE  # what --allow and sweep's --accept-verdict take


def test_a_negative_zero_tolerance_reads_as_zero(write_scenario) -> None:
    """TOML keeps -0.0's sign: ``tolerance_mib = -0.0`` printed "expected 704.6 ± -0 MiB"."""
    path = write_scenario(
        TINY + '[[expect]]\ncheckpoint = "after_init"\nused_mib = 1\ntolerance_mib = -0.0\n'
        '[[expect]]\ncheckpoint = "after_init"\nused_mib = 1\ntolerance_pct = -0.0\n'
    )
    mib, pct = load_scenario(path).expectations
    assert str(mib.tolerance_mib) == "0.0" and str(pct.tolerance_pct) == "0.0"
    messages = [r.message for r in check(mib, _variant({"after_init": {DEV0: 2.0}}))]
    assert messages and all("± 0 MiB" in m for m in messages)
