"""Shared fixtures: the repository's scenarios folder and a writer for scenario files under tmp_path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCENARIOS_DIR = REPO / "scenarios"

# A small valid scenario: two H100 96GB ranks, init and one checkpoint. Tests append or replace pieces.
TINY = """\
[scenario]
name = "tiny"

[cluster]
gpu = "h100-96gb"
gpus_per_node = 2

[torch]
release = "2.15"

[workload]
steps = [
  { op = "set_device" },
  { op = "init_process_group", backend = "nccl" },
  { op = "checkpoint", name = "after_init" },
]
"""


@pytest.fixture
def write_scenario(tmp_path: Path) -> Callable[..., Path]:
    """``write_scenario(text, name="s.toml")`` writes ``text`` under tmp_path and returns the path."""

    def write(text: str, name: str = "s.toml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write
