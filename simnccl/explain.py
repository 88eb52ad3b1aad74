"""``simnccl explain``: a run's hangs and failures in plain language, stragglers named first.

Why: users ask for explanations, not verdicts, and for the ranks that are *behind* rather than the ones that
wait (testing-practices, "Hang diagnosis in the field"). The hang entries already hold who waits where for
whom; this module groups them by the operation they are stuck in and tells the story once per operation.
Stragglers that slowed a run without hanging it (a slow rank, a slow link) come first, with what they cost,
because "everything was slow" is otherwise blamed on the ranks that waited for them. A process that only
legacy's heartbeat monitor could end is told with the monitor's own timeline.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from simnccl.result import VariantResult


def _ranks(ranks: list[int] | tuple[int, ...]) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def _slowdown(item: dict[str, Any]) -> str:
    factor = f"{item['factor']:g}x"
    if item["kind"] == "straggler":
        return (
            f"Rank {item['rank']} is a straggler: its local work ran {factor} slower, {item['extra_s']:.3f} s extra "
            "in all; the ranks that waited for it at the next collective are not at fault."
        )
    if not item["ops"]:
        return f"The link {item['link']} was slowed {factor}, but no collective or send/recv crossed it."
    groups = ", ".join(repr(g) for g in item["groups"])
    return (
        f"The link {item['link']} is the straggler: it ran {factor} slower, and the {item['ops']} collective or "
        f"point-to-point operation{'s' if item['ops'] != 1 else ''} whose communicator spans it (group"
        f"{'s' if len(item['groups']) != 1 else ''} {groups}) took {item['extra_s']:.3f} s longer in all; every "
        "rank's own work was on time."
    )


def _monitor(hang: dict[str, Any]) -> str:
    monitor = hang["monitor"]
    heartbeat = f"{monitor['heartbeat_timeout_s']:g} s"
    if monitor["reason"] == "watchdog hang":
        seen = f"legacy's heartbeat monitor saw no watchdog heartbeat at t={monitor['detected_at_s']:.3f} s"
    else:
        at = f"t={monitor['detected_at_s']:.3f} s"
        seen = f"legacy's heartbeat monitor saw another rank's dump signal in the store at {at}"
    if monitor["terminate_at_s"] is None:
        return (
            f" {seen[0].upper()}{seen[1:]}, dumped the flight recorder and only logged that it would have "
            "terminated the process (TORCH_NCCL_ENABLE_MONITORING=0): nothing ends it."
        )
    return (
        f" {seen[0].upper()}{seen[1:]} (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={heartbeat}), dumped the flight "
        f"recorder, waited another {heartbeat} and terminated the process at t={monitor['terminate_at_s']:.3f} s."
    )


def explain(variant: VariantResult) -> str:
    outcome = variant.outcome
    slow = [_slowdown(item) for item in outcome.slowdowns]
    if outcome.verdict == "pass":
        if slow:
            return f"{variant.name}: every rank finished its program, but more slowly than it could: " + " ".join(slow)
        return f"{variant.name}: every rank finished its program; nothing to explain."
    paragraphs: list[str] = list(slow)
    for error in outcome.errors:
        if error["kind"] in ("timeout", "heartbeat"):
            continue
        first = error["message"].splitlines()[0] if error["message"] else ""
        paragraphs.append(
            f"Rank {error['rank']} died at t={error['time_s']:.3f} s in {error['op']}: {error['type']}: {first}."
        )
    stuck: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for hang in outcome.hangs:
        stuck[(hang["group"], hang["kind"], hang["seq"], hang["op"])].append(hang)
    for (group, kind, seq, op), hangs in sorted(stuck.items(), key=lambda item: min(h["rank"] for h in item[1])):
        waiting = [h["rank"] for h in hangs]
        missing = sorted({r for h in hangs for r in h["waiting_for"]})
        since = min(h["since_s"] for h in hangs)
        what = f"{op} ({kind} #{seq} on group {group!r})" if group else f"{op} ({kind})"
        verb = "is" if len(waiting) == 1 else "are"
        text = f"{_ranks(waiting).capitalize()} {verb} stuck since t={since:.3f} s in {what}"
        if missing:
            text += (
                f", waiting for {_ranks(missing)}: the straggler{'s are' if len(missing) > 1 else ' is'} "
                f"{_ranks(missing)}"
            )
        text += "."
        reason = hangs[0].get("explanation")
        if reason:
            text += f" Why: {reason.rstrip('.')}."
        detected = [h["detected_at_s"] for h in hangs if h.get("detected_at_s") is not None]
        if hangs[0].get("monitor"):
            text += _monitor(hangs[0])
        elif detected:
            timeout = hangs[0].get("timeout_s") or 0.0
            extra = min(detected) - since - timeout
            text += f" Detected at t={min(detected):.3f} s (timeout {timeout:g} s"
            text += f" + {extra:g} s flight-recorder dump wait)." if extra > 1e-9 else ")."
        else:
            text += f" Nothing times out here: {hangs[0].get('watchdog', 'no watchdog covers this wait')}."
        paragraphs.append(text)
    if outcome.fr_dumps:
        paragraphs.append(
            f"Flight-recorder dumps were written by {_ranks(sorted(outcome.fr_dumps))}"
            + (
                f"; none by {_ranks(sorted(set(range(len(outcome.ranks))) - set(outcome.fr_dumps)))} "
                "(dead or finished processes write none)."
                if len(outcome.fr_dumps) < len(outcome.ranks)
                else "."
            )
        )
    return f"{variant.name} ({outcome.verdict}): " + " ".join(paragraphs)
