"""Two members of one NCCL communicator on one GPU: NCCL refuses the communicator at its init.

Why: a program that never calls ``torch.cuda.set_device`` runs every rank's legacy communicator on ``cuda:0``; a
``set_device(0)`` on every rank, or a wrong ``LOCAL_RANK`` -> GPU mapping (meta-pytorch/torchrec#4666: "Duplicate
GPU detected: rank 2 and rank 0 both on CUDA device 1b000"), does the same under any backend. The simulator let
such members share the GPU, charged both on it, and passed; real NCCL fails every such init.

What NCCL does (``src/init.cc`` ``initTransportsRank``, right after the bootstrap allgather of every member's peer
info, before it allocates anything), by version (``nccl_constants.toml`` ``versions.multi_rank_gpu_knob_since``):

* before 2.30.3: a member fails when another member has its host and bus id: WARN "Duplicate GPU detected : rank
  %d and rank %d both on CUDA device %lx" (itself, then the first such member, in communicator-rank order), and
  ``ncclInvalidUsage``. A member on a GPU of its own passes this check and goes on to the init's next bootstrap
  exchange, where it waits for the ones that failed; here it leaves its init and waits for them at its next
  call with them (the hang report names them). simnccl has no bus ids: the device's name stands in for one.
* 2.30.3 and later: every member fails when any two members share a host and a GPU: WARN "Multiple Ranks are
  using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration." and
  ``ncclInvalidUsage``, unless the member's ``NCCL_MULTI_RANK_GPU_ENABLE`` is non-zero (then they share it).

How torch reports it: legacy ``ProcessGroupNCCL`` raises ``DistBackendError`` with ``C10D_NCCL_CHECK``'s text (the
form every NCCL error of the legacy backend takes here); ``ProcessGroupNCCL2``'s ``NCCLBootstrap`` throws a
``std::runtime_error`` "Failed to initialize NCCL communicator: " + NCCL's error string (a RuntimeError in
Python; both texts are in the torch 2.15.0 wheel), and NCCL's WARN line follows as the last error, as in the
torchrec report (how torch joins the two there is not confirmed on a GPU).

Which inits are checked: every fresh NCCL bootstrap (a group's communicator, eager or at first use, and a
send/recv pair's). A split child is not: ``ncclCommSplit`` keeps each member on its parent's GPU, so a child's
members share a GPU only if its parent's did, and the parent's own init failed then.

Cost: nothing until a second rank makes a CUDA context on a device (``Memory.touch`` sets ``Memory.gpus_shared``);
a run where every rank has a GPU of its own never looks at a member list.
"""

from __future__ import annotations

from collections.abc import Mapping

from simnccl.c10d import TorchError
from simnccl.nccl import NcclInputError, NcclVersion
from simnccl.nccl.knobs import strtoll_prefix
from simnccl.release import Impl

WARN_DUPLICATE = "Duplicate GPU detected : rank {rank} and rank {other} both on CUDA device {device}"
WARN_MULTI_RANK = (
    "Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration."
)
INVALID_USAGE = "invalid usage (run with NCCL_DEBUG=WARN for details)"
LEGACY_TEXT = (
    "NCCL error in: ProcessGroupNCCL.cpp, {usage}, NCCL version {version}\n"
    "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n{warn}"
)
NCCL2_TEXT = "Failed to initialize NCCL communicator: {usage}\nNCCL Last Error: {warn}"
KNOB = "NCCL_MULTI_RANK_GPU_ENABLE"


def knob_enabled(env: Mapping[str, str]) -> bool:
    """``NCCL_MULTI_RANK_GPU_ENABLE`` as NCCL reads it (an int64 parameter, default 0; non-zero enables). A
    malformed value never reaches here: the env tables are checked against ``env_knobs.toml`` first."""
    raw = env.get(KNOB)
    if raw is None:
        return False
    try:
        return strtoll_prefix(str(raw))[0] != 0  # NCCL reads the leading integer and ignores the rest
    except ValueError:
        return False  # out of range: NCCL warns and keeps the default


class SharedGpus:
    """The check, for one run's NCCL version."""

    __slots__ = ("_last", "knob_era", "nccl_version")

    def __init__(self, nccl_version: str) -> None:
        self.nccl_version = nccl_version
        # the last bootstrap's member list, its GPUs, and the GPUs two or more of them hold (``_crowded``)
        self._last: tuple[tuple[int, ...], Mapping[int, str], dict[str, list[tuple[int, int]]]] | None = None
        try:
            self.knob_era = NcclVersion.parse(nccl_version).feature("multi_rank_gpu_knob_since")
        except NcclInputError:
            self.knob_era = True  # a version not stated (free text): the NCCL torch 2.15 ships

    def failure(
        self, rank: int, members: tuple[int, ...], devices: Mapping[int, str], env: Mapping[str, str], impl: Impl
    ) -> TorchError | None:
        """What ``rank``'s init of a communicator of ``members`` raises (None: nothing), ``devices`` giving each
        member's GPU (``n0:cuda:0``) as the bootstrap exchanged it."""
        mine = devices.get(rank)
        if mine is None:
            return None
        crowded = self._crowded(members, devices)
        if self.knob_era:
            if not crowded or knob_enabled(env):
                return None
            warn = WARN_MULTI_RANK
        else:
            sharing = crowded.get(mine)
            if sharing is None:
                return None
            me = next(position for position, r in sharing if r == rank)
            other = next(position for position, r in sharing if r != rank)
            warn = WARN_DUPLICATE.format(rank=me, other=other, device=mine)
        if impl is Impl.LEGACY:
            text = LEGACY_TEXT.format(usage=INVALID_USAGE, version=self.nccl_version, warn=warn)
            return TorchError("torch.distributed.DistBackendError", text)
        return TorchError("RuntimeError", NCCL2_TEXT.format(usage=INVALID_USAGE, warn=warn))

    def _crowded(self, members: tuple[int, ...], devices: Mapping[int, str]) -> dict[str, list[tuple[int, int]]]:
        """Each GPU two or more members hold, with their (communicator rank, global rank), in communicator-rank
        order. Counted once per bootstrap, not per member: every member asks, and counting the whole member list
        for each was quadratic in the communicator's size."""
        last = self._last
        if last is not None and last[0] is members and last[1] is devices:
            return last[2]
        by_gpu: dict[str, list[tuple[int, int]]] = {}
        for position, member in enumerate(members):
            gpu = devices.get(member)
            if gpu is not None:
                by_gpu.setdefault(gpu, []).append((position, member))
        crowded = {gpu: held for gpu, held in by_gpu.items() if len(held) > 1}
        self._last = (members, devices, crowded)
        return crowded
