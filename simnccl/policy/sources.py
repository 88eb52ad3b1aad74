"""The source files of a user's policy classes, with a digest of each: what says that a policy changed.

Why: a result recorded for a policy (a test's failure, a sweep's row) holds only while the policy's code is what
it was. The pytest plugin records these digests with a failure, so a replay can tell a fix (the source changed)
from a case that is not deterministic; a sweep puts them in each cell's identity, so ``--resume`` never keeps a
row that an edited policy would no longer give. Built-in policies are simnccl's own, versioned with it: none.
Only the file that defines each class is digested, not the modules it imports.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from simnccl.policy.plans import PolicyError
from simnccl.policy.specs import get_policy

MAX_PARTS = 64  # a composition's parts and wrappers' inner policies, walked at most this many


def policy_sources(policy: object) -> dict[str, str]:
    """The source file of each of a user's policy classes in ``policy`` (a spec, an object, a composition),
    resolved, with the sha256 of its content; ``{}`` for built-in policies and for a spec that does not load."""
    try:
        resolved = get_policy(policy) if isinstance(policy, str) else policy
    except PolicyError:
        return {}
    sources: dict[str, str] = {}
    todo, seen = [resolved], 0
    while todo and seen < MAX_PARTS:
        part, seen = todo.pop(), seen + 1
        if type(part).__module__.split(".")[0] == "simnccl":
            todo.extend(getattr(part, "parts", None) or ((part.inner,) if hasattr(part, "inner") else ()))
            continue
        path = getattr(sys.modules.get(type(part).__module__), "__file__", None)
        digest = file_digest(path) if isinstance(path, str) else None
        if digest is not None:
            sources[str(Path(path).resolve())] = digest  # type: ignore[arg-type]
    return sources


def sources_digest(sources: dict[str, str]) -> str:
    """One short digest of ``policy_sources``' answer ("" where it is empty: nothing of the user's to change)."""
    if not sources:
        return ""
    return hashlib.sha256(json.dumps(sorted(sources.items())).encode()).hexdigest()[:16]


def file_digest(path: str) -> str | None:
    """The sha256 of a file's bytes; None where it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
