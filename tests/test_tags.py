"""Group tags (``simnccl.tags``): production code says what a group is for in plain torch, with or without
simnccl's ``apply()``; the policy sees the tags under ``apply()``. Real torch in a subprocess (one gloo rank)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from simnccl.tags import current_tags, group_tags


def test_group_tags_nest_and_restore() -> None:
    assert current_tags() == (None, None)
    with group_tags(purpose="pp", traffic="p2p"):
        assert current_tags() == ("pp", "p2p")
        with group_tags(purpose="tp"):
            assert current_tags() == ("tp", None)
        assert current_tags() == ("pp", "p2p")
    assert current_tags() == (None, None)


def test_group_tags_reject_unknown_traffic() -> None:
    with pytest.raises(ValueError, match="traffic='p2pp'"), group_tags(traffic="p2pp"):
        pass
    assert current_tags() == (None, None)


PROBE = textwrap.dedent(
    """
    import json, os, sys, tempfile
    from dataclasses import dataclass
    import torch.distributed as dist
    import simnccl.tags as tags
    from simnccl.policy import BasePolicy

    SEEN = []

    @dataclass(frozen=True)
    class Recording(BasePolicy):
        name: str = "recording"

        def on_group(self, request, decision):
            SEEN.append([request.purpose, request.traffic])
            return decision

    out = {}
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    # Without apply(): torch's own new_group; the tags never reach it.
    with tags.group_tags(purpose="tp", traffic="collectives"):
        out["plain_block"] = dist.new_group([0]) is not None
    out["plain_call"] = tags.new_group([0], purpose="pp", traffic="p2p") is not None
    try:
        dist.new_group([0], purpose="tp")
        out["torch_rejects_kwargs"] = False
    except TypeError:
        out["torch_rejects_kwargs"] = True
    # Under apply(): the policy sees the tags, from the block, from simnccl.tags.new_group, and as kwargs.
    from simnccl.torch_apply import apply

    with apply(Recording()):
        with tags.group_tags(purpose="tp", traffic="collectives"):
            dist.new_group([0])
        tags.new_group([0], purpose="pp", traffic="p2p")
        dist.new_group([0], purpose="dp")
        dist.new_group([0])
    out["seen"] = SEEN
    dist.destroy_process_group()
    print(json.dumps(out))
    """
)


@pytest.mark.torch
def test_tags_work_with_and_without_apply() -> None:
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["plain_block"] and out["plain_call"]
    assert out["torch_rejects_kwargs"]  # why the tags travel beside the call: plain torch takes no purpose=
    assert out["seen"] == [["tp", "collectives"], ["pp", "p2p"], ["dp", None], [None, None]]
