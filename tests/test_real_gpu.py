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


_SHARED_GPU_RANK = r"""
import os, sys, json, torch, torch.distributed as dist
rank, case, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[4], RANK=str(rank), WORLD_SIZE="2")
if case == "legacy":
    os.environ["TORCH_DIST_USE_NCCL2"] = "0"
try:
    if case == "legacy":  # no set_device: the tensor, and so the communicator, is on cuda:0 on both ranks
        dist.init_process_group("nccl")
        dist.all_reduce(torch.ones(1, device="cuda:0"))
    else:  # nccl2: both ranks bound to cuda:0 at init
        dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    result = {"type": None, "message": ""}
except Exception as err:  # what the simulator must match
    result = {"type": type(err).__module__ + "." + type(err).__name__, "message": str(err)}
open(out, "w").write(json.dumps(result))
os._exit(0)
"""


@pytest.mark.parametrize("case", ["legacy", "nccl2"])
def test_two_ranks_on_one_gpu_fail_as_the_simulator_says(case: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """simnccl.engine.shared_gpus: NCCL refuses a communicator with two members on one GPU (one GPU is enough)."""
    import json
    import socket
    import subprocess
    import sys

    from simnccl.engine.shared_gpus import WARN_MULTI_RANK

    script = tmp_path / "rank.py"
    script.write_text(_SHARED_GPU_RANK)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    outs = [tmp_path / f"rank{r}.json" for r in (0, 1)]
    procs = [subprocess.Popen([sys.executable, str(script), str(r), case, str(outs[r]), port]) for r in (0, 1)]
    try:
        for p in procs:
            p.wait(timeout=150)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = [json.loads(o.read_text()) for o in outs]
    for result in results:
        assert WARN_MULTI_RANK in result["message"], result
        expected = "DistBackendError" if case == "legacy" else "RuntimeError"
        assert result["type"].endswith(expected), result
