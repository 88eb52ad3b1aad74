"""The GPU lane (NCCL on CUDA devices). Skipped, before any process group exists, when no CUDA device is visible."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from simnccl.real.lanes import NO_CUDA, LaneError, check_gpu_lane, visible_gpus

GPUS = visible_gpus()
pytestmark = [pytest.mark.gpu, pytest.mark.real, pytest.mark.skipif(GPUS == 0, reason=NO_CUDA)]


def test_single_rank_nccl2_group_memory_is_measured() -> None:
    from simnccl.ops import AllReduce, Checkpoint, InitProcessGroup, NewGroup, Program, SetDevice
    from simnccl.real.launch import Launcher, RunSettings

    program = Program(
        (
            SetDevice(),
            Checkpoint(label="context"),
            InitProcessGroup(backend="nccl", device_id=0),
            Checkpoint(label="init"),
            NewGroup(ranks=(0,), bind="one"),
            Checkpoint(label="group"),
            AllReduce(group="one"),
            Checkpoint(label="end"),
        )
    )
    with Launcher() as launcher:
        result = launcher.run_programs([program], RunSettings.for_lane("gpu", timeout_s=180.0), name="gpu")
    assert result["verdict"] == "pass", result["errors"]
    used = {c["name"]: c["devices"][0] for c in result["checkpoints"]}
    assert used["context"]["used_mib"] > 0, "a CUDA context costs device memory"
    assert used["init"]["used_mib"] > used["context"]["used_mib"], "nccl2 creates the world communicator eagerly"
    assert used["end"]["non_torch_mib"] > 0


def test_more_ranks_than_gpus_are_refused() -> None:
    with pytest.raises(LaneError, match="one GPU per rank"):
        check_gpu_lane(GPUS + 1)
