"""GPU kinds, nodes and devices: the hardware a scenario runs on.

Why a separate module: memory budgets (device total, CUDA context per process) belong to the hardware, not to
a torch release or an NCCL profile, and every layer (ledger, c10d model, workloads, vLLM-style startup checks)
asks the same questions: how many GPUs on a node, which node a rank lives on, how big a device is.

GPU kinds are data (``simnccl/data/gpu_kinds.toml``), each number with its source, so that nothing here is a
magic figure (DESIGN rule 4). The file is read once and validated field by field (rule 9).
"""

from __future__ import annotations

import functools
import importlib.resources
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from simnccl.table_keys import check_keys
from simnccl.visible_text import brief

BYTES_PER_MIB = 1024 * 1024

_KIND_FIELDS = ("display", "total_mib", "total_source", "cuda_context_mib", "cuda_context_source")
_OPTIONAL_KIND_FIELDS = ("topology",)  # NCCL's view of the hardware: read and validated by simnccl.nccl.hardware


class ClusterError(ValueError):
    """A bad cluster description or GPU-kind file (bad input, not a simulated failure)."""


def mib_to_bytes(mib: float) -> int:
    """Whole bytes for a MiB figure; the ledger counts bytes so sums stay exact."""
    return round(mib * BYTES_PER_MIB)


@dataclass(frozen=True, slots=True)
class GpuKind:
    """One GPU model: how much memory ``cudaMemGetInfo`` reports, and what a CUDA context costs on it."""

    key: str
    display: str
    total_mib: float
    cuda_context_mib: float
    source: str

    @property
    def total_bytes(self) -> int:
        return mib_to_bytes(self.total_mib)

    @property
    def cuda_context_bytes(self) -> int:
        return mib_to_bytes(self.cuda_context_mib)


def _gpu_kinds_resource() -> Any:
    return importlib.resources.files("simnccl") / "data" / "gpu_kinds.toml"


def _number(where: str, value: Any, *, positive: bool) -> float:
    # bool is an int subclass: `total_mib = true` must not read as 1.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ClusterError(f"{where}: expected a number of MiB, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ClusterError(f"{where}: expected a {'positive' if positive else 'non-negative'} number, got {value!r}")
    return float(value)


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ClusterError(f"{where}: expected a non-empty string, got {value!r}")
    return value.strip()


def _parse_kind(file: str, key: str, table: Any) -> GpuKind:
    where = f"{file}: [{key}]"
    check_keys(
        table, allowed=_OPTIONAL_KIND_FIELDS, required=_KIND_FIELDS, file=file, path=f"[{key}]", error=ClusterError
    )
    total = _number(f"{where}.total_mib", table["total_mib"], positive=True)
    context = _number(f"{where}.cuda_context_mib", table["cuda_context_mib"], positive=False)
    if context >= total:
        raise ClusterError(f"{where}.cuda_context_mib: expected less than total_mib ({total}), got {context}")
    total_source = _text(f"{where}.total_source", table["total_source"])
    context_source = _text(f"{where}.cuda_context_source", table["cuda_context_source"])
    return GpuKind(
        key=key,
        display=_text(f"{where}.display", table["display"]),
        total_mib=total,
        cuda_context_mib=context,
        source=f"total: {total_source}\nCUDA context: {context_source}",
    )


def parse_gpu_kinds(text: str, file: str) -> dict[str, GpuKind]:
    """Parse and validate a GPU-kinds TOML document; ``file`` names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ClusterError(f"{file}: not valid TOML: {exc}") from None
    if not data:
        raise ClusterError(f"{file}: expected at least one [gpu-kind] table, found none")
    return {key: _parse_kind(file, key, table) for key, table in data.items()}


@functools.cache
def _load_gpu_kinds() -> dict[str, GpuKind]:
    resource = _gpu_kinds_resource()
    return parse_gpu_kinds(resource.read_text(encoding="utf-8"), str(resource))


def gpu_kinds() -> dict[str, GpuKind]:
    """All GPU kinds, by key (a fresh dict each call: the cache behind it stays untouched)."""
    return dict(_load_gpu_kinds())


def get_gpu_kind(key: str) -> GpuKind:
    kinds = _load_gpu_kinds()
    try:
        return kinds[key]
    except KeyError:
        raise ClusterError(f"unknown GPU kind {brief(key)}; expected one of {', '.join(kinds)}") from None


def _check_int(owner: str, name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ClusterError(f"{owner}.{name}: expected an integer, got {value!r}")
    if value < minimum:
        raise ClusterError(f"{owner}.{name}: expected an integer >= {minimum}, got {value}")


@dataclass(frozen=True, slots=True, order=True)
class Device:
    """One GPU: ``index`` is the CUDA ordinal on its node (``cuda:{index}``)."""

    node: int
    index: int

    def __post_init__(self) -> None:
        _check_int("Device", "node", self.node, 0)
        _check_int("Device", "index", self.index, 0)

    @property
    def key(self) -> str:
        """Unique across the cluster; stable, so it can key ledgers and traces."""
        return f"n{self.node}:cuda:{self.index}"

    @property
    def label(self) -> str:
        return f"node{self.node}/cuda:{self.index}"

    def __str__(self) -> str:
        # What torch prints for the device inside one process (which node is not part of its name).
        return f"cuda:{self.index}"


@dataclass(frozen=True, slots=True)
class Cluster:
    """``nodes`` identical hosts, each with ``gpus_per_node`` GPUs of one kind and ``ranks_per_node`` ranks.

    Ranks are laid out node-major, as torchrun does: rank r lives on node ``r // ranks_per_node`` with local
    rank ``r % ranks_per_node``. ``ranks_per_node`` may differ from ``gpus_per_node`` (several processes per
    GPU, or a CPU-only host with ``gpus_per_node=0``); which GPU a rank uses is the program's choice.
    """

    gpu: GpuKind
    nodes: int
    gpus_per_node: int
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, GpuKind):
            raise ClusterError(f"Cluster.gpu: expected a GpuKind (see get_gpu_kind), got {self.gpu!r}")
        _check_int("Cluster", "nodes", self.nodes, 1)
        _check_int("Cluster", "gpus_per_node", self.gpus_per_node, 0)
        if self.ranks_per_node is None:
            if self.gpus_per_node == 0:
                raise ClusterError(
                    "Cluster.ranks_per_node: required when gpus_per_node is 0 (a CPU-only host has no GPU "
                    "count to default to)"
                )
            object.__setattr__(self, "ranks_per_node", self.gpus_per_node)
        _check_int("Cluster", "ranks_per_node", self.ranks_per_node, 1)

    @property
    def _ranks_per_node(self) -> int:
        assert self.ranks_per_node is not None  # set in __post_init__
        return self.ranks_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self._ranks_per_node

    @property
    def device_count(self) -> int:
        """GPUs per node: what ``torch.cuda.device_count()`` returns on any node."""
        return self.gpus_per_node

    @property
    def total_bytes(self) -> int:
        """Memory of one device, as ``cudaMemGetInfo`` reports its total."""
        return self.gpu.total_bytes

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ClusterError(f"rank {rank!r} out of range; expected 0 <= rank < {self.world_size}")

    def node_of(self, rank: int) -> int:
        self._check_rank(rank)
        return rank // self._ranks_per_node

    def nodes_of(self, ranks: Sequence[int]) -> list[int]:
        """``node_of`` of each of ``ranks``, checked once for the list: a group's members are counted per node
        once per group (pricing, NVLS), and checking rank by rank cost as much as making a member."""
        if ranks:
            if not all(type(r) is int for r in ranks):
                bad = next(r for r in ranks if type(r) is not int)
                self._check_rank(bad)  # raises (a bool, a float, ...) with the usual text
            low, high = min(ranks), max(ranks)
            if low < 0 or high >= self.world_size:
                self._check_rank(low if low < 0 else high)
        per_node = self._ranks_per_node
        return [r // per_node for r in ranks]

    def local_rank(self, rank: int) -> int:
        self._check_rank(rank)
        return rank % self._ranks_per_node

    def placements(self) -> list[tuple[int, int]]:
        """Every rank's (``node_of``, ``local_rank``), in rank order: one pass where a world's processes are made,
        not two checked calls per rank."""
        per_node = self._ranks_per_node
        return [divmod(rank, per_node) for rank in range(self.world_size)]

    def device(self, node: int, index: int) -> Device:
        if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < self.nodes:
            raise ClusterError(f"node {node!r} out of range; expected 0 <= node < {self.nodes}")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.gpus_per_node:
            raise ClusterError(
                f"device index {index!r} out of range on node {node}; expected 0 <= index < "
                f"{self.gpus_per_node} (torch.cuda.device_count())"
            )
        return Device(node, index)

    def devices(self) -> tuple[Device, ...]:
        """Every GPU, node by node, then by CUDA ordinal."""
        return tuple(Device(node, index) for node in range(self.nodes) for index in range(self.gpus_per_node))
