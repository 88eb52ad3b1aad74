"""``--memory-snapshot FILE.pickle``: a torch CUDA memory snapshot of the simulated ledger, with communicator
buffers as their own segments — rendered by torch's own ``torch.cuda._memory_viz`` (tests marked ``torch``) and
checked against the ledger without torch."""

from __future__ import annotations

import base64
import io
import json
import pickle
import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from conftest import SCENARIOS_DIR

from simnccl.cli import main
from simnccl.ops import AllReduce, DestroyProcessGroup, InitProcessGroup, NewGroup, SetDevice
from simnccl.outputs.memory_snapshot import build_snapshot, write_snapshots
from simnccl.result import ScenarioResult, VariantResult
from simnccl.runner import run_scenario
from simnccl.scenario import load_scenario
from simnccl.testing import simulate


class BuiltinsOnly(pickle.Unpickler):
    """Loads only builtins: a snapshot must open without simnccl (or torch) installed."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the snapshot refers to {module}.{name}")


def load(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        return BuiltinsOnly(handle).load()


def result(name: str, *variants: str) -> ScenarioResult:
    return run_scenario(load_scenario(SCENARIOS_DIR / f"{name}.toml"), list(variants) or None)


def test_segments_are_the_ledgers_live_charges_and_add_up_to_its_used_memory() -> None:
    variant = result("pytorch-199957", "nccl2-default").variants[0]
    snapshot = build_snapshot(variant)
    assert set(snapshot) == {"segments", "device_traces"}
    ledgers = list(variant.outcome.ledgers.values())
    assert len(snapshot["device_traces"]) == len(ledgers)
    for index, ledger in enumerate(ledgers):
        mine = [s for s in snapshot["segments"] if s["device"] == index]
        assert sum(s["total_size"] for s in mine) == ledger.used_bytes
        comm = sum(s["total_size"] for s in mine if s["segment_pool_id"] == (1, 0))
        assert comm == ledger.used_by_kind().get("comm", 0) > 0
        for segment in mine:
            [block] = segment["blocks"]
            assert block["size"] == block["requested_size"] == segment["total_size"] == segment["allocated_size"]
            assert block["state"] == "active_allocated" and block["address"] == segment["address"]
    addresses = sorted((s["address"], s["address"] + s["total_size"]) for s in snapshot["segments"])
    assert all(end <= start for (_, end), (start, _) in pairwise(addresses))


def test_communicator_segments_say_whose_buffers_they_are() -> None:
    snapshot = build_snapshot(result("pytorch-199957", "nccl2-default").variants[0])
    names = [s["frames"][0]["name"] for s in snapshot["segments"]]
    assert any(re.fullmatch(r"NCCL communicator buffers of group '1' \(\w[\w-]*\), rank \d+", n) for n in names)
    assert any(n.startswith("CUDA context of rank 0") for n in names)
    assert all(s["frames"][1]["name"].startswith("rank ") for s in snapshot["segments"])


def test_device_traces_pair_every_alloc_with_its_segment_and_every_free_with_a_release() -> None:
    variant = result("pytorch-199957", "legacy").variants[0]
    snapshot = build_snapshot(variant)
    for trace, ledger in zip(snapshot["device_traces"], variant.outcome.ledgers.values(), strict=True):
        live: dict[int, int] = {}
        for first, second in pairwise(trace):
            if first["action"] == "segment_alloc":
                assert second["action"] == "alloc" and second["addr"] == first["addr"]
        for entry in trace:
            assert entry["stream"] == 0 and isinstance(entry["time_us"], int) and entry["frames"]
            if entry["action"] == "alloc":
                live[entry["addr"]] = entry["size"]
            elif entry["action"] == "free_completed":
                del live[entry["addr"]]
        assert sum(live.values()) == ledger.used_bytes


def test_a_destroyed_group_frees_its_segments() -> None:
    program = [
        SetDevice(),
        InitProcessGroup(backend="nccl"),
        NewGroup(ranks=(0, 1), bind="g"),
        AllReduce(group="g"),
        DestroyProcessGroup(group="g"),
    ]
    outcome = simulate(program)
    snapshot = build_snapshot(VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", outcome))
    released = [e for trace in snapshot["device_traces"] for e in trace if e["action"] == "segment_free"]
    assert released and all("group '1'" in e["frames"][0]["name"] for e in released)
    freed = sum(-e.delta_bytes for ledger in outcome.ledgers.values() for e in ledger.timeline if e.delta_bytes < 0)
    assert sum(e["size"] for e in released) == freed > 0
    live = sum(s["total_size"] for s in snapshot["segments"])
    assert live == sum(ledger.used_bytes for ledger in outcome.ledgers.values())
    assert not any("group '1'" in s["frames"][0]["name"] for s in snapshot["segments"])


def test_one_file_per_variant_holding_only_builtins(tmp_path: Path) -> None:
    paths = write_snapshots([result("pytorch-199957")], tmp_path / "mem.pickle")
    assert [p.name for p in paths] == [
        "mem-nccl2-default.pickle",
        "mem-legacy.pickle",
        "mem-share-resources.pickle",
    ]
    for path in paths:
        assert load(path)["segments"]
    single = write_snapshots([result("pytorch-199957", "legacy")], tmp_path / "one.pickle")
    assert single == [tmp_path / "one.pickle"]


def test_writing_a_snapshot_imports_no_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from simnccl.cli import main\n"
        f"rc = main(['run', '--memory-snapshot', {str(tmp_path / 's.pickle')!r}])\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
        "sys.exit(rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(list(tmp_path.glob("s-*.pickle"))) == 3


def test_run_memory_snapshot_option_names_each_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "run",
            str(SCENARIOS_DIR / "vllm-startup-check.toml"),
            "--variant",
            "legacy",
            "--memory-snapshot",
            str(tmp_path / "m.pkl"),
        ]
    )
    assert code == 0
    assert f"memory snapshot: {tmp_path / 'm.pkl'}" in capsys.readouterr().err
    assert load(tmp_path / "m.pkl")["device_traces"]


# --------------------------------------------------------------------------------- torch's own renderer


@pytest.mark.torch
@pytest.mark.parametrize("scenario", ["pytorch-199957", "megatron-tp4-dp2-h100", "oom-at-group-creation"])
def test_torch_memory_viz_renders_the_snapshot(tmp_path: Path, scenario: str) -> None:
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    [path, *_] = write_snapshots([result(scenario)], tmp_path / "s.pickle")
    snapshot = load(path)

    summary = memory_viz.segsum(snapshot)  # asserts its own accounting: reserved == allocated + free
    assert f"segments: {len(snapshot['segments'])}" in summary
    assert "total_free: 0.0B" in summary

    text = memory_viz.trace(snapshot)
    assert "Device 0 ----------------" in text and "cudaMalloc(" in text

    # The flamegraph views: torch writes one "stack size" line per block (the SVG step needs flamegraph.pl).
    lines = memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines).splitlines()
    assert len(lines) == len(snapshot["segments"])
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == sum(s["total_size"] for s in snapshot["segments"])
    assert any("NCCL communicator buffers of group" in line for line in lines)
    per_segment = memory_viz.segments(snapshot, format_flamegraph=lambda lines: lines)
    assert per_segment.count(";seg_") == len(snapshot["segments"])

    for render in (memory_viz.trace_plot, memory_viz.segment_plot):
        html = render(snapshot)
        embedded = json.loads(re.search(r"const local_files = (\[.*?\])\n", html).group(1))
        assert pickle.load(io.BytesIO(base64.b64decode(embedded[0]["base64"]))) == snapshot
