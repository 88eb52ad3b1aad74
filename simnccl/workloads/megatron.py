"""Megatron-Core startup: ``initialize_model_parallel`` on every rank, in Megatron's own order, then (``training``)
the training entry's world barrier.

Follows **megatron-core 0.19.2** (the PyPI wheel): ``megatron/core/parallel_state.py``
(``initialize_model_parallel``, ``create_group``, ``get_nccl_options``, ``RankGenerator``,
``create_hierarchical_groups``, ``create_hybrid_dp_cp_groups``, ``create_all_gather_groups``) and
``megatron/training/initialize.py::_initialize_distributed`` (``torch.cuda.set_device(local_rank)``, then
``init_process_group(backend, world_size, rank, timeout=distributed_timeout_minutes)`` with no ``device_id``).
tests/test_framework_fidelity.py captures the real 0.19.2 code and checks this generator against it op for op.

* ``create_group`` is ``torch.distributed.new_group(ranks, timeout, backend, pg_options,
  use_local_synchronization=False, group_desc)`` and **every rank calls it for every group**, so the call
  list is rank-independent: all ranks share one Program (DESIGN rule 8). Ranks are listed sorted, as torch's
  ``new_group`` sorts them (Megatron passes the distributed-optimizer instance group unsorted).
* Rank groups come from ``RankGenerator`` (order ``tp-cp-ep-dp-pp``; missing tokens appended) through
  ``generate_masked_orthogonal_rank_groups``, re-implemented here (``masked_orthogonal_groups``); the expert
  generator has ``cp=1`` and the expert sizes. The ``gtp_remat`` axis 0.19.2 injects has size 1 (GTP needs
  TransformerEngine): its groups are the two families of W singletons (``GTP_WEIGHT_REMAT_GROUP`` first,
  ``EXPERT_GTP_WEIGHT_REMAT_GROUP`` before the expert groups), and ``tp-ep-gtp_remat-pp`` equals ``tp-ep-pp``,
  so ``EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP`` (created unconditionally) repeats those rank sets.
* ``pg_options = get_nccl_options(name, nccl_comm_cfgs)``: a ``ProcessGroupNCCL.Options(is_high_priority_stream)``
  with ``config.cga_cluster_size``/``max_ctas``/``min_ctas``/``net_name`` for names in ``nccl_comm_cfgs`` (the
  ``--nccl-communicator-config-path`` YAML; ``high_priority_stream_groups`` add ``is_high_priority_stream``),
  else None. Every field is kept in ``PgOptions``; ``max_ctas``/``min_ctas`` cap the NCCL memory model's channels,
  ``cga_cluster_size``/``net_name`` are recorded but not modelled (``PgOptions.unmodelled``). A ``net_name``
  other than IB/socket raises in Megatron, and is refused here.
* Gloo twins (``create_gloo_process_groups``, default on): DP-with-CP, DP, expert-DP, the intra-partial DP groups
  and the hierarchical expert-DP levels, right after their NCCL group; the hierarchical twins receive the
  level's NCCL ``pg_options`` too, as Megatron passes them.
* SHARP (``use_sharp``): with the default ``sharp_enabled_group`` ("dp"), 0.19.2 raises ``AssertionError: data
  parallel group with CP (with GTP_remat) is not initialized`` right after the DP-with-CP groups (its SHARP
  barrier reads a group assigned later in the function): that configuration is refused, quoting the error.
  With ``sharp_enabled_group = "dp_replica"`` (two or more distributed-optimizer instances) Megatron runs, and
  each rank issues a ``barrier`` on its inter-partial expert-DP group in every expert-DP iteration from the one
  that created it on: those barriers are modelled (ranks then differ: one Program per expert-DP group).
  ``NCCL_COLLNET_ENABLE`` itself is not modelled.
* ``all_gather_group`` (``--create-all-gather-group``): ``megatron/training/training.py::get_model`` calls
  ``create_all_gather_groups`` after ``initialize_model_parallel``: ``DATA_PARALLEL_GROUP_WITH_CP_AG`` per
  DP-with-CP group, and ``EXPERT_DATA_PARALLEL_GROUP_AG`` per expert-DP group when ep > 1, without pg_options
  (training passes no NCCL configs there).
* ``training`` (default: true, false with ``reinit_cycles > 1``): the startup of Megatron-LM's training entry
  point, ``pretrain_*`` / ``initialize_megatron`` (megatron/training/initialize.py), which most users run: after
  ``initialize_model_parallel`` (``finish_mpu_init``, :146) it calls ``_compile_dependencies()`` (:155), whose
  world ``torch.distributed.barrier()`` (:185) is the default group's first collective (``pretrain``'s start-time
  ``all_reduce`` follows on the same group). Since torch 2.15 that first use allocates the world communicator's
  buffers, and under legacy or a lazy policy creates it, so leaving it out would understate memory: false is
  for code that calls ``initialize_model_parallel`` itself (megatron-core as a library, its unit tests). A
  test suite's re-init cycles go through its ``Utils`` glue, not ``initialize_megatron``: ``training = true``
  with ``reinit_cycles > 1`` is refused.
* ``reinit_cycles`` / ``reinit_destroy``: the startup repeated as a test suite's destroy_model_parallel +
  initialize_model_parallel cycles, destroying only the gloo groups (the leak of Megatron-LM#6897) or every
  group made (PR #6902): ``simnccl.workloads.reinit``.
"""

from __future__ import annotations

from collections.abc import Sequence

from simnccl.ops import (
    NO_OPTIONS,
    WORLD,
    Barrier,
    Checkpoint,
    InitProcessGroup,
    NewGroup,
    Op,
    PgOptions,
    Program,
    SetDevice,
)
from simnccl.workloads._common import (
    BOOL,
    INT,
    INT_LIST,
    STR,
    STR_LIST,
    TABLE,
    Config,
    Generator,
    Param,
    WorkloadError,
    programs_by_key,
)
from simnccl.workloads.reinit import PARAMS as REINIT_PARAMS
from simnccl.workloads.reinit import with_reinit_cycles

Ranks = tuple[int, ...]

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
ORDER_TOKENS = ("tp", "pp", "dp", "ep", "cp")
NCCL_CFG_NAMES = (
    "dp",
    "dp_cp",
    "intra_dp_cp",
    "cp",
    "hcp",
    "mp",
    "tp",
    "pp",
    "embd",
    "pos_embd",
    "tp_dp_cp",
    "tp_dp",
    "tp_cp",
    "ep",
    "ep_tp",
    "tp_ep_mp",
    "tp_ep_pp",
    "ep_dp",
    "intra_ep_dp",
    "inter_ep_dp",
    "intra_dist_opt_instance",
    "gtp_remat",
    "gtp_remat_dp",
    "gtp_remat_dp_cp",
    "expt_gtp_remat",
    "tp_ep_gtp_remat_pp",
    "ep_gtp_remat_dp",
)
NCCL_CFG_KEYS = ("is_high_priority_stream", "cga_cluster_size", "max_ctas", "min_ctas", "net_name")
NCCL_NET_NAMES = ("ib", "socket")  # get_nccl_options raises RuntimeError for any other net_name (case-insensitive)
SHARP_ASSERTION = "data parallel group with CP (with GTP_remat) is not initialized"

PARAMS = (
    Param("tp", INT, 1, "tensor_model_parallel_size", minimum=1),
    Param("pp", INT, 1, "pipeline_model_parallel_size", minimum=1),
    Param("cp", INT, 1, "context_parallel_size", minimum=1),
    Param("dp", INT, None, "data-parallel size; Megatron derives it as world / (tp*pp*cp) (checked if given)", 1),
    Param("ep", INT, 1, "expert_model_parallel_size", minimum=1),
    Param("etp", INT, None, "expert_tensor_parallel_size (default: tp)", minimum=1),
    Param("order", STR, DEFAULT_ORDER, "RankGenerator order"),
    Param("hierarchical_cp", INT_LIST, None, "hierarchical_context_parallel_sizes (product must equal cp)", 1),
    Param("hybrid_cp", BOOL, False, "hybrid_context_parallel: HYBRID_DP_CP groups of every power of 2"),
    Param("num_distributed_optimizer_instances", INT, 1, "distributed-optimizer instances", minimum=1),
    Param("gloo", BOOL, True, "create_gloo_process_groups"),
    Param("all_gather_group", BOOL, False, "--create-all-gather-group: create_all_gather_groups after startup"),
    Param("use_sharp", BOOL, False, "--use-sharp (0.19.2 raises with sharp_enabled_group 'dp', the default)"),
    Param("sharp_enabled_group", STR, None, "--sharp-enabled-group (default 'dp')", choices=(None, "dp", "dp_replica")),
    Param("pipeline_comm_backend", STR, None, "pipeline_model_parallel_comm_backend", choices=(None, "nccl")),
    Param("nccl_comm_cfgs", TABLE, None, "per-group NCCL options (the --nccl-communicator-config-path YAML)"),
    Param("high_priority_stream_groups", STR_LIST, None, "group names whose options get is_high_priority_stream"),
    Param("gtp_remat_groups", BOOL, True, "the GTP weight-remat singleton families (False: not 0.19.2's startup)"),
    Param("distributed_timeout_minutes", INT, 10, "--distributed-timeout-minutes (Megatron's default 10)", 1),
    Param("backend", STR, "nccl", "--distributed-backend", choices=("nccl",)),
    Param(
        "training",
        BOOL,
        None,
        "the training entry's startup (pretrain / initialize_megatron): _compile_dependencies' world barrier after "
        "initialize_model_parallel (default: true; false with reinit_cycles > 1)",
    ),
    *REINIT_PARAMS,
)


# ---------------------------------------------------------------------------------------------- rank arithmetic


def _prefix_product(values: Sequence[int]) -> list[int]:
    out = [1]
    for v in values:
        out.append(out[-1] * v)
    return out


def _decompose(index: int, shape: Sequence[int]) -> list[int]:
    stride = _prefix_product(shape)
    return [(index // d) % s for s, d in zip(shape, stride, strict=False)]


def masked_orthogonal_groups(world_size: int, sizes: Sequence[int], mask: Sequence[bool]) -> list[Ranks]:
    """``generate_masked_orthogonal_rank_groups``: global_rank = sum(idx[i] * stride[i]) over the order."""
    masked_shape = [s for s, m in zip(sizes, mask, strict=True) if m]
    unmasked_shape = [s for s, m in zip(sizes, mask, strict=True) if not m]
    global_stride = _prefix_product(sizes)
    masked_stride = [d for d, m in zip(global_stride, mask, strict=False) if m]
    unmasked_stride = [d for d, m in zip(global_stride, mask, strict=False) if not m]
    group_size = _prefix_product(masked_shape)[-1]
    groups = []
    for group_index in range(world_size // group_size):
        base = sum(i * d for i, d in zip(_decompose(group_index, unmasked_shape), unmasked_stride, strict=True))
        ranks = tuple(
            base + sum(i * d for i, d in zip(_decompose(r, masked_shape), masked_stride, strict=True))
            for r in range(group_size)
        )
        groups.append(ranks)
    return groups


class RankGenerator:
    """Megatron's ``RankGenerator``: names to sizes, the order string, ``get_ranks("tp-dp")``."""

    def __init__(self, tp: int, ep: int, dp: int, pp: int, cp: int, order: str) -> None:
        if ep != 1 and cp != 1:
            raise WorkloadError("cp", "both ep and cp > 1 in one rank generator (Megatron asserts against it)")
        sizes = {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "cp": cp}
        tokens = order.lower().split("-")
        for name, size in sizes.items():
            if name not in tokens:
                if size != 1:
                    raise WorkloadError("order", f"the size of {name} is {size}, but the order {order!r} omits it")
                tokens.append(name)
        self.tokens = tokens
        self.sizes = [sizes[t] for t in tokens]
        self.world_size = tp * ep * dp * pp * cp
        self._cache: dict[str, list[Ranks]] = {}

    def get_ranks(self, token: str) -> list[Ranks]:
        groups = self._cache.get(token)
        if groups is None:
            wanted = token.split("-")
            mask = [t in wanted for t in self.tokens]
            groups = self._cache[token] = masked_orthogonal_groups(self.world_size, self.sizes, mask)
        return groups


def _check_order(order: str) -> None:
    tokens = order.lower().split("-")
    bad = [t for t in tokens if t not in ORDER_TOKENS]
    if bad or len(set(tokens)) != len(tokens):
        raise WorkloadError(
            "order", f"expected distinct tokens from {', '.join(ORDER_TOKENS)} joined by '-', got {order!r}"
        )


# ---------------------------------------------------------------------------------------------- sizes


def _dp(config: Config, world_size: int) -> int:
    model = config["tp"] * config["pp"] * config["cp"]
    if world_size % model:
        raise WorkloadError("tp", f"world_size ({world_size}) is not divisible by tp*pp*cp = {model}")
    dp = world_size // model
    if config["dp"] is not None and config["dp"] != dp:
        raise WorkloadError(
            "dp",
            f"tp*pp*cp*dp = {model * config['dp']} does not match the world of {world_size} ranks "
            f"(tp={config['tp']}, pp={config['pp']}, cp={config['cp']}, dp={config['dp']})",
        )
    return dp


def natural_world(config: Config) -> int | None:
    if config["dp"] is None:
        return None
    return config["tp"] * config["pp"] * config["cp"] * config["dp"]


def check(config: Config, world_size: int) -> None:
    _check_order(config["order"])
    if config["training"] and config["reinit_cycles"] > 1:
        raise WorkloadError(
            "training",
            "reinit cycles are a test suite's Utils glue, which does not go through initialize_megatron; "
            "set training = false (or leave it out) with reinit_cycles > 1",
        )
    dp = _dp(config, world_size)
    tp, pp, cp, ep = config["tp"], config["pp"], config["cp"], config["ep"]
    etp = config["etp"] if config["etp"] is not None else tp
    expert_model = etp * ep * pp
    if world_size % expert_model:
        raise WorkloadError(
            "ep",
            f"world_size ({world_size}) is not divisible by expert_tensor_model_pipeline size etp*ep*pp = "
            f"{expert_model}",
        )
    edp = world_size // expert_model
    instances = config["num_distributed_optimizer_instances"]
    if (dp * cp) % instances:
        raise WorkloadError(
            "num_distributed_optimizer_instances", f"dp*cp = {dp * cp} is not divisible by {instances} instances"
        )
    if edp % instances:
        raise WorkloadError(
            "num_distributed_optimizer_instances", f"expert dp = {edp} is not divisible by {instances} instances"
        )
    hcp = config["hierarchical_cp"]
    if hcp is not None:
        product = 1
        for s in hcp:
            product *= s
        if product != cp:
            raise WorkloadError("hierarchical_cp", f"the product of {list(hcp)} is {product}, expected cp = {cp}")
    if config["hybrid_cp"] and (dp * cp) % 2:
        raise WorkloadError("hybrid_cp", f"hybrid context parallel needs an even dp*cp, got {dp * cp}")
    order = config["order"]
    if not (order.endswith("pp") or pp == 1 or edp == dp):
        raise WorkloadError(
            "order", "when pp is not last in the order, the attention and MoE data-parallel sizes must match"
        )
    decoder = RankGenerator(tp, 1, dp, pp, cp, order)
    expert = RankGenerator(etp, ep, edp, pp, 1, order)
    if decoder.get_ranks("pp") != expert.get_ranks("pp"):
        raise WorkloadError("order", "pipeline groups differ between the dense and the expert rank generators")
    cfgs = config["nccl_comm_cfgs"] or {}
    for name, table in cfgs.items():
        if name not in NCCL_CFG_NAMES:
            raise WorkloadError(
                f"nccl_comm_cfgs.{name}", f"unknown process-group name; expected one of {', '.join(NCCL_CFG_NAMES)}"
            )
        if not isinstance(table, dict):
            raise WorkloadError(f"nccl_comm_cfgs.{name}", f"expected a table of NCCL options, got {table!r}")
        for key, value in table.items():
            if key not in NCCL_CFG_KEYS:
                raise WorkloadError(
                    f"nccl_comm_cfgs.{name}.{key}", f"unknown NCCL option; expected one of {', '.join(NCCL_CFG_KEYS)}"
                )
            where = f"nccl_comm_cfgs.{name}.{key}"
            if key == "is_high_priority_stream" and not isinstance(value, bool):
                raise WorkloadError(where, f"expected a boolean, got {value!r}")
            if key in ("cga_cluster_size", "max_ctas", "min_ctas") and (
                not isinstance(value, int) or isinstance(value, bool)
            ):
                raise WorkloadError(where, f"expected an integer, got {value!r}")
            if key == "net_name" and (not isinstance(value, str) or value.lower() not in NCCL_NET_NAMES):
                raise WorkloadError(where, f"net_name ({value}) is not supported. Accepted values: 'IB' or 'socket'.")
    for name in config["high_priority_stream_groups"] or ():
        if name not in NCCL_CFG_NAMES:
            raise WorkloadError(
                "high_priority_stream_groups",
                f"unknown group name {name!r}; expected one of {', '.join(NCCL_CFG_NAMES)}",
            )
    _check_sharp(config)


def _check_sharp(config: Config) -> None:
    """Megatron-Core 0.19.2's own SHARP assertions, and the AssertionError its default SHARP path raises."""
    group = config["sharp_enabled_group"]
    if not config["use_sharp"]:
        if group is not None:
            raise WorkloadError("sharp_enabled_group", "sharp_enabled_group is only valid when use_sharp is True")
        return
    if group == "dp_replica" and config["num_distributed_optimizer_instances"] < 2:
        raise WorkloadError("sharp_enabled_group", "dp_replica group requires num_distributed_optimizer_instances > 1")
    if group in (None, "dp"):
        raise WorkloadError(
            "use_sharp",
            f"megatron-core 0.19.2 raises AssertionError: {SHARP_ASSERTION} in initialize_model_parallel, right "
            "after creating the DATA_PARALLEL_GROUP_WITH_CP groups (its SHARP barrier reads a group assigned "
            'later in the function); this startup never completes. Use sharp_enabled_group = "dp_replica" '
            "(with num_distributed_optimizer_instances > 1) or use_sharp = false",
        )


# ---------------------------------------------------------------------------------------------- the program


def _nccl_options(config: Config) -> dict[str, PgOptions]:
    """``get_nccl_options`` for every configured name (the ones not configured get None)."""
    cfgs = {name: dict(table) for name, table in (config["nccl_comm_cfgs"] or {}).items()}
    for name in config["high_priority_stream_groups"] or ():
        cfgs.setdefault(name, {})["is_high_priority_stream"] = True
    return {
        name: PgOptions(
            is_high_priority_stream=bool(table.get("is_high_priority_stream", False)),
            cga_cluster_size=table.get("cga_cluster_size"),
            max_ctas=table.get("max_ctas"),
            min_ctas=table.get("min_ctas"),
            net_name=table.get("net_name"),
        )
        for name, table in cfgs.items()
    }


class _Ops:
    """Appends ``create_group`` calls; one instance per startup, shared by every rank."""

    def __init__(self, config: Config) -> None:
        self.ops: list[Op] = []
        self.options = _nccl_options(config)
        self.timeout_s = config["distributed_timeout_minutes"] * 60.0

    def create(
        self,
        ranks: Sequence[int],
        desc: str,
        bind: str,
        *,
        cfg: str | None,
        purpose: str,
        traffic: str = "collectives",
        backend: str | None = None,
        timeout: bool = True,
    ) -> None:
        options = self.options.get(cfg, NO_OPTIONS) if cfg is not None else NO_OPTIONS
        self.ops.append(
            NewGroup(
                ranks=tuple(sorted(ranks)),
                bind=bind,
                backend=backend,
                pg_options=options,
                group_desc=desc,
                timeout_s=self.timeout_s if timeout else None,
                purpose=purpose,
                traffic=traffic if backend != "gloo" else "collectives",
            )
        )


def _hierarchical(ranks: Ranks, sizes: Sequence[int]) -> list[list[Ranks]]:
    """``create_hierarchical_groups``: einops ``(l s u) -> (l u) s`` per level, u = prod(sizes[:level])."""
    levels = []
    for level, s in enumerate(sizes):
        u = 1
        for v in sizes[:level]:
            u *= v
        lo = len(ranks) // (s * u)
        groups = []
        for li in range(lo):
            for ui in range(u):
                groups.append(tuple(ranks[li * s * u + si * u + ui] for si in range(s)))
        levels.append(groups)
    return levels


def startup_ops(config: Config, world_size: int, edp_index: int | None = None) -> list[Op]:
    """Every call of Megatron's startup, in order.

    The same list on every rank, except with SHARP on ``dp_replica``: ``edp_index`` is then the index of the
    rank's expert-DP group, from whose iteration on the rank issues its barriers.
    """
    tp, pp, cp, ep = config["tp"], config["pp"], config["cp"], config["ep"]
    etp = config["etp"] if config["etp"] is not None else tp
    dp = _dp(config, world_size)
    edp = world_size // (etp * ep * pp)
    instances = config["num_distributed_optimizer_instances"]
    gloo = config["gloo"]
    decoder = RankGenerator(tp, 1, dp, pp, cp, config["order"])
    expert = RankGenerator(etp, ep, edp, pp, 1, config["order"])
    b = _Ops(config)
    b.ops += [
        SetDevice(),
        InitProcessGroup(backend=config["backend"], timeout_s=b.timeout_s),
        Checkpoint("after_init"),
    ]

    if config["gtp_remat_groups"]:  # gtp_remat = 1: one singleton per rank, before everything else
        for r in range(world_size):
            b.create((r,), "GTP_WEIGHT_REMAT_GROUP", "gtp_remat", cfg="gtp_remat", purpose="gtp_remat")

    intra = (dp * cp) // instances
    for ranks in decoder.get_ranks("dp-cp"):
        b.create(ranks, "DATA_PARALLEL_GROUP_WITH_CP", "dp_cp", cfg="dp_cp", purpose="dp")
        if gloo:
            b.create(ranks, "DATA_PARALLEL_GROUP_WITH_CP_GLOO", "dp_cp_gloo", cfg=None, purpose="dp", backend="gloo")
        if instances > 1:
            for i in range(instances):
                part = ranks[i * intra : (i + 1) * intra]
                b.create(
                    part, "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP", "intra_dp_cp", cfg="intra_dp_cp", purpose="dp"
                )
                if gloo:
                    b.create(
                        part,
                        "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO",
                        "intra_dp_cp_gloo",
                        cfg=None,
                        purpose="dp",
                        backend="gloo",
                    )

    if config["hybrid_cp"]:
        for ranks in decoder.get_ranks("dp-cp"):
            size = 2
            while size < len(ranks):  # [2**i for i in range(int(log2(len)))][1:]
                for i in range(0, len(ranks), size):
                    b.create(
                        ranks[i : i + size],
                        f"HYBRID_DP_CP_GROUP_{size}",
                        f"hybrid_dp_cp_{size}",
                        cfg="dp_cp",
                        purpose="dp",
                        timeout=False,
                    )
                size *= 2

    for ranks in decoder.get_ranks("dp"):
        b.create(ranks, "DATA_PARALLEL_GROUP", "dp", cfg="dp", purpose="dp")
        if gloo:
            b.create(ranks, "DATA_PARALLEL_GROUP_GLOO", "dp_gloo", cfg=None, purpose="dp", backend="gloo")

    hcp = config["hierarchical_cp"]
    for ranks in decoder.get_ranks("cp"):
        b.create(ranks, "CONTEXT_PARALLEL_GROUP", "cp", cfg="cp", purpose="cp", traffic="p2p")
        if hcp:
            for level, groups in enumerate(_hierarchical(ranks, hcp)):
                for sub in groups:
                    b.create(
                        sub,
                        f"HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L{level}",
                        f"hcp_l{level}",
                        cfg="hcp",
                        purpose="cp",
                        traffic="p2p",
                    )

    for ranks in decoder.get_ranks("tp-pp"):
        b.create(ranks, "MODEL_PARALLEL_GROUP", "mp", cfg="mp", purpose="mp")
    for ranks in decoder.get_ranks("tp"):
        b.create(ranks, "TENSOR_MODEL_PARALLEL_GROUP", "tp", cfg="tp", purpose="tp")

    pp_backend = config["pipeline_comm_backend"]
    for ranks in decoder.get_ranks("pp"):
        b.create(
            ranks, "PIPELINE_MODEL_PARALLEL_GROUP", "pp", cfg="pp", purpose="pp", traffic="p2p", backend=pp_backend
        )
        embedding = (ranks[0],) if len(ranks) == 1 else (ranks[0], ranks[-1])
        b.create(embedding, "EMBEDDING_GROUP", "embd", cfg="embd", purpose="embedding")
        b.create((ranks[0],), "POSITION_EMBEDDING_GROUP", "pos_embd", cfg="pos_embd", purpose="position_embedding")

    for ranks in decoder.get_ranks("tp-dp-cp"):
        b.create(ranks, "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", "tp_dp_cp", cfg="tp_dp_cp", purpose="tp_dp_cp")
    for ranks in decoder.get_ranks("tp-dp"):
        b.create(ranks, "TENSOR_AND_DATA_PARALLEL_GROUP", "tp_dp", cfg="tp_dp", purpose="tp_dp")
    for ranks in decoder.get_ranks("tp-cp"):
        b.create(ranks, "TENSOR_AND_CONTEXT_PARALLEL_GROUP", "tp_cp", cfg="tp_cp", purpose="tp_cp")

    if config["gtp_remat_groups"]:  # expert gtp_remat = 1: W singletons again
        for r in range(world_size):
            b.create(
                (r,), "EXPERT_GTP_WEIGHT_REMAT_GROUP", "expert_gtp_remat", cfg="expt_gtp_remat", purpose="gtp_remat"
            )

    for ranks in expert.get_ranks("ep"):
        b.create(ranks, "EXPERT_MODEL_PARALLEL_GROUP", "ep", cfg="ep", purpose="ep")
    for ranks in expert.get_ranks("tp"):
        b.create(ranks, "EXPERT_TENSOR_PARALLEL_GROUP", "etp", cfg="ep_tp", purpose="etp")
    for ranks in expert.get_ranks("tp-ep"):
        b.create(ranks, "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "tp_ep", cfg="tp_ep_mp", purpose="tp_ep")
    for ranks in expert.get_ranks("tp-ep-pp"):
        b.create(ranks, "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "tp_ep_pp", cfg="tp_ep_pp", purpose="tp_ep_pp")
    for ranks in expert.get_ranks("tp-ep-pp"):  # 'tp-ep-gtp_remat-pp' with gtp_remat = 1: the same rank sets
        b.create(
            ranks,
            "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP",
            "tp_ep_pp_egtp",
            cfg="tp_ep_gtp_remat_pp",
            purpose="tp_ep_pp",
        )

    intra_edp = edp // instances
    sharp_replica = config["use_sharp"] and config["sharp_enabled_group"] == "dp_replica"
    for index, ranks in enumerate(expert.get_ranks("dp")):
        b.create(ranks, "EXPERT_DATA_PARALLEL_GROUP", "edp", cfg="ep_dp", purpose="edp")
        if gloo:
            b.create(
                ranks,
                "EXPERT_DATA_PARALLEL_GROUP_GLOO",
                "edp_gloo",
                cfg=None,
                purpose="edp",
                backend="gloo",
                timeout=False,
            )
        if instances > 1:
            cfg_names = ("intra_ep_dp", "inter_ep_dp")
            for level, groups in enumerate(_hierarchical(ranks, (intra_edp, instances))):
                for sub in groups:
                    b.create(
                        sub,
                        f"HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L{level}",
                        f"edp_l{level}",
                        cfg=cfg_names[level],
                        purpose="edp",
                    )
                    if gloo:  # create_hierarchical_groups passes the level's NCCL options to the gloo twin too
                        b.create(
                            sub,
                            f"HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_GLOO_L{level}",
                            f"edp_gloo_l{level}",
                            cfg=cfg_names[level],
                            purpose="edp",
                            backend="gloo",
                        )
            if sharp_replica and edp_index is not None and index >= edp_index:
                # SHARP on dp_replica: a barrier on the rank's inter-partial expert-DP group, once it has one
                b.ops.append(Barrier(group="edp_l1"))

    batch: list[int] = []
    for index, ranks in enumerate(expert.get_ranks("tp-ep-pp"), start=1):
        batch.extend(ranks)
        if index % intra_edp == 0:
            b.create(
                batch,
                "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
                "intra_dist_opt",
                cfg="intra_dist_opt_instance",
                purpose="dp",
            )
            batch = []

    if training(config):  # initialize_megatron -> _compile_dependencies: a world barrier (initialize.py:155, :185)
        b.ops.append(Barrier(group=WORLD))

    if config["all_gather_group"]:  # training.get_model: create_all_gather_groups(nccl_comm_cfgs=None)
        for ranks in decoder.get_ranks("dp-cp"):
            b.create(ranks, "DATA_PARALLEL_GROUP_WITH_CP_AG", "dp_cp_ag", cfg=None, purpose="dp")
        if ep > 1:
            for ranks in expert.get_ranks("dp"):
                b.create(ranks, "EXPERT_DATA_PARALLEL_GROUP_AG", "edp_ag", cfg=None, purpose="edp")

    b.ops.append(Checkpoint("startup"))
    return b.ops


def training(config: Config) -> bool:
    """Whether the startup is the training entry's (``initialize_megatron``): the ``training`` knob, by default
    true for one startup and false for a test suite's re-init cycles (``reinit_cycles > 1``)."""
    if config["training"] is not None:
        return config["training"]
    return config["reinit_cycles"] == 1


def build(config: Config, world_size: int) -> tuple[Program, ...]:
    """Every rank's startup, repeated as ``reinit_cycles`` initialisations (``simnccl.workloads.reinit``)."""
    return with_reinit_cycles(_startups(config, world_size), config["reinit_cycles"], config["reinit_destroy"])


def _startups(config: Config, world_size: int) -> tuple[Program, ...]:
    if not (config["use_sharp"] and config["sharp_enabled_group"] == "dp_replica"):
        shared = startup_ops(config, world_size)
        return programs_by_key(world_size, lambda rank: None, lambda _: shared)
    etp = config["etp"] if config["etp"] is not None else config["tp"]
    edp = world_size // (etp * config["ep"] * config["pp"])
    expert = RankGenerator(etp, config["ep"], edp, config["pp"], 1, config["order"])
    index_of = {r: i for i, ranks in enumerate(expert.get_ranks("dp")) for r in ranks}
    return programs_by_key(world_size, index_of.__getitem__, lambda i: startup_ops(config, world_size, i))


GENERATOR = Generator(
    name="megatron",
    framework="Megatron-Core",
    source="megatron-core 0.19.2: megatron/core/parallel_state.py, megatron/training/initialize.py",
    params=PARAMS,
    build=build,
    natural_world=natural_world,
    check=check,
    doc="initialize_model_parallel: every rank creates every group (NCCL + gloo twins), in Megatron's order",
)
