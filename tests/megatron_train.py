"""Megatron-Core 0.19.2's startup as a training script runs it: ``simnccl capture --world W tests/megatron_train.py
--tp T --pp P`` captures it (not collected by pytest).

Megatron is imported at the top, as training scripts do, so the capture's fork server imports it once for every
rank (``simnccl.capture.script``); ``main()`` runs under the ``__main__`` guard in each rank, with that rank's
environment. The calls are ``tests/framework_startups.py::megatron_startup``'s for the same ``tp``/``pp``
(``_initialize_distributed`` re-typed, the real ``initialize_model_parallel``, then ``initialize_megatron``'s
``_compile_dependencies`` barrier, re-typed), so the CLI's capture can
be checked against the Python API's and the generator's.
"""

import argparse
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from megatron.core import parallel_state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(
        backend="nccl",
        world_size=int(os.environ["WORLD_SIZE"]),
        rank=int(os.environ["RANK"]),
        timeout=timedelta(minutes=10),
    )
    parallel_state.initialize_model_parallel(
        args.tp, args.pp, None, distributed_timeout_minutes=10, order="tp-cp-ep-dp-pp"
    )
    dist.barrier()  # initialize_megatron's _compile_dependencies (megatron/training/initialize.py:185)


if __name__ == "__main__":
    main()
