"""A team's own policy is first-class: named by import spec or entry point anywhere a built-in is named,
checked for member agreement whatever it claims, and rebuilt from a case file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import user_policies

from simnccl.ops import AllReduce, InitProcessGroup, NewGroup, SetDevice
from simnccl.policy import (
    ComposedPolicy,
    DedupePolicy,
    LazySingleRankPolicy,
    PolicyError,
    UserPolicyError,
    decides_alike_on_every_rank,
    describe_policy,
    entry_point_names,
    get_policy,
    policy_from_description,
)
from simnccl.testing import simulate
from simnccl.testing.replay import SimCase, share_identical

TESTS = Path(__file__).resolve().parent
START = [SetDevice(), InitProcessGroup(backend="nccl")]


# ---------------------------------------------------------------------- naming


def test_import_spec_names_a_class_an_instance_and_composes_with_builtins() -> None:
    assert get_policy("user_policies:LazyAbove") == user_policies.LazyAbove()
    assert get_policy("user_policies:LAZY_ABOVE_FOUR") is user_policies.LAZY_ABOVE_FOUR
    composed = get_policy("dedupe + user_policies:LazyAbove+lazy-single-rank")
    assert isinstance(composed, ComposedPolicy)
    assert composed.parts == (DedupePolicy(), user_policies.LazyAbove(), LazySingleRankPolicy())
    assert composed.name == "dedupe+lazy-above+lazy-single-rank"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:Policy", "module 'no_such_module_xyz' is not importable here"),
        ("user_policies:Missing", "has no attribute 'Missing'"),
        ("user_policies:not_a_policy", "function object has no on_group/on_init: not a policy"),
        ("user_policies:NeedsArguments", "NeedsArguments() needs arguments"),
        ("user_policies:CALLS", "list object has no on_group/on_init"),
        ("os.path:join()", "an import spec is 'package.module:Name'"),
        ("../evil.py:X", "an import spec is 'package.module:Name'"),
        ("no-such-policy", "unknown policy 'no-such-policy'"),
        ("dedupe+", "empty part"),
        ("x" * 3000, "longer than the limit"),
    ],
)
def test_bad_specs_are_refused_with_one_line(spec: str, message: str) -> None:
    with pytest.raises(PolicyError, match=None) as raised:
        get_policy(spec)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert user_policies.CALLS == []  # nothing named by a spec is ever called, only classes instantiated


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("import sys\nsys.exit(0)\n", "failed: SystemExit(0)"),
        ("class Unwind(BaseException):\n    pass\nraise Unwind('at import')\n", "failed: Unwind('at import')"),
        (
            "import sys\nfrom dataclasses import dataclass\nfrom simnccl.policy import BasePolicy\n"
            "@dataclass(frozen=True)\nclass P(BasePolicy):\n    name: str = 'p'\n"
            "    def __post_init__(self):\n        sys.exit(3)\n"
            "    def on_group(self, request, decision):\n        return decision\n",
            "P() raised SystemExit(3)",
        ),
        (  # an Exception in the constructor: the CLI once ended it as simnccl's own bug (exit 70)
            "from dataclasses import dataclass\nfrom simnccl.policy import BasePolicy\n"
            "@dataclass(frozen=True)\nclass P(BasePolicy):\n    name: str = 'p'\n"
            "    def __post_init__(self):\n        raise RuntimeError('ctor boom')\n",
            "P() raised RuntimeError('ctor boom')",
        ),
    ],
)
def test_a_policy_module_that_exits_or_raises_a_base_exception_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, message: str
) -> None:
    """``sys.exit(0)`` in a policy module once left ``simnccl run`` with exit 0 and nothing printed: a run
    that checked nothing, reported as passing. A policy's BaseException is its failure: one line, exit 2."""
    name = f"exiting_policy_{sum(map(ord, source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PolicyError) as raised:
        get_policy(f"{name}:P")
    assert message in str(raised.value) and "\n" not in str(raised.value)


FOUR = [*START, NewGroup(ranks=(0, 1, 2, 3), bind="g"), NewGroup(ranks=(0, 1, 2, 3), bind="h"), AllReduce(group="h")]


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            user_policies.ReusesOtherRanks(),
            "on_group returned reuse=(0, 1); a reuse names the call's own ranks (0, 1, 2, 3)",
        ),
        (user_policies.OptionsAsDict(), "on_group returned pg_options={'lazy_init': True}; expected a PgOptions"),
        (user_policies.ExplainedOptionsAsDict(), "returned pg_options={'lazy_init': True}; expected a PgOptions"),
        (user_policies.UnknownBackend(), "on_group returned backend='bogus-backend'; "),
    ],
)
def test_a_malformed_decision_is_the_policys_error(policy: object, message: str) -> None:
    """Each reached the engine: a reuse of other ranks was ignored there (the simulation passed; production binds
    the group it names), the others failed it as a bug in simnccl (exit 70)."""
    with pytest.raises(UserPolicyError) as raised:
        simulate(FOUR, gpus_per_node=4, policy=policy)  # type: ignore[arg-type]
    assert message in str(raised.value) and "rank 0" in str(raised.value)


def test_decision_options_outside_nccls_range_are_the_policys_error() -> None:
    """``max_ctas=-3`` (the right type) stopped the simulation on the NCCL model's error, naming no policy."""
    with pytest.raises(
        UserPolicyError, match=r"policy 'options-out-of-range': on_group returned pg_options.max_ctas=-3"
    ):
        simulate(FOUR, gpus_per_node=4, policy=user_policies.OptionsOutOfRange())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"backend": 5}, "on_init returned backend=5; expected a backend name or None"),
        ({"pg_options": None}, "on_init returned pg_options=None; expected a PgOptions"),
        ({"env": None}, "on_init returned env=None; expected a mapping"),
        ({"env": {5: "1"}}, "on_init returned env entry 5: '1'; expected variable names and values that are"),
        ({"env": {"A=B": "1"}}, "on_init returned env entry 'A=B': '1'; expected variable names"),
        (
            {"env": {"TORCH_DIST_USE_NCCL2": 0}},
            "on_init returned env entry 'TORCH_DIST_USE_NCCL2': 0; expected variable",
        ),
        ({"env": {"NCCL_FOOBAR": "1"}}, "on_init returned env entry NCCL_FOOBAR='1'; unknown environment knob"),
        ({"env": {"RANK": "7"}}, "on_init returned env entry RANK='7'; RANK is set per rank by the launcher"),
        ({"device_id": True}, "on_init returned device_id=True; expected a device index"),
    ],
)
def test_a_malformed_init_plan_is_the_policys_error(changes: dict[str, object], message: str) -> None:
    """Each reached the engine, which failed on it as a bug in simnccl, or (an env entry a scenario is refused for)
    was taken in silently: ``TORCH_DIST_USE_NCCL2 = 0`` as a number was ignored, torch's default simulated."""
    policy = user_policies.InitPlanOf(changes=tuple(changes.items()))
    with pytest.raises(UserPolicyError) as raised:
        simulate(FOUR, gpus_per_node=4, policy=policy)
    assert f"policy 'init-plan-of': {message}" in str(raised.value) and "rank 0 of 4" in str(raised.value)


def test_a_policy_class_is_taken_as_an_import_spec_takes_it() -> None:
    """A class passed the checks and then ran with its hooks unbound: the error blamed the user's on_init."""
    by_class = simulate(FOUR, gpus_per_node=4, policy=user_policies.LazyAbove)  # type: ignore[arg-type]
    by_instance = simulate(FOUR, gpus_per_node=4, policy=user_policies.LazyAbove())
    assert by_class.verdict == "pass" and by_class.trace_hash == by_instance.trace_hash


def test_a_policy_whose_name_raises_is_refused_naming_that() -> None:
    with pytest.raises(PolicyError, match=r"reading its 'name' raised RuntimeError\('name not configured'\)"):
        get_policy(user_policies.NameRaises())  # type: ignore[arg-type]


def test_a_decision_subclass_cannot_hide_members_that_disagree() -> None:
    out = simulate(FOUR, gpus_per_node=4, policy=user_policies.HidesDisagreementInKey())
    assert out.verdict == "error" and any(e["type"] == "PolicyInconsistency" for e in out.errors), out.errors


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (user_policies.HidesLazyInOptionsEquality(), "expected a PgOptions, not a subclass"),
        (user_policies.HidesGlooInBackendEquality(), "expected a backend name or None (a str, not a subclass)"),
    ],
)
def test_an_answer_whose_own_equality_hides_a_disagreement_is_the_policys_error(policy: object, message: str) -> None:
    """Found by a tester: odd ranks lazy (or on gloo) in a subclass whose ``__eq__`` is always true. The members
    "agreed", the engine applied rank 0's eager NCCL answer on every rank, and the run passed what production hangs
    on (eager on one rank, lazy on the other)."""
    with pytest.raises(UserPolicyError) as raised:
        simulate(FOUR, gpus_per_node=4, policy=policy)  # type: ignore[arg-type]
    assert message in str(raised.value)


@pytest.mark.parametrize("release", ["2.15", "2.14"])
def test_a_rank_may_name_its_own_device_as_a_cuda_string(release: str) -> None:
    """Found by a tester: ``device_id="cuda:<local rank>"`` (torch_apply hands torch ``torch.device`` of it) was a
    false AssertionError against a bound default group (the string compared with the bound index), and on legacy
    (2.14, or TORCH_DIST_USE_NCCL2=0) an internal error, exit 70."""
    group = [NewGroup(ranks=(0, 1), bind="g"), AllReduce(group="g")]
    unbound = [[SetDevice(), InitProcessGroup(backend="nccl"), *group]] * 2
    bound = [[SetDevice(), InitProcessGroup(backend="nccl", device_id=f"cuda:{r}"), *group] for r in range(2)]
    for programs in (unbound, bound) if release == "2.15" else (unbound,):  # 2.14 binds no device
        named = simulate(programs, gpus_per_node=2, release=release, policy=user_policies.BindsOwnDeviceByName())
        indexed = simulate(programs, gpus_per_node=2, release=release, policy=user_policies.BindsOwnDevice())
        assert named.verdict == indexed.verdict == "pass", named.errors
        assert named.trace_hash == indexed.trace_hash


@pytest.mark.parametrize("device", ["cuda", "cuda:01", "cpu:0"])
def test_a_device_string_torch_cannot_take_is_the_policys_error(device: str) -> None:
    """``torch.device("cuda:01")`` raises "Invalid device string" (found by a tester: it was accepted)."""
    policy = user_policies.DeviceOf(device=device)
    with pytest.raises(UserPolicyError, match=rf"device_id='{device}'; a group's device string names its CUDA device"):
        simulate(FOUR, gpus_per_node=4, policy=policy)


def test_a_policy_that_makes_a_used_group_fake_fails_where_it_communicates() -> None:
    """Found by a tester: every group ``fake`` passed (the fake backend returns at once) and ``cost`` priced the
    groups at nothing; production would run on without communicating."""
    out = simulate(FOUR, gpus_per_node=4, policy=user_policies.FakesAs())
    assert out.verdict == "error"
    assert {(e["type"], e["op"]) for e in out.errors} == {("PolicyFakeBackend", "all_reduce(group='h')")}
    assert "made group [0, 1, 2, 3] (4 ranks, asked for backend nccl) 'fake'" in out.errors[0]["message"]


@pytest.mark.parametrize("backend", ["FAKE", "cpu:fake", "cpu:fake,cuda:fake"])
def test_every_spelling_of_fake_is_caught(backend: str) -> None:
    """Found by a tester: torch lower-cases a backend name and reads a device map, so "FAKE" and "cpu:fake" make
    a fake group (real gloo: the all_reduce left the data as it was, 3 runs of 3) and passed the check."""
    gloo = [InitProcessGroup(backend="gloo"), NewGroup(ranks=(0, 1), bind="g"), AllReduce(group="g")]
    out = simulate(gloo, gpus_per_node=0, ranks_per_node=2, policy=user_policies.FakesAs(backend=backend))
    assert {e["type"] for e in out.errors} == {"PolicyFakeBackend"}, out.errors


@pytest.mark.parametrize("backend", ["fake", "FAKE"])
def test_a_policy_that_makes_the_default_group_fake_fails_where_it_communicates(backend: str) -> None:
    program = [InitProcessGroup(backend="gloo"), AllReduce()]
    out = simulate(program, gpus_per_node=0, ranks_per_node=2, policy=user_policies.FakesTheWorld(backend=backend))
    assert {e["type"] for e in out.errors} == {"PolicyFakeBackend"}, out.errors
    quiet = [InitProcessGroup(backend="gloo")]
    assert simulate(quiet, gpus_per_node=0, ranks_per_node=2, policy=user_policies.FakesTheWorld()).verdict == "pass"


def test_a_policy_may_make_an_unused_or_one_rank_group_fake() -> None:
    unused = [*START, NewGroup(ranks=(0, 1, 2, 3), bind="g"), NewGroup(ranks=(0,), bind="one"), AllReduce()]
    assert simulate(unused, gpus_per_node=4, policy=user_policies.FakesAs()).verdict == "pass"
    assert simulate(unused, gpus_per_node=4, policy="skip-single-rank").verdict == "pass"


def test_a_policy_that_makes_a_group_tagged_for_traffic_fake_fails_at_its_creation() -> None:
    """A startup may never use a group it makes for training (vLLM's TP groups): the program's ``traffic`` tag says
    it will communicate there."""
    tagged = [*START, NewGroup(ranks=(0, 1, 2, 3), bind="g", traffic="p2p")]
    out = simulate(tagged, gpus_per_node=4, policy=user_policies.FakesAs())
    assert out.verdict == "error"
    assert {(e["type"], e["op"].split("(")[0]) for e in out.errors} == {("PolicyFakeBackend", "new_group")}
    assert "tags it traffic='p2p'" in out.errors[0]["message"]
    untagged = [*START, NewGroup(ranks=(0, 1, 2, 3), bind="g", traffic="none")]
    assert simulate(untagged, gpus_per_node=4, policy=user_policies.FakesAs()).verdict == "pass"


def test_each_rank_may_name_its_own_device_but_not_only_some() -> None:
    """``device_id=local_rank`` differs on every rank by nature (it was reported as members disagreeing); whether
    a device is named must agree."""
    assert simulate(FOUR, gpus_per_node=4, policy=user_policies.BindsOwnDevice()).verdict == "pass"
    out = simulate(FOUR, gpus_per_node=4, policy=user_policies.OnlyRank0NamesADevice())
    assert out.verdict == "error" and any(e["type"] == "PolicyInconsistency" for e in out.errors), out.errors


def test_a_device_the_node_lacks_is_cudas_invalid_ordinal_on_the_rank() -> None:
    """On 2.14 (legacy, an unbound default group) the group's eager init uses the device the decision names: CUDA
    says "invalid device ordinal". The simulator's own ClusterError escaped instead, naming neither rank nor call."""
    program = [SetDevice(), InitProcessGroup(backend="nccl"), NewGroup(ranks=(0, 1), bind="g"), AllReduce(group="g")]
    out = simulate(program, gpus_per_node=2, release="2.14", policy=user_policies.DeviceTheNodeLacks())
    assert out.verdict == "error"
    assert {(e["rank"], e["type"], e["message"]) for e in out.errors} == {
        (r, "torch.AcceleratorError", "CUDA error: invalid device ordinal") for r in (0, 1)
    }
    assert all(e["op"].startswith("new_group(") for e in out.errors)


def test_ctrl_c_in_a_policy_is_not_relabelled() -> None:
    """Only the policy's own failures become policy errors: Ctrl-C still interrupts (exit 130 on the CLI)."""
    with pytest.raises(KeyboardInterrupt):
        simulate(PROGRAM, policy=user_policies.InterruptedOnGroup())  # type: ignore[arg-type]


def test_entry_point_names_an_installed_packages_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package registers ``[project.entry-points."simnccl.policies"]``; its name works like a built-in's."""
    dist_info = tmp_path / "acme_policies-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-policies\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[simnccl.policies]\nacme-lazy = user_policies:LazyAbove\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "acme-lazy" in entry_point_names()
    assert get_policy("acme-lazy") == user_policies.LazyAbove()
    assert get_policy("acme-lazy+dedupe").name == "lazy-above+dedupe"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("user_policies:ProtocolOnly", "ProtocolOnly.on_init is the Policy protocol's stub, which does nothing"),
        ("user_policies:UnnamedSubclass", "UnnamedSubclass is named 'torch-default', a built-in policy's name"),
        ("user_policies:WrongHookName", "WrongHookName overrides neither on_init nor on_group"),
    ],
)
def test_a_policy_that_would_run_as_something_else_is_refused_at_load(spec: str, message: str) -> None:
    """A subclass of the Policy protocol inherits hooks that return None (the engine crashed on them, exit 70);
    a BasePolicy subclass naming itself without @dataclass runs as 'torch-default' (reported under the
    built-in's name); one overriding no hook (``decide`` is none) ran as torch's defaults under its own name.
    Each is refused where the spec is loaded, saying what to write instead."""
    with pytest.raises(PolicyError) as raised:
        get_policy(spec)
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TORCH_DIST_USE_NCL2": "0"}, "did you mean TORCH_DIST_USE_NCCL2?"),
        ({"RANK": "1"}, "set per rank by the launcher"),
        ({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "soon"}, "expected an integer"),
        ({"NCCL_FROM_THE_FUTURE": "1"}, "name a newer one in extra_env_knobs"),
    ],
)
def test_simulate_checks_env_as_a_scenario_file_does(env: dict[str, str], message: str) -> None:
    """A misspelt knob in a test's ``simulate(env=...)`` simulated torch's default and the test passed."""
    with pytest.raises(ValueError, match=f"env: {next(iter(env))}: ") as raised:
        simulate([(SetDevice(), InitProcessGroup())] * 2, env=env)
    assert message in str(raised.value)


def test_simulate_takes_a_knob_newer_than_the_list_when_named() -> None:
    program = [(SetDevice(), InitProcessGroup())] * 2
    env = {"NCCL_FROM_THE_FUTURE": "1", "VLLM_ANYTHING": "x"}  # only torch's and NCCL's prefixes are checked
    assert simulate(program, env=env, extra_env_knobs=["NCCL_FROM_THE_FUTURE"]).verdict == "pass"


def test_a_policy_object_handed_to_simulate_is_checked_as_a_loaded_one() -> None:
    """A test's own policy object ran unchecked while its replay (rebuilt from the case file) was refused."""
    with pytest.raises(PolicyError, match="WrongHookName overrides neither on_init nor on_group"):
        simulate([(SetDevice(), InitProcessGroup())] * 2, policy=user_policies.WrongHookName())
    outcome = simulate([(SetDevice(), InitProcessGroup())] * 2, policy=user_policies.LazyAbove())
    assert outcome.verdict == "pass"


PROGRAM = [*START, NewGroup(ranks=(0, 1), bind="pair"), AllReduce(group="pair")]


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (user_policies.RaisesOnGroup(), "policy 'raises-on-group': on_group raised RuntimeError: team policy bug"),
        (user_policies.ReturnsNothing(), "policy 'returns-nothing': on_group returned None; expected a GroupDecision"),
        (user_policies.RaisesOnInit(), "policy 'raises-on-init': on_init raised KeyError: 'MASTER_ADDR'"),
        (user_policies.ExitsOnGroup(), "policy 'exits-on-group': on_group raised SystemExit: 0"),
        (
            user_policies.FlagsRank0InHistory(),
            "policy 'flags-rank0-in-history': on_group raised AttributeError: 'mappingproxy' object has no attribute "
            "'setdefault'",
        ),
        (
            user_policies.RaisesBaseExceptionOnInit(),
            "policy 'raises-base-exception-on-init': on_init raised PolicyAbort: unwind",
        ),
    ],
)
def test_a_user_policy_that_raises_or_answers_nothing_is_a_user_policy_error(policy: object, message: str) -> None:
    with pytest.raises(UserPolicyError) as raised:
        simulate(PROGRAM, policy=policy)  # type: ignore[arg-type]
    assert message in str(raised.value)
    causes, cause = [], raised.value.__cause__  # (simpy re-raises a process's exception with it as the cause)
    while cause is not None:
        causes.append(type(cause).__name__)
        cause = cause.__cause__
    own = {"RuntimeError", "KeyError", "SystemExit", "PolicyAbort", "AttributeError"}
    assert not (set(causes) - {"UserPolicyError", *own}), causes
    if "raised" in message:  # the policy's own exception is kept at the root
        assert causes[-1] in own, causes


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("user_policies:RaisesOnGroup", "user_policies.py"),  # the policy's own traceback
        ("lazy-init+user_policies:ReturnsNothing", "on_group returned None; expected a GroupDecision"),
        # a part before another: was "policy 'returns-nothing+dedupe': on_group raised AttributeError"
        ("user_policies:ReturnsNothing+dedupe", "policy 'returns-nothing': on_group returned None; expected a"),
        ("user_policies:ExitsOnGroup", "on_group raised SystemExit: 0"),  # once: exit 0, nothing printed
        ("user_policies:OsExitsOnGroup", "on_group called os._exit(0), which would have ended"),  # once: exit 0
        ("user_policies:RaisesBaseExceptionOnInit", "on_init raised PolicyAbort: unwind"),  # once: exit 1
    ],
)
def test_the_cli_exits_2_for_a_user_policy_error_with_its_traceback(tmp_path: Path, spec: str, expected: str) -> None:
    """On the command line the user's policy failing is their input (exit 2, the policy's traceback shown),
    not an internal error (exit 70, "a bug in simnccl") and not a failed check (exit 1)."""
    done = subprocess.run(
        [sys.executable, "-m", "simnccl", "cost", "--workload", "vllm", "--tp", "2", "--policy", spec],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "internal error" not in done.stderr and done.stderr.startswith("error: simnccl cost"), done.stderr
    assert expected in done.stderr


def test_scenario_toml_and_the_cli_take_an_import_spec(tmp_path: Path) -> None:
    scenario = tmp_path / "mine.toml"
    scenario.write_text(
        textwrap.dedent(
            """
            [scenario]
            name = "mine"
            policy = "user_policies:LazyAbove"
            [cluster]
            gpu = "h100-80gb"
            gpus_per_node = 4
            [torch]
            release = "2.15"
            [workload]
            steps = [
              { op = "set_device" },
              { op = "init_process_group", backend = "nccl" },
              { op = "new_group", ranks = [0, 1, 2, 3], bind = "all4" },
              { op = "checkpoint", name = "after_groups" },
            ]
            [[expect]]
            checkpoint = "after_groups"
            baseline = "after_groups"
            used_mib = 0
            """
        )
    )
    env = {"PYTHONPATH": str(TESTS), "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-m", "simnccl", "run", str(scenario), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert '"policy": "user_policies:LazyAbove"' in done.stdout
    bad = scenario.read_text().replace("user_policies:LazyAbove", "user_policies:Nope")
    scenario.write_text(bad)
    done = subprocess.run(
        [sys.executable, "-m", "simnccl", "run", str(scenario)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "has no attribute 'Nope'" in " ".join(done.stderr.split())


# ---------------------------------------------------------------------- safe by default


def test_only_builtin_types_are_decided_once_for_all_ranks() -> None:
    assert decides_alike_on_every_rank(get_policy("dedupe+budget(500)+lazy-init"))
    assert not decides_alike_on_every_rank(user_policies.LazyAbove())  # correct, but not simnccl's to vouch for
    assert not decides_alike_on_every_rank(user_policies.LastMemberLazy())  # its class attribute is ignored
    assert not decides_alike_on_every_rank(user_policies.SkewedDedupe())  # a subclass of a built-in
    assert not decides_alike_on_every_rank(get_policy("dedupe+user_policies:LazyAbove"))


@pytest.mark.parametrize("policy", [user_policies.LastMemberLazy(), get_policy("dedupe+user_policies:LastMemberLazy")])
def test_a_rank_dependent_user_policy_fails_whatever_it_claims(policy: object) -> None:
    program = [*START, NewGroup(ranks=(0, 1, 2, 3), bind="g"), AllReduce(group="g")]
    out = simulate(program, gpus_per_node=4, policy=policy)  # type: ignore[arg-type]
    assert out.verdict == "error"
    errors = [e for e in out.errors if e["type"] == "PolicyInconsistency"]
    assert errors, out.errors
    message = errors[0]["message"]
    assert "group [0, 1, 2, 3]" in message and "rank 3:" in message and "lazy_init" in message


def test_a_subclass_of_a_builtin_is_checked_too() -> None:
    program = [*START, NewGroup(ranks=(0, 1), bind="a"), NewGroup(ranks=(0, 1), bind="b"), AllReduce(group="b")]
    out = simulate(program, policy=user_policies.SkewedDedupe())
    assert any(e["type"] == "PolicyInconsistency" for e in out.errors), out.errors


def test_a_correct_user_policy_passes_on_the_checked_path() -> None:
    program = [*START, NewGroup(ranks=(0, 1, 2, 3), bind="g"), NewGroup(ranks=(0, 1), bind="p"), AllReduce(group="p")]
    out = simulate(program, gpus_per_node=4, policy="user_policies:LazyAbove")
    assert out.verdict == "pass", out.errors


# ---------------------------------------------------------------------- round trip through a case file


def test_descriptions_round_trip_builtins_user_dataclasses_and_compositions() -> None:
    assert describe_policy(get_policy("dedupe")) == "dedupe"
    assert describe_policy(get_policy("budget(500,231.1)")) == "budget(500,231.1)"
    assert describe_policy(get_policy("dedupe+lazy-init")) == "dedupe+lazy-init"
    mine = user_policies.LazyAbove(max_eager_ranks=8)
    described = describe_policy(mine)
    assert isinstance(described, dict)
    assert described["import"] == "user_policies:LazyAbove"
    assert described["fields"]["max_eager_ranks"] == 8
    assert policy_from_description(described) == mine
    composed = ComposedPolicy((DedupePolicy(), mine))
    assert policy_from_description(describe_policy(composed)) == composed


def test_a_policy_defined_in_a_function_cannot_be_recorded() -> None:
    from dataclasses import dataclass

    from simnccl.policy import BasePolicy

    @dataclass(frozen=True)
    class Local(BasePolicy):
        name: str = "local"

    with pytest.raises(PolicyError, match="defined inside a function"):
        describe_policy(Local())


def test_a_case_file_rebuilds_a_policy_from_a_module_only_the_test_session_could_import(tmp_path: Path) -> None:
    """pytest imports a test module from its folder; the replay runs elsewhere: the recorded file finds it."""
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "team_policy_mod.py").write_text(
        "from dataclasses import dataclass\nfrom simnccl.policy import BasePolicy\n\n"
        "@dataclass(frozen=True)\nclass TeamPolicy(BasePolicy):\n    name: str = 'team'\n    knob: int = 1\n\n"
        "    def on_group(self, request, decision):\n        return decision\n"
    )
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(folder)!r})
        import team_policy_mod
        from simnccl.ops import InitProcessGroup, SetDevice
        from simnccl.testing.replay import SimCase
        case = SimCase(programs=((SetDevice(), InitProcessGroup()),) * 2, policy=team_policy_mod.TeamPolicy(knob=7))
        case.dump({str(tmp_path / "case.json")!r})
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120, cwd=tmp_path)
    loaded = SimCase.load(tmp_path / "case.json")  # this process never had ``folder`` on sys.path
    assert type(loaded.policy).__name__ == "TeamPolicy" and loaded.policy.knob == 7
    assert loaded.run().verdict == "pass"


def test_case_with_a_user_policy_object_round_trips() -> None:
    programs = share_identical([[*START, NewGroup(ranks=(0, 1), bind="g")]] * 2)
    case = SimCase(programs=programs, policy=user_policies.LazyAbove(max_eager_ranks=1))
    assert SimCase.from_json(case.to_json()) == case
    namespace: dict[str, object] = {}
    exec(case.snippet().replace("print(", "_ = ("), namespace)  # the snippet rebuilds the policy too
    assert namespace["out"].verdict == case.run().verdict  # type: ignore[attr-defined]


def test_cost_takes_an_import_spec(capsys: pytest.CaptureFixture[str]) -> None:
    from simnccl.cli import main

    code = main(
        ["cost", "--workload", "vllm", "--tp", "2", "--gpu", "h100-80gb", "--policy", "user_policies:LazyAbove"]
    )
    out = capsys.readouterr().out
    assert code == 0 and "user_policies:LazyAbove" in out  # its own column, named by the spec
    assert main(["cost", "--workload", "vllm", "--tp", "2", "--policy", "user_policies:Nope"]) == 2


@pytest.mark.torch
def test_capture_simulates_under_an_import_spec() -> None:
    pytest.importorskip("torch")
    import capture_examples

    from simnccl.capture import capture

    run = capture(capture_examples.tagged_pipeline_groups, 4)
    eager = run.simulate(gpu="h100-80gb")
    lazy = run.simulate(gpu="h100-80gb", policy="user_policies:LazyAbove")  # the world group (4 ranks) turns lazy
    assert eager.verdict == lazy.verdict == "pass"
    assert lazy.ledgers["n0:cuda:0"].peak_bytes < eager.ledgers["n0:cuda:0"].peak_bytes


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_rank_dependent_policy_is_caught_on_the_fast_paths_of_a_large_startup(fast_path: bool) -> None:
    """Equal histories share the engine's work, never the check: every calling rank is still asked."""
    from simnccl.cluster import Cluster, get_gpu_kind
    from simnccl.engine import Engine, SimConfig
    from simnccl.profiles import find_profile
    from simnccl.release import get_release
    from simnccl.workloads import GENERATORS

    programs = GENERATORS["megatron"]({"tp": 2, "pp": 2, "dp": 8}, 32)
    outcomes = []
    for policy in (user_policies.LazyAbove(), user_policies.LastMemberLazy()):
        config = SimConfig(
            cluster=Cluster(get_gpu_kind("h100-80gb"), 4, 8),
            release=get_release("2.15"),
            profile=find_profile("h100-80gb", "2.15"),
            programs=programs,
            policy=policy,
        )
        outcomes.append(Engine(config, fast_path=fast_path).run())
    correct, wrong = outcomes
    assert correct.verdict == "pass", correct.errors[:1]
    assert wrong.verdict == "error"
    assert any(e["type"] == "PolicyInconsistency" for e in wrong.errors)


def test_init_plans_must_agree_except_for_each_ranks_own_device() -> None:
    program = [*START, NewGroup(ranks=(0, 1, 2, 3), bind="g"), AllReduce(group="g")]
    wrong = simulate(program, gpus_per_node=4, policy=user_policies.HalfLegacy())
    errors = [e for e in wrong.errors if e["type"] == "PolicyInconsistency"]
    assert errors and "planned init_process_group differently" in errors[0]["message"]
    assert "TORCH_DIST_USE_NCCL2=0" in errors[0]["message"]
    assert simulate(program, gpus_per_node=4, policy=user_policies.OwnDevice()).verdict == "pass"


@pytest.mark.parametrize("release", ["2.14", "2.15"])
def test_init_plans_must_agree_on_whether_a_device_is_named(release: str) -> None:
    """A policy naming a device at init on rank 0 alone: on 2.14 (legacy) rank 0 inits its communicator at once
    and the others at their first collective, and the run hung on a store timeout that named no policy. Named
    now, as a group's members' plans are (``GroupDecision.key``)."""
    program = [*START, NewGroup(ranks=(0, 1, 2, 3), bind="g"), AllReduce(group="g")]
    wrong = simulate(program, gpus_per_node=4, release=release, policy=user_policies.DeviceOnRankZero())
    errors = [e for e in wrong.errors if e["type"] == "PolicyInconsistency"]
    assert [e["rank"] for e in errors] == [1, 2, 3]  # each against rank 0's plan
    error = errors[0]
    assert "rank 0: backend=nccl, device_id=0 (rank 0 binds cuda:0)" in error["message"], error["message"]
    assert "rank 1: backend=nccl, device_id=None" in error["message"]


def test_a_policy_module_whose_exception_cannot_be_shown_is_still_bad_input(tmp_path, monkeypatch) -> None:
    """Its import raised an exception whose ``__repr__`` (and ``__str__``) raise: the message raised in its place."""
    from simnccl.policy import PolicyError, get_policy

    (tmp_path / "unshowable_policy.py").write_text(
        "class Odd(Exception):\n"
        "    def __str__(self):\n        raise RuntimeError('x')\n"
        "    def __repr__(self):\n        raise RuntimeError('x')\n"
        "raise Odd()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PolicyError, match=r"importing 'unshowable_policy' failed: <Odd whose repr\(\) raised"):
        get_policy("unshowable_policy:X")


def test_an_init_plans_environment_takes_effect() -> None:
    """The legacy policy's ``TORCH_DIST_USE_NCCL2=0`` makes the default group legacy (a change to the init gate once
    dropped the plan's env: the engine gate's 722 differing cases caught it)."""
    program = [SetDevice(), InitProcessGroup(), NewGroup(ranks=(0,), bind="c")]
    out = simulate(program, gpus_per_node=1, policy="legacy")
    assert {record.impl for record in out.groups.values()} == {"legacy"}
