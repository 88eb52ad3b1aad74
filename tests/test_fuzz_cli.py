"""Fuzz: mutated shipped scenarios through ``simnccl run`` exit 0, 1 or 2 — never a crash, a stall or a blow-up.

Why: scenario files are untrusted input (DESIGN rule 9) and the exit code is a contract CI reads (rule 11).
Each case takes a shipped scenario, applies one hypothesis-drawn mutation — of its structure (a key dropped,
a table replaced, values nested thousands deep), of a value's type, of a number (negative, zero, huge,
``inf``, ``nan``), of a text (rich markup, templates, control characters, near-miss names) or of the file's
bytes (truncated, spliced, not UTF-8) — and runs the command in-process. A case passes when the command exits
0, 1 or 2, and an exit 2 prints one message naming the file (and, for a key's value, the key).

The input limits are lowered for the run (``SIMNCCL_LIMIT_*``, the same override a user has) so that a
mutation that stays valid but grows a size (``repeat = 100000``) is still cheap to simulate or is refused
by a limit, which exercises those checks too. The wall-clock limit is set to a few seconds: a stall ends as
exit 2 naming ``max_wall_s``, which this test counts as a failure (a case must take seconds at most).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import sys
import tomllib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simnccl.cli import main

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
SHIPPED = sorted(SCENARIOS.glob("*.toml"))
BASES = {p.name: tomllib.loads(p.read_text(encoding="utf-8")) for p in SHIPPED}
TEXTS = {p.name: p.read_text(encoding="utf-8") for p in SHIPPED}

# Limits for the fuzz run: small enough that any mutant that still parses simulates in well under a second.
FUZZ_LIMITS = {
    "SIMNCCL_LIMIT_MAX_WORLD_SIZE": "32",
    "SIMNCCL_LIMIT_MAX_PROGRAM_OPS": "400",
    "SIMNCCL_LIMIT_MAX_EXPANDED_OPS": "4000",
    "SIMNCCL_LIMIT_MAX_FAULTS": "8",
    "SIMNCCL_LIMIT_MAX_RECOVERIES": "4",
    "SIMNCCL_LIMIT_MAX_VARIANTS": "16",
    "SIMNCCL_LIMIT_MAX_WALL_S": "20",
}
# 5 families x 450 = 2,250 cases per run, derandomized (the same cases every run, so CI is reproducible): about
# 55 s of CPU, i.e. ~30 s on two cores. SIMNCCL_FUZZ_EXAMPLES=N runs N fresh random cases per family instead
# (a longer hunt, e.g. nightly).
EXAMPLES_PER_FAMILY = int(os.environ.get("SIMNCCL_FUZZ_EXAMPLES", "450"))
DERANDOMIZE = "SIMNCCL_FUZZ_EXAMPLES" not in os.environ
FAMILIES = ("structure", "types", "numbers", "text", "bytes")

# ---------------------------------------------------------------------------------------------- TOML out


def dump_toml(document: dict[str, Any]) -> str:
    """A document as TOML: one ``key = value`` line per top-level key, tables inline (any depth)."""
    return "".join(f"{_key(k)} = {_value(v)}\n" for k, v in document.items())


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's escapes are TOML basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)  # pragma: no cover


# ---------------------------------------------------------------------------------------------- mutations

Path_ = tuple[Any, ...]
NEST = "<nested here>"


def _paths(value: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    """Every key/index path in a parsed document, tables and arrays included."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


def _copy(value: Any) -> Any:
    return json.loads(json.dumps(value))  # TOML from tomllib has no dates in the shipped scenarios


def _replace(document: dict[str, Any], path: Path_, new: Any) -> dict[str, Any]:
    out = _copy(document)
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = new
    return out


def _delete(document: dict[str, Any], path: Path_) -> dict[str, Any]:
    out = _copy(document)
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    del parent[path[-1]]
    return out


def _get(document: Any, path: Path_) -> Any:
    for step in path:
        document = document[step]
    return document


ODD_NUMBERS = [0, -1, 1, 2, 3, 7, 64, 65, 10**9, 10**21, -(10**14), 2**63 - 1, -(2**63)]
ODD_FLOATS = [0.0, -0.0, -5.0, 0.5, 1.5, 90.0, 1e308, -1e308, 1e-300, math.inf, -math.inf, math.nan, -1e14]
ODD_TEXTS = [
    "",
    "[/x]",
    "[bold]h100",
    "[red]x[/red]",
    "{rank}",
    "{i}",
    "g{i}-{rank}",
    "x" * 5000,
    "\x00\x01\x1b[31m",
    "ünïcødé ✓",
    "../../etc/passwd",
    "/dev/zero",
    "/dev/stdin",
    "TORCH_DIST_USE_NCL2",
    "NCCL_MAX_NCHANNEL",
    "after_nwe_groups",
    "n0:cuda:99",
    "nccl",
    "gloo",
    "nccl2",
    "torch-default",
    "2.15",
    "h100-80gb",
    "pass",
    "hang",
    "all_reduce",
    "world",
    "0",
    "-1",
    "99999999999999999999",
    "1e400",
    "nan",
]
scalars = st.one_of(
    st.sampled_from(ODD_NUMBERS),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(ODD_FLOATS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.sampled_from(ODD_TEXTS),
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["op", "name", "x", "ranks", "[/x]"]), inner)
    ),
    max_leaves=8,
)


@st.composite
def structure_mutation(draw: st.DrawFn, document: dict[str, Any]) -> str:
    paths = list(_paths(document))
    path = draw(st.sampled_from(paths))
    action = draw(st.sampled_from(["delete", "scalar", "nest", "wrap", "unknown", "swap"]))
    if action == "delete":
        return dump_toml(_delete(document, path))
    if action == "scalar":
        return dump_toml(_replace(document, path, draw(values)))
    if action == "nest":  # written as text: deeper than this serializer (or json) could recurse
        depth = draw(st.sampled_from([2, 40, 200, 3000]))
        opener, closer = draw(st.sampled_from([("[", "]"), ("{a = ", "}")]))
        nested = opener * depth + _value(_get(document, path)) + closer * depth
        return dump_toml(_replace(document, path, NEST)).replace(json.dumps(NEST), nested)
    if action == "wrap":
        return dump_toml(_replace(document, path, [_get(document, path)]))
    if action == "unknown":
        target = _get(document, path[:-1]) if len(path) > 1 else document
        if isinstance(target, dict):
            key = draw(st.sampled_from(["[/x]", "extra", "labl", "tolerance_mib", "seed", "verdict"]))
            return dump_toml(_replace(document, (*path[:-1], key), draw(values)))
        return dump_toml(document)
    other = draw(st.sampled_from(paths))  # swap: one subtree where another was
    return dump_toml(_replace(document, path, _get(document, other)))


def _leaves(document: dict[str, Any]) -> list[Path_]:
    return [p for p in _paths(document) if not isinstance(_get(document, p), (dict, list))]


@st.composite
def type_mutation(draw: st.DrawFn, document: dict[str, Any]) -> str:
    path = draw(st.sampled_from(_leaves(document)))
    old = _get(document, path)
    new = draw(values.filter(lambda v: type(v) is not type(old)))
    return dump_toml(_replace(document, path, new))


@st.composite
def number_mutation(draw: st.DrawFn, document: dict[str, Any]) -> str:
    numeric = [p for p in _leaves(document) if type(_get(document, p)) in (int, float)]
    if not numeric:
        return dump_toml(document)
    path = draw(st.sampled_from(numeric))
    new = draw(
        st.one_of(
            st.sampled_from(ODD_NUMBERS + ODD_FLOATS), st.integers(-(2**66), 2**66), st.floats(), st.just(10**400)
        )
    )
    return dump_toml(_replace(document, path, new))


@st.composite
def text_mutation(draw: st.DrawFn, document: dict[str, Any]) -> str:
    texts = [p for p in _paths(document) if isinstance(_get(document, p), str) or isinstance(p[-1], str)]
    path = draw(st.sampled_from(texts))
    new = draw(st.one_of(st.sampled_from(ODD_TEXTS), st.text(st.characters(exclude_categories=("Cs",)), max_size=30)))
    if isinstance(_get(document, path), str) and draw(st.booleans()):
        return dump_toml(_replace(document, path, new))
    # rename the key instead
    parent = _get(document, path[:-1]) if len(path) > 1 else document
    if not isinstance(parent, dict):
        return dump_toml(_replace(document, path, new))
    renamed = {(new if k == path[-1] else k): v for k, v in parent.items()}
    return dump_toml(renamed if len(path) == 1 else _replace(document, path[:-1], renamed))


@st.composite
def byte_mutation(draw: st.DrawFn, text: str) -> bytes:
    data = text.encode("utf-8")
    at = draw(st.integers(0, len(data)))
    action = draw(st.sampled_from(["truncate", "delete", "insert", "duplicate", "latin1"]))
    if action == "truncate":
        return data[:at]
    if action == "delete":
        return data[:at] + data[at + draw(st.integers(1, 40)) :]
    if action == "insert":
        return (
            data[:at]
            + draw(st.sampled_from([b"[", b"]", b"{", b'"', b"=", b"\n[[expect]]\n", b"\xff\xfe", b"\x00"]))
            + data[at:]
        )
    if action == "duplicate":
        lines = data.splitlines(keepends=True)
        index = draw(st.integers(0, max(len(lines) - 1, 0)))
        return b"".join(lines[: index + 1] + lines[index:])
    return text.replace("a", "\xe4", 1).encode("latin-1", errors="replace")


def _case(draw: st.DrawFn, family: str) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(BASES)))
    document = BASES[name]
    if family == "structure":
        return name, draw(structure_mutation(document)).encode("utf-8")
    if family == "types":
        return name, draw(type_mutation(document)).encode("utf-8")
    if family == "numbers":
        return name, draw(number_mutation(document)).encode("utf-8")
    if family == "text":
        return name, draw(text_mutation(document)).encode("utf-8")
    return name, draw(byte_mutation(TEXTS[name]))


# ---------------------------------------------------------------------------------------------- the test


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


@pytest.mark.property
@pytest.mark.parametrize("family", FAMILIES)
def test_mutated_scenarios_exit_0_1_or_2_with_a_message_naming_the_file(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for var, value in FUZZ_LIMITS.items():
        monkeypatch.setenv(var, value)
    codes: Counter[int] = Counter()

    @settings(
        max_examples=EXAMPLES_PER_FAMILY,
        derandomize=DERANDOMIZE,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def case(data: st.DataObject) -> None:
        base, content = _case(data.draw, family)
        file_name = data.draw(st.sampled_from(["s.toml", "[/x].toml", "[bold]s.toml"]))
        path = tmp_path / file_name
        path.parent.mkdir(exist_ok=True)  # "[/x].toml" is "x].toml" in a folder "[": markup in the path
        path.write_bytes(content)
        code, err = _run(["run", str(path)])
        codes[code] += 1
        assert code in (0, 1, 2), f"{base} mutant exited {code}:\n{err[-3000:]}"
        assert "Traceback" not in err, err[-3000:]
        if code == 2:
            assert str(path) in err, f"exit 2 without naming the file {path}: {err!r}"
            assert "max_wall_s" not in err, f"{base} mutant ran past the fuzz wall-clock limit: {err!r}"

    case()
    total = sum(codes.values())
    with capsys.disabled():
        shown = ", ".join(f"exit {c}: {n}" for c, n in sorted(codes.items()))
        print(f"\nfuzz [{family}]: {total} mutated shipped scenarios through simnccl run ({shown})", file=sys.stderr)
    assert total >= EXAMPLES_PER_FAMILY * 0.9
