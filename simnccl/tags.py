"""Tag a group with what it is for (``purpose``) and what will run on it (``traffic``), in plain torch code.

Why: a policy decides better when it knows that a group is for pipeline p2p or that it never communicates
(``nccl-lazy-p2p``, a team's own policy), but torch's ``new_group`` takes no such argument: production code
that passed ``purpose=`` to it would raise ``TypeError`` whenever simnccl's ``apply()`` is not installed. So
tags travel beside the call instead of inside it::

    from simnccl.tags import group_tags

    with group_tags(purpose="pp", traffic="p2p"):
        pp = torch.distributed.new_group(pp_ranks)       # plain torch: runs with or without simnccl

or, equivalently, ``simnccl.tags.new_group(pp_ranks, purpose="pp", traffic="p2p")``, which calls whatever
``torch.distributed.new_group`` is at the time (torch's own, or ``apply()``'s wrapper) inside ``group_tags``
and never passes the tags to torch. ``simnccl.torch_apply`` and ``simnccl.capture`` read the tags of the
innermost ``group_tags`` block; outside both, the tags are simply unused. This module imports neither torch
nor simpy (``new_group``/``split_group`` import torch when called).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from simnccl.policy.plans import TRAFFIC_KINDS

__all__ = ["current_tags", "group_tags", "new_group", "split_group"]

_TAGS: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "simnccl_group_tags", default=(None, None)
)


def check_traffic(traffic: str | None) -> None:
    """``traffic`` is one of ``collectives``, ``p2p``, ``none`` (or None); anything else is a caller's mistake."""
    if traffic is not None and traffic not in TRAFFIC_KINDS:
        raise ValueError(f"traffic={traffic!r}: expected one of {', '.join(TRAFFIC_KINDS)} (or None)")


@contextlib.contextmanager
def group_tags(purpose: str | None = None, traffic: str | None = None) -> Iterator[None]:
    """Group-creation calls inside the block carry these tags (an inner block's replace an outer's)."""
    if purpose is not None and not isinstance(purpose, str):
        raise TypeError(f"purpose={purpose!r}: expected a string (a free tag such as 'tp', 'pp', 'dp') or None")
    check_traffic(traffic)
    token = _TAGS.set((purpose, traffic))
    try:
        yield
    finally:
        _TAGS.reset(token)


def current_tags() -> tuple[str | None, str | None]:
    """(purpose, traffic) of the innermost ``group_tags`` block, or (None, None)."""
    return _TAGS.get()


def new_group(*args: Any, purpose: str | None = None, traffic: str | None = None, **kwargs: Any) -> Any:
    """``torch.distributed.new_group(*args, **kwargs)`` with tags; works with and without ``apply()``."""
    import torch.distributed as dist

    with group_tags(purpose, traffic):
        return dist.new_group(*args, **kwargs)


def split_group(*args: Any, purpose: str | None = None, traffic: str | None = None, **kwargs: Any) -> Any:
    """``torch.distributed.split_group(*args, **kwargs)`` with tags; works with and without ``apply()``."""
    import torch.distributed as dist

    with group_tags(purpose, traffic):
        return dist.split_group(*args, **kwargs)
