"""Which algorithm a collective connects at first use: simnccl's documented rule, not NCCL's tuner.

Why a rule and not the tuner: NCCL picks an algorithm per call from a cost model of sizes, bandwidths and
latencies; what matters for memory is only *which* connections the first call of a kind makes. The rule
(thresholds in ``nccl_constants.toml`` [algorithm_rule], marked ASSUMPTION) is:

=================  ==========================================================================================
one rank           nothing: NCCL copies locally and connects nothing
all_reduce         NVLS when NVLS is active on one node; else across nodes TREE below 256 KiB, RING above;
                   else RING (``barrier`` is a one-element all_reduce)
all_gather,        PAT with one GPU per node below 1 MiB (NCCL's PAT condition), else RING
reduce_scatter
broadcast, reduce  RING
send, recv         point-to-point to ``peers`` peers (connIndex 1)
all_to_all         point-to-point to every other rank: the fan-out of NVIDIA/nccl#1685
=================  ==========================================================================================

``NCCL_ALGO`` narrows the choice: the first allowed algorithm of the preference list is used (e.g.
``NCCL_ALGO=Ring`` turns an NVLS all_reduce into a ring). CollNet is used for all_reduce when enabled
(``NCCL_COLLNET_ENABLE=1``) on two or more nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from simnccl.nccl.constants import NcclInputError, constants
from simnccl.nccl.knobs import NcclSettings
from simnccl.nccl.layout import Layout

COLLECTIVES = (
    "all_reduce",
    "barrier",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "send",
    "recv",
    "all_to_all",
)
P2P = "p2p"
_NCCL_FUNCTION = {
    "all_reduce": "allreduce",
    "barrier": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
}


@dataclass(frozen=True, slots=True)
class Use:
    """One kind of call on the communicator: ``nbytes`` per rank (None: small), ``peers`` for send/recv."""

    collective: str
    nbytes: int | None = None
    peers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise NcclInputError(
                f"use: unknown collective {self.collective!r}; expected one of {', '.join(COLLECTIVES)}"
            )
        if self.nbytes is not None and (isinstance(self.nbytes, bool) or self.nbytes < 0):
            raise NcclInputError(f"use.nbytes: expected a byte count >= 0, got {self.nbytes!r}")

    @property
    def label(self) -> str:
        return self.collective if self.nbytes is None else f"{self.collective} {self.nbytes} B"


def _preference(use: Use, layout: Layout, nvls_active: bool, collnet: bool) -> list[str]:
    c = constants()
    nbytes = c.integer("algorithm_rule.default_bytes") if use.nbytes is None else use.nbytes
    if use.collective in ("all_reduce", "barrier"):
        order = []
        if collnet and layout.nodes > 1:
            order.append("collnetdirect")
        if nvls_active and layout.nodes == 1:
            order.append("nvls")
        if layout.nodes > 1:
            small = nbytes < c.integer("algorithm_rule.tree_below_bytes")
            order += ["tree", "ring"] if small else ["ring", "tree"]
        else:
            order += ["ring", "tree"]
        return order
    if use.collective in ("all_gather", "reduce_scatter"):
        one_gpu_per_node = layout.max_local_ranks == 1 and layout.nodes > 1
        pat = one_gpu_per_node and nbytes < c.integer("algorithm_rule.pat_below_bytes")
        return ["pat", "ring"] if pat else ["ring"]
    return ["ring"]


def algorithm_for(use: Use, layout: Layout, settings: NcclSettings, *, nvls_active: bool) -> str | None:
    """The algorithm whose connections the first ``use`` makes; ``p2p`` for send/recv; None for one rank."""
    if layout.nranks == 1:
        return None
    if use.collective in ("send", "recv", "all_to_all"):
        return P2P
    order = _preference(use, layout, nvls_active, settings.collnet_enable)
    allowed = settings.algorithms_allowed(_NCCL_FUNCTION[use.collective])
    if allowed is not None:
        usable = [a for a in order if a in allowed] or [a for a in ("ring", "tree") if a in allowed]
        if not usable:
            raise NcclInputError(
                f"NCCL_ALGO allows none of the algorithms {use.collective} can use here ({', '.join(order)})"
            )
        order = usable
    return order[0]


def p2p_peers(use: Use, layout: Layout) -> tuple[int, ...]:
    """The peers a send/recv/all_to_all use connects to (default: the next rank)."""
    if use.collective == "all_to_all":
        return tuple(r for r in range(layout.nranks) if r != layout.rank)
    if use.peers is not None:
        bad = [p for p in use.peers if not 0 <= p < layout.nranks]
        if bad:
            raise NcclInputError(f"use.peers: ranks {bad} are outside 0..{layout.nranks - 1}")
        return tuple(use.peers)
    return ((layout.rank + 1) % layout.nranks,)
