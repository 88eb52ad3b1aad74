"""``simnccl capture`` speed and memory on Megatron-Core's real startup: CLI and Python API, 8 to 512 ranks.

Run: ``python benchmarks/capture.py [--worlds 8 64 512] [--modes cli api] [--jobs N]`` (needs torch and
megatron-core 0.19.2, as tests/test_framework_fidelity.py pins).

Why: issue 12 asks that Megatron TP8·PP4·DP16 (512 ranks, ~2,900 ``new_group`` calls per rank) be captured in
<= 60 s on a 2-core machine with <= 2 GB of memory. Each measurement is one fresh process tree:

* ``cli``: ``python -m simnccl capture --world W tests/megatron_train.py --tp T --pp P --json FILE`` (the fork
  server imports Megatron once; every rank forks from it);
* ``api``: a Python process that imports Megatron, then calls ``simnccl.capture.capture`` on
  tests/framework_startups.py's ``megatron_startup`` (ranks fork from that process).

Figures per run: wall seconds from start to exit (the import of torch and Megatron included), CPU seconds of the
whole tree (user + system, children included), the peak of the tree's memory — as PSS (proportional set size:
a page shared by N processes counts 1/N to each, so the sum is the memory the tree really holds) and as the plain
sum of RSS (counts every shared page once per process; an upper bound) — the size of the
``--json`` document (cli), and the load average while it ran (the machine is shared: wall time moves with it, CPU
time much less; a run past ``--limit-s``, default 600 s, is killed and reported with rc -9). Layouts: 8 ranks
TP2·PP2·DP2, 64 ranks TP8·PP4·DP2, 512 ranks TP8·PP4·DP16; others TP8·PP4 when they divide the world, else TP2·PP2.

The LAST line is exactly ``capture_megatron512_cli_s=<x> api_s=<y> peak_pss_mib=<z>`` (the largest world
measured; missing figures are ``nan``).

The sampler must not slow what it measures. RSS comes from ``/proc/PID/statm`` (a counter: ~0.05 ms) every
0.2 s. PSS needs ``/proc/PID/smaps_rollup``, which walks the page tables of a process holding torch (~27 ms each,
and it holds the process' mmap lock, which a ``fork`` of that process waits for): sampled every 0.2 s it took
about a fifth of a core and made the 512-rank capture ~17 s slower (81 s against 64 s, API, idle). So PSS is
sampled only as often as keeps the sampler's own CPU under ``SAMPLER_SHARE`` of one core; the figures line gives
the sampler's CPU seconds and how many PSS samples were taken. The tree's memory is a plateau (the fork server
and ``--jobs`` short-lived ranks), so the sparser PSS samples still see its peak.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "megatron_train.py"
SAMPLE_S = 0.2
SAMPLER_SHARE = 0.02  # of one core: the most the PSS samples may take (see the docstring)
LIMIT_S = 600


@dataclass(frozen=True)
class Figures:
    world: int
    mode: str
    rc: int
    wall_s: float
    cpu_s: float
    peak_pss_mib: float
    peak_rss_sum_mib: float
    json_mib: float
    load: float
    programs: str
    sampler_cpu_s: float
    pss_samples: int

    def line(self) -> str:
        return (
            f"megatron world={self.world} mode={self.mode} rc={self.rc} wall_s={self.wall_s:.1f} "
            f"cpu_s={self.cpu_s:.1f} peak_pss_mib={self.peak_pss_mib:.0f} "
            f"peak_rss_sum_mib={self.peak_rss_sum_mib:.0f} json_mib={self.json_mib:.2f} load={self.load:.1f} "
            f"sampler_cpu_s={self.sampler_cpu_s:.2f} pss_samples={self.pss_samples} {self.programs}"
        )


def layout(world: int) -> tuple[int, int]:
    """(tp, pp) for a world: TP8·PP4 where it divides the world, else TP2·PP2 (8 ranks: TP2·PP2·DP2)."""
    if world % 32 == 0:
        return 8, 4
    if world % 4 == 0:
        return 2, 2
    raise SystemExit(f"--worlds: {world} is not a multiple of 4 (TP2·PP2 at least)")


def tree(pid: int) -> list[int]:
    """``pid`` and every descendant (Linux ``/proc``)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo.extend(int(p) for p in (task / "children").read_text().split())
            except (OSError, ValueError):
                continue
    return out


PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def rss_kib(pid: int) -> int:
    """Resident set of one process in KiB from ``statm`` (cheap), 0 when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KIB
    except (OSError, ValueError, IndexError):
        return 0


def pss_kib(pid: int) -> int:
    """Proportional set size of one process in KiB from ``smaps_rollup`` (a page-table walk), 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return 0
    return 0


class Sampler:
    """Peak RSS sum every call; peak PSS sum only when the PSS samples so far leave the sampler under
    ``SAMPLER_SHARE`` of one core (see the module docstring)."""

    def __init__(self) -> None:
        self.peak_pss = self.peak_rss = self.pss_samples = 0
        self.pss_cpu = 0.0
        self.started = time.monotonic()

    def sample(self, root: int) -> None:
        pids = tree(root)
        self.peak_rss = max(self.peak_rss, sum(rss_kib(p) for p in pids))
        elapsed = time.monotonic() - self.started
        if self.pss_samples and self.pss_cpu > SAMPLER_SHARE * elapsed:
            return
        cpu_start = time.process_time()
        self.peak_pss = max(self.peak_pss, sum(pss_kib(p) for p in pids))
        self.pss_cpu += time.process_time() - cpu_start
        self.pss_samples += 1


def measure(world: int, mode: str, jobs: int | None, limit_s: float = LIMIT_S) -> Figures:
    tp, pp = layout(world)
    with tempfile.TemporaryDirectory(prefix="simnccl-bench-") as folder:
        out = Path(folder) / "captured.json"
        if mode == "cli":
            command = [sys.executable, "-m", "simnccl", "capture", "--world", str(world)]
            command += [] if jobs is None else ["--jobs", str(jobs)]
            command += ["--json", str(out), str(SCRIPT), "--tp", str(tp), "--pp", str(pp)]
        else:
            command = [sys.executable, __file__, "--api-child", str(world), str(tp), str(pp), str(out)]
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        if jobs is not None:
            env["SIMNCCL_BENCH_JOBS"] = str(jobs)
        before = os.times()
        sampler_cpu_start = time.process_time()
        started = time.monotonic()
        load_start = os.getloadavg()[0]
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        sampler = Sampler()
        while proc.poll() is None:
            sampler.sample(proc.pid)
            if time.monotonic() - started > limit_s:
                proc.kill()
            time.sleep(SAMPLE_S)
        sampler_cpu_s = time.process_time() - sampler_cpu_start
        _, err = proc.communicate()
        wall_s = time.monotonic() - started
        after = os.times()
        cpu_s = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        load = (load_start + os.getloadavg()[0]) / 2
        json_mib = out.stat().st_size / 2**20 if out.exists() else math.nan
        programs = _programs(out) if out.exists() else err.decode(errors="replace").strip().splitlines()[-1:]
    return Figures(
        world,
        mode,
        proc.returncode,
        wall_s,
        cpu_s,
        sampler.peak_pss / 1024,
        sampler.peak_rss / 1024,
        json_mib,
        load,
        str(programs),
        sampler_cpu_s,
        sampler.pss_samples,
    )


def _programs(path: Path) -> str:
    document = json.loads(path.read_text())
    capture = document["results"][0]["capture"] if "results" in document else document
    ops = [len(p["ops"]) for p in capture["programs"]]
    return f"distinct_programs={len(ops)} ops_per_rank={max(ops)}"


def api_child(world: int, tp: int, pp: int, out: str) -> int:
    """The ``api`` measurement: import Megatron here, capture, write the run's JSON (as the CLI would)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import framework_startups
    from megatron.core import parallel_state  # noqa: F401 - imported once, here, before the ranks fork

    from simnccl.capture import capture

    jobs = int(os.environ["SIMNCCL_BENCH_JOBS"]) if "SIMNCCL_BENCH_JOBS" in os.environ else None
    run = capture(functools.partial(framework_startups.megatron_startup, {"tp": tp, "pp": pp}), world, jobs=jobs)
    Path(out).write_text(json.dumps(run.to_json()), encoding="utf-8")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--modes", nargs="+", choices=("cli", "api"), default=["cli", "api"])
    parser.add_argument("--jobs", type=int, default=None, help="ranks at a time (default: the CPU count)")
    parser.add_argument(
        "--limit-s", type=float, default=LIMIT_S, help=f"kill a run after this many seconds (default {LIMIT_S})"
    )
    parser.add_argument("--api-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.api_child:
        world, tp, pp, out = args.api_child
        return api_child(int(world), int(tp), int(pp), out)
    print(f"# {os.cpu_count()} CPUs; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    results: dict[tuple[int, str], Figures] = {}
    for world in args.worlds:
        for mode in args.modes:
            figures = measure(world, mode, args.jobs, args.limit_s)
            results[(world, mode)] = figures
            print(figures.line(), flush=True)
    largest = max(args.worlds)
    cli, api = results.get((largest, "cli")), results.get((largest, "api"))
    peak = max((f.peak_pss_mib for (w, _), f in results.items() if w == largest), default=math.nan)
    print(
        f"capture_megatron{largest}_cli_s={cli.wall_s if cli else math.nan:.1f} "
        f"api_s={api.wall_s if api else math.nan:.1f} peak_pss_mib={peak:.0f}"
    )
    return 0 if all(f.rc == 0 for f in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
