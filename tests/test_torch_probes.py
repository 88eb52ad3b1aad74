"""Probe the installed torch (2.15, CPU) and compare what it does with ``simnccl.release``.

Every probe runs real torch in a fresh interpreter (``TORCH_DIST_USE_NCCL2`` is read once per process), with
``CUDA_VISIBLE_DEVICES=""``, a FileStore and a timeout. The probe processes (``tests/probes/c10d_facts.py``)
are all started at once when the module's first test asks for facts, each prints its facts as JSON, and the
tests below are parametrized assertions over those facts:

1. which creator torch registers for ``nccl`` under each ``TORCH_DIST_USE_NCCL2`` value, and for ``nccl2``,
   ``nccl-legacy``, ``nccl-lazy``  vs  ``Release.nccl_impl`` / ``impl_for_name``;
2. the no-CUDA error of each NCCL-family backend string  vs  ``NCCL2_NO_CUDA`` / ``LEGACY_NO_CUDA``;
3. ``_get_default_timeout``  vs  ``Release.default_timeout_s``;
4. ``BackendConfig(name).device_backend_map``  vs  ``resolve_backend(...).pairs``;
5. group naming in a 2-rank gloo world (``"0"``, ``"1"``, …, hashed names under
   ``use_local_synchronization=True`` and ``split_group``, ``NON_GROUP_MEMBER``)  vs  the rules written down
   in ``_torch_group_name`` below and, once it exists, ``simnccl.c10d.group_name_for``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

pytest.importorskip("torch")

if importlib.util.find_spec("simnccl") is None:  # not installed: run from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simnccl.release import (
    DEVICE_CAPABILITY,
    KNOWN_BACKEND_NAMES,
    LEGACY_NO_CUDA,
    NCCL2_NO_CUDA,
    Impl,
    get_release,
    resolve_backend,
)

pytestmark = pytest.mark.torch

RELEASE = get_release("2.15")
PROBE_SCRIPT = Path(__file__).parent / "probes" / "c10d_facts.py"
PROBE_TIMEOUT_S = 120.0
WORLD = 2  # ranks in the group-naming probe

# TORCH_DIST_USE_NCCL2 values probed; None means unset.
ENV_CASES: dict[str, str | None] = {
    "unset": None,
    "0": "0",
    "1": "1",
    "false": "false",
    "empty": "",
    "space0": " 0",
}
# torch's creator functions (distributed_c10d.py) and the implementation each builds.
CREATOR_IMPL = {
    "_create_nccl2_process_group": Impl.NCCL2,
    "_create_nccl_process_group": Impl.LEGACY,
    "_create_nccl_lazy_process_group": Impl.NCCL_LAZY,
}
NO_CUDA_ERROR = {
    Impl.NCCL2: ("RuntimeError", NCCL2_NO_CUDA),
    Impl.NCCL_LAZY: ("RuntimeError", NCCL2_NO_CUDA),
    Impl.LEGACY: ("ValueError", LEGACY_NO_CUDA),
}
# Backend strings whose init_process_group is attempted in the env-unset process, in this order (None: no
# backend argument, i.e. "undefined"). Every NCCL-family one fails in its creator, after the group name was
# drawn, so each advances the group counter.
INIT_BACKENDS: tuple[str | None, ...] = (
    "nccl2",
    "nccl-lazy",
    "cpu:gloo,cuda:nccl",
    "nccl-legacy",
    "gloo",
    None,
)
CONFIG_NAMES = ("gloo", "nccl", "cpu:gloo,cuda:nccl", "fake", "undefined")
MODELLED_DEVICES = ("cpu", "cuda")

# Variables that would change what torch does; the probes run without them.
_SCRUB_PREFIXES = ("TORCH_DIST", "TORCH_NCCL", "TORCH_FR_", "NCCL_", "MASTER_")
_SCRUB_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def _env_map(value: str | None) -> dict[str, str]:
    return {} if value is None else {"TORCH_DIST_USE_NCCL2": value}


def _probe_env(nccl2: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB_PREFIXES) and k not in _SCRUB_NAMES}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(_env_map(nccl2))
    return env


class _Probes:
    """The probe processes of this module, started together and read on demand."""

    def __init__(self, workdir: Path) -> None:
        self.deadline = time.monotonic() + PROBE_TIMEOUT_S
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.results: dict[str, dict] = {}
        spec = {
            "init": list(INIT_BACKENDS),
            "timeouts": list(KNOWN_BACKEND_NAMES),
            "configs": list(CONFIG_NAMES),
        }
        for case, value in ENV_CASES.items():
            store_dir = workdir / f"env-{case}"
            store_dir.mkdir()
            args = ["full", str(store_dir), json.dumps(spec)] if value is None else ["resolve", str(store_dir)]
            self._start(f"env-{case}", args, _probe_env(value), workdir)
        store_file = workdir / "groups-store"
        for rank in range(WORLD):
            self._start(f"rank{rank}", ["groups", str(store_file), str(rank), str(WORLD)], _probe_env(None), workdir)

    def _start(self, key: str, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.procs[key] = subprocess.Popen(
            [sys.executable, str(PROBE_SCRIPT), *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def get(self, key: str) -> dict:
        if key not in self.results:
            proc = self.procs[key]
            try:
                out, err = proc.communicate(timeout=max(1.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                pytest.fail(f"probe {key} timed out after {PROBE_TIMEOUT_S:.0f} s\n{err[-3000:]}")
            lines = [line for line in out.splitlines() if line.startswith("PROBE_JSON: ")]
            if proc.returncode != 0 or not lines:
                pytest.fail(f"probe {key} failed (rc={proc.returncode})\n{err[-3000:]}")
            self.results[key] = json.loads(lines[-1].removeprefix("PROBE_JSON: "))
        return self.results[key]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory):
    p = _Probes(tmp_path_factory.mktemp("torch-probes"))
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def full(probes: _Probes) -> dict:
    """Facts from the process with TORCH_DIST_USE_NCCL2 unset (probes 1-4)."""
    return probes.get("env-unset")


@pytest.fixture(scope="module")
def ranks(probes: _Probes) -> list[dict]:
    """Facts from the 2-rank gloo world (probe 5), indexed by rank."""
    return [probes.get(f"rank{r}") for r in range(WORLD)]


# ---------------------------------------------------------------------------------------------------------
# 1. name resolution


@pytest.mark.parametrize("case", ENV_CASES)
def test_nccl_name_resolution(probes: _Probes, case: str) -> None:
    env = _env_map(ENV_CASES[case])
    facts = probes.get(f"env-{case}")
    assert facts["env"] == ENV_CASES[case]
    torch_impl = CREATOR_IMPL[facts["creators"]["nccl"]]
    assert torch_impl is RELEASE.nccl_impl(env)
    # Read once: flipping the variable after the first use of "nccl" changes nothing.
    assert facts["nccl_creator_after_env_flip"] == facts["creators"]["nccl"]
    # torch records the choice for the flight recorder: only legacy records itself.
    assert facts["nccl_self_recording"] == (torch_impl is Impl.LEGACY)


@pytest.mark.parametrize("name", ["nccl2", "nccl-legacy", "nccl-lazy"])
@pytest.mark.parametrize("case", ENV_CASES)
def test_explicit_name_resolution(probes: _Probes, case: str, name: str) -> None:
    env = _env_map(ENV_CASES[case])
    torch_impl = CREATOR_IMPL[probes.get(f"env-{case}")["creators"][name]]
    assert torch_impl is RELEASE.impl_for_name(name, env)


# ---------------------------------------------------------------------------------------------------------
# 2. errors on a host without CUDA

_ERROR_CASES = [pytest.param("env-unset", b, id=f"{b}") for b in INIT_BACKENDS if b and b != "gloo"] + [
    pytest.param(f"env-{case}", "nccl", id=f"nccl-env-{case}") for case in ENV_CASES
]


@pytest.mark.parametrize(("process", "backend"), _ERROR_CASES)
def test_no_cuda_error(probes: _Probes, process: str, backend: str) -> None:
    facts = probes.get(process)
    accelerator = resolve_backend(RELEASE, backend, _env_map(facts["env"])).accelerator
    assert accelerator is not None
    expected_type, expected_message = NO_CUDA_ERROR[accelerator.impl]
    got = facts["init_errors"][backend]
    assert not got["ok"]
    assert (got["type"], got["message"]) == (expected_type, expected_message)


def test_gloo_works_without_cuda(full: dict) -> None:
    assert full["cuda"]["device_count"] == 0
    got = full["init_errors"]["gloo"]
    assert got["ok"], got
    assert got["backend"] == "gloo"
    assert got["bound_device_id"] is None
    # gloo registers a cuda device type even on a CUDA-less host.
    modelled = [pair.device_type for pair in resolve_backend(RELEASE, "gloo", {}).pairs]
    assert sorted(got["device_types"]) == sorted(modelled) == ["cpu", "cuda"]


def test_failed_inits_advance_the_group_counter(full: dict) -> None:
    """A failed init_process_group never resets the name counter, so the next world is not named "0"."""
    failed = ["nccl", *INIT_BACKENDS[: INIT_BACKENDS.index("gloo")]]  # "nccl" is tried first, by probe 1
    assert all(not full["init_errors"][str(b)]["ok"] for b in failed)
    assert full["init_errors"]["gloo"]["group_name"] == str(len(failed))


def test_init_without_backend_on_cpu_host(full: dict) -> None:
    """No backend and no device_id is "undefined": the *available* accelerator's backend, here cpu:gloo."""
    got = full["init_errors"]["None"]
    assert got["ok"], got
    assert got["backend"] == "undefined"
    assert got["backend_config"] == "cpu:gloo"
    assert full["cuda"]["available_accelerator"] == "None"
    assert full["cuda"]["compile_accelerator"] == "cuda"


# ---------------------------------------------------------------------------------------------------------
# 3. default timeouts


@pytest.mark.parametrize("name", KNOWN_BACKEND_NAMES)
def test_default_timeout(full: dict, name: str) -> None:
    assert full["timeouts"][name] == RELEASE.default_timeout_s(name)


# ---------------------------------------------------------------------------------------------------------
# 4. BackendConfig


def _torch_pairs(device_map: Mapping[str, str]) -> list[tuple[str, str]]:
    return sorted((dev, name) for dev, name in device_map.items() if dev in MODELLED_DEVICES)


def _model_pairs(requested: str | None) -> list[tuple[str, str]]:
    return sorted((p.device_type, p.name) for p in resolve_backend(RELEASE, requested, {}).pairs)


@pytest.mark.parametrize("name", [n for n in CONFIG_NAMES if n != "undefined"])
def test_backend_config(full: dict, name: str) -> None:
    device_map = full["backend_config"][name]
    assert "type" not in device_map, device_map
    assert _torch_pairs(device_map) == _model_pairs(name)
    if ":" not in name:
        assert sorted(device_map) == sorted(DEVICE_CAPABILITY[name])


def test_backend_config_undefined(full: dict) -> None:
    # As BackendConfig sees it on a CUDA host (the host simnccl models): the accelerator's backend only.
    assert _torch_pairs(full["backend_config_undefined_cuda_host"]) == _model_pairs(None)
    # On this CUDA-less host the available "accelerator" is the cpu (not modelled).
    assert full["backend_config"]["undefined"] == {"cpu": "gloo"}


def test_device_id_validation(full: dict) -> None:
    """init_process_group(device_id=...) on a CUDA build with no device (reference §B.7)."""
    got = full["device_id_errors"]
    out_of_range = (
        "device_id cuda:{} is out of range. Please use a device index less than the number of "
        "accelerators available: 0."
    )
    assert (got["int"]["type"], got["int"]["message"]) == ("ValueError", out_of_range.format(0))
    assert (got["cuda:3"]["type"], got["cuda:3"]["message"]) == ("ValueError", out_of_range.format(3))
    assert (got["cuda"]["type"], got["cuda"]["message"]) == (
        "ValueError",
        "Please use a device_id with index.",
    )
    assert got["cpu:0"]["ok"] and got["cpu:0"]["bound_device_id"] == "cpu:0"


# ---------------------------------------------------------------------------------------------------------
# 5. group naming and non-members (2-rank gloo world)


def _torch_group_name(counter: int, ranks: list[int], use_local_synchronization: bool) -> str:
    """torch 2.15 ``_process_group_name`` (distributed_c10d.py l.6728-6771), given the counter it reads."""
    if not use_local_synchronization:
        return str(counter)
    return hashlib.sha1(f"{'_'.join(map(str, ranks))}_{counter}".encode()).hexdigest()


def _named_ranks(step: dict) -> list[int]:
    """The rank list torch names the group after: all ranks for None, sorted for new_group."""
    ranks = list(range(WORLD)) if step["ranks"] is None else step["ranks"]
    return sorted(ranks) if step["api"] == "new_group" else ranks


def _member_steps(ranks: list[dict]) -> list[tuple[int, dict]]:
    return [(r, s) for r, facts in enumerate(ranks) for s in facts["steps"] if s["member"]]


def test_world_group_name(ranks: list[dict]) -> None:
    for facts in ranks:
        assert facts["world_name"] == "0"
        assert facts["steps"][0]["count_before"] == 1  # the world drew "0"


def test_member_group_names(ranks: list[dict]) -> None:
    members = _member_steps(ranks)
    assert members
    for rank, step in members:
        expected = _torch_group_name(step["count_before"], _named_ranks(step), step["use_local_synchronization"])
        assert step["result"] == step["name_via_helper"] == expected, (rank, step)
        assert step["count_after"] == step["count_before"] + 1, (rank, step)


def test_non_members(ranks: list[dict]) -> None:
    for facts in ranks:
        for step in facts["steps"]:
            if step["member"]:
                continue
            assert step["result"] == facts["non_group_member"] == -100
            # Non-members draw a name (advancing the counter), except in new_group(use_local_sync...=True)
            # which returns before the name is drawn; split_group non-members always draw one.
            early_return = step["api"] == "new_group" and step["use_local_synchronization"]
            assert step["count_after"] == step["count_before"] + (0 if early_return else 1), step


def test_local_synchronization_desynchronises_the_counter(ranks: list[dict]) -> None:
    """After a local-sync group that excludes some ranks, ranks disagree on the next name."""
    after = {r: {s["key"]: s for s in facts["steps"]}["local1"]["count_after"] for r, facts in enumerate(ranks)}
    assert after == {0: 5, 1: 6}


def test_non_member_queries_and_collectives(ranks: list[dict]) -> None:
    for rank, facts in enumerate(ranks):
        got = facts["nonmember"]
        assert (got["get_rank"], got["get_world_size"]) == (-1, -1)
        assert got["all_reduce_returns"] == "None"
        assert got["warnings"] == [
            f"Running all_reduce on global rank {rank} which does not belong to the given group."
        ]


_BAD_RANKS = {
    "empty": ("AssertionError", "Group rank must be specified for group members", 1),
    "dup": ("ValueError", "ranks list must not contain duplicate entries, got [0, 0]", 0),
    "out_of_range": (
        "ValueError",
        f"Rank {WORLD} is out of range. Valid ranks are 0 to {WORLD - 1} (world_size={WORLD})",
        0,
    ),
    "negative": (
        "ValueError",
        f"Rank -1 is out of range. Valid ranks are 0 to {WORLD - 1} (world_size={WORLD})",
        0,
    ),
    "too_many": (
        "ValueError",
        "the new group's world size should be less or equal to the world size set by init_process_group",
        0,
    ),
    "str": ("TypeError", "ranks must be a sequence of integers", 0),
}


@pytest.mark.parametrize("label", _BAD_RANKS)
def test_new_group_bad_ranks(ranks: list[dict], label: str) -> None:
    expected = _BAD_RANKS[label]
    for facts in ranks:
        got = facts["bad_ranks"][label]
        assert (got["ok"], got["type"], got["message"], got["count_delta"]) == (False, *expected)


def test_destroy_resets_counter_only_for_world(ranks: list[dict]) -> None:
    for facts in ranks:
        assert facts["destroy"] == {"subgroup_count_delta": 0, "count_after_world": 0}


def test_group_names_match_model(ranks: list[dict]) -> None:
    from simnccl.c10d import group_name_for

    for rank, step in _member_steps(ranks):
        got = group_name_for(step["count_before"], _named_ranks(step), step["use_local_synchronization"])
        assert got == step["result"], (rank, step)
