"""``simnccl.capture.nonmember``: a non-member's ``new_group`` answered without torch's path leaves torch's state,
the return values and the captured Program exactly as torch's own path does.

Each comparison runs the same ranks twice in one process, with the shortcut on and off (``nonmember._enabled``),
and snapshots torch's process-group state after every call (``group_count``, every group's name and rank map,
the ``NON_GROUP_MEMBER`` map, ``pg_map``, tags, what the call returned or raised).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from simnccl import capture as cap
from simnccl.capture import nonmember

sys.path.insert(0, str(Path(__file__).parent))

pytestmark = pytest.mark.torch

NON_MEMBER = c10d.GroupMember.NON_GROUP_MEMBER


def torch_state() -> dict[str, Any]:
    """Everything the rest of a program can read of torch's group bookkeeping, as comparable data."""
    world = c10d._world

    def name(pg: Any) -> Any:
        return "NON_GROUP_MEMBER" if pg is NON_MEMBER else world.pg_names.get(pg, repr(type(pg)))

    return {
        "group_count": world.group_count,
        "initialized": dist.is_initialized(),
        "pg_names": sorted(world.pg_names.values()),
        "pg_group_ranks": sorted((str(name(pg)), sorted(ranks.items())) for pg, ranks in world.pg_group_ranks.items()),
        "pg_map": sorted((str(name(pg)), str(state[0])) for pg, state in world.pg_map.items()),
        "pg_backend_config": sorted((str(name(pg)), config) for pg, config in world.pg_backend_config.items()),
        "tags_to_pg": sorted((tag, sorted(str(name(pg)) for pg in pgs)) for tag, pgs in world.tags_to_pg.items()),
        "pg_to_tag": sorted((str(name(pg)), tag) for pg, tag in world.pg_to_tag.items()),
    }


def outcome(call: Callable[[], Any]) -> Any:
    """What a call returned (a group by name, size and rank) or raised (type and message)."""
    try:
        result = call()
    except Exception as err:  # the error is the outcome compared
        return ["raised", type(err).__name__, str(err)]
    if result is NON_MEMBER:
        return ["NON_GROUP_MEMBER"]
    return [type(result).__name__, c10d._world.pg_names.get(result), result.size(), result.rank()]


class Index:
    """A rank given as an object with ``__index__`` (as a numpy integer is): torch reads it with
    ``operator.index``, and so does the shortcut."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def varied_calls(snapshots: dict[int, list[Any]]) -> None:
    """One rank of 8: non-member calls of every shape the shortcut answers or hands to torch, members, errors."""
    rank = int(__import__("os").environ["RANK"])
    dist.init_process_group("nccl", timeout=timedelta(minutes=10))
    others = [r for r in range(8) if r != rank]
    lazy = dist.ProcessGroupNCCL.Options()
    lazy.lazy_init = True
    priority = dist.ProcessGroupNCCL.Options()
    priority.is_high_priority_stream = True
    ten = timedelta(minutes=10)
    calls: list[Callable[[], Any]] = [
        lambda: dist.new_group(others[:2], timeout=ten),
        lambda: dist.new_group(tuple(reversed(others[2:5])), timeout=ten, backend="gloo"),
        lambda: dist.new_group(others[4:1:-1], timeout=ten, sort_ranks=False),
        lambda: dist.new_group(range(rank + 1, 8), timeout=ten, group_desc="upper"),
        lambda: dist.new_group(others[:3], ten, "nccl", priority, group_desc="priority"),
        lambda: dist.new_group(others[:3], timeout=ten, pg_options=lazy),
        lambda: dist.new_group([rank, others[0]], timeout=ten),  # a member: torch's path
        lambda: dist.new_group(others[1:3], timeout=ten, use_local_synchronization=True),
        lambda: dist.new_group(others[:2]),  # default timeout: torch's path
        lambda: dist.new_group(others[:2], timeout=30),  # not a timedelta: torch's error
        lambda: dist.new_group([others[0], others[0]], timeout=ten),  # duplicates: torch's error
        lambda: dist.new_group([others[0], 99], timeout=ten),  # out of range: torch's error
        lambda: dist.new_group([], timeout=ten),  # empty: torch's error
        lambda: dist.new_group(others[:2], timeout=ten, backend=7),  # not a backend name: torch's error
        lambda: dist.new_group(iter(others[:2]), timeout=ten),  # an iterator: torch's path
        lambda: dist.new_group([others[5], Index(others[4])], timeout=ten),  # __index__, unsorted: the shortcut
        lambda: dist.new_group([others[5], Index(others[4])], timeout=ten, sort_ranks=False),
        lambda: dist.new_group([others[0], float(others[1])], timeout=ten),  # not integers: torch's error
        lambda: dist.new_group(None, timeout=ten),  # everyone: a member
        lambda: dist.new_group(others[2:4], timeout=ten, device_id=c10d._get_default_group().bound_device_id),
    ]
    out = [["start", torch_state()]]
    for call in calls:
        out.append([outcome(call), torch_state()])
    snapshots[rank] = out


@contextlib.contextmanager
def counted() -> Iterator[list[int]]:
    """How many calls the shortcut answered (``new_group_outside`` returning NON_GROUP_MEMBER)."""
    answered = [0]
    original = nonmember.new_group_outside

    def counting(arguments: Any, ranks: list[int] | None = None) -> Any:
        result = original(arguments, ranks)
        answered[0] += result is NON_MEMBER
        return result

    nonmember.new_group_outside = counting
    try:
        yield answered
    finally:
        nonmember.new_group_outside = original


def twice(target: Callable[[dict[int, list[Any]]], None], world: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(snapshots, JSON, calls answered) with the shortcut on, then the same with it off (inline ranks)."""
    runs = []
    for enabled in (True, False):
        monkeypatch.setattr(nonmember, "_enabled", enabled)
        snapshots: dict[int, list[Any]] = {}
        with counted() as answered:
            run = cap.capture(functools.partial(target, snapshots), world, mode="inline")
        runs.append((snapshots, document(run), answered[0]))
    return runs


def document(run: cap.CapturedRun) -> str:
    """The run's JSON, object addresses in reprs (an iterator passed as ``ranks``) blanked."""
    return re.sub(r" at 0x[0-9a-f]+", " at 0x…", json.dumps(run.to_json(), sort_keys=True))


def test_the_shortcut_applies_to_the_installed_torch() -> None:
    assert nonmember.source_digest() in nonmember._checked_digests(), (
        "the installed torch's new_group path differs from the one checked: read it, compare it with "
        "simnccl/capture/nonmember.py's docstring, then add its digest to simnccl/data/torch_checked.toml"
    )
    assert nonmember.shortcut_for(c10d.new_group) is not None


def test_a_patched_or_foreign_new_group_gets_no_shortcut() -> None:
    assert nonmember.shortcut_for(lambda *a, **k: None) is None


def test_non_member_calls_leave_torch_state_and_the_capture_as_torch_does(monkeypatch) -> None:
    (on, on_json, answered), (off, off_json, answered_off) = twice(varied_calls, 8, monkeypatch)
    assert answered >= 8 * 5 and answered_off == 0  # the comparison compares the shortcut with torch
    assert on == off
    assert on_json == off_json
    first = on[0]
    assert first[1][0] == ["NON_GROUP_MEMBER"] and first[1][1]["group_count"] == first[0][1]["group_count"] + 1


def test_a_replaced_torch_function_sends_every_call_to_torch(monkeypatch) -> None:
    seen: list[Any] = []
    original = c10d._new_group_with_tag

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(c10d, "_new_group_with_tag", spy)
    with counted() as answered:
        cap.capture(functools.partial(varied_calls, {}), 2, mode="inline")
    assert answered[0] == 0 and len(seen) > 10


def megatron_rank(knobs: dict[str, Any], snapshots: dict[int, list[Any]]) -> None:
    """Megatron's real startup as one inline rank (its module globals reset first), then torch's state."""
    import framework_startups
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    framework_startups.megatron_startup(knobs)
    snapshots[dist.get_rank()] = [torch_state()]


MEGATRON_KNOBS = {"tp": 2, "pp": 2, "cp": 2, "ep": 2}


def test_megatron_startup_is_identical_with_and_without_the_shortcut(monkeypatch) -> None:
    parallel_state = pytest.importorskip("megatron.core.parallel_state")
    try:
        runs = twice(functools.partial(megatron_rank, MEGATRON_KNOBS), 32, monkeypatch)
    finally:  # the inline ranks ran in this process: later captures of Megatron here start clean
        parallel_state.destroy_model_parallel()
    (on, on_json, answered), (off, off_json, _) = runs
    assert answered > 32 * 20
    assert on == off and on_json == off_json


def test_megatron_forked_capture_is_byte_identical_with_and_without_the_shortcut(monkeypatch) -> None:
    pytest.importorskip("megatron.core.parallel_state")
    documents = []
    for enabled in (True, False):
        monkeypatch.setattr(nonmember, "_enabled", enabled)
        run = cap.capture(functools.partial(megatron_rank, {"tp": 2, "pp": 2}, {}), 16)
        documents.append(document(run))
    assert documents[0] == documents[1]


def test_the_barrier_switch_is_read_from_the_live_environment(monkeypatch) -> None:
    monkeypatch.delenv("TORCH_DIST_INIT_BARRIER", raising=False)
    assert not nonmember._barrier_set()
    monkeypatch.setenv("TORCH_DIST_INIT_BARRIER", "1")
    assert nonmember._barrier_set()
    monkeypatch.delenv("TORCH_DIST_INIT_BARRIER")
    assert not nonmember._barrier_set()
