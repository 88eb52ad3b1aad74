"""The real frameworks' startup *and first training step* on tiny models, to capture (not collected by pytest).

Each ``*_startup`` returns what its ``*_step`` needs (``simnccl.capture.capture(startup, world, step=step)``);
the CUDA tensors, seeding and streams they touch run on ``simnccl.capture.fake_devices``. Models are tiny
(tensors live in host memory while capturing); the framework code around them is the pinned framework's own:

* Megatron-Core 0.19.2: ``initialize_model_parallel``, ``model_parallel_cuda_manual_seed`` (its
  ``_CUDA_RNG_STATE_TRACKER``), a ``GPTModel`` with the local (no Transformer Engine) layer spec moved to the
  current device, Megatron's ``DistributedDataParallel`` and ``get_megatron_optimizer`` (distributed optimizer);
  the step is a forward/backward on one micro-batch, ``finish_grad_sync`` and ``optimizer.step()``.
* torchtitan 0.3.0: the trainer's ``set_device``, ``init_distributed``, ``ParallelDims.from_config`` and
  ``set_determinism`` with its default ``DebugConfig`` (``seed=None``: rank 0 broadcasts a CUDA seed tensor),
  then a two-layer MLP under torch's FSDP2 ``fully_shard`` on the ``dp_shard`` mesh and an AdamW step.
* DeepSpeed 0.19.8: ``deepspeed.init_distributed`` and ``deepspeed.initialize`` with ZeRO stage 2 (torch Adam),
  then ``engine.backward`` and ``engine.step``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

SEQUENCE = 32
VOCAB = 128


def _local_rank() -> int:
    return int(os.environ["LOCAL_RANK"])


# ---------------------------------------------------------------------------------------------- Megatron-Core


def megatron_gpt_startup(tp: int = 2, pp: int = 1) -> tuple[Any, Any]:
    """``_initialize_distributed`` (re-typed, as in framework_startups), the seeding, a tiny GPT, DDP, optimizer."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.cuda.set_device(_local_rank())
    dist.init_process_group(backend="nccl", timeout=timedelta(minutes=10))
    parallel_state.initialize_model_parallel(tp, pp)
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, use_cpu_initialization=False, params_dtype=torch.float32
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=SEQUENCE,
    )
    model.cuda(torch.cuda.current_device())
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True, overlap_grad_reduce=False)
    ddp = DistributedDataParallel(config, ddp_config, model)
    optimizer_config = OptimizerConfig(optimizer="adam", lr=1e-3, use_distributed_optimizer=True)
    optimizer = get_megatron_optimizer(optimizer_config, [ddp])
    return ddp, optimizer


def megatron_gpt_step(state: tuple[Any, Any]) -> None:
    ddp, optimizer = state
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    tokens = torch.randint(0, VOCAB, (2, SEQUENCE), device="cuda")
    positions = torch.arange(SEQUENCE, device="cuda").unsqueeze(0).expand(2, -1)
    mask = torch.ones(2, 1, SEQUENCE, SEQUENCE, dtype=torch.bool, device="cuda").tril().logical_not()
    ddp(tokens, positions, mask, labels=tokens).float().mean().backward()
    ddp.finish_grad_sync()
    updated, _, _ = optimizer.step()
    assert updated, "the optimizer skipped the step"


# ---------------------------------------------------------------------------------------------- torchtitan


def torchtitan_trainer_startup() -> tuple[Any, Any]:
    """``Trainer.__init__``'s device, distributed, mesh and seeding calls, then an FSDP2 model and optimizer."""
    from torch.distributed.fsdp import fully_shard
    from torchtitan.config.configs import CommConfig, DebugConfig, ParallelismConfig
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.parallel_dims import ParallelDims

    device = torch.device("cuda", _local_rank())
    torch.cuda.set_device(device)
    world = dist_utils.init_distributed(CommConfig())
    parallel_dims = ParallelDims.from_config(ParallelismConfig(), world)
    dist_utils.set_determinism(parallel_dims, device, DebugConfig(), distinct_seed_mesh_dims=["pp"])
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).to(device)
    mesh = parallel_dims.get_mesh("dp_shard")
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def torchtitan_trainer_step(state: tuple[Any, Any]) -> None:
    model, optimizer = state
    model(torch.randn(8, 64, device="cuda")).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


# ---------------------------------------------------------------------------------------------- DeepSpeed

ZERO2 = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 1,
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
}


def deepspeed_zero2_startup() -> Any:
    """``set_device``, ``deepspeed.init_distributed()`` and ``deepspeed.initialize`` with ZeRO stage 2."""
    import deepspeed

    torch.cuda.set_device(_local_rank())
    deepspeed.init_distributed()
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    config = {**ZERO2, "train_batch_size": ZERO2["train_micro_batch_size_per_gpu"] * dist.get_world_size()}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def deepspeed_zero2_step(engine: Any) -> None:
    loss = engine(torch.randn(1, 64, device=engine.device)).pow(2).mean()
    engine.backward(loss)
    engine.step()
