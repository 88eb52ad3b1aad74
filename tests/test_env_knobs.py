"""The knob lists of ``simnccl.env_knobs`` against the names simnccl's sources read."""

from __future__ import annotations

import re
from pathlib import Path

import simnccl
from simnccl.capture.ranks import CODE_SET_PREFIXES
from simnccl.env_knobs import REPORT_ONLY_KNOBS, known_knobs, simulated_knobs

SIMULATED_KNOBS = simulated_knobs()

SOURCES = Path(simnccl.__file__).parent
# A knob the code reads is named as a string of its own ("NCCL_ALGO" in env); a message that mentions one
# ("run with NCCL_DEBUG=INFO") names it inside a longer string.
QUOTED = re.compile(r"""["']((?:TORCH_NCCL|TORCH_FR|NCCL)_[A-Z0-9_]+)["']""")


def _quoted_knobs() -> set[str]:
    names: set[str] = set()
    for path in SOURCES.rglob("*.py"):
        names.update(QUOTED.findall(path.read_text(encoding="utf-8")))
    return names & known_knobs()


def test_every_nccl_knob_the_sources_read_is_a_simulated_knob() -> None:
    """A knob read somewhere but missing from the list would let captured code set it differently per rank and be
    simulated with one value for all (a pass that real NCCL need not give)."""
    missing = _quoted_knobs() - SIMULATED_KNOBS - REPORT_ONLY_KNOBS
    assert not missing, f"read by simnccl but not in env_knobs.simulated_knobs(): {sorted(missing)}"


def test_every_simulated_knob_is_one_the_sources_read_and_torch_or_nccl_knows() -> None:
    assert known_knobs() >= SIMULATED_KNOBS
    stale = SIMULATED_KNOBS - _quoted_knobs()
    assert not stale, f"in env_knobs.simulated_knobs() but named nowhere in simnccl's sources: {sorted(stale)}"


def test_every_simulated_knob_is_one_a_capture_sees_the_code_set() -> None:
    """A capture records only the knobs of ``CODE_SET_PREFIXES`` the code sets in os.environ: a simulated knob
    outside them (TORCH_FR_*, before) was simulated without, whatever the code set."""
    assert all(name.startswith(CODE_SET_PREFIXES) for name in SIMULATED_KNOBS | REPORT_ONLY_KNOBS)


def test_knob_values_that_mean_the_same_to_nccl_s_model_are_one_value() -> None:
    """Megatron's SHARP deletes NCCL_COLLNET_ENABLE where it could set 0: the same to NCCL unless a group asks for
    collnet in its config, which the environment overrides. A knob the model does not read is told apart as
    written, and a value the model refuses is never the same as another."""
    from simnccl.nccl.knobs import same_to_the_model

    assert same_to_the_model("NCCL_COLLNET_ENABLE", [None, "0"])
    assert not same_to_the_model("NCCL_COLLNET_ENABLE", [None, "0"], [{}, {"collnet_enable": True}])
    assert not same_to_the_model("NCCL_COLLNET_ENABLE", [None, "1"])
    assert not same_to_the_model("NCCL_RUNTIME_CONNECT", [None, "0"])
    assert same_to_the_model("NCCL_RUNTIME_CONNECT", ["1", None])
    assert not same_to_the_model("TORCH_NCCL_ASYNC_ERROR_HANDLING", ["1", None])  # not the model's: as written
    assert not same_to_the_model("NCCL_MAX_NCHANNELS", ["abc", None])
