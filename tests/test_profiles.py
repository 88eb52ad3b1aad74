"""Profiles: every built-in loads and reproduces its source's arithmetic; bad files name file and key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import simnccl.profiles as profiles_module
from simnccl.cluster import get_gpu_kind, gpu_kinds
from simnccl.profiles import (
    CommCosts,
    ProfileError,
    builtin_profiles,
    find_profile,
    get_profile,
    load_profile,
)
from simnccl.release import RELEASES

H100_CALIBRATION = "h100-96gb-torch2.15-dev"

# ---------------------------------------------------------------------------------------- built-ins


def test_every_builtin_loads_and_is_named_after_its_file() -> None:
    profiles = builtin_profiles()
    assert len(profiles) >= 7
    for name, profile in profiles.items():
        assert profile.name == name
        assert Path(profile.path).name == f"{name}.toml"
        assert Path(profile.path).is_file()
        assert profile.gpu in gpu_kinds()
        assert profile.gpu_kind.key == profile.gpu
        assert set(profile.releases) <= set(RELEASES)
        assert profile.source and profile.measured


def test_every_gpu_kind_has_exactly_one_profile_per_release() -> None:
    profiles = builtin_profiles().values()
    for kind in gpu_kinds():
        for release in RELEASES:
            matches = [p.name for p in profiles if p.gpu == kind and release in p.releases]
            assert len(matches) == 1, (kind, release, matches)
            assert find_profile(kind, release).name == matches[0]


def test_the_named_profiles_cover_their_briefed_releases() -> None:
    assert set(get_profile(H100_CALIBRATION).releases) == {"2.15", "2.15-dev", "2.15a0"}
    assert get_profile("h100-96gb-torch2.14").releases == ("2.14",)
    assert get_profile("gb200-torch2.16-dev").releases == ("2.16-dev",)
    assert {"2.14", "2.15", "2.15-dev", "2.15a0"} <= set(get_profile("rtx3060-sglang35538").releases)


def test_pytorch_199957_arithmetic() -> None:
    profile = find_profile("h100-96gb", "2.15-dev")
    assert profile.name == H100_CALIBRATION
    comm = profile.comm
    context = get_gpu_kind("h100-96gb").cuda_context_mib
    # 9 eager nccl2 groups: +2080 MiB; with NCCL_COMM_SPLIT_SHARE_RESOURCES=1: +1188 MiB.
    assert 9 * comm.init_mib == pytest.approx(2080, rel=1e-2)
    assert 9 * comm.split_shared_init_mib == pytest.approx(1188, rel=1e-2)
    # After one all_reduce on each of the 10 groups (world + 9): 4672 MiB per GPU, nccl2 and legacy alike.
    assert context + 10 * (comm.init_mib + comm.first_collective_mib) == pytest.approx(4672, rel=1e-2)


def test_the_h100_literals_agree_to_four_decimals() -> None:
    comm = get_profile(H100_CALIBRATION).comm
    context = get_gpu_kind("h100-96gb").cuda_context_mib
    assert comm.init_mib == pytest.approx(2080 / 9, abs=1e-4)
    assert comm.first_collective_mib == pytest.approx((4672 - context - 10 * 2080 / 9) / 10, abs=1e-4)


@pytest.mark.parametrize(
    "name",
    [
        "h100-96gb-torch2.14",
        "h100-96gb-torch2.16-dev-extrapolated",
        "h100-80gb-extrapolated",
        "h200-141gb-extrapolated",
    ],
)
def test_profiles_reusing_the_h100_calibration_carry_the_same_costs(name: str) -> None:
    assert get_profile(name).comm == get_profile(H100_CALIBRATION).comm


def test_gb200_is_197_mib_per_group_on_2_16_dev() -> None:
    profile = find_profile("gb200", "2.16-dev")
    assert profile.comm.init_mib == pytest.approx(197, rel=1e-2)
    assert find_profile("gb200", "2.15").comm == profile.comm


def test_rtx3060_reproduces_sglang_35538() -> None:
    profile = find_profile("rtx3060-12gb", "2.15")
    comm = profile.comm
    assert comm.single_rank_init_mib == 388
    # The world group cost +470: the per-process overhead plus one 1-rank communicator.
    assert comm.process_first_comm_mib + comm.single_rank_init_mib == 470
    assert get_gpu_kind("rtx3060-12gb").cuda_context_mib == 114


def test_rtx3060_with_one_channel_costs_10_mib_per_group() -> None:
    costs = get_profile("rtx3060-sglang35538").costs_for_env({"NCCL_MAX_NCHANNELS": "1"})
    assert costs.init_mib == 10.0
    assert costs.default_nchannels == 1


def test_a100_pair_group_is_544_mib_after_its_first_all_reduce() -> None:
    comm = find_profile("a100-80gb", "2.15").comm
    assert comm.init_mib + comm.first_collective_mib == pytest.approx(544, abs=1e-3)


def test_extrapolated_profiles_say_so() -> None:
    for profile in builtin_profiles().values():
        if profile.name.endswith("-extrapolated"):
            assert "EXTRAPOLATED" in profile.source, profile.name


def test_builtin_profiles_returns_a_copy() -> None:
    builtin_profiles().clear()
    assert H100_CALIBRATION in builtin_profiles()


# ------------------------------------------------------------------------------------ costs_for_env


def test_no_cap_means_unchanged_costs() -> None:
    profile = get_profile(H100_CALIBRATION)
    assert profile.costs_for_env({}) is profile.comm
    assert profile.costs_for_env({"NCCL_DEBUG": "INFO"}) is profile.comm


def test_cap_scales_every_cost_linearly() -> None:
    profile = get_profile(H100_CALIBRATION)
    comm = profile.comm
    costs = profile.costs_for_env({"NCCL_MAX_NCHANNELS": "4"})
    factor = 4 / comm.default_nchannels
    assert costs.init_mib == pytest.approx(comm.init_mib * factor)
    assert costs.first_collective_mib == pytest.approx(comm.first_collective_mib * factor)
    assert costs.split_shared_init_mib == pytest.approx(comm.split_shared_init_mib * factor)
    assert costs.split_shared_first_collective_mib == pytest.approx(comm.split_shared_first_collective_mib * factor)
    assert costs.p2p_pair_mib == pytest.approx(comm.p2p_pair_mib * factor)
    assert costs.single_rank_init_mib == pytest.approx(comm.single_rank_init_mib * factor)
    assert costs.default_nchannels == 4


def test_cap_above_the_default_changes_nothing() -> None:
    profile = get_profile(H100_CALIBRATION)
    assert profile.costs_for_env({"NCCL_MAX_NCHANNELS": "64"}) == profile.comm


def test_measured_figure_applies_only_at_its_own_cap() -> None:
    profile = get_profile("rtx3060-sglang35538")
    comm = profile.comm
    at_one = profile.costs_for_env({"NCCL_MAX_NCHANNELS": "1"})
    # The measured value (taken on single-rank groups) replaces both init figures; the rest scale by 1/default.
    assert at_one.init_mib == pytest.approx(10.0)
    assert at_one.single_rank_init_mib == pytest.approx(10.0)
    assert at_one.first_collective_mib == pytest.approx(comm.first_collective_mib / comm.default_nchannels)
    at_two = profile.costs_for_env({"NCCL_MAX_NCHANNELS": "2"})
    assert at_two.init_mib == pytest.approx(comm.init_mib * 2 / comm.default_nchannels)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "", "1.5", "²"])
def test_invalid_cap_is_an_error_naming_file_and_variable(value: str) -> None:
    profile = get_profile(H100_CALIBRATION)
    with pytest.raises(ProfileError) as err:
        profile.costs_for_env({"NCCL_MAX_NCHANNELS": value})
    assert profile.path in str(err.value)
    assert "NCCL_MAX_NCHANNELS" in str(err.value)


# -------------------------------------------------------------------------------------------- loader

VALID = """
name = "test-profile"
gpu = "h100-96gb"
torch_build = "2.15.0"
releases = ["2.15"]
nccl_version = "2.30.7"
source = "a test"
measured = "nothing"

[comm]
init_mib = 100.0
first_collective_mib = 50
split_shared_init_mib = 0.0
split_shared_first_collective_mib = 0.0
p2p_pair_mib = 0.0
single_rank_init_mib = 0.0
process_first_comm_mib = 0.0
default_nchannels = 8
init_mib_at_max_nchannels = { 2 = 30.0 }

[timing]
comm_init_s = 0.1
split_s = 0.1
nocolor_split_s = 0.01
collective_latency_s = 1e-5
bus_bandwidth_gbps = 100.0
p2p_latency_s = 1e-5
cuda_context_s = 0.5

[derivation]
init_mib = "made up"
first_collective_mib = "made up"
default_nchannels = "made up"
init_mib_at_max_nchannels = "made up"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "custom.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_valid_file_loads(tmp_path: Path) -> None:
    path = _write(tmp_path, VALID)
    profile = load_profile(path)
    assert profile.path == str(path)
    assert profile.comm == CommCosts(100.0, 50.0, 0.0, 0.0, 0.0, 0.0, 0.0, 8, {2: 30.0})
    assert isinstance(profile.comm.first_collective_mib, float)
    assert profile.releases == ("2.15",)
    assert profile.costs_for_env({"NCCL_MAX_NCHANNELS": "2"}).init_mib == 30.0
    assert get_profile(str(path)) == profile


def test_profiles_are_frozen(tmp_path: Path) -> None:
    profile = load_profile(_write(tmp_path, VALID))
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        # unknown keys
        ('measured = "nothing"', 'measured = "nothing"\ncolour = "blue"', "colour"),
        ("init_mib = 100.0", "init_mib = 100.0\nnvls_mib = 5.0", "comm.nvls_mib"),
        ('init_mib = "made up"', 'init_mib = "made up"\nhunch = "x"', "derivation.hunch"),
        # missing keys
        ('nccl_version = "2.30.7"\n', "", "nccl_version"),
        ("p2p_pair_mib = 0.0\n", "", "comm.p2p_pair_mib"),
        ("cuda_context_s = 0.5\n", "", "timing.cuda_context_s"),
        ('first_collective_mib = "made up"\n', "", "derivation.first_collective_mib"),
        ('default_nchannels = "made up"\n', "", "derivation.default_nchannels"),
        ('init_mib_at_max_nchannels = "made up"\n', "", "derivation.init_mib_at_max_nchannels"),
        # wrong types
        ("init_mib = 100.0", 'init_mib = "100"', "comm.init_mib"),
        ("default_nchannels = 8", "default_nchannels = 8.0", "comm.default_nchannels"),
        ("default_nchannels = 8", "default_nchannels = true", "comm.default_nchannels"),
        ('releases = ["2.15"]', 'releases = "2.15"', "releases"),
        (
            "init_mib_at_max_nchannels = { 2 = 30.0 }",
            "init_mib_at_max_nchannels = 30.0",
            "init_mib_at_max_nchannels",
        ),
        ('name = "test-profile"', "name = 3", "name"),
        # negative and out-of-range values
        ("first_collective_mib = 50", "first_collective_mib = -50", "comm.first_collective_mib"),
        ("p2p_latency_s = 1e-5", "p2p_latency_s = -1e-5", "timing.p2p_latency_s"),
        ("bus_bandwidth_gbps = 100.0", "bus_bandwidth_gbps = 0.0", "timing.bus_bandwidth_gbps"),
        ("default_nchannels = 8", "default_nchannels = 0", "comm.default_nchannels"),
        ("{ 2 = 30.0 }", "{ 0 = 30.0 }", "comm.init_mib_at_max_nchannels.0"),
        ("{ 2 = 30.0 }", "{ 2 = -30.0 }", "comm.init_mib_at_max_nchannels.2"),
        # unknown names
        ('gpu = "h100-96gb"', 'gpu = "h800"', "gpu"),
        ('releases = ["2.15"]', 'releases = ["2.17"]', "releases[0]"),
        ('releases = ["2.15"]', 'releases = ["2.15", "2.15"]', "releases[1]"),
        # a non-zero cost needs a derivation
        ("p2p_pair_mib = 0.0", "p2p_pair_mib = 5.0", "derivation.p2p_pair_mib"),
    ],
)
def test_bad_files_fail_naming_file_and_key(tmp_path: Path, old: str, new: str, key: str) -> None:
    assert old in VALID, old
    path = _write(tmp_path, VALID.replace(old, new, 1))
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    message = str(err.value)
    assert str(path) in message
    assert key in message


def test_unknown_gpu_kind_lists_the_known_ones(tmp_path: Path) -> None:
    path = _write(tmp_path, VALID.replace('gpu = "h100-96gb"', 'gpu = "h800"'))
    with pytest.raises(ProfileError, match="rtx3060-12gb"):
        load_profile(path)


def test_malformed_toml_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, VALID.replace("[timing]", "[timing"))
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert str(path) in str(err.value)
    assert "not valid TOML" in str(err.value)


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ProfileError, match=r"absent\.toml"):
        load_profile(path)


# ------------------------------------------------------------------------------------ lookups


def test_unknown_gpu_or_release_in_find_profile() -> None:
    with pytest.raises(ProfileError, match="h800"):
        find_profile("h800", "2.15")
    with pytest.raises(ProfileError, match=r"2\.17"):
        find_profile("h100-96gb", "2.17")


def test_find_profile_without_a_match_lists_what_exists(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    only = load_profile(_write(tmp_path, VALID))
    monkeypatch.setattr(profiles_module, "_load_builtin", lambda: {only.name: only})
    with pytest.raises(ProfileError) as err:
        find_profile("h100-96gb", "2.14")
    assert "test-profile (2.15)" in str(err.value)


def test_find_profile_with_several_matches_asks_to_name_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first = load_profile(_write(tmp_path, VALID))
    second = dataclasses.replace(first, name="twin")
    monkeypatch.setattr(profiles_module, "_load_builtin", lambda: {"test-profile": first, "twin": second})
    with pytest.raises(ProfileError) as err:
        find_profile("h100-96gb", "2.15")
    assert "test-profile, twin" in str(err.value)
    assert "name one" in str(err.value)


def test_get_profile_by_name_and_unknown_name() -> None:
    assert get_profile(H100_CALIBRATION).name == H100_CALIBRATION
    with pytest.raises(ProfileError) as err:
        get_profile("no-such-profile")
    assert H100_CALIBRATION in str(err.value)
