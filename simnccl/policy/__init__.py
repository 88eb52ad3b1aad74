"""Group-creation policies: pure decisions, shared by the simulator and by real torch.

A policy answers two questions, in torch's own terms, each with a one-line explanation (torchft style):

* at ``init_process_group``: which backend, which ``device_id``, which process-environment knobs
  (``TORCH_DIST_USE_NCCL2``, ``NCCL_COMM_SPLIT_SHARE_RESOURCES``, ...), which ``pg_options``;
* at each ``new_group`` / ``split_group``: which backend, which ``pg_options`` (``lazy_init``,
  ``split_share``, ...), ``use_local_synchronization``, ``device_id`` — or "no new communicator": reuse an
  identical group this process already created.

Why pure (DESIGN rule 2): the same object decides in the simulator and in production, so this package imports
neither simpy nor torch, and a policy sees only what a real process sees when it calls ``new_group``: the
ranks, its own rank, the release, the environment, and the history of group-creation calls *it* made. Every
rank calls ``new_group`` for every group in the same order (unless ``use_local_synchronization``), so a policy
that derives its decision from that history decides the same on every member — and the simulator checks that
it does, on every calling rank, for every policy but simnccl's own built-ins (``decides_alike_on_every_rank``).

Rooms: ``plans`` (requests, plans, decisions, history, how a policy is asked), ``builtins`` (the built-in
policies and ``+`` composition), ``specs`` (naming a policy: built-in names, ``module:Name`` import specs,
entry points; a JSON round trip for case files). Real torch: ``simnccl.torch_apply.apply(policy)``.
"""

from simnccl.policy.builtins import (
    BUILTIN,
    TRUSTED_WRAPPERS,
    BasePolicy,
    BudgetPolicy,
    ComposedPolicy,
    DedupePolicy,
    LazyInitPolicy,
    LazySingleRankPolicy,
    LegacyPolicy,
    NcclLazyP2PPolicy,
    ShareResourcesPolicy,
    SkipSingleRankPolicy,
    decides_alike_on_every_rank,
)
from simnccl.policy.plans import (
    NCCL_NAMES,
    P2P_PURPOSES,
    TRAFFIC_KINDS,
    GroupDecision,
    GroupRequest,
    History,
    InitPlan,
    InitRequest,
    Policy,
    PolicyError,
    UserPolicyError,
    ask_group,
    ask_init,
    creates_eager_nccl,
    decide_group,
    decide_split,
    reused_group_among,
    unchanged,
)
from simnccl.policy.specs import (
    ENTRY_POINT_GROUP,
    describe_policy,
    entry_point_names,
    get_policy,
    policy_from_description,
    policy_label,
)

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "NCCL_NAMES",
    "P2P_PURPOSES",
    "TRAFFIC_KINDS",
    "TRUSTED_WRAPPERS",
    "BasePolicy",
    "BudgetPolicy",
    "ComposedPolicy",
    "DedupePolicy",
    "GroupDecision",
    "GroupRequest",
    "History",
    "InitPlan",
    "InitRequest",
    "LazyInitPolicy",
    "LazySingleRankPolicy",
    "LegacyPolicy",
    "NcclLazyP2PPolicy",
    "Policy",
    "PolicyError",
    "ShareResourcesPolicy",
    "SkipSingleRankPolicy",
    "UserPolicyError",
    "ask_group",
    "ask_init",
    "creates_eager_nccl",
    "decide_group",
    "decide_split",
    "decides_alike_on_every_rank",
    "describe_policy",
    "entry_point_names",
    "get_policy",
    "policy_from_description",
    "policy_label",
    "reused_group_among",
    "unchanged",
]
