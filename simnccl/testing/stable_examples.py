"""Derandomized examples that do not depend on which modules a process happens to have imported.

Why: hypothesis (6.131 and later) draws, about one draw in twenty, a literal constant taken from the source of the
"local" modules already imported: any module outside the standard library and site-packages that is not a test
file, which means a team's own policies and startup code, and simnccl itself when installed editable
(``hypothesis.internal.conjecture.providers``). It scans again whenever ``sys.modules`` grows. So a
derandomized profile (simnccl's ``ci``: "the same examples every run", or hypothesis' own on a CI machine) drew
other examples once a test that imported one more module had run in the same process; under pytest-xdist which
tests a worker ran before is decided afresh each run. A failure found in one CI run could then be gone from the
next, which is the worst thing a property suite can do to the people reading it. Measured in this repository:
the CLI fuzz test drew other byte mutants after ``tests/test_bad_input.py`` had run in the same process (205 of
450 exited 0 alone, 198 after it), and 1 in 60 generated cases changed after a module of constants was
imported.

The plugin (``simnccl.testing.plugin``) freezes the pool of local constants, empty, when collection has finished,
if the session's profile is derandomized or a seed was given to reproduce a run (``--simnccl-seed``,
``--hypothesis-seed``): a test's examples then depend on the test and the seed alone. It froze the pool the
collected modules made at first; but which modules are collected depends on the command line, and a test run
alone (``pytest NODEID``, what the replay of a failed assertion runs) drew other examples than in the whole
suite, passed, and the replay said "passes now" for a failure that had not gone. Random runs are left as
hypothesis makes them.
"""

from __future__ import annotations

from typing import Any

_FROZEN: list[bool] = []  # one entry once the pool is frozen (frozen for the rest of the process)


def freeze_local_constants() -> bool:
    """Let hypothesis draw from no local constants for the rest of the process. True when the pool is frozen
    (now or before); False when this hypothesis has no such pool (nothing to freeze)."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a hypothesis without the providers module
        return False
    scan = getattr(providers, "_get_local_constants", None)
    if not callable(scan):
        return False
    if _FROZEN:
        return True
    pool = _empty_pool(providers)
    if pool is None:  # pragma: no cover - a hypothesis whose pool is built otherwise: the collected modules'
        pool = scan()

    def frozen() -> Any:
        return pool

    providers._get_local_constants = frozen
    _FROZEN.append(True)
    return True


def _empty_pool(providers: Any) -> Any:
    """An empty pool of the kind hypothesis keeps (its ``_local_constants`` before any module is scanned)."""
    try:
        sorted_set, by_bits = providers.SortedSet, providers.float_to_int
        return providers.Constants(
            integers=sorted_set(), floats=sorted_set(key=by_bits), bytes=sorted_set(), strings=sorted_set()
        )
    except (AttributeError, TypeError):
        return None
