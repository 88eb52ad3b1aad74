"""``batch_isend_irecv``: every send and recv of the list posted before any is waited on (``BatchIsendIrecv``).

Real gloo's side of these (a ring, a recv smaller than its send, a batch meeting unbatched ops) is checked in
``tests/test_real_gloo_semantics.py``; NCCL's is torch 2.15's documented behaviour: the batch is coalesced on the
group's own communicator, which a lazy group makes at that first use, with every member.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simnccl.ops import (
    Barrier,
    BatchIsendIrecv,
    Checkpoint,
    InitProcessGroup,
    Op,
    Recv,
    Send,
    SetDevice,
)
from simnccl.scenario.load import load_scenario
from simnccl.scenario.model import ScenarioError
from simnccl.testing import simulate

W = 4
BACKENDS = {  # name -> (init_process_group backend, env)
    "gloo": ("gloo", {}),
    "nccl2": ("nccl", {}),
    "legacy": ("nccl", {"TORCH_DIST_USE_NCCL2": "0"}),
    "nccl-lazy": ("nccl-lazy", {}),
}


def _run(per_rank: list[list[Op]], kind: str, *, device_id: bool = False) -> object:
    backend, env = BACKENDS[kind]
    init = InitProcessGroup(backend=backend, device_id=0 if device_id else None)
    programs = [[SetDevice(), init, *ops, Checkpoint(label="end")] for ops in per_rank]
    if device_id:
        programs = [
            [SetDevice(), InitProcessGroup(backend=backend, device_id=r), *p[2:]] for r, p in enumerate(programs)
        ]
    return simulate(programs, nodes=1, gpus_per_node=len(per_rank), env=env)


def _ring(rank: int) -> list[Op]:
    return [BatchIsendIrecv(sends=((rank + 1) % W,), recvs=((rank - 1) % W,))]


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_a_batched_ring_completes_where_blocking_sends_and_recvs_hang(kind: str) -> None:
    batched = _run([_ring(r) for r in range(W)], kind)
    assert batched.verdict == "pass", batched.hangs or batched.errors
    blocking = _run([[Send(peer=(r + 1) % W), Recv(peer=(r - 1) % W)] for r in range(W)], kind)
    assert blocking.verdict == "hang"
    assert {h["rank"] for h in blocking.hangs} == set(range(W))


def test_a_batchs_waits_overlap_its_ops_take_one_exchange_not_one_per_op() -> None:
    one = _run([_ring(r) for r in range(W)], "nccl2")
    both_ways = [
        [BatchIsendIrecv(sends=((r + 1) % W, (r - 1) % W), recvs=((r - 1) % W, (r + 1) % W))] for r in range(W)
    ]
    two = _run(both_ways, "nccl2")
    assert two.verdict == "pass"
    ends = [max(rt.finished_at for rt in out.ranks) for out in (one, two)]
    assert ends[0] == ends[1]


@pytest.mark.parametrize(
    ("kind", "device_id", "verdict"),
    [
        ("legacy", False, "hang"),  # the group's communicator is made at this first use, by every member
        ("legacy", True, "pass"),  # made at init: a subset may batch
        ("nccl2", False, "pass"),
        ("gloo", False, "pass"),
    ],
)
def test_a_first_batch_on_a_lazy_nccl_group_needs_every_member(kind: str, device_id: bool, verdict: str) -> None:
    """torch's docstring: "if this API is the first collective call in the group ..., all ranks of the group must
    participate in this API call"; here ranks 2 and 3 make no call on the group."""
    pair = [[BatchIsendIrecv(sends=(1,), recvs=(1,))], [BatchIsendIrecv(sends=(0,), recvs=(0,))]]
    out = _run([*pair, [], []], kind, device_id=device_id)
    assert out.verdict == verdict, out.hangs or out.errors
    if verdict == "hang":
        assert {h["rank"] for h in out.hangs} == {0, 1}
        assert all("batch_isend_irecv" in h["op"] for h in out.hangs)


@pytest.mark.parametrize(
    ("kind", "verdict"), [("gloo", "pass"), ("nccl2", "pass"), ("legacy", "hang"), ("nccl-lazy", "hang")]
)
def test_a_batched_send_meets_an_unbatched_recv_only_on_one_communicator(kind: str, verdict: str) -> None:
    """Legacy's (lazy) and nccl-lazy's unbatched recv runs on a 2-rank communicator, the batch on the group's."""
    warm = Barrier()  # every member: legacy's group communicator is made here, not by the batch
    out = _run([[warm, BatchIsendIrecv(sends=(1,))], [warm, Recv(peer=0)]], kind)
    assert out.verdict == verdict, out.hangs or out.errors


@pytest.mark.parametrize(
    ("batch", "kind", "error"),
    [
        (BatchIsendIrecv(), "ValueError", None),
        (BatchIsendIrecv(sends=(0,)), "RuntimeError", "Pair is not connected"),  # isend does not check for self
        (BatchIsendIrecv(sends=(1,), recvs=(5,)), "ValueError", "Global rank 5 is not part of group"),
    ],
)
def test_torchs_checks_of_the_list_raise_on_the_rank(batch: BatchIsendIrecv, kind: str, error: str | None) -> None:
    out = _run([[batch], []], "gloo")
    assert out.verdict == "error"
    raised = out.errors[0]
    assert raised["rank"] == 0
    if error is None:
        assert raised["type"] == "IndexError"  # torch reads p2p_op_list[0]
    else:
        assert raised["type"] == kind and error in raised["message"]


def test_a_scenario_step_takes_peers_a_size_and_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def scenario(step: str) -> Path:
        path = tmp_path / "s.toml"
        path.write_text(
            '[scenario]\nname = "b"\n[cluster]\ngpu = "h100-80gb"\nnodes = 1\ngpus_per_node = 2\n'
            '[torch]\nrelease = "2.15"\n'
            '[[workload.steps]]\nop = "init_process_group"\nbackend = "gloo"\n'
            f'[[workload.steps]]\nop = "batch_isend_irecv"\n{step}\n',
            encoding="utf-8",
        )
        return path

    programs = load_scenario(scenario("sends = [1]\nsize_mib = 1\non_ranks = [0]")).programs
    assert programs[0].ops[-1] == BatchIsendIrecv(sends=(1,), size_bytes=2**20)
    assert not isinstance(programs[1].ops[-1], BatchIsendIrecv)
    with pytest.raises(ScenarioError, match=r"sends: expected ranks in 0\.\.1, got 2"):
        load_scenario(scenario("sends = [2]"))
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_PROGRAM_OPS", "10")  # a batch's ops count as a program's
    with pytest.raises(ScenarioError, match="a batch of 11 recvs exceeds the limit max_program_ops = 10"):
        load_scenario(scenario(f"recvs = [{', '.join(['1'] * 11)}]"))


def test_simulate_takes_lists_of_peers_and_bounds_them(monkeypatch: pytest.MonkeyPatch) -> None:
    out = simulate(
        [
            [InitProcessGroup(backend="gloo"), BatchIsendIrecv(sends=[1])],
            [InitProcessGroup(backend="gloo"), Recv(peer=0)],
        ],
        nodes=1,
        gpus_per_node=2,
    )
    assert out.verdict == "pass"
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_PROGRAM_OPS", "10")
    with pytest.raises(ValueError, match="a batch of 11 recvs exceeds the limit max_program_ops = 10"):
        simulate([InitProcessGroup(backend="gloo"), BatchIsendIrecv(recvs=(1,) * 11)], nodes=1, gpus_per_node=2)


def test_each_send_and_recv_may_have_its_own_size_and_its_peer_must_match_it() -> None:
    """A pipeline stage sends activations one way and gradients the other: a size per op (real gloo agrees on
    both outcomes: ``tests/test_real_gloo_semantics.py``, batch-sizes-per-op)."""
    gloo = InitProcessGroup(backend="gloo")
    head = [gloo, BatchIsendIrecv(sends=(1, 2), send_bytes=(1024, 32))]
    matched = simulate(
        [head, [gloo, Recv(peer=0, size_bytes=1024)], [gloo, Recv(peer=0, size_bytes=32)]], gpus_per_node=3
    )
    assert matched.verdict == "pass", matched.errors
    short = simulate(
        [head, [gloo, Recv(peer=0, size_bytes=1024)], [gloo, Recv(peer=0, size_bytes=16)]], gpus_per_node=3
    )
    assert [(e["rank"], e["kind"]) for e in short.errors] == [(2, "abort")]
    with pytest.raises(ValueError, match=r"send_bytes: expected one size per peer of sends \(1\), got 2"):
        BatchIsendIrecv(sends=(1,), send_bytes=(1, 2))


def test_a_scenario_steps_sizes_per_peer_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    head = '[scenario]\nname = "b"\n[cluster]\ngpu = "h100-80gb"\nnodes = 1\ngpus_per_node = 2\n'
    head += '[torch]\nrelease = "2.15"\n'
    step = '[[workload.steps]]\nop = "batch_isend_irecv"\nrecvs = [1]\n'
    path.write_text(head + step + "recv_bytes = [8, 8]\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"recv_bytes: expected one size per peer of recvs \(1\), got 2"):
        load_scenario(path)
    path.write_text(head + step + "recv_bytes = [-1]\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match="recv_bytes"):
        load_scenario(path)
    path.write_text(head + step + "recv_bytes = [8]\n", encoding="utf-8")
    assert load_scenario(path).programs[0].ops[-1] == BatchIsendIrecv(recvs=(1,), recv_bytes=(8,))


@pytest.mark.parametrize(
    "batch",
    [BatchIsendIrecv(sends=(1, 0)), BatchIsendIrecv(sends=(1,), recvs=(0,))],
    ids=["send-to-self", "recv-from-self"],
)
def test_a_batch_op_with_the_rank_itself_fails_after_the_ones_before_it_went_out(batch: BatchIsendIrecv) -> None:
    """Real gloo (``tests/test_real_gloo_semantics.py``): "Pair is not connected" at that op, and rank 1's recv of
    the earlier send completes. The simulator raised torch's unbatched send's ValueError before posting anything,
    and rank 1 hung."""
    out = _run([[batch], [Recv(peer=0)]], "gloo")
    assert [(e["rank"], e["type"]) for e in out.errors] == [(0, "RuntimeError")] and not out.hangs
