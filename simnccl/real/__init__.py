"""The verification tier: simnccl's Programs and policies on real torch.distributed.

* ``driver``   runs one rank's Program with real torch.distributed calls, group creation routed through
               ``simnccl.torch_apply.apply`` (imports ``simnccl.ops`` and ``simnccl.policy`` only, never the engine);
* ``launch``   N rank processes (forked from a zygote that imported torch once, or under torchrun), a
               wall-clock timeout and stall detection, every child killed and reaped, a verdict per run;
* ``lanes``    CPU lane (NCCL names -> gloo, declared) and GPU lane (one rank per visible GPU);
* ``measure``  per-op measurement and the simulator's Result JSON shape for real runs;
* ``compare``  simulator vs real, per variant: verdicts and stuck ranks (CPU), memory per checkpoint (GPU);
* ``differential``  generated programs on real gloo and in the simulator;
* ``calibrate``     the GPU calibration suite that writes a simnccl profile.

``simnccl real run|compare|diff|calibrate|gpu-scenarios`` (or ``python -m simnccl.real ...``);
``real/gpu_check.sh`` in the repository for a GPU machine.
Nothing in ``simnccl`` imports this package.
"""
