"""simnccl's hypothesis profiles (``ci``, ``dev``, ``thorough``), chosen by ``SIMNCCL_HYPOTHESIS_PROFILE``.

A module of its own so that the pytest plugin, which the ``pytest11`` entry point loads into *every* pytest
session of an environment where simnccl is installed, can register them without importing the strategies (and
without touching a session's hypothesis settings unless the variable asks it to).
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


def register_profiles() -> None:
    for name, values in PROFILES.items():
        settings.register_profile(name, suppress_health_check=_SUPPRESS, **values)


def load_profile(name: str | None = None) -> str:
    """Load ``name`` (default: $SIMNCCL_HYPOTHESIS_PROFILE, else ``ci``); returns the name loaded."""
    chosen = name or os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE
    if chosen not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={chosen!r}: expected one of {', '.join(PROFILES)}")
    settings.load_profile(chosen)
    return chosen
