"""Launch N rank processes for a scenario variant, watch them, and end every run with a verdict.

Local mode (``python -m simnccl.real run SCENARIO``): a zygote (``simnccl.real._zygote``) that imported torch
once forks the ranks; they rendezvous over a TCPStore a store host of the run holds (forked from the zygote too),
as torchrun's workers do over their agent's store. Each rank writes a progress record
*before* every op (``rank<N>.jsonl``), so when the run has to be stopped the report says where each rank was.

A run ends when every rank has reported its final record (done or failed; a rank that finished parks, keeping its
sockets open, so peers that still wait on it stay blocked as in the simulator), or when nothing has progressed for
``stall_s`` (a hang: on the CPU lane each op also carries a short torch timeout, so most hangs end as a gloo/store
timeout in the op first), or at the wall-clock ``timeout_s``. Then every rank still running is killed with its
process group (``killpg``), the parked ones are released, and all are reaped; ``run_programs`` checks that no rank
pid remains.

torchrun mode (``torchrun --nproc-per-node N -m simnccl.real run SCENARIO``, detected by ``RANK``/``WORLD_SIZE`` in the
environment): this process is one rank; the ranks coordinate over torchrun's store, a watchdog thread ends a rank
that passes the timeout (torchrun then stops the others), and rank 0 prints the report.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from simnccl.env_knobs import CHECKED_PREFIXES, env_problem
from simnccl.file_tail import tail_text
from simnccl.ops import Compute, Program
from simnccl.policy import UserPolicyError
from simnccl.real.lanes import LaneError, check_gpu_lane, comparability, cpu_programs, cpu_substitutions
from simnccl.real.measure import build_variant_result
from simnccl.real.programs import programs_to_lists
from simnccl.real.zygote import LaunchError, Zygote, kill_tree, pid_alive, signal_tree
from simnccl.scenario import Scenario, Variant

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RunSettings:
    """How a real run is executed and when it is declared over."""

    lane: str = "cpu"
    timeout_s: float = 60.0  # the whole run, wall clock
    # Passed to init_process_group/new_group/split_group (None: the op's own). The CPU default is a safety net
    # beyond the run's timeout: hangs are detected by the stall detector, which stops every rank at once. A short
    # torch timeout also works (the op fails with a gloo timeout, reported as a hang) but gloo then closes the
    # rank's sockets, and peers still waiting on it fail with "connection closed by peer" — a cascade that blurs
    # which ranks were really stuck.
    torch_timeout_s: float | None = 90.0
    # init_process_group's, when it must be longer than torch_timeout_s (the default group's timeout is also
    # its collectives' timeout, so a longer one slows hang detection on the world group)
    init_timeout_s: float | None = None
    stall_s: float = 5.0  # no progress from any rank for this long: a hang
    compute_scale: float = 0.0
    compute_cap_s: float = 2.0
    release_grace_s: float = 3.0
    startup_s: float = 60.0  # a rank that has not started its first op yet is not stalled before this
    keep_dir: bool = False
    max_ranks: int = 16

    @classmethod
    def for_lane(cls, lane: str, **overrides: Any) -> RunSettings:
        if lane == "gpu":
            base = cls(
                lane="gpu",
                timeout_s=300.0,
                torch_timeout_s=None,
                init_timeout_s=None,
                stall_s=120.0,
                compute_scale=0.01,
            )
        else:
            base = cls(lane="cpu")
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# Variables torch, NCCL or gloo read (the knob prefixes simnccl checks, and gloo's): a rank inherits them from the
# launcher's environment unless its variant sets them.
INHERITED_PREFIXES = (*CHECKED_PREFIXES, "GLOO_")
_INHERITED_SHOWN = 12  # names listed in the note (the rest counted); values cut to _INHERITED_VALUE_CHARS
_INHERITED_VALUE_CHARS = 60


def inherited_knobs(process_env: Mapping[str, str], variant_env: Mapping[str, str]) -> dict[str, str]:
    """The torch/NCCL/gloo variables the real ranks inherit from the launcher's environment that the variant
    does not set, by name.

    Why: a knob exported in the user's shell or GPU CI (``NCCL_BUFFSIZE``, ``TORCH_DIST_USE_NCCL2=0``) changes
    what the real ranks do, so a comparison's simulated side must run it too (``simulated_knobs``), or read its
    effect as the model's. Some are needed where the lane runs (``NCCL_SOCKET_IFNAME``), so they are kept, and
    said."""
    return {k: v for k, v in sorted(process_env.items()) if k.startswith(INHERITED_PREFIXES) and k not in variant_env}


def simulated_knobs(inherited: Mapping[str, str] | None) -> dict[str, str]:
    """The knobs of ``inherited`` the simulated side of a comparison runs too: those simnccl knows and whose value
    it can use (``env_problem``). Why: the real ranks run them all; a simulated side without them compares, or
    calibrates, a different configuration (the others are named by ``inherited_note``).

    A value is usable when ``env_problem`` finds none and NCCL's memory model, which prices every communicator
    under it, reads it (``settings_from``): an ``NCCL_BUFFSIZE=abc`` exported in the shell passed the first and
    stopped the simulated side with an internal error."""
    from simnccl.nccl import NcclInputError, settings_from

    usable: dict[str, str] = {}
    for name, value in (inherited or {}).items():
        if env_problem(name, value) is not None:
            continue
        try:
            settings_from({**usable, name: value})
        except NcclInputError:
            continue
        usable[name] = value
    return usable


def _listed(knobs: Mapping[str, str], values: bool = True) -> str:
    """``knobs`` as ``NAME=value`` (or names), bounded: _INHERITED_SHOWN of them, values cut, the rest counted."""
    shown = [
        f"{name}={value[:_INHERITED_VALUE_CHARS]}{'...' if len(value) > _INHERITED_VALUE_CHARS else ''}"
        if values
        else name
        for name, value in list(knobs.items())[:_INHERITED_SHOWN]
    ]
    more = len(knobs) - len(shown)
    return ", ".join(shown) + (f" (and {more} more)" if more else "")


def inherited_note(knobs: Mapping[str, str], simulated: Mapping[str, str] | None = None) -> str | None:
    """The report's line for ``inherited_knobs`` (None when there are none); bounded, whatever the environment.

    ``simulated``: the env a comparison's simulated side ran (None for a real run alone): the note then says
    which inherited knobs it ran too, and which it could not."""
    if not knobs:
        return None
    text = (
        f"the real ranks inherited {len(knobs)} torch/NCCL/gloo variable(s) from the launcher's environment that "
        f"the variant does not set: {_listed(knobs)}"
    )
    if simulated is None:
        return text
    without = {k: v for k, v in knobs.items() if simulated.get(k) != v}
    if not without:
        return f"{text}; the simulated side ran with them too"
    return (
        f"{text}; the simulated side ran without {_listed(without, values=False)} (a name simnccl does not know or "
        "a value it cannot use), so what they change is not compared"
    )


def check_local_world(world: int, settings: RunSettings) -> None:
    """Raise LaneError (exit 2) for a world this machine's launcher cannot run: one local process per rank, at
    most ``settings.max_ranks``. Asked before anything runs: ``real compare`` simulated a 65,536-rank scenario
    (17 GB, minutes) before its real side refused it."""
    if world > settings.max_ranks:
        raise LaneError(
            f"{world} ranks exceed the real tier's limit of {settings.max_ranks} local processes (one per rank, "
            f"on this machine): run a scenario with at most {settings.max_ranks} ranks here, or launch it under "
            "torchrun (`torchrun --nproc-per-node N -m simnccl.real run FILE`): one process per rank, across "
            "machines"
        )


def compute_problem(programs: Sequence[Program], settings: RunSettings, *, stall_watched: bool = True) -> str | None:
    """Why these settings would stop the run as hung while it only computes, or None.

    A ``compute`` op sleeps ``seconds x compute_scale``, capped at ``compute_cap_s`` (``Driver``). One sleep as
    long as ``stall_s`` (no progress from any rank) or a rank's sleeps adding up to ``timeout_s`` made the
    watcher kill a healthy run and report a hang (exit 1) that the program does not have. ``stall_watched``:
    whether the run is stopped on ``stall_s`` at all (torchrun mode watches ``timeout_s`` only).
    """
    scale, cap = settings.compute_scale, settings.compute_cap_s
    if scale <= 0:
        return None
    longest, busiest, busiest_rank = 0.0, 0.0, 0
    for rank, program in enumerate(programs):
        sleeps = [min(op.seconds * scale, cap) for op in program.ops if isinstance(op, Compute)]
        if sleeps:
            longest = max(longest, *sleeps)
            total = sum(sleeps)
            if total > busiest:
                busiest, busiest_rank = total, rank
    how = f"compute seconds x --compute-scale {scale:g}, each sleep capped at {cap:g} s"
    if stall_watched and longest >= settings.stall_s:
        return (
            f"a compute op sleeps {longest:g} s ({how}), not less than --stall {settings.stall_s:g} s: the run would "
            "be stopped as hung mid-sleep; raise --stall or lower --compute-scale"
        )
    if busiest >= settings.timeout_s:
        return (
            f"rank {busiest_rank}'s compute ops sleep {busiest:g} s in all ({how}), not less than --timeout "
            f"{settings.timeout_s:g} s: the run would be stopped as hung; raise --timeout or lower --compute-scale"
        )
    return None


def compute_notes(programs: Sequence[Program], settings: RunSettings) -> list[str]:
    """What the real ranks do not sleep of the programs' compute steps, said in the report. Why: on the CPU lane
    compute is not slept by default, and a comparison of a straggler scenario (a rank late past a timeout) said
    "sim hang | real pass" with nothing to tell that the real side never waited."""
    seconds = [op.seconds for program in programs for op in program.ops if isinstance(op, Compute)]
    if not any(s > 0 for s in seconds):
        return []
    scale, cap = settings.compute_scale, settings.compute_cap_s
    if scale <= 0:
        return [
            "compute steps were not slept (--compute-scale 0): the real ranks are never late, so what depends on "
            "a rank's lateness (a straggler past a timeout) is not compared; pass --compute-scale 1 for that"
        ]
    if scale != 1 or any(s * scale > cap for s in seconds):
        return [
            f"compute steps slept seconds x {scale:g} (--compute-scale), each at most {cap:g} s: "
            "timing that depends on a rank's lateness is compared at that scale, not the scenario's"
        ]
    return []


# ---------------------------------------------------------------------------------------------- one run


@dataclass
class RankWatch:
    rank: int
    progress: Path
    log: Path
    pid: int = 0
    offset: int = 0
    partial: str = ""
    ops: dict[int, dict[str, Any]] = field(default_factory=dict)
    current: dict[str, Any] | None = None
    final: dict[str, Any] | None = None
    killed: bool = False
    last_change: float = 0.0

    def poll(self) -> bool:
        """Read new progress records; True when something new arrived."""
        try:
            with open(self.progress, encoding="utf-8") as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return False
        if not chunk:
            return False
        text = self.partial + chunk
        lines = text.split("\n")
        self.partial = lines.pop()
        for line in lines:
            if not line.strip():
                continue
            record = json.loads(line)
            self._apply(record)
        self.last_change = time.time()
        return True

    def _apply(self, record: dict[str, Any]) -> None:
        event = record.get("e")
        if event == "start":
            entry = {k: v for k, v in record.items() if k != "e"}
            entry["start"] = entry.pop("t")
            self.ops[record["i"]] = entry
            self.current = record
        elif event == "end":
            entry = self.ops.setdefault(record["i"], {"i": record["i"]})
            entry["end"] = record.get("t")
            for key in ("outcome", "detail", "measure", "label"):
                if key in record:
                    entry[key] = record[key]
            if record.get("outcome") == "ok":
                self.current = None
        elif event == "final":
            self.final = record

    def log_tail(self) -> str:
        return tail_text(self.log, 4000)


# How long a store host may take to fork from the zygote, make its TCPStore and write the port (milliseconds
# when well; a loaded 2-core CI runner is given plenty).
STORE_HOST_START_S = 30.0


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (the kernel's pick): where a spawn launcher's rank 0
    hosts its store. Another process could take it before rank 0 binds it; torch then fails the init saying so
    (an error of the run, never a pass)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Launcher:
    """Runs worlds of rank processes locally; reuse one for many runs (the zygote starts once)."""

    def __init__(self, work_dir: str | Path | None = None) -> None:
        self._own_dir = work_dir is None
        self.work_dir = Path(tempfile.mkdtemp(prefix="real-")) if work_dir is None else Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._zygote: Zygote | None = None
        self._runs = 0
        self._keep = False  # a run asked to keep its files: the work folder survives close()
        self._lock = threading.Lock()
        self.all_pids: list[int] = []  # every rank process it started
        self.store_host_pids: list[int] = []  # every run's store host (``_host_store``)

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def zygote(self) -> Zygote:
        if self._zygote is None or self._zygote.proc.poll() is not None:
            orphaned = self.work_dir if self._own_dir and not self._keep else None  # ours to remove if we are killed
            self._zygote = Zygote(self.work_dir, remove_when_orphaned=orphaned)
        return self._zygote

    def inherited_env(self, variant_env: Mapping[str, str] | None = None) -> dict[str, str]:
        """``inherited_knobs`` of the ranks this launcher forks (its zygote's environment, which is fixed when the
        zygote starts: a later change to this process's environment reaches no rank)."""
        with self._lock:
            zygote = self.zygote
        return inherited_knobs(zygote.env, variant_env or {})

    @property
    def zygote_pid(self) -> int | None:
        return None if self._zygote is None else self._zygote.proc.pid

    def close(self) -> None:
        """Stop the zygote and remove the work folder: the folder also when the stop is interrupted (a second
        Ctrl-C while the first one's cleanup waits for the zygote left $TMPDIR/real-*/run0001 behind)."""
        try:
            if self._zygote is not None:
                self._zygote.close()
        finally:
            self._zygote = None
            if self._own_dir and not self._keep:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def run_programs(
        self,
        programs: Sequence[Program],
        settings: RunSettings,
        *,
        policy: str = "torch-default",
        gpu: str | None = None,
        profile: str | None = None,
        env: Mapping[str, str] | None = None,
        set_launcher_env: bool = True,
        store_per_init: bool = False,
        name: str = "run",
        description: str = "",
        release: str = "",
        substitutions: Sequence[str] = (),
        notes: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Run one world (one rank per program) to a verdict; the Result-shaped dict of it.

        ``gpu``, ``profile``: the simnccl GPU kind and profile file each rank hands ``apply`` (``rank_gpu``).
        ``store_per_init``: each init_process_group rendezvous over a store of its own that rank 0 hosts and its
        destroy drops (a spawn launcher's ``tcp://``), not one store kept for the whole run (torchrun's agent
        store). Why: a re-init under spawn was compared against the kept store's old keys, and disagreed with a
        simulator that models spawn right."""
        world = len(programs)
        check_local_world(world, settings)
        problem = compute_problem(programs, settings)
        if problem is not None:  # the run would be stopped as hung by its own settings: exit 2, not a hang (1)
            raise LaneError(problem)
        if settings.lane == "gpu":
            check_gpu_lane(world)
        with self._lock:
            self._runs += 1
            number = self._runs
            zygote = self.zygote
            if settings.keep_dir and not self._keep:  # kept even if this process is killed mid-run
                self._keep = True
                zygote.keep_files()
        inherited = inherited_knobs(zygote.env, env or {})
        note = inherited_note(inherited)
        notes = [*notes, note] if note else notes
        run_dir = self.work_dir / f"run{number:04d}"
        run_dir.mkdir(parents=True, exist_ok=True)
        release_file = run_dir / "release"
        lists = programs_to_lists(programs)
        watches = [RankWatch(r, run_dir / f"rank{r}.jsonl", run_dir / f"rank{r}.log") for r in range(world)]
        host_pid = None
        if store_per_init:
            store = {"kind": "per-init", "host": "127.0.0.1", "port": free_port(), "timeout_s": settings.timeout_s}
        else:
            host_pid, port = self._host_store(zygote, run_dir, release_file, settings, tag=f"{number}:store")
            store = {"kind": "agent", "host": "127.0.0.1", "port": port, "timeout_s": settings.timeout_s}
        started = time.time()
        for rank, watch in enumerate(watches):
            spec = {
                "rank": rank,
                "world_size": world,
                "program": lists[rank],
                "lane": settings.lane,
                "policy": policy,
                "gpu": gpu,
                "profile": profile,
                "env": dict(env or {}),
                "local_rank": rank,
                "local_world_size": world,
                "node": 0,
                "set_launcher_env": set_launcher_env,
                "store": store,
                "torch_timeout_s": settings.torch_timeout_s,
                "init_timeout_s": settings.init_timeout_s,
                "compute_scale": settings.compute_scale,
                "compute_cap_s": settings.compute_cap_s,
                "progress": str(watch.progress),
                "release_file": str(release_file),
                "park_max_s": settings.timeout_s + 30.0,
            }
            watch.pid = zygote.spawn(spec, watch.log, tag=f"{number}:{rank}")
            watch.last_change = time.time()
            self.all_pids.append(watch.pid)
        reason = self._watch(watches, zygote, settings, started)
        self._finish(watches, zygote, settings, release_file)
        if host_pid is not None:
            self._stop_store_host(zygote, host_pid)
        states = []
        for watch in watches:
            watch.poll()
            exit_info = zygote.exit_of(watch.pid)
            states.append(
                {
                    "rank": watch.rank,
                    "pid": watch.pid,
                    "ops": [watch.ops[i] for i in sorted(watch.ops)],
                    "current": watch.current,
                    "final": watch.final,
                    "killed": watch.killed,
                    "exit_code": None if exit_info is None else exit_info[0],
                    "exit_t": time.time() if exit_info is None else exit_info[1],
                    "log_tail": watch.log_tail() if watch.final is None or watch.final.get("status") != "done" else "",
                }
            )
        result = build_variant_result(
            name=name,
            description=description,
            lane=settings.lane,
            policy=policy,
            env=dict(env or {}),
            release=release,
            torch_version=installed_torch_version(),
            rank_states=states,
            reason=reason,
            started_at=started,
            substitutions=substitutions,
            notes=notes,
            settings=settings.to_dict(),
        )
        result["wall_s"] = round(time.time() - started, 3)
        result["inherited_env"] = inherited
        if settings.keep_dir:
            result["run_dir"] = str(run_dir)
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
        return result

    def _host_store(
        self, zygote: Zygote, run_dir: Path, release_file: Path, settings: RunSettings, tag: str
    ) -> tuple[int, int]:
        """Start the run's store host (``driver.store_host_main``: the TCPStore torchrun's agent would hold) and
        wait for its port; its pid and the port. It leaves when ``release_file`` appears, as parked ranks do."""
        port_file = run_dir / "store.port"
        spec = {
            "store_host": {
                "host": "127.0.0.1",
                "timeout_s": settings.timeout_s,
                "port_file": str(port_file),
                "release_file": str(release_file),
                "park_max_s": settings.timeout_s + 60.0,
            }
        }
        log = run_dir / "store.log"
        pid = zygote.spawn(spec, log, tag=tag)
        self.store_host_pids.append(pid)
        deadline = time.monotonic() + STORE_HOST_START_S
        while not port_file.exists():
            if zygote.exit_of(pid) is not None or time.monotonic() > deadline:
                kill_tree(pid)
                raise LaunchError(
                    f"the run's store host (pid {pid}) gave no port within {STORE_HOST_START_S:g} s; its log:\n"
                    f"{tail_text(log, 4000)}"
                )
            time.sleep(0.01)
        return pid, int(port_file.read_text(encoding="utf-8"))

    @staticmethod
    def _stop_store_host(zygote: Zygote, pid: int) -> None:
        """The store host leaves on the run's ``release_file``, once the ranks are gone; killed if it has not."""
        if not zygote.wait_exits([pid], 5.0):
            kill_tree(pid)
            zygote.wait_exits([pid], 10.0)

    def _watch(self, watches: list[RankWatch], zygote: Zygote, settings: RunSettings, started: float) -> str:
        deadline = started + settings.timeout_s
        while True:
            now = time.time()
            for watch in watches:
                watch.poll()
            if _all_ended(watches, zygote):
                return "finished"
            if zygote.proc.poll() is not None and zygote.drained():
                if _all_ended(watches, zygote):  # its last reports came in while it exited
                    return "finished"
                # Its ranks die with it (PR_SET_PDEATHSIG), and nobody reports their exits: waiting on would end
                # the run as a hang it never had. The launcher failed, not the program (exit 70, not 1).
                _stop_orphans([w.pid for w in watches if zygote.exit_of(w.pid) is None])  # parked ones too
                raise LaunchError(
                    f"the rank zygote (pid {zygote.proc.pid}) exited with code {zygote.proc.returncode} during the "
                    f"run, and its ranks with it; see {zygote.log_path}:\n{zygote.log_tail()}"
                )
            last = max(max(w.last_change for w in watches), max((e[1] for e in _exits(zygote, watches)), default=0))
            starting = any(not w.ops and w.final is None for w in watches) and now - started < settings.startup_s
            if now - last > settings.stall_s and not starting:
                return f"no progress for {settings.stall_s:g}s"
            if now > deadline:
                return f"wall-clock timeout of {settings.timeout_s:g}s"
            time.sleep(0.02)

    def _finish(self, watches: list[RankWatch], zygote: Zygote, settings: RunSettings, release_file: Path) -> None:
        """Kill what still runs, release what parked, reap all; no rank pid may survive.

        Every rank still running is frozen (SIGSTOP) before any is killed: a killed rank's gloo sockets close,
        and a peer still waiting on it would fail with "Connection closed by peer" and report an error the run
        never had (on a loaded machine the next kill came late enough for it to write that record). A frozen rank
        that had already written its final record is let go on; the others are killed where they stood.
        """
        running = [w for w in watches if w.final is None and zygote.exit_of(w.pid) is None]
        for watch in running:
            signal_tree(watch.pid, signal.SIGSTOP)
        for watch in running:
            watch.poll()
            if watch.final is None:
                watch.killed = True
                kill_tree(watch.pid)
            else:
                signal_tree(watch.pid, signal.SIGCONT)
        release_file.touch()
        pids = [w.pid for w in watches]
        if not zygote.wait_exits(pids, settings.release_grace_s):
            for watch in watches:
                if zygote.exit_of(watch.pid) is None:
                    kill_tree(watch.pid)
            zygote.wait_exits(pids, 10.0)
        # A rank the zygote reaped is gone, whatever now runs under its pid (pids are reused: pid_max can be
        # 32,768), so only the ones it has not reported are checked, and killed.
        survivors = [p for p in pids if zygote.exit_of(p) is None and pid_alive(p)]
        if survivors:
            for pid in survivors:
                kill_tree(pid)
            time.sleep(0.2)
            survivors = [p for p in pids if zygote.exit_of(p) is None and pid_alive(p)]
            if survivors:
                raise LaunchError(f"rank processes {survivors} survived SIGKILL")


def _stop_orphans(pids: list[int], grace_s: float = 5.0) -> None:
    """Ranks whose zygote died: let their ``PR_SET_PDEATHSIG`` take them, then SIGKILL any left (no rank pid may
    outlive its run)."""
    deadline = time.monotonic() + grace_s
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in pids:
        if pid_alive(pid):
            kill_tree(pid)


def _all_ended(watches: list[RankWatch], zygote: Zygote) -> bool:
    """Whether every rank has written its final record or been reported exited."""
    return all(w.final is not None or zygote.exit_of(w.pid) is not None for w in watches)


def _exits(zygote: Zygote, watches: list[RankWatch]) -> list[tuple[int, float]]:
    return [e for e in (zygote.exit_of(w.pid) for w in watches) if e is not None]


_USER_POLICY_ERROR = f"{UserPolicyError.__module__}.{UserPolicyError.__name__}"  # as a rank's final record names it


def raise_user_policy_error(result: Mapping[str, Any]) -> None:
    """Raise the first rank's ``UserPolicyError`` of a real run's result, if a rank ended in one.

    Why: a user's policy that raises (or answers no plan) is a defect of the user's input, which ``simnccl run``
    reports as exit 2 naming the policy, the hook and the exception; on the real lanes it ended only the ranks,
    and the run was a real "error" (exit 1, a failed check) for a program that never ran as written."""
    for error in result.get("errors", []):
        if error.get("type") == _USER_POLICY_ERROR:
            raise UserPolicyError(str(error.get("message", "")))


def installed_torch_version() -> str:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # pragma: no cover
        return "unknown"


def installed_release() -> str | None:
    """The simnccl release key of the installed torch (without importing torch)."""
    text = installed_torch_version()
    parts = text.split(".")
    try:
        key = (int(parts[0]), int(parts[1]))
    except (ValueError, IndexError):
        return None
    return {(2, 14): "2.14", (2, 15): "2.15", (2, 16): "2.16-dev"}.get(key)


# ---------------------------------------------------------------------------------------------- scenarios


def lane_programs(
    scenario: Scenario, lane: str, settings: RunSettings | None = None
) -> tuple[tuple[Program, ...], list[str], list[str]]:
    """(programs, substitutions, notes) a lane runs for a scenario; with ``settings``, the notes say what of
    the compute steps the real ranks do not sleep (``compute_notes``)."""
    notes: list[str] = compute_notes(scenario.programs, settings) if settings is not None else []
    faults = getattr(scenario, "faults", None)
    if faults is not None and getattr(faults, "faults", None):
        notes.append("faults: the scenario's [faults] are not injected on the real lanes (simulated only)")
    if lane == "cpu":
        return (
            cpu_programs(scenario.programs),
            cpu_substitutions(scenario.programs),
            notes + comparability(scenario.programs),
        )
    return tuple(scenario.programs), [], notes


def variant_notes(variant: Variant) -> list[str]:
    installed = installed_release()
    if installed is not None and variant.release != installed:
        return [f"variant release {variant.release}: the real run uses the installed torch {installed_torch_version()}"]
    return []


def rank_gpu(variant: Variant, lane: str) -> tuple[str | None, str | None, list[str]]:
    """The GPU kind and the profile file a lane's ranks hand ``apply(policy, gpu=..., profile=...)``, and a note
    where they can be given none.

    Why: ``budget(X)`` prices each eager NCCL group from a profile, as the simulation prices it from the variant's;
    the GPU lane's ranks applied their policy without one, so ``budget(X)`` raised PolicyError at the first eager
    group, a real "error" where the simulation passed. They get the variant's own profile (a calibrated one
    too: priced by the kind's built-in one they could decide otherwise), as a file path, None where it is the
    kind's built-in one for the installed torch. The CPU lane creates no NCCL group (the policy's plans are
    rewritten to gloo): nothing to price there. Where no profile covers the installed torch ``apply`` would
    refuse every policy, so nothing is given and the note says why ``budget(X)`` cannot decide."""
    if lane != "gpu":
        return None, None, []
    from simnccl.profiles import ProfileError, find_profile

    profile = variant.profile
    kind = profile.gpu
    release = installed_release()
    if release is None:
        return kind, None, []  # a torch simnccl does not model: apply() names it
    try:
        builtin = find_profile(kind, release)
    except ProfileError as err:
        builtin = None
        problem = str(err)
    if builtin is not None and builtin == profile:
        return kind, None, []
    if release in profile.releases and os.path.isfile(profile.path):
        return kind, os.path.abspath(profile.path), []
    if builtin is None:
        return (
            None,
            None,
            [f"the real ranks cannot price an eager group for budget(X) (apply(gpu={kind!r})): {problem}"],
        )
    note = f"profile {profile.name!r} does not cover the installed torch {release}: the real ranks price budget(X)"
    return kind, None, [f"{note} by {builtin.name!r}"]


def run_variant_real(
    launcher: Launcher,
    scenario: Scenario,
    variant: Variant,
    programs: Sequence[Program],
    settings: RunSettings,
    substitutions: Sequence[str],
    notes: Sequence[str],
) -> dict[str, Any]:
    """One variant's world on real torch (its policy, GPU kind and profile, env), the Result-shaped dict; a
    user policy that raised on the real ranks is raised again here (``raise_user_policy_error``)."""
    gpu, profile, gpu_notes = rank_gpu(variant, settings.lane)
    result = launcher.run_programs(
        programs,
        settings,
        policy=variant.policy,
        gpu=gpu,
        profile=profile,
        env=variant.env,
        set_launcher_env=scenario.launcher == "torchrun",
        store_per_init=scenario.launcher == "spawn",
        name=variant.name,
        description=variant.description,
        release=variant.release,
        substitutions=substitutions,
        notes=[*notes, *variant_notes(variant), *gpu_notes],
    )
    raise_user_policy_error(result)
    return result


def run_scenario_real(
    scenario: Scenario,
    settings: RunSettings,
    variants: Sequence[str] | None = None,
    launcher: Launcher | None = None,
) -> dict[str, Any]:
    """Every chosen variant of a scenario on real torch; the ScenarioResult-shaped dict."""
    chosen = [scenario.variant(n) for n in variants] if variants else list(scenario.variants)
    programs, substitutions, notes = lane_programs(scenario, settings.lane, settings)
    own = launcher is None
    launcher = launcher or Launcher()
    try:
        results = [
            run_variant_real(launcher, scenario, variant, programs, settings, substitutions, notes)
            for variant in chosen
        ]
    finally:
        if own:
            launcher.close()
    return run_document(scenario, settings.lane, results)


def run_document(scenario: Scenario, lane: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """The report of a real run (schema ``SCHEMA_VERSION``), whichever launcher ran its ranks."""
    return {
        "schema": SCHEMA_VERSION,
        "scenario": scenario.name,
        "source": scenario.source,
        "seed": scenario.seed,
        "lane": lane,
        "ok": True,
        "variants": results,
    }
