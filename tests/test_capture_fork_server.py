"""Fast capture: the fork server (a script's imports paid once), the recording fast path, shared results.

A script captured through the fork server must give the same ``CapturedRun`` as with every rank importing for
itself (``preload=False``); a script whose imports read per-rank variables must not be preloaded; timeouts,
failures and reaping must behave as for ranks forked directly. Megatron-Core's real startup through the server is
pinned against the generator in tests/test_framework_fidelity.py.
"""

from __future__ import annotations

import ctypes
import inspect
import mmap
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import communicate_or_kill, no_child_left_behind

pytest.importorskip("torch")

import torch
from torch.distributed import ProcessGroupNCCL
from torch.distributed import distributed_c10d as c10d

from simnccl import capture as cap
from simnccl.capture.heap import COLLAPSE_MIN_FORKS, _dense_anonymous_ranges, prepare_to_fork
from simnccl.capture.intercept import _BINDERS, _NEW_GROUP_KEYS, _call_args, _enter_new_group, _plain_args
from simnccl.capture.ranks import _frame, _Results
from simnccl.capture.recorder import _Recorder, built_calls, built_ops
from simnccl.capture.script import ScriptTarget
from simnccl.capture.values import _plain
from simnccl.ops import Checkpoint, NewGroup, PgOptions
from simnccl.tags import group_tags

pytestmark = pytest.mark.torch

# A module imported by the scripts below: it appends its importing process's pid to a file at import, so a test
# can count how many processes imported it.
COUNTED = """
import os
with open(os.environ["COUNT_FILE"], "a") as f:
    f.write(f"{os.getpid()}\\n")
TP = 2
"""

SCRIPT = """
\"\"\"A startup whose groups depend on its module's state and on the rank's environment.\"\"\"
from __future__ import annotations
import os
import torch.distributed as dist
import counted_{name}


def main() -> None:
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    tp = counted_{name}.TP
    for start in range(0, world, tp):
        dist.new_group(list(range(start, start + tp)), group_desc="tp")
    dist.new_group([int(os.environ["RANK"])], group_desc="self")


if __name__ == "__main__":
    main()
"""


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``script(name, module_source=COUNTED)``: a script importing ``counted_<name>`` (on sys.path), and the
    file that module appends its importers' pids to."""

    def make(name: str, module_source: str = COUNTED) -> tuple[Path, Path]:
        (tmp_path / f"counted_{name}.py").write_text(textwrap.dedent(module_source), encoding="utf-8")
        path = tmp_path / f"{name}.py"
        path.write_text(SCRIPT.replace("{name}", name), encoding="utf-8")
        count = tmp_path / f"{name}.count"
        count.write_text("", encoding="utf-8")
        monkeypatch.setenv("COUNT_FILE", str(count))
        return path, count

    monkeypatch.syspath_prepend(str(tmp_path))
    return make


def importers(count: Path) -> int:
    return len(count.read_text().split())


def test_a_script_is_imported_once_by_the_fork_server_and_captures_what_plain_forks_do(script) -> None:
    path, count = script("once")
    served = cap.capture(cap.script_target(None, str(path), []), 8)
    assert importers(count) == 1  # the fork server, not the ranks
    assert served.notes == ()
    plain = cap.capture(cap.script_target(None, str(path), [], preload=False), 8)
    assert importers(count) == 1 + 8  # every rank imported it itself
    assert [p.ops for p in served.programs] == [p.ops for p in plain.programs]
    assert served.calls == plain.calls
    assert [sum(isinstance(op, NewGroup) for op in p.ops) for p in served.programs] == [5] * 8
    assert [p.ops[-2].ranks for p in served.programs] == [(r,) for r in range(8)]  # each rank's own RANK


def test_exit_handlers_an_import_registers_run_in_every_rank_preloaded_or_not(script) -> None:
    """A module that registers an exit handler at import: a real process runs it at exit. Imported by the fork
    server, the handler was registered there, and no rank ran it; each rank importing the module itself did."""
    registers = COUNTED + (
        "import atexit\nimport torch.distributed as dist\n"
        'atexit.register(lambda: dist.new_group([0, 1], group_desc="at-exit"))\n'
    )
    path, count = script("atexit", registers)
    served = cap.capture(cap.script_target(None, str(path), []), 2)
    assert importers(count) == 1 and served.notes == ()  # preloaded
    plain = cap.capture(cap.script_target(None, str(path), [], preload=False), 2)
    assert [p.ops for p in served.programs] == [p.ops for p in plain.programs]
    assert all(any(getattr(op, "group_desc", None) == "at-exit" for op in p.ops) for p in served.programs)


def test_a_module_reading_rank_at_import_is_imported_by_every_rank(script) -> None:
    reads_rank = COUNTED + 'RANK_AT_IMPORT = int(os.environ.get("RANK", "-1"))\n'
    path, count = script("rankread", reads_rank)
    run = cap.capture(cap.script_target(None, str(path), []), 4)
    assert importers(count) == 1 + 4  # the server's import, thrown away; then each rank's, with its own RANK
    (note,) = run.notes
    assert "were not imported once for all ranks: importing 'counted_rankread' read RANK" in note
    plain = cap.capture(cap.script_target(None, str(path), [], preload=False), 4)
    assert [p.ops for p in run.programs] == [p.ops for p in plain.programs]


@pytest.mark.parametrize("copies", ["dict(os.environ)", "os.environ.copy()", "{k: v for k, v in os.environ.items()}"])
def test_a_module_keeping_a_copy_of_the_environment_is_imported_by_every_rank(script, copies: str) -> None:
    """The preload's copy lacks RANK: every rank would read the same default from it, where each rank importing
    the module itself reads its own (here: one group per rank, not one for all)."""
    keeps_copy = COUNTED + f'ENV = {copies}\nRANK_AT_IMPORT = int(ENV.get("RANK", "-1"))\n'
    path, count = script("envcopy", keeps_copy)
    path.write_text(path.read_text() + "dist.new_group([max(counted_envcopy.RANK_AT_IMPORT, 0)], group_desc='env')\n")
    run = cap.capture(cap.script_target(None, str(path), []), 2)
    (note,) = run.notes
    assert "importing 'counted_envcopy' kept a copy of the environment (counted_envcopy.ENV)" in note
    assert [[op.ranks for op in p.ops if isinstance(op, NewGroup)][-1] for p in run.programs] == [(0,), (1,)]
    assert importers(count) == 1 + 2


def test_a_module_scanning_the_environment_for_its_prefix_is_still_preloaded(script) -> None:
    scans = COUNTED + 'MINE = {k: v for k, v in os.environ.items() if k.startswith("MINE_")}\n'
    path, count = script("envscan", scans)
    run = cap.capture(cap.script_target(None, str(path), []), 2)
    assert run.notes == ()
    assert importers(count) == 1


def test_only_the_leading_imports_are_preloaded(tmp_path: Path) -> None:
    path = tmp_path / "lead.py"
    path.write_text(
        textwrap.dedent(
            '''
            """doc"""
            from __future__ import annotations
            import os, json
            try:
                import tomllib
            except ImportError:
                tomllib = None
            from collections import abc, OrderedDict
            from . import sibling

            def helper(x=1):
                return x

            import csv
            '''
        ),
        encoding="utf-8",
    )
    target = ScriptTarget(None, str(path))
    # the try block's handler assigns: not an import, so the leading imports end before it
    assert target.leading_imports() == ["os", "json"]
    path.write_text(
        "import os\ntry:\n    import tomllib\nexcept ImportError:\n    pass\ndef f(x=1): ...\nimport csv\n"
        "os.environ['X'] = '1'\nimport json\n",
        encoding="utf-8",
    )
    assert target.leading_imports() == ["os", "tomllib", "csv"]
    path.write_text("@decorated\ndef f(): ...\nimport csv\n", encoding="utf-8")
    assert target.leading_imports() == []
    path.write_text("from a.b import c, d\nfrom . import e\nimport f\n", encoding="utf-8")
    assert target.leading_imports() == ["a.b", "a.b:c", "a.b:d"]  # c, d: attributes, or else submodules


def test_a_module_target_preloads_its_parent_packages_and_its_leading_imports(tmp_path, monkeypatch) -> None:
    package = tmp_path / "pkg_lead"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "start.py").write_text("import json\nimport csv\nprint('hi')\nimport tomllib\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert ScriptTarget("pkg_lead.start", None).leading_imports() == ["pkg_lead", "json", "csv"]


def test_a_rank_of_a_served_script_past_its_timeout_is_killed_and_reaped(tmp_path: Path) -> None:
    path = tmp_path / "hangs.py"
    path.write_text("import time\nimport torch.distributed as dist\ndist.init_process_group('nccl')\ntime.sleep(60)\n")
    started = time.monotonic()
    with no_child_left_behind(), pytest.raises(cap.CaptureError, match=r"rank \d: no result within 1 s"):
        cap.capture(cap.script_target(None, str(path), []), 2, timeout_s=1)
    assert time.monotonic() - started < 15


def test_a_served_rank_that_raises_or_exits_nonzero_is_named(tmp_path: Path) -> None:
    path = tmp_path / "fails.py"
    path.write_text(
        "import sys\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "if dist.get_rank() == 1:\n    sys.exit(3)\n",
        encoding="utf-8",
    )
    failure = r"rank 1: the captured code exited with status 3"
    with no_child_left_behind(), pytest.raises(cap.CaptureError, match=failure):
        cap.capture(cap.script_target(None, str(path), []), 2)


def test_cli_jobs_below_one_is_bad_input(capsys: pytest.CaptureFixture) -> None:
    assert cap.main(["--world", "2", "--jobs", "0", "-m", "json.tool"]) == 2
    assert "jobs: expected an integer >= 1 (ranks run at a time), got 0" in capsys.readouterr().err


def test_cli_no_preload_captures_the_same(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "plain.py"
    path.write_text("import torch.distributed as dist\ndist.init_process_group('nccl')\ndist.new_group([0])\n")
    assert cap.main(["--world", "2", str(path)]) == 0
    served = capsys.readouterr().out
    assert cap.main(["--world", "2", "--no-preload", str(path)]) == 0
    plain = capsys.readouterr().out
    assert served.splitlines()[2:] == plain.splitlines()[2:]  # all but the timing line and settings line
    assert "1 new_group" in served


def test_a_served_rank_prints_and_its_output_goes_to_its_log(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Each rank's output goes to its log, shown under a failing rank's error; a print must neither fail (the
    fork server's stdout closing fd 1 under the rank) nor land in a file the rank opened."""
    path = tmp_path / "prints.py"
    other = tmp_path / "other.txt"
    path.write_text(
        "import sys\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        f"f = open({str(other)!r}, 'w')\n"
        "print('rank', dist.get_rank(), 'ready')\n"
        "if len(sys.argv) > 1 and dist.get_rank() == 1:\n    sys.exit(3)\n",
        encoding="utf-8",
    )
    assert cap.main(["--world", "2", str(path)]) == 0, capsys.readouterr().err
    assert "captured 2 ranks" in capsys.readouterr().out
    assert cap.main(["--world", "2", str(path), "fail"]) == 2
    err = capsys.readouterr().err
    assert "rank 1: the captured code exited with status 3" in err
    assert "rank 1 ready" in err  # the log's tail, under the error
    assert other.read_text() == ""


# ---------------------------------------------------------------------------------------------- recording fast path


@pytest.mark.parametrize(
    ("name", "args", "kwargs"),
    [
        ("new_group", (), {}),
        ("new_group", ([0, 1],), {"backend": "gloo"}),
        ("new_group", ([0, 1], timedelta(seconds=5), "nccl", None, True, "tp", None, False), {}),
        ("new_group", (), {"ranks": [1], "group_desc": "x", "sort_ranks": False}),
        ("split_group", (None, [[0, 1]]), {"group_desc": "s"}),
        ("init_process_group", ("nccl",), {"world_size": 2, "rank": 0}),
        ("destroy_process_group", (), {"group": None}),
    ],
)
def test_fast_binding_equals_signature_bind(name: str, args: tuple, kwargs: dict) -> None:
    bound = inspect.signature(getattr(c10d, name)).bind(*args, **kwargs)
    bound.apply_defaults()
    assert _BINDERS[name].bind(args, kwargs) == dict(bound.arguments)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [(([0],), {"ranks": [0]}), ((), {"no_such": 1}), (tuple(range(9)), {})],
)
def test_fast_binding_of_bad_arguments_raises_as_signature_bind_does(args: tuple, kwargs: dict) -> None:
    with pytest.raises(TypeError):
        inspect.signature(c10d.new_group).bind(*args, **kwargs)
    with pytest.raises(TypeError):
        _BINDERS["new_group"].bind(args, kwargs)


@pytest.mark.parametrize(
    "arguments",
    [
        {"ranks": [3, 1, 2], "timeout": timedelta(minutes=10), "backend": None, "group_desc": "TP", "sort_ranks": True},
        {"ranks": (0, 1), "timeout": 30, "backend": "gloo", "use_local_synchronization": True, "sort_ranks": False},
        {"ranks": None, "timeout": 1.5, "pg_options": None, "device_id": torch.device("cpu", 1)},
        {"ranks": range(2), "pg_options": ProcessGroupNCCL.Options(), "device_id": 0, "group_desc": None},
    ],
)
def test_new_groups_argument_fast_path_equals_the_general_conversion(arguments: dict) -> None:
    keys = _NEW_GROUP_KEYS
    general = {k: _plain(v) for k, v in _call_args(arguments, keys).items()}
    assert _plain_args(arguments, keys) == general
    assert list(_plain_args(arguments, keys)) == list(general)  # same order: the JSON lists them so


def test_a_new_group_recorded_compactly_builds_the_op_and_call_of_every_argument() -> None:
    """Every NewGroup field differs from its default and from the others, so a compact entry whose values were in
    another order than NewGroup's fields would build a different op."""
    arguments = _BINDERS["new_group"].bind(
        ([5, 3], timedelta(seconds=7), "gloo", ProcessGroupNCCL.Options(), True, "TP_GROUP", 2, True), {}
    )
    recorder = _Recorder(0, 0, False)
    with group_tags("tp", "p2p"):
        handle, _ = _enter_new_group(recorder, arguments)
    assert type(recorder.ops[-1]) is tuple  # kept compact until built
    (op,) = built_ops(recorder.ops)
    assert op == NewGroup(
        ranks=(3, 5),
        bind=handle,
        backend="gloo",
        pg_options=op.pg_options,
        use_local_synchronization=True,
        group_desc="TP_GROUP",
        device_id=2,
        timeout_s=7.0,
        purpose="tp",
        traffic="p2p",
    )
    assert handle == "TP_GROUP.1" and isinstance(op.pg_options, PgOptions)
    assert built_calls(recorder.calls) == (cap.Call("new_group", _plain_args(arguments, _NEW_GROUP_KEYS), handle),)


def test_compact_rank_results_are_built_once_and_equal_what_an_inline_rank_records() -> None:
    recorder = _Recorder(0, 0, False)
    _enter_new_group(recorder, _BINDERS["new_group"].bind(([0, 1],), {"group_desc": "tp"}))
    recorder.append(Checkpoint("end"))
    results = _Results()
    for rank in range(2):
        results.add(rank, _frame(cap.RankCapture(rank, tuple(recorder.ops), tuple(recorder.calls), ())))
    first, second = results.ranks[0], results.ranks[1]
    assert first.ops == built_ops(recorder.ops) and first.calls == built_calls(recorder.calls)
    assert isinstance(first.ops[0], NewGroup) and isinstance(first.calls[0], cap.Call)
    assert second.ops is first.ops and second.calls is first.calls


# ---------------------------------------------------------------------------------------------- shared results


def test_equal_rank_results_are_kept_once_and_failures_carry_their_message() -> None:
    ops = (NewGroup(ranks=(0, 1), bind="tp.1", pg_options=PgOptions(max_ctas=8, net_name="IB")), Checkpoint("end"))
    calls = (cap.Call("new_group", {"ranks": [0, 1]}, "tp.1"),)
    results = _Results()
    for rank in range(3):
        results.add(rank, _frame(cap.RankCapture(rank, ops, calls, ())))
    first, *others = (results.ranks[r] for r in range(3))
    assert first.ops == ops and first.calls == calls and [r.rank for r in (first, *others)] == [0, 1, 2]
    assert all(r.ops is first.ops and r.calls is first.calls for r in others)
    with pytest.raises(cap.CaptureError, match="rank 9: boom"):
        results.add(9, _frame("rank 9: boom"))


def test_json_lists_each_distinct_list_of_calls_once_with_its_ranks(script, tmp_path: Path) -> None:
    path, _ = script("calls_json")  # not json.py: beside itself, it would shadow the json torch imports
    data = cap.capture(cap.script_target(None, str(path), []), 4).to_json()
    assert [entry["ranks"] for entry in data["calls"]] == [[0], [1], [2], [3]]  # each new_group([RANK]) differs
    same = tmp_path / "same.py"
    same.write_text("import torch.distributed as dist\ndist.init_process_group('nccl')\ndist.new_group([0, 1])\n")
    for mode in ("fork", "inline"):
        data = cap.capture(cap.script_target(None, str(same), []), 4, mode=mode).to_json()
        (entry,) = data["calls"]
        assert entry["ranks"] == [0, 1, 2, 3]
        assert [c["call"] for c in entry["calls"]] == ["init_process_group", "new_group"]


def test_a_server_that_dies_while_importing_falls_back_and_the_ranks_report_it(tmp_path, monkeypatch) -> None:
    (tmp_path / "exits_at_import.py").write_text("import os\nos._exit(0)\n", encoding="utf-8")
    path = tmp_path / "dies.py"
    path.write_text("import exits_at_import\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    # jobs=1: rank 0 runs (and dies) before rank 1 starts, so the rank the error names does not depend on which
    # of two concurrent children the parent happens to see die first
    failure = r"rank 0: the capture process died without a result"
    with no_child_left_behind(), pytest.raises(cap.CaptureError, match=failure):
        cap.capture(cap.script_target(None, str(path), []), 2, jobs=1)


def test_from_import_of_an_attribute_never_imports_a_submodule_of_the_same_name(tmp_path, monkeypatch) -> None:
    package = tmp_path / "pkg_attr"
    package.mkdir()
    (package / "__init__.py").write_text("def thing():\n    return 3\n", encoding="utf-8")
    (package / "thing.py").write_text("", encoding="utf-8")  # importing it would rebind pkg_attr.thing
    path = tmp_path / "uses_attr.py"
    path.write_text(
        "from pkg_attr import thing\nimport torch.distributed as dist\n"
        "dist.init_process_group('nccl')\nfor _ in range(thing()):\n    dist.new_group([0])\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run = cap.capture(cap.script_target(None, str(path), []), 2)
    assert sum(isinstance(op, NewGroup) for op in run.programs[0].ops) == 3


def test_ctrl_c_during_a_served_capture_exits_130_and_leaves_no_rank_running(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    path = tmp_path / "waits.py"
    path.write_text(
        "import os, time\nimport torch.distributed as dist\n"
        f"with open({str(pids)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n"
        "dist.init_process_group('nccl')\ntime.sleep(60)\n",
        encoding="utf-8",
    )
    command = [sys.executable, "-m", "simnccl", "capture", "--world", "2", "--timeout", "100", str(path)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while (not pids.exists() or len(pids.read_text().split()) < 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    ranks = [int(p) for p in pids.read_text().split()]
    assert len(ranks) == 2  # both ranks run (each wrote its pid)
    proc.send_signal(signal.SIGINT)
    _, err = communicate_or_kill(proc, 60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    time.sleep(0.5)  # the ranks die with the fork server (PR_SET_PDEATHSIG) or by its SIGKILL
    assert [pid for pid in ranks if _alive(pid)] == []


def _alive(pid: int) -> bool:
    """Running (a zombie left to an init that does not reap is not running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# ------------------------------------------------------------------------------------- the fork source's memory

SMAPS = """\
00400000-00600000 r-xp 00000000 08:01 12 /usr/bin/python3
Rss:                2048 kB
01000000-01a00000 rw-p 00000000 00:00 0 [heap]
Rss:               10240 kB
7f0000100000-7f0000a00000 rw-p 00000000 00:00 0
Rss:                9000 kB
7f0001000000-7f0002000000 rw-p 00000000 00:00 0
Rss:                 100 kB
7f0003000000-7f0003400000 rw-p 00001000 08:01 13 /usr/lib/libtorch.so
Rss:                4096 kB
7f0004000000-7f0004400000 rw-s 00000000 00:01 14 /dev/zero (deleted)
Rss:                4096 kB
"""


def test_only_dense_private_anonymous_memory_is_collapsed_in_whole_huge_pages() -> None:
    huge = 2 << 20
    # the heap (dense) and the anonymous mapping at 0x7f0000100000 (9000 of 9216 KiB resident), trimmed to
    # whole 2 MiB pages; not the sparse anonymous reservation, the file's data or the shared mapping
    assert _dense_anonymous_ranges(SMAPS, huge) == [(0x01000000, 0x01A00000), (0x7F0000200000, 0x7F0000A00000)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_COLLAPSE is Linux's")
def test_collapsing_keeps_every_byte_and_maps_huge_pages_where_the_kernel_can() -> None:
    size = 8 << 20
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pattern = bytes(range(256)) * (size // 256)
    region.write(pattern)
    assert prepare_to_fork(COLLAPSE_MIN_FORKS - 1) == 0  # a small world: not worth the copy
    collapsed = prepare_to_fork(COLLAPSE_MIN_FORKS)
    assert region[:] == pattern  # the same memory, the same contents
    if not collapsed:
        pytest.skip("this kernel maps no transparent huge pages (THP off, or no MADV_COLLAPSE before 6.1)")
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    assert _huge_bytes_of(address, address + size) >= 2 << 20


def _huge_bytes_of(start: int, end: int) -> int:
    """AnonHugePages of the mapping holding [start, end) in this process's smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= start and end <= hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1]) * 1024
    return 0
