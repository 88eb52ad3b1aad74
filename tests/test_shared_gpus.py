"""Two members of one NCCL communicator on one GPU fail its init (simnccl.engine.shared_gpus).

Before: a program that never set a device ran every rank's legacy communicator on ``cuda:0``, charged both ranks
there and passed; NCCL refuses that communicator (torchrec#4666's "Duplicate GPU detected", NCCL 2.30's "Multiple
Ranks are using the same GPU/Partition").
"""

from __future__ import annotations

import pytest

from simnccl.engine.shared_gpus import WARN_DUPLICATE, WARN_MULTI_RANK, SharedGpus, knob_enabled
from simnccl.ops import AllReduce, Barrier, InitProcessGroup, NewGroup, Recv, Send, SetDevice
from simnccl.release import Impl
from simnccl.testing import simulate

LEGACY = {"TORCH_DIST_USE_NCCL2": "0"}


def _errors(out):  # type: ignore[no-untyped-def]
    return {e["rank"]: e for e in out.errors}


def test_legacy_without_set_device_fails_at_the_first_collective_on_every_rank() -> None:
    out = simulate([InitProcessGroup(backend="nccl"), AllReduce()], gpus_per_node=2, env=LEGACY)
    errors = _errors(out)
    assert out.verdict == "error" and set(errors) == {0, 1}
    for error in errors.values():
        assert error["type"] == "torch.distributed.DistBackendError"
        assert error["op"] == "all_reduce()"
        assert "invalid usage" in error["message"] and WARN_MULTI_RANK in error["message"]
        assert "NCCL version 2.30.7" in error["message"]
    # Nothing of the refused communicator is charged: NCCL checks before it allocates.
    owners = {o.group for o in out.ledgers["n0:cuda:0"].by_owner if o.kind == "comm"}
    assert owners == set()


def test_each_rank_on_its_own_gpu_still_passes() -> None:
    out = simulate([SetDevice(), InitProcessGroup(backend="nccl"), AllReduce()], gpus_per_node=2, env=LEGACY)
    assert out.verdict == "pass"


def test_a_device_bound_on_every_rank_to_gpu_0_fails_nccl2s_eager_init() -> None:
    program = [InitProcessGroup(backend="nccl", device_id=0), AllReduce()]
    out = simulate(program, gpus_per_node=2)
    errors = _errors(out)
    assert set(errors) == {0, 1}
    for error in errors.values():
        assert error["type"] == "RuntimeError"
        assert error["op"].startswith("init_process_group(")
        assert error["message"].startswith("Failed to initialize NCCL communicator: invalid usage")
        assert WARN_MULTI_RANK in error["message"]


def test_nccl_multi_rank_gpu_enable_lets_them_share() -> None:
    env = {**LEGACY, "NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    out = simulate([InitProcessGroup(backend="nccl"), AllReduce()], gpus_per_node=2, env=env)
    assert out.verdict == "pass"
    assert out.ledgers["n0:cuda:1"].used_bytes == 0  # both ranks' communicators are on cuda:0


def test_ranks_on_gpu_0_of_two_nodes_do_not_share_a_gpu() -> None:
    program = [InitProcessGroup(backend="nccl", device_id=0), AllReduce()]
    out = simulate(program, nodes=2, gpus_per_node=1)
    assert out.verdict == "pass"


def test_four_ranks_on_two_gpus_fail_the_world_communicator_at_init() -> None:
    # Four ranks on two GPUs (two processes per GPU): torch 2.15's nccl2 binds LOCAL_RANK % 2, so ranks 0 and 2
    # share cuda:0. The world communicator already holds both, so it fails at init.
    out = simulate(
        [InitProcessGroup(backend="nccl"), NewGroup(ranks=(0, 1), bind="g")], gpus_per_node=2, ranks_per_node=4
    )
    assert set(_errors(out)) == {0, 1, 2, 3}
    assert all(e["op"].startswith("init_process_group(") for e in out.errors)


def test_legacy_send_and_recv_on_one_gpu_fail_their_pair_communicator() -> None:
    programs = [
        [InitProcessGroup(backend="nccl"), Send(peer=1)],
        [InitProcessGroup(backend="nccl"), Recv(peer=0)],
    ]
    out = simulate(programs, gpus_per_node=2, env=LEGACY)
    errors = _errors(out)
    assert set(errors) == {0, 1}
    assert errors[0]["op"].startswith("send(") and errors[1]["op"].startswith("recv(")
    assert all(WARN_MULTI_RANK in e["message"] for e in errors.values())


@pytest.mark.parametrize("env", [LEGACY, {}], ids=["legacy", "nccl2"])
def test_a_barrier_without_a_device_uses_torchs_device_not_gpu_0(env: dict[str, str]) -> None:
    """torch 2.15's barrier: a bound device (nccl2 always binds), else legacy's guess, global rank mod the
    device count (its docstring's rule 4), never the current device: each rank gets a GPU of its own."""
    out = simulate([InitProcessGroup(backend="nccl"), Barrier()], gpus_per_node=2, env=env, keep_trace=True)
    assert out.verdict == "pass"
    contexts = {(e[1], e[3]) for e in out.trace if len(e) > 3 and e[2] == "context"}
    assert contexts == {(0, "n0:cuda:0"), (1, "n0:cuda:1")}


def test_the_check_looks_at_no_member_list_while_every_rank_has_a_gpu_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[int] = []
    failure = SharedGpus.failure

    def counted(self, rank, *args):  # type: ignore[no-untyped-def]
        asked.append(rank)
        return failure(self, rank, *args)

    monkeypatch.setattr(SharedGpus, "failure", counted)
    program = [SetDevice(), InitProcessGroup(backend="nccl"), NewGroup(ranks=(0, 1), bind="g"), AllReduce(group="g")]
    assert simulate(program, gpus_per_node=4, env=LEGACY).verdict == "pass"
    assert asked == []
    out = simulate([SetDevice(device=0), *program[1:]], gpus_per_node=4, env=LEGACY)
    assert out.verdict == "error" and sorted(asked) == [0, 1]  # the members of g; legacy never inits the world here


# ---------------------------------------------------------------------------------------- NCCL's rule by version


def test_before_2_30_3_a_member_names_itself_and_the_first_member_on_its_gpu() -> None:
    check = SharedGpus("2.28.9")
    devices = {10: "n0:cuda:0", 11: "n0:cuda:1", 12: "n0:cuda:0"}
    members = (10, 11, 12)
    error = check.failure(12, members, devices, {}, Impl.LEGACY)
    assert error is not None
    assert error.type_name == "torch.distributed.DistBackendError"
    assert WARN_DUPLICATE.format(rank=2, other=0, device="n0:cuda:0") in error.message
    assert "NCCL version 2.28.9" in error.message
    first = check.failure(10, members, devices, {}, Impl.NCCL2)
    assert first is not None and "rank 0 and rank 2" in first.message
    # A member on a GPU of its own passes the check (it waits for the others later); the knob did not exist.
    assert check.failure(11, members, devices, {}, Impl.LEGACY) is None
    assert check.failure(10, members, devices, {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}, Impl.LEGACY) is not None


def test_from_2_30_3_every_member_fails_unless_the_knob_is_set() -> None:
    check = SharedGpus("2.30.7")
    devices = {0: "n0:cuda:0", 1: "n0:cuda:1", 2: "n0:cuda:0"}
    for rank in (0, 1, 2):
        error = check.failure(rank, (0, 1, 2), devices, {}, Impl.NCCL_LAZY)
        assert error is not None and WARN_MULTI_RANK in error.message
    assert check.failure(1, (0, 1, 2), devices, {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}, Impl.LEGACY) is None
    assert check.failure(1, (0, 1, 2), {0: "n0:cuda:0", 1: "n0:cuda:1"}, {}, Impl.LEGACY) is None
    assert SharedGpus("not a version").knob_era  # a profile's free-text version: the NCCL torch 2.15 ships


@pytest.mark.parametrize(("raw", "enabled"), [("1", True), ("0", False), ("2", True), ("0x1", True), (" 1 ", True)])
def test_the_knob_is_read_as_nccl_reads_an_integer_parameter(raw: str, enabled: bool) -> None:
    assert knob_enabled({"NCCL_MULTI_RANK_GPU_ENABLE": raw}) is enabled
    assert knob_enabled({}) is False
