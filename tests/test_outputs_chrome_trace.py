"""``--trace FILE.json``: a Chrome/Perfetto trace that keeps the trace-event format's rules (checked here the way
a viewer reads it: required keys per phase, nested complete events, time order per track, matched flows bound to
slices) and tells the run's story (a track per rank, hangs, waits, meetings, memory counters)."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from conftest import SCENARIOS_DIR

from simnccl.cli import main
from simnccl.memory import to_mib
from simnccl.outputs.chrome_trace import TraceUnavailable, build_trace, write_trace
from simnccl.result import ScenarioResult
from simnccl.runner import run_scenario
from simnccl.scenario import load_scenario

PHASES = {"X", "i", "C", "s", "f", "M"}
METADATA = {
    "process_name": "name",
    "thread_name": "name",
    "process_sort_index": "sort_index",
    "thread_sort_index": "sort_index",
}


def check_trace_events(document: Any) -> dict[str, int]:
    """The trace-event format's rules a viewer relies on; returns the count of events per phase."""
    assert isinstance(document, dict) and isinstance(document["traceEvents"], list)
    assert document.get("displayTimeUnit") in (None, "ms", "ns")
    named_pids, named_threads, tracks = set(), set(), set()
    last_ts: dict[tuple[int, int], int] = {}
    open_slices: dict[tuple[int, int], list[int]] = defaultdict(list)
    slices: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    flows: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    counts: Counter[str] = Counter()
    for event in document["traceEvents"]:
        ph = event["ph"]
        counts[ph] += 1
        assert ph in PHASES, event
        assert isinstance(event["name"], str) and event["name"], event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int), event
        track = (event["pid"], event["tid"])
        if ph == "M":
            assert event["name"] in METADATA, event
            assert METADATA[event["name"]] in event["args"], event
            if event["name"] == "process_name":
                named_pids.add(event["pid"])
            if event["name"] == "thread_name":
                named_threads.add(track)
            continue
        assert isinstance(event["ts"], int | float) and math.isfinite(event["ts"]) and event["ts"] >= 0, event
        ts = _ns(event["ts"])
        assert ts >= last_ts.get(track, -1), f"ts goes back on track {track}: {event}"
        last_ts[track] = ts
        if ph == "X":
            assert isinstance(event["dur"], int | float) and math.isfinite(event["dur"]) and event["dur"] >= 0, event
            stack = open_slices[track]
            while stack and ts >= stack[-1]:
                stack.pop()  # ended before this one starts
            end = ts + _ns(event["dur"])
            assert not stack or end <= stack[-1], f"slice overlaps its parent without nesting: {event}"
            stack.append(end)
            slices[track].append((ts, end))
            tracks.add(track)
        elif ph == "i":
            assert event["s"] in ("t", "p", "g"), event
            tracks.add(track)
        elif ph == "C":
            assert event["args"] and all(isinstance(v, int | float) for v in event["args"].values()), event
        else:  # s / f
            assert "id" in event and event.get("cat"), event
            if ph == "f":
                assert event.get("bp") == "e", event
            flows[event["id"]].append(event)
    for flow_id, (*pair,) in flows.items():
        assert [e["ph"] for e in pair] == ["s", "f"] or [e["ph"] for e in pair] == ["f", "s"], flow_id
        start, finish = sorted(pair, key=lambda e: e["ph"] != "s")
        assert start["name"] == finish["name"] and start["cat"] == finish["cat"], flow_id
        assert finish["ts"] >= start["ts"], flow_id
        for event in (start, finish):
            spans = slices[(event["pid"], event["tid"])]
            assert any(ts <= _ns(event["ts"]) <= end for ts, end in spans), f"flow event outside any slice: {event}"
    assert {pid for pid, _ in tracks} <= named_pids
    assert tracks <= named_threads
    return dict(counts)


def _ns(us: float) -> int:
    """Microseconds as the viewers store them: integer nanoseconds."""
    return round(us * 1000)


def strict_load(path: Path) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    return json.loads(path.read_text(), parse_constant=refuse)


def traced(name: str, *variants: str) -> ScenarioResult:
    return run_scenario(load_scenario(SCENARIOS_DIR / f"{name}.toml"), list(variants) or None, keep_trace=True)


def rank_events(document: dict[str, Any], variant: str) -> dict[str, list[dict[str, Any]]]:
    """Events per thread name ('rank 0', ...) of one variant's processes."""
    pids = {
        e["pid"]
        for e in document["traceEvents"]
        if e["name"] == "process_name" and f" · {variant} · " in e["args"]["name"]
    }
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in document["traceEvents"]
        if e["name"] == "thread_name" and e["pid"] in pids
    }
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in document["traceEvents"]:
        if event["ph"] != "M" and (event["pid"], event["tid"]) in names:
            out[names[(event["pid"], event["tid"])]].append(event)
    return out


@pytest.mark.parametrize("path", sorted(SCENARIOS_DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_writes_a_valid_trace(path: Path, tmp_path: Path) -> None:
    result = run_scenario(load_scenario(path), keep_trace=True)
    target = tmp_path / "trace.json"
    count = write_trace([result], target)
    document = strict_load(target)
    counts = check_trace_events(document)
    assert count == len(document["traceEvents"])
    assert counts["M"] >= 2 and counts["i"] > 0
    assert document["otherData"]["runs"][0]["trace_hash"] == result.trace_hash


def test_the_creation_order_deadlock_shows_every_rank_hung_and_the_meetings_before() -> None:
    document = build_trace([traced("creation-order-hang", "torch-2.15-default")])
    check_trace_events(document)
    ranks = rank_events(document, "torch-2.15-default")
    assert sorted(ranks) == ["rank 0", "rank 1", "rank 2", "rank 3"]
    hung = {
        name: [e for e in events if e["ph"] == "X" and e["name"].startswith("hung in ")]
        for name, events in ranks.items()
    }
    assert hung["rank 2"][0]["name"] == "hung in new_group(ranks=[0, 2], bind='dp')"
    assert hung["rank 2"][0]["args"]["waiting_for"] == [0]
    waits = {e["name"] for e in ranks["rank 2"] if e["ph"] == "X" and e["cat"] == "wait"}
    assert "wait for rank 0" in waits
    for events in ranks.values():
        names = [e["name"] for e in events if e["ph"] == "X" and e["cat"] == "op"]
        assert names[0] == "init_process_group (bootstrap #0 on '0')"
        assert "new_group (split #1 on '0')" in names
    # The bootstrap of the default group: the last rank to arrive releases the three others.
    flows = [e for e in document["traceEvents"] if e["ph"] == "s" and e["name"].startswith("init_process_group")]
    assert len(flows) == 3


def test_a_rank_that_arrives_late_shows_the_others_waiting_for_it() -> None:
    document = build_trace([traced("hang-missing-rank", "nccl2-default")])
    ranks = rank_events(document, "nccl2-default")
    stalled = [e for e in ranks["rank 1"] if e["ph"] == "X" and e["name"].startswith("hung in ")]
    assert stalled and stalled[0]["args"]["kind"] == "stall"
    waiting = [e for e in ranks["rank 0"] if e["ph"] == "X" and e["name"] == "wait for rank 1"]
    assert waiting and waiting[-1]["dur"] > 600e6  # until the watchdog's timeout, in simulated microseconds
    assert any(e["ph"] == "i" and e["name"].startswith("timeout") for e in ranks["rank 0"])


def test_memory_counters_end_at_each_devices_used_memory() -> None:
    result = traced("pytorch-199957")
    document = build_trace([result])
    for variant in result.variants:
        pids = {
            e["pid"]
            for e in document["traceEvents"]
            if e["name"] == "process_name" and f" · {variant.name} · " in e["args"]["name"]
        }
        for ledger in variant.outcome.ledgers.values():
            if not ledger.timeline:
                continue
            counters = [
                e
                for e in document["traceEvents"]
                if e["ph"] == "C" and e["pid"] in pids and e["name"] == f"{ledger.device} used MiB"
            ]
            assert counters
            assert sum(counters[-1]["args"].values()) == pytest.approx(to_mib(ledger.used_bytes), abs=0.01)
            assert set(counters[-1]["args"]) >= {"comm", "cuda_context"}


def test_a_recovery_job_has_a_track_of_segments() -> None:
    result = traced("crash-replaced")
    document = build_trace([result])
    check_trace_events(document)
    segments = [e for e in document["traceEvents"] if e["ph"] == "X" and e.get("cat") == "segment"]
    report = result.variants[0].outcome.recovery
    assert len(segments) == len(report.segments) >= 2
    assert segments[0]["name"].startswith("segment 1: steps ")


def test_a_run_without_its_event_trace_is_refused() -> None:
    result = run_scenario(load_scenario(SCENARIOS_DIR / "creation-order-hang.toml"), ["legacy"])
    with pytest.raises(TraceUnavailable, match="keep_trace=True"):
        build_trace([result])


def test_keeping_the_trace_changes_nothing_the_run_reports() -> None:
    plain = run_scenario(load_scenario(SCENARIOS_DIR / "creation-order-hang.toml"))
    kept = traced("creation-order-hang")
    assert plain.trace_hash == kept.trace_hash
    assert [v.outcome.hangs for v in plain.variants] == [v.outcome.hangs for v in kept.variants]
    assert all(v.outcome.meetings == [] for v in plain.variants)
    assert all(v.outcome.meetings for v in kept.variants)


def test_run_trace_option_writes_the_file_and_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "run.json"
    code = main(["run", str(SCENARIOS_DIR / "creation-order-hang.toml"), "--trace", str(target)])
    err = capsys.readouterr().err
    assert code == 0
    assert f"Perfetto trace: {target}" in err
    counts = check_trace_events(strict_load(target))
    assert counts["X"] > 0 and counts["s"] == counts["f"] > 0 and counts["C"] > 0


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("trace.txt", "--trace {path}: expected a file name ending in .json"),
        ("missing/trace.json", "--trace {path}: the folder {folder} does not exist"),
    ],
)
def test_a_trace_path_that_cannot_be_written_is_refused_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, message: str
) -> None:
    path = tmp_path / name
    code = main(["run", str(SCENARIOS_DIR / "creation-order-hang.toml"), "--trace", str(path)])
    captured = capsys.readouterr()
    assert code == 2
    assert message.format(path=path, folder=path.parent) in " ".join(captured.err.split())
    assert captured.out == "" and not path.exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, a folder nobody can create a file in")
@pytest.mark.parametrize("flag", ["--trace", "--plot", "--json"])
def test_a_folder_that_refuses_files_is_refused_before_running(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """A folder that exists but takes no file (sysfs, /proc, a read-only mount; root passes every permission
    check) was found only when the report was written, after the whole run."""
    suffix = ".png" if flag == "--plot" else ".json"
    code = main(["run", str(SCENARIOS_DIR / "creation-order-hang.toml"), flag, f"/proc/simnccl{suffix}"])
    captured = capsys.readouterr()
    assert code == 2 and "cannot write in" in captured.err and "/proc" in captured.err, captured.err
    assert captured.out == "", "nothing ran"
