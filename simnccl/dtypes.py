"""Tensor element types by the names torch's flight recorder prints (``"Float"``, ``"BFloat16"`` ...).

Why one table: a collective's ``dtype`` is compared between members (a mismatch is a desync), printed in
flight-recorder dumps, turned into a real tensor on the real tier and read back from captured tensors. Four
places kept their own lists, which disagreed (the dump writer sized ``Short`` and ``Bool`` as 4 bytes), and a
scenario could name any string: ``dtype = "fp16"`` simulated as a type no torch has and ran on the real tier as
float32. The names and sizes are data (``simnccl/data/dtypes.toml``, checked against torch by the tests);
importing this module does not import torch.
"""

from __future__ import annotations

import functools
import importlib.resources
import tomllib
from dataclasses import dataclass

DATA_FILE = "dtypes.toml"
DEFAULT = "Float"  # what an op carries when its file or caller names no dtype (torch's default float32)


@dataclass(frozen=True, slots=True)
class Dtype:
    name: str  # the c10 ScalarType name: "Float"
    torch: str  # the torch attribute: "float32"
    bytes: int  # element size
    gloo: bool = True  # whether gloo's collectives take it (they raise "Invalid scalar type" where not)
    gloo_gather: bool = True  # whether gloo's gather takes it (torch hands it a complex tensor as it is)


@functools.cache
def dtypes() -> dict[str, Dtype]:
    """Every known dtype by name, in the data file's order (read once)."""
    resource = importlib.resources.files("simnccl") / "data" / DATA_FILE
    table = tomllib.loads(resource.read_text(encoding="utf-8"))
    return {
        name: Dtype(
            name,
            str(entry["torch"]),
            int(entry["bytes"]),
            bool(entry.get("gloo", True)),
            bool(entry.get("gloo_gather", entry.get("gloo", True))),
        )
        for name, entry in table.items()
    }


def gloo_refuses(name: str, call: str = "") -> bool:
    """Whether gloo's collectives raise "Invalid scalar type" for a tensor of ``name`` (``dtypes.toml``); ``call``:
    the torch call a collective stands for ("gather": torch hands it complex tensors as they are)."""
    entry = dtypes()[name]
    return not (entry.gloo_gather if call == "gather" else entry.gloo)


def is_known(name: object) -> bool:
    return isinstance(name, str) and name in dtypes()


def element_bytes(name: str) -> int:
    """The element size of ``name``; KeyError for a name not in the table (callers check input first)."""
    return dtypes()[name].bytes


def by_torch_attribute() -> dict[str, str]:
    """torch attribute ("float32") -> name ("Float"): what a captured tensor's dtype is recorded as."""
    return {entry.torch: entry.name for entry in dtypes().values()}


def expected_text() -> str:
    return ", ".join(dtypes())
