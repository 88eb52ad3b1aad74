"""The memory of the process every rank forks from (frozen for the collector, mapped with huge pages), and the
collector's pace in a forked rank.

Why: a capture forks one child per rank from a process holding torch and the framework (Megatron-Core: ~740 MiB
resident, ~410 MiB of it anonymous). ``fork`` copies a page-table entry for every resident anonymous page and the
child drops them all again at exit: ~35 ms of kernel time per rank (measured on this 2-core machine), ~18 s of
CPU for 512 ranks before a rank runs a line. Two things make that cheap:

* ``gc.freeze()`` (``frozen_heap``): the collector never walks the inherited objects, so it never writes to
  (and so never copies) their pages in a child.
* ``collapse_into_huge_pages``: Linux's ``madvise(MADV_COLLAPSE)`` (6.1+) remaps the process's densely resident
  anonymous memory as 2 MiB transparent huge pages, so ``fork`` copies one entry per 2 MiB instead of 512, and a
  child that writes to one (a reference count) splits that entry and copies its 4 KiB page, as before. It costs ~1 s
  of CPU once and saves ~25-40 ms per fork (fork, exit and the child's faults), so it is done only for worlds of at
  least ``COLLAPSE_MIN_FORKS`` ranks. Only mappings at least ``DENSE_FRACTION`` resident are collapsed (collapsing
  fills the holes of a 2 MiB range with zeros: a sparse reservation would grow). Nothing a program can observe
  changes: the same memory, the same contents, only the page size the kernel maps it with. Anywhere it is not
  available (not Linux, an older kernel, THP disabled) it does nothing.

A forked rank itself (``rank_collector``) collects cyclic garbage after ``RANK_GC_THRESHOLD`` tracked allocations
instead of CPython's 700. A rank lives for one startup (and step), and what it allocates mostly stays: its record
(a tuple, a dict and a list per ``new_group``) and the framework's rank lists. At the default pace the collector
ran 22 times in a Megatron rank of a 512-rank world, each younger-generation pass walking that growing record
again: 17-20 ms of a rank's 140 ms (measured with ``gc.callbacks`` in forked ranks). Garbage that only the
collector can free (reference cycles) is still freed, after more allocations.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
from collections.abc import Iterator
from pathlib import Path

RANK_GC_THRESHOLD = 100_000  # tracked allocations before a rank's collection (CPython's default: 700)
COLLAPSE_MIN_FORKS = 128  # ~1 s once vs ~25-40 ms saved per fork: a sure gain from about a hundred ranks
DENSE_FRACTION = 0.875  # a mapping at least this resident is collapsed; sparser ones would grow
MADV_COLLAPSE = 25  # <linux/mman.h>
_HUGE_PAGE_BYTES = 2 << 20  # x86-64 and arm64 (4 KiB base pages) PMD size; read from sysfs where it exists


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """``gc.freeze()`` around the forks: the collector never walks (and so never writes to) the objects the
    children inherit, so their pages stay shared instead of being copied into every child. Left alone when the
    process froze objects itself."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def rank_collector() -> None:
    """In a forked rank (never in the capturing process): collect cyclic garbage after ``RANK_GC_THRESHOLD``
    tracked allocations; the older generations' ratios stay."""
    gc.set_threshold(RANK_GC_THRESHOLD, *gc.get_threshold()[1:])


def prepare_to_fork(forks: int) -> int:
    """Before forking ``forks`` children from this process: collapse its memory when that pays (bytes
    collapsed, 0 when not done)."""
    if forks < COLLAPSE_MIN_FORKS:
        return 0
    return collapse_into_huge_pages()


def collapse_into_huge_pages() -> int:
    """Map this process's densely resident private anonymous memory with huge pages; returns the bytes collapsed
    (0 where the kernel cannot: every failure leaves the memory as it was)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
        huge = _huge_page_bytes()
        ranges = _dense_anonymous_ranges(Path("/proc/self/smaps").read_text(), huge)
    except (OSError, AttributeError, ValueError):
        return 0
    collapsed = 0
    for start, end in ranges:
        if madvise(start, end - start, MADV_COLLAPSE) == 0:  # failing (EINVAL, EAGAIN, ENOMEM) changes nothing
            collapsed += end - start
    return collapsed


def _huge_page_bytes() -> int:
    try:
        return int(Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return _HUGE_PAGE_BYTES


def _dense_anonymous_ranges(smaps: str, huge: int) -> list[tuple[int, int]]:
    """The huge-page-aligned part of every private anonymous read-write mapping (``[heap]`` included) at least
    ``DENSE_FRACTION`` resident, from the text of ``/proc/self/smaps``."""
    out: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    for line in smaps.splitlines():
        head, _, rest = line.partition(" ")
        if "-" in head and not head.endswith(":"):  # a mapping's first line: "start-end perms offset dev inode [path]"
            fields = rest.split()
            path = fields[4] if len(fields) > 4 else ""
            lo, hi = (int(x, 16) for x in head.split("-"))
            current = (lo, hi) if fields[0] == "rw-p" and path in ("", "[heap]") else None
        elif head == "Rss:" and current is not None:
            lo, hi = current
            start, end = -(-lo // huge) * huge, hi // huge * huge
            if end > start and int(rest.split()[0]) * 1024 >= DENSE_FRACTION * (hi - lo):
                out.append((start, end))
            current = None
    return out
