"""SGLang (srt) startup: ``init_distributed_environment`` then ``initialize_model_parallel``.

Follows ``python/sglang/srt/distributed/parallel_state.py`` of sgl-project/sglang (read at 0005973, 2026),
as ../shared/reference/framework-startup.md §2 summarises it:

* ``init_process_group(backend="nccl", init_method, world_size, rank, timeout, pg_options=None)`` with no
  ``device_id``; then ``_WORLD = init_world_group(...)``, a GroupCoordinator over all ranks.
* The world is one engine's TP x PP (``world_size == tp * pp`` is asserted); DP-attention ranks live inside TP.
  Plain (non-attention) DP runs separate engines with separate worlds and is out of scope here.
* ``GroupCoordinator.__init__``: for every group of the family and on every rank,
  ``new_group(ranks, backend, pg_options, timeout, group_desc=f"{name}:device")`` then
  ``new_group(ranks, backend="gloo", timeout=gloo_timeout (120 min), group_desc=f"{name}:cpu")``.
* ``initialize_model_parallel`` order: tp; pdmux_prefill_tp (a duplicate TP family, only with
  PD-multiplexing); dcp (only when dcp > 1); attn_cp (alias of tp when attn_cp == tp, else new groups —
  singletons when attn_cp == 1 < tp); attention_tp (alias when attn_tp == tp); shared_experts_tp (only when
  its size > 1 and differs from attn_tp); moe_dp (alias of attn_cp when attn_cp > moe_dp, of tp when
  moe_dp == tp); moe_ep (alias when ep == tp); moe_tp (alias when moe_tp == tp); pp; self_pp (W singletons for
  the one-layer draft; present in the source read, not in the reference's summary: ``self_pp_group``).
  Aliases create no group. The call list is rank-independent: every rank shares one Program.

Not modelled: PyNccl / custom all-reduce / mscclpp / symm-mem communicators (not torch groups), Mooncake
backends, and the closed nccl2-routing PRs (sglang#27834, #33434, #33439, #33440).
"""

from __future__ import annotations

from simnccl.ops import Checkpoint, InitProcessGroup, NewGroup, Op, SetDevice
from simnccl.workloads._common import BOOL, INT, Config, Generator, Param, WorkloadError, same_for_all

Ranks = tuple[int, ...]

GLOO_TIMEOUT_S = 120 * 60.0

PARAMS = (
    Param("tp", INT, None, "--tp-size (default: world / pp)", minimum=1),
    Param("pp", INT, 1, "--pp-size", minimum=1),
    Param("ep", INT, 1, "--ep-size (moe_ep)", minimum=1),
    Param("attn_dp", INT, 1, "attention data parallel size (--dp with --enable-dp-attention)", minimum=1),
    Param("attn_cp", INT, 1, "attention context parallel size", minimum=1),
    Param("moe_dp", INT, 1, "moe data parallel size", minimum=1),
    Param("dcp", INT, 1, "decode context parallel size (inside each TP group)", minimum=1),
    Param("shared_experts_tp", INT, None, "shared-expert TP width (must divide attention TP)", minimum=1),
    Param("pdmux", BOOL, False, "PD-multiplexing: the duplicate pdmux_prefill_tp family"),
    Param("self_pp_group", BOOL, True, "the one-layer draft's singleton PP family (source 0005973)"),
)


def _tp(config: Config, world_size: int) -> int:
    pp = config["pp"]
    if world_size % pp:
        raise WorkloadError("pp", f"the world of {world_size} ranks is not divisible by pp = {pp}")
    tp = config["tp"] if config["tp"] is not None else world_size // pp
    if tp * pp != world_size:
        raise WorkloadError(
            "tp", f"world_size ({world_size}) is not equal to tp ({tp}) x pp ({pp}) (SGLang asserts it)"
        )
    return tp


def natural_world(config: Config) -> int | None:
    return None if config["tp"] is None else config["tp"] * config["pp"]


def _widths(config: Config, tp: int) -> tuple[int, int]:
    """``derive_parallel_widths``: attn_tp = tp / attn_cp / attn_dp, moe_tp = tp / ep / moe_dp."""
    attn = config["attn_cp"] * config["attn_dp"]
    if tp % attn:
        raise WorkloadError("attn_cp", f"tp ({tp}) is not divisible by attn_cp*attn_dp = {attn}")
    moe = config["ep"] * config["moe_dp"]
    if tp % moe:
        raise WorkloadError("ep", f"tp ({tp}) is not divisible by ep*moe_dp = {moe}")
    return tp // attn, tp // moe


def check(config: Config, world_size: int) -> None:
    tp = _tp(config, world_size)
    attn_tp, _ = _widths(config, tp)
    if tp % config["dcp"]:
        raise WorkloadError("dcp", f"tp ({tp}) must be divisible by dcp ({config['dcp']})")
    shared = config["shared_experts_tp"]
    if shared is not None and shared > 1 and attn_tp % shared:
        raise WorkloadError("shared_experts_tp", f"{shared} must divide the attention TP width {attn_tp}")


def families(config: Config, world_size: int) -> list[tuple[str, list[Ranks]]]:
    """(group_name, group_ranks) of every GroupCoordinator that creates groups, in SGLang's order."""
    tp = _tp(config, world_size)
    attn_tp, moe_tp = _widths(config, tp)
    attn_cp, attn_dp = config["attn_cp"], config["attn_dp"]
    ep, moe_dp = config["ep"], config["moe_dp"]
    n_tp = world_size // tp
    out: list[tuple[str, list[Ranks]]] = [("world", [tuple(range(world_size))])]
    tp_groups = [tuple(range(i * tp, (i + 1) * tp)) for i in range(n_tp)]
    out.append(("tp", tp_groups))
    if config["pdmux"]:
        out.append(("pdmux_prefill_tp", tp_groups))
    if config["dcp"] > 1:
        d = config["dcp"]
        out.append(("dcp", [g[s : s + d] for g in tp_groups for s in range(0, tp, d)]))
    if attn_cp != tp:
        groups = []
        for t in range(n_tp):
            for dp_idx in range(attn_dp):
                for a in range(attn_tp):
                    st = t * tp + dp_idx * attn_tp * attn_cp + a
                    en = t * tp + (dp_idx + 1) * attn_tp * attn_cp + a
                    groups.append(tuple(range(st, en, attn_tp)))
        out.append(("attn_cp", groups))
    if attn_tp != tp:
        groups = []
        for t in range(n_tp):
            for c in range(attn_cp * attn_dp):
                groups.append(tuple(range(t * tp + c * attn_tp, t * tp + (c + 1) * attn_tp)))
        out.append(("attention_tp", groups))
    shared = config["shared_experts_tp"]
    if shared is not None and shared > 1 and shared != attn_tp:
        out.append(("shared_experts_tp", [tuple(range(s, s + shared)) for s in range(0, world_size, shared)]))
    if not (attn_cp > moe_dp or moe_dp == tp):
        groups = []
        for t in range(n_tp):
            for c in range(moe_tp * ep):
                groups.append(tuple(range(t * tp + c, (t + 1) * tp + c, moe_tp * ep)))
        out.append(("moe_dp", groups))
    if ep != tp:
        groups = []
        for t in range(n_tp):
            for d in range(moe_dp):
                for m in range(moe_tp):
                    st = t * tp + d * ep * moe_tp + m
                    groups.append(tuple(range(st, st + ep * moe_tp, moe_tp)))
        out.append(("moe_ep", groups))
    if moe_tp != tp:
        groups = []
        for t in range(n_tp):
            for c in range(ep * moe_dp):
                groups.append(tuple(range(t * tp + c * moe_tp, t * tp + (c + 1) * moe_tp)))
        out.append(("moe_tp", groups))
    n_pp = world_size // config["pp"]
    out.append(("pp", [tuple(range(i, world_size, n_pp)) for i in range(n_pp)]))
    if config["self_pp_group"]:
        out.append(("self_pp", [(r,) for r in range(world_size)]))
    return out


def startup_ops(config: Config, world_size: int) -> list[Op]:
    ops: list[Op] = [SetDevice(), InitProcessGroup(backend="nccl"), Checkpoint("after_init")]
    for name, group_ranks in families(config, world_size):
        traffic = "p2p" if name in ("pp", "self_pp") else "collectives"
        for ranks in group_ranks:
            ops.append(
                NewGroup(
                    ranks=ranks, backend="nccl", bind=name, group_desc=f"{name}:device", purpose=name, traffic=traffic
                )
            )
            ops.append(
                NewGroup(
                    ranks=ranks,
                    backend="gloo",
                    bind=f"{name}_cpu",
                    group_desc=f"{name}:cpu",
                    timeout_s=GLOO_TIMEOUT_S,
                    purpose=name,
                    traffic="collectives",
                )
            )
    ops.append(Checkpoint("startup"))
    return ops


def build(config: Config, world_size: int):
    return same_for_all(world_size, startup_ops(config, world_size))


GENERATOR = Generator(
    name="sglang",
    framework="SGLang",
    source="sgl-project/sglang python/sglang/srt/distributed/parallel_state.py @ 0005973 (2026)",
    params=PARAMS,
    build=build,
    natural_world=natural_world,
    check=check,
    doc="GroupCoordinator twins (NCCL + gloo) for tp, attention/moe families (aliases skipped), pp",
)
