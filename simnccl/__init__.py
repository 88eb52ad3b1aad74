"""simnccl: simulate torch.distributed process-group creation and NCCL communicator memory, without GPUs.

Importing simnccl never imports torch: the simulator, the release model and the policy API are pure Python
(plus simpy in the engine), so property tests run on any laptop. The ``real`` package is the torch side.
"""

__version__ = "0.1.0"
