"""Calibration arithmetic without a GPU: synthetic measurements made by the simulator itself must round-trip.

The suite's programs are simulated with a built-in profile; the checkpoints are fed to ``derive`` as if measured;
the profile written from them must parse, carry provenance, and reproduce the suite in the simulator within 1%.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")

from simnccl.cluster import Cluster, get_gpu_kind
from simnccl.engine import Engine, SimConfig
from simnccl.ops import MIB
from simnccl.profiles import FixedOverheads, find_profile, parse_profile
from simnccl.real.calibrate import derive, profile_toml, reproduce, suite, write_gpu_scenarios
from simnccl.release import get_release
from simnccl.scenario import load_scenario

pytestmark = pytest.mark.real


def _synthetic(profile, world: int, inherited: dict[str, str] | None = None) -> dict:
    results = {}
    for run in suite(world):
        outcome = Engine(
            SimConfig(
                cluster=Cluster(get_gpu_kind(profile.gpu), 1, world, None),
                release=get_release("2.15"),
                profile=profile,
                programs=run.programs,
                env={**(inherited or {}), **run.env},
                launcher="torchrun",
            )
        ).run()
        checkpoints = [
            {
                "name": label,
                "devices": [
                    {"device": key, "rank": snap.rank, "used_mib": snap.used_bytes / MIB}
                    for key, snap in sorted(snaps.items())
                    if key.endswith(":0")
                ],
            }
            for label, snaps in outcome.checkpoints.items()
        ]
        results[run.name] = {"verdict": outcome.verdict, "checkpoints": checkpoints, "ranks": []}
    return results


@pytest.mark.parametrize("world", [1, 2])
def test_profile_from_simulated_measurements_round_trips(world: int, tmp_path: Path) -> None:
    base = find_profile("h200-141gb", "2.15")
    results = _synthetic(base, world)
    assert all(r["verdict"] == "pass" for r in results.values())
    values, why, notes = derive(results, world, base)
    text = profile_toml(
        name="h200-test",
        gpu="h200-141gb",
        releases=["2.15"],
        provenance={"torch": "2.15.0", "nccl": "2.30.7", "gpu_name": "NVIDIA H200", "world": world},
        values=values,
        why=why,
        base=base,
        notes=notes,
        nccl_version="2.30.7",
    )
    path = tmp_path / "h200-test.toml"
    path.write_text(text)
    profile = parse_profile(text, str(path))
    assert profile.nccl_version == "2.30.7" and "NVIDIA H200" in profile.source
    assert profile.comm == pytest.approx(base.comm, abs=1e-3)  # every fitted overhead found again
    if world == 1:
        assert any("2 GPUs" in n for n in notes)
    rows = reproduce(profile, suite(world), results)
    assert rows and all(r["within"] and abs(r["residual_mib"]) < 0.01 for r in rows), rows
    assert "carried over from profile" in profile.derivation["nocolor_split_s"]


def test_calibrate_fits_only_the_fixed_overheads(tmp_path: Path) -> None:
    """Measurements 10 MiB above the model per group, 50 at init and 300 at the first collective: exactly those
    three figures come back, and nothing else of memory is written to the profile."""
    base = find_profile("h200-141gb", "2.15")
    truth = replace(base, comm=FixedOverheads(10.0, 50.0, 300.0))
    results = _synthetic(truth, 2)
    values, why, _notes = derive(results, 2, base)
    memory = {k: v for k, v in values.items() if k.endswith("_mib")}
    assert memory == pytest.approx({"comm_fixed_mib": 10.0, "process_mib": 50.0, "process_first_collective_mib": 300.0})
    assert "least squares" in why["comm_fixed_mib"]
    assert set(memory) == set(FixedOverheads.__dataclass_fields__)


def test_calibrate_models_the_knobs_the_measured_ranks_inherited() -> None:
    """Measured under an NCCL knob exported in the launcher's environment (NCCL_MIN_NCHANNELS=32), the fit
    finds the true overheads only because the model runs that knob too; a note names it in the profile."""
    base = find_profile("h200-141gb", "2.15")
    inherited = {"NCCL_MIN_NCHANNELS": "32"}
    results = _synthetic(base, 2, inherited)
    values, _, notes = derive(results, 2, base, inherited=inherited)
    memory = {k: v for k, v in values.items() if k.endswith("_mib")}
    assert memory == pytest.approx(
        {
            "comm_fixed_mib": base.comm.comm_fixed_mib,
            "process_mib": base.comm.process_mib,
            "process_first_collective_mib": base.comm.process_first_collective_mib,
        },
        abs=1e-3,
    )
    assert any("NCCL_MIN_NCHANNELS=32" in n and "ran with them too" in n for n in notes)
    blind, _, _ = derive(results, 2, base)  # the model without the knob takes its effect for an overhead
    assert blind["comm_fixed_mib"] != pytest.approx(base.comm.comm_fixed_mib, abs=1.0)


def test_a_negative_residual_is_clamped_and_noted() -> None:
    base = find_profile("h200-141gb", "2.15")
    results = _synthetic(base, 1)
    for checkpoint in results["nccl"]["checkpoints"]:
        if checkpoint["name"] != "context":
            for device in checkpoint["devices"]:
                device["used_mib"] -= 5000.0  # far less than the model predicts for the world's init
    values, _, notes = derive(results, 1, base)
    assert values["process_mib"] == 0.0
    assert any("process_mib" in n and "clamped" in n for n in notes)


def test_gpu_check_scenarios_load(tmp_path: Path) -> None:
    profile = Path(find_profile("h200-141gb", "2.15").path)
    for world in (1, 2):
        (path,) = write_gpu_scenarios(tmp_path / str(world), "h200-141gb", profile, world, "2.15")
        scenario = load_scenario(path)
        assert len(scenario.programs) == world
        assert {v.name for v in scenario.variants} >= {"nccl2-default", "legacy", "lazy-init", "lazy-single-rank"}


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--out", "{file}", "--ranks", "2"], "real: --out: cannot write the scenarios to"),
        (["--out", "/proc/no-such-folder", "--ranks", "2"], "real: --out: cannot write the scenarios to"),
        (["--out", "{dir}", "--ranks", "10000000"], "real: --ranks: expected an integer in [1, 16]"),
        (["--out", "{dir}", "--ranks", "-3"], "real: --ranks: expected an integer in [1, 16]"),
        (["--out", "{dir}", "--ranks", "0"], "real: --ranks: expected an integer in [1, 16]"),
    ],
    ids=["out-is-a-file", "out-unwritable", "ranks-huge", "ranks-negative", "ranks-zero"],
)
def test_gpu_scenarios_bad_input_is_one_line_exit_2(tmp_path: Path, capsys, flags: list[str], said: str) -> None:
    """An --out that is a file was an internal error (exit 70); --ranks 10000000 wrote an 88 MB scenario (exit 0);
    --ranks -3 blamed a missing GPU."""
    from simnccl.real.__main__ import main

    (tmp_path / "file").write_text("")
    profile = Path(find_profile("h200-141gb", "2.15").path)
    argv = [f.format(file=tmp_path / "file", dir=tmp_path / "out") for f in flags]
    assert main(["gpu-scenarios", "--profile", str(profile), *argv]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(said)
    assert not (tmp_path / "out").exists()
