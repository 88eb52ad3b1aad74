"""Collect torch.distributed facts from the installed torch, for ``tests/test_torch_probes.py``.

Run only in a fresh interpreter (``TORCH_DIST_USE_NCCL2`` is read once per process, at the first use of
``"nccl"``), with ``CUDA_VISIBLE_DEVICES=""``. Imports torch only, never simnccl: the comparison with the
release model happens in the test process. Prints one line ``PROBE_JSON: {...}`` on stdout.

Modes (first argument):

* ``resolve <store-dir>``: which creator torch registers for each NCCL-family name, under the environment
  as given, and the error ``init_process_group("nccl")`` raises on this CUDA-less host.
* ``full <store-dir> <spec-json>``: ``resolve`` plus no-CUDA errors for several backend strings, that gloo
  works, default timeouts, ``BackendConfig`` maps and ``device_id`` validation texts. ``spec-json`` names
  the backend strings to probe (``{"timeouts": [...], "configs": [...], "init": [...]}``).
* ``groups <store-file> <rank> <world-size>``: group naming, non-member results and ``new_group`` argument
  errors in a gloo world (run once per rank, concurrently).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

NCCL_NAMES = ("nccl", "nccl2", "nccl-legacy", "nccl-lazy")
TIMEOUT = timedelta(seconds=30)


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


def _creators() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in NCCL_NAMES:
        c10d.Backend._ensure_backend_registered(name)
        plugin = c10d.Backend._plugins.get(name.upper())
        out[name] = None if plugin is None else plugin.creator_fn.__name__
    return out


def _try_init(backend: str | None, store_dir: str, tag: str, **kwargs: object) -> dict[str, object]:
    """Init a world of 1 with ``backend``; report the error, or the group's facts and destroy it."""
    store = dist.FileStore(os.path.join(store_dir, f"store-{tag}"), 1)
    try:
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=TIMEOUT, **kwargs)
    except Exception as exc:
        return {"ok": False, **_error(exc)}
    try:
        pg = dist.group.WORLD
        return {
            "ok": True,
            "backend": dist.get_backend(),
            "group_name": pg.group_name,
            "backend_config": str(c10d._world.pg_backend_config[pg]),
            "device_types": [d.type for d in pg._device_types],
            "bound_device_id": None if pg.bound_device_id is None else str(pg.bound_device_id),
        }
    finally:
        dist.destroy_process_group()


def resolve(store_dir: str) -> dict[str, object]:
    facts: dict[str, object] = {"env": os.environ.get("TORCH_DIST_USE_NCCL2")}
    facts["creators"] = _creators()
    facts["nccl_self_recording"] = "nccl" in c10d._FR_SELF_RECORDING_BACKENDS
    # TORCH_DIST_USE_NCCL2 is read once: flipping it now must not change "nccl".
    os.environ["TORCH_DIST_USE_NCCL2"] = "1" if facts["env"] == "0" else "0"
    c10d.BackendConfig("nccl")
    facts["nccl_creator_after_env_flip"] = c10d.Backend._plugins["NCCL"].creator_fn.__name__
    facts["init_errors"] = {"nccl": _try_init("nccl", store_dir, "nccl")}
    return facts


def full(store_dir: str, spec: dict[str, list[str]]) -> dict[str, object]:
    facts = resolve(store_dir)
    del os.environ["TORCH_DIST_USE_NCCL2"]  # resolve() flipped it; "nccl" is already registered
    errors = facts["init_errors"]
    for i, backend in enumerate(spec["init"]):
        errors[str(backend)] = _try_init(backend, store_dir, f"init{i}")  # null: no backend argument
    facts["cuda"] = {
        "device_count": torch.cuda.device_count(),
        "compile_accelerator": str(torch.accelerator.current_accelerator()),
        "available_accelerator": str(torch.accelerator.current_accelerator(check_available=True)),
    }
    facts["timeouts"] = {name: c10d._get_default_timeout(name).total_seconds() for name in spec["timeouts"]}
    configs: dict[str, object] = {}
    for name in spec["configs"]:
        if name == "fake":
            importlib.import_module("torch.testing._internal.distributed.fake_pg")  # registers "fake"
        try:
            configs[name] = dict(c10d.BackendConfig(name).device_backend_map)
        except Exception as exc:
            configs[name] = _error(exc)
    facts["backend_config"] = configs
    # "undefined" depends on the host: replay it as BackendConfig sees a CUDA host.
    real = torch.accelerator.current_accelerator
    torch.accelerator.current_accelerator = lambda check_available=False: torch.device("cuda")
    try:
        facts["backend_config_undefined_cuda_host"] = dict(c10d.BackendConfig("undefined").device_backend_map)
    finally:
        torch.accelerator.current_accelerator = real
    facts["device_id_errors"] = {
        "int": _try_init("gloo", store_dir, "devint", device_id=0),
        "cuda:3": _try_init("gloo", store_dir, "devcuda3", device_id=torch.device("cuda", 3)),
        "cuda": _try_init("gloo", store_dir, "devcuda", device_id=torch.device("cuda")),
        "cpu:0": _try_init("gloo", store_dir, "devcpu0", device_id=torch.device("cpu", 0)),
    }
    return facts


def _group_fact(result: object, count_before: int, ranks: list[int] | None, local: bool, api: str) -> dict:
    member = result != dist.GroupMember.NON_GROUP_MEMBER
    return {
        "api": api,
        "ranks": ranks,
        "use_local_synchronization": local,
        "count_before": count_before,
        "count_after": c10d._world.group_count,
        "member": member,
        "result": result.group_name if member else result,
        "name_via_helper": c10d._get_process_group_name(result) if member else None,
    }


def groups(store_file: str, rank: int, world_size: int) -> dict[str, object]:
    store = dist.FileStore(store_file, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=TIMEOUT)
    facts: dict[str, object] = {
        "rank": rank,
        "world_name": dist.group.WORLD.group_name,
        "non_group_member": dist.GroupMember.NON_GROUP_MEMBER,
    }
    steps: list[dict] = []
    handles: dict[str, object] = {}

    def step(key: str, ranks: list[int] | None, local: bool = False) -> None:
        before = c10d._world.group_count
        g = dist.new_group(ranks, timeout=TIMEOUT, use_local_synchronization=local)
        handles[key] = g
        steps.append({"key": key, **_group_fact(g, before, ranks, local, "new_group")})

    step("only0", [0])
    step("all", None)
    step("reversed", list(reversed(range(world_size))))
    before = c10d._world.group_count
    sg = dist.split_group(split_ranks=[[0]], timeout=TIMEOUT)
    steps.append({"key": "split0", **_group_fact(sg, before, [0], True, "split_group")})
    # Non-members of a local-synchronization group return before the name is drawn, so from here on the
    # counter (and the plain names) differ between ranks; only single-member groups follow.
    step("local1", [1], local=True)
    step("local0", [0], local=True)
    step("after_local", [0])
    facts["steps"] = steps

    # What a non-member gets back from the query API and a collective.
    nonmember = handles["only0"] if rank != 0 else handles["local1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ret = dist.all_reduce(torch.ones(1), group=nonmember)
    facts["nonmember"] = {
        "get_rank": dist.get_rank(nonmember),
        "get_world_size": dist.get_world_size(nonmember),
        "all_reduce_returns": repr(ret),
        "warnings": [str(w.message) for w in caught],
    }

    bad: dict[str, object] = {}
    for label, ranks in (
        ("empty", []),
        ("dup", [0, 0]),
        ("out_of_range", [world_size]),
        ("negative", [-1]),
        ("too_many", list(range(world_size + 1))),
        ("str", ["a"]),
    ):
        before = c10d._world.group_count
        try:
            dist.new_group(ranks, timeout=TIMEOUT)
            bad[label] = {"ok": True}
        except Exception as exc:
            bad[label] = {"ok": False, **_error(exc)}
        bad[label]["count_delta"] = c10d._world.group_count - before
    facts["bad_ranks"] = bad

    member = handles["only0"] if rank == 0 else handles["local1"]
    before = c10d._world.group_count
    dist.destroy_process_group(member)
    dist.destroy_process_group(nonmember)  # NON_GROUP_MEMBER: a silent no-op
    facts["destroy"] = {"subgroup_count_delta": c10d._world.group_count - before}
    dist.destroy_process_group()
    facts["destroy"]["count_after_world"] = c10d._world.group_count
    return facts


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "resolve":
        facts = resolve(argv[1])
    elif mode == "full":
        facts = full(argv[1], json.loads(argv[2]))
    elif mode == "groups":
        facts = groups(argv[1], int(argv[2]), int(argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print("PROBE_JSON: " + json.dumps(facts), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
