"""The real frameworks as fixtures: their own startup code, captured, equals the generators op for op.

megatron-core 0.19.2, torchtitan 0.3.0 and deepspeed 0.19.8 (pinned in .ci/frameworks-requirements.txt) run
unmodified under ``simnccl.capture`` (tests/framework_startups.py drives them with the generators' own knobs),
at several configurations and worlds of 8-32 ranks; each capture must equal the ``simnccl.workloads`` generator
for the same knobs: the same calls in the same order, with the same rank sets, backends, group descriptions,
timeouts and every pg_options field, the same group families (handles, compared up to renaming), and the same
ranks sharing a Program. ``bind``/``purpose``/``traffic`` are simnccl annotations, not torch arguments, and are
not compared. A framework that is not installed (or not at the pinned version) skips its tests, saying so.

Each framework is imported once in this worker; capture forks one child per rank from it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))

import framework_startups as startups

from simnccl import capture as cap
from simnccl.ops import (
    Alloc,
    AllReduce,
    Barrier,
    Checkpoint,
    Collective,
    NewGroup,
    Op,
    PgOptions,
    Program,
    Raise,
    Recv,
    Send,
    SetDevice,
    SplitGroup,
)
from simnccl.scenario import load_scenario
from simnccl.testing import simulate
from simnccl.workloads import WorkloadError, generate
from simnccl.workloads import megatron as mg

pytestmark = pytest.mark.torch

REQUIREMENTS = ".ci/frameworks-requirements.txt"


def _require(distribution: str, *modules: str, importing: Any = None) -> None:
    """Import ``modules`` here (forked ranks inherit them), or skip: not installed, another version, or broken.

    ``importing``: a context manager to import them in (DeepSpeed picks its accelerator at first import).
    """
    pinned = startups.PINNED[distribution]
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{distribution} {pinned} is not installed (install it as {REQUIREMENTS} says)")
    if version != pinned:
        pytest.skip(f"{distribution} {version} is installed; these tests pin {pinned} ({REQUIREMENTS})")
    try:
        with importing or contextlib.nullcontext():
            for module in modules:
                importlib.import_module(module)
    except ImportError as err:
        pytest.skip(f"{distribution} {pinned} is installed but does not import: {err} ({REQUIREMENTS})")


@pytest.fixture(scope="module")
def megatron() -> None:
    _require("megatron-core", "megatron.core.parallel_state")


@pytest.fixture(scope="module")
def torchtitan() -> None:
    _require("torchtitan", "torchtitan.distributed.parallel_dims", "torchtitan.distributed.utils")


@pytest.fixture(scope="module")
def deepspeed() -> None:
    modules = ("deepspeed", "deepspeed.runtime.pipe.module", "deepspeed.utils.groups", "deepspeed.runtime.zero")
    modules += ("deepspeed.runtime.engine", "deepspeed.moe.layer")
    _require("deepspeed", *modules, importing=startups.deepspeed_on_cuda())


# ---------------------------------------------------------------------------------------------- comparison


def rows(ops: Sequence[Op], *, payload: bool = True) -> list[str]:
    """One line per op: every torch argument, handles renamed by first appearance, annotations dropped.

    ``payload=False`` also drops collectives' byte counts and dtypes (the model decides them, not the startup).
    """
    names: dict[str, str] = {"world": "world"}
    out = []
    for op in ops:
        data = op.to_dict()
        for key in ("bind", "group", "parent"):
            if key in data:
                data[key] = names.setdefault(data[key], f"h{len(names)}")
        for key in ("purpose", "traffic"):
            data.pop(key, None)
        if not payload and isinstance(op, Collective):
            data.pop("size_bytes", None)
            data.pop("dtype", None)
        out.append(json.dumps(data, sort_keys=True))
    return out


def sharing(programs: Sequence[Program], keep: Callable[[Op], bool] | None = None) -> list[list[int]]:
    """Which ranks run one Program object, as lists of ranks in first-rank order; with ``keep``, which ranks
    run the same ops once the others are left out."""
    by_key: dict[Any, list[int]] = {}
    for rank, program in enumerate(programs):
        key = id(program) if keep is None else tuple(op for op in program.ops if keep(op))
        by_key.setdefault(key, []).append(rank)
    return list(by_key.values())


def assert_same_startup(
    run: cap.CapturedRun,
    generated: Sequence[Program],
    *,
    payload: bool = True,
    keep: Callable[[Op], bool] | None = None,
) -> None:
    """Capture and generator agree op for op on every rank, and share Programs between the same ranks.

    ``keep``: compare only the generator's ops it keeps (the ones the capture can reach). The capture's
    ``Alloc`` ops are left out: a fixture's tiny model's tensors, which no generator models.
    """
    assert sharing(run.programs) == sharing(generated, keep)
    for ranks in sharing(generated, keep):
        rank = ranks[0]
        expected = rows([op for op in generated[rank].ops if keep is None or keep(op)], payload=payload)
        real = [op for op in run.programs[rank].ops if not isinstance(op, Alloc)]
        assert rows(real, payload=payload) == expected, f"rank {rank}"


STARTUPS: dict[str, Callable[..., None]] = {
    "megatron": startups.megatron_startup,
    "torchtitan": startups.torchtitan_startup,
    "deepspeed": startups.deepspeed_startup,
    "deepspeed-pipeline-engine": startups.deepspeed_pipeline_engine_startup,
}


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., cap.CapturedRun]:
    """``captured(framework, knobs, world, env=None)``: the framework's real startup captured with those knobs,
    once per module (several tests read the same capture)."""
    cache: dict[str, cap.CapturedRun] = {}

    def get(framework: str, knobs: dict[str, Any], world: int, env: dict[str, str] | None = None) -> cap.CapturedRun:
        key = json.dumps([framework, knobs, world, env or {}], sort_keys=True)
        if key not in cache:
            args: tuple[Any, ...] = (knobs,)
            if framework == "megatron":  # the --nccl-communicator-config-path YAML, written before ranks fork
                args += (_nccl_config_file(knobs, tmp_path_factory.mktemp("megatron")),)
            target = functools.partial(STARTUPS[framework], *args)
            cache[key] = cap.capture(target, world, env=env or {}, final_checkpoint="startup")
        return cache[key]

    return get


def _nccl_config_file(knobs: dict[str, Any], folder: Path) -> str | None:
    if not knobs.get("nccl_comm_cfgs"):
        return None
    import yaml

    path = folder / "nccl_comm_cfgs.yaml"
    path.write_text(yaml.safe_dump(knobs["nccl_comm_cfgs"]), encoding="utf-8")
    return str(path)


def memory(outcome: Any) -> dict[str, Any]:
    return {label: {d: s.used_bytes for d, s in sorted(snaps.items())} for label, snaps in outcome.checkpoints.items()}


# ---------------------------------------------------------------------------------------------- Megatron-Core

NCCL_CFGS = {
    "dp_cp": {"is_high_priority_stream": True, "max_ctas": 16, "min_ctas": 4, "cga_cluster_size": 2, "net_name": "IB"},
    "tp": {"max_ctas": 8},
    "intra_ep_dp": {"max_ctas": 2, "net_name": "socket"},
    "tp_ep_gtp_remat_pp": {"min_ctas": 1},  # 0.19.2's names for the EGTP family and the expert GTP singletons
    "expt_gtp_remat": {"cga_cluster_size": 1},
}

MEGATRON_CASES = {
    # id: (world, the megatron generator's knobs, which the startup passes to Megatron's own functions)
    "tp2-pp2": (8, {"tp": 2, "pp": 2}),
    "tp8-pp2-dp2": (32, {"tp": 8, "pp": 2}),
    "cp4-hierarchical-ep4": (16, {"tp": 2, "cp": 4, "hierarchical_cp": [2, 2], "ep": 4, "etp": 1}),
    "moe-2-instances-no-gloo": (
        16,
        {"tp": 2, "ep": 4, "etp": 1, "num_distributed_optimizer_instances": 2, "gloo": False},
    ),
    "nccl-config-yaml": (
        8,
        {
            "tp": 2,
            "num_distributed_optimizer_instances": 2,
            "nccl_comm_cfgs": NCCL_CFGS,
            "high_priority_stream_groups": ["pp"],
        },
    ),
    "hybrid-cp2-pp2": (16, {"cp": 2, "pp": 2, "hybrid_cp": True}),
    "pp-before-dp-order": (8, {"tp": 2, "pp": 2, "order": "tp-cp-ep-pp-dp"}),
    "pp4-nccl-backend": (8, {"pp": 4, "pipeline_comm_backend": "nccl", "distributed_timeout_minutes": 30}),
    # NCCL_COLLNET_ENABLE held still: Megatron toggles it around its SHARP group, which a capture refuses
    # (test_megatron_sharp_s_collnet_toggle_is_refused_by_a_capture); the groups and barriers do not depend on it
    "sharp-dp-replica": (
        8,
        {
            "tp": 2,
            "num_distributed_optimizer_instances": 2,
            "use_sharp": True,
            "sharp_enabled_group": "dp_replica",
            "hold_env": ["NCCL_COLLNET_ENABLE"],
        },
    ),
    "all-gather-groups-ep2": (8, {"tp": 2, "ep": 2, "all_gather_group": True}),
}


@pytest.mark.parametrize("case", list(MEGATRON_CASES))
def test_megatron_initialize_model_parallel_equals_the_generator(megatron, captured, case: str) -> None:
    world, knobs = MEGATRON_CASES[case]
    generated = {k: v for k, v in knobs.items() if k != "hold_env"}  # the startup's own, not a generator knob
    assert_same_startup(captured("megatron", knobs, world), generate("megatron", generated, world))


def test_megatron_sharp_s_collnet_toggle_is_refused_by_a_capture(megatron, captured) -> None:
    """Megatron 0.19.2 sets NCCL_COLLNET_ENABLE=1 for the SHARP group's creation and deletes it after the group's
    barrier: NCCL reads it per communicator, simnccl simulates one environment per run, so simulated without it
    (as a capture did, with a note) the SHARP group's collnet buffers were missing on multi-node runs. Refused."""
    knobs = {k: v for k, v in MEGATRON_CASES["sharp-dp-replica"][1].items() if k != "hold_env"}
    with pytest.raises(
        cap.CaptureError, match=r"changed NCCL_COLLNET_ENABLE in os\.environ between init_process_group"
    ):
        captured("megatron", knobs, 8)


def test_megatron_training_entry_source_has_the_barrier(megatron) -> None:
    """``megatron.training`` does not import on Python 3.11 (it needs 3.12), so ``megatron_startup`` re-types its
    ``initialize_megatron``; this reads the installed 0.19.2 source to pin what it re-types: after
    ``finish_mpu_init()`` (``_initialize_distributed``: ``initialize_model_parallel``), ``initialize_megatron``
    calls ``_init_autoresume()`` and ``_compile_dependencies()``, which ends in a world ``barrier()`` — the
    collective the generator's ``training`` knob emits (the default group's first use)."""
    import ast

    import megatron.core

    path = Path(megatron.core.__file__).parent.parent / "training" / "initialize.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}

    def calls(function: ast.FunctionDef) -> list[str]:
        found = [node for node in ast.walk(function) if isinstance(node, ast.Call)]
        found.sort(key=lambda node: (node.lineno, node.col_offset))
        return [ast.unparse(node) for node in found]

    entry = [c for c in calls(functions["initialize_megatron"]) if c.endswith("()") and "(" not in c[:-2]]
    assert entry[entry.index("finish_mpu_init()") :][:3] == [
        "finish_mpu_init()",
        "_init_autoresume()",
        "_compile_dependencies()",
    ]
    assert calls(functions["_compile_dependencies"])[-1] == "torch.distributed.barrier()"
    assert "barrier" not in " ".join(calls(functions["_initialize_distributed"]))
    generated = generate("megatron", {"tp": 2}, 8)[0].ops
    assert generated[-2:] == (Barrier(group="world"), Checkpoint("startup"))
    assert Barrier(group="world") not in generate("megatron", {"tp": 2, "training": False}, 8)[0].ops


MEGATRON_SCRIPT = Path(__file__).parent / "megatron_train.py"


@pytest.mark.parametrize(("world", "tp", "pp"), [(8, 2, 2), (64, 8, 4)])
def test_megatron_training_script_through_the_fork_server_equals_the_api_capture_and_the_generator(
    megatron, captured, world: int, tp: int, pp: int
) -> None:
    """What ``simnccl capture --world W tests/megatron_train.py --tp T --pp P`` runs: the script's imports in the
    fork server, each rank forked from it running the script as ``__main__`` — the same Programs as the Python
    API on ``megatron_startup`` (ranks forked from this worker) and as the generator, op for op."""
    knobs = {"tp": tp, "pp": pp}
    target = cap.script_target(None, str(MEGATRON_SCRIPT), ["--tp", str(tp), "--pp", str(pp)])
    served = cap.capture(target, world, final_checkpoint="startup")
    assert served.notes == ()  # preloaded: nothing refused
    assert_same_startup(served, generate("megatron", knobs, world))
    api = captured("megatron", knobs, world)
    assert [p.ops for p in served.programs] == [p.ops for p in api.programs]
    assert served.calls == api.calls


def test_megatron_fork_server_and_plain_forks_capture_the_same_run(megatron) -> None:
    argv = ["--tp", "2", "--pp", "2"]
    served = cap.capture(cap.script_target(None, str(MEGATRON_SCRIPT), argv), 8)
    plain = cap.capture(cap.script_target(None, str(MEGATRON_SCRIPT), argv, preload=False), 8)
    assert [p.ops for p in served.programs] == [p.ops for p in plain.programs]
    assert served.calls == plain.calls and served.notes == plain.notes
    assert served.to_json() == plain.to_json()


EGTP = "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP"


def test_megatron_creates_the_egtp_family_and_its_communicator(megatron, captured) -> None:
    """The family 0.19.2 creates unconditionally (the generator once missed it): one more membership, and on
    2.15 one more eager communicator per rank; the captured startup and the generator simulate alike."""
    run = captured("megatron", {"tp": 2, "pp": 2}, 8)
    egtp = [c.args["ranks"] for c in run.calls[0] if c.args.get("group_desc") == EGTP]
    assert egtp == [[0, 1, 4, 5], [2, 3, 6, 7]]
    generated = generate("megatron", {"tp": 2, "pp": 2}, 8)
    outcome = run.simulate(gpu="h100-80gb")
    expected = simulate([p.ops for p in generated], gpu="h100-80gb", nodes=1, gpus_per_node=8)
    assert outcome.verdict == expected.verdict == "pass"
    assert memory(outcome) == memory(expected)
    without = [op for op in generated[0].ops if getattr(op, "group_desc", None) != EGTP]
    fewer = memory(simulate([without] * 8, gpu="h100-80gb", nodes=1, gpus_per_node=8))["startup"]
    extra = [a - b for a, b in zip(memory(outcome)["startup"].values(), fewer.values(), strict=True)]
    assert all(200 * 2**20 < e < 260 * 2**20 for e in extra)  # one eager communicator (~231 MiB on h100-80gb)


def test_megatron_use_sharp_on_dp_raises_in_the_real_code_and_the_generator_refuses_it(megatron, captured) -> None:
    message = r"AssertionError: data parallel group with CP \(with GTP_remat\) is not initialized"
    with pytest.raises(cap.CaptureError, match=message):
        captured("megatron", {"tp": 2, "use_sharp": True}, 8)
    with pytest.raises(WorkloadError, match=r"megatron-core 0\.19\.2 raises " + message) as info:
        generate("megatron", {"tp": 2, "use_sharp": True}, 8)
    assert info.value.key == "use_sharp"


def test_megatron_net_name_other_than_ib_or_socket_is_refused_like_the_real_code(megatron, captured) -> None:
    knobs = {"tp": 2, "nccl_comm_cfgs": {"tp": {"net_name": "RoCE"}}}
    with pytest.raises(cap.CaptureError, match=r"net_name \(RoCE\) is not supported"):
        captured("megatron", knobs, 8)
    with pytest.raises(WorkloadError, match=r"net_name \(RoCE\) is not supported"):
        generate("megatron", knobs, 8)


def test_megatron_options_are_recorded_losslessly_and_listed_as_unmodelled(megatron, captured, tmp_path) -> None:
    world, knobs = MEGATRON_CASES["nccl-config-yaml"]
    run = captured("megatron", knobs, world)
    dp_cp = [op for op in run.programs[0].ops if getattr(op, "group_desc", None) == "DATA_PARALLEL_GROUP_WITH_CP"]
    assert dp_cp[0].pg_options == PgOptions(
        is_high_priority_stream=True, max_ctas=16, min_ctas=4, cga_cluster_size=2, net_name="IB"
    )
    note = "pg_options recorded but not modelled by the simulator yet: is_high_priority_stream, cga_cluster_size, "
    assert any(n.startswith(note + "net_name") for n in run.notes), run.notes
    # The scenario TOML the capture writes keeps every field and says which are unmodelled; read back, it is
    # the same Programs.
    path = tmp_path / "captured.toml"
    path.write_text(run.to_scenario_toml("megatron-nccl-config"), encoding="utf-8")
    assert f"# {note}" in path.read_text()
    assert [p.ops for p in load_scenario(path).programs] == [p.ops for p in run.programs]


# ---------------------------------------------------------------------------------------------- Megatron re-init

REINIT_CASES = {
    # id: (world, the repro's knobs). #6897's own configuration: 8 GPUs, Utils.initialize_model_parallel(1, 1).
    "6897-tp1-pp1": (8, {"tp": 1, "pp": 1, "reinit_cycles": 6}),
    "tp2-pp2": (8, {"tp": 2, "pp": 2, "reinit_cycles": 3}),
}


def described(ops: Sequence[Op], rank: int) -> list[str]:
    """One line per op with each group named by what ``rank`` is a member of (its ``group_desc`` and ranks),
    not by handle: the generator gives every call its own handle, the capture one per family. A destroy of a
    group ``rank`` is not in is dropped (the generator emits it, a no-op; Megatron never calls it)."""
    names = {"world": "world"}
    out = []
    for op in ops:
        data = op.to_dict()
        for key in ("purpose", "traffic", "bind"):
            data.pop(key, None)
        if isinstance(op, NewGroup) and op.bind and rank in op.ranks:
            names[op.bind] = f"{op.group_desc}{list(op.ranks)}"
        if "group" in data:
            if data["group"] not in names:
                continue
            data["group"] = names[data["group"]]
        out.append(json.dumps(data, sort_keys=True))
    return out


def _live_groups(programs: Sequence[Program], checkpoint: str) -> int:
    """Rank 0's groups, the world included, at ``checkpoint``: the programs simulated up to it."""
    cut = [list(p.ops[: p.ops.index(Checkpoint(checkpoint)) + 1]) for p in programs]
    outcome = simulate(cut, gpu="h200-141gb", nodes=1, gpus_per_node=len(programs), env={"NCCL_NVLS_ENABLE": "0"})
    assert outcome.verdict == "pass"
    return sum(1 for group in outcome.ranks[0].groups if not group.destroyed)


@pytest.mark.parametrize("case", list(REINIT_CASES))
def test_megatron_reinit_repro_equals_the_generator_and_its_pg_map_counts(megatron, tmp_path, case: str) -> None:
    """NVIDIA/Megatron-LM#6897's repro on the real ``parallel_state`` (``framework_startups.megatron_reinit_repro``):
    the generator's ``reinit_cycles`` are its calls on every rank, and the simulator's live groups on rank 0
    after each initialisation are real torch's ``len(_world.pg_map)`` there. On the report's configuration that
    is 24, 44, 64, 84, 104, 124: the report's first two (24, 44), not its later ones (70, 89, 115, 134), which
    the repro's code on torch 2.15.0 + megatron-core 0.19.2 does not produce (+20 each cycle: 23 groups created,
    the 3 Gloo groups destroyed)."""
    world, knobs = REINIT_CASES[case]
    counts_file = tmp_path / "pg_map.txt"
    run = cap.capture(
        functools.partial(startups.megatron_reinit_repro, knobs, str(counts_file)), world, final_checkpoint=None
    )
    real = [int(n) for n in counts_file.read_text().split()]
    # Utils leaves distributed_timeout_minutes at initialize_model_parallel's default (30)
    generated = generate("megatron", {**knobs, "distributed_timeout_minutes": 30}, world)
    for rank in range(world):
        assert described(run.programs[rank].ops, rank) == described(generated[rank].ops, rank), f"rank {rank}"
    cycles = range(1, knobs["reinit_cycles"] + 1)
    assert [_live_groups(run.programs, f"cycle{k}") for k in cycles] == real
    if case == "6897-tp1-pp1":
        assert real == [24, 44, 64, 84, 104, 124]


# ---------------------------------------------------------------------------------------------- torchtitan

TITAN_CASES = {
    # id: (world, capture env, torchtitan_startup knobs, extra generator knobs). On 2.15 the nccl2 default group
    # is bound even without device_id, so DeviceMesh takes split_group: the generator's split_group branch.
    "fsdp-tp2-2.15": (8, {}, {"tp": 2}, {"split_group": True}),
    "fsdp-tp2-legacy": (8, {"TORCH_DIST_USE_NCCL2": "0"}, {"tp": 2}, {}),
    "full-dtensor-tp2": (8, {}, {"tp": 2, "spmd_backend": "full_dtensor"}, {"split_group": True}),
    "partial-dtensor-hsdp-cp2-tp2-legacy": (
        16,
        {"TORCH_DIST_USE_NCCL2": "0"},
        {"dp_replicate": 2, "cp": 2, "tp": 2, "spmd_backend": "partial_dtensor"},
        {},
    ),
    "pp2-tp2-ep2": (16, {}, {"pp": 2, "tp": 2, "ep": 2}, {"split_group": True}),
    "cpu-backend-tp4-legacy": (8, {"TORCH_DIST_USE_NCCL2": "0"}, {"tp": 4, "enable_cpu_backend": True}, {}),
}


@pytest.mark.parametrize("case", list(TITAN_CASES))
def test_torchtitan_build_mesh_equals_the_generator(torchtitan, captured, case: str) -> None:
    world, env, knobs, extra = TITAN_CASES[case]
    assert_same_startup(captured("torchtitan", knobs, world, env), generate("torchtitan", {**knobs, **extra}, world))


def test_torchtitan_full_dtensor_has_fewer_real_memberships_than_spmd_types(torchtitan, captured) -> None:
    """full_dtensor builds one dense mesh where spmd_types builds two: 5 real groups per rank, not 7 (the
    generator had no spmd_backend knob and always built 7)."""

    def real_memberships(programs: Sequence[Program]) -> int:
        return sum(1 for op in programs[0].ops if isinstance(op, SplitGroup) or getattr(op, "backend", "") is None)

    full = {"tp": 2, "spmd_backend": "full_dtensor"}
    assert real_memberships(captured("torchtitan", full, 8).programs) == 5
    assert real_memberships(generate("torchtitan", {**full, "split_group": True}, 8)) == 5
    assert real_memberships(captured("torchtitan", {"tp": 2}, 8).programs) == 7


# ---------------------------------------------------------------------------------------------- DeepSpeed

DEEPSPEED_CASES = {
    # id: (world, the deepspeed generator's knobs)
    "zero2-dp8": (8, {}),
    # ZeRO-1 with a pipeline: the PipelineEngine asserts stage < 2 (the pipeline-engine cases below)
    "pipe4-tied-embeddings": (16, {"pp": 4, "tied_embeddings": True, "zero_stage": 1}),
    "pipe2-mp2": (8, {"pp": 2, "mp": 2, "zero_stage": 1}),
    "moe-ep4-quantized-gradients": (16, {"ep": 4, "zero_quantized_gradients": True}),
    "moe-ep2-pipe2": (16, {"pp": 2, "ep": 2, "zero_stage": 1}),
    "zero3-init-dp8": (8, {"zero_stage": 3, "zero_init": True}),
    "zero3-hpz8": (16, {"zero_stage": 3, "zero_init": True, "zero_hpz_partition_size": 8}),
}


def _before_the_pipeline_engine(op: Op) -> bool:
    """The generator's ops but the ``PipelineEngine``'s, which the startup does not build: its parameter-count
    all-reduce and its warm-up send/recv (the engine's ``_broadcast_model`` is captured)."""
    if isinstance(op, Send | Recv):
        return False
    return not (isinstance(op, AllReduce) and op.group == "model")


@pytest.mark.parametrize("case", list(DEEPSPEED_CASES))
def test_deepspeed_startup_equals_the_generator(deepspeed, captured, case: str) -> None:
    world, knobs = DEEPSPEED_CASES[case]
    run = captured("deepspeed", knobs, world)
    assert_same_startup(run, generate("deepspeed", knobs, world), payload=False, keep=_before_the_pipeline_engine)


DEEPSPEED_PIPELINE_ENGINE_CASES = {
    # id: (world, the deepspeed generator's knobs), deepspeed.initialize run whole
    "pipe2-zero1": (4, {"pp": 2, "zero_stage": 1}),
    "pipe2-zero2-asserts": (4, {"pp": 2, "zero_stage": 2}),
    "pipe2-mp2-zero2-asserts": (8, {"pp": 2, "mp": 2, "zero_stage": 2}),
}


def _until_raised(ops: Sequence[Op]) -> list[Op]:
    """A captured ``deepspeed.initialize``'s ops as the generator spells them: the engine's own ``set_device``
    (``_set_distributed_vars``, engine.py:1943; the device the rank already has) and the model's tensors left out,
    and the startup's ``raised <type>: <message>`` checkpoint read as the ``raise`` op it marks, which ends it."""
    out: list[Op] = []
    for op in ops:
        if isinstance(op, Alloc) or (isinstance(op, SetDevice) and out):
            continue
        if isinstance(op, Checkpoint) and op.label.startswith("raised "):
            error_type, message = op.label.removeprefix("raised ").split(": ", 1)
            return [*out, Raise(error_type=error_type, message=message)]
        out.append(op)
    return out


@pytest.mark.parametrize("case", list(DEEPSPEED_PIPELINE_ENGINE_CASES))
def test_deepspeed_pipeline_engine_startup_equals_the_generator(deepspeed, captured, case: str) -> None:
    """The whole ``PipelineEngine`` (parameter-count all_reduce, warm-up send/recv) with ZeRO-1, and with ZeRO-2
    where it stops: every rank raises its ZeRO-stage ``AssertionError`` (runtime/pipe/engine.py:76-77) after the
    engine's groups and broadcast, which the generator simulated as a startup that passed."""
    world, knobs = DEEPSPEED_PIPELINE_ENGINE_CASES[case]
    run = captured("deepspeed-pipeline-engine", knobs, world)
    generated = generate("deepspeed", knobs, world)
    for rank in range(world):
        real = rows(_until_raised(run.programs[rank].ops), payload=False)
        assert real == rows(generated[rank].ops, payload=False), f"rank {rank}"


def test_deepspeed_default_timeout_is_ten_minutes(deepspeed, captured) -> None:
    init = captured("deepspeed", {}, 8).programs[0].ops[1]
    assert (init.name, init.timeout_s, init.device_id) == ("init_process_group", 600.0, 0)
    assert generate("deepspeed", {}, 8)[0].ops[1] == init


def test_generator_docstrings_name_the_pinned_versions() -> None:
    """Each generator says which release it follows: the one the tests above check it against."""
    from simnccl.workloads import deepspeed as ds
    from simnccl.workloads import torchtitan as tt

    for module, distribution in ((mg, "megatron-core"), (tt, "torchtitan"), (ds, "deepspeed")):
        text = f"{distribution} {startups.PINNED[distribution]}"
        assert text in (module.__doc__ or ""), module.__name__
        assert text in module.GENERATOR.source, module.__name__
