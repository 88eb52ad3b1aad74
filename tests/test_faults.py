"""Faults: seeded schedules replay exactly; each kind does what it claims, at the op or time it names."""

from __future__ import annotations

import pytest
from conftest import TINY

from simnccl.explain import explain
from simnccl.faults import FAULT_KINDS, Fault, FaultError, FaultSchedule, apply_to_programs, generate
from simnccl.ops import Alloc, AllReduce, Barrier, Compute, InitProcessGroup, NewGroup, Program, Recv, Send, SetDevice
from simnccl.result import VariantResult
from simnccl.scenario import ScenarioError, load_scenario
from simnccl.testing import simulate

START = [SetDevice(), InitProcessGroup(backend="nccl")]
BODY = [
    *START,
    NewGroup(ranks=(0, 1, 2, 3), bind="tp"),
    AllReduce(group="tp"),
    Compute(seconds=1.0),
    AllReduce(group="tp"),
    AllReduce(group="tp"),
]
PROGRAMS = [Program(tuple(BODY))] * 4


def run(*faults: Fault, env=None):
    return simulate(BODY, gpus_per_node=4, env=env, faults=FaultSchedule(None, (), tuple(faults)))


def test_same_seed_gives_the_same_schedule_and_trace() -> None:
    a, b = generate(11, PROGRAMS), generate(11, PROGRAMS)
    assert a == b and a.describe() == b.describe()
    assert a.describe().startswith("fault schedule seed=11 classes=")
    outs = [
        simulate(BODY, gpus_per_node=4, faults=generate(11, PROGRAMS, classes=FAULT_KINDS, max_faults=3))
        for _ in range(2)
    ]
    assert outs[0].trace_hash == outs[1].trace_hash


def test_swarm_switches_whole_classes_off() -> None:
    classes = {generate(seed, PROGRAMS).classes for seed in range(40)}
    assert len(classes) > 10  # different subsets of the fault classes, not always all of them
    assert all(
        f.kind in generate(seed, PROGRAMS).classes for seed in range(40) for f in generate(seed, PROGRAMS).faults
    )


def test_skip_rewrites_only_the_culprits_program() -> None:
    programs = apply_to_programs(FaultSchedule(None, (), (Fault("skip", 2, at_op=5),)), PROGRAMS)
    assert programs[0] is PROGRAMS[0] and programs[2] is not PROGRAMS[2]
    assert isinstance(programs[2].ops[5], Compute) and len(programs[2].ops) == len(BODY)


def test_skip_hangs_the_others_who_name_the_culprit() -> None:
    out = run(Fault("skip", 2, at_op=5))
    assert out.verdict == "hang"
    waiting = {h["rank"]: h for h in out.hangs}
    assert waiting[0]["waiting_for"] == [2]
    assert "rank 2" in waiting[0]["explanation"]


def test_crash_at_an_op_kills_the_rank_without_a_dump_and_others_time_out() -> None:
    out = run(Fault("crash", 1, at_op=5))
    assert out.verdict == "error"
    crash = [e for e in out.errors if e["kind"] == "crash"]
    assert [e["rank"] for e in crash] == [1] and "injected fault: crash rank 1 at op 5" in crash[0]["message"]
    assert 1 not in out.fr_dumps and set(out.fr_dumps) == {0, 2, 3}
    assert "died: Crash" in next(h for h in out.hangs if h["rank"] == 0)["explanation"]


def test_crash_at_a_time_interrupts_whatever_the_rank_is_doing() -> None:
    out = run(Fault("crash", 3, at_s=0.5))
    (crash,) = [e for e in out.errors if e["kind"] == "crash"]
    assert crash["rank"] == 3 and crash["time_s"] == pytest.approx(0.5)


def test_gpu_crash_takes_every_process_on_that_gpu() -> None:
    # four gloo processes sharing two GPUs (cuda:r%2): a crash of GPU 0 kills ranks 0 and 2 only
    programs = [
        [SetDevice(device=r % 2), InitProcessGroup(backend="gloo"), Alloc(mib=16), Compute(seconds=5.0)]
        for r in range(4)
    ]
    out = simulate(
        programs, gpus_per_node=2, ranks_per_node=4, faults=FaultSchedule(None, (), (Fault("gpu-crash", 0, at_s=1.0),))
    )
    crashed = sorted(e["rank"] for e in out.errors if e["kind"] == "crash")
    assert crashed == [0, 2]
    assert {rt.rank: rt.status for rt in out.ranks} == {0: "aborted", 1: "done", 2: "aborted", 3: "done"}


def test_straggler_is_slower_but_finishes() -> None:
    fast = run()
    slow = run(Fault("straggler", 1, factor=4.0))
    assert slow.verdict == fast.verdict == "pass"
    assert slow.end_time_s == pytest.approx(fast.end_time_s + 3.0, abs=1e-6)


def test_oom_at_init_fails_that_ranks_next_communicator() -> None:
    out = run(Fault("oom-at-init", 2))
    (oom,) = [e for e in out.errors if e["kind"] == "oom"]
    assert oom["rank"] == 2 and "injected fault: oom-at-init" in oom["message"]
    assert out.verdict == "fail"


def test_nccl_error_aborts_after_the_dump_wait() -> None:
    out = run(Fault("nccl-error", 0, at_op=5))
    (err,) = [e for e in out.errors if e["rank"] == 0]
    assert "NCCL Async Error" in err["message"] and err["time_s"] >= 15.0
    assert out.verdict == "error"


@pytest.mark.parametrize("fault", [Fault("nccl-error", 1, at_op=5), Fault("nccl-error", 1, at_s=0.5)])
def test_nccl_error_under_clean_up_only_is_an_error_the_rank_raised(fault) -> None:
    """CleanUpOnly: the rank's call raises DistBackendError: an error of the run (it was filed as a watchdog
    timeout: verdict hang), and the others' report says rank 1 raised, not that it died."""
    out = run(fault, env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"})
    assert out.verdict == "error"
    (err,) = [e for e in out.errors if e["rank"] == 1]
    assert err["kind"] == "error" and err["type"] == "torch.distributed.DistBackendError"
    assert out.ranks[1].status == "error"
    explanation = next(h for h in out.hangs if h["rank"] == 0)["explanation"]
    assert "rank 1 raised torch.distributed.DistBackendError: [Rank 1] NCCL Async Error" in explanation
    assert "died" not in explanation


def test_nccl_error_at_a_time_aborts_as_an_error_not_a_timeout() -> None:
    out = run(Fault("nccl-error", 1, at_s=0.5))
    (err,) = [e for e in out.errors if e["rank"] == 1]
    assert err["kind"] == "abort" and out.verdict == "error"


@pytest.mark.parametrize("fault", [Fault("nccl-error", 1, at_op=5), Fault("nccl-error", 1, at_s=0.5)])
def test_nccl_error_under_no_handling_hangs_the_rank_in_its_op(fault) -> None:
    """NoHandling logs the error and leaves the communicator broken: the op never completes (it did, and the
    run passed), and the report says why."""
    out = run(fault, env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})
    assert out.verdict == "hang" and not out.errors
    hangs = {h["rank"]: h for h in out.hangs}
    assert hangs[1]["op_index"] == (5 if fault.at_op is not None else 4)  # at 0.5 s: inside the compute
    assert "NoHandling" in hangs[1]["explanation"] and "NCCL Async Error" in hangs[1]["explanation"]
    assert hangs[0]["waiting_for"] == [1] and "NoHandling" in hangs[0]["explanation"]


@pytest.mark.parametrize("kind", ["stall", "crash"])
def test_a_fault_after_a_split_the_rank_ran_ahead_of_strikes_when_the_split_ends(kind: str) -> None:
    """Rank 1 is no member of [4..7]: it runs ahead of that NOCOLOR split and settles at its end (0.55 s), where
    its next op starts, as ranks 0, 2 and 3 do. A fault at that op struck at its arrival at the split (0.40 s): a
    stalled rank was "stuck since t=0.400 s" while the split it was in went on until 0.55 s."""
    program = [
        *START,
        NewGroup((0, 1, 2, 3), bind="tp"),
        NewGroup((4, 5, 6, 7), bind="tp"),
        AllReduce(group="tp", size_bytes=2**20),
    ]
    faults = FaultSchedule(None, (), (Fault(kind, 1, at_op=4),))
    out = simulate(program, gpus_per_node=8, faults=faults, keep_trace=True)
    (struck,) = [e for e in out.trace if e[1:3] == (1, "fault")]
    entered = {h["rank"]: h["since_s"] for h in out.hangs if h["rank"] != 1}
    assert entered and set(entered.values()) == {struck[0]}, (struck, entered)


@pytest.mark.parametrize(
    "fault",
    [
        Fault("explode", 0),
        Fault("crash", 9, at_op=0),
        Fault("skip", 0, at_op=0),
        Fault("crash", 0),
        Fault("straggler", 0, factor=0.5),
        Fault("skip", 0, at_op=99),
    ],
)
def test_malformed_faults_are_rejected(fault) -> None:
    with pytest.raises(FaultError):
        apply_to_programs(FaultSchedule(None, (), (fault,)), PROGRAMS)


# ---------------------------------------------------------------------------------------------- link stragglers

# Two nodes of two GPUs: groups a (ranks 0, 1: node 0) and b (ranks 2, 3: node 1) stay inside a node; the
# world group spans both. 1 GiB all-reduces make the wire time dominate the latency.
GIB = 1 << 30
LINKS = [
    *START,
    NewGroup(ranks=(0, 1), bind="a"),
    NewGroup(ranks=(2, 3), bind="b"),
    AllReduce(group="a", size_bytes=GIB),
    AllReduce(group="b", size_bytes=GIB),
    AllReduce(size_bytes=GIB),
]


def run_links(*faults: Fault, program=LINKS, **kwargs):
    return simulate(program, nodes=2, gpus_per_node=2, faults=FaultSchedule(None, (), tuple(faults)), **kwargs)


def test_a_slow_inter_node_link_slows_only_the_groups_that_span_it() -> None:
    fast = run_links()
    slow = run_links(Fault("link-straggler", 0, factor=4.0, peer=2))
    assert slow.verdict == fast.verdict == "pass"
    (link,) = slow.slowdowns
    assert link["link"] == "between node 0 and node 1 (ranks 0 and 2)"
    assert link["ops"] == 1 and link["groups"] == ["0"]  # the world all-reduce; a and b stay inside a node
    assert link["extra_s"] > 0.01
    assert slow.end_time_s == pytest.approx(fast.end_time_s + link["extra_s"], abs=1e-9)


def test_a_slow_gpu_link_inside_a_node_slows_the_groups_with_both_gpus() -> None:
    slow = run_links(Fault("link-straggler", 1, factor=3.0, peer=0))
    (link,) = slow.slowdowns
    assert link["link"] == "between the GPUs of ranks 1 and 0 on node 0"
    assert link["ops"] == 2 and sorted(link["groups"]) == ["0", "1"]  # group a and the world, not b


def test_a_slow_link_slows_point_to_point_across_it() -> None:
    program = [[*START, Send(peer=2, size_bytes=GIB)], [*START], [*START, Recv(peer=0, size_bytes=GIB)], [*START]]
    fast = run_links(program=program)
    slow = run_links(Fault("link-straggler", 0, factor=5.0, peer=3), program=program)
    (link,) = slow.slowdowns
    assert link["ops"] == 1 and slow.end_time_s == pytest.approx(fast.end_time_s + link["extra_s"], abs=1e-9)
    same_node = run_links(Fault("link-straggler", 2, factor=5.0, peer=3), program=program)  # a link on node 1 only
    assert same_node.slowdowns[0]["ops"] == 0 and same_node.end_time_s == pytest.approx(fast.end_time_s)


def test_explain_names_the_slow_link_not_the_ranks_that_waited() -> None:
    slow = run_links(Fault("link-straggler", 0, factor=4.0, peer=2))
    text = explain(VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", slow))
    assert "The link between node 0 and node 1 (ranks 0 and 2) is the straggler: it ran 4x slower" in text
    assert "every rank's own work was on time" in text


def test_explain_gives_a_small_slowdown_in_a_unit_that_shows_it() -> None:
    """A link slowed under a small collective costs microseconds: "took 0.000 s longer" hid it."""
    from simnccl.explain import _duration

    assert [_duration(s) for s in (0.0, 2.5, 0.1, 0.0123, 7.3107e-05)] == [
        "0.000 s",
        "2.500 s",
        "0.100 s",
        "12.300 ms",
        "73.107 us",
    ]
    slow = run_links(Fault("link-straggler", 0, factor=4.0, peer=2))
    text = explain(VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", slow))
    assert " 0.000 s longer" not in text, text


def test_explain_names_a_rank_straggler_in_a_passing_run() -> None:
    slow = run(Fault("straggler", 1, factor=4.0))
    text = explain(VariantResult("v", "", "2.15", "2.15.0", "p", {}, "torch-default", slow))
    assert "Rank 1 is a straggler: its local work ran 4x slower, 3.000 s extra" in text


def test_a_link_slow_enough_times_the_collective_out_and_the_hang_says_why() -> None:
    out = run_links(Fault("link-straggler", 0, factor=1e6, peer=2))
    assert out.verdict == "hang"
    hang = next(h for h in out.hangs if h["rank"] == 0)
    assert hang["waiting_for"] == [] and hang["detected_at_s"] == pytest.approx(hang["since_s"] + 615)
    assert "every member arrived; the operation itself runs until" in hang["explanation"]
    assert "over the slowed link between node 0 and node 1" in hang["explanation"]


def test_link_stragglers_are_generated_printed_and_replayed() -> None:
    programs = [Program(tuple(LINKS))] * 4
    schedules = [generate(seed, programs, classes=["link-straggler"], max_faults=2) for seed in range(20)]
    faults = [f for s in schedules for f in s.faults]
    assert faults and all(f.kind == "link-straggler" and f.peer not in (None, f.rank) for f in faults)
    assert all(1.5 <= f.factor <= 10 for f in faults)
    schedule = next(s for s in schedules if s.faults)
    assert f"link-straggler link rank {schedule.faults[0].rank}<->rank {schedule.faults[0].peer} x" in (
        schedule.describe()
    )
    seed = next(i for i, s in enumerate(schedules) if s.faults)
    again = generate(seed, programs, classes=["link-straggler"], max_faults=2)
    assert again == schedules[seed]
    runs = [simulate(LINKS, nodes=2, gpus_per_node=2, faults=again) for _ in range(2)]
    assert runs[0].trace_hash == runs[1].trace_hash
    assert "link-straggler" in FAULT_KINDS and any(
        "link-straggler" in generate(seed, programs).classes for seed in range(20)
    )


@pytest.mark.parametrize(
    ("fault", "text"),
    [
        (Fault("link-straggler", 0, factor=2.0), "needs peer"),
        (Fault("link-straggler", 0, factor=2.0, peer=0), "needs peer"),
        (Fault("link-straggler", 0, factor=2.0, peer=4), "needs peer"),
        (Fault("link-straggler", 0, factor=float("inf"), peer=1), "finite number >= 1"),
        (Fault("link-straggler", 0, factor=float("nan"), peer=1), "finite number >= 1"),
        (Fault("straggler", 0, factor=2.0, peer=1), "only meaningful for a link-straggler"),
        (Fault("watchdog-stuck", 0), "needs at_op or at_s"),
        (Fault("crash", 0, at_op=1, at_s=1.0), "not both"),
        (Fault("crash", 0, at_op=1, factor=3.0), "factor is not used by a fault of kind 'crash'"),
        (Fault("oom-at-init", 0, at_op=1), "at_op is not used by a fault of kind 'oom-at-init'"),
        (Fault("store-timeout", 0, at_s=1.0), "at_s is not used by a fault of kind 'store-timeout'"),
        (Fault("crash", 0, at_s=-1.0), "at_s must be a time >= 0"),
    ],
)
def test_malformed_link_and_stuck_faults_say_why(fault: Fault, text: str) -> None:
    with pytest.raises(FaultError, match=text):
        apply_to_programs(FaultSchedule(None, (), (fault,)), PROGRAMS)


def test_a_scenario_names_the_link_by_peer(write_scenario) -> None:
    fault_table = "\n[faults]\ninject = [{ kind = 'link-straggler', rank = 0, peer = 1, factor = 2.5 }]\n"
    scenario = load_scenario(write_scenario(TINY + fault_table))
    assert scenario.faults.faults == (Fault("link-straggler", 0, factor=2.5, peer=1),)
    bad = "\n[faults]\ninject = [{ kind = 'link-straggler', rank = 0, peer = 0, factor = 2.5 }]\n"
    with pytest.raises(ScenarioError, match=r"faults\.inject\[0\]: .*needs peer"):
        load_scenario(write_scenario(TINY + bad))


def test_a_straggler_at_a_time_is_rejected_not_ignored() -> None:
    with pytest.raises(FaultError, match="slow from the start"):
        apply_to_programs(
            FaultSchedule(None, (), (Fault("link-straggler", 0, at_s=3.0, factor=2.0, peer=1),)), PROGRAMS
        )


def _two_rank_scenario(tmp_path, inject: str):
    """A two-rank scenario of set_device, init and one all_reduce, with ``[faults] inject = [inject]``."""
    path = tmp_path / "twice.toml"
    path.write_text(
        '[scenario]\nname = "twice"\n[cluster]\ngpu = "h100-80gb"\ngpus_per_node = 2\n[torch]\nrelease = "2.15"\n'
        '[workload]\nsteps = [{ op = "set_device" }, { op = "init_process_group" }, { op = "all_reduce" }]\n'
        f"[faults]\ninject = [{inject}]\n"
    )
    return path


def _never_drawn_twice(classes, key) -> None:
    """A swarm of ``classes`` (300 seeds, 2 ranks, up to 4 faults) never draws two of them with the same
    ``key``; faults of other kinds the schedule holds are not looked at."""
    from simnccl.faults import generate
    from simnccl.ops import AllReduce, InitProcessGroup, Program, SetDevice

    program = Program((SetDevice(), InitProcessGroup(), AllReduce(size_bytes=8)))
    for seed in range(300):
        faults = generate(seed, [program] * 2, classes=sorted(classes), max_faults=4).faults
        keys = [key(f) for f in faults if f.kind in classes]
        assert len(keys) == len(set(keys)), (seed, faults)


@pytest.mark.parametrize("second", ["stall", "nccl-error", "crash", "watchdog-stuck"])
def test_two_timed_faults_on_one_op_are_refused_or_never_generated(tmp_path, capsys, second: str) -> None:
    """A crash and a second timed fault on the same op of one rank: the engine acts out one fault per op, so
    the second silently replaced the crash (a printed crash that never happened). Bad input in a file (exit 2,
    naming both); never drawn by a swarm."""
    from simnccl.cli import main
    from simnccl.faults import TIMED_FAULTS

    with pytest.raises(FaultError, match="hit the same op"):
        apply_to_programs(FaultSchedule(None, (), (Fault("crash", 1, at_op=5), Fault(second, 1, at_op=5))), PROGRAMS)
    _never_drawn_twice(TIMED_FAULTS, lambda f: (f.rank, f.at_op))
    path = _two_rank_scenario(
        tmp_path, f'{{ kind = "crash", rank = 1, at_op = 2 }}, {{ kind = "{second}", rank = 1, at_op = 2 }}'
    )
    assert main(["run", str(path)]) == 2
    assert f"crash rank 1 at op 2 and {second} rank 1 at op 2 hit the same op" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("first", "second", "says"),
    [
        ('kind = "straggler", rank = 1, factor = 2', 'kind = "straggler", rank = 1, factor = 8', "only one factor"),
        ('kind = "oom-at-init", rank = 1', 'kind = "oom-at-init", rank = 1', "it fails once"),
    ],
)
def test_two_faults_a_rank_holds_once_are_refused_or_never_generated(
    tmp_path, capsys, first: str, second: str, says: str
) -> None:
    """Two stragglers on one rank: the second factor silently replaced the first; two oom-at-init faults acted
    once. The schedule printed both. Bad input in a file (exit 2, naming both); never drawn by a swarm."""
    from simnccl.cli import main
    from simnccl.faults import ONCE_PER_RANK

    _never_drawn_twice(ONCE_PER_RANK, lambda f: (f.kind, f.rank))
    assert main(["run", str(_two_rank_scenario(tmp_path, f"{{ {first} }}, {{ {second} }}"))]) == 2
    assert says in capsys.readouterr().err


def test_two_program_faults_on_one_op_are_refused_or_never_generated(tmp_path) -> None:
    """A skip and a mismatch on the same op of one rank: bad input in a file (exit 2), never drawn by a swarm."""
    from simnccl.cli import main
    from simnccl.faults import PROGRAM_FAULTS

    _never_drawn_twice(PROGRAM_FAULTS, lambda f: (f.rank, f.at_op))
    path = _two_rank_scenario(
        tmp_path, '{ kind = "skip", rank = 0, at_op = 2 }, { kind = "mismatch", rank = 0, at_op = 2 }'
    )
    assert main(["run", str(path)]) == 2


def test_a_fault_that_never_struck_is_reported_with_why(tmp_path, capsys) -> None:
    """A crash at a time after the rank had finished, a stall at an op past its program's end... A run that passes
    said nothing of a fault that never acted: as if the policy had survived it. Each is reported, with why."""
    import json

    from simnccl.cli import main

    path = tmp_path / "late.toml"
    path.write_text(
        '[scenario]\nname = "late"\n[cluster]\ngpu = "h100-80gb"\ngpus_per_node = 2\n[torch]\nrelease = "2.15"\n'
        '[workload]\nsteps = [{ op = "set_device" }, { op = "init_process_group" }, { op = "all_reduce" }]\n'
        '[faults]\ninject = [{ kind = "crash", rank = 1, at_s = 500 }]\n'
    )
    assert main(["run", str(path), "--json", str(tmp_path / "o.json")]) == 1  # a failed check (--allow unacted)
    out = capsys.readouterr().out
    (variant,) = json.loads((tmp_path / "o.json").read_text())["results"][0]["variants"]
    assert variant["faults_unacted"] == ["crash rank 1 at t=500s: never acted (the rank had ended before then)"]
    assert "fault crash rank 1 at t=500s: never acted" in out
    assert variant["end_time_s"] < 1  # the run ends with its ranks, not at the time of a fault that never struck
    stalled = simulate(
        [SetDevice(), InitProcessGroup(backend="nccl"), AllReduce()],
        faults=FaultSchedule(None, (), (Fault("stall", 0, at_op=1), Fault("crash", 1, at_op=2))),
    )
    assert stalled.faults_unacted == ["crash rank 1 at op 2: never acted (the rank never reached that op)"]
    full = simulate(
        [SetDevice(), InitProcessGroup(backend="nccl"), AllReduce()],
        faults=FaultSchedule(None, (), (Fault("oom-at-init", 0),)),
    )
    assert full.faults_unacted == [], "the world's init struck"
    none = simulate([SetDevice()], faults=FaultSchedule(None, (), (Fault("oom-at-init", 1),)))
    assert none.faults_unacted == ["oom-at-init rank 1: never acted (the rank made no communicator after it was armed)"]


def test_a_fault_that_never_struck_is_on_the_one_line_q_prints_and_in_explain(tmp_path, capsys) -> None:
    """``run -q`` printed "pass ok" and ``explain`` "nothing to explain" for a run no scheduled fault struck."""
    from simnccl.cli import main

    path = tmp_path / "late.toml"
    path.write_text(
        '[scenario]\nname = "late"\n[cluster]\ngpu = "h100-80gb"\ngpus_per_node = 2\n[torch]\nrelease = "2.15"\n'
        '[workload]\nsteps = [{ op = "set_device" }, { op = "init_process_group" }, { op = "all_reduce" }]\n'
        '[faults]\ninject = [{ kind = "crash", rank = 1, at_s = 500 }]\n'
    )
    assert main(["run", "-q", str(path), "--allow", "unacted"]) == 0
    assert "pass  ok  peak " in (line := capsys.readouterr().out) and line.rstrip().endswith("1 fault never acted")
    assert main(["explain", str(path), "--allow", "unacted"]) == 0
    assert "every rank finished its program, but no scheduled fault acted: crash rank 1 at t=500s" in (
        capsys.readouterr().out
    )


def test_a_fault_that_never_acted_fails_the_run_unless_allowed(tmp_path, capsys) -> None:
    """It exited 0: the run passed with the fault merely listed, and CI read "survived". Now a failed check in
    the summary (FAIL), the JSON's ok, and explain's exit, as a pass a race decided is; --allow unacted accepts it."""
    import json

    from simnccl.cli import main

    path = tmp_path / "late.toml"
    path.write_text(
        '[scenario]\nname = "late"\n[cluster]\ngpu = "h100-80gb"\ngpus_per_node = 2\n[torch]\nrelease = "2.15"\n'
        '[workload]\nsteps = [{ op = "set_device" }, { op = "init_process_group" }, { op = "all_reduce" }]\n'
        '[faults]\ninject = [{ kind = "crash", rank = 1, at_s = 500 }]\n'
    )
    assert main(["run", "-q", str(path)]) == 1
    line = capsys.readouterr().out
    assert "pass  FAIL  peak " in line and "unacted: variant 'default': 1 scheduled fault never acted" in line
    assert main(["run", str(path), "--json", "-"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is False and document["summary"][0]["ok"] is False
    assert main(["explain", str(path)]) == 1
    capsys.readouterr()
    assert main(["run", "-q", str(path), "--allow", "unacted,hang"]) == 0


def test_the_order_the_classes_are_given_in_draws_nothing_else() -> None:
    """A swarm's classes are a set: ["crash", "stall", "skip"] and ["skip", "stall", "crash"] drew two schedules
    under one seed, and the header printed both as "classes=crash,skip,stall"."""
    programs = PROGRAMS
    for seed in range(20):
        one = generate(seed, programs, classes=["crash", "stall", "skip"], max_faults=3)
        other = generate(seed, programs, classes=["skip", "stall", "crash"], max_faults=3)
        assert one == other, seed


# ------------------------------------------------------------------------------- faults that could not act


def _unacted(program, *faults: Fault, **kwargs) -> list[str]:
    return simulate(program, faults=FaultSchedule(None, (), tuple(faults)), **kwargs).faults_unacted


TP01 = [*START, NewGroup(ranks=(0, 1), bind="tp"), AllReduce(group="tp")]


@pytest.mark.parametrize("kind", ["skip", "mismatch"])
def test_a_program_fault_on_a_collective_the_rank_is_not_in_never_acted(kind) -> None:
    """A skip or mismatch of a collective on a group the rank is not a member of rewrote torch's NON_GROUP_MEMBER
    no-op: the run was the run without the fault (same trace), and nothing said so."""
    assert _unacted(TP01, Fault(kind, 3, at_op=3), gpus_per_node=4) == [
        f"{kind} rank 3 at op 3: never acted (the rank is not a member of group 'tp': the collective is torch's "
        "NON_GROUP_MEMBER no-op)"
    ]
    assert _unacted(TP01, Fault(kind, 1, at_op=3), gpus_per_node=4) == [], "a member's op is rewritten"


def test_a_mismatch_on_a_group_of_one_never_acted_where_a_skip_does() -> None:
    """A group of one has no other member to disagree with on the size (the trace was the fault-free one's); a
    skip there still spares the rank the collective and its communicator, so it acted."""
    solo = [
        [*START, NewGroup(ranks=(1,), bind="solo"), *([AllReduce(group="solo")] if r == 1 else [])] for r in range(4)
    ]
    assert _unacted(solo, Fault("mismatch", 1, at_op=3), gpus_per_node=4) == [
        "mismatch rank 1 at op 3: never acted (group 'solo' has one member: no other member to disagree on the size)"
    ]
    assert _unacted(solo, Fault("skip", 1, at_op=3), gpus_per_node=4) == []


def test_a_program_fault_at_an_op_the_rank_never_reaches_never_acted() -> None:
    """The rank hung in an earlier collective (its peer crashed there): the mismatch later on was reported by
    nobody, so a run expecting the crash's error passed as if both had struck."""
    program = [*START, NewGroup(ranks=(0, 1, 2, 3), bind="tp"), AllReduce(group="tp"), AllReduce(group="tp")]
    faults = (Fault("crash", 1, at_op=3), Fault("mismatch", 2, at_op=4))
    assert _unacted(program, *faults, gpus_per_node=4) == [
        "mismatch rank 2 at op 4: never acted (the rank never reached that op)"
    ]


@pytest.mark.parametrize(
    ("program", "at_op"),
    [
        ([SetDevice(), InitProcessGroup(backend="nccl"), AllReduce()], 0),  # before the process has a communicator
        ([SetDevice(), InitProcessGroup(backend="gloo"), AllReduce(), AllReduce()], 3),  # a gloo-only world
    ],
)
def test_an_nccl_error_in_a_process_without_an_nccl_communicator_never_acts(program, at_op) -> None:
    """torch raises "NCCL Async Error" from an NCCL communicator's async error: a process with none cannot. The
    fault aborted the rank there (a gloo world's peers then lost it), a failure real torch cannot have."""
    out = simulate(program, faults=FaultSchedule(None, (), (Fault("nccl-error", 1, at_op=at_op),)))
    assert out.verdict == "pass" and out.errors == []
    assert out.faults_unacted == [
        f"nccl-error rank 1 at op {at_op}: never acted (the rank had no NCCL communicator then: no NCCL error can "
        "surface)"
    ]
    timed = simulate(program[:2], faults=FaultSchedule(None, (), (Fault("nccl-error", 1, at_s=0.0),)))
    assert timed.faults_unacted and "no NCCL communicator" in timed.faults_unacted[0]


def test_a_straggler_that_slows_nothing_never_acted() -> None:
    """A straggler rank with no local work, or a slow link no communicator spans, showed ``ops 0, extra_s 0.0``
    and passed as if the policy had survived a slow rank or link."""
    no_compute = [*START, NewGroup(ranks=(0, 1, 2, 3), bind="tp"), AllReduce(group="tp")]
    assert _unacted(no_compute, Fault("straggler", 1, factor=50.0), gpus_per_node=4) == [
        "straggler rank 1 x50 slower: never acted (the rank ran no local work it could slow)"
    ]
    assert _unacted(BODY, Fault("straggler", 1, factor=4.0), gpus_per_node=4) == [], "its compute ran slower"
    pairs = [
        [
            *START,
            NewGroup(ranks=(0, 1), bind="a"),
            NewGroup(ranks=(2, 3), bind="b"),
            AllReduce(group="a" if r < 2 else "b"),
        ]
        for r in range(4)
    ]
    assert _unacted(pairs, Fault("link-straggler", 0, factor=100.0, peer=3), gpus_per_node=4) == [
        "link-straggler link rank 0<->rank 3 x100 slower: never acted (no collective or send/recv it slowed ran "
        "over that link)"
    ]
    assert _unacted(pairs, Fault("link-straggler", 0, factor=100.0, peer=1), gpus_per_node=4) == []


def test_a_slow_link_masked_by_an_equally_slow_one_on_the_same_ring_acted() -> None:
    """Two slow links on one communicator: the op runs at the slower one's pace and its extra time is charged to
    it; the other, as slow (a tie went to the first listed) or less, was reported "never acted (no collective ...
    ran over that link)", a failed check, though the all_reduce ran over it."""
    world = [*START, AllReduce(), AllReduce()]
    links = (Fault("link-straggler", 0, factor=3.0, peer=2), Fault("link-straggler", 2, factor=3.0, peer=4))
    assert _unacted(world, *links, nodes=3, gpus_per_node=2) == []
    slower = (Fault("link-straggler", 0, factor=5.0, peer=2), Fault("link-straggler", 2, factor=2.0, peer=4))
    assert _unacted(world, *slower, nodes=3, gpus_per_node=2) == []


@pytest.mark.parametrize(
    ("op", "why"),
    [
        (AllReduce(size_bytes=0), "the collective moves 0 bytes, and twice 0 is 0: nothing to mismatch"),
        (Barrier(), "a barrier has no size a program sets"),
    ],
)
def test_a_mismatch_that_cannot_change_a_size_is_refused_at_load(tmp_path, op, why) -> None:
    """Twice 0 bytes is 0, and no program sizes a barrier: the mismatch was the run without it, and passed."""
    with pytest.raises(FaultError, match=why):
        apply_to_programs(FaultSchedule(None, (), (Fault("mismatch", 1, at_op=2),)), [Program((*START, op))] * 2)
    from simnccl.cli import main

    step = '{ op = "barrier" }' if isinstance(op, Barrier) else '{ op = "all_reduce", size_bytes = 0 }'
    path = tmp_path / "m.toml"
    path.write_text(
        '[scenario]\nname = "m"\n[cluster]\ngpu = "h100-80gb"\ngpus_per_node = 2\n[torch]\nrelease = "2.15"\n'
        f'[workload]\nsteps = [{{ op = "set_device" }}, {{ op = "init_process_group" }}, {step}]\n'
        '[faults]\ninject = [{ kind = "mismatch", rank = 1, at_op = 2 }]\n'
    )
    assert main(["run", str(path)]) == 2


def _swarm(tmp_path, faults: str):
    path = tmp_path / "swarm.toml"
    path.write_text(
        '[scenario]\nname = "swarm"\n[cluster]\ngpu = "h100-80gb"\ngpus_per_node = 2\n[torch]\nrelease = "2.15"\n'
        '[workload]\nsteps = [{ op = "set_device" }, { op = "init_process_group" }, { op = "all_reduce" }]\n'
        f"[faults]\n{faults}\n"
    )
    return path


@pytest.mark.parametrize("faults", ["seed = 1\nmax_faults = 0", "seed = 1\nclasses = []"])
def test_a_swarm_that_can_draw_nothing_is_refused(tmp_path, faults) -> None:
    """``max_faults = 0`` or ``classes = []`` ran the fault-free run as a fault run, and passed."""
    from simnccl.cli import main

    assert main(["run", str(_swarm(tmp_path, faults))]) == 2


def test_a_swarm_whose_seed_drew_nothing_never_acted_and_its_schedule_is_in_the_json(tmp_path, capsys) -> None:
    """A seed whose draw came up empty passed with no note, and the JSON had no schedule to tell it by."""
    import json

    from simnccl.cli import main
    from simnccl.scenario import load_scenario

    programs = load_scenario(_swarm(tmp_path, "seed = 0")).programs
    empty = next(s for s in range(100) if not generate(s, programs, classes=["crash"], max_faults=1).faults)
    drawn = next(s for s in range(100) if generate(s, programs, classes=["crash"], max_faults=1).faults)
    path = _swarm(tmp_path, f'seed = {empty}\nclasses = ["crash"]\nmax_faults = 1')
    assert main(["run", str(path), "--json", "-"]) == 1
    document = json.loads(capsys.readouterr().out)
    (result,) = document["results"]
    assert result["fault_schedule"] == {"seed": empty, "classes": ["crash"], "faults": []}
    (variant,) = result["variants"]
    assert variant["faults_unacted"] == [
        f"swarm seed={empty}: drew no fault: never acted (its draw of 0..1 faults from classes crash came up 0; "
        "try another --seed)"
    ]
    assert main(["run", str(path), "--seed", str(drawn), "--json", "-", "--allow", "error,hang,unacted"]) == 0
    schedule = json.loads(capsys.readouterr().out)["results"][0]["fault_schedule"]
    assert schedule["seed"] == drawn and len(schedule["faults"]) == 1 and schedule["faults"][0].startswith("crash")
