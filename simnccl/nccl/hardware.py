"""The hardware a communicator runs on, as NCCL's memory mechanics see it.

Why its own module: NCCL sizes a communicator from its topology (how many NVLinks a GPU has, whether an
NVSwitch joins them, whether multicast is there, whether the NIC can DMA into GPU memory), not from the GPU's
name. These facts live beside the GPU kinds in ``simnccl/data/gpu_kinds.toml`` (``[<kind>.topology]``);
hardware that is not a simulated GPU kind (a validation point's RTX 3090) gives the same table inline.
"""

from __future__ import annotations

import functools
import importlib.resources
import tomllib
from dataclasses import dataclass, replace
from typing import Any, Literal

from simnccl.nccl.constants import NcclInputError, constants
from simnccl.table_keys import check_keys

Interconnect = Literal["nvswitch", "nvlink", "pcie"]
INTERCONNECTS: tuple[Interconnect, ...] = ("nvswitch", "nvlink", "pcie")

_REQUIRED = (
    "compute_capability",
    "interconnect",
    "nvlink_links",
    "multicast",
    "gdr",
    "nics_per_node",
    "nic_bw",
    "cpu_arm",
    "source",
)
_OPTIONAL = ("pcie_bw", "cumem_granularity_bytes")


@dataclass(frozen=True, slots=True)
class Topology:
    """One GPU's view of its node and network: what NCCL's topology search and transports depend on.

    ``interconnect``: ``nvswitch`` (every GPU of the node reaches every other through NVSwitches with
    ``nvlink_links`` links), ``nvlink`` (pairs bridged directly with ``nvlink_links`` links), ``pcie`` (no
    NVLink; ``pcie_bw`` GB/s as NCCL reports the link). ``multicast``: NVLS usable (NVSwitch multicast with
    fabric manager / IMEX). ``gdr``: the NICs can DMA into GPU memory (GPUDirect RDMA); without it network
    buffers live in pinned host memory. ``nic_bw`` in GB/s per NIC.
    """

    name: str
    compute_capability: int
    interconnect: Interconnect
    nvlink_links: int
    multicast: bool
    gdr: bool
    nics_per_node: int
    nic_bw: float
    cpu_arm: bool
    source: str
    pcie_bw: float = 0.0  # required for interconnect = "pcie"
    cumem_granularity_bytes: int = 0  # 0: the constant cumem.granularity_bytes

    def with_changes(self, **changes: Any) -> Topology:
        """A copy with some facts changed (a validation point's stated or assumed conditions)."""
        return replace(self, **changes)

    @property
    def granularity_bytes(self) -> int:
        return self.cumem_granularity_bytes or constants().integer("cumem.granularity_bytes")

    def nvlink_bw_per_link(self) -> float:
        """GB/s of one NVLink on this architecture (NCCL's ncclTopoNVLinkBw)."""
        c = constants()
        cc = self.compute_capability
        if cc >= 100:
            return c.number("channels.nvlink_bw_sm100")
        if cc >= 90:
            return c.number("channels.nvlink_bw_sm90")
        if cc == 86:
            return c.number("channels.nvlink_bw_sm86")
        return c.number("channels.nvlink_bw_sm80")

    def intra_bw(self) -> float:
        """GB/s one GPU has towards the other GPUs of its node, as NCCL's search budgets it."""
        if self.interconnect == "pcie" or self.nvlink_links == 0:
            return self.pcie_bw
        return self.nvlink_links * self.nvlink_bw_per_link()


def _int(where: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise NcclInputError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise NcclInputError(f"{where}: expected a positive number, got {value!r}")
    return float(value)


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise NcclInputError(f"{where}: expected true or false, got {value!r}")
    return value


def parse_topology(where: str, name: str, table: Any) -> Topology:
    """Validate one topology table; ``where`` names the file and table in errors."""
    # ``where`` already names the file: the keys are named after it (``t.toml: [x].speed``).
    check_keys(table, allowed=_OPTIONAL, required=_REQUIRED, file="", path=where, error=NcclInputError)
    interconnect = table["interconnect"]
    if interconnect not in INTERCONNECTS:
        raise NcclInputError(f"{where}.interconnect: expected one of {', '.join(INTERCONNECTS)}, got {interconnect!r}")
    source = table["source"]
    if not isinstance(source, str) or not source.strip():
        raise NcclInputError(f"{where}.source: expected a non-empty string")
    links = _int(f"{where}.nvlink_links", table["nvlink_links"], 0)
    if interconnect == "pcie" and "pcie_bw" not in table:
        raise NcclInputError(f"{where}.pcie_bw: required for interconnect 'pcie' (GB/s as NCCL reports the link)")
    if interconnect != "pcie" and links == 0:
        raise NcclInputError(f"{where}.nvlink_links: expected >= 1 for interconnect {interconnect!r}")
    return Topology(
        name=name,
        compute_capability=_int(f"{where}.compute_capability", table["compute_capability"], 30),
        interconnect=interconnect,
        nvlink_links=links,
        multicast=_bool(f"{where}.multicast", table["multicast"]),
        gdr=_bool(f"{where}.gdr", table["gdr"]),
        nics_per_node=_int(f"{where}.nics_per_node", table["nics_per_node"], 0),
        nic_bw=_number(f"{where}.nic_bw", table["nic_bw"]),
        cpu_arm=_bool(f"{where}.cpu_arm", table["cpu_arm"]),
        source=source.strip(),
        pcie_bw=_number(f"{where}.pcie_bw", table["pcie_bw"]) if "pcie_bw" in table else 0.0,
        cumem_granularity_bytes=_int(f"{where}.cumem_granularity_bytes", table.get("cumem_granularity_bytes", 0), 0),
    )


@functools.cache
def _kind_topologies() -> dict[str, Topology]:
    resource = importlib.resources.files("simnccl") / "data" / "gpu_kinds.toml"
    data = tomllib.loads(resource.read_text(encoding="utf-8"))
    return {
        key: parse_topology(f"{resource}: [{key}.topology]", key, table["topology"])
        for key, table in data.items()
        if isinstance(table, dict) and "topology" in table
    }


def topology_for(gpu_kind: str) -> Topology:
    """The topology of a simulated GPU kind (``simnccl/data/gpu_kinds.toml``)."""
    kinds = _kind_topologies()
    try:
        return kinds[gpu_kind]
    except KeyError:
        raise NcclInputError(
            f"GPU kind {gpu_kind!r} has no [topology] in gpu_kinds.toml; expected one of {', '.join(sorted(kinds))}"
        ) from None
