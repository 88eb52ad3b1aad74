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
    assert all(len(value) == 5 and value[0] in {"pass", "fail", "hang", "error", "raise"} for value in cases.values())
    assert gate.main(["compare", str(first), str(second)]) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == f"compared={len(cases)} identical={len(cases)} equivalent=0 differing=0 missing=0"
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
    assert err == f"engine_gate: {bad}: key 'schema': expected 'simnccl-engine-gate/2' with a 'cases' table"
    assert gate.main(["record", str(tmp_path / "x.json"), "--only", "nope"]) == 2
    assert "--only: unknown source 'nope'" in capsys.readouterr().err


def test_semantic_compare_accepts_a_regrouped_trace_and_nothing_else(recorded, tmp_path, capsys) -> None:
    """A trace hash and event count that differ with an equal semantic digest (calls regrouped into blocks) are
    equivalent under --semantic only; a differing semantic digest fails either way."""
    first, _ = recorded
    data = json.loads(first.read_text())
    keys = sorted(data["cases"])
    data["cases"][keys[0]][1] += 3
    data["cases"][keys[0]][2] = "0" * 32
    data["cases"][keys[1]][2] = "1" * 32
    data["cases"][keys[1]][4] = "2" * 16
    changed = tmp_path / "regrouped.json"
    changed.write_text(json.dumps(data))
    assert gate.main(["compare", str(first), str(changed)]) == 1
    assert capsys.readouterr().out.splitlines()[-1].endswith("equivalent=0 differing=2 missing=0")
    assert gate.main(["compare", "--semantic", str(first), str(changed)]) == 1
    out = capsys.readouterr().out
    assert f"differs (trace_hash, semantic_digest): {keys[1]}" in out
    assert out.splitlines()[-1].endswith("equivalent=1 differing=1 missing=0")
    data["cases"][keys[1]] = json.loads(first.read_text())["cases"][keys[1]]
    changed.write_text(json.dumps(data))
    assert gate.main(["compare", "--semantic", str(first), str(changed)]) == 0


class _Outcome:
    verdict, hangs, errors, fr_dumps, slowdowns, checkpoints = "pass", [], [], {}, [], {}
    ops_executed, end_time_s = 8, 2.0


def test_the_semantic_digest_ignores_block_layout_and_order_but_not_what_a_rank_did() -> None:
    events = [(0.0, 0, "new_group", "g", 1), (0.0, 1, "new_group", "g", 1), (1.0, "meet", "split", ("k",), 2)]
    layout = [(1.0, "cohort", 3, "new_group", 2), (1.0, "meet", "cohort", ("cohort", 3), 1)]
    digest = gate._semantic_digest(_Outcome(), [{"a": 1}, {"b": 2}], events)
    assert gate._semantic_digest(_Outcome(), [{"b": 2}, {"a": 1}], layout + events[::-1]) == digest
    moved = [(0.5, 0, "new_group", "g", 1), *events[1:]]
    assert gate._semantic_digest(_Outcome(), [{"a": 1}, {"b": 2}], moved) != digest
    assert gate._semantic_digest(_Outcome(), [{"a": 1}, {"b": 2}], events[1:]) != digest

    # a time summed in another order differs in its last bit only: the same; a microsecond is not
    def at(t: float) -> str:
        return gate._semantic_digest(_Outcome(), [], [(t, *events[0][1:]), *events[1:]])

    assert 0.1 + 0.2 != 0.3 and at(0.1 + 0.2) == at(0.3)
    assert at(0.300001) != at(0.3)


def test_the_semantic_digest_names_communicators_by_what_they_are() -> None:
    """Communicator ids are numbered in the order communicators come to exist, which a block and ranks on their
    own may number differently: a meeting key's id is named by its communicator's group, so a renumbering is
    the same run, and a collective on another communicator is not."""
    events = [(1.0, "meet", "collective", ("coll", 4, 1), 2), (2.0, "meet", "p2p", ("p2p", 6, 0, 1, 1), 2)]
    renumbered = [(1.0, "meet", "collective", ("coll", 5, 1), 2), (2.0, "meet", "p2p", ("p2p", 7, 0, 1, 1), 2)]
    digest = gate._semantic_digest(_Outcome(), [], events, {4: "3:nccl2", 6: "5:nccl2"})
    assert gate._semantic_digest(_Outcome(), [], renumbered, {5: "3:nccl2", 7: "5:nccl2"}) == digest
    assert gate._semantic_digest(_Outcome(), [], renumbered, {5: "5:nccl2", 7: "3:nccl2"}) != digest
    assert gate._semantic_digest(_Outcome(), [], renumbered) != gate._semantic_digest(_Outcome(), [], events)


def test_the_gate_draws_without_the_literals_of_the_modules_loaded() -> None:
    # hypothesis draws now and then from the literals of "local" modules loaded (an editable simnccl checkout is
    # one), read once per process: loading simnccl.workloads before the draw, or adding strings to simnccl,
    # changed the cases the gate drew under one seed. While the gate draws, that pool is empty and no pool filled
    # earlier is used; afterwards both are as they were.
    from hypothesis.internal.conjecture import providers

    real, cache = providers._get_local_constants, providers.CONSTANTS_CACHE
    with gate._without_local_constants():
        pool = providers._get_local_constants()
        assert not (pool.integers or pool.floats or pool.strings or pool.bytes)
        assert providers.CONSTANTS_CACHE is not cache and len(providers.CONSTANTS_CACHE) == 0
    assert providers._get_local_constants is real and providers.CONSTANTS_CACHE is cache
