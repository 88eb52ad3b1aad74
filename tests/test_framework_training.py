"""The pinned frameworks' real startups with their CUDA seeding, and a first training step, captured and simulated.

Issue 12's acceptance: Megatron-Core's ``model_parallel_cuda_manual_seed`` and a tiny GPT step, torchtitan's
default ``set_determinism(seed=None)``, and ``deepspeed.initialize`` with ZeRO-2 — each used to fail with a
CUDA driver error while capturing. The code is in ``tests/framework_training.py``; the frameworks are the
ones ``.ci/frameworks-requirements.txt`` pins (skipped, saying why, when they are not installed).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))

import framework_startups as startups
import framework_training as training
from test_framework_fidelity import _require, deepspeed, megatron, torchtitan  # noqa: F401 - fixtures

from simnccl import capture as cap
from simnccl.ops import MIB, AllGather, Alloc, AllReduce, Broadcast, Checkpoint, Op, ReduceScatter

pytestmark = pytest.mark.torch


def _between(ops: Sequence[Op], first: str, last: str) -> Sequence[Op]:
    return ops[ops.index(Checkpoint(first)) + 1 : ops.index(Checkpoint(last))]


def _tensor_mib(ops: Sequence[Op]) -> float:
    return sum(op.mib for op in ops if isinstance(op, Alloc))


def _used_mib(outcome: object, label: str) -> float:
    snapshots = outcome.checkpoints[label]  # type: ignore[attr-defined]
    return max(s.used_bytes for s in snapshots.values()) / MIB


@pytest.fixture(scope="module")
def megatron_gpt(megatron: None) -> None:  # noqa: F811 - the fixture above, extended
    _require("megatron-core", "megatron.core.models.gpt", "megatron.core.optimizer", "megatron.core.distributed")


def test_megatron_cuda_seeding_and_a_gpt_training_step_capture_and_simulate(megatron_gpt: None) -> None:
    run = cap.capture(training.megatron_gpt_startup, 2, step=training.megatron_gpt_step)
    ops = run.programs[0].ops
    step = _between(ops, "startup", "step1")
    # the tensor-parallel all-reduces of the forward and backward, the distributed optimizer's gather
    assert sum(isinstance(op, AllReduce) and op.group.startswith("TENSOR_MODEL_PARALLEL_GROUP") for op in step) >= 4
    assert any(isinstance(op, AllGather) for op in step)
    # the tiny GPT's weights, buffers and optimizer state reserve a 2 MiB segment at startup; the step's tensors
    # are served from what the caching allocator holds (whole segments only, never bytes)
    assert _tensor_mib(ops[: ops.index(Checkpoint("startup"))]) >= 2
    assert all(op.mib % 2 == 0 for op in ops if isinstance(op, Alloc))
    outcome = run.simulate()
    assert outcome.verdict == "pass"
    assert _used_mib(outcome, "step1") >= _used_mib(outcome, "startup")


def test_megatron_under_lazy_init_pays_for_its_communicators_in_step_one(megatron_gpt: None) -> None:
    eager_run = cap.capture(training.megatron_gpt_startup, 2, step=training.megatron_gpt_step)
    with pytest.raises(cap.BranchMismatch, match="lazy_init"):  # one capture per variant: see README
        eager_run.simulate(policy="lazy-init")
    eager = eager_run.simulate()
    run = cap.capture(training.megatron_gpt_startup, 2, step=training.megatron_gpt_step, policy="lazy-init")
    lazy = run.simulate(policy="lazy-init")
    assert eager.verdict == lazy.verdict == "pass"
    assert _used_mib(lazy, "startup") < _used_mib(eager, "startup")
    assert _used_mib(lazy, "step1") > _used_mib(lazy, "startup")  # the first use is step 1's


def test_torchtitan_default_seeding_and_an_fsdp2_step_capture_and_simulate(torchtitan: None) -> None:  # noqa: F811
    run = cap.capture(training.torchtitan_trainer_startup, 2, step=training.torchtitan_trainer_step)
    ops = run.programs[0].ops
    startup = ops[: ops.index(Checkpoint("startup"))]
    # set_determinism(seed=None): rank 0's 8-byte CPU seed, broadcast as a CUDA tensor
    assert Broadcast(size_bytes=8, dtype="Byte", src=0) in startup
    step = _between(ops, "startup", "step1")
    assert any(isinstance(op, AllGather) for op in step) and any(isinstance(op, ReduceScatter) for op in step)
    assert run.simulate().verdict == "pass"


def test_deepspeed_initialize_with_zero2_and_a_step_capture_and_simulate(deepspeed: None) -> None:  # noqa: F811
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    with startups.deepspeed_on_cuda():
        run = cap.capture(training.deepspeed_zero2_startup, 2, step=training.deepspeed_zero2_step)
    ops = run.programs[0].ops
    step = _between(ops, "startup", "step1")
    assert any(isinstance(op, AllReduce) for op in step) and any(isinstance(op, AllGather) for op in step)
    # ZeRO-2's contiguous gradient bucket: reduce_bucket_size fp32 elements, on the device, in step 1
    bucket_mib = DeepSpeedZeroConfig().reduce_bucket_size * 4 / MIB
    assert _tensor_mib(step) >= bucket_mib
    outcome = run.simulate()
    assert outcome.verdict == "pass"
    assert _used_mib(outcome, "step1") - _used_mib(outcome, "startup") >= bucket_mib
