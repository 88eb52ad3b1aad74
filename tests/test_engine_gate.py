"""The engine behaviour gate (benchmarks/engine_gate.py): recording is deterministic, a difference or a missing
case is found and named, bad input exits 2 with one line."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "engine_gate.py"


def _load_gate():
    spec = importlib.util.spec_from_file_location("simnccl_engine_gate", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gate = _load_gate()
SMALL = ["--generated", "4", "--generated-big", "1", "--mutants", "2", "--only", "gen,mutant"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("gate")
    first, second = folder / "a.json", folder / "b.json"
    assert gate.main(["record", str(first), *SMALL]) == 0
    assert gate.main(["record", str(second), *SMALL]) == 0
    return first, second


def test_two_records_of_one_engine_are_identical_and_cover_both_paths(recorded, capsys) -> None:
    first, second = recorded
    cases = json.loads(first.read_text())["cases"]
    # 5 generated cases, each with and without faults, plus 2 mutants: every one on both paths
    assert len(cases) == (5 * 2 + 2) * 2
    assert {key.rsplit("/", 1)[1] for key in cases} == {"fast", "slow"}
    assert all(len(value) == 4 and value[0] in {"pass", "fail", "hang", "error", "raise"} for value in cases.values())
    assert gate.main(["compare", str(first), str(second)]) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == f"compared={len(cases)} identical={len(cases)} differing=0 missing=0"
    )


def test_a_changed_trace_hash_and_a_missing_case_are_named(recorded, tmp_path, capsys) -> None:
    first, _ = recorded
    data = json.loads(first.read_text())
    keys = sorted(data["cases"])
    data["cases"][keys[0]][2] = "0" * 32
    del data["cases"][keys[1]]
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(data))
    assert gate.main(["compare", str(first), str(changed)]) == 1
    out = capsys.readouterr().out
    assert f"differs (trace_hash): {keys[0]}" in out
    assert f"missing in after: {keys[1]}" in out
    assert out.splitlines()[-1].endswith("differing=1 missing=1")


def test_bad_input_exits_2_with_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "other"}')
    assert gate.main(["compare", str(bad), str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"engine_gate: {bad}: key 'schema': expected 'simnccl-engine-gate/1' with a 'cases' table"
    assert gate.main(["record", str(tmp_path / "x.json"), "--only", "nope"]) == 2
    assert "--only: unknown source 'nope'" in capsys.readouterr().err
