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


def _peak_kinds_replayed(ledger: DeviceLedger) -> dict[str, int]:
    """What each kind held at the ledger's peak, replayed from its timeline: the state after the last change
    that set a new peak."""
    held: dict[str, int] = {}
    at_peak: dict[str, int] = {}
    peak = 0
    for event in ledger.timeline:
        held[event.owner.kind] = held.get(event.owner.kind, 0) + event.delta_bytes
        if event.used_bytes > peak:
            peak, at_peak = event.used_bytes, dict(held)
    return {kind: n for kind, n in sorted(at_peak.items()) if n}


@pytest.mark.parametrize(
    "steps",
    [
        ["+ctx 100", "+comm 200"],  # only rising: the peak is now
        ["+ctx 100", "+comm 200", "-comm 200"],  # left the peak
        ["+ctx 100", "+comm 200", "-comm 200", "+torch 150"],  # below the old peak again
        ["+ctx 100", "+comm 200", "-comm 200", "+torch 300"],  # a new peak, of other kinds
        ["+ctx 100", "+comm 200", "move comm->torch 50", "+torch 10"],  # a move at the peak, then a new peak
        ["+ctx 100", "+comm 200", "move comm->torch 50"],  # a move keeps the use: the peak is before it
        ["+comm 50", "-comm 50", "+ctx 20"],  # back to nothing, then less than the peak
    ],
)
def test_what_each_kind_held_at_the_peak_is_the_state_after_the_last_new_peak(steps: list[str]) -> None:
    ledger = DeviceLedger("n0:cuda:0", 10_000 * MIB)
    owners = {
        kind: Owner(kind, 0, "1" if kind == "comm" else "", "init" if kind == "comm" else "")
        for kind in ("ctx", "comm", "torch")
    }
    for t, step in enumerate(steps):
        verb, *rest = step.split()
        if verb == "move":
            source, target = rest[0].split("->")
            ledger.move(owners[source], owners[target], int(rest[1]) * MIB, time_s=t, op=step)
        elif verb.startswith("+"):
            ledger.allocate(owners[verb[1:]], int(rest[0]) * MIB, time_s=t, op=step)
        else:
            ledger.release(owners[verb[1:]], int(rest[0]) * MIB, time_s=t, op=step)
    assert ledger.peak_by_owner_kind == _peak_kinds_replayed(ledger)
    assert sum(ledger.peak_by_owner_kind.values()) == ledger.peak_bytes


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


def test_every_ledger_of_a_run_that_frees_and_allocates_again_reports_its_peak_as_its_timeline_has_it() -> None:
    """A startup that destroys a group and makes another: the devices' peaks are left and passed again, and each
    ledger's peak by kind must be what its own timeline says held at the peak."""
    from simnccl.ops import AllReduce, Checkpoint, DestroyProcessGroup, InitProcessGroup, NewGroup, SetDevice
    from simnccl.testing import simulate

    program = [
        SetDevice(),
        InitProcessGroup(backend="nccl"),
        NewGroup(ranks=(0, 1, 2, 3), bind="g"),
        AllReduce(group="g"),
        DestroyProcessGroup(group="g"),
        NewGroup(ranks=(0, 1), bind="h"),
        NewGroup(ranks=(2, 3), bind="h2"),
        Checkpoint(label="end"),
    ]
    out = simulate(program, gpus_per_node=4)
    assert out.verdict == "pass"
    left_peak = 0
    for ledger in out.ledgers.values():
        assert ledger.peak_by_owner_kind == _peak_kinds_replayed(ledger)
        left_peak += ledger.used_bytes < ledger.peak_bytes
    assert left_peak == len(out.ledgers)  # every device left its peak (g destroyed): the snapshot was taken
