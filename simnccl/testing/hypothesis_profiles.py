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


# Set by the pytest plugin while a session names its profile with ``--hypothesis-profile``: a choice even when the
# name is the one hypothesis would load by itself (``default``, or ``ci`` on a CI machine).
CHOSEN_ON_THE_COMMAND_LINE = [False]


def untouched() -> bool:
    """True while nobody (a conftest, ``--hypothesis-profile``, simnccl) has chosen a profile for the session.

    Why the flag: ``--hypothesis-profile default`` (or ``ci`` with ``CI`` set) looked like nobody's choice, and
    the session ran simnccl's ``ci`` profile instead, with fewer examples than the user's ``default`` asked for."""
    if CHOSEN_ON_THE_COMMAND_LINE[0]:
        return False
    return settings.get_current_profile_name() == hypothesis_own_profile()


def load_profile(name: str | None = None) -> str:
    """Load ``name`` (default: $SIMNCCL_HYPOTHESIS_PROFILE, else ``ci``); returns the registered name loaded.

    Under a forced seed the profile's :func:`seeded` child is loaded: importing the strategies loads ``ci`` at
    collection, after the plugin applied the seed, and a derandomized ``ci`` would ignore it."""
    chosen = name or os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE
    if chosen not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={chosen!r}: expected one of {', '.join(PROFILES)}")
    registered = seeded(registered_name(chosen))
    settings.load_profile(registered)
    return registered


def forced_seed() -> object:
    """The seed hypothesis is told to draw every test's examples from (``--hypothesis-seed``, or the plugin's
    ``--simnccl-seed``), or None."""
    from hypothesis import core

    return getattr(core, "global_force_seed", None)


def seeded(name: str) -> str:
    """The registered profile to load for ``name`` in this process: ``name`` itself, or, while a seed is
    forced and ``name`` is derandomized, a child of it with derandomization off (registered now).

    Why: a derandomized test draws from a hash of its own source and ignores every seed, so a nightly job
    passing ``--hypothesis-seed`` with a new seed each night under ``ci`` repeated the same examples. Off, the
    forced seed chooses them: the same seed draws the same examples (in every xdist worker, and in the replay,
    which passes the seed again), another seed other ones. Everything else (examples, deadline, health checks,
    no database) is the parent's."""
    seed = forced_seed()
    parent = settings.get_profile(name)
    if seed is None or not parent.derandomize:
        return name
    child = f"{name}-seed-{seed}"
    settings.register_profile(child, parent=parent, derandomize=False)
    return child
