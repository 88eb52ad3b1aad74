"""The fact ``simnccl.engine.store_collisions`` models, on real torch 2.15 gloo, data included.

Two groups of one size bootstrapped under one store name whose members' group ranks differ write each
group-rank key once, and gloo connects the writers. The differential harness cannot show what that does (its
tensors are ones, and nothing raises), so this test runs its own program: each rank's tensor holds its rank, and
every op on a rank's own group returns another group's data. The simulator stops a rank at such an op
(``tests/test_gloo_semantics.py``); this is why it must.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import communicate_or_kill

pytest.importorskip("torch")

pytestmark = pytest.mark.real

# Ranks 0, 2 and 3 make a local-synchronization group, so their group counter runs one ahead of rank 1's; rank 0
# then makes [1, 3] before [0, 2], ranks 1 to 3 [0, 2] before [1, 3]. Name '2': rank 1 as group rank 0 of
# [1, 3], rank 2 as group rank 1 of [0, 2]; name '3': rank 0 as group rank 0 of [0, 2], rank 3 as group rank 1 of
# [1, 3]. Each rank prints what an all_reduce, a broadcast from group rank 0 and a send/recv give it.
PROGRAM = """
import json, sys
from datetime import timedelta
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, store):
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=4, timeout=timedelta(seconds=20)
    )
    if rank != 1:
        dist.new_group([0, 2, 3], use_local_synchronization=True)
    order = ([1, 3], [0, 2]) if rank == 0 else ([0, 2], [1, 3])
    mine = None
    for ranks in order:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = (group, ranks)
    group, ranks = mine
    seen = {"rank": rank, "group": ranks, "name": dist.distributed_c10d._get_process_group_name(group)}
    value = torch.tensor([float(rank)])
    dist.all_reduce(value, group=group)
    seen["all_reduce"] = value.item()
    value = torch.tensor([float(rank)])
    dist.broadcast(value, src=ranks[0], group=group)
    seen["broadcast"] = value.item()
    value = torch.tensor([float(rank)])
    if rank == ranks[0]:
        dist.send(value, dst=ranks[1], group=group)
    else:
        dist.recv(value, src=ranks[0], group=group)
        seen["recv"] = value.item()
    with open(f"{store}.seen{rank}", "w") as out:  # a file per rank: four processes' prints can interleave
        out.write(json.dumps(seen))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(sys.argv[1],), nprocs=4)
"""


def test_two_groups_joined_by_group_rank_exchange_each_other_s_data(tmp_path: Path) -> None:
    script = tmp_path / "cross_wired.py"
    script.write_text(PROGRAM)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "store")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # mp.spawn's workers are in its session: the finally reaps them all
    )
    try:
        out, err = communicate_or_kill(proc, 120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    found = sorted(tmp_path.glob("store.seen*"))
    assert len(found) == 4, out + err[-3000:]
    seen = {s["rank"]: s for s in (json.loads(path.read_text()) for path in found)}
    assert sorted(seen) == [0, 1, 2, 3], out + err[-3000:]
    assert {r: (s["name"], s["group"]) for r, s in seen.items()} == {
        0: ("3", [0, 2]),
        1: ("2", [1, 3]),
        2: ("2", [0, 2]),
        3: ("3", [1, 3]),
    }
    # every rank's group sums 0 + 2 or 1 + 3 = 2 or 4 if wired as meant; gloo connected 1 with 2 and 0 with 3
    assert {r: s["all_reduce"] for r, s in seen.items()} == {0: 3.0, 1: 3.0, 2: 3.0, 3: 3.0}
    # a broadcast from each group's rank 0 (0 for [0, 2], 1 for [1, 3]): rank 2 gets rank 1's, rank 3 rank 0's
    assert {r: s["broadcast"] for r, s in seen.items()} == {0: 0.0, 1: 1.0, 2: 1.0, 3: 0.0}
    # rank 2's recv from "rank 0" gets rank 1's message; rank 3's from "rank 1" gets rank 0's
    assert {r: s["recv"] for r, s in seen.items() if "recv" in s} == {2: 1.0, 3: 0.0}
