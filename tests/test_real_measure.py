"""How the real tier names a failed op (``simnccl.real.measure.classify``), on the exception texts torch 2.15 and
NCCL produce: no GPU needed, the texts are built as their sources build them."""

from __future__ import annotations

import pytest

from simnccl.memory import oom_message
from simnccl.real.measure import classify

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

# torch 2.15, legacy ProcessGroupNCCL: C10D_NCCL_CHECK (NCCLUtils.hpp:76-85) throws DistBackendError with
# "NCCL error in: <file>:<line>, " + ncclGetErrorWithVersion(result) + "\n" + getNcclErrorDetailStr(result), the
# detail being "ncclUnhandledCudaError: Call to CUDA function failed." + "\nLast error:\n" + ncclGetLastError().
LEGACY = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run with "
    "NCCL_DEBUG=INFO for details), NCCL version 2.28.3\nncclUnhandledCudaError: Call to CUDA function failed.\n"
    "Last error:\n{last}"
)
# torch 2.15, nccl2 / nccl-lazy: NCCLException (nccl2/ProcessGroupNCCL.hpp:79) is
# "{operation}: {ncclGetErrorString(result)} \nNCCL Last Error: {ncclGetLastError(comm)}", a RuntimeError in Python.
NCCL2 = "{operation}: unhandled cuda error (run with NCCL_DEBUG=INFO for details) \nNCCL Last Error: {last}"
# NCCL's own WARN texts for a failed device allocation (src/include/alloc.h), the last error torch appends.
CALLOC = "Failed to CUDA calloc 6291456 bytes"
CALLOC_ASYNC = "Failed to CUDA calloc async 2432 bytes"
MALLOC = "Failed to CUDA malloc 33554432 bytes"
CUMEM = "Cuda failure 2 'out of memory'"


def _legacy(last: str) -> BaseException:
    return torch.distributed.DistBackendError(LEGACY.format(last=last))


def _nccl2(operation: str, last: str) -> BaseException:
    return RuntimeError(NCCL2.format(operation=operation, last=last))


@pytest.mark.parametrize("last", [CALLOC, CALLOC_ASYNC, MALLOC, CUMEM])
def test_an_nccl_out_of_memory_under_the_legacy_backend_is_oom(last: str) -> None:
    """The simulator calls it ``oom`` (a DistBackendError since torch 2.15 is typed as it is raised); the real tier
    called it ``error``, a false disagreement in ``real compare`` on a GPU."""
    assert classify(_legacy(last)) == "oom"


@pytest.mark.parametrize("operation", ["Failed to initialize NCCL communicator", "NCCL AllReduce failed"])
@pytest.mark.parametrize("last", [CALLOC, CALLOC_ASYNC, CUMEM])
def test_an_nccl_out_of_memory_under_nccl2_is_oom(operation: str, last: str) -> None:
    assert classify(_nccl2(operation, last)) == "oom"


def test_the_simulators_own_nccl_oom_text_is_oom_under_either_type() -> None:
    """What the simulator raises for an NCCL communicator's OOM is what the real tier calls oom."""
    text = oom_message("n0:cuda:0", 6291456, 1024, 80 * 2**30, nccl=True)
    assert classify(torch.distributed.DistBackendError(text)) == "oom"
    assert classify(RuntimeError(text)) == "oom"


def test_a_tensor_out_of_memory_is_still_oom() -> None:
    text = oom_message("n0:cuda:0", 2**30, 2**20, 80 * 2**30, nccl=False)
    assert classify(torch.OutOfMemoryError(text)) == "oom"


@pytest.mark.parametrize(
    "exc",
    [
        # an NCCL CUDA failure that is not an allocation
        _legacy("Cuda failure 'invalid device ordinal'"),
        _nccl2("NCCL AllReduce failed", "Cuda failure 'an illegal memory access was encountered'"),
        # without the last error, "unhandled cuda error" alone says nothing about memory
        RuntimeError(
            "Failed to initialize NCCL communicator: unhandled cuda error (run with NCCL_DEBUG=INFO for details)"
        ),
        # NCCL's pinned host memory, not the device's
        _legacy("Failed to CUDA host alloc 4194304 bytes"),
        # the calloc text under a type torch never raises for an NCCL error
        ValueError(LEGACY.format(last=CALLOC)),
    ],
    ids=["legacy-other-cuda", "nccl2-other-cuda", "no-last-error", "host-alloc", "not-an-nccl-type"],
)
def test_other_nccl_errors_stay_errors(exc: BaseException) -> None:
    assert classify(exc) == "error"
