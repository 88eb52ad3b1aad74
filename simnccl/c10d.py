"""torch.distributed's group-creation decisions (``distributed_c10d.py``), release-dependent, as pure functions.

Why pure: the engine executes rendezvous, memory and time; this module only answers what torch would decide
for a call on one rank — which name the group gets, whether the rank is a member, whether the communicator is
split from the default group or bootstrapped fresh, whether a non-member must join a NOCOLOR split, which
device the group binds, and which error the user gets. Every rule cites the 2.15.0 source it mirrors
(line numbers of ``torch/distributed/distributed_c10d.py`` in the 2.15.0 wheel).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from simnccl.backends import Comm, lifecycle
from simnccl.env_knobs import PER_RANK_VARIABLES, cvar_bool
from simnccl.ops import PgOptions
from simnccl.release import (
    DEFAULT_DEVICE_BACKEND,
    MISMATCHED_BOUND_DEVICE,
    NCCL2_NO_CUDA,
    NO_SPLIT_PARENT,
    SPLIT_PARENT_NOT_INITIALIZED,
    BackendConfig,
    DeviceBackend,
    Impl,
    Release,
    resolve_backend,
)

NON_GROUP_MEMBER = -100  # GroupMember.NON_GROUP_MEMBER
GLOO_HAS_NO_NOCOLOR_SPLIT = (
    "'torch._C._distributed_c10d.ProcessGroupGloo' object has no attribute 'perform_nocolor_split'"
)


class TorchError(Exception):
    """An exception real torch raises on this rank: its Python type name and its exact message."""

    def __init__(self, type_name: str, message: str, facts: dict[str, Any] | None = None) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        # What a check found, reported beside the message in the rank's error (a cross-wired group's foreign
        # ranks, compared with what the real run's data showed); None for torch's own errors.
        self.facts = facts


@dataclass(slots=True)
class Group:
    """One rank's ``ProcessGroup``: name, members (global ranks in group-rank order), binding, backends."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    rank_in_group: int
    backend: BackendConfig
    bound_device: int | None
    timeout_s: float
    options: PgOptions
    comms: dict[str, Comm] = field(default_factory=dict)
    destroyed: bool = False
    bound_cpu: bool = False  # bound to cpu:N (``bound_device`` names cuda indices only)
    # C++ ``ProcessGroup::splitCounter_`` (ProcessGroup.hpp:205-206,1218): per split_group call on this parent
    # without a group_desc (keyed by the call's counter, so planning a call twice counts it once), its index.
    # None until the first such call: most groups are never split.
    split_calls: dict[int, int] | None = None
    # The store namespace its name's bootstrap keys live under (``store_name``): "" but for a split of a group
    # other than the default one (``plan_split_group``).
    store_prefix: str = ""

    @property
    def size(self) -> int:
        return len(self.ranks)

    def comm_for(self, device_type: str) -> Comm | None:
        return self.comms.get(device_type)


@dataclass(frozen=True, slots=True)
class ProcessContext:
    """What torch can see of its process: ranks, the node's GPU count, and its environment."""

    rank: int
    world_size: int
    local_rank: int
    device_count: int
    env: Mapping[str, str]


# Plans are never changed once made, and are named tuples so nothing can change one: a world-wide startup makes a
# GroupPlan and a CommPlan per membership (relabel_member_plan), and a frozen dataclass's __init__ sets each field
# through object.__setattr__ (measured: 2.0 us for a GroupPlan), where a named tuple is built in C. Nothing hashes
# a plan (one with a split parent, a Comm, never could be), and nothing compares one with a plain tuple.
class CommPlan(NamedTuple):
    """How one device type's backend of a new group comes to exist on a member rank."""

    pair: DeviceBackend
    eager: bool
    split_from: Comm | None
    shared: bool
    device: int | None
    lazy_init: bool


class GroupPlan(NamedTuple):
    """torch's decision for one ``init_process_group``/``new_group``/``split_group`` call on one rank."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    member: bool
    backend: BackendConfig
    bound_device: int | None
    timeout_s: float
    options: PgOptions
    comms: tuple[CommPlan, ...] = ()
    nocolor_split_on: Comm | None = None
    counter_advance: int = 1
    rank_in_group: int = -1
    bound_cpu: bool = False
    store_prefix: str = ""  # ``Group.store_prefix``


def group_name_for(counter: int, ranks: tuple[int, ...] | list[int], use_local_synchronization: bool) -> str:
    """``_process_group_name`` (l.6758): the counter as a string, or sha1 of ``ranks_counter`` (l.6728)."""
    if use_local_synchronization:
        unique = "_".join(["_".join(map(str, ranks)), str(counter)])
        return hashlib.sha1(unique.encode("utf-8"), usedforsecurity=False).hexdigest()
    return str(counter)


@functools.lru_cache(maxsize=8)
def world_ranks(world_size: int) -> tuple[int, ...]:
    """The default group's members: one shared tuple for every rank (W copies of W ranks is W² memory)."""
    return tuple(range(world_size))


def nccl_device_fallback(ctx: ProcessContext, env: Mapping[str, str]) -> int:
    """``_nccl2_device`` (l.820-849): LOCAL_RANK % count when LOCAL_RANK is set, else global rank % count."""
    if ctx.device_count == 0:
        raise TorchError("RuntimeError", NCCL2_NO_CUDA)
    if "LOCAL_RANK" in env:
        return ctx.local_rank % ctx.device_count
    return ctx.rank % ctx.device_count


def _check_gpus(pair: DeviceBackend, ctx: ProcessContext) -> None:
    """The no-CUDA errors each implementation raises at construction (§D.1)."""
    if ctx.device_count > 0:
        return
    if pair.impl in (Impl.NCCL2, Impl.NCCL_LAZY):
        raise TorchError("RuntimeError", NCCL2_NO_CUDA)
    if pair.impl is Impl.LEGACY:
        raise TorchError("ValueError", "ProcessGroupNCCL is only supported with GPUs, no GPUs found!")


def _device_type(device_id: int | str) -> str:
    """The torch device type of a ``device_id``: an int is the (CUDA) accelerator's index (l.2601)."""
    return device_id.split(":", 1)[0] if isinstance(device_id, str) else "cuda"


DEVICE_ID_WITHOUT_INDEX = (
    "init_process_group device_id parameter must be a device with a valid index, e.g. cpu:0 or cuda:0"
)


def _validate_device_id(device_id: int | str | None, ctx: ProcessContext) -> int | None:
    """``init_process_group`` device_id checks (l.2455-2789); returns the cuda index or None."""
    if device_id is None:
        return None
    if isinstance(device_id, str):
        if device_id.startswith("cpu"):
            if not device_id.startswith("cpu:"):
                # l.2966: the cpu type passes the accelerator checks (l.2610); _new_process_group_helper wants an index
                raise TorchError("ValueError", DEVICE_ID_WITHOUT_INDEX)
            return None
        if not device_id.startswith("cuda:"):
            raise TorchError("ValueError", "Please use a device_id with index.")
        device_id = int(device_id.split(":", 1)[1])
    if device_id < 0 or device_id >= ctx.device_count:
        raise TorchError(
            "ValueError",
            f"device_id cuda:{device_id} is out of range. Please use a device index less than the number of "
            f"accelerators available: {ctx.device_count}.",
        )
    return device_id


def _binds_device(release: Release, pair: DeviceBackend | None) -> bool:
    """2.15's nccl2 and nccl-lazy write their device back to ``bound_device_id`` (§B.2); legacy, gloo don't."""
    return release.nccl2_device_fallback and pair is not None and pair.impl in (Impl.NCCL2, Impl.NCCL_LAZY)


def plan_init(
    release: Release,
    ctx: ProcessContext,
    backend: str | None,
    device_id: int | str | None,
    timeout_s: float | None,
    options: PgOptions,
) -> GroupPlan:
    """``init_process_group``: the default group "0", every rank a member, no split source."""
    bound = _validate_device_id(device_id, ctx)
    if backend is None and device_id is not None:
        # l.2632-2635: the device type's default backend ("cuda" -> "nccl", "cpu" -> "gloo"), so it gets that
        # name's timeout and get_backend(); only without a device_id does None become "undefined".
        backend = DEFAULT_DEVICE_BACKEND[_device_type(device_id)]
    config = resolve_backend(release, backend, ctx.env, has_cuda=ctx.device_count > 0)
    cuda = config.accelerator
    if cuda is not None:
        _check_gpus(cuda, ctx)
        if bound is None and _binds_device(release, cuda):
            bound = nccl_device_fallback(ctx, ctx.env)
    _check_lazy_init_supported(release, options)
    timeout = timeout_s if timeout_s is not None else release.default_timeout_s(config.requested)
    comms = tuple(_fresh_comm_plan(release, pair, bound, options, ctx) for pair in _distinct_backends(config))
    return GroupPlan(
        name="0",
        desc="default_pg",
        ranks=world_ranks(ctx.world_size),
        member=True,
        backend=config,
        bound_device=bound,
        timeout_s=timeout,
        options=options,
        comms=comms,
        rank_in_group=ctx.rank,
        bound_cpu=bound is None and device_id is not None and _device_type(device_id) == "cpu",
    )


def _check_lazy_init_supported(release: Release, options: PgOptions) -> None:
    if options.lazy_init and not release.lazy_init_option:
        raise TorchError("AttributeError", "'Options' object has no attribute 'lazy_init'")


def _distinct_backends(config: BackendConfig) -> list[DeviceBackend]:
    """One backend object per distinct name: gloo serves cpu and cuda with one object."""
    seen: dict[str, DeviceBackend] = {}
    for pair in config.pairs:
        if pair.name not in seen or pair.device_type == "cuda":
            seen[pair.name] = pair
    return list(seen.values())


GLOO_LAZY_KNOB = "TORCH_GLOO_LAZY_INIT"


def _lazy_gloo(impl: Impl, ctx: ProcessContext) -> bool:
    """Whether a communicator of ``impl`` is ProcessGroupGloo's lazyInit (``TORCH_GLOO_LAZY_INIT``): its address
    written when its group is made, its pairs connected at first use (``Comms.publish``)."""
    return impl is Impl.GLOO and cvar_bool(ctx.env, GLOO_LAZY_KNOB)


def _fresh_comm_plan(
    release: Release, pair: DeviceBackend, bound: int | None, options: PgOptions, ctx: ProcessContext
) -> CommPlan:
    """A communicator bootstrapped by the members over the store (no split source).

    ``device`` None means unbound: legacy then binds the device of the first collective's tensor.
    """
    eager = lifecycle(pair.impl).eager_at_creation(release, bound=bound is not None, lazy_init=options.lazy_init)
    if _lazy_gloo(pair.impl, ctx):
        eager = False
    return CommPlan(pair=pair, eager=eager, split_from=None, shared=False, device=bound, lazy_init=options.lazy_init)


def split_source(release: Release, world: Group, requested: BackendConfig, options: PgOptions) -> Comm | None:
    """``_get_split_source`` (l.2790) gated by l.2934ff: bound default pg, splittable, same backend name.

    The source is the default group's backend on its bound device's type: cpu for ``device_id='cpu:N'``
    (gloo's, which a gloo world also serves cuda with)."""
    if (world.bound_device is None and not world.bound_cpu) or options.lazy_init:
        return None
    device_type = "cuda" if world.bound_device is not None else "cpu"
    parent_pair = world.backend.for_device(device_type)
    if parent_pair is None:
        return None
    parent = world.comm_for(device_type) or next((c for c in world.comms.values() if c.impl is parent_pair.impl), None)
    if parent is None or not lifecycle(parent.impl).supports_splitting(parent):
        return None
    if release.split_source_matches_name:
        wanted = requested.for_device(device_type)
        if wanted is None or wanted.name != parent_pair.name:
            return None
    return parent


@dataclass(frozen=True, slots=True, eq=False)
class Members:
    """A validated, sorted rank list and each rank's group rank: computed once per call site, shared by all
    ranks (a group's member tuple is one object, not one copy per member)."""

    ranks: tuple[int, ...]
    index: dict[int, int]


def validate_ranks(ranks: tuple[int, ...] | None, world_size: int) -> Members:
    """``_new_group_with_tag``'s checks on ``ranks`` (l.7193-7237) with torch's texts."""
    if ranks is None:
        members = world_ranks(world_size)
    else:
        members = tuple(sorted(ranks))
        if len(set(members)) != len(members):
            raise TorchError("ValueError", f"ranks list must not contain duplicate entries, got {list(members)}")
        if len(members) > world_size:
            raise TorchError(
                "ValueError",
                "the new group's world size should be less or equal to the world size set by init_process_group",
            )
        for r in members:
            if r < 0 or r >= world_size:
                raise TorchError(
                    "ValueError",
                    f"Rank {r} is out of range. Valid ranks are 0 to {world_size - 1} (world_size={world_size})",
                )
    if not members:
        # l.2985/3027: an empty list reaches the helper as "the default group" after drawing a name.
        raise TorchError("AssertionError", "Group rank must be specified for group members")
    return Members(members, {r: i for i, r in enumerate(members)})


def plan_new_group(
    release: Release,
    ctx: ProcessContext,
    world: Group,
    counter: int,
    ranks: tuple[int, ...] | Members | None,
    backend: str | None,
    options: PgOptions,
    use_local_synchronization: bool,
    group_desc: str | None,
    device_id: int | None,
    timeout_s: float | None,
) -> GroupPlan:
    """``new_group`` → ``_new_group_with_tag`` (l.7150-7300) → ``_new_process_group_helper`` (l.2934)."""
    world_bound = world.bound_device is not None or world.bound_cpu
    if device_id is not None and world_bound and device_id != world.bound_device:
        # l.7172: checked only against a bound default group; an unbound one lets the new group bind its own.
        raise TorchError("AssertionError", MISMATCHED_BOUND_DEVICE)
    requested = backend if backend else world.backend.requested
    config = resolve_backend(release, requested, ctx.env, has_cuda=ctx.device_count > 0)
    _check_lazy_init_supported(release, options)
    timeout = timeout_s if timeout_s is not None else release.default_timeout_s(config.requested)
    if isinstance(ranks, Members):
        members, rank_in_group = ranks.ranks, ranks.index.get(ctx.rank)
    elif use_local_synchronization and ranks is not None and ctx.rank not in ranks:
        # l.7206 tests membership on the raw list before validating it: a non-member returns even from a list
        # with duplicates, out-of-range ranks, or none at all, which raises on the members.
        members, rank_in_group = tuple(ranks), None
    else:
        group = validate_ranks(ranks, ctx.world_size)
        members, rank_in_group = group.ranks, group.index.get(ctx.rank)
    member = rank_in_group is not None
    if use_local_synchronization and not member:
        # l.7206: returns before _process_group_name, so the counter does not advance on non-members.
        return GroupPlan(
            name="",
            desc=group_desc or "undefined",
            ranks=members,
            member=False,
            backend=config,
            bound_device=None,
            timeout_s=timeout,
            options=options,
            counter_advance=0,
        )
    name = group_name_for(counter, members, use_local_synchronization)
    desc = group_desc or "undefined"
    parent = split_source(release, world, config, options)
    if not member:
        if parent is not None and parent.impl is Impl.GLOO:
            # l.3020 calls split_from.perform_nocolor_split(...), which ProcessGroupGloo lacks (real gloo, world 3:
            # the non-member of new_group([0, 1]) raises this; the members connect a fresh gloo group).
            raise TorchError("AttributeError", GLOO_HAS_NO_NOCOLOR_SPLIT)
        return GroupPlan(
            name=name,
            desc=desc,
            ranks=members,
            member=False,
            backend=config,
            bound_device=None,
            timeout_s=timeout,
            options=options,
            nocolor_split_on=parent,
        )
    bound = world.bound_device if device_id is None else device_id  # l.7170 / l.3044: the new pg's bound device
    comms: list[CommPlan] = []
    for pair in _distinct_backends(config):
        if pair.impl.is_nccl:
            _check_gpus(pair, ctx)
        if parent is not None and pair.device_type == "cuda" and parent.impl.is_nccl and pair.impl.is_nccl:
            # gloo's creator ignores split_from: its members bootstrap fresh (l.752)
            child_impl = Impl.NCCL2 if parent.impl is Impl.NCCL_LAZY else parent.impl
            shared = _split_share_requested(ctx.env, options)
            comms.append(
                CommPlan(
                    pair=DeviceBackend(pair.device_type, pair.name, child_impl),
                    eager=True,
                    split_from=parent,
                    shared=shared,
                    device=bound,
                    lazy_init=False,
                )
            )
        else:
            comms.append(_fresh_comm_plan(release, pair, bound, options, ctx))
    device = bound
    if device is None and any(_binds_device(release, c.pair) for c in comms):
        device = nccl_device_fallback(ctx, ctx.env)
        comms = [
            CommPlan(
                c.pair,
                c.eager,
                c.split_from,
                c.shared,
                device if _binds_device(release, c.pair) else c.device,
                c.lazy_init,
            )
            for c in comms
        ]
    return GroupPlan(
        name=name,
        desc=desc,
        ranks=members,
        member=True,
        backend=config,
        bound_device=device,
        timeout_s=timeout,
        options=options,
        comms=tuple(comms),
        rank_in_group=rank_in_group,
    )


def outsider_key(ctx: ProcessContext, world: Group) -> tuple[object, ...]:
    """Everything ``plan_new_group`` reads, on a rank *outside* the new group (no local synchronization),
    besides the call's own arguments and the counter (which only names the group).

    Why it exists: most of a large startup's calls are made by outsiders, and their plan is the same on every
    rank with an equal key, so the engine plans one outsider per key and reuses the answer (DESIGN rule 8).
    Keep it in step with ``plan_new_group``, ``resolve_backend`` (only TORCH_DIST_USE_NCCL2 of the env) and
    ``split_source`` (the default group's backend, whether it is bound, and its cuda communicator's lifecycle
    state). Which device the default group is bound to is not in the key: an outsider's plan reads it only to
    compare it with the call's own ``device_id``, so a call naming one is not shared (``shares_outsider_plan``);
    with it in the key, the 8 local ranks of every node planned each call 8 times over.
    """
    parent = world.comm_for("cuda")
    return (
        ctx.world_size,
        ctx.device_count,
        ctx.env.get("TORCH_DIST_USE_NCCL2"),
        world.backend,
        world.bound_device is not None,
        world.bound_cpu,
        None if parent is None else (parent.impl, parent.state),
    )


def shares_outsider_plan(device_id: int | None) -> bool:
    """Whether a call's outsider plan may be shared by ranks of one ``outsider_key``: not when it names a
    ``device_id``, which ``plan_new_group`` compares with each rank's own bound device."""
    return device_id is None


_LAUNCHER_RANK_ENV = frozenset(PER_RANK_VARIABLES)  # differ per rank; plan_new_group reads LOCAL_RANK's presence only


def member_key(ctx: ProcessContext, world: Group) -> tuple[object, ...]:
    """Everything ``plan_new_group`` reads on a rank *inside* the new group, besides the call's own arguments,
    the counter and the member list, and besides what ``relabel_member_plan`` carries from one member to
    another: its group rank, its bound device and its own default-group communicator (the split parent).

    Why it exists: ranks with an equal key are one *rank class* for group creation — their plans for a call are
    equal up to that relabelling — so the engine plans one member per class and relabels it for the others
    (DESIGN rule 8). Keep it in step with ``plan_new_group`` the way ``outsider_key`` is: the environment (less
    the launcher's per-rank variables, whose only use is the device fallback, keyed by its answer), the GPU
    count, the default group's backend, whether it is bound, and its cuda communicator's lifecycle state.
    """
    parent = world.comm_for("cuda")
    fallback: int | None = None
    if world.bound_device is None and ctx.device_count > 0:
        fallback = nccl_device_fallback(ctx, ctx.env)  # the unbound nccl2 device: rank-dependent, so keyed
    env = tuple(sorted((k, v) for k, v in ctx.env.items() if k not in _LAUNCHER_RANK_ENV))
    return (
        ctx.world_size,
        ctx.device_count,
        env,
        "LOCAL_RANK" in ctx.env,
        world.backend,
        world.bound_device is None,
        world.bound_cpu,
        fallback,
        None if parent is None else (parent.impl, parent.state),
    )


_new_tuple = tuple.__new__


def relabel_member_plan(template: GroupPlan, members: Members, rank: int, name: str, world: Group) -> GroupPlan:
    """``template`` (a member's plan for a call) as ``rank``'s plan for an equal call on ``members`` named
    ``name``: valid when ``rank``'s ``member_key`` equals the template rank's and the call's ``device_id`` (if
    any) is the rank's bound device (else torch raises). What differs between members of one class is exactly
    this: the group rank, the bound device (every device of a bound plan is the bound
    one) and the split parent (each member splits its own default-group communicator)."""
    bound = world.bound_device
    comms = template.comms
    if comms:
        parent = world.comm_for("cuda")
        comms = tuple(
            [
                _new_tuple(
                    CommPlan,
                    (
                        c.pair,
                        c.eager,
                        None if c.split_from is None else parent,
                        c.shared,
                        c.device if bound is None else bound,
                        c.lazy_init,
                    ),
                )
                for c in comms
            ]
        )
    # In field order, built as the named tuples' own constructors build them but in C (theirs is Python code):
    # this runs once per member of every group of a startup.
    return _new_tuple(
        GroupPlan,
        (
            name,
            template.desc,
            members.ranks,
            True,
            template.backend,
            template.bound_device if bound is None else bound,
            template.timeout_s,
            template.options,
            comms,
            None,
            template.counter_advance,
            members.index[rank],
            False,
            "",  # new_group calls only: no split store prefix
        ),
    )


def _split_share_requested(env: Mapping[str, str], options: PgOptions) -> bool:
    if options.split_share is not None:
        return options.split_share
    return env.get("NCCL_COMM_SPLIT_SHARE_RESOURCES") == "1"


def _legacy_guess_device(parent: Comm, ctx: ProcessContext) -> int:
    """Legacy ``ProcessGroupNCCL::split`` connects the child eagerly on ``guessDeviceId()``: the bound device,
    else the device the parent's communicator was made on (``usedDeviceIdxs_``), else global rank % GPU count.

    Why: an unbound legacy parent still supports splitting, and its child is a communicator on a GPU; with no
    device the child was charged nothing and its first collective failed inside the simulator."""
    if parent.device is not None:
        return parent.device
    return ctx.rank % ctx.device_count


def _split_desc(parent: Group, parent_comm: Comm, counter: int) -> str:
    """The child's desc when split_group gets no group_desc: C++ ``ProcessGroup::splitGroup`` names it
    ``"<parent desc>:split:<n>"``, n counting this parent's split_group calls without a desc, on members and
    non-members alike (real gloo, 2 ranks: ``default_pg:split:0``, then ``:split:1`` on both, an explicit desc
    in between counts nothing). Why it matters: the desc is what the flight recorder and torch's logs name.

    Legacy ``ProcessGroupNCCL`` is the exception (l.6889-6890, the only backend with ``comm_split_count``):
    Python names it ``"<parent desc>:split:<comm_split_count()>"``, the ncclCommSplit calls this rank's
    communicator of the parent made so far (``NCCLComm::split`` counts each on its source, NOCOLOR included), so
    ``new_group`` splits count, and the C++ count is never taken."""
    if parent_comm.impl is Impl.LEGACY:
        return f"{parent.desc}:split:{parent_comm.splits}"
    if parent.split_calls is None:
        parent.split_calls = {}
    index = parent.split_calls.setdefault(counter, len(parent.split_calls))
    return f"{parent.desc}:split:{index}"


def check_split_parent_initialized(parent: Group) -> None:
    """C++ ``ProcessGroup::splitGroup``'s ``TORCH_CHECK(getBackend(deviceType)->isInitialized(), ...)`` on every
    backend of the parent, after Python's checks of the split lists and before any split (2.15 libtorch_cpu; its
    text is a RuntimeError on every parent rank, members and non-members alike).

    Why only legacy: its ``supportsSplitting()`` is true even before its lazy communicator exists
    (ProcessGroupNCCL.hpp:837-839), so Python's support check (l.6877) lets it through and this check is what
    refuses a split before the parent's first collective. Gloo's is always true, and an uninitialised lazy nccl2
    parent is refused earlier, by ``supportsSplitting()``.

    Legacy's ``isInitialized()`` is "``devNCCLCommMap_`` is not empty and every communicator in it is
    initialized", and an unbatched send/recv's pair communicator lives in that map too (key ``"lo:hi"``): a
    rank that holds only pair communicators passes, one that holds none raises. Per rank, as torch checks it;
    what such a parent's split then does is ``legacy_split_has_parent_comm``'s."""
    for comm in parent.comms.values():
        if comm.impl is Impl.LEGACY and not comm.ready and not comm.pair_comms:
            raise TorchError("RuntimeError", SPLIT_PARENT_NOT_INITIALIZED)


def legacy_split_has_parent_comm(parent_comm: Comm) -> bool:
    """Whether legacy ``ProcessGroupNCCL::split`` finds a communicator of the parent to split: it looks only under
    the device key (``getKeyFromDevice``), where the lazy communicator of the parent's first collective lives.

    Why it matters: a parent that passed ``isInitialized()`` on send/recv pair communicators alone has none there.
    A member's child (``eagerConnectSingleDevice``, ``getNCCLComm`` with ``split_from``) then splits nothing and
    bootstraps fresh over its own store, members only; a non-member's ``performNocolorSplit`` only logs the
    missing communicator and calls ``NCCLComm::split`` on the null pointer (``Comms.nocolor_split``)."""
    return parent_comm.impl is not Impl.LEGACY or parent_comm.ready


# torch 2.15's two size checks of a split (distributed_c10d.py l.6975, then C++ ProcessGroup::splitGroup): against
# init_process_group's world, then against the parent group's size (a RuntimeError, though its text says world).
SPLIT_LARGER_THAN_WORLD = "the split group's size should be less or equal to the world_size set by init_process_group"
SPLIT_LARGER_THAN_PARENT = "the split group's size should be no larger than the world_size set by init_process_group"


class SplitNamesNoProcess(TorchError):
    """A member's split lists group ranks its parent does not have (a subgroup's split given global ranks): torch
    checks only the split's size, and the backend's split makes a child of that size. On gloo no process ever
    joins the child's full mesh for those ranks, so its members wait in the bootstrap until the split's timeout
    (measured on 2.15 gloo: new_group([0, 1]) split by [[0, 2]] in a world of 3: rank 0 waits, then
    DistStoreError "wait timeout"): the engine blocks the rank there (``Groups.op_split_group``). What NCCL's
    ncclCommSplit does with a color its other ranks never take is not measured here: the rank fails, saying so.
    A TorchError, so a cohort that meets one leaves the call to the rank-by-rank path."""

    def __init__(self, outside: list[int], parent_size: int, *, is_nccl: bool) -> None:
        self.outside = outside
        self.parent_size = parent_size
        self.is_nccl = is_nccl
        what = f"split ranks {outside} name no rank of the parent group of size {parent_size}"
        if is_nccl:
            super().__init__("SimulatorLimit", f"{what}: what NCCL's split makes of them is not modelled")
        else:
            super().__init__("DistStoreError", f"{what}: no process joins the child's bootstrap for them")

    def explanation(self) -> str:
        return (
            f"split ranks {self.outside} name no rank of the parent group of size {self.parent_size} (split_ranks "
            "are ranks of the parent group): no process joins the child's gloo full mesh for them, so its members "
            "wait in the bootstrap until the split's timeout"
        )


def plan_split_group(
    release: Release,
    ctx: ProcessContext,
    counter: int,
    parent: Group,
    split_ranks: tuple[tuple[int, ...], ...],
    options: PgOptions,
    group_desc: str | None,
    timeout_s: float | None,
    parent_is_default: bool = True,
) -> GroupPlan:
    """``split_group`` (l.6783-7043): every parent rank calls it; the parent backend must support splitting.

    Each rank validates the splits only up to its own (l.6972-6983); the name is the hashed name of its own
    split in the given order (l.6989; ``split_ranks[0]`` for a rank in none), and every rank advances the
    counter. A rank in no split still calls the backend's ``split``, which for NCCL is a NOCOLOR split.

    gloo (``ProcessGroupGloo::split``) is no collective on the parent: a member connects a fresh full mesh over
    the store prefixed with the hashed name (so members meet only if their counters agree), and a non-member
    returns ``NON_GROUP_MEMBER`` without communicating.

    The child's store is prefixed on its parent's, so a split of a group other than the default one
    (``parent_is_default`` False) keys its bootstrap under the parent's name too (``store_prefix``). Measured on
    2.15 gloo: the two parts of new_group family [[0, 1], [2, 3]] splitting their own group by [[0, 1]] get one
    hashed name (same group ranks, same counter) and both complete, every run. A split of the default group
    keeps the plain name (unmeasured: no test tells its namespace from the new_group names').
    """
    if not split_ranks:
        raise TorchError("ValueError", "split_ranks cannot be None or empty")
    pair = parent.backend.for_device("cuda") or parent.backend.pairs[0]
    parent_comm = parent.comm_for(pair.device_type)
    if parent_comm is None or not lifecycle(parent_comm.impl).supports_splitting(parent_comm):
        raise TorchError("RuntimeError", NO_SPLIT_PARENT)
    my_parent_rank = parent.rank_in_group
    mine = None
    for split in split_ranks:
        if not split:
            raise TorchError("ValueError", "the split group cannot be empty")
        if len(split) > ctx.world_size:
            raise TorchError("ValueError", SPLIT_LARGER_THAN_WORLD)
        if len(set(split)) != len(split):
            raise TorchError("ValueError", "the split group cannot have duplicate ranks")
        if my_parent_rank in split:
            mine = split
            break
    _check_lazy_init_supported(release, options)
    # C++ ``ProcessGroup::splitGroup``, on every rank with the split it was handed (a rank in none: the first):
    # its size against the *parent's* size, before the parent's backend is asked anything
    if len(mine if mine is not None else split_ranks[0]) > len(parent.ranks):
        raise TorchError("RuntimeError", SPLIT_LARGER_THAN_PARENT)
    check_split_parent_initialized(parent)
    # l.6964: the backend's default (``_get_default_timeout`` of the parent's backend *name*), never the parent's
    # own timeout: a child of a 7200 s nccl world times out at 600 s (real gloo: parent 7 s, child 30 min).
    timeout = timeout_s if timeout_s is not None else release.default_timeout_s(parent.backend.requested)
    name = group_name_for(counter, mine if mine is not None else split_ranks[0], True)
    desc = group_desc if group_desc is not None else _split_desc(parent, parent_comm, counter)
    collective = lifecycle(parent_comm.impl).split_is_collective
    if mine is None:
        return GroupPlan(
            name=name,
            desc=desc,
            ranks=(),
            member=False,
            backend=parent.backend,
            bound_device=None,
            timeout_s=timeout,
            options=options,
            nocolor_split_on=parent_comm if collective else None,
        )
    outside = [r for r in mine if not 0 <= r < len(parent.ranks)]
    if outside:
        raise SplitNamesNoProcess(outside, len(parent.ranks), is_nccl=parent_comm.impl.is_nccl)
    members = tuple(parent.ranks[r] for r in mine)
    child_impl = Impl.NCCL2 if parent_comm.impl is Impl.NCCL_LAZY else parent_comm.impl
    device = parent.bound_device
    if device is None and parent_comm.impl is Impl.LEGACY:
        device = _legacy_guess_device(parent_comm, ctx)
    elif device is None:
        # ncclCommSplit makes the child on the parent communicator's device: an unbound parent that split (2.14's
        # nccl2 after its first collective) has one. With none, the child's first collective crashed the simulator.
        device = parent_comm.device
    splits = legacy_split_has_parent_comm(parent_comm)
    comm = CommPlan(
        pair=DeviceBackend(pair.device_type, pair.name, child_impl),
        eager=not _lazy_gloo(child_impl, ctx),  # a lazy gloo child returns at once, as its parent did
        split_from=parent_comm if collective and splits else None,
        shared=splits and _split_share_requested(ctx.env, options),
        device=device,
        lazy_init=False,
    )
    return GroupPlan(
        name=name,
        desc=desc,
        ranks=members,
        member=True,
        backend=parent.backend,
        bound_device=parent.bound_device,
        timeout_s=timeout,
        options=options,
        comms=(comm,),
        rank_in_group=mine.index(my_parent_rank),
        store_prefix="" if parent_is_default else f"{parent.store_prefix}{parent.name}/",
    )
