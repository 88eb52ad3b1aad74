"""Recording torch's group-lifecycle calls (``init_process_group``/``new_group``/``split_group``/``destroy``).

Why wrappers and not the backend: a non-member's ``new_group`` never reaches a backend, yet it is part of the
rank's program.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from simnccl.c10d import _device_type
from simnccl.capture import nonmember
from simnccl.capture.recorder import _Recorder, active
from simnccl.capture.result import CaptureError
from simnccl.capture.standin import _on_tensor_device
from simnccl.capture.values import _backend_name, _device, _options, _plain, _seconds
from simnccl.ops import (
    WORLD,
    BatchIsendIrecv,
    Checkpoint,
    DestroyProcessGroup,
    InitProcessGroup,
    SplitGroup,
)
from simnccl.release import DEFAULT_DEVICE_BACKEND
from simnccl.tags import current_tags

RECORDED_FUNCTIONS = ("init_process_group", "new_group", "split_group", "destroy_process_group")


class _Binder:
    """A function's call arguments by parameter name, defaults filled in, as ``Signature.bind`` gives them.

    Why not ``Signature.bind`` itself: Megatron calls ``new_group`` ~2,900 times per rank at 512 ranks, and
    ``bind`` + ``apply_defaults`` cost more than the rest of the recording together. torch's recorded functions
    take only positional-or-keyword parameters; for those, filling a dict is the whole of binding. Any other
    shape, or a call that does not fit (too many arguments, an unknown or repeated name, a required one
    missing), goes to ``Signature.bind``, which raises torch's own ``TypeError``.
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        self.signature = inspect.signature(function)
        parameters = list(self.signature.parameters.values())
        self.names = tuple(p.name for p in parameters)
        self.defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
        self.known = frozenset(self.names)
        self.simple = all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters)

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        if self.simple and len(args) <= len(self.names) and kwargs.keys() <= self.known:
            out = dict(self.defaults)
            if args:
                if not kwargs.keys().isdisjoint(self.names[: len(args)]):
                    return self._bound(args, kwargs)  # a name given twice: torch's TypeError
                out.update(zip(self.names, args, strict=False))
            out.update(kwargs)
            if len(out) == len(self.names):
                return out
        return self._bound(args, kwargs)

    def _bound(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)


# Read once, at import: binding each call's arguments is per call, inspecting torch's signatures need not be.
_BINDERS = {name: _Binder(getattr(c10d, name)) for name in RECORDED_FUNCTIONS}

# Recorded calls in progress (process-wide, like the recorder): a call torch makes from inside a recorded call
# (``init_device_mesh`` calling ``new_group``) is torch's, not the user's, and passes through unrecorded.
_DEPTH = 0


def _holders(values: Iterable[Any]) -> list[tuple[Any, str, Any]]:
    """Every (module, attribute, value) of a loaded module whose value is one of ``values`` (~25-70 ms)."""
    wanted = {id(value) for value in values}  # the values are alive (the caller holds them): ids are unique
    out = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):
            out.extend((module, attr, value) for attr, value in list(namespace.items()) if id(value) in wanted)
    return out


@contextlib.contextmanager
def _intercepted() -> Iterator[None]:
    """Torch's group-lifecycle functions swapped for recording wrappers wherever a loaded module holds them.

    Every module attribute that *is* one of torch's functions is swapped (DeviceMesh and user modules bind
    ``new_group``/``split_group`` at import, so patching ``torch.distributed`` alone would miss them; a module
    imported later binds the wrapper from wherever it imports it). ``capture()`` does this once, before ranks
    run inline or fork: the wrappers record into whichever rank's recorder is active (``active()``) and pass
    straight through when none is, so a module that one inline rank imports (binding a wrapper) records every
    later rank's calls too. On exit torch's functions are back everywhere, in modules imported meanwhile too.
    (``sys.setprofile`` would see every call without patching, but costs ~20x on torch's lazy imports of a
    first DeviceMesh build; wrapping costs nothing.)
    """
    names = (*RECORDED_FUNCTIONS, "batch_isend_irecv")
    originals = {name: getattr(c10d, name) for name in names}
    wrappers = {name: _wrapper(name, fn) for name, fn in originals.items() if name in RECORDED_FUNCTIONS}
    wrappers["batch_isend_irecv"] = _batch_wrapper(originals["batch_isend_irecv"])
    wrapper_of = {id(originals[name]): wrappers[name] for name in names}
    original_of = {id(wrappers[name]): originals[name] for name in names}
    patched = _holders(originals.values())
    try:
        for module, attr, value in patched:
            setattr(module, attr, wrapper_of[id(value)])
        yield
    finally:
        for module, attr, value in reversed(patched):
            setattr(module, attr, value)
        for module, attr, wrapper in _holders(wrappers.values()):
            setattr(module, attr, original_of[id(wrapper)])


def _batch_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    """``batch_isend_irecv`` recorded as one ``BatchIsendIrecv``: its sends and recvs reach the stand-in one by one
    (it supports no coalescing, so torch calls each isend/irecv), which keeps them in ``recorder.batch``. Why: as
    separate blocking sends and recvs, a ring exchange that real NCCL and gloo complete was simulated as a hang."""

    def recorded(*args: Any, **kwargs: Any) -> Any:
        recorder = active()
        if recorder is None or recorder.batch is not None:
            return original(*args, **kwargs)
        recorder.batch = []
        try:
            works = original(*args, **kwargs)
            items = recorder.batch
        finally:
            recorder.batch = None  # torch raised for the list (a bad op, groups that differ): nothing recorded
        if items:
            listed = args[0] if args else kwargs.get("p2p_op_list", ())
            tensors = [p2p.tensor for p2p in listed[:1]]  # torch runs the batch on its first tensor's device
            with _on_tensor_device(recorder, tensors):
                recorder.add(_batch_op(recorder, items), "batch_isend_irecv", {"group": items[0][4]}, items[0][4])
        return works

    recorded.__wrapped__ = original  # type: ignore[attr-defined]
    return recorded


def _batch_op(recorder: _Recorder, items: Sequence[tuple[bool, int, int, str, str]]) -> BatchIsendIrecv:
    """The batch's op: each send's and recv's own size where they differ (``send_bytes``/``recv_bytes``), one
    dtype, the first where they differ (with a note: the simulator compares a message's two ends by it)."""
    sends = [(peer, size) for is_send, peer, size, _, _ in items if is_send]
    recvs = [(peer, size) for is_send, peer, size, _, _ in items if not is_send]
    sizes = {size for _, _, size, _, _ in items}
    dtypes = list(dict.fromkeys(dtype for _, _, _, dtype, _ in items))
    if len(dtypes) > 1:
        recorder.notes.append(
            f"rank {recorder.rank}: a batch_isend_irecv of tensors of {len(dtypes)} dtypes is recorded with its "
            f"first ({dtypes[0]})"
        )
    one = len(sizes) == 1
    return BatchIsendIrecv(
        sends=tuple(peer for peer, _ in sends),
        recvs=tuple(peer for peer, _ in recvs),
        group=items[0][4],
        size_bytes=max(sizes),
        dtype=dtypes[0],
        send_bytes=None if one or not sends else tuple(size for _, size in sends),
        recv_bytes=None if one or not recvs else tuple(size for _, size in recvs),
    )


def _names_nccl(name: str, backend: object) -> bool:
    """Whether this call uses torch's backend name "nccl" (its first use registers it, reading
    TORCH_DIST_USE_NCCL2: legacy or nccl2): an init_process_group without a backend (the accelerator's default on
    the GPU host a capture emulates), or a backend string naming it (``"nccl"``, ``"cpu:gloo,cuda:nccl"``)."""
    if backend is None:
        return name == "init_process_group"
    if not isinstance(backend, str):
        return False
    return "nccl" in (part.rpartition(":")[2].strip().lower() for part in backend.split(","))


def _wrapper(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for torch's ``name`` that records entry into the active recorder and binds the result."""
    bind = _BINDERS[name].bind
    # new_group for a group this rank is not in: torch's effects without torch's path (capture.nonmember)
    outside = nonmember.shortcut_for(original) if name == "new_group" else None

    def recorded(*args: Any, **kwargs: Any) -> Any:
        global _DEPTH
        recorder = active()
        if recorder is None or _DEPTH:
            return original(*args, **kwargs)
        try:
            arguments = bind(args, kwargs)
        except TypeError:
            return original(*args, **kwargs)  # torch raises its own error for bad arguments
        ranks = None  # new_group's ranks as torch reads them (``_enter_new_group``), for the shortcut
        if name == "init_process_group" and recorder.env_at_init is None:
            recorder.env_at_init = dict(os.environ)  # what NCCL's knobs are as the default group is made
        if recorder.env_at_nccl is None and _names_nccl(name, arguments.get("backend")):
            recorder.env_at_nccl = dict(os.environ)  # where torch reads TORCH_DIST_USE_NCCL2, once a process
        _refuse_renamed(recorder)
        _DEPTH += 1
        recorder.ops.extend(recorder.memory.changes())  # tensors made before the call: kept whatever it does
        before = (len(recorder.ops), len(recorder.calls), c10d._world.group_count)
        try:
            try:
                if name == "new_group":
                    args, kwargs = _ranks_read_once(args, kwargs, arguments)
                    handle, ranks = _enter_new_group(recorder, arguments)
                else:
                    handle = _enter(recorder, name, arguments)
            except (TypeError, ValueError) as err:  # arguments torch will reject itself, just below
                handle = None
                recorder.notes.append(f"{name}: arguments not recorded ({err})")
            result = nonmember.TORCH if outside is None else outside(arguments, ranks)
            if result is nonmember.TORCH:
                result = original(*args, **kwargs)
        except Exception as err:
            _unrecord(recorder, name, before, err)
            raise
        finally:
            _DEPTH -= 1
        _leave(recorder, name, handle, result)
        return result

    recorded.__wrapped__ = original  # type: ignore[attr-defined]
    recorded.__name__ = name
    recorded.__doc__ = original.__doc__
    return recorded


def _unrecord(rec: _Recorder, name: str, before: tuple[int, int, int], err: BaseException) -> None:
    """A call torch raised in did nothing a Program can hold: what it recorded is taken back (code that catches
    the error goes on as if it never called). Why: ``new_group([9])`` in a world of 4, or a negative timeout,
    caught by the code, was recorded anyway, and the capture then failed on the Program's own checks (exit 2)
    where real torch had gone on, or would have charged a group torch never made.

    torch checks a group's arguments before it takes the group's name from its counter; a call that raised after
    taking it leaves every later group on this rank named one higher, which no Program expresses: the rank's
    next group call is refused (``_refuse_renamed``)."""
    ops, calls, count = before
    del rec.ops[ops:], rec.calls[calls:]
    note = f"{name} raised {type(err).__name__} (torch rejected the call): not recorded"
    if note not in rec.notes:
        rec.notes.append(note)
    if c10d._world.group_count != count and rec.renamed is None:
        # refused at this rank's next group call (``_refuse_renamed``): code that lets the error end the rank
        # keeps torch's own error, the one real torch shows
        rec.renamed = (
            f"rank {rec.rank}: {name} raised {type(err).__name__} after torch took a group name from its counter, "
            "and the code went on: this rank's later groups are named one higher than any Program of the calls "
            "that succeeded says"
        )


def _refuse_renamed(rec: _Recorder) -> None:
    """A group call after one that raised having taken a group name (``_unrecord``): not expressible."""
    if rec.renamed is not None:
        raise CaptureError(rec.renamed)


def _ranks_read_once(
    args: tuple[Any, ...], kwargs: dict[str, Any], arguments: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``ranks`` given as an iterator (a generator, ``map``, ``iter(...)``) is read once, here: the record and torch
    both get the list. torch 2.15's ``_new_group_with_tag`` makes a list of ``ranks`` before anything else reads
    it, so torch behaves as with the iterator; reading the iterator for the record and then handing torch the
    exhausted one made torch see no ranks ("Group rank must be specified"), which real torch never says."""
    raw = arguments.get("ranks")
    if type(raw) is list or not isinstance(raw, Iterator):  # (a list first: most calls, and no ABC check)
        return args, kwargs
    ranks = arguments["ranks"] = list(raw)
    if "ranks" in kwargs:
        return args, {**kwargs, "ranks": ranks}
    at = _BINDERS["new_group"].names.index("ranks")
    return (*args[:at], ranks, *args[at + 1 :]), kwargs


def _enter(rec: _Recorder, name: str, args: Mapping[str, Any]) -> str | None:
    """Record the call, before torch runs it; returns the handle its group will be bound to. (``new_group`` goes
    to ``_enter_new_group``, which also returns the ranks the non-member shortcut reuses.)"""
    if name == "init_process_group":
        device = _device(args.get("device_id"))
        backend = _backend_name(args.get("backend"))
        if backend is None:
            # torch l.2632-2640: a device_id names its device type's default backend, else "undefined" (the
            # accelerator's only); recorded as torch resolves it (None made the scenario writer fail: exit 70)
            backend = "undefined" if device is None else DEFAULT_DEVICE_BACKEND[_device_type(device)]
        op = InitProcessGroup(
            backend=backend,
            device_id=device,
            timeout_s=_seconds(args.get("timeout")),
            pg_options=_options(args.get("pg_options")),
        )
        keys = ("backend", "init_method", "timeout", "device_id", "pg_options")
        rec.add(op, name, _call_args(args, keys), WORLD)
        return WORLD
    purpose, traffic = current_tags()  # production code's simnccl.tags.group_tags around the call
    if name == "split_group":
        split = tuple(tuple(int(r) for r in s) for s in args.get("split_ranks") or ())
        desc = args.get("group_desc")
        handle = rec.family(desc or "split", None, _world_size())
        rec.families.pop(desc or "split", None)  # one split_group call is one family
        if args.get("backend") is not None:
            rec.notes.append(f"split_group(backend={args['backend']!r}): not expressible in a Program; dropped")
        op = SplitGroup(
            split_ranks=split,
            parent=rec.handle_of(args.get("parent_pg")),
            bind=handle,
            pg_options=_options(args.get("pg_options")),
            group_desc=desc,
            timeout_s=_seconds(args.get("timeout")),
            purpose=purpose,
            traffic=traffic,
        )
        keys = ("parent_pg", "split_ranks", "timeout", "pg_options", "group_desc", "backend")
        rec.add(op, name, _call_args(args, keys), handle)
        return handle
    group = args.get("group")
    handle = rec.handle_of(group)
    rec.add(DestroyProcessGroup(group=handle), name, {"group": handle}, handle)
    return None


def _enter_new_group(rec: _Recorder, args: Mapping[str, Any]) -> tuple[str, list[int] | None]:
    """``_enter`` for ``new_group``: (the handle, the ranks as torch 2.15 reads them — ``operator.index`` of
    each, sorted when ``sort_ranks`` — or None when ``ranks`` is None or not all integers).

    The ranks are handed to the non-member shortcut (``nonmember.new_group_outside``), which would otherwise
    convert and sort them again: one pass for both, on the call Megatron makes ~2,900 times per rank. A rank
    that is not an integer (``int()`` reads ``"3"``, torch raises) is recorded as ``int()`` reads it and
    handed to torch."""
    purpose, traffic = current_tags()  # production code's simnccl.tags.group_tags around the call
    raw = args.get("ranks")
    indexed: list[int] | None = None
    if raw is None:
        ranks = None
    else:
        try:
            ranks = indexed = list(map(operator.index, raw))
        except TypeError:
            ranks = list(map(int, raw))
        if args.get("sort_ranks", True):
            ranks.sort()
    backend = _backend_name(args.get("backend"))
    desc = args.get("group_desc")
    handle = rec.family(desc or backend or "group", ranks, _world_size() if ranks is None else 0)
    timeout = args.get("timeout")
    fields = (  # NewGroup's fields in order (the compact form _Recorder.record_new_group keeps)
        None if ranks is None else tuple(ranks),  # ranks
        handle,  # bind
        backend,
        _options(args.get("pg_options")),
        bool(args.get("use_local_synchronization", False)),
        desc,  # group_desc
        _device(args.get("device_id")),
        timeout.total_seconds() if type(timeout) is timedelta else _seconds(timeout),  # timeout_s
        purpose,
        traffic,
    )
    rec.record_new_group(fields, _plain_args(args, _NEW_GROUP_KEYS), handle)
    return handle, indexed


def _world_size() -> int:
    """The default group's size (0 before ``init_process_group``): the members of a ``ranks=None`` group."""
    return dist.get_world_size() if dist.is_initialized() else 0


def _leave(rec: _Recorder, name: str, handle: str | None, result: Any) -> None:
    """Bind the group torch returned (or the default group it created) to its handle."""
    if name == "init_process_group" and dist.is_initialized():
        _check_world(rec)
        rec.bind(c10d._get_default_group(), WORLD)
        if rec.checkpoints:
            # a re-init (destroy_process_group, then init again) gets its own label: a label met twice fails
            rec.inits += 1
            rec.append(Checkpoint("after_init" if rec.inits == 1 else f"after_init_{rec.inits}"))
    elif handle is not None and type(result) is not int and isinstance(result, c10d.ProcessGroup):
        # (NON_GROUP_MEMBER is an int; torch's ProcessGroup isinstance check is a Python-level metaclass hook)
        rec.bind(result, handle)


def _check_world(rec: _Recorder) -> None:
    """The default group is this rank's place in the world the capture runs, or the captured code fails here.

    Why: a rank and world given to ``init_process_group`` (``rank=0`` on every process, ``world_size=8`` under
    ``--world 2``) are what torch's rendezvous waits for. Real ranks then hang in it, waiting for ranks that never
    come, or fail on a port another rank holds; the stand-in's rendezvous needs no peer, and the capture went on
    to record a world the run does not have, which simulated as a pass."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rec.world_size and (rank, world) != (rec.rank, rec.world_size):
        raise CaptureError(
            f"rank {rec.rank}: init_process_group made this process rank {rank} of a world of {world}, but it is "
            f"rank {rec.rank} of the {rec.world_size} ranks captured: real torch would wait in its rendezvous for "
            "ranks that never come (give each process its own rank, and the world the capture runs)"
        )


# new_group's arguments a Call keeps, in the order it lists them
_NEW_GROUP_KEYS = (
    "ranks",
    "timeout",
    "backend",
    "pg_options",
    "use_local_synchronization",
    "group_desc",
    "device_id",
    "sort_ranks",
)


def _plain_args(args: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``keys``' values that are not None, as plain data (``_call_args`` then ``values._plain`` on each, in one
    pass: this runs once per recorded ``new_group``, thousands of times per rank)."""
    out = {}
    for key in keys:
        value = args.get(key)
        if value is None:
            continue
        kind = type(value)
        if kind is bool or kind is str or kind is int:
            out[key] = value
        elif kind is timedelta:
            out[key] = value.total_seconds()
        else:
            out[key] = _plain(value)
    return out


def _call_args(args: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    out = {k: args[k] for k in keys if k in args and args[k] is not None}
    if "parent_pg" in out:
        recorder = active()
        out["parent_pg"] = recorder.handle_of(out["parent_pg"]) if recorder is not None else None
    return out
