"""``simnccl.torch_apply`` on real torch 2.15 (CPU): torch receives exactly what the policy planned.

Every check runs real torch in fresh interpreters (``tests/probes/torch_apply_worker.py``) with
``CUDA_VISIBLE_DEVICES=""``, a FileStore, a 20 s c10d timeout and a wall-clock limit; all worker processes are
started together when the module's first test asks for results, and every one is reaped at module teardown.

1. ``record`` (3 ranks): a recording Python backend (registered with ``Backend.register_backend(...,
   extended_api=True, devices=["cpu"])`` under ``nccl``/``nccl-lazy`` as stand-ins for NCCL, and under
   ``simrec``) on a world bound to ``cpu:0``, one startup per built-in policy. Per call: torch's creator got
   the decision's backend and ``backend_options``; members got ``split_from`` and called ``split()`` exactly
   when torch's rules say (same backend name, bound parent, no lazy_init); non-members made a NOCOLOR split
   exactly then; reused groups made no torch call at all; ``fake`` groups never touched the recorder.
2. ``gloo`` (2 ranks): ``apply("legacy")`` sets ``TORCH_DIST_USE_NCCL2=0`` before ``init_process_group`` runs
   and uninstall restores ``os.environ``; ``apply("dedupe")`` returns the very same group objects and
   collectives on them work.
3. ``solo`` (1 rank): ``import simnccl`` / ``simnccl.policy`` import no torch until ``apply``; install and
   uninstall restore the exact function objects; installing twice is refused; ``release_key``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.torch

WORKER = Path(__file__).parent / "probes" / "torch_apply_worker.py"
DEADLINE_S = 150.0  # for all workers together (they take ~15 s on 2 cores)
RECORD_WORLD = 3
GLOO_WORLD = 2
NCCL_OPTIONS_DEFAULT = {"nccl": True, "lazy_init": False, "is_high_priority_stream": False, "split_share": -2147483648}

_SCRUB_PREFIXES = ("TORCH_DIST", "TORCH_NCCL", "TORCH_FR_", "NCCL_", "MASTER_")
_SCRUB_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB_PREFIXES) and k not in _SCRUB_NAMES}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


class _Workers:
    """Every worker process of this module, started at once; results read on demand; all reaped on close."""

    def __init__(self, workdir: Path) -> None:
        self.deadline = time.monotonic() + DEADLINE_S
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.results: dict[str, dict[str, Any]] = {}
        for mode, world in (("record", RECORD_WORLD), ("gloo", GLOO_WORLD)):
            folder = workdir / mode
            folder.mkdir()
            for rank in range(world):
                # gloo rank 1 starts with TORCH_DIST_USE_NCCL2=1, to see uninstall put a previous value back.
                extra = {"TORCH_DIST_USE_NCCL2": "1"} if (mode, rank) == ("gloo", 1) else {}
                self._start(f"{mode}{rank}", [mode, str(folder), str(rank), str(world)], _env(**extra), workdir)
        (workdir / "solo").mkdir()
        self._start("solo", ["solo", str(workdir / "solo")], _env(), workdir)

    def _start(self, key: str, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.procs[key] = subprocess.Popen(
            [sys.executable, str(WORKER), *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def get(self, key: str) -> dict[str, Any]:
        if key not in self.results:
            proc = self.procs[key]
            try:
                out, err = proc.communicate(timeout=max(1.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.close()
                out, err = proc.communicate()
                pytest.fail(f"worker {key} timed out after {DEADLINE_S:.0f} s\n{err[-3000:]}")
            lines = [line for line in out.splitlines() if line.startswith("PROBE_JSON: ")]
            if proc.returncode != 0 or not lines:
                pytest.fail(f"worker {key} failed (rc={proc.returncode})\n{err[-4000:]}")
            self.results[key] = json.loads(lines[-1].removeprefix("PROBE_JSON: "))
        return self.results[key]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory):
    w = _Workers(tmp_path_factory.mktemp("torch-apply"))
    try:
        yield w
    finally:
        w.close()


@pytest.fixture(scope="module")
def record(workers: _Workers) -> list[dict[str, Any]]:
    """Per rank: {scenario label: {"spec", "backend", "calls": [...], "facts": {...}}}."""
    return [workers.get(f"record{r}")["scenarios"] for r in range(RECORD_WORLD)]


@pytest.fixture(scope="module")
def gloo(workers: _Workers) -> list[dict[str, Any]]:
    return [workers.get(f"gloo{r}") for r in range(GLOO_WORLD)]


@pytest.fixture(scope="module")
def solo(workers: _Workers) -> dict[str, Any]:
    return workers.get("solo")


SCENARIOS = ("torch-default", "lazy-init", "dedupe", "skip-single-rank", "budget", "nccl-lazy-p2p", "lazy-init-simrec")


def _call(record: list[dict[str, Any]], scenario: str, rank: int, label: str) -> dict[str, Any]:
    calls = [c for c in record[rank][scenario]["calls"] if c["label"] == label]
    assert len(calls) == 1, (scenario, rank, label)
    return calls[0]


def _labels(record: list[dict[str, Any]], scenario: str) -> list[str]:
    return [c["label"] for c in record[0][scenario]["calls"]]


def _decision(call: dict[str, Any]) -> dict[str, Any]:
    assert len(call["decisions"]) == 1, call
    return call["decisions"][0]


def _seen_options(options: dict[str, Any]) -> dict[str, Any] | None:
    """What the creator receives for a decision's PgOptions on an NCCL-family name (no options: None)."""
    if not options:
        return None
    return {**NCCL_OPTIONS_DEFAULT, **options}


# ---------------------------------------------------------------------------------------------------------
# 1. the recording backend


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_init_receives_the_plan(record: list[dict[str, Any]], scenario: str) -> None:
    for rank in range(RECORD_WORLD):
        call = _call(record, scenario, rank, "init")
        plan = _decision(call)
        backend = record[rank][scenario]["backend"]
        assert plan["kind"] == "init_process_group" and plan["backend"] == backend and plan["env"] == {}
        lazy = plan["options"].get("lazy_init", False)
        # lazy-init asks for lazy_init only where it means something: on an NCCL-family default group
        assert lazy == (scenario.startswith("lazy-init") and backend == "nccl")
        # NCCL-family: a ProcessGroupNCCL.Options with lazy_init; simrec has no such options, gets none.
        options = _seen_options(plan["options"]) if backend == "nccl" else None
        expected = [["create", backend, [0, 1, 2], False, options]]
        if not (lazy and backend == "nccl"):  # torch connects a bound group unless it can't split yet
            expected.append(["eager_connect", "0", "cpu:0"])
        assert call["events"] == expected


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_new_group_receives_the_decision(record: list[dict[str, Any]], scenario: str) -> None:
    """Each new_group call, on every rank, did in torch exactly what torch's rules make of the decision."""
    world_backend = record[0][scenario]["backend"]
    world_lazy = _decision(_call(record, scenario, 0, "init"))["options"].get("lazy_init", False)
    world_lazy = world_lazy and world_backend == "nccl"
    checked = 0
    for label in _labels(record, scenario):
        for rank in range(RECORD_WORLD):
            call = _call(record, scenario, rank, label)
            if not call["decisions"] or call["decisions"][0]["kind"] != "new_group":
                continue
            decision = _decision(call)
            ranks, member = decision["ranks"], rank in decision["ranks"]
            backend, options = decision["backend"], decision["options"]
            if decision["reuse"] is not None:
                assert not decision["torch_called"] and call["events"] == [], call
                continue
            assert decision["torch_called"]
            if backend == "fake":  # torch's FakeProcessGroup: nothing reaches the recorder, nobody splits
                assert call["events"] == []
                assert call["result"] == ({"backend": "fake", "size": 1, "rank": 0} if member else "NON_GROUP_MEMBER")
                continue
            seen = _seen_options(options) if backend in ("nccl", "nccl-lazy") else None
            # torch splits when the bound parent supports it, the name matches and the child is not lazy_init
            split = backend == world_backend and not world_lazy and not options.get("lazy_init", False)
            if member:
                expected = [["create", backend, list(ranks), split, seen]]
                if split:
                    expected.append(["split", "0", list(ranks), seen, True])
                if split or not options.get("lazy_init", False):  # a bound group that can split is connected
                    expected.append(["eager_connect", "0>split" if split else "<its name>", "cpu:0"])
                events = [e if e[0] != "eager_connect" or split else [e[0], "<its name>", e[2]] for e in call["events"]]
                assert events == expected, (scenario, label, rank)
                assert call["result"] == {"backend": backend, "size": len(ranks), "rank": ranks.index(rank)}
            else:
                assert call["events"] == ([["nocolor_split", "0", "cpu:0"]] if split else []), (scenario, label, rank)
                assert call["result"] == "NON_GROUP_MEMBER"
            checked += 1
    assert checked >= 2 * RECORD_WORLD


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_split_group_receives_the_decision(record: list[dict[str, Any]], scenario: str) -> None:
    for rank in range(RECORD_WORLD):
        call = _call(record, scenario, rank, "split")
        decision = _decision(call)
        own = [0, 1] if rank < 2 else [2]
        assert decision["kind"] == "split_group" and decision["ranks"] == own and decision["torch_called"]
        # torch hands the split the caller's pg_options, else the parent's own Backend.Options
        options = call["events"][0][3]
        assert options["lazy_init"] == decision["options"].get("lazy_init", False)
        assert options["nccl"] == bool(decision["options"])
        assert call["events"] == [["split", "0", own, options, True]]
        assert call["result"] == {
            "backend": record[rank][scenario]["backend"],
            "size": len(own),
            "rank": own.index(rank),
        }


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_members_agree(record: list[dict[str, Any]], scenario: str) -> None:
    """Built-in policies are rank-independent: every rank reached the same decision for each group."""
    for label in _labels(record, scenario):
        keys = set()
        for rank in range(RECORD_WORLD):
            for d in _call(record, scenario, rank, label)["decisions"]:
                if d["kind"] == "new_group":
                    keys.add(json.dumps([d["backend"], d["options"], d["use_local_synchronization"], d["reuse"]]))
        assert len(keys) <= 1, (scenario, label, keys)


def test_torch_default_changes_nothing(record: list[dict[str, Any]]) -> None:
    for rank in range(RECORD_WORLD):
        for call in record[rank]["torch-default"]["calls"]:
            for d in call["decisions"]:
                assert d["backend"] == "nccl" and d["options"] == {} and d["torch_called"]
                assert d.get("reuse") is None
    # g01 and its duplicate are two torch groups, each a split of the world
    assert _call(record, "torch-default", 0, "g01-again")["events"][1][0] == "split"
    assert _call(record, "torch-default", 2, "g01-again")["events"] == [["nocolor_split", "0", "cpu:0"]]


def test_lazy_init_never_splits(record: list[dict[str, Any]]) -> None:
    for rank in range(RECORD_WORLD):
        calls = record[rank]["lazy-init"]["calls"]
        new_groups = [c for c in calls if c["decisions"] and c["decisions"][0]["kind"] == "new_group"]
        assert new_groups and all(_decision(c)["options"] == {"lazy_init": True} for c in new_groups)
        kinds = {e[0] for c in new_groups for e in c["events"]}
        assert kinds <= {"create"}, kinds  # no split(), no NOCOLOR split, no eager connect
        assert all(e[3] is False for c in new_groups for e in c["events"])  # no split_from
        # A lazy_init world can't be split from before its first op (reference §B.5): torch says so.
        early = _call(record, "lazy-init", rank, "split-before-use")
        assert early["result"] == {
            "error": "No backend for the parent process group or its backend does not support splitting"
        }
        assert _call(record, "lazy-init", rank, "world-all-reduce")["events"] == [["lazy_init_on_first_use", "0"]]


def test_lazy_init_leaves_other_backends_alone(record: list[dict[str, Any]]) -> None:
    """``simrec`` is not NCCL-family: lazy-init leaves its default group alone (the plan says why), and
    subgroups split from it as usual."""
    for rank in range(RECORD_WORLD):
        init = _call(record, "lazy-init-simrec", rank, "init")
        assert _decision(init)["options"] == {}
        assert "not an NCCL backend" in _decision(init)["explanation"]
        assert init["events"][0] == ["create", "simrec", [0, 1, 2], False, None]
        g01 = _call(record, "lazy-init-simrec", rank, "g01")
        assert _decision(g01)["options"] == {}
        assert g01["events"][0] == (
            ["create", "simrec", [0, 1], True, None] if rank < 2 else ["nocolor_split", "0", "cpu:0"]
        )


def test_dedupe_reuses_without_torch(record: list[dict[str, Any]]) -> None:
    for rank in range(RECORD_WORLD):
        again = _call(record, "dedupe", rank, "g01-again")
        decision = _decision(again)
        assert decision["reuse"] == [0, 1] and not decision["torch_called"] and again["events"] == []
        assert record[rank]["dedupe"]["facts"]["g01_again_is_g01"]
        assert again["result"] == ({"backend": "nccl", "size": 2, "rank": rank} if rank < 2 else "NON_GROUP_MEMBER")
        # split_group [[0, 1], [2]]: [0, 1] exists already, [2] does not; the split is collective over the
        # world, so nobody can skip it: [0, 1] is created anew, and says why.
        split = _decision(_call(record, "dedupe", rank, "split"))
        assert split["reuse"] is None and split["torch_called"]
        if rank < 2:
            assert "created" in split["explanation"] and "reused" in split["explanation"]


def test_dedupe_first_in_a_composition_returns_the_group_a_later_part_made_lazy(record: list[dict[str, Any]]) -> None:
    """``dedupe+budget(0,200)``: g01 was made lazy by the budget, g01-again asks as g01 asked; dedupe decides on
    the call as asked and reuses it (it never did: it compared the lazied group with the call as asked). torch
    is not called, and the very same group object comes back, as the simulation binds it: the reuse (which the
    budget leaves as it is) matches g01 by ranks and backend, not the gloo group made first on those ranks."""
    for rank in range(RECORD_WORLD):
        first = _decision(_call(record, "dedupe+budget", rank, "g01"))
        assert first["options"].get("lazy_init") and first["torch_called"]
        again = _call(record, "dedupe+budget", rank, "g01-again")
        decision = _decision(again)
        assert decision["reuse"] == [0, 1] and not decision["torch_called"] and again["events"] == []
        assert not decision["options"].get("lazy_init")  # so only the fallback by backend finds g01
        assert record[rank]["dedupe+budget"]["facts"]["g01_again_is_g01"]


def test_skip_single_rank_makes_a_fake_group(record: list[dict[str, Any]]) -> None:
    for rank in range(RECORD_WORLD):
        g0 = _call(record, "skip-single-rank", rank, "g0")
        assert _decision(g0)["backend"] == "fake" and g0["events"] == []
        assert g0["result"] == ({"backend": "fake", "size": 1, "rank": 0} if rank == 0 else "NON_GROUP_MEMBER")
        assert record[rank]["skip-single-rank"]["facts"]["all_reduce"] == [1.0, 1.0]  # rank 0's ran on g0 too
        # multi-rank groups are untouched
        assert _decision(_call(record, "skip-single-rank", rank, "g12-pp"))["backend"] == "nccl"


def test_budget_turns_lazy_when_the_budget_is_spent(record: list[dict[str, Any]]) -> None:
    """budget(500,200): two eager groups per device fit; the third for any member is lazy_init."""
    expected = {"g01": False, "g01-again": False, "g0": True, "g12-pp": True}
    for rank in range(RECORD_WORLD):
        for label, lazy in expected.items():
            assert _decision(_call(record, "budget", rank, label))["options"].get("lazy_init", False) is lazy
        # split_group [[0, 1], [2]]: ranks 0 and 1 are at 2 eager groups, rank 2 at 0
        split = _decision(_call(record, "budget", rank, "split"))
        assert split["options"].get("lazy_init", False) is (rank < 2)


def test_nccl_lazy_p2p_uses_a_fresh_nccl_lazy_group(record: list[dict[str, Any]]) -> None:
    for rank in range(RECORD_WORLD):
        pp = _call(record, "nccl-lazy-p2p", rank, "g12-pp")
        assert _decision(pp)["backend"] == "nccl-lazy"
        if rank == 0:
            assert pp["events"] == []  # a different backend name: no NOCOLOR split of the world
        else:
            assert pp["events"][0] == ["create", "nccl-lazy", [1, 2], False, None]
        # purpose-less groups stay on nccl
        assert _decision(_call(record, "nccl-lazy-p2p", rank, "g01"))["backend"] == "nccl"


def test_wrappers_installed_during_each_scenario(record: list[dict[str, Any]]) -> None:
    assert all(record[r][s]["facts"]["installed_during"] for r in range(RECORD_WORLD) for s in SCENARIOS)


# ---------------------------------------------------------------------------------------------------------
# 2. gloo


def test_legacy_sets_the_env_before_init_and_restores_it(gloo: list[dict[str, Any]]) -> None:
    for rank, facts in enumerate(gloo):
        before = None if rank == 0 else "1"
        assert facts["env_before"] == before
        assert facts["env_seen_by_init"] == {"TORCH_DIST_USE_NCCL2": "0", "backend": "gloo"}
        assert facts["env_during"] == "0"
        assert facts["env_set"] == {"TORCH_DIST_USE_NCCL2": before}
        assert facts["nccl_creator"] == "_create_nccl_process_group"  # "nccl" resolved to legacy
        assert facts["env_after"] == ("<unset>" if before is None else before)
        assert facts["init_restored"]  # the very function object that was there before install
        assert facts["legacy_all_reduce"] == [3.0, 3.0]


def test_dedupe_on_gloo_returns_the_same_objects(gloo: list[dict[str, Any]]) -> None:
    for rank, facts in enumerate(gloo):
        assert facts["same_object"] and facts["split_same_object"]
        assert facts["split_size"] == 1
        # new_group([0]) is identical to rank 0's split [0]: that group comes back, no torch call
        assert facts["solo"] == ("split group" if rank == 0 else "NON_GROUP_MEMBER")
        # init, new_group, its duplicate, split_group, its duplicate, new_group([0])
        assert facts["torch_called"] == [True, True, False, True, False, False]
        assert facts["all_reduce"] == [3.0, 3.0, 3.0]
        assert facts["all_gather"] == [0.0, 1.0]
        assert facts["split_all_reduce"] == 10.0 + rank


def test_dedupe_on_gloo_destroys_a_shared_group_with_its_last_handle_and_never_reuses_it(
    gloo: list[dict[str, Any]],
) -> None:
    """``dedupe`` returned one group to two equal calls, and ``destroy_process_group`` of one handle destroyed it
    under the other; the history recorded no destroy, so an equal later call reused the dead group (ApplyError)
    where torch's default makes a new one. As in the simulator (tests/test_policy.py)."""
    for facts in gloo:
        assert facts["kept_by_other_handle"] == [True, 2.0]
        assert facts["gone_with_last_handle"]
        assert facts["recreated"] == [True, 2.0]
        assert facts["after_world"] == [True, 2.0]
        # init, new_group, its reuse, the new_group after the destroy, init again, new_group after it
        assert facts["destroy_torch_called"] == [True, True, False, True, True, True]


# ---------------------------------------------------------------------------------------------------------
# 3-4. imports, install / uninstall


def test_simnccl_imports_torch_only_on_apply(solo: dict[str, Any]) -> None:
    assert solo["torch_after_import"] is False
    assert solo["torch_after_apply"] is True
    assert solo["applied_type"] == "Applied"


def test_install_uninstall_restore_the_exact_functions(solo: dict[str, Any]) -> None:
    names = solo["before"]
    # 4 functions x torch.distributed and c10d, and device_mesh's new_group, split_group and init_process_group
    assert len(names) == 11 and all(names.values())
    assert not any(solo["during_is_original"].values())
    assert solo["during_one_wrapper_per_name"]
    for key in ("after", "after_second_uninstall", "after_exception"):
        assert solo[key] == names, key
    assert solo["current_is_applied"] and solo["current_after"]


def test_installing_twice_is_refused(solo: dict[str, Any]) -> None:
    assert "already installed" in solo["nested"] and "'dedupe'" in solo["nested"]


def test_stale_wrapper_passes_through(solo: dict[str, Any]) -> None:
    assert solo["stale_wrapper"] == [{"backend": "gloo", "size": 1, "rank": 0}, 0]


def test_world_of_one(solo: dict[str, Any]) -> None:
    assert solo["world1_dedupe_same"] and solo["world1_all_reduce"] == 1.0
    assert [d["torch_called"] for d in solo["world1_decisions"]] == [True, False]
    assert solo["bad_traffic"].startswith("traffic='bogus'")


def test_release_key(solo: dict[str, Any]) -> None:
    keys = solo["release_keys"]
    assert keys["2.14.1"] == "2.14"
    assert keys["2.15.0+cu132"] == keys["2.15.0a0+git1234"] == keys["2.15.0.dev20260101"] == "2.15"
    assert keys["2.16.0.dev20260301"] == "2.16-dev"
    assert keys["2.13.0"].startswith("ApplyError")
    assert solo["release_here"][1] == "2.15"


def test_apply_gpu_prices_budget_groups_from_the_profile(solo: dict[str, Any]) -> None:
    from simnccl.testing.invariants import eager_group_bytes

    assert solo["budget_priced_mib"] == pytest.approx(eager_group_bytes("rtx3060-12gb", "2.15", {}) / 2**20, abs=1e-3)
    assert solo["budget_unpriced_mib"] is None


def test_apply_profile_prices_budget_groups_from_that_profile(solo: dict[str, Any]) -> None:
    """A calibrated profile prices what the simulation run with it priced: by the kind's built-in one, production
    could decide ``budget(X)`` otherwise than the run that was proven."""
    from simnccl.testing.invariants import eager_group_bytes

    builtin_mib = eager_group_bytes("rtx3060-12gb", "2.15", {}) / 2**20
    mib, gpu = solo["budget_profile_mib"]
    assert mib == pytest.approx(builtin_mib + 100, abs=1e-3) and gpu == "rtx3060-12gb"
    assert solo["budget_profile_file_mib"] == pytest.approx(builtin_mib, abs=1e-3)
    assert "is for GPU 'rtx3060-12gb'" in solo["profile_other_gpu"]
    assert "does not cover torch release '2.14'" in solo["profile_other_release"]
    assert "/nonexistent/calibrated.toml" in solo["profile_missing_file"]


def test_apply_prices_a_budget_group_by_its_layout_from_local_world_size(solo: dict[str, Any]) -> None:
    """Under real torch the layout ``budget(X)`` prices comes from LOCAL_WORLD_SIZE (what torchrun and
    ``simnccl.real`` set), the whole world on one node when unset: the same figures the simulator prices for
    those layouts, so both decide alike. NCCL_RUNTIME_CONNECT=0, where the layout matters."""
    from simnccl.comm_memory import Pricer
    from simnccl.profiles import find_profile

    env = {"NCCL_RUNTIME_CONNECT": "0"}
    ranks = (0, 1, 2, 3)
    expected = {
        local: Pricer(find_profile("h100-80gb", "2.15"), lambda rank, n=local: rank // n).eager_group_bytes(ranks, env)
        / 2**20
        for local in (4, 1)
    }
    assert expected[1] > expected[4]  # four nodes cost more than one
    assert solo["budget_4_ranks_local_4"] == pytest.approx(expected[4], abs=1e-6)
    assert solo["budget_4_ranks_local_unset"] == pytest.approx(expected[4], abs=1e-6)
    assert solo["budget_4_ranks_local_1"] == pytest.approx(expected[1], abs=1e-6)
    assert solo["unknown_gpu"].startswith("apply(gpu='tpu-v9')") and "tpu-v9" in solo["unknown_gpu"]


def test_a_policy_that_raises_in_on_init_is_named_under_apply(tmp_path: Path) -> None:
    """``apply()`` called ``on_init`` bare: a bare KeyError, no policy or hook named (``on_group`` was wrapped)."""
    script = tmp_path / "init_raises.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "import user_policies\n"
        "from simnccl.policy import UserPolicyError\n"
        "from simnccl.torch_apply import apply\n"
        "with apply(user_policies.RaisesOnInit()):\n"
        "    try:\n"
        "        dist.init_process_group('gloo', rank=0, world_size=1, store=dist.HashStore())\n"
        "    except UserPolicyError as err:\n"
        "        print('named:', err)\n"
    )
    tests = Path(__file__).resolve().parent
    done = subprocess.run(
        [sys.executable, str(script)],
        env=dict(os.environ, PYTHONPATH=f"{tests.parent}{os.pathsep}{tests}"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "named: policy 'raises-on-init': on_init raised KeyError: 'MASTER_ADDR'" in done.stdout, done.stdout


def test_apply_checks_its_arguments_and_leaves_torch_what_the_caller_passed(tmp_path: Path) -> None:
    """Three faults a fuzzing round found: ``apply(object())`` failed on a missing attribute and a policy the
    simulator refuses (no hook overridden) ran as torch's defaults; ``new_group(map(int, ["0"]))``, which torch
    takes, reached torch exhausted under the no-op policy; a decision's ``device_id="cuda:0"``, which the
    simulator takes, crashed ``apply`` in simnccl."""
    script = tmp_path / "apply_arguments.py"
    script.write_text(
        textwrap.dedent(
            """\
            import torch.distributed as dist
            import user_policies
            from simnccl.policy import PolicyError
            from simnccl.testing import simulate
            from simnccl.ops import InitProcessGroup, NewGroup
            from simnccl.torch_apply import ApplyError, apply

            for bad in (object(), user_policies.WrongHookName()):
                try:
                    apply(bad)
                except PolicyError as err:
                    print("refused policy:", type(bad).__name__)
            for kwargs in ({"release": "banana"}, {"profile": 123}):
                try:
                    apply("torch-default", **kwargs)
                except ApplyError as err:
                    print("refused:", err)
            with apply("torch-default") as applied:
                dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
                group = dist.new_group(map(int, ["0"]))
                print("one-pass ranks:", dist.get_process_group_ranks(group))
                dist.destroy_process_group()
            program = [InitProcessGroup(backend="gloo"), NewGroup(ranks=(0,), bind="g")]
            print("simulated:", simulate(program, gpus_per_node=1, policy=user_policies.DeviceString()).verdict)
            with apply(user_policies.DeviceString()) as applied:
                dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
                dist.new_group([0])
                print("device string:", applied.decisions[-1].decision.device_id)
                dist.destroy_process_group()
            """
        )
    )
    tests = Path(__file__).resolve().parent
    done = subprocess.run(
        [sys.executable, str(script)],
        env=dict(_env(), PYTHONPATH=f"{tests.parent}{os.pathsep}{tests}"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[:2] == ["refused policy: object", "refused policy: WrongHookName"], done.stdout
    assert "refused: apply(release='banana'): expected one of" in lines[2], done.stdout
    assert "refused: apply(profile=123): expected a Profile" in lines[3], done.stdout
    assert lines[4:] == ["one-pass ranks: [0]", "simulated: pass", "device string: cuda:0"], done.stdout


def test_only_one_pass_iterators_are_read_into_lists() -> None:
    """What can be read twice reaches torch as the caller gave it; an iterator (and each split that is one) as the
    list it held, so the policy's reading of it leaves torch the same ranks."""
    from simnccl.torch_apply import _kept_once

    given: dict[str, Any] = {"ranks": map(int, ["0", "1"])}
    _kept_once(given, "ranks")
    assert given["ranks"] == [0, 1]
    kept = range(2)
    given = {"ranks": kept}
    _kept_once(given, "ranks")
    assert given["ranks"] is kept
    given = {"split_ranks": (iter([0, 1]), [2, 3])}
    _kept_once(given, "split_ranks")
    assert given["split_ranks"] == [[0, 1], [2, 3]]
    given = {"split_ranks": (s for s in ([0], [1]))}
    _kept_once(given, "split_ranks")
    assert given["split_ranks"] == [[0], [1]]
