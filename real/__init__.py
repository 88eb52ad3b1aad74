"""The verification tier: simnccl's Programs and policies on real torch.distributed (imports torch).

Nothing here is imported by ``simnccl``; the driver, launcher, measurement and calibration land with the
verification-tier issue.
"""
