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


def test_the_gloo_flag_is_what_real_gloo_does_with_each_dtype(tmp_path) -> None:
    """``gloo = false`` exactly where torch's gloo raises "Invalid scalar type", and ``gloo_gather = false`` where
    its gather alone does (a one-rank gloo world, in a process of its own: an all_reduce, an all_gather and a
    gather of each listed dtype)."""
    pytest.importorskip("torch")
    import json
    import subprocess
    import sys

    probe = (
        "import json, sys, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', init_method='file://' + sys.argv[1], rank=0, world_size=1)\n"
        "out = {}\n"
        "for name, attr in json.loads(sys.argv[2]).items():\n"
        "    said = []\n"
        "    for run in (\n"
        "        lambda t: dist.all_reduce(t),\n"
        "        lambda t: dist.all_gather([torch.zeros_like(t)], t),\n"
        "        lambda t: dist.gather(t, [torch.zeros_like(t)], dst=0),\n"
        "    ):\n"
        "        try:\n"
        "            run(torch.zeros(4, dtype=getattr(torch, attr)))\n"
        "            said.append('ok')\n"
        "        except RuntimeError as err:\n"
        "            said.append(str(err))\n"
        "    out[name] = said\n"
        "print(json.dumps(out))\n"
    )
    table = {name: entry.torch for name, entry in dtypes.dtypes().items()}
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "store"), json.dumps(table)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout.splitlines()[-1])
    for name, said in measured.items():
        expected = ["Invalid scalar type" if dtypes.gloo_refuses(name, call) else "ok" for call in ("", "", "gather")]
        assert said == expected, name
    assert sum(dtypes.gloo_refuses(n) for n in table) == 9
    assert sum(dtypes.gloo_refuses(n, "gather") for n in table) == 12  # and the three complex types


def test_a_gloo_gather_of_a_complex_tensor_raises_where_its_all_gather_passes() -> None:
    """Found by a tester (real 2.15 gloo, 2 ranks, 3 runs): a ComplexFloat gather raised "Invalid scalar type" on
    both ranks; the simulator passed it (torch's gather does not pass complex tensors as real ones)."""
    from simnccl.ops import AllGather, InitProcessGroup
    from simnccl.testing import simulate

    init = InitProcessGroup(backend="gloo")
    gather = simulate(
        [init, AllGather(size_bytes=64, dtype="ComplexFloat", call="gather", root=0)], gpus_per_node=0, ranks_per_node=2
    )
    assert [(e["rank"], e["message"]) for e in gather.errors] == [
        (0, "Invalid scalar type"),
        (1, "Invalid scalar type"),
    ]
    assert (
        simulate([init, AllGather(size_bytes=64, dtype="ComplexFloat")], gpus_per_node=0, ranks_per_node=2).verdict
        == "pass"
    )


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_a_gloo_collective_of_a_type_gloo_refuses_raises_on_the_rank(backend: str) -> None:
    """Real gloo raises "Invalid scalar type" for an int16 or float8 all_reduce, on every rank that calls it; the
    simulator said pass. NCCL's list is not modelled: the same program on NCCL passes here."""
    from simnccl.ops import InitProcessGroup, SetDevice
    from simnccl.testing import simulate

    program = [SetDevice(), InitProcessGroup(backend=backend), AllReduce(size_bytes=64, dtype="Short")]
    out = simulate(program, nodes=1, gpus_per_node=2, release="2.15")
    if backend == "nccl":
        assert out.verdict == "pass"
        return
    assert out.verdict == "error"
    assert [(e["rank"], e["type"], e["message"]) for e in out.errors] == [
        (0, "RuntimeError", "Invalid scalar type"),
        (1, "RuntimeError", "Invalid scalar type"),
    ]
    fine = simulate([*program[:2], AllReduce(size_bytes=64, dtype="BFloat16")], nodes=1, gpus_per_node=2)
    assert fine.verdict == "pass"
