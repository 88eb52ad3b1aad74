"""``simnccl cost`` explains the MiB: per communicator, channels x buffers, NVLS, network shared buffers, fixed
overheads, and when each is paid, in the ``--breakdown`` view and always in the JSON."""

from __future__ import annotations

import json

import pytest
from conftest import SCENARIOS_DIR

from simnccl import cost_breakdown
from simnccl.cli import main
from simnccl.engine.nvls import multicast_data, slots_per_node
from simnccl.ops import AllReduce, Checkpoint, InitProcessGroup, NewGroup, SetDevice
from simnccl.profiles import find_profile
from simnccl.runner import run_scenario
from simnccl.scenario import load_scenario
from simnccl.testing import simulate

SLOTS = multicast_data().integer("per_communicator.slots")  # what the multicast ledger charges a communicator
VLLM = ["cost", "--workload", "vllm", "--tp", "8", "--gpu", "h100-80gb", "--variant", "torch-default"]


def test_breakdown_is_in_the_cost_json_and_adds_up_to_the_nccl_row(capsys) -> None:
    assert main([*VLLM, "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    (col,) = result["columns"]
    summary = col["breakdown"]["summary"]
    categories = sum(summary[f"cat:{c}"]["typical"] for c in cost_breakdown.CATEGORIES)
    assert categories == pytest.approx(col["summary"]["nccl_mib"]["typical"], abs=0.2)
    when = summary["when:init"]["typical"] + summary["when:first use"]["typical"]
    assert when == pytest.approx(categories, abs=0.2)
    assert summary["cat:NVLS"]["typical"] > 0 and summary["slots"]["typical"] == 3 * SLOTS  # 3 NVLS groups of 8
    assert summary["cat:process"]["typical"] == find_profile("h100-80gb", "2.15").comm.process_mib
    comms = col["breakdown"]["communicators"]
    assert len(comms) == 7 and all(c["parts"] for c in comms)  # the default group + 6 NCCL groups of rank 0
    assert {p["paid_at"] for c in comms for p in c["parts"]} == {"init"}  # nothing is used before the check


def test_breakdown_view_only_with_the_flag(capsys) -> None:
    assert main(VLLM) == 0
    plain = capsys.readouterr().out
    assert "where the NCCL MiB come from" not in plain
    assert main([*VLLM, "--breakdown"]) == 0
    out = capsys.readouterr().out
    assert "where the NCCL MiB come from" in out
    assert "torch-default: rank 0's communicators" in out
    assert "0 (default_pg)" in out and "(process)" in out
    for label in ("channels x buffers MiB", "NVLS MiB", "net shared MiB", "fixed MiB", "paid at first use MiB"):
        assert label in out


def test_first_use_is_told_apart_from_init() -> None:
    out = simulate(
        [
            SetDevice(),
            InitProcessGroup(backend="nccl"),
            NewGroup(ranks=(0, 1), bind="g"),
            AllReduce(group="g"),
            Checkpoint(label="x"),
        ]
    )
    data = cost_breakdown.breakdown(out)
    (g,) = [c for c in data["communicators"] if c["group"] != "0"]
    assert g["when:first use"] == 64 and g["cat:NVLS"] == 64 + 34  # buffers at first use; channels+credit at init
    assert g["uses"] == ["all_reduce 4194304 B"]
    profile = find_profile("h100-80gb", "2.15")
    assert data["process_mib"] == {
        "process-first-comm": profile.comm.process_mib,
        "process-first-collective": profile.comm.process_first_collective_mib,
    }
    summary = data["summary"]
    assert summary["when:first use"]["typical"] == pytest.approx(
        64 + profile.comm.process_first_collective_mib, abs=0.1
    )


def test_breakdown_slots_are_what_the_multicast_ledger_charged_when_it_failed_the_bind() -> None:
    """nccl#2077 on 8x H200: the breakdown's slots are the ledger's, so the count a user reads is the one that
    failed the 12th pair's bind (world + 11 pairs hold 120 of 128; one more communicator needs 10)."""
    scenario = load_scenario(SCENARIOS_DIR / "nvls-multicast-exhaustion.toml")
    (variant,) = run_scenario(scenario, ["nccl2-default"]).variants
    out = variant.outcome
    assert variant.verdict == "error"
    per_comm: dict[str, float] = {}  # a node's members share one binding: count each communicator once
    for comms in cost_breakdown.communicators(out).values():
        per_comm.update((c["communicator"], c["slots"]) for c in comms)
    capacity = slots_per_node("h200-141gb")
    assert capacity is not None
    assert sum(per_comm.values()) == out.multicast_slots["n0"] == 12 * SLOTS
    assert sum(per_comm.values()) + SLOTS > capacity  # exactly why the next bind failed
    rank0 = cost_breakdown.per_rank_totals(out)[0]["slots"]
    assert rank0 == 9 * SLOTS  # the world and ranks 0-1's 8 pairs
