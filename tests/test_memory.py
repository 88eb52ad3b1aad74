"""The per-device ledger: owners, free/total counting every process, OOM text, vLLM's check formula."""

from __future__ import annotations

import pytest

from simnccl.memory import DeviceLedger, Owner, SimulatedOOM, vllm_check_message, vllm_requested_bytes

MIB = 2**20


def test_every_process_on_a_device_counts_toward_used_and_free() -> None:
    ledger = DeviceLedger("n0:cuda:0", 1000 * MIB)
    ledger.allocate(Owner("cuda_context", 0), 100 * MIB, time_s=0, op="a")
    ledger.allocate(Owner("comm", 1, "3", "init"), 200 * MIB, time_s=1, op="b")
    assert ledger.mem_get_info() == (700 * MIB, 1000 * MIB)
    assert ledger.used_by_kind() == {"comm": 200 * MIB, "cuda_context": 100 * MIB}
    assert ledger.used_by_group() == {"3": 200 * MIB}
    assert ledger.release_owner(Owner("comm", 1, "3", "init"), time_s=2, op="c") == 200 * MIB
    assert ledger.peak_bytes == 300 * MIB and ledger.used_bytes == 100 * MIB
    assert [e.used_bytes for e in ledger.timeline] == [100 * MIB, 300 * MIB, 100 * MIB]


def test_an_allocation_that_does_not_fit_raises_and_changes_nothing() -> None:
    ledger = DeviceLedger("n0:cuda:0", 100 * MIB)
    ledger.allocate(Owner("torch", 0), 60 * MIB, time_s=0, op="a")
    with pytest.raises(SimulatedOOM, match=r"Tried to allocate 50\.00 MiB") as err:
        ledger.allocate(Owner("torch", 0), 50 * MIB, time_s=0, op="b")
    assert err.value.free_bytes == 40 * MIB
    assert ledger.used_bytes == 60 * MIB
    with pytest.raises(SimulatedOOM, match="Failed to CUDA calloc"):
        ledger.allocate(Owner("comm", 0, "1", "init"), 50 * MIB, time_s=0, op="b", nccl=True)


def test_vllm_requested_memory_is_a_ceiling_and_the_message_has_vllms_shape() -> None:
    total = 22.05 * 2**30
    assert vllm_requested_bytes(int(total), 0.9) == -(-int(total) * 9 // 10)
    text = vllm_check_message("cuda:1", int(19.77 * 2**30), int(total), 0.9, int(19.84 * 2**30))
    assert text.startswith(
        "Free memory on device cuda:1 (19.77/22.05 GiB) on startup is less than desired GPU memory utilization "
        "(0.9, 19.84 GiB)."
    )
