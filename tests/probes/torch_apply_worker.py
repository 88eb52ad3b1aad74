"""One rank of a real-torch check of ``simnccl.torch_apply``, for ``tests/test_torch_apply.py``.

Run in a fresh interpreter with ``CUDA_VISIBLE_DEVICES=""``; prints one line ``PROBE_JSON: {...}`` on stdout.

Modes (first argument):

* ``record <dir> <rank> <world>``: registers a recording Python backend (reference §G) under ``nccl``,
  ``nccl-lazy`` (stand-ins: this host can't build NCCL communicators, and built-in policies act on NCCL-family
  names only) and ``simrec``, then runs one small startup per policy under ``apply(policy)`` on a world bound
  to ``cpu:0`` (so torch takes its split / NOCOLOR paths) and reports, per call, the policy's decision, what
  the backend saw (creations with their ``backend_options`` and ``split_from``, ``split()``,
  ``perform_nocolor_split``, eager connects) and what the caller got back.
* ``gloo <dir> <rank> <world>``: ``apply("legacy")`` (env set before init, restored after) and
  ``apply("dedupe")`` (same group objects, working collectives) on gloo.
* ``solo <dir>``: importing simnccl does not import torch until ``apply``; install/uninstall restore the exact
  function objects; nesting is refused; an uninstalled wrapper passes through; ``release_key``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

if importlib.util.find_spec("simnccl") is None:  # not installed: run from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TIMEOUT = timedelta(seconds=20)
LOG: list[Any] = []  # recording backend events, in order


# ---------------------------------------------------------------------------------------------------------
# record


def _options(options: Any) -> dict[str, Any] | None:
    import torch.distributed as dist

    if options is None:
        return None
    config = getattr(options, "config", None)
    return {
        "nccl": isinstance(options, dist.ProcessGroupNCCL.Options),
        "lazy_init": bool(getattr(options, "lazy_init", False)),
        "is_high_priority_stream": bool(getattr(options, "is_high_priority_stream", False)),
        "split_share": getattr(config, "split_share", None),
    }


def _recording_backend() -> Any:
    import torch
    from torch._C._distributed_c10d import Backend as C10dBackend
    from torch._C._distributed_c10d import _create_work_from_future
    from torch.futures import Future

    def done(value: Any) -> Any:
        future: Future[Any] = Future()
        future.set_result(value)
        return _create_work_from_future(future)

    class Recorder(C10dBackend):
        """Records what torch asks of it; mimics nccl2's ``supports_splitting`` (False while lazy_init)."""

        def __init__(self, name: str, rank: int, ranks: list[int], group: str, lazy: bool) -> None:
            super().__init__(rank, len(ranks))
            self._name, self._ranks, self._group, self._lazy = name, ranks, group, lazy

        def getBackendName(self) -> str:
            return self._name

        @property
        def options(self) -> Any:  # without it, ProcessGroup.split_group recurses through the trampoline
            return C10dBackend.Options(self._name, TIMEOUT)

        @property
        def supports_splitting(self) -> bool:
            return not self._lazy

        def eager_connect_single_device(self, device: Any) -> None:
            LOG.append(["eager_connect", self._group, str(device)])

        def perform_nocolor_split(self, device: Any) -> None:
            LOG.append(["nocolor_split", self._group, str(device)])

        def split(self, store: Any, ranks: list[int], opts: Any) -> Any:
            me = self._ranks[self.rank()]
            ranks = list(ranks)
            LOG.append(["split", self._group, ranks, _options(opts), me in ranks])
            if me not in ranks:
                return None
            return Recorder(self._name, ranks.index(me), ranks, f"{self._group}>split", False)

        def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
            if self._lazy:
                LOG.append(["lazy_init_on_first_use", self._group])
                self._lazy = False
            return done(tensors)

        def barrier(self, opts: Any) -> Any:
            return done(None)

    def creator(name: str) -> Any:
        def create(opts: Any, backend_options: Any) -> Any:
            ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
            LOG.append(["create", name, ranks, opts.split_from is not None, _options(backend_options)])
            if opts.split_from is not None:
                return opts.split_from.split(opts.store, list(opts.global_ranks_in_group), backend_options)
            lazy = bool(getattr(backend_options, "lazy_init", False))
            return Recorder(name, opts.group_rank, ranks, opts.group_id, lazy)

        return create

    return creator


def _describe(result: Any) -> Any:
    import torch.distributed as dist

    if result is None:
        return None
    if isinstance(result, int):
        return "NON_GROUP_MEMBER" if result == dist.GroupMember.NON_GROUP_MEMBER else result
    return {"backend": str(dist.get_backend(result)), "size": result.size(), "rank": result.rank()}


def _decision(call: Any) -> dict[str, Any]:
    from simnccl.policy import InitPlan

    d = call.decision
    out: dict[str, Any] = {"kind": call.kind, "ranks": call.ranks, "torch_called": call.torch_called}
    out["backend"] = d.backend
    out["options"] = d.pg_options.to_dict()
    if isinstance(d, InitPlan):
        out["env"] = dict(d.env)
        out["device_id"] = d.device_id
    else:
        out["use_local_synchronization"] = d.use_local_synchronization
        out["reuse"] = None if d.reuse is None else list(d.reuse)
    out["explanation"] = d.explanation
    return out


RECORD_SCENARIOS = {  # label: (policy spec, world backend)
    "torch-default": ("torch-default", "nccl"),
    "lazy-init": ("lazy-init", "nccl"),
    "dedupe": ("dedupe", "nccl"),
    "skip-single-rank": ("skip-single-rank", "nccl"),
    "budget": ("budget(500,200)", "nccl"),
    "nccl-lazy-p2p": ("nccl-lazy-p2p", "nccl"),
    "lazy-init-simrec": ("lazy-init", "simrec"),
    "dedupe+budget": ("dedupe+budget(0,200)", "nccl"),
}


def record(workdir: str, rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from simnccl.torch_apply import apply

    creator = _recording_backend()
    for name in ("nccl", "nccl-lazy", "simrec"):
        dist.Backend.register_backend(name, creator(name), extended_api=True, devices=["cpu"])
    out: dict[str, Any] = {}
    for index, (label, (spec, backend)) in enumerate(RECORD_SCENARIOS.items()):
        store = dist.FileStore(os.path.join(workdir, f"record-{index}"), world)
        calls: list[dict[str, Any]] = []
        facts: dict[str, Any] = {}
        with apply(spec) as applied:

            def call(label: str, fn: Any, applied: Any = applied, calls: list[dict[str, Any]] = calls) -> Any:
                start, first = len(LOG), len(applied.decisions)
                try:
                    result = fn()
                    described = _describe(result)
                except RuntimeError as err:
                    result, described = None, {"error": str(err)}
                decisions = [_decision(c) for c in applied.decisions[first:]]
                calls.append({"label": label, "decisions": decisions, "events": LOG[start:], "result": described})
                return result

            call(
                "init",
                lambda store=store, backend=backend: dist.init_process_group(
                    backend, store=store, rank=rank, world_size=world, timeout=TIMEOUT, device_id=torch.device("cpu", 0)
                ),
            )
            if spec.startswith("dedupe+"):  # a group of another backend on the same ranks, made first
                call("g01-gloo", lambda: dist.new_group([0, 1], backend="gloo"))
            g01 = call("g01", lambda: dist.new_group([1, 0]))
            g01b = call("g01-again", lambda: dist.new_group([0, 1]))
            g0 = call("g0", lambda: dist.new_group([0]))
            call("g12-pp", lambda: dist.new_group([1, 2], purpose="pp"))
            if spec == "lazy-init":  # a lazy_init parent can't be split from before its first op (§B.5)
                call("split-before-use", lambda: dist.split_group(split_ranks=[[0, 1], [2]]))
            tensor = torch.ones(2)
            call("world-all-reduce", lambda tensor=tensor: dist.all_reduce(tensor))
            call("split", lambda: dist.split_group(split_ranks=[[0, 1], [2]]))
            facts["g01_again_is_g01"] = g01b is g01
            if rank == 0:
                dist.all_reduce(tensor, group=g0)  # a fake group under skip-single-rank: a local no-op
            facts["all_reduce"] = tensor.tolist()
            facts["installed_during"] = dist.new_group is applied.wrappers["new_group"]
            dist.destroy_process_group()
        out[label] = {"spec": spec, "backend": backend, "calls": calls, "facts": facts}
    return {"scenarios": out}


# ---------------------------------------------------------------------------------------------------------
# gloo


def gloo(workdir: str, rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from simnccl.torch_apply import apply

    out: dict[str, Any] = {"env_before": os.environ.get("TORCH_DIST_USE_NCCL2")}

    # legacy: a spy stands in for torch's init_process_group so the environment at the call is observable;
    # install takes the spy as "the original" and must put the very same object back.
    real_init = c10d.init_process_group
    seen: dict[str, Any] = {}

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen["TORCH_DIST_USE_NCCL2"] = os.environ.get("TORCH_DIST_USE_NCCL2")
        seen["backend"] = args[0] if args else kwargs.get("backend")
        return real_init(*args, **kwargs)

    c10d.init_process_group = dist.init_process_group = spy
    try:
        with apply("legacy") as applied:
            store = dist.FileStore(os.path.join(workdir, "legacy"), world)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
            out["env_during"] = os.environ.get("TORCH_DIST_USE_NCCL2")
            out["env_set"] = dict(applied.env_set)
            c10d.Backend._ensure_backend_registered("nccl")  # first use of "nccl": reads the variable now
            out["nccl_creator"] = c10d.Backend._plugins["NCCL"].creator_fn.__name__
            tensor = torch.full((2,), float(rank + 1))
            dist.all_reduce(tensor)
            out["legacy_all_reduce"] = tensor.tolist()
            dist.destroy_process_group()
        out["env_seen_by_init"] = seen
        out["env_after"] = os.environ.get("TORCH_DIST_USE_NCCL2", "<unset>")
        out["init_restored"] = dist.init_process_group is spy and c10d.init_process_group is spy
    finally:
        c10d.init_process_group = dist.init_process_group = real_init

    # dedupe: identical rank lists give the very same group object; collectives work on it.
    with apply("dedupe") as applied:
        store = dist.FileStore(os.path.join(workdir, "dedupe"), world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
        both = dist.new_group([0, 1])
        both_again = dist.new_group([1, 0])
        split = dist.split_group(split_ranks=[[0], [1]])
        split_again = dist.split_group(split_ranks=[[0], [1]])
        solo = dist.new_group([0])  # identical to rank 0's split: the split group itself comes back
        out["same_object"] = both_again is both
        out["split_same_object"] = split_again is split
        out["split_size"] = split.size()
        out["solo"] = "split group" if solo is split else _describe(solo)
        out["torch_called"] = [c.torch_called for c in applied.decisions]
        tensor = torch.full((3,), float(rank + 1))
        dist.all_reduce(tensor, group=both_again)
        out["all_reduce"] = tensor.tolist()
        gathered = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(gathered, torch.tensor([float(rank)]), group=both_again)
        out["all_gather"] = [t.item() for t in gathered]
        mine = torch.tensor([float(rank + 10)])
        dist.all_reduce(mine, group=split_again)
        out["split_all_reduce"] = mine.item()
        dist.barrier(group=both)
        dist.destroy_process_group()

    # dedupe and destroys: one of two equal handles destroyed leaves the group to the other; the group goes
    # with its last handle, and an equal later call (or one after the default group was destroyed and made
    # again) creates a new group rather than reuse the dead one.
    with apply("dedupe") as applied:
        store = dist.FileStore(os.path.join(workdir, "destroy"), world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
        first = dist.new_group([0, 1])
        second = dist.new_group([0, 1])
        dist.destroy_process_group(first)
        tensor = torch.ones(1)
        dist.all_reduce(tensor, group=second)
        out["kept_by_other_handle"] = [second is first, tensor.item()]
        dist.destroy_process_group(second)
        out["gone_with_last_handle"] = second not in c10d._world.pg_map
        again = dist.new_group([0, 1])
        tensor = torch.ones(1)
        dist.all_reduce(tensor, group=again)
        out["recreated"] = [again is not first, tensor.item()]
        dist.destroy_process_group()
        store = dist.FileStore(os.path.join(workdir, "destroy-world"), world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
        after_world = dist.new_group([0, 1])
        tensor = torch.ones(1)
        dist.all_reduce(tensor, group=after_world)
        out["after_world"] = [after_world is not again, tensor.item()]
        out["destroy_torch_called"] = [c.torch_called for c in applied.decisions]
        dist.destroy_process_group()
    return out


# ---------------------------------------------------------------------------------------------------------
# solo


def solo(workdir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    import simnccl
    import simnccl.policy

    out["torch_after_import"] = "torch" in sys.modules
    out["simnccl_version"] = simnccl.__version__
    import simnccl.torch_apply

    applied = simnccl.torch_apply.apply("torch-default")
    out["torch_after_apply"] = "torch" in sys.modules
    applied.uninstall()

    import torch
    import torch.distributed as dist

    from simnccl import torch_apply
    from simnccl.torch_apply import ApplyError, apply, install, release_key, uninstall

    out["applied_type"] = type(applied).__name__
    modules = [sys.modules[m] for m in torch_apply.PATCHED_MODULES]
    names = torch_apply.PATCHED_FUNCTIONS
    # device_mesh imports new_group and split_group but not destroy_process_group: only what a module has
    originals = {(m.__name__, n): getattr(m, n) for m in modules for n in names if hasattr(m, n)}

    def state() -> dict[str, bool]:
        return {f"{m}.{n}": getattr(sys.modules[m], n) is f for (m, n), f in originals.items()}

    out["before"] = state()
    applied = install("dedupe")
    out["during_is_original"] = state()
    out["during_one_wrapper_per_name"] = all(getattr(sys.modules[m], n) is applied.wrappers[n] for m, n in originals)
    try:
        install("legacy")
        out["nested"] = "no error"
    except ApplyError as err:
        out["nested"] = str(err)
    out["current_is_applied"] = torch_apply.current() is applied
    wrapper = dist.new_group
    uninstall(applied)
    out["after"] = state()
    applied.uninstall()  # idempotent
    uninstall()  # nothing installed: no-op
    out["after_second_uninstall"] = state()
    try:
        with apply("lazy-init"):
            raise KeyError("boom")
    except KeyError:
        pass
    out["after_exception"] = state()
    out["current_after"] = torch_apply.current() is None

    # An uninstalled wrapper someone kept passes straight through (purpose/traffic stripped), world of 1.
    store = dist.FileStore(os.path.join(workdir, "solo"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=TIMEOUT)
    group = wrapper([0], purpose="tp", traffic="collectives")
    out["stale_wrapper"] = [_describe(group), len(applied.decisions)]
    with apply("dedupe") as again:
        first = dist.new_group([0])
        out["world1_dedupe_same"] = dist.new_group([0]) is first
        tensor = torch.ones(1)
        dist.all_reduce(tensor, group=first)
        out["world1_all_reduce"] = tensor.item()
        try:
            dist.new_group([0], traffic="bogus")
            out["bad_traffic"] = "no error"
        except ValueError as err:
            out["bad_traffic"] = str(err)
        out["world1_decisions"] = [_decision(c) for c in again.decisions]
    dist.destroy_process_group()

    cases = ["2.14.1", "2.15.0+cu132", "2.15.0a0+git1234", "2.15.0.dev20260101", "2.16.0.dev20260301", "2.13.0"]
    keys: dict[str, str] = {}
    for version in cases:
        try:
            keys[version] = release_key(version)
        except ApplyError as err:
            keys[version] = f"ApplyError: {err}"
    out["release_keys"] = keys
    out["release_here"] = [torch.__version__, release_key()]

    # gpu= prices an eager group for budget(X) from that kind's profile; an unknown kind is refused up front.
    with apply("budget(300)", gpu="rtx3060-12gb") as priced:
        out["budget_priced_mib"] = priced.eager_group_mib()
    with apply("budget(300)") as unpriced:
        out["budget_unpriced_mib"] = unpriced.eager_group_mib()
    # budget(X) prices a group by its layout, LOCAL_WORLD_SIZE ranks to a node (one node when unset): with
    # NCCL_RUNTIME_CONNECT=0 a group spread over nodes costs more at init.
    saved = {name: os.environ.pop(name, None) for name in ("NCCL_RUNTIME_CONNECT", "LOCAL_WORLD_SIZE")}
    os.environ["NCCL_RUNTIME_CONNECT"] = "0"
    with apply("budget(5000)", gpu="h100-80gb") as laid:
        out["budget_4_ranks_local_unset"] = laid.eager_group_mib((0, 1, 2, 3), world_size=4)
        for local in ("4", "1"):
            os.environ["LOCAL_WORLD_SIZE"] = local
            out[f"budget_4_ranks_local_{local}"] = laid.eager_group_mib((0, 1, 2, 3), world_size=4)
    for name, value in saved.items():
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value
    try:
        install("budget(300)", gpu="tpu-v9")
        out["unknown_gpu"] = "no error"
    except ApplyError as err:
        out["unknown_gpu"] = str(err)
    # profile= prices from that profile (a calibrated one: here the built-in with 100 MiB more per communicator),
    # given as an object or a file, and names the kind; one for another kind or release is refused.
    import dataclasses

    from simnccl.profiles import find_profile

    builtin = find_profile("rtx3060-12gb", "2.15")
    calibrated = dataclasses.replace(
        builtin,
        name="calibrated",
        releases=("2.15",),
        comm=dataclasses.replace(builtin.comm, comm_fixed_mib=builtin.comm.comm_fixed_mib + 100),
    )
    with apply("budget(300)", profile=calibrated) as by_profile:
        out["budget_profile_mib"] = [by_profile.eager_group_mib(), by_profile.gpu]
    with apply("budget(300)", profile=builtin.path, gpu="rtx3060-12gb") as by_file:
        out["budget_profile_file_mib"] = by_file.eager_group_mib()
    for name, kwargs in (
        ("profile_other_gpu", {"profile": calibrated, "gpu": "h100-80gb"}),
        ("profile_other_release", {"profile": calibrated, "release": "2.14"}),
        ("profile_missing_file", {"profile": "/nonexistent/calibrated.toml"}),
    ):
        try:
            install("budget(300)", **kwargs)
            out[name] = "no error"
        except ApplyError as err:
            out[name] = str(err)
    return out


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "solo":
        result = solo(argv[1])
    else:
        handler = {"record": record, "gloo": gloo}[mode]
        result = handler(argv[1], int(argv[2]), int(argv[3]))
    print("PROBE_JSON: " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
