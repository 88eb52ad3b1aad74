"""``--plot FILE.png|.svg`` (memory per device over time) and ``explain --plot`` (the wait-for graph): the files
decode as images (PNG signature, IHDR, pixels via matplotlib) or parse as SVG, and each panel carries what it
promises (a line per device or the envelope of many, checkpoints, group creations, cycles); without matplotlib
the option is refused with one line naming the extra to install."""

from __future__ import annotations

import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from conftest import SCENARIOS_DIR

import simnccl.prerequisites
from simnccl.cli import main
from simnccl.outputs.plot import DPI, MAX_DEVICE_LINES, PANEL_SIZE_IN, TOP_DEVICES, _panel
from simnccl.runner import run_scenario
from simnccl.scenario import load_scenario

matplotlib = pytest.importorskip("matplotlib")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG = "{http://www.w3.org/2000/svg}"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk, which must come first."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


def decoded(path: Path) -> Any:
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[2] in (3, 4)
    assert pixels[..., :3].std() > 0.05  # something is drawn, not a blank canvas
    return pixels


def svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return ["".join(t.itertext()).strip() for t in root.iter(f"{SVG}text")]


def legend(scenario: str, variant: str) -> list[str]:
    from matplotlib.figure import Figure

    result = run_scenario(load_scenario(SCENARIOS_DIR / f"{scenario}.toml"), [variant])
    ax = Figure().subplots()
    _panel(ax, result.scenario, result.variants[0])
    return [text.get_text() for text in ax.get_legend().get_texts()]


def test_run_plot_png_decodes_with_one_panel_per_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "memory.png"
    code = main(["run", str(SCENARIOS_DIR / "pytorch-199957.toml"), "--plot", str(target)])
    assert code == 0
    assert f"memory plot: {target}" in capsys.readouterr().err
    width, height = png_size(target)
    assert (width, height) == (round(PANEL_SIZE_IN[0] * DPI), round(PANEL_SIZE_IN[1] * 3 * DPI))  # 3 variants, 1 column
    assert decoded(target).shape[:2] == (height, width)


def test_run_plot_svg_parses_and_names_each_variant_and_device(tmp_path: Path) -> None:
    target = tmp_path / "memory.svg"
    assert main(["run", str(SCENARIOS_DIR / "creation-order-hang.toml"), "--plot", str(target)]) == 0
    texts = svg_texts(target)
    for name in ("torch-2.15-default", "legacy", "torch-2.14"):
        assert any(f"creation-order-hang · {name} — hang" in t for t in texts)
    for device in range(4):
        assert f"n0:cuda:{device}" in texts
    assert "groups_created" in texts  # a checkpoint, named on its line


def test_a_panel_draws_each_device_the_checkpoints_and_the_group_creations() -> None:
    labels = legend("pytorch-199957", "nccl2-default")
    result = run_scenario(load_scenario(SCENARIOS_DIR / "pytorch-199957.toml"), ["nccl2-default"])
    devices = [ledger.device for ledger in result.variants[0].outcome.ledgers.values() if ledger.timeline]
    assert labels[: len(devices)] == devices
    assert "checkpoint" in labels
    assert f"group created ({len(result.variants[0].outcome.groups)})" in labels


def test_many_devices_are_drawn_as_an_envelope_and_the_top_peaks() -> None:
    labels = legend("megatron-tp8-pp2-dp2-4nodes", "torch-2.15-default")
    assert MAX_DEVICE_LINES < 32
    assert "all 32 devices (min-max)" in labels and "median" in labels
    assert sum(label.endswith("(top peak)") for label in labels) == TOP_DEVICES


def test_a_failed_rank_is_marked() -> None:
    assert "rank failed (1)" in legend("vllm-startup-check", "torch-2.15-default")


def test_explain_plot_draws_the_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svg, png = tmp_path / "waits.svg", tmp_path / "waits.png"
    path = str(SCENARIOS_DIR / "creation-order-hang.toml")
    assert main(["explain", path, "--plot", str(svg)]) == 0
    assert main(["explain", path, "--variant", "torch-2.15-default", "--plot", str(png)]) == 0
    assert f"wait-for graph: {png}" in capsys.readouterr().err
    texts = svg_texts(svg)
    assert "circular wait: 0, 2" in texts
    assert "circular wait: 0, 2; circular wait: 1, 3" in texts  # legacy: two store-key cycles
    assert "split-color #1\non '0'" in texts or any("split-color #1" in t for t in texts)
    decoded(png)


def test_explain_plot_of_a_straggler_and_of_a_passing_run(tmp_path: Path) -> None:
    target = tmp_path / "waits.svg"
    assert (
        main(["explain", str(SCENARIOS_DIR / "hang-missing-rank.toml"), "pytorch-199957.toml", "--plot", str(target)])
        == 2
    )
    assert (
        main(
            [
                "explain",
                str(SCENARIOS_DIR / "hang-missing-rank.toml"),
                str(SCENARIOS_DIR / "pytorch-199957.toml"),
                "--plot",
                str(target),
            ]
        )
        == 0
    )
    texts = svg_texts(target)
    assert "straggler: rank 1" in texts
    assert texts.count("no rank waits for another") == 3  # pytorch-199957's three passing variants


@pytest.mark.parametrize("command", ["run", "explain"])
def test_plot_without_matplotlib_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    real = simnccl.prerequisites.importlib.util.find_spec
    monkeypatch.setattr(
        simnccl.prerequisites.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    code = main([command, "--plot", str(tmp_path / "m.png")])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.strip().splitlines() == [
        f"error: simnccl {command} --plot needs matplotlib, which is not installed: pip install 'simnccl[plots]'"
    ]
    assert out == "" and not (tmp_path / "m.png").exists()


def test_a_plot_name_without_png_or_svg_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--plot", str(tmp_path / "m.jpg")])
    assert code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: --plot {tmp_path / 'm.jpg'}: expected a file name ending in .png or .svg" in err


def test_matplotlib_is_imported_only_when_a_plot_is_asked_for(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from simnccl.cli import main\n"
        f"assert main(['run', '--trace', {str(tmp_path / 't.json')!r}]) == 0\n"
        "assert 'matplotlib' not in sys.modules\n"
        f"assert main(['run', '--plot', {str(tmp_path / 'p.png')!r}]) == 0\n"
        "assert 'matplotlib' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
