"""Framework startup generators: group lists against independent expectations, call order, sharing, errors."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from simnccl.cluster import Cluster, get_gpu_kind
from simnccl.comm_memory import Pricer
from simnccl.engine import Engine, RunOutcome, SimConfig
from simnccl.ops import (
    Alloc,
    AllReduce,
    Barrier,
    Broadcast,
    Checkpoint,
    InitProcessGroup,
    MemoryCheck,
    NewGroup,
    Program,
    Raise,
    Recv,
    Send,
    SetDevice,
    SplitGroup,
)
from simnccl.policy import get_policy
from simnccl.profiles import find_profile
from simnccl.release import get_release
from simnccl.workloads import GENERATORS, WorkloadError, generate, get_generator
from simnccl.workloads import megatron as mg
from simnccl.workloads import vllm as vl

CONTEXT_MIB = 392.0  # h100-80gb CUDA context
PROFILE = find_profile("h100-80gb", "2.15")
PROCESS_MIB = PROFILE.comm.process_mib  # NCCL's once-per-process cost, with the first communicator


def priced_mib(groups, rank: int, nodes: int, gpus: int, uses: dict | None = None) -> float:
    """What ``rank``'s communicators of ``groups`` (member tuples) cost, as NCCL's mechanics price them
    (simnccl.comm_memory): each at init, plus the first call of each collective named in ``uses[i]`` for the
    i-th group."""
    pricer = Pricer(PROFILE, Cluster(get_gpu_kind("h100-80gb"), nodes, gpus).node_of)
    total = 0
    for i, ranks in enumerate(groups):
        memory = pricer.create(ranks, ranks.index(rank), {})
        for collective in (uses or {}).get(i, ()):
            pricer.use(memory, collective, 4 * 2**20)
        total += memory.breakdown.device_bytes
    return total / 2**20


def member_sets(program: Program, rank: int, *, splits: bool = False) -> list[tuple[int, ...]]:
    """The rank sets of the NCCL groups ``rank`` joins (new_group calls, or with ``splits`` its split_group
    colors, one communicator per split, cpu ones included), in program order."""
    if splits:
        return [s for op in program.ops if isinstance(op, SplitGroup) for s in op.split_ranks if rank in s]
    return [op.ranks for op in new_groups(program) if rank in op.ranks and op.backend in (None, "nccl")]


def new_groups(program: Program, backend: object = ...) -> list[NewGroup]:
    ops = [op for op in program.ops if isinstance(op, NewGroup)]
    return ops if backend is ... else [op for op in ops if op.backend == backend]


def by_desc(program: Program) -> dict[str, list[tuple[int, ...]]]:
    out: dict[str, list[tuple[int, ...]]] = {}
    for op in new_groups(program):
        out.setdefault(op.group_desc, []).append(op.ranks)
    return out


def run(programs: tuple[Program, ...], nodes: int, gpus: int, *, env=None, policy=None) -> RunOutcome:
    config = SimConfig(
        cluster=Cluster(get_gpu_kind("h100-80gb"), nodes, gpus),
        release=get_release("2.15"),
        profile=find_profile("h100-80gb", "2.15"),
        programs=programs,
        env=env or {},
        policy=get_policy(policy) if policy else None,
    )
    return Engine(config).run()


def used(outcome: RunOutcome, checkpoint: str) -> list[float]:
    return [s.used_bytes / 2**20 for _, s in sorted(outcome.checkpoints[checkpoint].items())]


# ---------------------------------------------------------------------------------------------- registry


def test_registry_has_the_five_frameworks_with_sources() -> None:
    assert sorted(GENERATORS) == ["deepspeed", "megatron", "sglang", "torchtitan", "vllm"]
    for name, generator in GENERATORS.items():
        module = __import__(f"simnccl.workloads.{name}", fromlist=["x"])
        assert module.__doc__ and "Follows" in module.__doc__, name
        assert re.search(r"@ \w+|\d+\.\d+\.\d+", generator.source), name  # the commit or release it follows


@pytest.mark.parametrize(
    ("name", "args", "key", "text"),
    [
        ("megatron", {"tp": 8, "pp": 4, "dp": 8}, "dp", "does not match the world of 512"),
        ("megatron", {"tp": 3}, "tp", "not divisible"),
        ("megatron", {"tp": "8"}, "tp", "expected an integer, got a string '8'"),
        ("megatron", {"tp": True}, "tp", "expected an integer, got a boolean"),
        ("megatron", {"tensor_parallel": 8}, "tensor_parallel", "unknown argument"),
        ("megatron", {"tp": 8, "hierarchical_cp": [2, 2]}, "hierarchical_cp", "expected cp = 1"),
        ("megatron", {"tp": 8, "order": "tp-xx-pp"}, "order", "distinct tokens"),
        ("megatron", {"tp": 8, "nccl_comm_cfgs": {"bogus": {}}}, "nccl_comm_cfgs.bogus", "unknown process-group"),
        ("megatron", {"tp": 8, "pipeline_comm_backend": "ucc"}, "pipeline_comm_backend", "expected one of"),
        ("megatron", {"tp": 0}, "tp", ">= 1"),
        ("vllm", {"tp": 8, "dcp": 3}, "dcp", "divisible"),
        ("vllm", {"tp": 8, "dp": 2}, "dp", "does not match"),
        ("vllm", {"tp": 8, "enable_eplb": True}, "enable_eplb", "MoE"),
        ("vllm", {"tp": 8, "gpu_memory_utilization": 1.5}, "gpu_memory_utilization", "fraction"),
        ("sglang", {"tp": 8, "pp": 2}, "tp", "not equal to tp"),
        ("sglang", {"tp": 512, "ep": 3}, "ep", "not divisible"),
        ("torchtitan", {"tp": 8, "dp_shard": 4}, "dp_shard", "!= WORLD_SIZE(512)"),
        ("torchtitan", {"tp": 8, "ep": 3}, "ep", "must divide"),
        ("deepspeed", {"pp": 4, "dp": 4}, "dp", "does not match"),
        ("deepspeed", {"zero_hpz_partition_size": 8}, "zero_hpz_partition_size", "stage 3"),
    ],
)
def test_bad_arguments_name_the_key(name: str, args: dict, key: str, text: str) -> None:
    with pytest.raises(WorkloadError) as info:
        generate(name, args, 512)
    assert info.value.key == key
    assert text in info.value.message


def test_unknown_generator_and_bad_world() -> None:
    with pytest.raises(WorkloadError, match="unknown workload generator 'jax'"):
        get_generator("jax")
    with pytest.raises(WorkloadError, match="positive integer"):
        generate("megatron", {}, 0)


# ---------------------------------------------------------------------------------------------- Megatron


def test_megatron_rank_generator_matches_its_docstring_examples() -> None:
    # generate_masked_orthogonal_rank_groups docstring: [tp=2, dp=3, pp=4], mask dp.
    groups = mg.masked_orthogonal_groups(24, [2, 3, 4], [False, True, False])
    assert groups[0] == (0, 2, 4) and groups[1] == (1, 3, 5) and groups[7] == (19, 21, 23)
    # initialize_model_parallel docstring: 16 GPUs, tp=2, pp=4.
    gen = mg.RankGenerator(tp=2, ep=1, dp=2, pp=4, cp=1, order="tp-cp-ep-dp-pp")
    assert gen.get_ranks("dp") == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    assert gen.get_ranks("tp") == [(2 * i, 2 * i + 1) for i in range(8)]
    assert gen.get_ranks("pp") == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]
    # hierarchical groups docstring: 16 ranks at [2, 2, 4].
    levels = mg._hierarchical(tuple(range(16)), (2, 2, 4))
    assert levels[0][:2] == [(0, 1), (2, 3)] and len(levels[0]) == 8
    assert levels[1][:4] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert levels[2] == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]


@pytest.fixture(scope="module")
def megatron_512() -> tuple[Program, ...]:
    return generate("megatron", {"tp": 8, "pp": 4, "dp": 16}, 512)


def test_megatron_512_shares_one_program(megatron_512) -> None:
    assert len(megatron_512) == 512
    assert all(p is megatron_512[0] for p in megatron_512)


def test_megatron_512_group_families_and_counts(megatron_512) -> None:
    program = megatron_512[0]
    groups = by_desc(program)
    expected_counts = {
        "GTP_WEIGHT_REMAT_GROUP": 512,
        "DATA_PARALLEL_GROUP_WITH_CP": 32,
        "DATA_PARALLEL_GROUP_WITH_CP_GLOO": 32,
        "DATA_PARALLEL_GROUP": 32,
        "DATA_PARALLEL_GROUP_GLOO": 32,
        "CONTEXT_PARALLEL_GROUP": 512,
        "MODEL_PARALLEL_GROUP": 16,
        "TENSOR_MODEL_PARALLEL_GROUP": 64,
        "PIPELINE_MODEL_PARALLEL_GROUP": 128,
        "EMBEDDING_GROUP": 128,
        "POSITION_EMBEDDING_GROUP": 128,
        "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": 4,
        "TENSOR_AND_DATA_PARALLEL_GROUP": 4,
        "TENSOR_AND_CONTEXT_PARALLEL_GROUP": 64,
        "EXPERT_GTP_WEIGHT_REMAT_GROUP": 512,
        "EXPERT_MODEL_PARALLEL_GROUP": 512,
        "EXPERT_TENSOR_PARALLEL_GROUP": 64,
        "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": 64,
        "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": 16,
        "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP": 16,
        "EXPERT_DATA_PARALLEL_GROUP": 32,
        "EXPERT_DATA_PARALLEL_GROUP_GLOO": 32,
        "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP": 1,
    }
    assert {k: len(v) for k, v in groups.items()} == expected_counts
    assert len(new_groups(program)) == 2937
    # Independent expectations: TP = contiguous blocks of 8; DP strided by 8 within a stage of 128; PP strided
    # by 128 (the stage size); embedding = first and last stage; position embedding = first stage.
    assert groups["TENSOR_MODEL_PARALLEL_GROUP"] == [tuple(range(b, b + 8)) for b in range(0, 512, 8)]
    assert groups["DATA_PARALLEL_GROUP"] == [
        tuple(stage * 128 + t + 8 * d for d in range(16)) for stage in range(4) for t in range(8)
    ]
    assert groups["PIPELINE_MODEL_PARALLEL_GROUP"] == [tuple(r + 128 * s for s in range(4)) for r in range(128)]
    assert groups["EMBEDDING_GROUP"] == [(r, r + 384) for r in range(128)]
    assert groups["POSITION_EMBEDDING_GROUP"] == [(r,) for r in range(128)]
    assert groups["DATA_PARALLEL_GROUP"] == groups["DATA_PARALLEL_GROUP_WITH_CP"]  # cp = 1
    # one instance: all tp-ep-pp groups batched into one world-sized group (Megatron passes it unsorted; torch's
    # new_group sorts it)
    assert groups["INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP"] == [tuple(range(512))]
    # megatron-core 0.19.2 repeats the tp-ep-pp rank sets in the EGTP family (expert gtp_remat = 1)
    assert (
        groups["EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP"]
        == groups["EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP"]
    )
    # Every covering family puts each rank in exactly one group.
    for desc, family in groups.items():
        if desc in ("EMBEDDING_GROUP", "POSITION_EMBEDDING_GROUP"):
            continue
        assert sorted(r for g in family for r in g) == list(range(512)), desc


def test_megatron_call_order_follows_initialize_model_parallel(megatron_512) -> None:
    ops = megatron_512[0].ops
    assert isinstance(ops[0], SetDevice)
    assert ops[1] == InitProcessGroup(backend="nccl", timeout_s=600.0)  # --distributed-timeout-minutes 10
    assert isinstance(ops[-1], Checkpoint) and ops[-1].label == "startup"
    order = []
    for op in new_groups(megatron_512[0]):
        if not order or order[-1] != op.group_desc:
            order.append(op.group_desc)
    assert order[:4] == [
        "GTP_WEIGHT_REMAT_GROUP",
        "DATA_PARALLEL_GROUP_WITH_CP",
        "DATA_PARALLEL_GROUP_WITH_CP_GLOO",
        "DATA_PARALLEL_GROUP_WITH_CP",
    ]  # each DP-with-CP group is followed by its gloo twin
    firsts = list(dict.fromkeys(order))
    assert firsts == [
        "GTP_WEIGHT_REMAT_GROUP",
        "DATA_PARALLEL_GROUP_WITH_CP",
        "DATA_PARALLEL_GROUP_WITH_CP_GLOO",
        "DATA_PARALLEL_GROUP",
        "DATA_PARALLEL_GROUP_GLOO",
        "CONTEXT_PARALLEL_GROUP",
        "MODEL_PARALLEL_GROUP",
        "TENSOR_MODEL_PARALLEL_GROUP",
        "PIPELINE_MODEL_PARALLEL_GROUP",
        "EMBEDDING_GROUP",
        "POSITION_EMBEDDING_GROUP",
        "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP",
        "TENSOR_AND_DATA_PARALLEL_GROUP",
        "TENSOR_AND_CONTEXT_PARALLEL_GROUP",
        "EXPERT_GTP_WEIGHT_REMAT_GROUP",
        "EXPERT_MODEL_PARALLEL_GROUP",
        "EXPERT_TENSOR_PARALLEL_GROUP",
        "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP",
        "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP",
        "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP",
        "EXPERT_DATA_PARALLEL_GROUP",
        "EXPERT_DATA_PARALLEL_GROUP_GLOO",
        "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
    ]
    # pp, embedding and position embedding interleave per pipeline group
    pp_block = [
        op.group_desc
        for op in new_groups(megatron_512[0])
        if "EMBEDDING" in op.group_desc or "PIPELINE" in op.group_desc
    ]
    assert pp_block[:3] == ["PIPELINE_MODEL_PARALLEL_GROUP", "EMBEDDING_GROUP", "POSITION_EMBEDDING_GROUP"]
    pp = [op for op in new_groups(megatron_512[0]) if op.group_desc == "PIPELINE_MODEL_PARALLEL_GROUP"]
    assert all(op.traffic == "p2p" and op.purpose == "pp" for op in pp)
    assert all(op.timeout_s == 600.0 for op in pp)


def test_megatron_options_gloo_expert_and_hierarchical_groups() -> None:
    args = {
        "tp": 2,
        "cp": 4,
        "hierarchical_cp": [2, 2],
        "ep": 4,
        "etp": 1,
        "num_distributed_optimizer_instances": 2,
        "gloo": False,
        "nccl_comm_cfgs": {"dp_cp": {"is_high_priority_stream": True, "max_ctas": 16}},
        "high_priority_stream_groups": ["tp"],
        "use_sharp": True,
        "sharp_enabled_group": "dp_replica",
        "gtp_remat_groups": False,
    }
    programs = generate("megatron", args, 16)  # dp = 2
    program = programs[0]
    assert not new_groups(program, "gloo")
    groups = by_desc(program)
    assert "GTP_WEIGHT_REMAT_GROUP" not in groups
    assert groups["CONTEXT_PARALLEL_GROUP"] == [(0, 2, 4, 6), (1, 3, 5, 7), (8, 10, 12, 14), (9, 11, 13, 15)]
    # hierarchical CP [2, 2] inside each CP group, created right after it
    assert groups["HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L0"][:2] == [(0, 2), (4, 6)]
    assert groups["HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L1"][:2] == [(0, 4), (2, 6)]
    # two distributed-optimizer instances: intra-partial DP-with-CP halves and hierarchical expert DP
    assert groups["DATA_PARALLEL_GROUP_WITH_CP"][0] == (0, 2, 4, 6, 8, 10, 12, 14)
    assert groups["INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP"][:2] == [(0, 2, 4, 6), (8, 10, 12, 14)]
    assert groups["EXPERT_MODEL_PARALLEL_GROUP"] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    assert groups["EXPERT_DATA_PARALLEL_GROUP"] == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]
    assert "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L1" in groups
    assert len(groups["INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP"]) == 2
    # nccl_comm_cfgs-style options, every field kept (max_ctas recorded, not modelled); tp high priority via the list
    for op in new_groups(program):
        high = op.group_desc in ("DATA_PARALLEL_GROUP_WITH_CP", "TENSOR_MODEL_PARALLEL_GROUP")
        assert op.pg_options.is_high_priority_stream is high, op.group_desc
        assert op.pg_options.max_ctas == (16 if op.group_desc == "DATA_PARALLEL_GROUP_WITH_CP" else None)
    # SHARP on dp_replica: each rank barriers on its inter-partial expert-DP group in every expert-DP iteration
    # from the one that created it (expert-DP groups (0,4,8,12), (1,5,9,13), ... in that order)
    for rank, count in ((0, 4), (1, 3), (3, 1), (15, 1)):
        barriers = [op for op in programs[rank].ops if isinstance(op, Barrier) and op.group != "world"]
        assert barriers == [Barrier(group="edp_l1")] * count, rank
    assert programs[0] is programs[4] and programs[0] is not programs[1]


def test_megatron_memory_on_2_15_legacy_and_dedupe() -> None:
    programs = generate("megatron", {"tp": 8, "pp": 2, "training": False}, 32)  # initialize_model_parallel alone
    default = used(run(programs, 4, 8), "startup")
    # 19 NCCL groups per rank (22 held - 3 gloo; the EGTP family included) + the default group; +1
    # position-embedding group (one rank) on stage 0.
    world = tuple(range(32))
    sets = {rank: member_sets(programs[rank], rank) for rank in (0, 16)}
    assert len(sets[0]) == 20 and len(sets[16]) == 19
    stage0 = CONTEXT_MIB + PROCESS_MIB + priced_mib([world, *sets[0]], 0, 4, 8)
    others = CONTEXT_MIB + PROCESS_MIB + priced_mib([world, *sets[16]], 16, 4, 8)
    assert [round(v, 1) for v in default] == [round(stage0, 1)] * 16 + [round(others, 1)] * 16
    assert stage0 - others == pytest.approx(priced_mib([(0,)], 0, 1, 1), abs=0.1)  # a one-rank group: 388 MiB
    legacy = used(run(programs, 4, 8, env={"TORCH_DIST_USE_NCCL2": "0"}), "startup")
    assert legacy == [CONTEXT_MIB] * 32
    dedupe = used(run(programs, 4, 8, policy="dedupe"), "startup")
    distinct = list(dict.fromkeys(sets[16]))
    assert len(distinct) == 7
    assert dedupe[16] == pytest.approx(CONTEXT_MIB + PROCESS_MIB + priced_mib([world, *distinct], 16, 4, 8), abs=0.1)


def test_megatron_training_entry_barrier_uses_the_world_communicator() -> None:
    """``initialize_megatron``'s ``_compile_dependencies`` barrier (megatron/training/initialize.py:185), on by
    default: the default group's first use, so 2.15 allocates its connections and the process's first collective,
    and legacy creates it, where ``initialize_model_parallel`` alone leaves every communicator unused (legacy: none)."""
    training = generate("megatron", {"tp": 4}, 8)
    alone = generate("megatron", {"tp": 4, "training": False}, 8)
    assert training[0].ops[-2:] == (Barrier(group="world"), Checkpoint("startup"))
    assert training[0].ops[:-2] == alone[0].ops[:-1]
    for env in ({}, {"TORCH_DIST_USE_NCCL2": "0"}):
        more = used(run(training, 1, 8, env=env), "startup")[0] - used(run(alone, 1, 8, env=env), "startup")[0]
        assert more > PROFILE.comm.process_first_collective_mib, env
    assert used(run(alone, 1, 8, env={"TORCH_DIST_USE_NCCL2": "0"}), "startup")[0] == CONTEXT_MIB
    # a test suite's re-init cycles (Utils glue) do not go through initialize_megatron
    cycled = generate("megatron", {"tp": 4, "reinit_cycles": 2}, 8)
    assert cycled[0].ops == generate("megatron", {"tp": 4, "reinit_cycles": 2, "training": False}, 8)[0].ops
    with pytest.raises(WorkloadError, match="does not go through initialize_megatron") as info:
        generate("megatron", {"tp": 4, "reinit_cycles": 2, "training": True}, 8)
    assert info.value.key == "training"


# ---------------------------------------------------------------------------------------------- vLLM


def test_vllm_layout_matches_torch_reshape_by_hand() -> None:
    # W=8, dp=2 pp=2 tp=2: rank = dp*4 + pp*2 + tp (arange(W).reshape(-1, DP, PP, PCP, TP)).
    fams = {
        name: groups
        for name, groups, _ in vl.families(
            {"tp": 2, "pp": 2, "pcp": 1, "dcp": 1, "dp": 2, "moe": True, "enable_eplb": False, "local_world_size": 8}, 8
        )
    }
    assert list(fams) == ["world", "tp", "dcp", "pcp", "pp", "dp", "ep"]
    assert fams["tp"] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert fams["dcp"] == [(r,) for r in range(8)]
    assert fams["pcp"] == [(r,) for r in range(8)]
    assert fams["pp"] == [(0, 2), (1, 3), (4, 6), (5, 7)]  # transpose(2, 4): rows over (dp, tp)
    assert fams["dp"] == [(0, 4), (2, 6), (1, 5), (3, 7)]  # transpose(1, 4): rows over (tp, pp)
    assert fams["ep"] == [(0, 1, 4, 5), (2, 3, 6, 7)]  # per pp stage over (dp, pcp, tp)


def test_vllm_default_path_twins_every_group_on_every_rank() -> None:
    programs = generate("vllm", {"tp": 8, "gpu_memory_utilization": 0.95}, 8)
    assert all(p is programs[0] for p in programs)
    ops = programs[0].ops
    assert ops[:2] == (SetDevice(), InitProcessGroup(backend="nccl"))
    groups = new_groups(programs[0])
    assert len(groups) == 2 * (1 + 1 + 8 + 8 + 8 + 8)  # world, tp, then singletons for dcp/pcp/pp/dp
    for device, cpu in zip(groups[::2], groups[1::2], strict=True):
        assert (device.backend, cpu.backend) == ("nccl", "gloo")
        assert device.ranks == cpu.ranks and device.use_local_synchronization is False
    assert [op.bind for op in groups[::2]][:3] == ["world", "tp", "dcp"]
    check = [i for i, op in enumerate(ops) if isinstance(op, MemoryCheck)]
    assert len(check) == 1 and ops[check[0]].gpu_memory_utilization == 0.95
    assert isinstance(ops[check[0] - 1], Checkpoint) and ops[check[0] - 1].label == "before_memory_check"
    assert max(i for i, op in enumerate(ops) if isinstance(op, NewGroup)) < check[0]


def test_vllm_split_path_and_moe_dp_engines() -> None:
    programs = generate("vllm", {"dp": 16, "moe": True, "enable_eplb": True, "split_group": True}, 16)
    assert len({id(p) for p in programs}) == 8  # one per local rank: only device_id differs
    assert programs[3] is programs[11]
    assert programs[5].ops[1] == InitProcessGroup(backend="cpu:gloo,cuda:nccl", device_id=5)
    splits = [op for op in programs[0].ops if isinstance(op, SplitGroup)]
    names = ["world", "tp", "dcp", "pcp", "pp", "dp", "ep", "eplb"]
    assert [op.group_desc for op in splits] == [f"{n}:{kind}" for n in names for kind in ("device", "cpu")]
    assert splits[-4].split_ranks == (tuple(range(16)),)  # ep over (dp, pcp, tp) of the one stage
    assert splits[2].split_ranks == tuple((r,) for r in range(16))  # tp = 1: singletons
    assert not new_groups(programs[0])
    # Every split is collective over the world; each member gets a communicator per split, cpu ones too.
    outcome = run(programs, 2, 8)
    assert outcome.verdict == "pass"
    sets = member_sets(programs[0], 0, splits=True)
    assert len(sets) == 16  # + the default group = 17 communicators
    expected = CONTEXT_MIB + PROCESS_MIB + priced_mib([tuple(range(16)), *sets], 0, 2, 8)
    assert used(outcome, "before_memory_check")[0] == pytest.approx(expected, abs=0.1)
    # An inner DP world appears when one engine spans nodes.
    wide = generate("vllm", {"tp": 16, "dp": 2}, 32)[0]
    assert [op.bind for op in new_groups(wide)][2:4] == ["inner_dp_world", "inner_dp_world_cpu"]


def test_vllm_v2_runner_and_pynccl_charge() -> None:
    program = generate("vllm", {"tp": 2, "pp": 2, "v2_model_runner": True, "pynccl_mib": 100.0}, 4)[0]
    ops = program.ops
    check = next(i for i, op in enumerate(ops) if isinstance(op, MemoryCheck))
    sibling = [op for op in ops[check:] if isinstance(op, NewGroup)]
    assert [op.ranks for op in sibling] == [(0, 2), (1, 3)] and {op.bind for op in sibling} == {"pp_broadcast"}
    allocs = [op.tag for op in ops if isinstance(op, Alloc)]
    assert allocs == ["pynccl:tp", "pynccl:pp"]  # only device-communicator groups of size > 1


def test_vllm_tp8_memory_check_on_2_15_and_legacy() -> None:
    programs = generate("vllm", {"tp": 8, "gpu_memory_utilization": 0.98}, 8)
    outcome = run(programs, 1, 8)
    # default group + world, tp (8 ranks), dcp, pcp, pp, dp (one rank) device groups: 7 eager communicators
    eight, one = priced_mib([tuple(range(8))], 0, 1, 8), priced_mib([(0,)], 0, 1, 8)
    expected = CONTEXT_MIB + PROCESS_MIB + 3 * eight + 4 * one
    assert used(outcome, "before_memory_check") == [pytest.approx(expected, abs=0.1)] * 8
    assert outcome.verdict == "fail"
    assert "less than desired GPU memory utilization (0.98" in outcome.errors[0]["message"]
    legacy = run(programs, 1, 8, env={"TORCH_DIST_USE_NCCL2": "0"})
    assert legacy.verdict == "pass" and used(legacy, "before_memory_check") == [CONTEXT_MIB] * 8


# ---------------------------------------------------------------------------------------------- SGLang


def test_sglang_tp8_singletons_aliases_and_twins() -> None:
    from simnccl.workloads import sglang

    fams = dict(sglang.families(GENERATORS["sglang"].config({"tp": 8}), 8))
    # attn_cp = 1 < tp: new singleton groups; attention_tp == tp and moe_tp == tp are aliases (no groups)
    assert list(fams) == ["world", "tp", "attn_cp", "moe_dp", "moe_ep", "pp", "self_pp"]
    assert fams["tp"] == [tuple(range(8))]
    for name in ("attn_cp", "moe_dp", "moe_ep", "pp", "self_pp"):
        assert fams[name] == [(r,) for r in range(8)], name
    program = generate("sglang", {"tp": 8}, 8)[0]
    groups = new_groups(program)
    assert len(groups) == 2 * (1 + 1 + 8 * 5)
    assert groups[2].group_desc == "tp:device" and groups[3].group_desc == "tp:cpu"
    assert groups[3].timeout_s == 7200.0


def test_sglang_dp_attention_ep_and_pp() -> None:
    from simnccl.workloads import sglang

    config = GENERATORS["sglang"].config({"tp": 8, "pp": 2, "attn_dp": 2, "ep": 8})
    fams = dict(sglang.families(config, 16))
    assert "moe_ep" not in fams  # ep == tp: alias of tp
    assert fams["attention_tp"][:2] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert fams["attn_cp"][:4] == [(0,), (1,), (2,), (3,)]
    assert fams["pp"] == [(r, r + 8) for r in range(8)]


# ---------------------------------------------------------------------------------------------- torchtitan


def test_torchtitan_fsdp_tp_mesh_groups() -> None:
    program = generate("torchtitan", {"tp": 2}, 8)[0]  # dp_shard = 4
    calls = [(op.group_desc, op.backend, op.ranks) for op in new_groups(program)]
    descs = Counter((d, b) for d, b, _ in calls)
    assert descs == {
        ("mesh_pp", "fake"): 32,  # pp=1 in four meshes: 8 singletons each
        ("mesh_batch", None): 2,
        ("mesh_cp", "fake"): 24,
        ("mesh_tp", None): 12,  # tp in dataloading, dense_fsdp, dense_fwdbwd: x3
        ("mesh_loss_mesh", None): 2,
        ("mesh_dp_replicate", "fake"): 16,
        ("mesh_dp_shard", None): 2,
        ("mesh_dp", None): 2,
        ("mesh_efsdp", "fake"): 1,  # ep = 1: fake, spans the world
        ("mesh_ep", "fake"): 8,
    }
    tp = [r for d, b, r in calls if d == "mesh_tp"]
    assert tp[:4] == [(0, 1), (2, 3), (4, 5), (6, 7)] and tp[:4] == tp[4:8] == tp[8:]
    batch = [r for d, b, r in calls if d == "mesh_batch"]
    assert batch == [(0, 2, 4, 6), (1, 3, 5, 7)]
    order = list(dict.fromkeys(d for d, _, _ in calls))
    assert order == [
        "mesh_pp",
        "mesh_batch",
        "mesh_cp",
        "mesh_tp",
        "mesh_loss_mesh",
        "mesh_dp_replicate",
        "mesh_dp_shard",
        "mesh_dp",
        "mesh_efsdp",
        "mesh_ep",
    ]


def test_torchtitan_world_dims_reuse_the_default_group() -> None:
    program = generate("torchtitan", {}, 8)[0]  # pure FSDP: batch, loss, dp_shard, dp span the world
    real = [op for op in new_groups(program) if op.backend is None]
    assert real == []
    assert all(op.backend == "fake" for op in new_groups(program))


def test_torchtitan_device_id_variant_splits_real_dims() -> None:
    programs = generate("torchtitan", {"tp": 2, "device_id": True}, 8)
    assert len({id(p) for p in programs}) == 8
    assert programs[6].ops[1] == InitProcessGroup(backend="nccl", device_id=6, timeout_s=300.0)
    splits = [op for op in programs[0].ops if isinstance(op, SplitGroup)]
    assert [op.group_desc for op in splits] == [
        "mesh_batch",
        "mesh_tp",
        "mesh_loss_mesh",
        "mesh_dp_shard",
        "mesh_tp",
        "mesh_dp",
        "mesh_tp",
    ]
    assert splits[1].split_ranks == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert all(op.backend == "fake" for op in new_groups(programs[0]))
    outcome = run(programs, 1, 8)
    assert outcome.verdict == "pass"
    world, sets = tuple(range(8)), member_sets(programs[0], 0, splits=True)
    assert len(sets) == 7  # + the default group = 8 communicators
    expected = CONTEXT_MIB + PROCESS_MIB + priced_mib([world, *sets], 0, 1, 8)
    assert used(outcome, "startup")[0] == pytest.approx(expected, abs=0.1)
    deduped = run(programs, 1, 8, policy="dedupe")
    distinct = [s for s in dict.fromkeys(sets) if s != world]  # the default group's set is reused too
    assert len(distinct) == 2
    expected = CONTEXT_MIB + PROCESS_MIB + priced_mib([world, *distinct], 0, 1, 8)
    assert used(deduped, "startup")[0] == pytest.approx(expected, abs=0.1)


# ---------------------------------------------------------------------------------------------- DeepSpeed


def test_deepspeed_zero_on_an_eager_device_id_world() -> None:
    programs = generate("deepspeed", {}, 16)
    assert len({id(p) for p in programs}) == 8 and programs[1] is programs[9]
    ops = programs[9].ops
    assert ops[1] == InitProcessGroup(backend="nccl", device_id=1, timeout_s=600.0)  # deepspeed/constants.py
    assert new_groups(programs[0]) == [
        NewGroup(ranks=tuple(range(16)), bind="data_parallel", purpose="dp", traffic="collectives")
    ]
    assert [op for op in ops if isinstance(op, Broadcast)] == [Broadcast(group="data_parallel")]
    for env in ({}, {"TORCH_DIST_USE_NCCL2": "0"}):  # device_id makes legacy eager too
        outcome = run(programs, 2, 8, env=env)
        assert outcome.verdict == "pass"
        # the default group and its clone (16 ranks on 2 nodes), the clone connected by the model broadcast, and
        # the process's first collective
        world = tuple(range(16))
        comms = priced_mib([world, world], 0, 2, 8, uses={1: ("broadcast",)})
        expected = CONTEXT_MIB + PROCESS_MIB + PROFILE.comm.process_first_collective_mib + comms
        assert used(outcome, "startup")[0] == pytest.approx(expected, abs=0.1)


def test_deepspeed_pipeline_grid_groups_and_warmup() -> None:
    from simnccl.workloads import deepspeed as ds

    topo = ds.Topology(("pipe", "data", "model"), (2, 2, 2))
    assert topo.comm_lists("pipe") == [(0, 4), (1, 5), (2, 6), (3, 7)]  # DeepSpeed's docstring example
    assert topo.axis_list("data", 0) == [0, 1, 4, 5]
    config = GENERATORS["deepspeed"].config({"pp": 2, "tied_embeddings": True})
    fams = dict(ds.pipeline_groups(config, 8))
    assert list(fams) == ["pipe_world", "model", "data_parallel", "pipe", "slice", "tied_embedding"]
    assert fams["model"] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert fams["data_parallel"] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert fams["pipe"] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert fams["slice"] == [(r,) for r in range(8)]
    programs = generate("deepspeed", {"pp": 4, "zero_stage": 1}, 8)  # stages of 2 ranks
    assert len({id(p) for p in programs}) == 8
    p2p = [[(type(op).__name__, op.peer) for op in p.ops if isinstance(op, Send | Recv)] for p in programs]
    assert p2p[0] == [("Send", 2)]  # stage 0 (even): send only
    assert p2p[2] == [("Recv", 0), ("Send", 4)]  # stage 1 (odd): recv first
    assert p2p[4] == [("Send", 6), ("Recv", 2)]  # stage 2 (even): send first
    assert p2p[7] == [("Recv", 5)]  # last stage
    assert any(isinstance(op, AllReduce) and op.group == "model" for op in programs[0].ops)
    assert run(programs, 1, 8).verdict == "pass"


@pytest.mark.parametrize(
    "args",
    [{"pp": 2}, {"pp": 2, "zero_stage": 3}, {"pp": 2, "zero_stage": 3, "zero_init": True, "tied_embeddings": True}],
)
def test_deepspeed_pipeline_with_zero_2_or_3_fails_with_the_pipeline_engines_assertion(args: dict) -> None:
    """deepspeed 0.19.8's ``PipelineEngine.__init__`` runs ``DeepSpeedEngine.__init__`` (runtime/pipe/engine.py:73:
    the engine's groups and its ``_broadcast_model``), then asserts ZeRO stage < 2 (:76-77): every rank dies there,
    holding the communicators it made, before the parameter-count all_reduce and the warm-up. The generator
    simulated a startup that passed (and refused zero_init with pp > 1 as bad input, exit 2)."""
    programs = generate("deepspeed", args, 8)
    for program in programs:
        assert program.ops[-1] == Raise(
            error_type="AssertionError", message="ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        )
        assert not any(isinstance(op, Send | Recv | AllReduce) or op == Checkpoint("startup") for op in program.ops)
        assert any(op.bind == "data_parallel" for op in new_groups(program))  # the grid's, before the assertion
    outcome = run(programs, 1, 8)
    assert outcome.verdict == "fail"
    assert [(e["rank"], e["kind"], e["type"], e["message"]) for e in outcome.errors] == [
        (rank, "check", "AssertionError", "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
        for rank in range(8)
    ]
    # what the engine made before the assertion is held: the eager world's splits and the broadcasts' buffers
    after_init = used(outcome, "after_init")
    assert all(ledger.used_bytes / 2**20 > after_init[0] for ledger in outcome.ledgers.values())
    assert run(generate("deepspeed", {**args, "zero_stage": 1, "zero_init": False}, 8), 1, 8).verdict == "pass"


def test_deepspeed_moe_broadcasts_its_experts_on_the_expert_data_parallel_group() -> None:
    """``_broadcast_model`` (deepspeed 0.19.8 engine.py:2050-2056) broadcasts the expert parameters on each rank's
    expert-data-parallel group from its first rank: that communicator's first use, and its buffers, at startup."""
    programs = generate("deepspeed", {"ep": 4}, 8)  # expert-data-parallel groups (0, 4), (1, 5), (2, 6), (3, 7)
    for rank, program in enumerate(programs):
        broadcasts = [op for op in program.ops if isinstance(op, Broadcast)]
        assert broadcasts == [Broadcast(group="data_parallel"), Broadcast(group="expert_data_parallel", src=rank % 4)]
    without = tuple(
        Program(tuple(op for op in p.ops if getattr(op, "group", None) != "expert_data_parallel")) for p in programs
    )
    for policy in (None, "lazy-init"):
        assert (
            used(run(programs, 1, 8, policy=policy), "startup")[0]
            > used(run(without, 1, 8, policy=policy), "startup")[0]
        )


def test_deepspeed_moe_hpz_and_quantized_gradient_groups() -> None:
    args = {"ep": 4, "zero_stage": 3, "zero_init": True, "zero_hpz_partition_size": 8, "zero_quantized_gradients": True}
    program = generate("deepspeed", args, 16)[0]
    binds = [op.bind for op in new_groups(program)]
    assert binds == (
        ["zero_param_intra"] * 2  # zero.Init makes them, before deepspeed.initialize
        + ["expert_data_parallel"] * 4
        + ["expert_parallel"] * 4
        + ["local_all_to_all"] * 2
        + ["global_all_to_all"] * 8
        + ["data_parallel"]
    )
    groups = [op.ranks for op in new_groups(program)]
    assert groups[0] == tuple(range(8))
    assert groups[2] == (0, 4, 8, 12) and groups[6] == (0, 1, 2, 3)
    assert groups[10] == tuple(range(8)) and groups[12] == (0, 8)
    # zero.Init's parameter broadcast on the world group, before the groups; no _broadcast_model
    assert [op for op in program.ops if isinstance(op, Broadcast)] == [Broadcast(group="world", src=0)]


# ---------------------------------------------------------------------------------------------- scenario hook

HOOK = """\
[scenario]
name = "hook"

[cluster]
gpu = "h100-80gb"
nodes = 4
gpus_per_node = 8

[torch]
release = "2.15"

[workload]
{workload}

[[expect]]
verdict = "pass"
"""


def test_scenario_generator_takes_the_world_from_the_cluster(write_scenario) -> None:
    from simnccl.scenario import load_scenario

    scenario = load_scenario(write_scenario(HOOK.format(workload='generator = "megatron"\nargs = { tp = 8, pp = 4 }')))
    assert len(scenario.programs) == 32
    assert all(p is scenario.programs[0] for p in scenario.programs)  # dp = 32 / (8 x 4) = 1
    assert len(new_groups(scenario.programs[0])) == len(new_groups(generate("megatron", {"tp": 8, "pp": 4}, 32)[0]))


@pytest.mark.parametrize(
    ("workload", "key", "text"),
    [
        ('generator = "jax"', "workload.generator", "unknown workload generator 'jax'; expected one of vllm"),
        ('generator = "megatron"\nargs = { tp = 8, pp = 4, dp = 2 }', "workload.args.dp", "does not match the world"),
        ('generator = "megatron"\nargs = { tp = "8" }', "workload.args.tp", "expected an integer"),
        ('generator = "vllm"\nargs = { tensor_parallel_size = 8 }', "workload.args.tensor_parallel_size", "unknown"),
        ('generator = "vllm"\nargs = 8', "workload.args", "expected a table"),
        (
            'generator = "megatron"\nargs = { nccl_comm_cfgs = { tp = { foo = 1 } } }',
            "workload.args.nccl_comm_cfgs.tp.foo",
            "unknown NCCL option",
        ),
    ],
)
def test_scenario_generator_errors_name_the_key(write_scenario, workload: str, key: str, text: str) -> None:
    from simnccl.scenario import ScenarioError, load_scenario

    with pytest.raises(ScenarioError) as info:
        load_scenario(write_scenario(HOOK.format(workload=workload)))
    assert info.value.key == key
    assert text in str(info.value)


def test_shipped_framework_scenarios_cover_every_generator() -> None:
    import tomllib
    from pathlib import Path

    scenarios = Path(__file__).resolve().parent.parent / "scenarios"
    seen: dict[str, int] = {}
    for path in sorted(scenarios.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        generator = data.get("workload", {}).get("generator")
        if generator is None:
            continue
        assert path.stem.startswith(f"{generator}-"), path.name
        names = [v["name"] for v in data.get("variants", [])]
        assert {"torch-2.15-default", "legacy"} <= set(names), path.name
        assert any(n.startswith("policy:") for n in names), path.name
        assert any("used_mib" in e for e in data.get("expect", [])), path.name
        seen[generator] = seen.get(generator, 0) + 1
        nodes = data["cluster"].get("nodes", 1)
        seen[f"{generator}:{'multi' if nodes > 1 else 'single'}"] = 1
    for name in GENERATORS:
        assert seen.get(f"{name}:single") and seen.get(f"{name}:multi"), name


def _broadcast_sources(programs: tuple[Program, ...]) -> list[tuple[int, str, int, tuple[int, ...]]]:
    """(rank, group, src, the group's global ranks) of every broadcast a rank runs on a group it holds."""
    world = tuple(range(len(programs)))
    out = []
    for rank, program in enumerate(programs):
        members: dict[str, tuple[int, ...]] = {"world": world}
        for op in program.ops:
            if isinstance(op, NewGroup) and op.bind is not None:
                ranks = world if op.ranks is None else tuple(sorted(op.ranks))
                if rank in ranks:
                    members[op.bind] = ranks
            elif isinstance(op, SplitGroup) and op.bind is not None and op.parent in members:
                parent = members[op.parent]
                for part in op.split_ranks:
                    ranks = tuple(sorted(parent[i] for i in part))
                    if rank in ranks:
                        members[op.bind] = ranks
            elif isinstance(op, Broadcast) and op.group in members:
                out.append((rank, op.group, op.src, members[op.group]))
    return out


def test_every_broadcast_source_is_a_member_of_its_group() -> None:
    """``Broadcast.src`` is a global rank (as torch's ``dist.broadcast(src=)`` takes it); real torch refuses a source
    outside the group ("Global rank 0 is not part of group"). DeepSpeed's pipeline generator broadcast from rank 0
    on every stage's data-parallel group; DeepSpeed 0.19.8 broadcasts from the group's first rank
    (``groups._get_broadcast_src_rank``), and the real tier's gloo run of deepspeed-pipe-2nodes failed on it."""
    from pathlib import Path

    from simnccl.scenario import load_scenario

    checked = 0
    for path in sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.toml")):
        for rank, group, src, ranks in _broadcast_sources(load_scenario(str(path)).programs):
            assert src in ranks, f"{path.name}: rank {rank} broadcasts on {group!r} {ranks} from rank {src}"
            checked += 1
    for name, args, world in (("deepspeed", {"pp": 4}, 16), ("deepspeed", {"pp": 2, "tied_embeddings": True}, 8)):
        for rank, group, src, ranks in _broadcast_sources(generate(name, args, world)):
            assert src in ranks, f"{name} {args}: rank {rank} broadcasts on {group!r} {ranks} from rank {src}"
            assert src == min(ranks)  # DeepSpeed's source: the group's first global rank
            checked += 1
    assert checked > 50
