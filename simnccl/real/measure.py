"""Measurement on a rank (after each op) and the Result-shaped report built from every rank's records.

Per op, on the GPU lane (after ``torch.cuda.synchronize()``), for the device this process uses — never a device it
has not touched, since querying one creates a CUDA context there:

* ``used_mib`` = ``total - free`` from ``torch.cuda.mem_get_info`` (device-wide, what vLLM's check sees),
  minus ``baseline_mib``, the device's usage before this process touched it (NVML, when importable; else 0);
* ``reserved_mib`` = ``torch.cuda.memory_reserved`` (torch's caching allocator);
* ``non_torch_mib`` = ``used - reserved``: CUDA context + NCCL buffers (vLLM's ``non_torch_memory``);
* ``nvml_process_mib``: NVML per-process usage of this pid, when pynvml is importable and the driver reports it
  (often not in containers).

On the CPU lane only wall times and the process's resident memory are recorded; checkpoints carry no device
entries (gloo allocates no GPU memory).

``build_variant_result`` turns the rank records into the simulator's ``VariantResult.to_dict`` shape (verdict,
checkpoints with per-device ``used_mib``/``free_mib``, hangs with rank/op/group/seq/waiting_for, errors), plus
real-only keys (``lane``, ``substitutions``, ``ranks``: every op's start/end/outcome/measurement).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from simnccl.backends.gloo import FOREIGN_RANKS

MIB = 1024 * 1024

# How a failed op is classified (see ``classify``) and how kinds map to a verdict, as the simulator does.
ERROR_KINDS = ("error", "abort", "crash", "peer-lost")
FAIL_KINDS = ("oom", "check")
TIMEOUT_TEXTS = ("timed out", "timeout", "wait timeout")
PEER_LOST_TEXTS = ("connection reset by peer", "connection closed by peer", "broken pipe", "socket closed")
# An NCCL communicator's out-of-memory, as torch 2.15 raises it (the simulator's ``oom`` of a communicator): legacy
# ProcessGroupNCCL's C10D_NCCL_CHECK throws DistBackendError (NCCLUtils.hpp:76-85), nccl2/nccl-lazy throw
# NCCLException, a RuntimeError in Python (nccl2/ProcessGroupNCCL.hpp:79); both carry ncclGetErrorString of
# ncclUnhandledCudaError and NCCL's last error: its WARN for a failed device allocation (src/include/alloc.h:
# "Failed to CUDA calloc [async] N bytes", "Failed to CUDA malloc N bytes") or, from a direct CUDA call, "Cuda
# failure [2] 'out of memory'". Pinned host memory ("Failed to CUDA host alloc") is not the device's.
NCCL_ERROR_TYPES = ("DistBackendError", "RuntimeError")
NCCL_CUDA_ERROR_TEXT = "unhandled cuda error"
NCCL_OOM_TEXTS = ("failed to cuda calloc", "failed to cuda malloc", "'out of memory'")


def classify(exc: BaseException) -> str:
    """``timeout`` (a torch/gloo/store timeout: the rank was stuck), ``peer-lost`` (a peer process died under it),
    ``oom`` (a tensor's, or an NCCL communicator's: see ``is_nccl_oom``), or ``error``."""
    name = type(exc).__name__
    text = str(exc).lower()
    if name == "OutOfMemoryError" or is_nccl_oom(name, text):
        return "oom"
    if name == "DistStoreError" or any(t in text for t in TIMEOUT_TEXTS):
        return "timeout"
    if any(t in text for t in PEER_LOST_TEXTS):
        return "peer-lost"
    return "error"


def is_nccl_oom(type_name: str, text: str) -> bool:
    """Whether an exception of ``type_name`` with ``text`` (lower case) is an NCCL communicator's out-of-memory.

    Why not the type alone: torch 2.15 raises no OutOfMemoryError there, and DistBackendError/RuntimeError carry
    every NCCL failure; the simulator calls this case ``oom``, so labelling it ``error`` here made ``real compare``
    report a false mismatch on a GPU. Without NCCL's last error naming an allocation it stays ``error``: a CUDA
    failure that is not memory must not pass for the simulator's OOM."""
    return (
        type_name in NCCL_ERROR_TYPES
        and NCCL_CUDA_ERROR_TEXT in text
        and any(needle in text for needle in NCCL_OOM_TEXTS)
    )


def rss_mib() -> float | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
        return round(pages * os.sysconf("SC_PAGE_SIZE") / MIB, 3)
    except (OSError, ValueError, IndexError):
        return None


class Measurer:
    """Takes one measurement per op on this rank. ``gpu`` False: wall time and RSS only."""

    def __init__(self, gpu: bool, node: int = 0) -> None:
        self.gpu = gpu
        self.node = node
        self.baseline_mib: dict[int, float] = {}
        self._nvml: Any = None
        self._nvml_failed = False
        self.notes: list[str] = []

    # ------------------------------------------------------------------ NVML (optional)

    def _nvml_module(self) -> Any:
        if self._nvml is not None or self._nvml_failed:
            return self._nvml
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as err:  # not installed, or no driver access in this container
            self._nvml_failed = True
            self.notes.append(f"NVML unavailable ({type(err).__name__}): baseline 0, no per-process usage")
        return self._nvml

    def _nvml_handle(self, index: int) -> Any:
        nvml = self._nvml_module()
        if nvml is None:
            return None
        try:
            return nvml.nvmlDeviceGetHandleByIndex(_physical_index(index))
        except Exception:
            return None

    def note_baseline(self, index: int) -> None:
        """The device's used memory before this process creates a context on it (NVML; else 0)."""
        if not self.gpu or index in self.baseline_mib:
            return
        handle = self._nvml_handle(index)
        used = 0.0
        if handle is not None:
            try:
                used = self._nvml.nvmlDeviceGetMemoryInfo(handle).used / MIB
            except Exception:
                used = 0.0
        self.baseline_mib[index] = round(used, 3)

    def _nvml_process_mib(self, index: int) -> float | None:
        handle = self._nvml_handle(index)
        if handle is None:
            return None
        try:
            for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    return round(proc.usedGpuMemory / MIB, 3)
        except Exception:
            return None
        return None

    # ------------------------------------------------------------------ per op

    def device_index(self) -> int | None:
        """The CUDA device this process uses, only if CUDA is already initialised here."""
        if not self.gpu:
            return None
        import torch

        if not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.current_device())

    def measure(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": time.time(), "rss_mib": rss_mib()}
        index = self.device_index()
        if index is None:
            return out
        import torch

        torch.cuda.synchronize(index)
        free, total = torch.cuda.mem_get_info(index)
        reserved = torch.cuda.memory_reserved(index)
        baseline = self.baseline_mib.get(index, 0.0)
        used = (total - free) / MIB - baseline
        out["device"] = {
            "device": f"n{self.node}:cuda:{_physical_index(index)}",
            "index": index,
            "used_mib": round(used, 3),
            "free_mib": round(free / MIB, 3),
            "total_mib": round(total / MIB, 3),
            "baseline_mib": baseline,
            "reserved_mib": round(reserved / MIB, 3),
            "non_torch_mib": round(used - reserved / MIB, 3),
            "nvml_process_mib": self._nvml_process_mib(index),
        }
        return out


def _physical_index(index: int) -> int:
    """The physical GPU index under CUDA_VISIBLE_DEVICES (a plain integer list), else the index itself."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return index
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if index < len(parts) and parts[index].isdigit():
        return int(parts[index])
    return index


# ---------------------------------------------------------------------------------------------- the report


def verdict_of(errors: Sequence[Mapping[str, Any]], hangs: Sequence[Mapping[str, Any]]) -> str:
    """The simulator's rule: an error/abort/crash → error; an OOM or failed check → fail; a hang → hang."""
    kinds = {e["kind"] for e in errors}
    if kinds & set(ERROR_KINDS):
        return "error"
    if kinds & set(FAIL_KINDS):
        return "fail"
    if hangs:
        return "hang"
    return "pass"


def _members_waiting(rank: int, stuck_at: Mapping[int, Mapping[str, Any]], record: Mapping[str, Any]) -> list[int]:
    """Members of the group a stuck rank waits in that are not stuck in the same operation (where known)."""
    members = record.get("members")
    if not members:
        return []

    def key(rec: Mapping[str, Any]) -> tuple[Any, ...]:
        return (rec.get("group"), rec.get("seq"), rec.get("name"), tuple(rec.get("members") or ()))

    mine = key(record)
    return [r for r in members if r != rank and (r not in stuck_at or key(stuck_at[r]) != mine)]


def _rank_notes(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ranks' own notes (their drivers': an element type the data check could not read, NVML missing), each
    once with the ranks that wrote it, in the order first written: what a rank could not check or measure is the
    run's to say, not only its JSON's."""
    by_text: dict[str, list[int]] = {}
    for rank in ranks:
        for text in rank.get("notes") or ():
            by_text.setdefault(str(text), []).append(int(rank["rank"]))
    return [f"{'rank' if len(r) == 1 else 'ranks'} {', '.join(map(str, r))}: {text}" for text, r in by_text.items()]


OP_KIND = {
    "init_process_group": "bootstrap",
    "new_group": "bootstrap",
    "split_group": "split",
    "send": "p2p",
    "recv": "p2p",
}


def build_variant_result(
    *,
    name: str,
    description: str,
    lane: str,
    policy: str,
    env: Mapping[str, str],
    release: str,
    torch_version: str,
    rank_states: Sequence[Mapping[str, Any]],
    reason: str,
    started_at: float,
    substitutions: Sequence[str] = (),
    notes: Sequence[str] = (),
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Result-shaped dict of one real run. ``rank_states``: per rank, as ``launch`` collected them
    (``events``: start/end records; ``final``; ``exit_code``; ``killed``; ``log_tail``)."""
    hangs: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    checkpoints: dict[str, dict[str, dict[str, Any]]] = {}
    ranks_out = []
    stuck_at: dict[int, Mapping[str, Any]] = {}
    for state in rank_states:
        current = state.get("current")
        final = state.get("final") or {}
        if current is not None and (state.get("killed") or final.get("kind") == "timeout"):
            stuck_at[state["rank"]] = current
    decisions: list[Any] = []
    for state in rank_states:
        rank = state["rank"]
        final = state.get("final") or {}
        current = state.get("current")
        ops = state.get("ops", [])
        for op in ops:
            if op.get("name") == "checkpoint" and op.get("outcome") == "ok":
                device = (op.get("measure") or {}).get("device")
                label = op.get("label", "")
                per_device = checkpoints.setdefault(label, {})
                if device is not None:
                    per_device[device["device"]] = {
                        "device": device["device"],
                        "used_mib": device["used_mib"],
                        "free_mib": device["free_mib"],
                        "time_s": round(op["end"] - started_at, 3),
                        "rank": rank,
                        "reserved_mib": device["reserved_mib"],
                        "non_torch_mib": device["non_torch_mib"],
                        "baseline_mib": device["baseline_mib"],
                        "nvml_process_mib": device["nvml_process_mib"],
                    }
        if rank == 0 and final.get("decisions"):
            decisions = list(final["decisions"])
        status = "done"
        if final.get("status") == "error":
            kind = final.get("kind", "error")
            error = {
                "rank": rank,
                "kind": kind,
                "type": final.get("type", ""),
                "message": final.get("message", ""),
                "op": final.get("op", ""),
                "time_s": round(final.get("t", started_at) - started_at, 3),
            }
            if FOREIGN_RANKS in final:  # the data check's finding (``data_check``), as the simulator reports its own
                error[FOREIGN_RANKS] = list(final[FOREIGN_RANKS])
            errors.append(error)
            status = kind
        elif not final:
            code = state.get("exit_code")
            if state.get("killed") or code is None:
                status = "stuck"
            else:
                kind = "abort" if code < 0 else "crash"
                message = f"process exited with {'signal ' + str(-code) if code < 0 else 'code ' + str(code)}"
                tail = state.get("log_tail", "").strip()
                if tail:
                    message += ": " + tail.splitlines()[-1][:500]
                errors.append(
                    {
                        "rank": rank,
                        "kind": kind,
                        "type": "signal" if code < 0 else "exit",
                        "exit_code": code,  # real compare names the signal (SIGABRT) as the simulator does
                        "message": message,
                        "op": (current or {}).get("op", "<between ops>"),
                        "time_s": round(state.get("exit_t", time.time()) - started_at, 3),
                        "log_tail": tail[-2000:],
                    }
                )
                status = kind
        if status in ("stuck", "timeout"):
            record = current or {}
            if status == "stuck":
                watchdog = f"killed by the launcher ({reason})"
            else:
                watchdog = "torch/gloo timeout raised in the op"
            hangs.append(
                {
                    "rank": rank,
                    "op": record.get("op", "<between ops>"),
                    "op_index": record.get("i"),
                    "group": record.get("group") or record.get("handle") or "",
                    "handle": record.get("handle", ""),
                    # between ops: in no op, so of no kind (not a collective)
                    "kind": OP_KIND.get(record.get("name", ""), "collective") if record else "",
                    "seq": record.get("seq", 0),
                    "waiting_for": _members_waiting(rank, stuck_at, record),
                    "since_s": round(record.get("t", started_at) - started_at, 3),
                    "timeout_s": record.get("timeout_s"),
                    "detected_at_s": round(final.get("t", time.time()) - started_at, 3)
                    if status == "timeout"
                    else None,
                    "watchdog": watchdog,
                    "explanation": final.get("message", "") if status == "timeout" else "still in the op when killed",
                }
            )
        ranks_out.append(
            {
                "rank": rank,
                "status": status,
                "pid": state.get("pid"),
                "exit_code": state.get("exit_code"),
                "killed": bool(state.get("killed")),
                "notes": final.get("notes", []),
                "ops": ops,
            }
        )
    hangs.sort(key=lambda h: h["rank"])
    errors.sort(key=lambda e: e["rank"])
    end = max([started_at, *(s.get("exit_t", started_at) for s in rank_states)])
    return {
        "name": name,
        "description": description,
        "verdict": verdict_of(errors, hangs),
        "ok": True,
        "release": release,
        "torch_version": torch_version,
        "profile": "measured",
        "policy": policy,
        "env": dict(sorted(env.items())),
        "checkpoints": [
            {"name": label, "devices": [per[d] for d in sorted(per)]} for label, per in checkpoints.items()
        ],
        "devices": [],
        "groups": [],
        "hangs": hangs,
        "errors": errors,
        "expectations": [],
        "decisions": decisions,
        "event_count": sum(len(s.get("ops", [])) for s in rank_states),
        "trace_hash": None,
        "end_time_s": round(end - started_at, 3),
        # real-only keys
        "lane": lane,
        "substitutions": list(substitutions),
        "notes": [*notes, *_rank_notes(ranks_out)],
        "end_reason": reason,
        "settings": dict(settings or {}),
        "ranks": ranks_out,
    }
