"""The verification tier: simnccl's Programs and policies on real torch.distributed.

* ``simnccl.real.driver``   runs one rank's Program with real torch.distributed calls, group creation routed through
                    ``simnccl.policy.apply`` (imports ``simnccl.ops`` and ``simnccl.policy`` only, never the engine);
* ``simnccl.real.launch``   N rank processes (forked from a zygote that imported torch once, or under torchrun), a
                    wall-clock timeout and stall detection, every child killed and reaped, a verdict per run;
* ``simnccl.real.lanes``    CPU lane (NCCL names -> gloo, declared) and GPU lane (one rank per visible GPU);
* ``simnccl.real.measure``  per-op measurement and the simulator's Result JSON shape for real runs;
* ``simnccl.real.compare``  simulator vs real, per variant: verdicts and stuck ranks (CPU), memory per checkpoint (GPU);
* ``simnccl.real.differential``  generated programs on real gloo and in the simulator;
* ``simnccl.real.calibrate``     the GPU calibration suite that writes a simnccl profile.

``python -m simnccl.real run|compare|diff|calibrate|gpu-scenarios``; ``real/gpu_check.sh`` for a GPU machine.
Nothing in ``simnccl`` imports this package.
"""
