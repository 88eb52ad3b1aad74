"""CUDA without a GPU while capturing (``simnccl.capture.fake_devices``) and the captured first training step.

Plain torch on this CPU-only machine (a CUDA build without a driver): every target here would fail with "Found
no NVIDIA driver" or "CUDA driver version is insufficient" without the fake devices. Inline captures let a
test look at what the code saw; forked ones are what users run.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

import torch
import torch.distributed as dist

from simnccl import capture as cap
from simnccl.capture.fake_devices import TENSOR_TAG, TensorMemory
from simnccl.ops import MIB, Alloc, AllReduce, Checkpoint, EmptyCache, Free, SetDevice
from simnccl.scenario import load_scenario
from simnccl.testing import simulate

pytestmark = pytest.mark.torch


def _startup() -> None:
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())


def test_cuda_tensors_report_their_device_to_python_and_run_on_the_cpu() -> None:
    seen: list[Any] = []

    def target() -> None:
        _startup()
        a = torch.zeros(4, device="cuda")
        b = torch.ones(2, 3).to("cuda:1")
        c = torch.nn.Linear(3, 3).cuda().weight
        d = (b @ c).relu()
        seen.append((a.device, a.is_cuda, b.device, c.device, d.device, d.type(), d.sum().item() >= 0))
        host = d.cpu()
        seen.append((host.device, host.is_cuda))

    cap.capture(target, 2, mode="inline")
    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    assert seen[0] == (cuda0, True, cuda1, cuda0, cuda1, "torch.cuda.FloatTensor", True)
    assert seen[1] == (torch.device("cpu"), False)


def test_host_pinning_streams_and_to_another_tensor_work_without_a_driver() -> None:
    seen: list[Any] = []

    def target() -> None:
        _startup()
        on_gpu = torch.zeros(2, device="cuda")
        pinned = torch.empty(4, pin_memory=True)
        staged = torch.ones(4).pin_memory()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            moved = staged.to(on_gpu, non_blocking=True)
        moved.record_stream(stream)
        stream.synchronize()
        seen.append((pinned.is_pinned(), moved.device, torch.ones(1).to(moved).device, moved.to(pinned).device))

    cap.capture(target, 1, mode="inline")
    assert seen == [(False, torch.device("cuda", 0), torch.device("cuda", 0), torch.device("cpu"))]


def test_cuda_seeding_runs_torchs_own_rng_functions_on_one_generator_per_device() -> None:
    seen: list[Any] = []

    def target() -> None:
        _startup()
        cpu_state = torch.get_rng_state()
        torch.cuda.manual_seed(7)
        first = torch.randn(3, device="cuda")
        state = torch.cuda.get_rng_state()
        second = torch.randn(3, device="cuda")
        torch.cuda.set_rng_state(state)
        again = torch.randn(3, device="cuda")
        torch.cuda.manual_seed(7)
        seen.append(torch.equal(first, torch.randn(3, device="cuda")))
        seen.append(torch.equal(second, again))
        seen.append(torch.equal(cpu_state, torch.get_rng_state()))  # CUDA draws leave the CPU generator alone
        torch.cuda.manual_seed_all(3)
        seen.append(torch.cuda.initial_seed())

    cap.capture(target, 1, mode="inline")
    assert seen == [True, True, True, 3]


def test_a_cuda_seed_queued_before_the_capture_never_reaches_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch queues ``torch.cuda.manual_seed`` until CUDA initialises; the stand-in used to make
    ``is_initialized()`` true mid-run, so torch ran that queue against the real driver ("CUDA driver version
    is insufficient"). Now every rank is initialised from its start and the queued callback stays queued."""
    assert not torch.cuda.is_initialized()
    monkeypatch.setattr(torch.cuda, "_lazy_seed_tracker", type(torch.cuda._lazy_seed_tracker)())  # this test's queue
    torch.cuda.manual_seed(11)  # queued: no CUDA here
    assert torch.cuda._lazy_seed_tracker.get_calls()

    def target() -> None:
        _startup()
        torch.cuda.manual_seed(5)
        torch.cuda.get_rng_state()
        torch.randn(2, device="cuda")

    run = cap.capture(target, 2)
    assert run.programs[0].ops[0].name == "init_process_group"
    assert not torch.cuda.is_initialized()  # restored after the capture


def _ddp_startup() -> tuple[Any, Any]:
    _startup()
    model = torch.nn.Linear(1024, 1024).cuda()  # 4 MiB of weights: large-pool segments
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    return ddp, torch.optim.Adam(ddp.parameters())


def _ddp_step(state: tuple[Any, Any]) -> None:
    ddp, optimizer = state
    ddp(torch.randn(64, 1024, device="cuda")).sum().backward()
    optimizer.step()


def test_a_training_step_records_its_collectives_and_tensor_memory_between_startup_and_step1() -> None:
    run = cap.capture(_ddp_startup, 2, step=_ddp_step)
    ops = run.programs[0].ops
    assert run.programs[0] is run.programs[1]
    labels = [op.label for op in ops if isinstance(op, Checkpoint)]
    assert labels == ["after_init", "startup", "step1", "end"]
    startup, step1 = ops.index(Checkpoint("startup")), ops.index(Checkpoint("step1"))
    weights = (1024 * 1024 + 1024) * 4
    # DDP's gradient all-reduce is step 1's: one bucket holding every gradient
    assert [op for op in ops[startup:step1] if isinstance(op, AllReduce)] == [AllReduce(size_bytes=weights)]
    at_startup = sum(op.mib for op in ops[:startup] if isinstance(op, Alloc)) * MIB
    at_step1 = sum(op.mib for op in ops[:step1] if isinstance(op, Alloc)) * MIB
    # reserved >= allocated at every point: the weights and DDP's bucket, then also gradients and Adam's moments
    assert at_startup >= 2 * weights and at_step1 >= 5 * weights and at_step1 > at_startup
    assert all(op.mib % 2 == 0 for op in ops if isinstance(op, Alloc))  # whole allocator segments (2 MiB units)
    outcome = run.simulate()
    assert outcome.verdict == "pass"
    used = {label: snaps["n0:cuda:0"].used_bytes for label, snaps in outcome.checkpoints.items()}
    assert used["step1"] - used["startup"] >= at_step1 - at_startup  # the tensors are charged (and comms)


def test_a_step_receives_what_startup_returned_and_a_memory_check_can_follow_it() -> None:
    def step(state: tuple[Any, Any]) -> None:
        _ddp_step(state)
        cap.memory_check(0.99)

    run = cap.capture(_ddp_startup, 2, step=step)
    outcome = run.simulate(gpu="l4")
    assert outcome.verdict != "pass"  # 99 % of an L4 cannot be free next to a CUDA context and communicators
    assert "Free memory on device" in str(outcome.ranks[0].error)


def test_freed_tensors_stay_reserved_until_empty_cache() -> None:
    seen: list[Any] = []

    def target() -> None:
        _startup()
        big = torch.empty(MIB // 4, device="cuda")  # 1 MiB: the small pool's largest request, in a 2 MiB segment
        cap.checkpoint("big")
        del big
        seen.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), torch.cuda.max_memory_reserved()))
        cap.checkpoint("freed")
        torch.cuda.empty_cache()
        seen.append(torch.cuda.memory_reserved())
        cap.checkpoint("emptied")

    run = cap.capture(target, 1, mode="inline")
    ops = run.programs[0].ops
    assert seen == [(0, 2 * MIB, 2 * MIB), 0]
    big, freed, emptied = (ops.index(Checkpoint(label)) for label in ("big", "freed", "emptied"))
    assert ops[big - 1] == Alloc(mib=2.0, tag=TENSOR_TAG)
    assert not any(isinstance(op, Alloc | Free | EmptyCache) for op in ops[big + 1 : freed])  # reserved, not freed
    assert ops[freed + 1 : emptied] == (EmptyCache(mib=2.0, tag=TENSOR_TAG),)


def test_the_cuda_memory_statistics_answer_as_torchs_allocator_would() -> None:
    seen: list[Any] = []

    def target() -> None:
        _startup()
        small = torch.empty(3, device="cuda")  # 12 bytes: one 512-byte block of a 2 MiB segment
        seen.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))
        free, total = torch.cuda.mem_get_info()
        seen.append(total - free)  # the device sees segments
        large = torch.empty(3 * MIB // 4, device="cuda")  # 3 MiB: a 20 MiB segment
        seen.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))
        del small, large

    cap.capture(target, 1, mode="inline")
    assert seen == [(512, 2 * MIB), 2 * MIB, (512 + 3 * MIB, 22 * MIB)]


def test_a_storage_resized_in_place_frees_its_block_and_takes_a_new_one() -> None:
    """FSDP2's ``free_storage``/``alloc_storage``: ``untyped_storage().resize_(0)`` after use, back before the next."""
    seen: list[Any] = []

    def target() -> None:
        _startup()
        unsharded = torch.empty(3 * MIB // 4, device="cuda")  # 3 MiB, in a 20 MiB segment
        seen.append(torch.cuda.memory_allocated())
        unsharded.untyped_storage().resize_(0)
        seen.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))
        unsharded.untyped_storage().resize_(3 * MIB)
        unsharded.fill_(1.0)  # a parallel op in this process: later forked ranks must not hang
        seen.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), torch.cuda.max_memory_allocated()))

    cap.capture(target, 1, mode="inline")
    assert seen == [3 * MIB, (0, 20 * MIB), (3 * MIB, 20 * MIB, 3 * MIB)]  # the cached block served it again
    assert torch.UntypedStorage.resize_ is not None and torch.empty(4).untyped_storage().resize_(8).nbytes() == 8


def test_tensor_memory_charges_the_reserved_high_water_mark_between_recorded_calls() -> None:
    memory = TensorMemory()
    first, second = torch.empty(1024), torch.empty(3 * MIB // 4)  # 4 KiB (small pool), 3 MiB (large pool)
    memory.place(first.untyped_storage(), 0)
    memory.place(second.untyped_storage(), 0)
    memory.place(first[1:].untyped_storage(), 0)  # a view shares its base's storage: counted once
    del second
    assert memory.live == {0: 4096} and memory.peak == {0: 4096 + 3 * MIB}
    assert memory.reserved == {0: 22 * MIB}  # freed blocks stay reserved
    assert memory.changes() == [Alloc(mib=22.0, tag=TENSOR_TAG)]
    assert memory.changes() == []
    memory.empty_cache()
    assert memory.changes() == [EmptyCache(mib=20.0, tag=TENSOR_TAG)]  # the small segment still holds `first`


def test_memory_reserved_again_after_empty_cache_in_the_same_window_is_charged() -> None:
    memory = TensorMemory()
    big = torch.empty(3 * MIB // 4)
    memory.place(big.untyped_storage(), 0)
    del big
    memory.empty_cache()
    again = torch.empty(3 * MIB // 4)
    memory.place(again.untyped_storage(), 0)
    assert memory.changes() == [
        Alloc(mib=20.0, tag=TENSOR_TAG),
        EmptyCache(mib=20.0, tag=TENSOR_TAG),
        Alloc(mib=20.0, tag=TENSOR_TAG),
    ]
    assert memory.reserved == {0: 20 * MIB}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["place", "drop", "empty", "ask"]), st.integers(1, 5)), max_size=40))
def test_changes_shortcut_answers_as_the_full_computation(steps: list[tuple[str, int]]) -> None:
    fast, full = TensorMemory(), TensorMemory()
    held: list[torch.Tensor] = []
    for action, size in steps:
        if action == "place":
            held.append(torch.empty(size * 256))
            for memory in (fast, full):
                memory.place(held[-1].untyped_storage(), 0)
        elif action == "drop" and held:
            del held[size % len(held)]  # both ledgers see the storage go
        elif action == "empty":
            fast.empty_cache()
            full.empty_cache()
        elif action == "ask":
            assert fast.changes() == full._settle()
    assert fast.changes() == full._settle()


def test_empty_cache_gives_back_only_what_alloc_charged_under_its_tag() -> None:
    ops = [SetDevice(), Alloc(mib=100, tag="t"), Checkpoint("full"), EmptyCache(mib=60, tag="t"), Checkpoint("part")]
    ops += [EmptyCache(mib=500, tag="t"), Checkpoint("none"), EmptyCache(mib=10, tag="other"), Checkpoint("still")]
    outcome = simulate(ops, gpus_per_node=1)
    used = {label: snaps["n0:cuda:0"].used_bytes for label, snaps in outcome.checkpoints.items()}
    assert used["full"] - used["part"] == 60 * MIB
    assert used["part"] - used["none"] == 40 * MIB
    assert used["none"] == used["still"]


def test_device_properties_are_the_capture_gpu_kind_and_unknown_fields_are_refused() -> None:
    seen: list[Any] = []

    def target() -> None:
        _startup()
        props = torch.cuda.get_device_properties(0)
        seen.append((props.name, props.total_memory, torch.cuda.mem_get_info()[1]))

    cap.capture(target, 1, mode="inline", gpu="l4")
    from simnccl.cluster import get_gpu_kind

    l4 = get_gpu_kind("l4")
    assert seen == [(l4.display, l4.total_bytes, l4.total_bytes)]

    def asks_for_sms() -> None:
        _startup()
        torch.cuda.get_device_properties(0).multi_processor_count  # noqa: B018

    with pytest.raises(cap.CaptureError, match="multi_processor_count: not known while capturing without a GPU"):
        cap.capture(asks_for_sms, 1, mode="inline")


def test_a_cuda_call_without_a_stand_in_is_refused_naming_what_is_covered() -> None:
    def target() -> None:
        _startup()
        torch.cuda.CUDAGraph()

    with pytest.raises(cap.CaptureError) as caught:
        cap.capture(target, 1)
    message = str(caught.value)
    assert message.startswith("rank 0: the captured code called CUDA where simnccl's GPU-less CUDA does not stand in")
    assert "CUDA graphs" in message and "torch.cuda.CUDAGraph()" in message


def test_tensors_on_another_device_are_charged_to_the_current_one_and_said_so() -> None:
    kept: list[Any] = []

    def target() -> None:
        _startup()
        kept.append((torch.zeros(4, device="cuda"), torch.zeros(4, device=f"cuda:{1 - dist.get_rank()}")))

    run = cap.capture(target, 2, mode="inline")
    assert "rank 0 placed tensors on cuda:0, cuda:1: all of them are charged to its current device" in run.notes


def test_step_and_gpu_arguments_are_checked() -> None:
    with pytest.raises(cap.CaptureError, match="step: expected a callable"):
        cap.capture(_startup, 1, step=3)  # type: ignore[arg-type]
    with pytest.raises(cap.CaptureError, match="gpu: "):
        cap.capture(_startup, 1, gpu="no-such-gpu")


STEP_SCRIPT = """
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank())
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8).cuda())


def train_step(state):
    state["model"](torch.randn(4, 8, device="cuda")).sum().backward()
"""


def test_cli_step_runs_a_function_on_the_scripts_globals(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(STEP_SCRIPT), encoding="utf-8")
    toml = tmp_path / "captured.toml"
    assert cap.main(["--world", "2", "--step", f"{script}:train_step", "--toml", str(toml), str(script)]) == 0
    text = toml.read_text(encoding="utf-8")
    assert '"step1"' in text and 'op = "alloc"' in text
    assert text.index('"startup"') < text.index('op = "all_reduce"') < text.index('"step1"')
    replayed = load_scenario(toml).programs[0].ops  # the scenario file holds the step's ops exactly
    assert [op for op in replayed if isinstance(op, Alloc)] and Checkpoint("step1") in replayed


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ("nocolon", "--step: expected MODULE:FUNCTION"),
        ("no_such_module_xyz:f", "--step: cannot import 'no_such_module_xyz'"),
        ("json:no_such_function", "--step: 'json' has no function 'no_such_function'"),
        ("missing.py:f", "--step: no such file 'missing.py'"),
    ],
)
def test_cli_bad_step_is_a_clear_message(step: str, message: str, tmp_path: Path, capsys) -> None:
    script = tmp_path / "s.py"
    script.write_text("", encoding="utf-8")
    assert cap.main(["--world", "1", "--step", step, str(script)]) == 2
    assert message in capsys.readouterr().err


def _parallel_work() -> None:
    _startup()
    torch.ones(4 * MIB, device="cuda").mul_(2)  # large enough for torch's intra-op thread pool


def test_forked_ranks_finish_after_this_process_used_torchs_thread_pool() -> None:
    """GNU OpenMP's pool does not survive fork: a parallel op here, then one in a forked rank, used to hang the
    rank until it was killed as "no result within 120 s"."""
    torch.ones(4 * MIB).mul_(2)
    run = cap.capture(_parallel_work, 2)
    assert run.programs[0].ops[0].name == "init_process_group"
