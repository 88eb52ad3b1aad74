"""``TORCH_GLOO_LAZY_INIT=1``: a gloo communicator writes its address to the store when its group is made and
connects at first use (ProcessGroupGloo's ``lazyInit``, read with torch's ``getCvarBool``).

Before, the knob was accepted and ignored: a ``new_group`` that one rank never calls and nobody uses hung in the
simulator's eager bootstrap, where real gloo passes (found by a tester). Measured on torch 2.15 CPU (3 ranks,
``/tmp`` experiments, 1 run each, and ``real compare`` below): ``new_group`` returns in 1-7 ms; an unused group a
rank skips passes; a group a rank skips that the others all_reduce on raises ``DistStoreError: wait timeout after
3000ms, keys: /default_pg/0//1//cpu//0/2`` on them at the group's 3 s timeout, from the all_reduce (eager: from
``new_group``); a rank 2 s late to a lazy group is waited for; a send/recv on a group every rank made runs, and
one between two ranks of a group the third never makes runs too (the pair connects alone).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from simnccl.backends.gloo import LAZY_SPLIT_NEVER_CONNECTS
from simnccl.ops import (
    AllReduce,
    Barrier,
    BatchIsendIrecv,
    Compute,
    InitProcessGroup,
    NewGroup,
    Op,
    Recv,
    Send,
    SplitGroup,
)
from simnccl.profiles import gloo_defaults
from simnccl.testing import simulate

GLOO = InitProcessGroup(backend="gloo")
LAZY = {"TORCH_GLOO_LAZY_INIT": "1"}
G3 = NewGroup(ranks=(0, 1, 2), bind="g", timeout_s=3.0)
REDUCE = AllReduce(group="g", size_bytes=16)


def _run(programs: list[list[Op]], env: dict[str, str] | None = LAZY, *, distinct: bool = False):
    if distinct:  # ranks on their own path (no cohort blocks): the same outcome
        programs = [[replace(op) for op in p] for p in programs]
    return simulate(programs, gpus_per_node=0, ranks_per_node=len(programs), env=env or {})


def test_an_unused_lazy_group_a_rank_never_makes_passes() -> None:
    programs = [[GLOO, G3, Barrier()], [GLOO, G3, Barrier()], [GLOO, Barrier()]]
    assert _run(programs).verdict == "pass"
    eager = _run(programs, env=None)
    assert eager.verdict == "hang" and eager.errors[0]["type"] == "torch.distributed.DistStoreError"


@pytest.mark.parametrize("distinct", [False, True])
def test_the_first_use_of_a_lazy_group_a_rank_never_made_raises_the_store_wait(distinct: bool) -> None:
    programs = [[GLOO, G3, REDUCE], [GLOO, G3, REDUCE], [GLOO, Compute(seconds=15.0)]]
    out = _run(programs, distinct=distinct)
    errors = [(e["rank"], e["type"], e["message"], e["op"]) for e in out.errors]
    text = "wait timeout after 3000ms, keys: /default_pg/0//1//cpu//0/2"
    op = "all_reduce(group='g', size_bytes=16)"
    assert errors == [(r, "torch.distributed.DistStoreError", text, op) for r in (0, 1)]
    assert [e["time_s"] for e in out.errors] == [3.0, 3.0]  # the world is lazy too: unused, never connected


def test_a_lazy_group_waits_for_a_late_member_at_first_use() -> None:
    late = [GLOO, Compute(seconds=2.0), G3, REDUCE]
    out = _run([[GLOO, G3, REDUCE], [GLOO, G3, REDUCE], late])
    assert out.verdict == "pass" and out.end_time_s > 2.0


def test_a_lazy_group_is_made_without_waiting() -> None:
    programs = [[GLOO, Compute(seconds=1.0), G3], [GLOO, G3], [GLOO, G3]]
    lazy, eager = _run(programs), _run(programs, env=None)
    assert [rt.finished_at for rt in lazy.ranks] == pytest.approx([1.0, 0.0, 0.0])
    per_peer = gloo_defaults()["gloo_bootstrap_per_peer_s"]
    assert [rt.finished_at for rt in eager.ranks] == pytest.approx([1.0 + 4 * per_peer] * 3)  # world's, then g's


def test_a_send_recv_on_a_lazy_group_every_rank_made_runs() -> None:
    programs = [[GLOO, G3, Send(group="g", peer=1, size_bytes=16)], [GLOO, G3, Recv(group="g", peer=0, size_bytes=16)]]
    assert _run([*programs, [GLOO, G3]]).verdict == "pass"


SEND = Send(group="g", peer=1, size_bytes=16)
RECV = Recv(group="g", peer=0, size_bytes=16)


@pytest.mark.parametrize("distinct", [False, True])
def test_a_send_recv_on_a_lazy_group_a_member_never_made_runs_between_the_pair(distinct: bool) -> None:
    """gloo's lazy context connects a send/recv's pair alone: ranks 0 and 1 of a group of three that rank 2 never
    makes complete (real gloo, 3 ranks; ``real compare`` below). The simulator waited for rank 2's address until
    the timeout (a hang real gloo does not have), with the peer 1 s late too."""
    late = [GLOO, Compute(seconds=1.0), G3, RECV, Send(group="g", peer=0, size_bytes=16)]
    out = _run([[GLOO, G3, SEND, Recv(group="g", peer=1, size_bytes=16)], late, [GLOO]], distinct=distinct)
    assert out.verdict == "pass" and out.end_time_s == pytest.approx(1.0, abs=0.01)


def test_a_batch_on_a_lazy_group_a_member_never_made_runs_between_its_peers() -> None:
    ring = [BatchIsendIrecv(group="g", sends=(peer,), recvs=(peer,), size_bytes=16) for peer in (1, 0)]
    assert _run([[GLOO, G3, ring[0]], [GLOO, G3, ring[1]], [GLOO]]).verdict == "pass"


def test_a_send_to_a_peer_that_never_made_the_lazy_group_waits_for_its_address() -> None:
    out = _run([[GLOO, G3, SEND], [GLOO], [GLOO, G3]])
    assert out.verdict == "hang"
    assert [(e["rank"], e["type"], e["time_s"]) for e in out.errors] == [(0, "torch.distributed.DistStoreError", 3.0)]


def test_a_collective_after_a_lazy_pairs_send_recv_still_waits_for_every_member() -> None:
    programs = [[GLOO, G3, SEND, REDUCE], [GLOO, G3, RECV, REDUCE], [GLOO, Compute(seconds=10.0)]]
    out = _run(programs)
    assert out.verdict == "hang" and sorted(e["rank"] for e in out.errors) == [0, 1]
    assert all(e["op"] == "all_reduce(group='g', size_bytes=16)" for e in out.errors)


SPLIT = SplitGroup(split_ranks=((0, 1, 2),), bind="s", timeout_s=3.0)


def test_a_split_group_child_returns_at_once_and_never_connects() -> None:
    """Measured on torch 2.15 gloo (``real compare`` below): under the knob, ``split_group`` returns at once and
    the child's first all_reduce or send/recv times out on every member. The simulator raised "does not
    support splitting" at the split (the lazy parent was not connected yet), which real gloo never says; gloo
    always supports splitting (found by a tester)."""
    used = _run([[GLOO, SPLIT, AllReduce(group="s", size_bytes=16)]] * 3)
    assert used.verdict == "hang" and sorted(h["rank"] for h in used.hangs) == [0, 1, 2]
    assert all(h["op"] == "all_reduce(group='s', size_bytes=16)" for h in used.hangs)
    assert LAZY_SPLIT_NEVER_CONNECTS in used.hangs[0]["explanation"]
    unused = _run([[GLOO, SPLIT, Compute(seconds=1.0)], [GLOO, SPLIT], [GLOO]])
    assert unused.verdict == "pass" and [rt.finished_at for rt in unused.ranks] == pytest.approx([1.0, 0.0, 0.0])
    assert _run([[GLOO, SPLIT, AllReduce(group="s", size_bytes=16)]] * 3, env=None).verdict == "pass"


@pytest.mark.parametrize("value", ["1", "true", "YES", "t", "y"])
def test_torchs_true_values_make_gloo_lazy(value: str) -> None:
    programs = [[GLOO, G3, Barrier()], [GLOO, G3, Barrier()], [GLOO, Barrier()]]
    assert _run(programs, env={"TORCH_GLOO_LAZY_INIT": value}).verdict == "pass"
    assert _run(programs, env={"TORCH_GLOO_LAZY_INIT": value.replace("1", "0")[:0] or "0"}).verdict == "hang"


def test_a_value_torch_cannot_read_is_refused() -> None:
    with pytest.raises(ValueError, match=r"TORCH_GLOO_LAZY_INIT: expected one of y, yes, 1, t, true, n, no, 0"):
        _run([[GLOO]] * 2, env={"TORCH_GLOO_LAZY_INIT": "maybe"})


# Three ranks on one node without GPUs, torch 2.15: the head of both scenarios below.
_CLUSTER = """\
[cluster]
gpu = "h100-80gb"
nodes = 1
gpus_per_node = 0
ranks_per_node = 3
[torch]
release = "2.15"
"""
SCENARIO = (
    """\
[scenario]
name = "gloo-lazy"
"""
    + _CLUSTER
    + """[workload]
steps = [
  { op = "init_process_group", backend = "gloo" },
  { op = "new_group", ranks = [0, 1, 2], bind = "g", timeout_s = 3, on_ranks = [0, 1] },
  { op = "new_group", ranks = [0, 1], bind = "p", timeout_s = 3 },
  { op = "send", group = "p", peer = 1, size_bytes = 64, on_ranks = [0] },
  { op = "recv", group = "p", peer = 0, size_bytes = 64, on_ranks = [1] },
  { op = "barrier" },
]
[[variants]]
name = "lazy"
env = { TORCH_GLOO_LAZY_INIT = "1" }
[[variants]]
name = "eager"
"""
)


def _lazy_scenario(name: str, *steps: str) -> str:
    """A scenario of the three ranks under ``TORCH_GLOO_LAZY_INIT=1``, its default group gloo, then ``steps``."""
    lines = ['  { op = "init_process_group", backend = "gloo" },', *(f"  {step}," for step in steps)]
    head = f'[scenario]\nname = "{name}"\n{_CLUSTER}env = {{ TORCH_GLOO_LAZY_INIT = "1" }}\n'
    return head + "[workload]\nsteps = [\n" + "\n".join(lines) + "\n]\n"


# A send/recv pair of a lazy group of three that rank 2 never makes, rank 1 a second late.
PAIR_SCENARIO = _lazy_scenario(
    "gloo-lazy-pair",
    '{ op = "compute", seconds = 1.0, on_ranks = [1] }',
    '{ op = "new_group", ranks = [0, 1, 2], bind = "g", timeout_s = 4, on_ranks = [0, 1] }',
    '{ op = "send", group = "g", peer = 1, size_bytes = 64, on_ranks = [0] }',
    '{ op = "recv", group = "g", peer = 0, size_bytes = 64, on_ranks = [1] }',
    '{ op = "batch_isend_irecv", group = "g", sends = [1], recvs = [1], size_bytes = 64, on_ranks = [0] }',
    '{ op = "batch_isend_irecv", group = "g", sends = [0], recvs = [0], size_bytes = 64, on_ranks = [1] }',
)
# A split of the world by every rank, then an all_reduce on the child.
SPLIT_SCENARIO = _lazy_scenario(
    "gloo-lazy-split",
    '{ op = "split_group", split_ranks = [[0, 1, 2]], bind = "s", timeout_s = 3 }',
    '{ op = "all_reduce", group = "s", size_bytes = 64 }',
)


@pytest.mark.real
@pytest.mark.parametrize(
    ("text", "agreed"),
    [
        (
            SCENARIO,
            ["gloo-lazy  lazy  agree  ok  sim pass | real pass", "gloo-lazy  eager  agree  ok  sim hang | real hang"],
        ),
        (PAIR_SCENARIO, ["gloo-lazy-pair  default  agree  ok  sim pass | real pass"]),
        (SPLIT_SCENARIO, ["gloo-lazy-split  default  agree  ok  sim hang | real hang"]),
    ],
    ids=["lazy-and-eager", "lazy-pair", "lazy-split"],
)
def test_real_gloo_agrees_lazy_and_eager(tmp_path: Path, text: str, agreed: list[str]) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "gloo-lazy.toml"
    path.write_text(text, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "simnccl", "real", "compare", str(path), "--compute-scale", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for line in agreed:
        assert line in done.stdout, done.stdout
