"""Shared fixtures: the repository's scenarios folder, a writer for scenario files under tmp_path, and a loader
for the benchmark scripts (they are files, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
SCENARIOS_DIR = REPO / "scenarios"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (registered in sys.modules: dataclasses resolve through it)."""
    spec = importlib.util.spec_from_file_location(f"simnccl_benchmark_{name}", REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
