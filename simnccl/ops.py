"""The program vocabulary: one frozen dataclass per torch.distributed call a startup makes.

Why data and not code: a rank's program must be generated (hypothesis), shrunk, serialised, diffed,
shared between ranks (DESIGN rule 8: identical programs are one object) and replayed on real torch by the
real tier. So an op holds only what torch would receive as arguments, spelled as torch spells them.

Groups are referred to by *handle*: a name the program binds when it creates a group (like the Python
variable a framework assigns ``new_group(...)`` to). ``"world"`` is the default group. A rank that is not a
member of a group it created still gets the handle bound, to ``NON_GROUP_MEMBER``, exactly as torch returns
``GroupMember.NON_GROUP_MEMBER``; a collective on such a handle is a no-op with torch's warning.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from simnccl import dtypes

WORLD = "world"

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Op:
    """Base of every op. ``name`` is the torch.distributed function this op mirrors."""

    name: ClassVar[str] = "op"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.name}
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = _plain(value)
        return out

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "op")
        return f"{self.name}({args})"


def _plain(value: Any) -> Any:
    if isinstance(value, PgOptions):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class PgOptions:
    """Every field of torch's ``ProcessGroupNCCL.Options`` (and its ``NCCLConfig``, ``.config``) a caller sets.

    Spelled as torch spells them, so a Program says exactly what torch received (capture records every field;
    nothing is dropped). ``None`` means "not set": torch leaves an NCCLConfig field at
    ``NCCL_CONFIG_UNDEF_INT`` (or ``None`` for strings) and NCCL picks its default or reads its env var.

    Only ``MODELLED_OPTION_FIELDS`` change what the simulator does today; ``unmodelled()`` names the others a
    program sets (``max_ctas``, ``min_ctas``, ``nvls_ctas``, ``collnet_enable`` and ``split_share`` reach the NCCL
    memory model, ``simnccl.comm_memory``).
    Fields torch fills in itself (``backend``, ``group_name``, ``global_ranks_in_group``, ``split_color``,
    ``split_from``, ``_timeout``: the group's ``timeout`` argument) are not options a caller chooses.
    """

    # ProcessGroupNCCL.Options
    lazy_init: bool = False
    split_share: bool | None = None  # .config.split_share (NCCL_COMM_SPLIT_SHARE_RESOURCES)
    is_high_priority_stream: bool = False
    enable_reconfigure: bool = False
    use_pg_for_symm_mem_rendezvous: bool = False
    # ProcessGroupNCCL.NCCLConfig (Options.config), as in ncclConfig_t
    blocking: int | None = None
    cga_cluster_size: int | None = None
    collnet_enable: int | None = None
    comm_name: str | None = None
    cta_policy: int | None = None
    max_ctas: int | None = None
    max_p2p_peers: int | None = None
    min_ctas: int | None = None
    net_name: str | None = None
    nvls_ctas: int | None = None
    traffic_class: int | None = None

    def __post_init__(self) -> None:
        """Each field set is of the type torch's field holds (``check_option``). Why here: a policy or a test that
        builds ``PgOptions(lazy_init="False")`` was simulated as lazy (any non-empty text is true), where torch's
        pybind field refuses the text."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not f.default and value != f.default:
                check_option(f.name, value)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PgOptions:
        """The inverse of ``to_dict``; an unknown field or a value of the wrong type raises ValueError."""
        if not data:
            return NO_OPTIONS
        return cls(**{key: check_option(key, value) for key, value in data.items()})

    def unmodelled(self) -> tuple[str, ...]:
        """The fields this object sets that the simulator does not use yet (recorded, replayed, not priced)."""
        return tuple(k for k in self.to_dict() if k not in MODELLED_OPTION_FIELDS)


# What the simulator reads today (simnccl.c10d: lazy_init decides eager vs lazy; the NCCL memory model,
# through simnccl.comm_memory: split_share, max_ctas, min_ctas, nvls_ctas, collnet_enable). Add a field here
# when a model starts using it.
MODELLED_OPTION_FIELDS = ("lazy_init", "split_share", "max_ctas", "min_ctas", "nvls_ctas", "collnet_enable")
# Fields that live on ``Options.config`` (torch's NCCLConfig) rather than on the Options object itself.
NCCL_CONFIG_FIELDS = (
    "split_share",
    "blocking",
    "cga_cluster_size",
    "collnet_enable",
    "comm_name",
    "cta_policy",
    "max_ctas",
    "max_p2p_peers",
    "min_ctas",
    "net_name",
    "nvls_ctas",
    "traffic_class",
)
_OPTION_KINDS: dict[str, type] = {
    "lazy_init": bool,
    "split_share": bool,
    "is_high_priority_stream": bool,
    "enable_reconfigure": bool,
    "use_pg_for_symm_mem_rendezvous": bool,
    "comm_name": str,
    "net_name": str,
}
OPTION_FIELDS = tuple(f.name for f in fields(PgOptions))
BOOL_OPTION_FIELDS = tuple(name for name, kind in _OPTION_KINDS.items() if kind is bool)


def check_option(key: str, value: Any) -> Any:
    """``value`` when it is what PgOptions field ``key`` holds (bool, int or str), else ValueError saying so."""
    if key not in OPTION_FIELDS:
        raise ValueError(f"unknown pg_options field {key!r}; expected one of {', '.join(OPTION_FIELDS)}")
    kind = _OPTION_KINDS.get(key, int)
    # The exact type (a bool is no integer here): a subclass's own ``__eq__`` would make options that differ
    # compare equal in the members-agree check (``GroupDecision.key``).
    if type(value) is not kind:
        text = {bool: "a boolean", int: "an integer", str: "a string"}[kind]
        raise ValueError(f"{key}: expected {text}, got {type(value).__name__} {value!r}")
    return value


NO_OPTIONS = PgOptions()


@dataclass(frozen=True, slots=True)
class SetDevice(Op):
    """``torch.cuda.set_device(index)``; ``None`` means the process's LOCAL_RANK. Creates the CUDA context."""

    name: ClassVar[str] = "set_device"
    device: int | None = None


@dataclass(frozen=True, slots=True)
class InitProcessGroup(Op):
    """``init_process_group(backend, device_id=..., timeout=..., pg_options=...)``."""

    name: ClassVar[str] = "init_process_group"
    backend: str | None = "nccl"
    device_id: int | str | None = None
    timeout_s: float | None = None
    pg_options: PgOptions = NO_OPTIONS


@dataclass(frozen=True, slots=True)
class NewGroup(Op):
    """``new_group(ranks, backend=..., pg_options=..., use_local_synchronization=..., group_desc=...)``.

    ``bind`` is the handle the program stores the result under; ``purpose`` is a free tag (tp, pp, dp …)
    that policies may use and reports print.
    """

    name: ClassVar[str] = "new_group"
    ranks: tuple[int, ...] | None = None
    bind: str | None = None
    backend: str | None = None
    pg_options: PgOptions = NO_OPTIONS
    use_local_synchronization: bool = False
    group_desc: str | None = None
    device_id: int | None = None
    timeout_s: float | None = None
    purpose: str | None = None
    traffic: str | None = None  # "collectives" | "p2p" | "none": what the program will do on it (for policies)


@dataclass(frozen=True, slots=True)
class SplitGroup(Op):
    """``split_group(parent_pg, split_ranks, pg_options=..., group_desc=...)``; split_ranks are parent ranks."""

    name: ClassVar[str] = "split_group"
    split_ranks: tuple[tuple[int, ...], ...] = ()
    parent: str = WORLD
    bind: str | None = None
    pg_options: PgOptions = NO_OPTIONS
    group_desc: str | None = None
    timeout_s: float | None = None
    purpose: str | None = None
    traffic: str | None = None


@dataclass(frozen=True, slots=True)
class Collective(Op):
    """A collective on a group handle, with the bytes of its input tensor (what torch checks for size)."""

    name: ClassVar[str] = "collective"
    group: str = WORLD
    size_bytes: int = 4 * MIB
    dtype: str = dtypes.DEFAULT

    def __post_init__(self) -> None:
        _check_dtype(self)


# The torch call a collective stands for where it is not the op's own (``call``): the simulator runs it as its op
# (same members, bytes and memory), and members whose calls or roots differ do not run one collective. Why: a
# capture recorded ``reduce(dst=rank)`` as an all_reduce and ``scatter`` as a broadcast, so ranks naming different
# roots, or mixing reduce with all_reduce, passed where real gloo hangs (found by a tester: 3 runs of 3 each).
CALLS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("reduce",),
    "all_gather": ("gather",),
    "broadcast": ("scatter",),
    "barrier": ("monitored_barrier",),
}
ROOTED_CALLS = ("reduce", "gather")  # calls that name their root in ``root`` (scatter's is the op's ``src``)
PADDED = -1  # a padded gather's size in its meeting's payload (``AllGather.padded``): the members' largest


def _check_called(op: Any) -> None:
    """``__post_init__`` of the collectives that may stand for another torch call: its dtype, call and root."""
    _check_dtype(op)
    root = getattr(op, "root", None)
    if op.call or root is not None:
        _check_call(op, op.call, root)


def _check_call(op: Collective, call: str, root: int | None) -> None:
    allowed = CALLS[op.name]
    if call and call not in allowed:
        raise ValueError(f"{op.name}: call: expected one of {', '.join(allowed)} (or none), got {call!r}")
    if call in ROOTED_CALLS:
        if type(root) is not int or root < 0:
            raise ValueError(f"{op.name}: root: {call} needs its root, a global rank >= 0, got {root!r}")
    elif root is not None:
        raise ValueError(f"{op.name}: root: only a call of {', '.join(ROOTED_CALLS)} names one, got {root!r}")


@dataclass(frozen=True, slots=True)
class AllReduce(Collective):
    """``call="reduce"`` with ``root`` (its ``dst``): torch's ``reduce``, run as an all_reduce."""

    name: ClassVar[str] = "all_reduce"
    call: str = ""
    root: int | None = None

    __post_init__ = _check_called


@dataclass(frozen=True, slots=True)
class Broadcast(Collective):
    """``call="scatter"``: torch's ``scatter`` from ``src``, run as a broadcast."""

    name: ClassVar[str] = "broadcast"
    src: int = 0
    call: str = ""

    __post_init__ = _check_called


@dataclass(frozen=True, slots=True)
class AllGather(Collective):
    """``call="gather"`` with ``root`` (its ``dst``): torch's ``gather``, run as an all_gather. ``padded``: the
    pickled objects of ``all_gather_object``/``gather_object``, each rank's padded by torch to the members' largest
    (so members may record different sizes and still run one gather; ``size_bytes`` is this rank's own)."""

    name: ClassVar[str] = "all_gather"
    call: str = ""
    root: int | None = None
    padded: bool = False

    def __post_init__(self) -> None:
        _check_called(self)
        if type(self.padded) is not bool:
            raise ValueError(f"all_gather: padded: expected true or false, got {self.padded!r}")
        if self.padded and self.dtype != "Byte":
            # What pads is torch's object gather, whose tensors are bytes: a padded Float gather would be a tensor
            # gather of unequal sizes, which gloo aborts and the simulation would have let pass.
            raise ValueError(
                "all_gather: padded: only the pickled objects of all_gather_object/gather_object are padded, "
                f'and they are bytes (dtype "Byte"), got dtype {self.dtype!r}'
            )


@dataclass(frozen=True, slots=True)
class ReduceScatter(Collective):
    name: ClassVar[str] = "reduce_scatter"


@dataclass(frozen=True, slots=True)
class AllToAll(Collective):
    name: ClassVar[str] = "all_to_all"


@dataclass(frozen=True, slots=True)
class Barrier(Collective):
    """``call="monitored_barrier"``: torch's ``monitored_barrier`` (gloo: rank 0 hears from every rank), run as a
    barrier, waiting ``timeout_s`` (its ``timeout``; None: torch's default for the group's backend, 30 minutes for
    gloo), not the group's timeout."""

    name: ClassVar[str] = "barrier"
    size_bytes: int = 4
    call: str = ""
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        _check_called(self)
        if self.timeout_s is not None and self.call != "monitored_barrier":
            raise ValueError(f"barrier: timeout_s: only a monitored_barrier has one, got {self.timeout_s!r}")


@dataclass(frozen=True, slots=True)
class PointToPoint(Op):
    """An unbatched ``send``/``recv``; ``peer`` is a global rank, as in torch."""

    name: ClassVar[str] = "p2p"
    peer: int = -1  # required: -1 is "not given" and is rejected, so describe() always shows the peer
    group: str = WORLD
    size_bytes: int = 4 * MIB
    dtype: str = dtypes.DEFAULT
    # torch's ``tag``: gloo matches a recv to a send by it (one with another tag never completes) and refuses a
    # negative one on the rank (``Collectives.op_p2p``); NCCL ignores it
    tag: int = 0

    def __post_init__(self) -> None:
        _check_dtype(self)
        if self.tag and (type(self.tag) is not int or not -(2**31) <= self.tag < 2**31):
            # torch hands the tag to a C++ int: past it, pybind's TypeError at the call, not a program torch runs
            raise ValueError(f"{self.name}: tag: expected an integer in -2147483648..2147483647, got {self.tag!r}")


@dataclass(frozen=True, slots=True)
class Send(PointToPoint):
    name: ClassVar[str] = "send"


@dataclass(frozen=True, slots=True)
class Recv(PointToPoint):
    name: ClassVar[str] = "recv"


@dataclass(frozen=True, slots=True)
class BatchIsendIrecv(Op):
    """``batch_isend_irecv``: every send and recv of the list posted at once on one group, then waited on together
    (``for req in reqs: req.wait()``). ``sends``/``recvs``: the peers (global ranks), each direction in the list's
    order; every tensor ``size_bytes`` of ``dtype``, or each send's and recv's own (``send_bytes``/``recv_bytes``,
    one per peer, in order).

    Why its own op: the list's order of sends and recvs does not matter (torch's docstring), so a ring exchange
    that blocking sends and recvs deadlock completes; and on NCCL the batch is coalesced on the group's own
    communicator, where an unbatched send or recv may make a 2-rank one."""

    name: ClassVar[str] = "batch_isend_irecv"
    sends: tuple[int, ...] = ()
    recvs: tuple[int, ...] = ()
    group: str = WORLD
    size_bytes: int = 4 * MIB
    dtype: str = dtypes.DEFAULT
    send_bytes: tuple[int, ...] | None = None
    recv_bytes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _check_dtype(self)
        problem = self.sizes_problem()
        if problem is not None:
            raise ValueError(f"{self.name}: {problem}")

    def sizes_problem(self) -> str | None:
        """Why ``send_bytes``/``recv_bytes`` do not give one size per peer, or None."""
        for key, sizes, which, peers in (
            ("send_bytes", self.send_bytes, "sends", self.sends),
            ("recv_bytes", self.recv_bytes, "recvs", self.recvs),
        ):
            if sizes is not None and len(sizes) != len(peers):
                return f"{key}: expected one size per peer of {which} ({len(peers)}), got {len(sizes)}"
        return None

    def items(self) -> tuple[tuple[type[PointToPoint], int, int], ...]:
        """(Send or Recv, peer, bytes) of each op of the list: the sends, then the recvs."""
        sends = self.send_bytes or (self.size_bytes,) * len(self.sends)
        recvs = self.recv_bytes or (self.size_bytes,) * len(self.recvs)
        return (
            *((Send, peer, size) for peer, size in zip(self.sends, sends, strict=True)),
            *((Recv, peer, size) for peer, size in zip(self.recvs, recvs, strict=True)),
        )


# Ops that run on a group handle and communicate there.
ON_A_GROUP = (Collective, PointToPoint, BatchIsendIrecv)


@dataclass(frozen=True, slots=True)
class DestroyProcessGroup(Op):
    """``destroy_process_group(group)``; the world handle tears down every group, as torch does."""

    name: ClassVar[str] = "destroy_process_group"
    group: str = WORLD


@dataclass(frozen=True, slots=True)
class Compute(Op):
    """Local work that only advances this rank's clock."""

    name: ClassVar[str] = "compute"
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Alloc(Op):
    """A torch caching-allocator allocation on the current device (model weights, buffers)."""

    name: ClassVar[str] = "alloc"
    mib: float = 0.0
    tag: str = "tensor"


@dataclass(frozen=True, slots=True)
class Free(Op):
    """``del`` of the tensors an ``alloc`` tagged ``tag``: their blocks go back to torch's cache, still reserved
    on the device (``memory_reserved`` unchanged): torch reuses them, NCCL's own allocations cannot."""

    name: ClassVar[str] = "free"
    tag: str = "tensor"


@dataclass(frozen=True, slots=True)
class EmptyCache(Op):
    """``torch.cuda.empty_cache()`` after tensors died: ``mib`` of what ``alloc`` charged under ``tag`` goes back
    to the device (never more than the tag holds).

    What ``simnccl.capture`` records: it charges the caching allocator's reserved high-water mark under one tag,
    so what ``empty_cache`` returns is that tag's reserved-but-unused bytes. Its own op, not a ``free`` with a
    size: the two give memory back to different holders (torch's cache vs the device).
    """

    name: ClassVar[str] = "empty_cache"
    mib: float = 0.0
    tag: str = "tensor"


# Fields an op no longer takes because another op took over their meaning: a file that still gives one is
# refused naming the replacement, never read with a different meaning. (``free`` with ``mib`` meant what
# ``empty_cache`` means now.)
RETIRED_FIELDS: dict[tuple[str, str], str] = {
    ("free", "mib"): (
        "op 'free' no longer takes mib (it drops the tag's tensors into torch's cache); memory given back to the "
        "device at torch.cuda.empty_cache() is op 'empty_cache' with the same mib and tag"
    ),
}


def retired_field(op_name: str, keys: Iterable[str]) -> tuple[str, str] | None:
    """The first of ``keys`` that ``op_name`` no longer takes, with why and what replaces it; None if none."""
    for key in keys:
        reason = RETIRED_FIELDS.get((op_name, key))
        if reason is not None:
            return key, reason
    return None


@dataclass(frozen=True, slots=True)
class MemoryCheck(Op):
    """vLLM's startup check: ``requested = ceil(total * utilization)``; fails when free < requested."""

    name: ClassVar[str] = "memory_check"
    gpu_memory_utilization: float = 0.9


@dataclass(frozen=True, slots=True)
class Raise(Op):
    """A framework's own check that always fails at this point: the rank raises ``error_type(message)`` and ends.

    Why an op and not a refusal of the arguments: when the real framework checks only after it has made groups
    and run collectives (DeepSpeed's ``PipelineEngine`` asserts ZeRO stage < 2 after the engine's groups and
    broadcasts), those communicators exist and hold memory when the rank dies, and peers still waiting on the rank
    hang or fail; the program runs up to here as the real one does, then fails as it does.
    """

    name: ClassVar[str] = "raise"
    error_type: str = "AssertionError"
    message: str = ""

    def __post_init__(self) -> None:
        problem = type_name_problem(self.error_type)
        if problem is not None:
            raise ValueError(f"raise: error_type: {problem}")
        if not isinstance(self.message, str):
            raise ValueError(f"raise: message: expected a string, got {self.message!r}")


_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_MAX_TYPE_NAME = 200


def type_name_problem(value: object) -> str | None:
    """What is wrong with ``value`` as a ``raise`` op's ``error_type``, or None. It is reported as the rank's
    error type, where a name like Python's is expected: a dotted name of at most ``_MAX_TYPE_NAME`` characters
    (``torch.distributed.DistBackendError``), not text a terminal could take for a control sequence."""
    if isinstance(value, str) and len(value) <= _MAX_TYPE_NAME and _TYPE_NAME.fullmatch(value):
        return None
    shown = repr(value) if not isinstance(value, str) or len(value) <= 60 else repr(value[:60]) + "..."
    return f"expected a dotted Python name of at most {_MAX_TYPE_NAME} characters (e.g. 'AssertionError'), got {shown}"


@dataclass(frozen=True, slots=True)
class Checkpoint(Op):
    """A named measurement point: the device's used/free memory as the rank passes it."""

    name: ClassVar[str] = "checkpoint"
    label: str = ""


OP_TYPES: dict[str, type[Op]] = {
    cls.name: cls
    for cls in (
        SetDevice,
        InitProcessGroup,
        NewGroup,
        SplitGroup,
        AllReduce,
        Broadcast,
        AllGather,
        ReduceScatter,
        AllToAll,
        Barrier,
        Send,
        Recv,
        BatchIsendIrecv,
        DestroyProcessGroup,
        Compute,
        Alloc,
        Free,
        EmptyCache,
        MemoryCheck,
        Raise,
        Checkpoint,
    )
}


@dataclass(frozen=True, slots=True)
class Program:
    """One rank's ops, in order. Identical programs are one object shared by many ranks."""

    ops: tuple[Op, ...] = field(default_factory=tuple)

    def __len__(self) -> int:
        return len(self.ops)

    def to_list(self) -> list[dict[str, Any]]:
        return [op.to_dict() for op in self.ops]


def _check_dtype(op: Collective | PointToPoint | BatchIsendIrecv) -> None:
    """A collective's or p2p's ``dtype`` must be one torch has (``simnccl.dtypes``): an unknown name simulated as
    a type no member could send, and ran on the real tier as float32."""
    if not dtypes.is_known(op.dtype):
        raise ValueError(f"{op.name}: dtype: expected one of {dtypes.expected_text()}, got {op.dtype!r}")
