"""simnccl's hypothesis profiles (``ci``, ``dev``, ``thorough``), chosen by ``SIMNCCL_HYPOTHESIS_PROFILE``.

A module of its own so that the pytest plugin, which the ``pytest11`` entry point loads into *every* pytest
session of an environment where simnccl is installed, can register them without importing the strategies (and
without touching a session's hypothesis settings unless the variable asks it to).

The profiles are registered as ``simnccl-ci``, ``simnccl-dev`` and ``simnccl-thorough``: hypothesis has a
built-in ``ci`` profile of its own, which it loads by itself when the ``CI`` variable (or a CI vendor's) is
set. Registering ours under that name would silently change every suite of a CI machine, and would make
"nothing loaded a profile yet" impossible to tell from "hypothesis chose its CI profile"; so ours are
prefixed, and :func:`untouched` counts hypothesis' own automatic choice as untouched.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

PROFILE_ENV = "SIMNCCL_HYPOTHESIS_PROFILE"
DEFAULT_PROFILE = "ci"

# Examples per property test. ``ci`` is derandomized (the same examples every run, so CI is reproducible) and
# sized so that ``pytest -n auto -m property`` simulates well over 2,000 generated programs
# (tests/test_properties.py: ~25 tests x 100, plus the stateful test's steps) in under a minute on two cores;
# the session's "simnccl:" summary line counts them. ``dev`` is for a quick local loop, ``thorough`` for a
# nightly job.
PROFILES: dict[str, dict[str, Any]] = {
    "ci": {"max_examples": 100, "derandomize": True, "deadline": None, "print_blob": True},
    "dev": {"max_examples": 25, "deadline": None, "print_blob": True},
    "thorough": {"max_examples": 1500, "deadline": None, "print_blob": True},
}
# Generated programs are large draws by design; simulations are not microsecond-fast.
_SUPPRESS = (HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much)


REGISTERED_PREFIX = "simnccl-"


def registered_name(name: str) -> str:
    """The name hypothesis knows profile ``name`` by (``ci`` -> ``simnccl-ci``)."""
    return REGISTERED_PREFIX + name


def register_profiles() -> None:
    # Parented on hypothesis' ``default``, not on whatever is loaded now: on a CI machine that is hypothesis'
    # ``ci`` (derandomized, no database), and ``dev`` would silently inherit its derandomization.
    base = settings.get_profile("default")
    for name, values in PROFILES.items():
        settings.register_profile(registered_name(name), parent=base, suppress_health_check=_SUPPRESS, **values)


def hypothesis_own_profile() -> str:
    """The profile hypothesis loads by itself: its ``ci`` on a CI machine, else ``default``."""
    try:
        from hypothesis._settings import is_in_ci
    except ImportError:  # pragma: no cover - a hypothesis without CI detection
        return "default"
    return "ci" if is_in_ci() else "default"


def untouched() -> bool:
    """True while nobody (a conftest, ``--hypothesis-profile``, simnccl) has chosen a profile for the session."""
    return settings.get_current_profile_name() == hypothesis_own_profile()


def load_profile(name: str | None = None) -> str:
    """Load ``name`` (default: $SIMNCCL_HYPOTHESIS_PROFILE, else ``ci``); returns the registered name loaded."""
    chosen = name or os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE
    if chosen not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={chosen!r}: expected one of {', '.join(PROFILES)}")
    registered = registered_name(chosen)
    settings.load_profile(registered)
    return registered
