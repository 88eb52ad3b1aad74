"""ACME's policy, proven with simnccl: generated startups on generated clusters, releases and env knobs."""

import pytest
from hypothesis import given, settings
from policies import CappedEager, TightRanksLazy

from simnccl.ops import AllReduce, InitProcessGroup, NewGroup, SetDevice
from simnccl.testing import GrowingProgram
from simnccl.testing import invariants as inv
from simnccl.testing.strategies import cases, policies

MANY = settings(max_examples=400)


@MANY
@given(case=cases(policy=CappedEager()))
def test_capped_eager_keeps_every_startup_alive(case):
    out = case.run()
    assert (v := inv.passes(out)), v.explanation
    assert (v := inv.within_capacity(out)), v.explanation


@MANY
@given(case=cases(policy=policies(custom=[CappedEager(max_eager=1)])))
def test_capped_eager_composes_with_the_builtins(case):
    assert (v := inv.passes(case.run())), v.explanation


@MANY
@given(case=cases(policy=CappedEager(max_eager=0), min_world=2))
def test_with_every_group_lazy_startups_still_pass(case):
    out = case.run()
    assert (v := inv.passes(out)), v.explanation


def test_the_fourth_group_is_lazy(simnccl_simulate):
    start = [SetDevice(), InitProcessGroup(backend="nccl")]
    groups = [NewGroup(ranks=(0, 1), bind=f"g{i}") for i in range(4)]
    out = simnccl_simulate([*start, *groups, AllReduce(group="g3")], policy=CappedEager())
    assert out.verdict == "pass"
    assert [g.options.lazy_init for g in out.ranks[0].groups] == [False, False, False, False, True]  # world first


class CappedEagerGrows(GrowingProgram):
    def draw_policy(self, data):
        return CappedEager()


CappedEagerGrows.TestCase.settings = settings(max_examples=40, stateful_step_count=8)
TestCappedEagerGrows = CappedEagerGrows.TestCase


@pytest.mark.demo_failure
@given(case=cases(policy=TightRanksLazy(), min_world=2))
def test_tight_ranks_lazy_is_caught(case):
    assert (v := inv.passes(case.run())), v.explanation
