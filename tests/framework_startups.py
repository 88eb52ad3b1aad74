"""The real frameworks' startup code, driven by the simnccl generators' own knobs (not collected by pytest).

Each function takes the knob table a ``simnccl.workloads`` generator takes and runs the pinned framework's own
code with the same settings, so ``simnccl.capture`` records what the framework really calls and
tests/test_framework_fidelity.py can compare it with the generator op for op. Only the framework's entry
points are called; the lines written here are the glue a training script has around them, each said where it
comes from:

* ``megatron_startup``: megatron-core 0.19.2. ``megatron/training/initialize.py::_initialize_distributed`` is
  re-typed (``megatron.training`` needs Python >= 3.12: it imports ``typing.override``): ``set_device`` then
  ``init_process_group(backend, world_size, rank, timeout)``; then the real
  ``parallel_state.initialize_model_parallel`` with the arguments ``_initialize_distributed`` passes, then
  (``training``, the default) ``initialize_megatron``'s ``_compile_dependencies`` barrier, re-typed too, and,
  for ``all_gather_group``, the real ``create_all_gather_groups`` as ``training.get_model`` calls it.
* ``torchtitan_startup``: torchtitan 0.3.0's real ``init_distributed(CommConfig())`` and
  ``ParallelDims(...).build_mesh()``, after the trainer's ``set_device``.
* ``deepspeed_startup``: deepspeed 0.19.8's real ``deepspeed.init_distributed()``, ``PipelineModule`` (layers
  without parameters: the generator models the groups, not the layers), and the ``deepspeed.utils.groups``
  functions the engine calls and its real ``_broadcast_model`` (on a one-parameter model, or a ``MoE`` layer),
  in the engine's order, after the real ``deepspeed.zero.Init`` for ``zero_init``
  (``deepspeed.initialize`` itself, with ZeRO-2 and a training step, is captured in ``framework_training.py``).
* ``deepspeed_pipeline_engine_startup``: the real ``deepspeed.initialize`` of a ``PipelineModule``: the whole
  ``PipelineEngine`` startup, or where its ZeRO-stage assertion stops it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

PINNED = {"megatron-core": "0.19.2", "torchtitan": "0.3.0", "deepspeed": "0.19.8"}


def _local_rank() -> int:
    return int(os.environ["LOCAL_RANK"])


# ---------------------------------------------------------------------------------------------- Megatron-Core


def megatron_startup(knobs: Mapping[str, Any], nccl_config_path: str | None = None) -> None:
    """``_initialize_distributed`` + ``initialize_model_parallel`` (+ ``_compile_dependencies``' barrier, +
    ``create_all_gather_groups``).

    ``nccl_config_path``: the ``--nccl-communicator-config-path`` YAML holding ``knobs["nccl_comm_cfgs"]``
    (written by the caller before the capture forks).
    """
    from megatron.core import parallel_state

    minutes = knobs.get("distributed_timeout_minutes", 10)
    torch.cuda.set_device(_local_rank())
    dist.init_process_group(
        backend=knobs.get("backend", "nccl"),
        world_size=int(os.environ["WORLD_SIZE"]),
        rank=int(os.environ["RANK"]),
        timeout=timedelta(minutes=minutes),
    )
    if knobs.get("hold_env"):  # this module's own os, as parallel_state sees it: writes of these names ignored
        parallel_state.os = _EnvHeld(tuple(knobs["hold_env"]))  # type: ignore[attr-defined]
    parallel_state.initialize_model_parallel(
        knobs.get("tp", 1),
        knobs.get("pp", 1),
        None,
        pipeline_model_parallel_comm_backend=knobs.get("pipeline_comm_backend"),
        use_sharp=knobs.get("use_sharp", False),
        context_parallel_size=knobs.get("cp", 1),
        hierarchical_context_parallel_sizes=knobs.get("hierarchical_cp"),
        hybrid_context_parallel=knobs.get("hybrid_cp", False),
        expert_model_parallel_size=knobs.get("ep", 1),
        num_distributed_optimizer_instances=knobs.get("num_distributed_optimizer_instances", 1),
        expert_tensor_parallel_size=knobs.get("etp"),
        distributed_timeout_minutes=minutes,
        nccl_communicator_config_path=nccl_config_path,
        order=knobs.get("order", "tp-cp-ep-dp-pp"),
        create_gloo_process_groups=knobs.get("gloo", True),
        high_priority_stream_groups=knobs.get("high_priority_stream_groups"),
        sharp_enabled_group=knobs.get("sharp_enabled_group"),
    )
    if knobs.get("training", True):
        # initialize_megatron, after finish_mpu_init (:146): _init_autoresume (no autoresume: nothing) and
        # _compile_dependencies (:155), which ends in a world barrier (:185); its rank-0 compile_helpers() (a C++
        # build, no collective) is left out. test_megatron_training_entry_source_has_the_barrier pins these lines.
        dist.barrier()
    if knobs.get("all_gather_group", False):
        parallel_state.create_all_gather_groups(
            for_expert_parallelism=knobs.get("ep", 1) > 1, timeout=timedelta(minutes=minutes)
        )


class _EnvHeld:
    """``os`` for Megatron's parallel_state with ``environ`` writes of ``names`` ignored (``hold_env``).

    Why: with SHARP, Megatron sets ``NCCL_COLLNET_ENABLE=1`` around the one group SHARP is for and deletes it
    after that group's barrier; a capture refuses it (simnccl simulates one environment for a run, and NCCL reads
    the knob per communicator), which is right for a user. The fidelity test compares the groups and barriers
    Megatron makes, which do not depend on the knob, so it holds it still there."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names
        self.environ = _HeldEnviron(os.environ, names)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


class _HeldEnviron(dict):  # type: ignore[type-arg]
    """A view of ``os.environ`` in which setting or deleting one of ``names`` does nothing."""

    def __init__(self, environ: Any, names: tuple[str, ...]) -> None:
        super().__init__(environ)
        self._environ, self._names = environ, names

    def __setitem__(self, key: str, value: str) -> None:
        if key not in self._names:
            self._environ[key] = value
            super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        if key not in self._names:
            del self._environ[key]
            super().__delitem__(key)


# ---------------------------------------------------------------------------------------------- torchtitan


def torchtitan_startup(knobs: Mapping[str, Any]) -> None:
    """The trainer's ``set_device``, ``init_distributed(CommConfig())`` and ``ParallelDims.build_mesh()``."""
    from torchtitan.config.configs import CommConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.utils import init_distributed

    torch.cuda.set_device(_local_rank())
    world = init_distributed(CommConfig(), enable_cpu_backend=knobs.get("enable_cpu_backend", False))
    ParallelDims(
        dp_replicate=knobs.get("dp_replicate", 1),
        dp_shard=knobs.get("dp_shard", -1),
        cp=knobs.get("cp", 1),
        tp=knobs.get("tp", 1),
        pp=knobs.get("pp", 1),
        ep=knobs.get("ep", 1),
        world_size=world,
        spmd_backend=knobs.get("spmd_backend", "spmd_types"),
    ).build_mesh()


# ---------------------------------------------------------------------------------------------- DeepSpeed


@contextlib.contextmanager
def deepspeed_on_cuda() -> Iterator[None]:
    """Import DeepSpeed with its CUDA accelerator chosen (it detects none on a CPU-only machine and caches
    the choice); the environment is restored, the accelerator stays cached."""
    saved = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = "cuda"
    try:
        from deepspeed.accelerator import get_accelerator

        get_accelerator()
        yield
    finally:
        if saved is None:
            os.environ.pop("DS_ACCELERATOR", None)
        else:
            os.environ["DS_ACCELERATOR"] = saved


class _TiedEmbedding(torch.nn.Module):
    """A tied layer whose ``weight`` is a plain attribute: nothing for ``PipelineModule.to(cuda:N)`` to move (nor
    for ``_broadcast_model`` to broadcast). Made on the rank's GPU, where DeepSpeed's tied weights live: its
    ``_synchronize_tied_weights`` broadcasts it over an nccl group, which serves cuda only."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.zeros(4, device="cuda")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - never run
        return x


def deepspeed_startup(knobs: Mapping[str, Any]) -> None:
    """``set_device`` (as DeepSpeed's examples do), ``deepspeed.init_distributed()``, the pipeline module, and
    the groups the engine's ``_configure_distributed_model`` and ZeRO-3 create, in that order."""
    import deepspeed
    from deepspeed.runtime.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipeModelDataParallelTopology
    from deepspeed.utils import groups

    torch.cuda.set_device(_local_rank())
    deepspeed.init_distributed()
    if knobs.get("zero_init", False):
        _deepspeed_zero_init(knobs)
    pp, mp = knobs.get("pp", 1), knobs.get("mp", 1)
    world = dist.get_world_size()
    if pp > 1:
        dp = world // (pp * mp)
        topology = (
            PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=dp)
            if mp > 1
            else PipeDataParallelTopology(num_pp=pp, num_dp=dp)
        )
        layers: list[Any] = [LayerSpec(torch.nn.Identity) for _ in range(pp)]
        if knobs.get("tied_embeddings", False):
            layers[0] = layers[-1] = TiedLayerSpec("embedding", _TiedEmbedding)
        module = PipelineModule(layers, topology=topology, partition_method="uniform")
        groups.mpu = module.mpu()  # what PipelineEngine hands the engine (deepspeed.initialize(mpu=...))
    model = _deepspeed_model(knobs)
    for layer in model.modules():  # engine.py:2150-2157: a MoE layer creates its expert groups
        if hasattr(layer, "set_deepspeed_parallelism"):
            layer.set_deepspeed_parallelism(False)
    if knobs.get("zero_quantized_gradients", False):
        groups._get_local_all_to_all_group()
    groups._get_data_parallel_group()  # the engine's data-parallel group: a world clone without a pipeline
    if not knobs.get("zero_init", False):
        _deepspeed_broadcast_model(model)
    if knobs.get("zero_hpz_partition_size", 1) > 1 and groups._get_zero_param_intra_parallel_group() is None:
        # the ZeRO-3 optimizer's hpZ groups, unless zero.Init made them (runtime/zero/stage3.py:271-272)
        groups._create_zero_param_parallel_group(knobs["zero_hpz_partition_size"])


def deepspeed_pipeline_engine_startup(knobs: Mapping[str, Any]) -> None:
    """The real ``deepspeed.initialize`` of a ``PipelineModule`` (``pp`` > 1, ``mp``, ``zero_stage`` 0-2; ZeRO-3's
    engine reads device properties a capture without a GPU does not have): the whole ``PipelineEngine``, or its
    failing check, which is marked by a checkpoint ``raised <type>: <message>`` (the captured code may not raise).
    One parameter per stage: one ``_broadcast_model`` broadcast, as the generator emits."""
    import deepspeed
    from deepspeed.runtime.pipe.module import LayerSpec, PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipeModelDataParallelTopology

    from simnccl import capture

    torch.cuda.set_device(_local_rank())
    deepspeed.init_distributed()
    pp, mp = knobs["pp"], knobs.get("mp", 1)
    dp = dist.get_world_size() // (pp * mp)
    topology = (
        PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=dp)
        if mp > 1
        else PipeDataParallelTopology(num_pp=pp, num_dp=dp)
    )
    layers = [LayerSpec(torch.nn.Linear, 4, 4, bias=False) for _ in range(pp)]
    module = PipelineModule(layers, topology=topology, partition_method="uniform")
    config = {
        "train_batch_size": dp,
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": knobs.get("zero_stage", 2)},
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    try:
        deepspeed.initialize(model=module, model_parameters=module.parameters(), config=config)
    except AssertionError as err:
        capture.checkpoint(f"raised AssertionError: {err}")


def _deepspeed_model(knobs: Mapping[str, Any]) -> torch.nn.Module:
    """The engine's model: one dense parameter (a broadcast on the data-parallel group), or with ``ep > 1`` a
    real ``deepspeed.moe.layer.MoE`` with one local expert: its gate's weight (dense) and its expert's weight
    (an expert-data-parallel broadcast), in that order, as the generator emits them."""
    expert = torch.nn.Linear(4, 4, bias=False)
    if knobs.get("ep", 1) == 1:
        return expert
    from deepspeed.moe.layer import MoE

    return MoE(4, expert, num_experts=knobs["ep"], ep_size=knobs["ep"])


def _deepspeed_broadcast_model(model: torch.nn.Module) -> None:
    """The real ``DeepSpeedEngine._broadcast_model`` (engine.py:2038-2056) on the attributes
    ``_configure_distributed_model`` gives the engine (engine.py:2160-2171), after moving the model to the
    device as it does (engine.py:2093-2094): building a whole engine would need an optimizer and a config."""
    from types import SimpleNamespace

    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.utils import groups

    model.to(torch.device("cuda", _local_rank()))
    engine = SimpleNamespace(
        dist_backend="nccl",
        module=model,
        seq_data_parallel_group=groups._get_sequence_data_parallel_group(),
        expert_data_parallel_group=groups._get_expert_data_parallel_group_dict(),
    )
    DeepSpeedEngine._broadcast_model(engine)


def _deepspeed_zero_init(knobs: Mapping[str, Any]) -> None:
    """The real ``deepspeed.zero.Init`` (ZeRO-3) with the knobs' config, entered as a training script does to
    build its model before ``deepspeed.initialize``; it creates the hpZ groups itself, and broadcasts each
    parameter built under it on the world group: the model here has one, the generator emits one."""
    import deepspeed

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3, "zero_hpz_partition_size": knobs.get("zero_hpz_partition_size", 1)},
    }
    with deepspeed.zero.Init(config_dict_or_path=config):
        torch.nn.Linear(4, 4, bias=False)


# ---------------------------------------------------------------------------------------------- Megatron re-init


def megatron_reinit_repro(knobs: Mapping[str, Any], pg_map_file: str) -> None:
    """NVIDIA/Megatron-LM#6897's repro, run on the real ``parallel_state`` (megatron-core 0.19.2).

    The repro calls ``Utils.initialize_model_parallel(tp, pp)`` once, then per cycle prints
    ``len(_world.pg_map)`` and calls ``Utils.destroy_model_parallel()`` and ``Utils.initialize_model_parallel``
    again. ``Utils`` (Megatron main's ``tests/unit_tests/test_utilities.py``; it imports ``megatron.training``,
    which needs Python >= 3.12) is re-typed here: ``initialize_model_parallel`` = ``ps.destroy_model_parallel()``,
    ``initialize_distributed()`` (once: ``set_device``, ``init_process_group(backend="nccl", world_size, rank)``,
    ``barrier()``), ``ps.initialize_model_parallel(tp, pp)``; ``destroy_model_parallel`` = ``synchronize``,
    ``barrier()``, ``ps.destroy_model_parallel()``, ``empty_cache``. The count is taken where the repro prints
    it (a checkpoint ``cycle<k>`` marks the same point); the loop stops after the last print (the repro's
    trailing destroy + initialisation print nothing). Rank 0 writes the counts, one per line, to ``pg_map_file``.
    """
    from megatron.core import parallel_state as ps
    from torch.distributed.distributed_c10d import _world

    from simnccl.capture import checkpoint

    def initialize() -> None:
        ps.destroy_model_parallel()
        if not dist.is_initialized():
            torch.cuda.set_device(_local_rank())
            dist.init_process_group(
                backend="nccl", world_size=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"])
            )
            dist.barrier()
        ps.initialize_model_parallel(knobs.get("tp", 1), knobs.get("pp", 1))

    def destroy() -> None:
        torch.cuda.synchronize()
        dist.barrier()
        ps.destroy_model_parallel()
        torch.cuda.memory.empty_cache()

    counts = []
    initialize()
    for cycle in range(1, knobs["reinit_cycles"] + 1):
        checkpoint(f"cycle{cycle}")
        counts.append(len(_world.pg_map))
        if cycle < knobs["reinit_cycles"]:
            destroy()
            initialize()
    if dist.get_rank() == 0:
        with open(pg_map_file, "w", encoding="utf-8") as out:
            out.write("".join(f"{n}\n" for n in counts))
