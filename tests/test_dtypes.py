"""The dtype table (``simnccl.dtypes``): torch's own names and sizes, the one list every part uses."""

from __future__ import annotations

import pytest

from simnccl import dtypes
from simnccl.flight_recorder import numel
from simnccl.ops import AllGather, AllReduce, Barrier, Recv, Send


def test_every_entry_is_torchs_name_attribute_and_size() -> None:
    """Each name is the c10 ScalarType name torch gives that dtype, and the size its itemsize; every dtype
    torch's name table covers is in ours."""
    torch = pytest.importorskip("torch")
    from torch._export.serde.schema import SCALAR_TYPE_TO_C10
    from torch._export.serde.serialize import _TORCH_TO_SERIALIZE_DTYPE

    torch_names = {
        dtype: SCALAR_TYPE_TO_C10[scalar]
        for dtype, scalar in _TORCH_TO_SERIALIZE_DTYPE.items()
        if scalar in SCALAR_TYPE_TO_C10
    }
    table = dtypes.dtypes()
    for entry in table.values():
        dtype = getattr(torch, entry.torch)
        assert isinstance(dtype, torch.dtype), entry
        assert torch_names[dtype] == entry.name, entry
        assert dtype.itemsize == entry.bytes, entry
    assert sorted(table) == sorted(torch_names.values())


def test_the_default_is_float32() -> None:
    assert dtypes.DEFAULT == "Float"
    assert dtypes.dtypes()[dtypes.DEFAULT].torch == "float32"
    assert AllReduce().dtype == dtypes.DEFAULT


@pytest.mark.parametrize("op_type", [AllReduce, AllGather, Barrier])
@pytest.mark.parametrize("name", ["fp16", "float32", "", "float"])
def test_a_collective_with_an_unknown_dtype_is_refused(op_type: type, name: str) -> None:
    """Programs built in Python (a user's own tests) are checked as scenario files are."""
    with pytest.raises(ValueError, match=r"dtype: expected one of Byte, .*got"):
        op_type(dtype=name)


@pytest.mark.parametrize("op_type", [Send, Recv])
def test_a_p2p_with_an_unknown_dtype_is_refused(op_type: type) -> None:
    with pytest.raises(ValueError, match="dtype: expected one of"):
        op_type(peer=1, dtype="half")
    assert op_type(peer=1, dtype="Half").dtype == "Half"


@pytest.mark.parametrize(("name", "size_bytes", "expected"), [("Short", 8, 4), ("Bool", 8, 8), ("Double", 8, 1)])
def test_flight_recorder_numel_uses_the_element_size(name: str, size_bytes: int, expected: int) -> None:
    """Short and Bool were sized as 4 bytes in the dump writer's own table."""
    assert numel(size_bytes, name) == expected


def test_capture_records_every_listed_dtype_by_its_name() -> None:
    torch = pytest.importorskip("torch")
    from simnccl.capture.values import _dtype

    for entry in dtypes.dtypes().values():
        assert _dtype(torch.empty(0, dtype=getattr(torch, entry.torch))) == entry.name
