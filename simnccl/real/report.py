"""Plain-text rendering of real runs (``python -m simnccl.real run``): verdict, where each rank ended, checkpoints."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def rank_outcomes(variant: Mapping[str, Any], world_size: int | None = None) -> dict[int, dict[str, Any]]:
    """Per rank, from a Result-shaped variant dict (simulated or real): status hang/error/done, op and index.

    A rank in ``hangs`` is ``hang`` (a watchdog timeout that the simulator also lists under errors stays a hang);
    a rank only in ``errors`` is ``error`` with its kind; every other rank is ``done``.
    """
    out: dict[int, dict[str, Any]] = {}
    for error in variant.get("errors", []):
        out[int(error["rank"])] = {"status": "error", "kind": error.get("kind", ""), "op": error.get("op", "")}
    for hang in variant.get("hangs", []):
        out[int(hang["rank"])] = {
            "status": "hang",
            "kind": hang.get("kind", ""),
            "op": hang.get("op", ""),
            "op_index": hang.get("op_index"),
            "waiting_for": list(hang.get("waiting_for", [])),
        }
    ranks = world_size
    if ranks is None:
        ranks = max([*out, *(r["rank"] for r in variant.get("ranks", []))], default=-1) + 1
    for rank in range(ranks):
        out.setdefault(rank, {"status": "done", "kind": "", "op": ""})
    return dict(sorted(out.items()))


def describe_outcome(outcome: Mapping[str, Any]) -> str:
    if outcome["status"] == "done":
        return "done"
    where = outcome.get("op") or "?"
    index = outcome.get("op_index")
    at = f"#{index} {where}" if index is not None else where
    kind = f" [{outcome['kind']}]" if outcome.get("kind") else ""
    waiting = outcome.get("waiting_for")
    tail = f" waiting for {waiting}" if waiting else ""
    return f"{outcome['status']}{kind} at {at}{tail}"


def render_run(report: Mapping[str, Any]) -> str:
    return "\n".join([render_run_header(report), *(render_run_variant(v) for v in report["variants"])])


def render_run_header(report: Mapping[str, Any]) -> str:
    return f"scenario {report['scenario']} ({report['source']}) — real run, {report['lane']} lane"


def render_run_variant(variant: Mapping[str, Any]) -> str:
    """One variant's real run, starting with an empty line (printed as soon as the variant has run)."""
    lines = [
        "",
        f"variant {variant['name']}: {variant['verdict'].upper()}  "
        f"(torch {variant['torch_version']}, policy {variant['policy']}, {variant.get('wall_s', '?')}s, "
        f"ended: {variant.get('end_reason', '')})",
    ]
    if variant.get("run_dir"):
        lines.append(f"  progress files and logs kept in {variant['run_dir']}")
    for text in variant.get("substitutions", []):
        lines.append(f"  substituted: {text}")
    for text in variant.get("notes", []):
        lines.append(f"  note: {text}")
    for rank, outcome in rank_outcomes(variant).items():
        lines.append(f"  rank {rank}: {describe_outcome(outcome)}")
    for error in variant.get("errors", []):
        lines.append(f"  error rank {error['rank']} ({error['kind']}): {_error_headline(error)}")
    for checkpoint in variant.get("checkpoints", []):
        for device in checkpoint["devices"]:
            lines.append(
                f"  checkpoint {checkpoint['name']} {device['device']}: used {device['used_mib']:.1f} MiB "
                f"(torch reserved {device.get('reserved_mib', 0):.1f}, "
                f"non-torch {device.get('non_torch_mib', 0):.1f})"
            )
    return "\n".join(lines)


def _error_headline(error: Mapping[str, Any]) -> str:
    """``type: first line of the message`` as the simulator prints an error, so a check names the exception the
    framework raised; the launcher's own records of a dead process (type ``signal``/``exit``) say it in words."""
    lines = str(error.get("message", "")).splitlines()
    first = lines[0][:200] if lines else ""
    kind = error.get("type", "")
    if not kind or kind in ("signal", "exit"):
        return first
    return f"{kind}: {first}" if first else kind
