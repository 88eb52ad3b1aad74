"""DeepSpeed startup: ``deepspeed.init_distributed`` on an eager ``device_id`` world, then the engine.

Follows **deepspeed 0.19.8** (the PyPI release): ``deepspeed/constants.py`` (``default_pg_timeout``: 10 minutes,
``DEEPSPEED_TIMEOUT`` overrides it), ``deepspeed/comm/torch.py`` (``TorchBackend.init_process_group``),
``deepspeed/utils/groups.py``, ``deepspeed/runtime/engine.py`` (``_configure_distributed_model``),
``deepspeed/runtime/pipe/module.py`` (``PipelineModule``: world group, grid, tied groups and
``_synchronize_tied_weights``), ``deepspeed/runtime/pipe/topology.py`` (``ProcessTopology``,
``PipelineParallelGrid``) and ``deepspeed/runtime/pipe/engine.py``. tests/test_framework_fidelity.py captures
the real 0.19.8 code (``zero.Init``, the groups, the engine's ``_broadcast_model``, and ``deepspeed.initialize``
of a ``PipelineModule``: the whole ``PipelineEngine`` with ZeRO-1, its assertion with ZeRO-2) and checks this
generator against it op for op.

1. ``set_device(LOCAL_RANK)``; ``init_process_group(backend="nccl", timeout=10 min,
   device_id=cuda:LOCAL_RANK)`` (torch >= 2.3, and a world larger than one rank: #8248): the world is eager
   and bound, so every later ``new_group`` is an ``ncclCommSplit`` over the whole world with a NOCOLOR split on
   non-members. Programs differ per local rank (the ``device_id``) and, with a pipeline, per stage (the
   tied-weight broadcast and the warm-up send/recv).
2. Pipeline (``pp > 1``): ``PipelineModule`` creates ``world_group = new_group(range(W))`` (a duplicate of the
   default group), then ``PipelineParallelGrid`` over ``PipeDataParallelTopology(pp, dp)`` (axes pipe, data;
   ``PipeModelDataParallelTopology`` with ``mp > 1``): one model group per data index, the dp groups, the
   pipe groups, and the slice groups (W singletons when mp == 1); with ``tied_embeddings``, the tied groups
   (first and last stage per data and model index), then ``_synchronize_tied_weights``: a broadcast of the tied
   weight from the first stage on each, by its members.
3. ZeRO-3's ``zero.Init`` (``zero_init``), which the training script enters to build its model before
   ``deepspeed.initialize``: with ``zero_hpz_partition_size > 1`` it creates the hpZ groups
   (``_create_zero_param_parallel_group``, runtime/zero/partition_parameters.py:1117-1119), then sets the
   device (:1139); each parameter the model then creates is broadcast from rank 0 over the default world group
   (``_post_init_method`` :1248 -> ``_zero_init_param`` :1200-1206): one broadcast here.
4. The engine's ``_configure_distributed_model``: MoE expert and expert-data groups
   (``_create_expert_and_data_parallel``, legacy ordering, ``ep > 1``), the quantized-gradient local
   all-to-all groups (``zero_quantized_gradients``), then the data-parallel group: the grid's with a
   pipeline, else ``_clone_world_group()`` — another ``new_group(range(W))``. Then ``_broadcast_model``
   (engine.py:2038-2056) unless ``zero_init`` (ZeRO-3's ``zero.Init``): a broadcast on the data-parallel group
   and, with ``ep > 1``, one on the rank's expert-data-parallel group (the MoE expert parameters).
5. ZeRO-3 with ``zero_hpz_partition_size > 1`` and no ``zero.Init``: ``_create_zero_param_parallel_group``
   (contiguous blocks) when the optimizer is configured (after step 4; runtime/zero/stage3.py:271-272 skips
   it when ``zero.Init`` made the groups).
6. ``PipelineEngine``: an ``all_reduce`` of the parameter counts on the model group, then the warm-up
   "send a 0" to the next stage / receive from the previous one, on the default group, by stage parity.
   With ZeRO stage 2 or 3 (``zero_init`` included) it never gets there: ``PipelineEngine.__init__`` first runs
   ``DeepSpeedEngine.__init__`` (runtime/pipe/engine.py:73: steps 4 and 5, its groups and broadcasts), then
   asserts the stage is below 2 (:76-77), so every rank ends in that ``AssertionError`` (a ``raise`` op),
   holding the communicators it made; the all_reduce (:153) and the warm-up (:225-235) never run.

Payload sizes of the broadcasts are the op's default (the model decides them). Not modelled: the 1-bit /
compressed communication backends' ``world_group``, MiCS, sequence parallelism, AutoEP, the ``mp_size > 1``
expert ordering, and ``deepspeed.comm`` timers.
"""

from __future__ import annotations

import itertools

from simnccl.ops import AllReduce, Broadcast, Checkpoint, InitProcessGroup, NewGroup, Op, Raise, Recv, Send, SetDevice
from simnccl.workloads._common import BOOL, INT, Config, Generator, Param, WorkloadError, programs_by_key

Ranks = tuple[int, ...]

DEFAULT_PG_TIMEOUT_S = 10 * 60.0  # deepspeed/constants.py default_pg_timeout (0.19.8)

# runtime/pipe/engine.py:76-77 (0.19.8): ``assert self.zero_optimization_stage() < ZeroStageEnum.gradients, ...``
PIPELINE_ZERO_ERROR = Raise(
    error_type="AssertionError", message="ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
)

PARAMS = (
    Param("dp", INT, None, "data-parallel size (default: world / (pp*mp))", minimum=1),
    Param("pp", INT, 1, "pipeline stages (PipelineModule num_stages); 1 = no pipeline engine", minimum=1),
    Param("mp", INT, 1, "model (tensor-slicing) parallel size of the pipeline topology", minimum=1),
    Param(
        "zero_stage",
        INT,
        2,
        "zero_optimization.stage (with pp > 1, 2 and 3 fail: the PipelineEngine asserts stage < 2)",
        minimum=0,
        choices=(0, 1, 2, 3),
    ),
    Param("zero_init", BOOL, False, "ZeRO-3 zero.Init: the engine skips _broadcast_model"),
    Param("zero_hpz_partition_size", INT, 1, "ZeRO++ hpZ secondary partition size (stage 3)", minimum=1),
    Param("zero_quantized_gradients", BOOL, False, "ZeRO++ qgZ: the local all-to-all groups"),
    Param("ep", INT, 1, "MoE expert-parallel size (deepspeed.moe.layer.MoE ep_size)", minimum=1),
    Param("tied_embeddings", BOOL, False, "pipeline TiedLayerSpec on the first and last stage"),
    Param("device_id", BOOL, True, "pass device_id to init_process_group (DeepSpeed does on torch >= 2.3, W > 1)"),
    Param("local_world_size", INT, 8, "processes per node (LOCAL_RANK = rank % local_world_size)", minimum=1),
)


def _sizes(config: Config, world_size: int) -> tuple[int, int, int]:
    pp, mp = config["pp"], config["mp"]
    if world_size % (pp * mp):
        raise WorkloadError("pp", f"the world of {world_size} ranks is not divisible by pp*mp = {pp * mp}")
    dp = config["dp"] if config["dp"] is not None else world_size // (pp * mp)
    if dp * pp * mp != world_size:
        raise WorkloadError(
            "dp", f"pp*mp*dp = {pp * mp * dp} does not match the world of {world_size} ranks (pp={pp}, mp={mp})"
        )
    return pp, mp, dp


def natural_world(config: Config) -> int | None:
    return None if config["dp"] is None else config["dp"] * config["pp"] * config["mp"]


def check(config: Config, world_size: int) -> None:
    pp, mp, _ = _sizes(config, world_size)
    if mp > 1 and pp == 1:
        raise WorkloadError("mp", "mp applies to the pipeline topology; set pp > 1 (or leave mp at 1)")
    ep = config["ep"]
    if ep > 1:
        if mp > 1:
            raise WorkloadError("ep", "MoE with mp > 1 (the TP-strided expert ordering) is not modelled")
        stride = world_size // pp
        if stride % ep:
            raise WorkloadError("ep", f"ep ({ep}) must divide the ranks per pipeline stage ({stride})")
    hpz = config["zero_hpz_partition_size"]
    if hpz > 1:
        if config["zero_stage"] != 3:
            raise WorkloadError("zero_hpz_partition_size", "hpZ needs zero_stage 3")
        if world_size % min(hpz, world_size):
            raise WorkloadError("zero_hpz_partition_size", f"the world of {world_size} is not divisible by {hpz}")
    if config["zero_init"] and config["zero_stage"] != 3:
        raise WorkloadError("zero_init", "zero.Init is a ZeRO stage 3 feature")
    if config["tied_embeddings"] and pp == 1:
        raise WorkloadError("tied_embeddings", "tied layers across stages need pp > 1")
    if config["zero_quantized_gradients"]:
        local = config["local_world_size"]
        if world_size > local and world_size % local:
            raise WorkloadError("zero_quantized_gradients", f"the world of {world_size} is not whole nodes of {local}")


class Topology:
    """``ProcessTopology``: row-major coordinates over named axes."""

    def __init__(self, axes: tuple[str, ...], dims: tuple[int, ...]) -> None:
        self.axes = axes
        self.dims = dims
        self.mapping = {coord: rank for rank, coord in enumerate(itertools.product(*(range(d) for d in dims)))}
        self.coords = list(self.mapping)  # rank -> coordinate (row-major enumeration)

    def coord(self, rank: int) -> tuple[int, ...]:
        return self.coords[rank]

    def axis_list(self, axis: str, idx: int) -> list[int]:
        a = self.axes.index(axis)
        return [r for c, r in self.mapping.items() if c[a] == idx]

    def comm_lists(self, axis: str) -> list[Ranks]:
        """``get_axis_comm_lists``: all combinations of the other axes (row-major), then along ``axis``."""
        a = self.axes.index(axis)
        other = [i for i in range(len(self.axes)) if i != a]
        out = []
        for fixed in itertools.product(*(range(self.dims[i]) for i in other)):
            coord = [0] * len(self.axes)
            for i, v in zip(other, fixed, strict=True):
                coord[i] = v
            group = []
            for k in range(self.dims[a]):
                coord[a] = k
                group.append(self.mapping[tuple(coord)])
            out.append(tuple(group))
        return out


def topology(config: Config, world_size: int) -> Topology:
    pp, mp, dp = _sizes(config, world_size)
    if mp > 1:
        return Topology(("pipe", "data", "model"), (pp, dp, mp))
    return Topology(("pipe", "data"), (pp, dp))


def pipeline_groups(config: Config, world_size: int) -> list[tuple[str, list[Ranks]]]:
    """(bind, groups) of PipelineModule + PipelineParallelGrid, in creation order."""
    pp, mp, dp = _sizes(config, world_size)
    topo = topology(config, world_size)
    out = [("pipe_world", [tuple(range(world_size))])]
    out.append(("model", [tuple(sorted(topo.axis_list("data", d))) for d in range(dp)]))
    out.append(("data_parallel", topo.comm_lists("data")))
    out.append(("pipe", topo.comm_lists("pipe")))
    if mp == 1:
        out.append(("slice", [(r,) for r in range(world_size)]))
    else:
        out.append(("slice", topo.comm_lists("model")))
    if config["tied_embeddings"]:
        tied = []
        for d in range(dp):
            for m in range(mp):
                stages = (0, pp - 1)
                ranks = []
                for s in stages:
                    coord = (s, d, m) if mp > 1 else (s, d)
                    ranks.append(topo.mapping[coord])
                tied.append(tuple(ranks))
        out.append(("tied_embedding", tied))
    return out


def expert_groups(config: Config, world_size: int) -> list[tuple[str, list[Ranks]]]:
    """``_create_expert_and_data_parallel`` (mp_size <= 1, expert-then-data ordering)."""
    ep, pp = config["ep"], config["pp"]
    stride = world_size // pp
    edp = []
    for start in range(0, world_size, stride):
        for i in range(ep):
            edp.append(tuple(range(start + i, start + stride, ep)))
    eps = [tuple(range(i * ep, (i + 1) * ep)) for i in range(world_size // ep)]
    return [("expert_data_parallel", edp), ("expert_parallel", eps)]


def all_to_all_groups(config: Config, world_size: int) -> list[tuple[str, list[Ranks]]]:
    """``_get_local_all_to_all_group`` with ``device_count()`` = local_world_size: (bind, groups), the node-local
    groups (``local_{i}``) then, across nodes, one group per local index (``global_{i}``)."""
    per_node = config["local_world_size"]
    num_local = world_size // per_node
    if num_local == 0:
        return [("local_all_to_all", [tuple(range(world_size))])]
    if num_local == 1:
        return [("local_all_to_all", [tuple(range(per_node))])]
    local = [tuple(j + per_node * i for j in range(per_node)) for i in range(num_local)]
    across = [tuple(i + j * per_node for j in range(num_local)) for i in range(per_node)]
    return [("local_all_to_all", local), ("global_all_to_all", across)]


def _new_groups(bind: str, groups: list[Ranks], purpose: str) -> list[Op]:
    return [NewGroup(ranks=g, bind=bind, purpose=purpose, traffic="collectives") for g in groups]


def module_ops(config: Config, world_size: int) -> list[Op]:
    """``PipelineModule``'s group calls (none without a pipeline), identical on every rank."""
    ops: list[Op] = []
    if config["pp"] > 1:
        for bind, groups in pipeline_groups(config, world_size):
            ops += _new_groups(bind, groups, bind)
    return ops


def tied_broadcast_ops(config: Config, world_size: int, rank: int) -> list[Op]:
    """``_synchronize_tied_weights``: a broadcast from the first tied stage on each tied group, by its members."""
    if config["pp"] == 1 or not config["tied_embeddings"]:
        return []
    (tied,) = [groups for bind, groups in pipeline_groups(config, world_size) if bind == "tied_embedding"]
    return [Broadcast(group="tied_embedding", src=min(g)) for g in tied if rank in g]


def hpz_groups(config: Config, world_size: int) -> list[Op]:
    """``_create_zero_param_parallel_group``: the hpZ groups, contiguous blocks of ``zero_hpz_partition_size``."""
    hpz = config["zero_hpz_partition_size"]
    if hpz == 1:
        return []
    size = min(hpz, world_size)
    return _new_groups("zero_param_intra", [tuple(range(i, i + size)) for i in range(0, world_size, size)], "zero_hpz")


def zero_init_ops(config: Config, world_size: int) -> list[Op]:
    """``deepspeed.zero.Init`` (``zero_init``), before ``deepspeed.initialize``: the hpZ groups first
    (runtime/zero/partition_parameters.py:1117-1119), so they come before the engine's world clone, which
    matters for hang analysis (every rank must create groups in the same order); then ``set_device`` (:1139);
    then, as the model is built, ``_post_init_method`` (:1248) broadcasts every parameter from rank 0 on the
    default world group (``_zero_init_param``, :1200-1206). One broadcast stands for them all: what the
    memory depends on is the world communicator's first use (since torch 2.15 it allocates its buffers, and
    under a lazy policy creates the communicator), which a generator that leaves it out understates."""
    if not config["zero_init"]:
        return []
    return [*hpz_groups(config, world_size), SetDevice(), Broadcast(group="world", src=0)]


def engine_ops(config: Config, world_size: int, broadcast_src: int = 0, expert_src: int | None = None) -> list[Op]:
    """The engine's and ZeRO's group calls and collectives (warm-up p2p comes after), identical on every rank
    but for ``_broadcast_model``'s sources, ``broadcast_src``: DeepSpeed broadcasts from
    ``groups._get_broadcast_src_rank()``, the first global rank of the rank's data-parallel group
    (``dist.get_global_rank(group, 0)``): rank 0 for the world clone, the stage's first rank under a pipeline;
    ``expert_src`` (``ep > 1``): the first global rank of the rank's expert-data-parallel group, from which
    ``_broadcast_model`` broadcasts the MoE expert parameters on that group (engine.py:2050-2053,
    ``groups._get_expert_broadcast_src_rank``). One broadcast per group stands for all the parameters: what
    the memory depends on is each communicator's first use, which the expert-data-parallel one gets here."""
    ops: list[Op] = []
    pipeline = config["pp"] > 1
    if config["ep"] > 1:
        for bind, groups in expert_groups(config, world_size):
            ops += _new_groups(bind, groups, bind)
    if config["zero_quantized_gradients"]:
        for bind, groups in all_to_all_groups(config, world_size):
            ops += _new_groups(bind, groups, "zero_all_to_all")
    if not pipeline:
        ops += _new_groups("data_parallel", [tuple(range(world_size))], "dp")  # _clone_world_group()
    if not config["zero_init"]:  # _broadcast_model: the dense parameters, then (a MoE layer's) the experts'
        ops.append(Broadcast(group="data_parallel", src=broadcast_src))
        if expert_src is not None:
            ops.append(Broadcast(group="expert_data_parallel", src=expert_src))
    if not config["zero_init"]:  # the ZeRO-3 optimizer's, unless zero.Init made them (stage3.py:271-272)
        ops += hpz_groups(config, world_size)
    if pipeline and not pipeline_refuses_zero(config):
        ops.append(AllReduce(group="model", size_bytes=16))  # the parameter-count all_reduce
    return ops


def pipeline_refuses_zero(config: Config) -> bool:
    """Whether ``PipelineEngine`` asserts on this config (runtime/pipe/engine.py:76-77): ZeRO stage 2 or 3 with a
    pipeline. Not a refusal of the arguments: the assertion runs after ``DeepSpeedEngine.__init__`` (:73) has made
    the engine's groups and run its broadcasts, which the simulated startup does, then fails as the real one."""
    return config["pp"] > 1 and config["zero_stage"] >= 2


def warmup_ops(config: Config, world_size: int, rank: int, topo: Topology | None = None) -> list[Op]:
    """PipelineEngine's "send a 0" between adjacent stages, on the default group, by stage parity."""
    if config["pp"] == 1:
        return []
    topo = topo or topology(config, world_size)
    coord = topo.coord(rank)
    stage = coord[0]
    last = config["pp"] - 1

    def at(s: int) -> int:
        return topo.mapping[(s, *coord[1:])]

    send = [Send(peer=at(stage + 1), size_bytes=4)] if stage != last else []
    recv = [Recv(peer=at(stage - 1), size_bytes=4)] if stage != 0 else []
    return send + recv if stage % 2 == 0 else recv + send


def build(config: Config, world_size: int):
    module = module_ops(config, world_size)
    local = config["local_world_size"]
    use_device = config["device_id"] and world_size > 1  # DeepSpeed binds no device on a 1-rank world (#8248)
    pipeline = config["pp"] > 1
    topo = topology(config, world_size) if pipeline else None
    first_of: dict[int, int] = {}  # rank -> its data-parallel group's first rank (the pipeline's broadcast source)
    if pipeline:
        (data_parallel,) = [groups for bind, groups in pipeline_groups(config, world_size) if bind == "data_parallel"]
        first_of = {rank: min(group) for group in data_parallel for rank in group}
    expert_of: dict[int, int] = {}  # rank -> its expert-data-parallel group's first rank (ep > 1)
    if config["ep"] > 1 and not config["zero_init"]:
        (expert_data,) = [
            groups for bind, groups in expert_groups(config, world_size) if bind == "expert_data_parallel"
        ]
        expert_of = {rank: min(group) for group in expert_data for rank in group}
    # built once per pair of broadcast sources (data-parallel: one per stage; expert: one per expert-data-parallel
    # group), not once per rank: the ops are the same objects on every rank sharing them, and the expert and ZeRO
    # group lists are not rebuilt for each of the world's ranks
    sources = {(first_of.get(rank, 0), expert_of.get(rank)) for rank in range(world_size)}
    engines = {pair: engine_ops(config, world_size, *pair) for pair in sources}
    zero_init = zero_init_ops(config, world_size)

    def key(rank: int):
        device = rank % local if use_device else None
        return (device, rank if pipeline else None, expert_of.get(rank))

    def ops_for(k) -> list[Op]:
        device, rank, expert_src = k
        init = InitProcessGroup(backend="nccl", device_id=device, timeout_s=DEFAULT_PG_TIMEOUT_S)
        per_stage = [] if rank is None else tied_broadcast_ops(config, world_size, rank)
        engine = engines[(0 if rank is None else first_of[rank], expert_src)]
        if pipeline_refuses_zero(config):
            end: list[Op] = [PIPELINE_ZERO_ERROR]  # the PipelineEngine's assertion, before its warm-up
        else:
            warm = warmup_ops(config, world_size, rank, topo) if rank is not None else []
            end = [*warm, Checkpoint("startup")]
        return [SetDevice(), init, Checkpoint("after_init"), *zero_init, *module, *per_stage, *engine, *end]

    return programs_by_key(world_size, key, ops_for)


GENERATOR = Generator(
    name="deepspeed",
    framework="DeepSpeed",
    source="deepspeed 0.19.8: deepspeed/constants.py, deepspeed/comm/torch.py, deepspeed/utils/groups.py, "
    "deepspeed/runtime/engine.py, deepspeed/runtime/pipe/{module,topology,engine}.py",
    params=PARAMS,
    build=build,
    natural_world=natural_world,
    check=check,
    doc="ZeRO data parallel on an eager device_id world (world clone + broadcast), or the pipeline grid",
)
