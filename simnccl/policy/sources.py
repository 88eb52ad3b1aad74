"""The source files of a user's policy classes, with a digest of each: what says that a policy changed.

Why: a result recorded for a policy (a test's failure, a sweep's row) holds only while the policy's code is what
it was. The pytest plugin records these digests with a failure, so a replay can tell a fix (the source changed)
from a case that is not deterministic; a sweep puts them in each cell's identity, so ``--resume`` never keeps a
row that an edited policy would no longer give. Built-in policies are simnccl's own, versioned with it: none.
Digested: the file that defines each of the user's classes, and the module each import spec (or entry point) of
a spec names, where its object is made (``P = BudgetPolicy(max_mib_per_device=...)`` in ``conf.py``: a built-in
class, configured in the user's file); not the modules they import.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from simnccl.policy.plans import PolicyError
from simnccl.policy.specs import get_policy, spec_modules

MAX_PARTS = 64  # a composition's parts and wrappers' inner policies, walked at most this many


def policy_sources(policy: object) -> dict[str, str]:
    """The source file of each of a user's policy classes in ``policy`` (a spec, an object, a composition),
    resolved, with the sha256 of its content; ``{}`` for built-in policies and for a spec that does not load."""
    return {path: digest for path, (digest, _) in _sources(policy).items()}


def loaded_sources(policy: object) -> tuple[dict[str, str], list[str]]:
    """``policy_sources(policy)``, and those of its files whose content is not what this process imported: edited
    since the module holding it was imported here (as this process first saw it, by ``policy_sources`` or this),
    in one pass over the files.

    Why: a long-lived process (a Dask worker kept between sweeps, a pytest session) imports a user's module once;
    the file edited afterwards has the new digest on disk while the old code runs, so a digest of the files alone
    said "the policy is the edited one" over results of the old one (found by a tester: a sweep on a Dask
    cluster passed a policy whose edit fails locally). A module imported afresh is seen afresh."""
    sources = _sources(policy)
    stale = sorted(path for path, (digest, _) in sources.items() if _FIRST_SEEN[path][1] != digest)
    return {path: digest for path, (digest, _) in sources.items()}, stale


# Each user module file this process has seen, with the module object and the file's digest when first seen.
_FIRST_SEEN: dict[str, tuple[object, str]] = {}


def _sources(policy: object) -> dict[str, tuple[str, object]]:
    """``policy_sources``' files, each with its digest now and the module object that holds it here."""
    try:
        resolved = get_policy(policy) if isinstance(policy, str) else policy
    except PolicyError:
        return {}
    modules: list[object] = []
    if isinstance(policy, str):
        modules.extend(sys.modules.get(name) for name in spec_modules(policy))
    todo, seen = [resolved], 0
    while todo and seen < MAX_PARTS:
        part, seen = todo.pop(), seen + 1
        if type(part).__module__.split(".")[0] == "simnccl":
            todo.extend(getattr(part, "parts", None) or ((part.inner,) if hasattr(part, "inner") else ()))
            continue
        modules.append(sys.modules.get(type(part).__module__))
    sources: dict[str, tuple[str, object]] = {}
    for module in modules:
        path = getattr(module, "__file__", None)
        digest = file_digest(path) if isinstance(path, str) else None
        if digest is None:
            continue
        resolved_path = str(Path(path).resolve())  # type: ignore[arg-type]
        sources[resolved_path] = (digest, module)
        first = _FIRST_SEEN.get(resolved_path)
        if first is None or first[0] is not module:  # first seen, or imported afresh: its code is this file's
            _FIRST_SEEN[resolved_path] = (module, digest)
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
