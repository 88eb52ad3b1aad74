"""The strategies' coverage, pinned: whatever the draws look like (coarse choices, ``strategies._choose``), every
kind of program, cluster, release, knob and policy they could make is still made, and shrinking ends on the
simplest case.

Each test draws many examples under a fixed seed and checks that each feature shows up at least once: a
feature that can no longer be drawn fails here, instead of silently leaving the property tests blind to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, find, given, seed, settings
from hypothesis import strategies as st

from simnccl.ops import (
    WORLD,
    Barrier,
    Broadcast,
    Checkpoint,
    Collective,
    Compute,
    DestroyProcessGroup,
    InitProcessGroup,
    NewGroup,
    Recv,
    Send,
    SplitGroup,
)
from simnccl.testing import invariants as inv
from simnccl.testing import mutations, strategies
from simnccl.testing.replay import SimCase
from simnccl.testing.strategies import (
    COLLECTIVES,
    COMPUTE_SECONDS,
    ENV_KNOBS,
    GPU_KINDS,
    GROUP_TIMEOUTS_S,
    INIT_TIMEOUTS_S,
    RELEASE_KEYS,
    SAFE_TIMEOUT_S,
    SINGLE_POLICIES,
    SIZES_BYTES,
    STRAGGLER_BUDGET_S,
    Use,
    _choose,
    _index,
    cases,
    draw_layout,
    draw_mesh_shape,
    layouts,
    mesh_shapes,
    mutants,
    policies,
)

EXAMPLES = 1500


def _drawn(strategy: st.SearchStrategy[Any], count: int = EXAMPLES, at: int = 0) -> list[Any]:
    """``count`` examples of ``strategy`` under a fixed seed (hypothesis' generate phase only)."""
    out: list[Any] = []

    @seed(at)
    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        derandomize=False,
        phases=["generate"],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(example: Any) -> None:
        out.append(example)

    collect()
    return out


def _missing(wanted: set[Any], seen: set[Any]) -> set[Any]:
    return wanted - seen


@pytest.fixture(scope="module")
def drawn_cases() -> list[SimCase]:
    return _drawn(cases())


def test_every_cluster_shape_gpu_kind_release_and_knob_value_is_drawn(drawn_cases: list[SimCase]) -> None:
    shapes = {(c.nodes, c.gpus_per_node) for c in drawn_cases}
    assert not _missing({(1, n) for n in range(1, 9)} | {(2, n) for n in range(1, 5)}, shapes)
    assert not _missing(set(GPU_KINDS), {c.gpu for c in drawn_cases})
    assert not _missing(set(RELEASE_KEYS), {c.release for c in drawn_cases})
    knobs = {(k, dict(c.env).get(k)) for c in drawn_cases for k in ENV_KNOBS}
    assert not _missing({(k, v) for k, values in ENV_KNOBS.items() for v in (None, *values)}, knobs)
    assert any(not c.env for c in drawn_cases) and any(len(c.env) == len(ENV_KNOBS) for c in drawn_cases)


def test_every_single_policy_and_compositions_of_two_and_three_parts_are_drawn(drawn_cases: list[SimCase]) -> None:
    specs = [c.policy for c in drawn_cases]
    assert not _missing(set(SINGLE_POLICIES), set(specs))
    parts = {len(s.split("+")) for s in specs}
    assert parts == {1, 2, 3}
    for spec in specs:  # no policy composed with itself (or two budgets)
        kinds = [p.split("(")[0] for p in spec.split("+")]
        assert len(kinds) == len(set(kinds)), spec
    assert not _missing(set(SINGLE_POLICIES), {p for s in specs for p in s.split("+")[1:]})


def test_custom_policies_are_drawn_alone_and_composed() -> None:
    mine = ("acme-a", "acme-b")
    drawn = _drawn(policies(custom=mine, builtins=False), 300)
    assert set(drawn) == {"acme-a", "acme-b", "acme-a+acme-b", "acme-b+acme-a"}


def _families(case: SimCase) -> list[tuple[str, str, tuple[tuple[int, ...], ...]]]:
    """(handle, purpose, parts) of each family, in creation order, read off rank 0's program."""
    out: dict[str, tuple[str, list[tuple[int, ...]]]] = {}
    for op in case.programs[0]:
        if isinstance(op, NewGroup):
            out.setdefault(op.bind, (op.purpose, []))[1].append(op.ranks)
    return [(handle, purpose, tuple(parts)) for handle, (purpose, parts) in out.items()]


def test_every_group_family_kind_is_drawn(drawn_cases: list[SimCase]) -> None:
    """tp/pp/dp/ep/cp mesh partitions, pairs, singletons, the world, colour splits, and duplicates."""
    purposes: set[str] = set()
    pairs = duplicate = colour_split_of_several = False
    counts = set()
    for case in drawn_cases:
        families = _families(case)
        counts.add(len(families))
        for i, (_, purpose, parts) in enumerate(families):
            purposes.add(purpose)
            world = case.world_size
            pairs |= world > 2 and parts == tuple(tuple(range(r, min(r + 2, world))) for r in range(0, world, 2))
            duplicate |= any(parts == earlier[2] and purpose == earlier[1] for earlier in families[:i])
            colour_split_of_several |= purpose == "custom" and 1 < len(parts) < world
    assert not _missing({"tp", "pp", "dp", "ep", "cp", "single", "world", "custom"}, purposes)
    assert pairs and duplicate and colour_split_of_several
    assert not _missing(set(range(6)), counts)


def test_nearly_every_case_makes_a_group(drawn_cases: list[SimCase]) -> None:
    """A program with no new_group tests no group-creation policy, yet counted as an example passed: a third of
    the draws were such programs. Now nearly none (no family stays drawable: see the test above)."""
    groupless = sum(not any(isinstance(op, NewGroup) for op in c.programs[0]) for c in drawn_cases)
    assert groupless <= len(drawn_cases) // 20, f"{groupless} of {len(drawn_cases)} cases make no group"


def test_split_group_is_drawn_and_its_children_used_and_destroyed(drawn_cases: list[SimCase]) -> None:
    """cases() never drew ``split_group``, so a user's policy that mishandles splits was never exercised. Now a
    share of programs split the world or a family after the parent's first collective (torch requires it
    initialized) and later run collectives on the children; some split leaving non-members, with ranks out of
    order, and some destroy a child."""
    split = child_used = destroyed = 0
    parents: set[bool] = set()
    non_members = reordered = False
    for case in drawn_cases:
        children: set[str] = set()
        used = False
        for op in case.programs[0]:
            if isinstance(op, SplitGroup):
                children.add(op.bind)
                parents.add(op.parent == WORLD)
                whole = op.parent == WORLD and len(op.split_ranks) == 1
                non_members |= whole and len(op.split_ranks[0]) < case.world_size
                reordered |= any(list(s) != sorted(s) for s in op.split_ranks)
            elif isinstance(op, Collective) and op.group in children:
                used = True
            elif isinstance(op, DestroyProcessGroup) and op.group in children:
                destroyed += 1
        split += bool(children)
        child_used += used
    assert split > len(drawn_cases) // 6, f"{split} of {len(drawn_cases)} cases split"
    assert child_used > len(drawn_cases) // 20, f"{child_used} of {len(drawn_cases)} cases use a split child"
    assert parents == {True, False} and non_members and reordered and destroyed


def _destroy_patterns(case: SimCase) -> tuple[bool, bool]:
    """Whether any rank's program (1) destroys a handle whose members another live handle of that rank has, and
    (2) makes a group again with the members of one it destroyed before. Members are global ranks, sorted."""
    one_of_two = recreated = False
    for rank, program in enumerate(case.programs):
        live: dict[str, tuple[int, ...]] = {WORLD: tuple(range(case.world_size))}
        gone: set[tuple[int, ...]] = set()
        for op in program:
            members: tuple[int, ...] | None = None
            if isinstance(op, NewGroup) and op.ranks is not None and rank in op.ranks:
                members = tuple(sorted(op.ranks))
            elif isinstance(op, SplitGroup) and op.parent in live:
                parent = live[op.parent]
                mine = next((s for s in op.split_ranks if parent.index(rank) in s), None)
                members = None if mine is None else tuple(sorted(parent[i] for i in mine))
            elif isinstance(op, DestroyProcessGroup) and op.group in live:
                members = live.pop(op.group)
                one_of_two |= members in live.values()
                gone.add(members)
                continue
            if members is not None and getattr(op, "bind", None):
                recreated |= members in gone
                live[op.bind] = members
    return one_of_two, recreated


def test_destroy_then_recreate_and_destroying_one_of_two_equal_handles_are_drawn(
    drawn_cases: list[SimCase],
) -> None:
    """Both patterns were kept out of every user's programs because the built-in ``dedupe`` mishandled them (it
    reused a destroyed group, and destroyed a group another handle still had): a failure that vanished from
    every suite using ``cases()``. They are drawn now; ``dedupe`` handles both (destroy-then-recreate with ranks
    outside the group is its documented PolicyInconsistency)."""
    found = [_destroy_patterns(c) for c in drawn_cases]
    assert any(one for one, _ in found), "no case destroys one of two handles with the same members"
    assert any(again for _, again in found), "no case makes a destroyed group's members again"


def _timing_drawn(drawn: list[SimCase]) -> tuple[set[float | None], set[float | None], set[float]]:
    """The group timeouts, init timeouts and straggler computes of ``drawn``, each compute checked to be
    followed by the barrier its peers wait for it at."""
    group_timeouts = {op.timeout_s for c in drawn for op in c.programs[0] if isinstance(op, NewGroup)}
    init_timeouts = {op.timeout_s for c in drawn for op in c.programs[0] if isinstance(op, InitProcessGroup)}
    seconds: set[float] = set()
    for case in drawn:
        for program in case.programs:
            for i, op in enumerate(program):
                if isinstance(op, Compute):
                    seconds.add(op.seconds)
                    assert isinstance(program[i + 1], Barrier), case.snippet()
    return group_timeouts, init_timeouts, seconds


def test_default_cases_draw_timeouts_and_stragglers_that_never_fire(drawn_cases: list[SimCase]) -> None:
    """A program whose own timeouts fire fails under any policy, so it is no counterexample to a user's
    policy, yet about 1 in 100 default draws timed out and a user's ``passes`` failed on it. Default draws
    still carry timeouts and stragglers, but only timeouts no wait can reach: ``may_time_out`` is false for
    every one, also where many uses leave room for many stragglers."""
    group_timeouts, init_timeouts, seconds = _timing_drawn(drawn_cases)
    assert group_timeouts == {None, *(t for t in GROUP_TIMEOUTS_S if t >= SAFE_TIMEOUT_S)}
    assert init_timeouts == {None, *(t for t in INIT_TIMEOUTS_S if t >= SAFE_TIMEOUT_S)}
    assert seconds == set(COMPUTE_SECONDS)
    assert not [c.snippet() for c in drawn_cases if inv.may_time_out(c.programs)][:1]
    long = _drawn(cases(max_uses=60, max_ops=150), 300)
    assert not [c.snippet() for c in long if inv.may_time_out(c.programs)][:1]


def _last_option(strategy: st.SearchStrategy[int]) -> int:
    """A stand-in for hypothesis' ``draw`` that takes every choice's last option (the layout draws only
    integers, through ``_int``)."""
    return next(high for (_, high), known in strategies._INTS.items() if known is strategy)


def test_a_default_layout_of_nothing_but_stragglers_stops_at_the_budget() -> None:
    """Every choice its last option: every use a 45 s straggler, sixty of them. Drawn at random, a program
    rarely has more than three, so the budget is pinned here: by default the computes stop at
    ``STRAGGLER_BUDGET_S`` and no timeout is within their reach; with ``timeouts_may_fire`` they do not stop."""
    capped = draw_layout(_last_option, 8, max_uses=60, max_ops=150)
    computes = [s.seconds for s in capped.steps if isinstance(s, Use) and s.kind == "compute"]
    assert sum(computes) == STRAGGLER_BUDGET_S and set(computes) == {max(COMPUTE_SECONDS)}
    assert not inv.may_time_out(capped.render())
    free = draw_layout(_last_option, 8, max_uses=60, max_ops=150, timeouts_may_fire=True)
    assert sum(s.seconds for s in free.steps if isinstance(s, Use) and s.kind == "compute") > STRAGGLER_BUDGET_S
    assert inv.may_time_out(free.render())


def test_timeouts_may_fire_draws_short_timeouts_and_some_fire() -> None:
    """``cases(timeouts_may_fire=True)`` (simnccl's own property tests) draws every group and init timeout,
    short ones included, most programs still cannot time out, and some drawn timeouts fire (a short group
    timeout that never fired went unseen by thousands of generated cases that drew neither)."""
    drawn = _drawn(cases(timeouts_may_fire=True), 800)
    group_timeouts, init_timeouts, seconds = _timing_drawn(drawn)
    assert group_timeouts == {None, *GROUP_TIMEOUTS_S} and init_timeouts == {None, *INIT_TIMEOUTS_S}
    assert seconds == set(COMPUTE_SECONDS)
    timed = [c for c in drawn if inv.may_time_out(c.programs)]
    assert len(timed) < len(drawn) // 3
    assert any(c.run().verdict != "pass" for c in timed)


def test_timeouts_may_fire_without_timing_is_refused() -> None:
    from hypothesis.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="timeouts_may_fire"):
        _drawn(cases(timing=False, timeouts_may_fire=True), 1)


def test_every_mesh_shape_of_a_world_is_drawn() -> None:
    shapes = _drawn(st.composite(lambda draw: draw_mesh_shape(draw, 12))(), 400)
    assert set(shapes) == set(mesh_shapes(12))
    assert len(mesh_shapes(12)) == 18 and all(o * m * i == 12 for o, m, i in mesh_shapes(12))


def test_every_use_kind_size_handle_and_checkpoint_label_is_drawn(drawn_cases: list[SimCase]) -> None:
    collectives: set[tuple[str, int, bool]] = set()
    labels: set[str] = set()
    p2p_on: set[bool] = set()
    warmed_before_p2p = False
    for case in drawn_cases:
        for program in case.programs:
            for i, op in enumerate(program):
                if isinstance(op, Collective):
                    collectives.add((op.name, op.size_bytes, op.group == WORLD))
                elif isinstance(op, Checkpoint):
                    labels.add(op.label)
                elif isinstance(op, Send | Recv):
                    p2p_on.add(op.group == WORLD)
                    warmed_before_p2p |= any(isinstance(o, Barrier) and o.group == op.group for o in program[:i])
    for name in COLLECTIVES:
        for size in (4,) if name == "barrier" else SIZES_BYTES:
            on = (True,) if name == "broadcast" else (True, False)
            assert not _missing({(name, size, world) for world in on}, collectives), (name, size)
    assert not any(name == Broadcast.name and not world for name, _, world in collectives)
    assert not _missing({"init", "groups", "end", "c0", "c1", "c2", "c3"}, labels)
    assert p2p_on == {True, False} and warmed_before_p2p


def test_traffic_annotations_are_drawn_on_and_off(drawn_cases: list[SimCase]) -> None:
    traffic = {op.traffic for c in drawn_cases for op in c.programs[0] if isinstance(op, NewGroup)}
    # never "p2p": a handle's first use is a collective (``first_use_is_collective`` warms it with a barrier)
    assert traffic == {None, "collectives", "none"}


def test_programs_reach_the_op_limit_and_the_empty_program(drawn_cases: list[SimCase]) -> None:
    sizes = {c.ops_per_rank() for c in drawn_cases}
    assert 30 in sizes and 5 in sizes  # prologue (3) + groups + end checkpoints: no family, no use


def test_layout_options_are_honoured() -> None:
    drawn = _drawn(layouts(8, max_ops=40, min_families=2, max_families=3, p2p=False, use_all=True), 200)
    assert {len(x.families) for x in drawn} == {2, 3}
    assert not any(isinstance(s, Use) and s.kind == "p2p" for x in drawn for s in x.steps)
    assert all(max(len(p) for p in x.render()) <= 40 for x in drawn)


def test_every_mutation_kind_is_drawn() -> None:
    drawn = _drawn(mutants(), 300)
    assert {m.kind for _, m in drawn} == set(mutations.KINDS)


@pytest.mark.parametrize(
    ("condition", "simplest"),
    [
        (lambda c: True, "one rank of the first GPU kind, the first release, no knobs, torch's default policy"),
        (lambda c: c.world_size >= 4 and any(isinstance(op, Send) for op in c.programs[0] + c.programs[1]), "p2p"),
    ],
    ids=["anything", "a-send"],
)
def test_shrinking_ends_on_the_simplest_case(condition: Callable[[SimCase], bool], simplest: str) -> None:
    found = find(cases(), condition, settings=settings(database=None, max_examples=2000, derandomize=True))
    if simplest == "p2p":
        # the fewest ranks and steps that still hold a send: a 4-rank world, a warm-up barrier, one pair
        assert found.world_size == 4 and found.nodes == 1
        ops = [op for op in found.programs[0] if not isinstance(op, Checkpoint)]
        assert [type(op).__name__ for op in ops][-2:] == ["Barrier", "Send"]
        assert found.policy == SINGLE_POLICIES[0] and not found.env
        return
    assert (found.world_size, found.gpu, found.release, found.env, found.policy) == (
        1,
        GPU_KINDS[0],
        RELEASE_KEYS[0],
        (),
        SINGLE_POLICIES[0],
    )
    # One group of the one rank, not none: the simplest family count is one, since all-zero choices are also how
    # hypothesis completes a share of its early examples, and a zero meaning "no group" kept those groupless.
    assert _families(found) == [("tp0", "tp", ((0,),))]
    assert not any(isinstance(op, Collective | Compute) or getattr(op, "timeout_s", None) for op in found.programs[0])


def test_a_choice_among_more_options_than_one_draw_holds_reaches_every_option() -> None:
    """Past ``_RADIX`` options, a choice is drawn as several digits: every option is still reachable, and
    several small decisions packed into one choice each cover their whole range."""
    assert set(_drawn(st.composite(lambda draw: _index(draw, 300))(), 2000)) == set(range(300))
    packed = _drawn(st.composite(lambda draw: _choose(draw, 3, 5, 7, 11))(), 800)
    assert all(len({p[i] for p in packed}) == n for i, n in enumerate((3, 5, 7, 11)))


def test_cluster_shapes_keep_the_world_bounds_a_test_states() -> None:
    """``max_world=3`` drew 2 x 2 = 4 ranks and ``min_world=12`` one node of 12 GPUs: the bounds hold now, and
    bounds no cluster meets are refused."""
    from hypothesis.errors import InvalidArgument

    from simnccl.testing.strategies import _node_shapes

    every = {(n, g) for n in (1, 2) for g in range(1, 9)}
    for low in range(1, 17):
        for high in range(low, 17):
            possible = {(n, g) for n, g in every if low <= n * g <= high}
            if not possible:  # an odd world above 8 on at most two nodes
                with pytest.raises(InvalidArgument):
                    _node_shapes(low, high)
                continue
            assert set(_node_shapes(low, high)) == possible
    assert [n * g for n, g in _node_shapes(3, 3)] == [3]
    assert _node_shapes(1, 8) == tuple((1, g) for g in range(1, 9)) + tuple((2, g) for g in range(1, 5))
    for low, high in ((5, 2), (17, 20), (0, 0), (2, "8")):
        with pytest.raises(InvalidArgument):
            _node_shapes(low, high)  # type: ignore[arg-type]
    # a bound above what any cluster reaches: it drew at most 16 ranks, silently, where a test asked for 10**6
    for high in (17, 32, 10**6):
        with pytest.raises(InvalidArgument, match=f"max_world={high}: clusters are 1-2 nodes of 1-8 GPUs"):
            _node_shapes(1, high)


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        (lambda: cases(max_ops=1), "cases(): max_ops=1 is too few for a program with 1 family: at least 6"),
        # room for no group: only group-free programs, which every policy passes
        (lambda: cases(max_ops=5), "cases(): max_ops=5 is too few for a program with 1 family: at least 6"),
        (lambda: cases(max_ops=10, min_families=6), "max_ops=10 is too few for a program with 6 families: at least 11"),
        (lambda: cases(min_families=3, max_families=1), "cases(): min_families=3 > max_families=1"),
        (lambda: cases(max_uses=-1), "cases(): max_uses: expected an integer >= 0, got -1"),
        (lambda: layouts(0), "cases(): world: expected an integer >= 1, got 0"),
        (lambda: policies(max_parts=0), "policies(max_parts=...): expected an integer >= 1, got 0"),
        (lambda: policies(max_parts=2.5), "policies(max_parts=...): expected an integer >= 1, got 2.5"),
        (lambda: strategies.envs(knobs=["NCCL_NVLS_ENABLE"]), "envs(knobs=...): expected a list of the knobs"),
        (lambda: strategies.envs(knobs="TORCH_DIST_USE_NCCL2"), "got 'TORCH_DIST_USE_NCCL2'"),
        (lambda: cases(env="x"), "cases(env=...): expected a dict of strings"),
        (lambda: mutants("skip_new_group", max_world=1), "needs a world of at least 2 ranks; max_world=1"),
    ],
)
def test_a_bound_a_strategy_cannot_keep_is_refused(strategy: Callable[[], Any], message: str) -> None:
    """Each was overridden silently (``max_ops=1`` drew five-op programs, ``min_families > max_families`` raised
    the max, ``max_parts=0`` drew one part) or crashed (KeyError, AttributeError, hypothesis' Unsatisfiable)."""
    from hypothesis.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as raised:
        _drawn(strategy(), 1)
    assert message in str(raised.value)


def test_a_gpu_kind_simnccl_does_not_know_is_refused_when_drawn() -> None:
    with pytest.raises(ValueError, match="h100"):
        _drawn(strategies.clusters(gpu="h100"), 1)


def test_a_mutant_raises_a_minimum_world_below_what_its_mutation_needs() -> None:
    drawn = _drawn(mutants("skip_new_group", min_world=1, max_world=2), 20)
    assert drawn and all(case.world_size == 2 for case, _mutation in drawn)


def test_drawing_cases_keeps_no_growing_heap_behind() -> None:
    """The use menus were cached 4,096 deep, and a menu is a tuple per (target, kind, size): a 2,000-case property
    run kept 234,000 tuples alive, which every full collection of the cyclic GC then walked (the property
    benchmark's simulations ran 12% slower beside them). A menu is reused within one example only, so a few are
    kept: a second batch of cases leaves the heap as the first left it, give or take hypothesis' own."""
    import gc

    def heap_after(at: int) -> int:
        _drawn(cases(min_world=8, max_world=8), 300, at)
        gc.collect()
        return len(gc.get_objects())

    heap_after(1)
    first = heap_after(2)
    assert heap_after(3) - first < 10_000
