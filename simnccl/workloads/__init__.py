"""Framework startup generators: a framework's own knobs in, every rank's Program out.

One module per framework (DESIGN rule 3): ``vllm``, ``sglang``, ``megatron``, ``torchtitan``, ``deepspeed``.
Each module's docstring names the framework version and source files it follows. The registry gives every
generator the same signature::

    GENERATORS["megatron"]({"tp": 8, "pp": 4}, world_size=512) -> tuple[Program, ...]

Arguments are validated (unknown key, wrong type, sizes that don't fit the world: ``WorkloadError`` naming
the key). Ranks whose calls are identical share one Program object (DESIGN rule 8).
"""

from __future__ import annotations

from collections.abc import Mapping

from simnccl.ops import Program
from simnccl.workloads import deepspeed, megatron, sglang, torchtitan, vllm
from simnccl.workloads._common import Generator, Param, WorkloadError

GENERATORS: dict[str, Generator] = {
    g.name: g
    for g in (
        vllm.GENERATOR,
        sglang.GENERATOR,
        megatron.GENERATOR,
        torchtitan.GENERATOR,
        deepspeed.GENERATOR,
    )
}


def get_generator(name: str) -> Generator:
    try:
        return GENERATORS[name]
    except KeyError:
        raise WorkloadError(
            "", f"unknown workload generator {name!r}; expected one of {', '.join(GENERATORS)}"
        ) from None


def generate(name: str, args: Mapping[str, object], world_size: int) -> tuple[Program, ...]:
    """Every rank's Program for framework ``name`` with knobs ``args`` on a world of ``world_size`` ranks."""
    return get_generator(name)(args, world_size)


__all__ = ["GENERATORS", "Generator", "Param", "WorkloadError", "generate", "get_generator"]
