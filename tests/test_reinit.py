"""Re-initialising the default process group: destroy_process_group, then init_process_group again.

Measured on torch 2.15 (CPU gloo; a program of init, all_reduce, destroy, init, new_group([0, 1]), all_reduce):
destroy resets the group counter, so the new default group is "0" again and the first new_group is "1". Under
mp.spawn rank 0 hosts the store and its destroy drops it: the re-init bootstraps in a fresh store and passes,
even with rank 0 re-initialising 3 s late. Under torchrun the agent's store outlives the destroy: the re-init's
keys find the destroyed incarnation's values, and with rank 0 late rank 1 read rank 0's old gloo address and
raised "Gloo connectFullMesh failed ... Connection refused" at once (in lockstep it passed: a race).
"""

from __future__ import annotations

import pytest

from simnccl.engine import RunOutcome
from simnccl.engine.reinit_store import NCCL_REFUSED_RETRY_S, SPAWN_STORE_RACE, STALE_RACE
from simnccl.ops import (
    WORLD,
    AllReduce,
    Compute,
    DestroyProcessGroup,
    InitProcessGroup,
    NewGroup,
    Op,
    PgOptions,
    Recv,
    Send,
    SetDevice,
    SplitGroup,
)
from simnccl.profiles import gloo_defaults
from simnccl.real.compare import racy, verdict_racy
from simnccl.testing import simulate

# A gloo bootstrap of three ranks: each connects to its two peers (simnccl/data/gloo_transport.toml).
GLOO_BOOTSTRAP_3_S = 2 * gloo_defaults()["gloo_bootstrap_per_peer_s"]


def reinit(backend: str, *, late: float = 0.0, late_before_destroy: bool = False) -> list[list[Op]]:
    """The measured program for ranks 0 and 1; rank 0 computes ``late`` seconds after (or before) its destroy."""
    delay = [Compute(seconds=late)] if late else []
    programs = []
    for rank in (0, 1):
        wait = delay if rank == 0 else []
        programs.append(
            [
                SetDevice(),
                InitProcessGroup(backend=backend),
                AllReduce(group=WORLD, size_bytes=1024),
                *(wait if late_before_destroy else []),
                DestroyProcessGroup(group=WORLD),
                *([] if late_before_destroy else wait),
                InitProcessGroup(backend=backend),
                NewGroup(ranks=(0, 1), bind="b"),
                AllReduce(group="b", size_bytes=1024),
            ]
        )
    return programs


def run(programs: list[list[Op]], launcher: str) -> RunOutcome:
    return simulate(programs, gpus_per_node=2, launcher=launcher)


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("late", [0.0, 3.0])
def test_a_reinit_under_spawn_bootstraps_in_a_fresh_store_and_names_the_first_new_group_1(
    backend: str, late: float
) -> None:
    out = run(reinit(backend, late=late), "spawn")
    assert out.verdict == "pass", (out.errors, out.hangs)
    assert sorted(name for name, _ranks in out.groups) == ["0", "1"]
    # rank 1 destroys and re-initialises at the instant rank 0 destroys (rank 0's delay comes after its destroy):
    # which store it reaches is a race (``test_a_reinit_under_spawn_at_rank_0s_destroy_is_a_race``)
    assert len(out.races) == 1 and SPAWN_STORE_RACE in out.races[0]


@pytest.mark.parametrize("backend", ["gloo", "nccl", "nccl-legacy"])
def test_a_reinit_under_spawn_at_rank_0s_destroy_is_a_race(backend: str) -> None:
    """Measured (2.15 gloo, ranks destroying and re-initialising with no delay, a TCP store rank 0 hosts per
    init, then a split): rank 1 reached the store rank 0's destroy was dropping in 3 runs of 14, failing with
    "DistNetworkError: Failed to recv, got 0 bytes" or leaving rank 0's new store waiting for it. The simulated
    clock puts both at one instant and passed it, so real compare called the failing runs a disagreement and the
    user's check called the startup safe. One race entry per instant names every rank; the verdict stays what the
    simulated order decided."""
    program = [
        SetDevice(),
        InitProcessGroup(backend=backend),
        AllReduce(group=WORLD, size_bytes=1024),
        DestroyProcessGroup(group=WORLD),
        InitProcessGroup(backend=backend),
        AllReduce(group=WORLD, size_bytes=1024),
    ]
    out = simulate(program, gpus_per_node=4, launcher="spawn", keep_trace=True)  # one shared Program
    assert out.verdict == "pass", (out.errors, out.hangs)
    [race] = out.races
    assert race.startswith("ranks [1, 2, 3] re-initialised the default group at ")
    assert SPAWN_STORE_RACE in race and "in 3 runs of 14" in race
    assert [e[1] for e in out.trace if len(e) > 2 and e[2] == "store-race"] == [1, 2, 3]
    assert verdict_racy({"hangs": [], "errors": [], "races": out.races})
    # the same program under torchrun (the agent's store outlives the destroy) has no such race
    assert simulate(program, gpus_per_node=4, launcher="torchrun").races == []


def test_a_lazy_reinit_under_spawn_before_rank_0_destroyed_is_not_modelled_past_its_first_bootstrap() -> None:
    """Legacy makes no communicator at init, so a rank re-initialising before rank 0 destroyed connected to rank
    0's old store and read nothing yet; its first bootstrap there (a new group's name the destroyed incarnation
    never used) waits on a store rank 0's destroy drops. The simulator passed it; now it says it does not know."""
    out = run(reinit("nccl-legacy", late=3.0, late_before_destroy=True), "spawn")
    assert out.verdict == "error"
    [error] = out.errors
    assert (error["rank"], error["type"]) == (1, "SimulatorLimit")
    assert error["op"] == "all_reduce(group='b', size_bytes=1024)"
    assert "connected to the old store" in error["message"] and "group '1'" in error["message"]
    assert "is not modelled" in error["message"]
    # after rank 0's destroy the rank reaches rank 0's next store: modelled, and it passes
    assert run(reinit("nccl-legacy", late=3.0), "spawn").verdict == "pass"


def test_a_gloo_reinit_under_torchrun_reads_the_destroyed_incarnations_address_and_fails_at_once() -> None:
    out = run(reinit("gloo", late=3.0), "torchrun")
    assert out.verdict == "error"
    assert not out.hangs
    assert [(e["rank"], e["type"]) for e in out.errors] == [(0, "RuntimeError"), (1, "RuntimeError")]
    for error in out.errors:
        assert error["message"].startswith("Gloo connectFullMesh failed with [")
        assert "timed out connecting: SO_ERROR: Connection refused" in error["message"]
        assert "torchrun's agent store, which outlives destroy_process_group" in error["message"]
        assert STALE_RACE in error["message"]
    # not after the group's timeout (1800 s): gloo's connect retries end at once
    assert max(e["time_s"] for e in out.errors) < 60


def test_an_nccl_reinit_under_torchrun_reads_the_destroyed_unique_id_and_its_root_waits_in_init() -> None:
    out = run(reinit("nccl"), "torchrun")
    assert [(e["rank"], e["type"]) for e in out.errors] == [(1, "torch.distributed.DistBackendError")]
    error = out.errors[0]
    assert "ncclRemoteError" in error["message"] and "socketStartConnect: exceeded retries" in error["message"]
    assert "stale store key" in error["message"] and STALE_RACE in error["message"]
    reinit_at = min(h["since_s"] for h in out.hangs)
    assert error["time_s"] == pytest.approx(reinit_at + NCCL_REFUSED_RETRY_S)
    # group rank 0 published a fresh id and never reads: it waits in ncclCommInitRank, which has no timeout
    [hang] = out.hangs
    assert (hang["rank"], hang["op"], hang["timeout_s"]) == (0, "init_process_group()", None)
    assert "stale store key" in hang["explanation"] and "torchrun's agent store" in hang["explanation"]
    assert verdict_racy({"hangs": out.hangs, "errors": out.errors})
    # and real compare calls it a race (it did not: only the texts of RACE_TEXTS make a comparison racy, so a real
    # run that read the new id and passed was a DISAGREE)
    assert racy({"verdict": out.verdict, "hangs": out.hangs, "errors": out.errors})


def test_a_reinit_under_spawn_before_rank_0_destroyed_reads_rank_0s_store() -> None:
    # rank 0 hosts the store: until its destroy drops it, rank 1's re-init finds the old incarnation's keys
    out = run(reinit("gloo", late=3.0, late_before_destroy=True), "spawn")
    assert out.verdict == "error"
    first = next(e for e in out.errors if e["rank"] == 1)
    assert first["type"] == "RuntimeError"
    assert "Connection refused" in first["message"]
    assert "rank 0's store, which lives until rank 0 destroys its default group" in first["message"]
    # rank 0 re-initialises in a fresh store and waits there for rank 1, which raised: told why; the store it
    # hosts raises one second past the timeout (measured), not an NCCL unique-id text
    [hang] = out.hangs
    assert hang["rank"] == 0 and "stale store key" in hang["explanation"]
    [timeout] = [e for e in out.errors if e["rank"] == 0]
    assert timeout["message"] == "Timed out after 1801 seconds waiting for clients. 1/2 clients joined."


def test_two_live_groups_under_one_name_are_still_a_store_key_collision() -> None:
    # diverged counters (rank 2 skips new_group([0, 1])): rank 2 bootstraps [0, 2] under "1", which ranks 0 and 1
    # already bootstrapped as [0, 1]; no destroy, so this is not a stale key but a collision that never completes
    pair, other = NewGroup(ranks=(0, 1), bind="a"), NewGroup(ranks=(0, 2), bind="b")
    gloo = InitProcessGroup(backend="gloo")
    out = simulate([[gloo, pair, other], [gloo, pair, other], [gloo, other]], gpus_per_node=0, ranks_per_node=3)
    assert out.verdict == "hang"
    assert any("store key collision under group name '1'" in h["explanation"] for h in out.hangs)
    assert not any("stale store key" in h["explanation"] for h in out.hangs)


def reinit_p2p(*, late: float = 0.0, late_before_destroy: bool = False) -> list[list[Op]]:
    """Ranks 0 and 1 on unbound legacy ProcessGroupNCCL: a send/recv (a lazily made pair communicator, its unique
    id under store key '0:1'), destroy, re-init, the same send/recv; rank 0 computes ``late`` seconds after (or
    before) its destroy."""
    delay = [Compute(seconds=late)] if late else []
    programs = []
    for rank, p2p in ((0, Send(peer=1)), (1, Recv(peer=0))):
        wait = delay if rank == 0 else []
        programs.append(
            [
                SetDevice(),
                InitProcessGroup(backend="nccl-legacy"),
                p2p,
                *(wait if late_before_destroy else []),
                DestroyProcessGroup(group=WORLD),
                *([] if late_before_destroy else wait),
                InitProcessGroup(backend="nccl-legacy"),
                p2p,
            ]
        )
    return programs


def test_a_legacy_send_recv_after_a_reinit_under_torchrun_reads_the_destroyed_pairs_unique_id() -> None:
    # getKeySendRecv has no counter: the re-init's pair reads '0:1', which the agent store still holds
    out = run(reinit_p2p(), "torchrun")
    assert [(e["rank"], e["type"], e["op"]) for e in out.errors] == [
        (1, "torch.distributed.DistBackendError", "recv(peer=0)")
    ]
    error = out.errors[0]
    assert "ncclRemoteError" in error["message"] and "socketStartConnect: exceeded retries" in error["message"]
    assert "stale store key" in error["message"] and "under store key '0:1'" in error["message"]
    assert STALE_RACE in error["message"]
    # pair rank 0 published a fresh id and waits in ncclCommInitRank, which has no timeout
    [hang] = out.hangs
    assert (hang["rank"], hang["op"], hang["timeout_s"]) == (0, "send(peer=1)", None)
    assert error["time_s"] == pytest.approx(hang["since_s"] + NCCL_REFUSED_RETRY_S)
    assert "stale store key" in hang["explanation"] and "torchrun's agent store" in hang["explanation"]
    assert verdict_racy({"hangs": out.hangs, "errors": out.errors})


@pytest.mark.parametrize("late", [0.0, 3.0])
def test_a_legacy_send_recv_after_a_reinit_under_spawn_bootstraps_in_a_fresh_store(late: float) -> None:
    out = run(reinit_p2p(late=late), "spawn")
    assert out.verdict == "pass", (out.errors, out.hangs)


def test_a_legacy_send_recv_reinit_under_spawn_before_rank_0_destroyed_reads_rank_0s_store() -> None:
    out = run(reinit_p2p(late=3.0, late_before_destroy=True), "spawn")
    assert [(e["rank"], e["op"]) for e in out.errors] == [(1, "recv(peer=0)")]
    assert "rank 0's store, which lives until rank 0 destroys its default group" in out.errors[0]["message"]
    [hang] = out.hangs
    assert hang["rank"] == 0 and "stale store key" in hang["explanation"]


def test_nccl_lazys_pair_counter_survives_the_reinit() -> None:
    """LazyBackend::nextPairAttempt is a process-wide static: a destroy does not reset it. Global 0 made a pair
    with global 1 (group ranks 0, 1) before the re-init and global 2 none, so in the re-init's new_group([0, 2])
    (group ranks 0, 1 again) rank 0 names the pair '1/p2p-0-1-1' and rank 2 '1/p2p-0-1-0': they never meet. The
    re-init's group "1" is fresh, so a counter per group would pass it."""
    lazy = NewGroup(ranks=(0, 2), backend="nccl-lazy", bind="g", timeout_s=120, pg_options=PgOptions(lazy_init=True))
    head = [SetDevice(), InitProcessGroup(backend="nccl-lazy")]
    tail = [DestroyProcessGroup(group=WORLD), InitProcessGroup(backend="nccl-lazy"), lazy]
    late = [DestroyProcessGroup(group=WORLD), Compute(seconds=5.0), *tail[1:]]  # after rank 0's store is gone
    programs = [
        [*head, Send(peer=1), *tail, Send(peer=2, group="g")],
        [*head, Recv(peer=0), *late],
        [*head, *late, Recv(peer=0, group="g")],
    ]
    out = simulate(programs, gpus_per_node=3, launcher="spawn")
    assert [(e["rank"], e["kind"], e["op"]) for e in out.errors] == [(2, "timeout", "recv(peer=0, group='g')")]
    assert "/1/p2p-0-1-0/nccl_storekey_0" in out.errors[0]["message"]
    [hang] = [h for h in out.hangs if h["rank"] == 0]
    assert hang["group"] == "1/p2p-0-1-1" and "LazyBackend::nextPairAttempt" in hang["explanation"]


@pytest.mark.parametrize("destroyed", [True, False], ids=["after-destroy", "before-init"])
def test_an_op_on_the_default_group_when_there_is_none_raises_torchs_value_error(destroyed: bool) -> None:
    """torch's ``_get_default_group``: before ``init_process_group`` or after ``destroy_process_group()``, an op on
    the default group raises ValueError. The simulator said NameError ("group handle 'world' was never bound")."""
    from simnccl.engine.state import DEFAULT_GROUP_MISSING
    from simnccl.ops import AllReduce, DestroyProcessGroup, InitProcessGroup, SetDevice

    steps = [SetDevice(), InitProcessGroup(backend="nccl"), DestroyProcessGroup()] if destroyed else [SetDevice()]
    out = simulate([*steps, AllReduce(size_bytes=8)], nodes=1, gpus_per_node=2, release="2.15")
    assert {(e["type"], e["message"]) for e in out.errors} == {("ValueError", DEFAULT_GROUP_MISSING)}


def test_the_default_groups_absence_is_said_in_torchs_words() -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from simnccl.engine.state import DEFAULT_GROUP_MISSING

    with pytest.raises(ValueError) as before:
        dist.all_reduce(torch.zeros(1))
    assert str(before.value) == DEFAULT_GROUP_MISSING


@pytest.mark.parametrize("before", ["init-destroy", "nothing"], ids=["second-destroy", "before-init"])
def test_destroying_the_world_when_there_is_none_raises_torchs_assertion(before: str) -> None:
    """torch's ``destroy_process_group()`` checks that ``GroupMember.WORLD`` is not None: a second destroy (an
    exit hook after an explicit teardown) or one before init raises on every rank. The simulator said pass."""
    from simnccl.engine.state import NO_GROUP_TO_DESTROY
    from simnccl.ops import DestroyProcessGroup, InitProcessGroup, SetDevice

    steps = [SetDevice(), InitProcessGroup(backend="gloo"), DestroyProcessGroup()] if before == "init-destroy" else []
    out = simulate([*steps, DestroyProcessGroup()], nodes=1, gpus_per_node=2, release="2.15")
    assert out.verdict == "error"
    assert [(e["rank"], e["type"], e["message"]) for e in out.errors] == [
        (rank, "AssertionError", NO_GROUP_TO_DESTROY) for rank in (0, 1)
    ]


def test_destroying_the_world_when_there_is_none_is_said_in_torchs_words() -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    from simnccl.engine.state import NO_GROUP_TO_DESTROY

    with pytest.raises(AssertionError) as raised:
        dist.destroy_process_group()
    assert str(raised.value) == NO_GROUP_TO_DESTROY


@pytest.mark.parametrize("split", [False, True])
def test_a_subgroup_kept_across_the_destroy_keeps_rank_0s_store_under_spawn(split: bool) -> None:
    """A program keeps its subgroups (frameworks hold them in globals); each holds a prefix store of rank 0's
    TCPStore, and torch's TCPStore is multi-tenant, so rank 0's re-init reuses the live server and its keys.
    Measured (torch 2.15 gloo, env:// rendezvous, a new_group held across destroy_process_group, rank 1 a little
    late): rank 0's re-init read rank 1's destroyed address and raised "Gloo connectFullMesh failed ... Connection
    refused" in 5 runs of 7; with the subgroup deleted, 7 of 7 passed. The simulator dropped the store at every
    destroy and passed (exit 0); real compare then disagreed in 5 of 9 runs."""
    from simnccl.ops import SplitGroup

    made = SplitGroup(split_ranks=((0, 1),), bind="a") if split else NewGroup(ranks=(0, 1), bind="a")
    gloo = InitProcessGroup(backend="gloo")
    late = [Compute(seconds=0.5)]
    programs = [
        [
            SetDevice(),
            gloo,
            made,
            AllReduce(group="a", size_bytes=1024),
            DestroyProcessGroup(group=WORLD),
            *(late if rank == 1 else []),
            gloo,
            NewGroup(ranks=(0, 1), bind="b"),
            AllReduce(group="b", size_bytes=1024),
        ]
        for rank in (0, 1)
    ]
    out = run(programs, "spawn")
    assert out.verdict == "error" and out.races == []
    assert sorted(e["rank"] for e in out.errors) == [0, 1]
    for error in out.errors:
        assert "Connection refused" in error["message"] and STALE_RACE in error["message"]
        assert "holds no subgroup of it" in error["message"] and "multi-tenant" in error["message"]
    assert verdict_racy({"hangs": out.hangs, "errors": out.errors})
    # the same re-init without the subgroup: rank 0's destroy dropped its store, a fresh one passes
    bare = [[op for op in program if op is not made and getattr(op, "group", None) != "a"] for program in programs]
    assert run(bare, "spawn").verdict == "pass"


LEGACY = {"TORCH_DIST_USE_NCCL2": "0"}


def _store_gone_programs(backend: str, *, keep: bool = False, late_s: float = 2.0) -> list[list[Op]]:
    """Rank 0 destroys its default group at once (``keep``: holding a subgroup of it); ranks 1 and 2 make a group
    of theirs ``late_s`` later, which bootstraps through the store."""
    init = InitProcessGroup(backend=backend)
    pair = NewGroup(ranks=(1, 2), bind="g")
    kept = [NewGroup(ranks=(0, 1, 2), bind="k")] if keep else []
    return [
        [SetDevice(), init, *kept, pair, DestroyProcessGroup()],
        *([SetDevice(), init, *kept, Compute(seconds=late_s), pair, AllReduce(group="g")] for _ in range(2)),
    ]


@pytest.mark.parametrize(
    ("backend", "env", "op"),
    [("gloo", {}, "new_group(ranks=[1, 2], bind='g')"), ("nccl", LEGACY, "all_reduce(group='g')")],
    ids=["gloo", "legacy-nccl"],
)
def test_under_spawn_a_bootstrap_after_rank_0_dropped_the_store_fails_as_a_lost_peer(
    backend: str, env: dict[str, str], op: str
) -> None:
    """Real gloo (3 runs of 3, and ``tests/test_real_lane.py``): both raise "DistNetworkError: Broken pipe" from
    TCPStore::doWait. The simulator passed it (exit 0): only a re-initialised rank was checked against rank 0's
    store. A lazy NCCL communicator's unique id goes through the same store, at its first collective (nccl2's
    new_group splits the default group's communicator instead, which needs no store)."""
    out = simulate(_store_gone_programs(backend), gpus_per_node=3, launcher="spawn", env=env)
    assert [(e["rank"], e["kind"], e["type"], e["op"]) for e in out.errors] == [
        (r, "peer-lost", "torch.distributed.DistNetworkError", op) for r in (1, 2)
    ]
    assert all(e["message"].startswith("Broken pipe") and "'1'" in e["message"] for e in out.errors)
    assert simulate(_store_gone_programs(backend), gpus_per_node=3, launcher="torchrun", env=env).verdict == "pass"


def test_under_spawn_rank_0_holding_a_subgroup_keeps_its_store() -> None:
    out = simulate(_store_gone_programs("gloo", keep=True), gpus_per_node=3, launcher="spawn")
    assert out.verdict == "pass", out.errors


def test_under_spawn_ranks_waiting_in_a_bootstrap_fail_when_rank_0_drops_the_store() -> None:
    """Ranks 1 and 2 wait for rank 0, a member, in the bootstrap of a gloo group when it destroys the default
    group instead: their TCPStore waits fail then (real: "Broken pipe" or "Failed to recv, got 0 bytes")."""
    init = InitProcessGroup(backend="gloo")
    programs = [
        [init, Compute(seconds=1.0), DestroyProcessGroup()],
        *([init, NewGroup(ranks=(0, 1, 2), bind="g", use_local_synchronization=True)] for _ in range(2)),
    ]
    out = simulate(programs, gpus_per_node=3, launcher="spawn")
    lost_at = 1.0 + GLOO_BOOTSTRAP_3_S
    errors = [(e["rank"], e["kind"], e["time_s"]) for e in out.errors]
    assert errors == [(1, "peer-lost", lost_at), (2, "peer-lost", lost_at)]
    assert not out.hangs


def test_under_spawn_a_bootstrap_at_the_instant_rank_0_drops_the_store_is_a_race() -> None:
    from simnccl.engine.reinit_store import STORE_GONE_RACE

    out = simulate(_store_gone_programs("gloo", late_s=0.0), gpus_per_node=3, launcher="spawn")
    assert out.verdict == "pass" and out.races == [STORE_GONE_RACE.format(ranks="ranks [1, 2]", now=GLOO_BOOTSTRAP_3_S)]


@pytest.mark.parametrize("timed", [False, True], ids=["at-op", "at-time"])
def test_under_spawn_rank_0s_store_goes_with_its_process(timed: bool) -> None:
    """Real gloo, rank 0 crashing before ranks 1 and 2 make their group: rank 1 raised "DistNetworkError: Broken
    pipe" in new_group. The simulator had both finish, naming rank 0 alone."""
    from simnccl.faults import Fault, FaultSchedule

    fault = Fault("crash", 0, at_s=0.5) if timed else Fault("crash", 0, at_op=1)
    programs = [[InitProcessGroup(backend="gloo"), Compute(seconds=1.0), NewGroup(ranks=(1, 2), bind="g")]] * 3
    faults = FaultSchedule(None, (), (fault,))
    spawn = simulate(programs, gpus_per_node=3, launcher="spawn", faults=faults)
    assert [(e["rank"], e["kind"]) for e in spawn.errors] == [(0, "crash"), (1, "peer-lost"), (2, "peer-lost")]
    assert "went with rank 0's process" in spawn.errors[1]["message"]
    torchrun = simulate(programs, gpus_per_node=3, launcher="torchrun", faults=faults)
    assert [(e["rank"], e["kind"]) for e in torchrun.errors] == [(0, "crash")]


def test_under_spawn_a_split_through_rank_0s_dropped_store_hangs() -> None:
    """Real gloo (2 runs of 2, ``real compare``): ranks 1 and 2 split their group a second after rank 0 destroyed
    the default group, and both hang in split_group, where a new_group raises at once."""
    init = InitProcessGroup(backend="gloo")
    pair = NewGroup(ranks=(1, 2), bind="g")
    split = SplitGroup(parent="g", split_ranks=((0, 1),), bind="h")
    programs = [
        [init, pair, DestroyProcessGroup()],
        *([init, pair, Compute(seconds=1.0), split, AllReduce(group="h")] for _ in range(2)),
    ]
    out = simulate(programs, gpus_per_node=3, launcher="spawn")
    assert out.verdict == "hang" and {h["rank"] for h in out.hangs} == {1, 2}
    assert all("waits on a store that never answers: Broken pipe" in h["explanation"] for h in out.hangs)


def test_under_spawn_a_destroyed_subgroup_whose_handle_is_kept_keeps_rank_0s_store() -> None:
    """The program's variable holds the destroyed group, and with it its prefix store of rank 0's store (real gloo,
    4 runs of 4; with the handle deleted, plain torch raised Broken pipe 2 of 2). It was a false failure."""
    init = InitProcessGroup(backend="gloo")
    later = NewGroup(ranks=(1, 2), bind="h", use_local_synchronization=True)
    programs = [
        [init, NewGroup(ranks=(0, 1, 2), bind="a"), DestroyProcessGroup(group="a"), DestroyProcessGroup()],
        *(
            [init, NewGroup(ranks=(0, 1, 2), bind="a"), Compute(seconds=1.0), later, AllReduce(group="h")]
            for _ in range(2)
        ),
    ]
    assert simulate(programs, gpus_per_node=3, launcher="spawn").verdict == "pass"
