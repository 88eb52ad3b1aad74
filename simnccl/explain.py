"""``simnccl explain``: a run's hangs and failures in plain language, stragglers and cycles named first.

Why: users ask for explanations, not verdicts, and for the ranks that are *behind* rather than the ones that
wait (testing-practices, "Hang diagnosis in the field"). The hang entries already hold who waits where for
whom; this module groups them by the operation they are stuck in and tells the story once per operation.
Stragglers that slowed a run without hanging it (a slow rank, a slow link) come first, with what they cost,
because "everything was slow" is otherwise blamed on the ranks that waited for them. Circular waits come
next, named as cycles (``simnccl.waitfor``): there nobody is behind, and calling a rank of a cycle "the
straggler" sends the user looking for a slow GPU instead of a call order that differs between ranks. A
process that only legacy's heartbeat monitor could end is told with the monitor's own timeline.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from simnccl.backends.gloo import CROSS_WIRED_TYPE
from simnccl.engine.outcome import pass_decided_by_race
from simnccl.report import replaced_timeout_text
from simnccl.result import VariantResult
from simnccl.waitfor import Cycle, WaitForGraph

MAX_REASONS = 3  # distinct explanations told per stuck operation (32 ranks often give 32 near-identical ones)


def _ranks(ranks: list[int] | tuple[int, ...]) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def _duration(seconds: float) -> str:
    """A span as read: a link slowed 4x under a 1 MiB all_reduce costs microseconds, which "0.000 s" hid."""
    if seconds == 0 or seconds >= 0.1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-4:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.3f} us"


def _slowdown(item: dict[str, Any]) -> str:
    factor = f"{item['factor']:g}x"
    if item["kind"] == "straggler":
        return (
            f"Rank {item['rank']} is a straggler: its local work ran {factor} slower, {_duration(item['extra_s'])} "
            "extra in all; the ranks that waited for it at the next collective are not at fault."
        )
    if not item["ops"]:
        return f"The link {item['link']} was slowed {factor}, but no collective or send/recv crossed it."
    groups = ", ".join(repr(g) for g in item["groups"])
    return (
        f"The link {item['link']} is the straggler: it ran {factor} slower, and the {item['ops']} collective or "
        f"point-to-point operation{'s' if item['ops'] != 1 else ''} whose communicator spans it (group"
        f"{'s' if len(item['groups']) != 1 else ''} {groups}) took {_duration(item['extra_s'])} longer in all; every "
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
    # The times add up as written: detection, the dump's wait, one more heartbeat, termination (the dump's wait
    # was left out: "at t=960, waited another 480 s and terminated at t=1455").
    dump_s = monitor["terminate_at_s"] - monitor["detected_at_s"] - monitor["heartbeat_timeout_s"]
    dumped = f"dumped the flight recorder ({dump_s:g} s)" if dump_s > 1e-9 else "dumped the flight recorder"
    return (
        f" {seen[0].upper()}{seen[1:]} (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={heartbeat}), {dumped}, waited another "
        f"{heartbeat} and terminated the process at t={monitor['terminate_at_s']:.3f} s."
    )


def _cycle(graph: WaitForGraph, cycle: Cycle) -> str:
    """A circular wait, named as one: every wait of the cycle, and who else is held up by it."""
    behind = sorted(
        r for r in graph.blocked if r not in cycle.ranks and cycle in graph.reaches(r)[1] and not graph.is_sink(r)
    )
    text = (
        f"Circular wait between {_ranks(cycle.ranks)}: {cycle.describe()}. No rank is behind (there is no "
        f"straggler): each waits for a call the {'other' if len(cycle.ranks) == 2 else 'next one'} will never "
        "make, because the ranks issued their calls in different orders"
    )
    if behind:
        text += f"; {_ranks(behind)} {'waits' if len(behind) == 1 else 'wait'} on this cycle too"
    return text + "."


def _behind(graph: WaitForGraph, waiting: list[int], missing: list[int]) -> str:
    """What the ranks waited for are: stragglers (they wait on nobody), in a cycle, or blocked behind someone
    else. 'Straggler' is said only of ranks that wait on nobody."""
    if all(graph.is_sink(r) for r in missing):
        return f": the straggler{'s are' if len(missing) > 1 else ' is'} {_ranks(missing)}"
    notes: list[str] = []
    if any(r in waiting for r in missing):
        notes.append("they are all in this call but cannot meet: see why")
    sinks: set[int] = set()
    cycles: list[Cycle] = []
    for rank in missing:
        if rank in waiting:
            continue
        found_sinks, found_cycles = graph.reaches(rank)
        sinks.update(found_sinks)
        cycles.extend(c for c in found_cycles if c.circular and c not in cycles)
    notes.extend(f"part of the circular wait between {_ranks(c.ranks)} named above" for c in cycles)
    if sinks:
        notes.append(f"blocked behind the straggler{'s' if len(sinks) > 1 else ''} {_ranks(sorted(sinks))}")
    return " (" + "; ".join(notes) + ")" if notes else ""


def _recovery(variant: VariantResult) -> str:
    """What a run that passed only after recovering from a failure went through (empty: it never failed). Why: a
    crash the recovery replaced said "nothing to explain", though a rank died and steps were re-done."""
    entry = next((e for e in variant.explanations if e.get("call") == "recovery"), None)
    if entry is None or not entry.get("recoveries"):
        return ""
    failures = [
        f"rank {e['rank']} failed at t={e['time_s']:.3f} s ({e['type']}"
        + (f": {line})" if (line := next(iter(e["message"].splitlines()), "")) else ")")
        for e in variant.outcome.errors
        if isinstance(e.get("time_s"), int | float)
    ]
    replaced = entry.get("replacement_devices") or []
    parts = [*failures, str(entry["plan"])]
    if replaced:
        parts.append(f"replacement device{'s' if len(replaced) > 1 else ''} {', '.join(map(str, replaced))}")
    return "; ".join(parts) + "."


def explain(variant: VariantResult) -> str:
    outcome = variant.outcome
    slow = [_slowdown(item) for item in outcome.slowdowns]
    if outcome.verdict == "pass":
        recovered = _recovery(variant)
        if recovered:
            finished = f"{variant.name}: every rank finished its program after a recovery: {recovered}"
            return finished + (" It ran more slowly than it could: " + " ".join(slow) if slow else "")
        raced = pass_decided_by_race(outcome)
        if raced is not None:
            return f"{variant.name}: every rank finished its program, but it {raced}"
        unacted = outcome.faults_unacted
        if unacted:  # the run survived no fault: it was never struck by the ones scheduled
            faults = "; ".join(unacted)
            return f"{variant.name}: every rank finished its program, but no scheduled fault acted: {faults}."
        if slow:
            return f"{variant.name}: every rank finished its program, but more slowly than it could: " + " ".join(slow)
        return f"{variant.name}: every rank finished its program; nothing to explain."
    paragraphs: list[str] = list(slow)
    # Ranks that ended alike (the same way, time, op and message but for the rank's own number) are told once:
    # 65,536 ranks raising one error on one op were 65,536 sentences (8.5 MB on one line), where `simnccl run`
    # prints a line. Messages that differ otherwise (whom a cross-wired rank is wired to) stay sentences of their own.
    # (the sentence before and after the message, the message) -> (rank, its message)
    alike: dict[tuple[str, str, str], list[tuple[int, str]]] = {}
    for error in outcome.errors:
        if error["kind"] in ("timeout", "heartbeat"):
            continue
        # the sentence's own full stop ends it: torch's messages often end in one ("... the group first.")
        first = error["message"].splitlines()[0].rstrip(".") if error["message"] else ""
        # "died" only where the process did (a crash, gloo's SIGABRT); the rest raised an exception the program
        # could have caught, and a reader takes "died" for a crash to look for in the logs. The cross-wired check
        # is the simulator's own: real torch raises nothing there
        ended = "died" if error["kind"] in ("crash", "abort") else "raised"
        if error["type"] == CROSS_WIRED_TYPE:
            ended = "was stopped by simnccl's check"
        head = f"{ended} at t={error['time_s']:.3f} s in {error['op']}: {error['type']}: "
        tail = "."
        if error.get("replaced_timeout"):  # the wait it ended is no hang entry: tell it here
            tail += f" torch {replaced_timeout_text(error['replaced_timeout'])}."
        own = re.sub(rf"\brank {error['rank']}\b", "rank R", first, flags=re.IGNORECASE)
        alike.setdefault((head, tail, own), []).append((error["rank"], first))
    for (head, tail, _), said in alike.items():
        rank, message = min(said)
        if len(said) > 1:
            message += f" (rank {rank}'s message; the others' alike)"
        paragraphs.append(f"{_ranks([r for r, _ in said]).capitalize()} {head}{message}{tail}")
    graphs = WaitForGraph.by_segment(outcome.hangs)
    for graph in graphs.values():
        paragraphs.extend(_cycle(graph, cycle) for cycle in graph.cycles() if cycle.circular)
    stuck: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for hang in outcome.hangs:
        stuck[(hang.get("segment"), hang["group"], hang["kind"], hang["seq"], hang["op"])].append(hang)
    for (segment, group, kind, seq, op), hangs in sorted(
        stuck.items(), key=lambda item: (item[0][0] or 0, min(h["rank"] for h in item[1]))
    ):
        waiting = [h["rank"] for h in hangs]
        missing = sorted({r for h in hangs for r in h["waiting_for"]})
        since = min(h["since_s"] for h in hangs)
        what = f"{op} ({kind} #{seq} on group {group!r})" if group else f"{op} ({kind})"
        verb = "is" if len(waiting) == 1 else "are"
        text = f"{_ranks(waiting).capitalize()} {verb} stuck since t={since:.3f} s in {what}"
        if missing:
            text += f", waiting for {_ranks(missing)}{_behind(graphs[segment], waiting, missing)}"
        text += "."
        reasons = list(dict.fromkeys(h["explanation"].rstrip(".") for h in hangs if h.get("explanation")))
        if reasons:
            text += f" Why: {'; '.join(reasons[:MAX_REASONS])}."
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
