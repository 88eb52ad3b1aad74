"""Flight-recorder dumps in torch 2.15's format, and torch's own analyzer reading them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simnccl.explain import explain
from simnccl.faults import Fault, FaultSchedule
from simnccl.flight_recorder import FR_VERSION, dump_prefix, write_dumps
from simnccl.ops import AllReduce, InitProcessGroup, NewGroup, SetDevice
from simnccl.runner import run_scenario
from simnccl.scenario import load_scenario
from simnccl.testing import simulate

REPO = Path(__file__).resolve().parents[1]
START = [SetDevice(), InitProcessGroup(backend="nccl")]
BODY = [
    *START,
    NewGroup(ranks=(0, 1, 2, 3), bind="tp", group_desc="tp"),
    *[AllReduce(group="tp", size_bytes=32) for _ in range(3)],
]


def stalled(*faults: Fault, env=None, backend="nccl"):
    body = [SetDevice(), InitProcessGroup(backend=backend), *BODY[2:]]
    return simulate(body, gpus_per_node=4, env=env, faults=FaultSchedule(None, (), faults))


def test_dump_has_torchs_keys_and_group_names_match_entries() -> None:
    out = stalled(Fault("stall", 1, at_op=5))
    dump = out.fr_dumps[0]
    assert dump["version"] == FR_VERSION == "2.10"
    assert set(dump) >= {"version", "pg_config", "pg_status", "entries", "comm_lib_version"}
    assert dump["pg_config"]["1"] == {"name": "1", "desc": "tp", "ranks": "[0, 1, 2, 3]"}
    names = {e["process_group"][0] for e in dump["entries"]}
    assert names <= set(dump["pg_config"])
    first, last = dump["entries"][0], dump["entries"][-1]
    assert first["profiling_name"] == "nccl2:all_reduce" and first["state"] == "completed"
    assert last["collective_seq_id"] == 3 and last["state"] == "scheduled" and last["timeout_ms"] == 600_000
    for key in ("input_dtypes", "output_dtypes", "time_created_ns", "is_p2p", "p2p_seq_id", "op_id"):
        assert key in first
    assert first["input_sizes"] == [[8]]  # 32 bytes of Float


def test_legacy_records_natively_under_its_own_name_and_fake_records_nothing() -> None:
    legacy = stalled(Fault("stall", 1, at_op=5), env={"TORCH_DIST_USE_NCCL2": "0"})
    assert legacy.fr_dumps[0]["entries"][0]["profiling_name"] == "nccl:all_reduce"
    fake = stalled(Fault("stall", 1, at_op=5), backend="fake")
    assert fake.verdict == "hang" and not fake.fr_dumps  # nothing times out on fake, nothing is dumped


def test_buffer_size_bounds_the_ring_and_zero_disables_it() -> None:
    out = stalled(Fault("stall", 1, at_op=5), env={"TORCH_FR_BUFFER_SIZE": "2"})
    assert [e["collective_seq_id"] for e in out.fr_dumps[0]["entries"]] == [2, 3]
    assert not stalled(Fault("stall", 1, at_op=5), env={"TORCH_FR_BUFFER_SIZE": "0"}).fr_dumps


def test_dump_prefix_follows_torch() -> None:
    assert dump_prefix({"TORCH_FR_DUMP_TEMP_FILE": "/x/trace_"}) == "/x/trace_"
    assert dump_prefix({"XDG_CACHE_HOME": "/c"}) == os.path.join("/c", "torch", "comm_lib_trace_rank_")
    assert dump_prefix({"HOME": "/h"}) == os.path.join("/h", ".cache", "torch", "comm_lib_trace_rank_")


def test_dead_ranks_write_no_dump() -> None:
    out = stalled(Fault("crash", 1, at_op=5))
    assert set(out.fr_dumps) == {0, 2, 3}


def test_explain_names_the_straggler_group_and_sequence() -> None:
    scenario = load_scenario(REPO / "scenarios" / "hang-missing-rank.toml")
    variant = run_scenario(scenario, ["nccl2-default"]).variants[0]
    text = explain(variant)
    assert "waiting for rank 1: the straggler is rank 1" in text
    assert "collective #3 on group '1'" in text
    assert "Detected at t=615.400 s (timeout 600 s + 15 s flight-recorder dump wait)" in text


# ------------------------------------------------------------------------------------------- torch's analyzer


def fr_trace(directory: Path, *args: str) -> str:
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(directory), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    return done.stdout + done.stderr


@pytest.mark.torch
def test_fr_trace_names_the_missing_rank_group_and_sequence(tmp_path: Path) -> None:
    scenario = load_scenario(REPO / "scenarios" / "hang-missing-rank.toml")
    variant = run_scenario(scenario, ["nccl2-default"]).variants[0]
    write_dumps(variant.outcome.fr_dumps, tmp_path)
    output = fr_trace(tmp_path)
    assert "Not all ranks joining collective, sequence number: 3" in output, output
    assert "missing ranks: {1}" in output
    assert "group info: 1:tp" in output


@pytest.mark.torch
def test_fr_trace_reports_the_size_mismatch(tmp_path: Path) -> None:
    scenario = load_scenario(REPO / "scenarios" / "hang-size-mismatch.toml")
    variant = run_scenario(scenario, ["nccl2-default"]).variants[0]
    write_dumps(variant.outcome.fr_dumps, tmp_path)
    output = fr_trace(tmp_path)
    assert "SIZE_OR_SYNTAX_MISMATCH" in output, output
    assert "[[16]]" in output and "[[32]]" in output


@pytest.mark.torch
def test_fr_trace_with_a_dead_rank_needs_allow_incomplete_ranks(tmp_path: Path) -> None:
    out = stalled(Fault("crash", 1, at_op=5))
    write_dumps(out.fr_dumps, tmp_path)
    assert "Missing dump files from ranks {1}" in fr_trace(tmp_path)
    output = fr_trace(tmp_path, "--allow-incomplete-ranks")
    assert "we missed FR dumps from ranks ({1})" in output, output


def test_an_entrys_element_count_is_its_bytes_over_the_dtypes_size_and_an_unknown_dtype_is_never_remembered() -> None:
    """``numel`` keeps its answers per (size, dtype): the same answers as computed afresh, at least one element,
    and a dtype the table lacks raises every time (a remembered answer must not hide it)."""
    from simnccl.dtypes import element_bytes
    from simnccl.flight_recorder import numel

    for size, dtype in [(4096, "Float"), (4096, "BFloat16"), (1, "Float"), (0, "Long"), (4096, "Float")]:
        assert numel(size, dtype) == max(1, size // element_bytes(dtype))
    assert numel(4096, "Float") == 1024 and numel(4096, "BFloat16") == 2048
    for _ in range(2):
        with pytest.raises(KeyError):
            numel(8, "no-such-dtype")
