"""What a command needs installed, checked before it imports it.

Why: ``simnccl capture`` and ``simnccl real`` drive real torch, which a downstream suite installed with
``simnccl[testing]`` does not have. A missing prerequisite is bad input in the exit-code contract (2, one line
saying what to install), never a ``ModuleNotFoundError`` traceback. ``find_spec`` answers without importing.
"""

from __future__ import annotations

import importlib.util


class MissingPrerequisite(RuntimeError):
    """A package a command needs is not installed; the message is the one line to print."""


def require_torch(command: str) -> None:
    """Raise ``MissingPrerequisite`` unless torch can be imported (without importing it)."""
    if importlib.util.find_spec("torch") is None:
        raise MissingPrerequisite(
            f"{command} needs PyTorch (torch>=2.15), which is not installed: pip install 'simnccl[real]'"
        )


def require_matplotlib(what: str) -> None:
    """Raise ``MissingPrerequisite`` unless matplotlib can be imported (pictures are an extra: ``plots``)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise MissingPrerequisite(f"{what} needs matplotlib, which is not installed: pip install 'simnccl[plots]'")
