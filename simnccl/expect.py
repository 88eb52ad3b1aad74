"""Checking a scenario's ``[[expect]]`` tables against a variant's result.

Each check says what it compared and by how much it missed, because a CI log line "expectation failed" is
useless; "n0:cuda:1 at after_new_groups: 2103.4 MiB above after_init, expected 2080 ± 1%" is a diagnosis.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from simnccl.engine.outcome import devices_short_of, pass_decided_by_race
from simnccl.memory import distinct_figures, to_mib
from simnccl.result import ExpectationResult, VariantResult
from simnccl.scenario import VERDICTS, Expectation

DEFAULT_TOLERANCE_PCT = 1.0
UNEXPECTED_VERDICT_KEY = "verdict"
RACE_KEY = "race"
ACCEPTS_RACES = "race"  # in ``--allow``: a pass a race decided (``pass_decided_by_race``) is not a failure
UNACTED_KEY = "unacted"
ACCEPTS_UNACTED = "unacted"  # in ``--allow``: a scheduled fault that never acted (``faults_unacted``) is no failure
ACCEPTABLE = (*VERDICTS, ACCEPTS_RACES, ACCEPTS_UNACTED)  # what ``run --allow`` and ``sweep --accept-verdict`` take
ALLOW_FLAG = "--allow"  # what ``run`` and ``explain`` call ``allow``; the remedies name it (``sweep``: its own)


def unexpected_verdict(
    variant: VariantResult,
    expectations: Sequence[Expectation],
    allow: frozenset[str] = frozenset(),
    flag: str = ALLOW_FLAG,
) -> ExpectationResult | None:
    """A failed entry when the variant ended other than ``pass`` and nothing asked for that.

    Why: a scenario without ``[[expect]]`` that hangs used to print "all expectations hold" and exit 0, so CI
    could not tell a hang from a pass. A ``verdict`` expectation on the variant (which then checks the verdict
    itself) or ``allow`` (the ``--allow`` flag) asks for it; nothing else does.

    A "pass" that a race decided (``pass_decided_by_race``) fails too, whatever the expectations, unless
    ``allow`` holds ``race``: the other order of the race fails or hangs on real ranks. ``flag``: the command's
    name for ``allow``, which the remedy names (``sweep``: ``--accept-verdict``).
    """
    verdict = variant.verdict
    raced = pass_decided_by_race(variant.outcome, quote=False)
    if raced is not None and ACCEPTS_RACES not in allow:
        races = len(variant.outcome.races)
        return ExpectationResult(
            RACE_KEY,
            False,
            f"variant {variant.name!r} {raced}: {races} race(s), each printed as 'race:' (\"races\" in --json); "
            f"if a run that may fail is acceptable, run with {flag} {ACCEPTS_RACES}",
        )
    if verdict == "pass" or verdict in allow or any(e.verdict is not None for e in expectations):
        return None
    return ExpectationResult(
        UNEXPECTED_VERDICT_KEY,
        False,
        f"variant {variant.name!r} ended {verdict!r} and no expectation asks for it; if that is what it should do, "
        f'add verdict = "{verdict}" to an [[expect]] for it, or run with {flag} {verdict}',
    )


def unacted_faults(
    variant: VariantResult, allow: frozenset[str] = frozenset(), flag: str = ALLOW_FLAG
) -> ExpectationResult | None:
    """A failed entry when a scheduled fault never acted (``RunOutcome.faults_unacted``), unless ``allow`` holds
    ``unacted``.

    Why: a run proves a policy survives the faults it was given only if they struck. One that never acted (a crash
    timed after the rank ended, a store-timeout at an op that bootstraps nothing, a swarm that drew none) left the
    run the fault-free one, which passed and exited 0 with the fault merely listed: CI read "survived". Failed as a
    pass a race decided is, whatever the verdict: the verdict is not the one the fault was meant to test."""
    unacted = variant.outcome.faults_unacted
    if not unacted or ACCEPTS_UNACTED in allow:
        return None
    count = f"{len(unacted)} scheduled fault{'s' if len(unacted) > 1 else ''}"
    return ExpectationResult(
        UNACTED_KEY,
        False,
        f"variant {variant.name!r}: {count} never acted, each printed as 'fault ...: never acted' "
        f'("faults_unacted" in --json): the run did not test them; if that is acceptable, run with '
        f"{flag} {ACCEPTS_UNACTED}",
    )


def check(expectation: Expectation, variant: VariantResult) -> list[ExpectationResult]:
    results: list[ExpectationResult] = []
    key = expectation.key
    if expectation.verdict is not None:
        ok = variant.verdict == expectation.verdict
        results.append(ExpectationResult(key, ok, f"verdict {variant.verdict!r}, expected {expectation.verdict!r}"))
    if expectation.used_mib is not None:
        results.extend(_check_memory(expectation, variant))
    if expectation.error_contains is not None:
        texts = [f"{e['type']}: {e['message']}" for e in variant.outcome.errors]
        texts += [h["explanation"] for h in variant.outcome.hangs]
        ok = any(expectation.error_contains in t for t in texts)
        shown = texts[0].splitlines()[0] if texts else "no error or hang"
        results.append(
            ExpectationResult(
                key, ok, f"error text {'contains' if ok else 'lacks'} {expectation.error_contains!r} (first: {shown})"
            )
        )
    if expectation.detected_at_s is not None:
        times = [h["detected_at_s"] for h in variant.outcome.hangs if h.get("detected_at_s") is not None]
        at = min(times) if times else None
        results.append(_at_time(expectation, at, expectation.detected_at_s, "hang detected at", "hang never detected"))
    if expectation.error_at_s is not None:
        times = [e["time_s"] for e in variant.outcome.errors if e.get("time_s") is not None]
        at = min(times) if times else None
        results.append(_at_time(expectation, at, expectation.error_at_s, "first failure at", "no rank failed"))
    if expectation.fr_dump_ranks is not None:
        dumped = variant.outcome.fr_dumps
        results.append(_same_ranks(key, dumped, expectation.fr_dump_ranks, "flight-recorder dumps from ranks"))
    results.extend(_check_recovery(expectation, variant))
    if expectation.hang_ranks is not None:
        hung = [h["rank"] for h in variant.outcome.hangs]
        results.append(_same_ranks(key, hung, expectation.hang_ranks, "hung ranks"))
    return results


def _at_time(expectation: Expectation, at: float | None, want: float, seen: str, unseen: str) -> ExpectationResult:
    """``at`` (None: it never happened) within the expectation's ``tolerance_s`` of ``want``."""
    ok = at is not None and abs(at - want) <= expectation.tolerance_s
    shown = unseen if at is None else f"{seen} {at:.6f} s"
    return ExpectationResult(expectation.key, ok, f"{shown}, expected {want:g} s ± {expectation.tolerance_s:g}")


def _same_ranks(key: str, got: Iterable[int], want: Iterable[int], what: str) -> ExpectationResult:
    """The same set of ranks, in any order (shown sorted)."""
    got_sorted, want_sorted = sorted(got), sorted(want)
    return ExpectationResult(key, got_sorted == want_sorted, f"{what} {got_sorted}, expected {want_sorted}")


def _check_recovery(expectation: Expectation, variant: VariantResult) -> list[ExpectationResult]:
    """Recovery runs (simnccl.recovery): committed and lost steps, replacements, when the fault was acted on."""
    key = expectation.key
    wanted = (
        expectation.committed_steps,
        expectation.lost_steps,
        expectation.replacement_devices,
        expectation.fault_detected_at_s,
    )
    if all(v is None for v in wanted):
        return []
    report = getattr(variant.outcome, "recovery", None)
    if report is None:
        return [ExpectationResult(key, False, "not a recovery run (the scenario has no [recovery] table)")]
    results = []
    if expectation.committed_steps is not None:
        ok = report.committed_steps == expectation.committed_steps
        got = f"{report.committed_steps}/{report.steps} steps committed"
        results.append(ExpectationResult(key, ok, f"{got}, expected {expectation.committed_steps}"))
    if expectation.lost_steps is not None:
        ok = report.lost_steps == expectation.lost_steps
        results.append(
            ExpectationResult(key, ok, f"{report.lost_steps} steps lost and re-done, expected {expectation.lost_steps}")
        )
    if expectation.replacement_devices is not None:
        got = list(report.replacement_devices)
        held = []
        for device in got:  # the replacement's communicators must be charged to its own device
            ledger = variant.outcome.ledgers.get(device)
            comm = sum(b for o, b in ledger.by_owner.items() if o.kind == "comm") if ledger is not None else 0
            ranks = sorted({o.rank for o in ledger.by_owner if o.kind == "comm"}) if ledger is not None else []
            held.append((device, comm, ranks))
        ok = got == list(expectation.replacement_devices) and all(comm > 0 for _, comm, _ in held)
        shown = ", ".join(f"{d} holds {to_mib(c):.1f} MiB of communicators of ranks {r}" for d, c, r in held)
        results.append(
            ExpectationResult(
                key, ok, f"replacements {got} ({shown or 'none'}), expected {list(expectation.replacement_devices)}"
            )
        )
    if expectation.fault_detected_at_s is not None:
        at = report.fault_detected_at_s
        want = expectation.fault_detected_at_s
        results.append(_at_time(expectation, at, want, "fault acted on at", "no fault acted on"))
    return results


def _check_memory(expectation: Expectation, variant: VariantResult) -> list[ExpectationResult]:
    key = expectation.key
    assert expectation.checkpoint is not None and expectation.used_mib is not None
    at = variant.checkpoint_used_mib(expectation.checkpoint)
    if at is None:
        return [ExpectationResult(key, False, f"checkpoint {expectation.checkpoint!r} was never reached")]
    base: dict[str, float] | None = None
    if expectation.baseline is not None:
        base = variant.checkpoint_used_mib(expectation.baseline)
        if base is None:
            return [ExpectationResult(key, False, f"baseline checkpoint {expectation.baseline!r} was never reached")]
    # No devices named: every device of a rank whose program has the checkpoint, those that ended before it too
    short = devices_short_of(variant.outcome, expectation.checkpoint)
    devices = list(expectation.devices) or sorted(set(at) | set(short))
    results = []
    for device in devices:
        if device not in at:
            why = f" (rank {', '.join(map(str, short[device]))} ended before it)" if device in short else ""
            results.append(
                ExpectationResult(key, False, f"{device} has no measurement at {expectation.checkpoint!r}{why}")
            )
            continue
        value = at[device] - (base.get(device, 0.0) if base is not None else 0.0)
        expected = expectation.used_mib
        if expectation.tolerance_mib is not None:
            allowed = expectation.tolerance_mib
            tol_text = f"± {allowed:g} MiB"
        else:
            pct = expectation.tolerance_pct if expectation.tolerance_pct is not None else DEFAULT_TOLERANCE_PCT
            allowed = abs(expected) * pct / 100
            tol_text = f"± {pct:g}%"
        ok = abs(value - expected) <= allowed + 1e-9
        what = f"above {expectation.baseline!r}" if base is not None else "used"
        # as many decimals as the tolerance has, and as tell the figure from the one expected: at 0.1 a FAIL read
        # "704.6 MiB used, expected 704.6 ± 0" and an ok "704.6 MiB used, expected 704.5 ± 0.056"
        least = _decimals(allowed) if expectation.tolerance_mib is not None else 1
        shown, _ = distinct_figures(value, expected, least, grouping=False)
        results.append(
            ExpectationResult(
                key, ok, f"{device} at {expectation.checkpoint!r}: {shown} MiB {what}, expected {expected:g} {tol_text}"
            )
        )
    return results


def _decimals(tolerance: float) -> int:
    """Decimals a figure needs beside this tolerance (at least 1): 0.056 -> 3, 5 -> 1."""
    text = f"{tolerance:.6f}".rstrip("0")
    return max(1, len(text.split(".")[1]) if "." in text else 1)
