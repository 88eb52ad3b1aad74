"""Profiles: every built-in loads and reproduces its source's arithmetic; bad files name file and key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import simnccl.profiles as profiles_module
from simnccl.cluster import get_gpu_kind, gpu_kinds
from simnccl.comm_memory import one_node_mib
from simnccl.nccl import communicator_bytes
from simnccl.profiles import (
    FixedOverheads,
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


def _mib(profile, nranks: int = 2, env=None, uses=(), parent=None) -> float:
    """One communicator's device MiB: NCCL's mechanics on the profile's topology, plus its fixed overhead."""
    return one_node_mib(profile, nranks, env, uses, parent=parent)


def test_pytorch_199957_arithmetic() -> None:
    """The issue's three figures from the model plus the profile's fitted overheads, each within 1 %."""
    profile = find_profile("h100-96gb", "2.15-dev")
    assert profile.name == H100_CALIBRATION
    comm = profile.comm
    context = get_gpu_kind("h100-96gb").cuda_context_mib
    share = {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}
    parent = communicator_bytes(profile.topology, 2, 2, 1, profile.nccl_version, env=share)
    # 9 eager nccl2 groups: +2080 MiB; with NCCL_COMM_SPLIT_SHARE_RESOURCES=1: +1188 MiB.
    assert 9 * _mib(profile) == pytest.approx(2080, rel=1e-2)
    assert 9 * _mib(profile, env=share, parent=parent) == pytest.approx(1188, rel=1e-2)
    # After one all_reduce on each of the 10 communicators (world + 9): 4672 MiB per GPU, nccl2 and legacy alike.
    used = _mib(profile, uses=("all_reduce",))
    total = context + comm.process_mib + comm.process_first_collective_mib + 10 * used
    assert total == pytest.approx(4672, rel=1e-2)


def test_the_h100_overheads_are_the_least_squares_and_exact_fits() -> None:
    profile = get_profile(H100_CALIBRATION)
    comm = profile.comm
    share = {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}
    parent = communicator_bytes(profile.topology, 2, 2, 1, profile.nccl_version, env=share)
    bare = _mib(profile) - comm.comm_fixed_mib
    bare_shared = _mib(profile, env=share, parent=parent) - comm.comm_fixed_mib
    assert comm.comm_fixed_mib == pytest.approx(((2080 / 9 - bare) + (1188 / 9 - bare_shared)) / 2, abs=1e-4)
    context = get_gpu_kind("h100-96gb").cuda_context_mib
    used = _mib(profile, uses=("all_reduce",))
    assert comm.process_first_collective_mib == pytest.approx(4672 - context - comm.process_mib - 10 * used, abs=1e-3)
    assert comm.process_mib == get_profile("rtx3060-sglang35538").comm.process_mib


@pytest.mark.parametrize(
    "name",
    [
        "h100-96gb-torch2.14",
        "h100-96gb-torch2.16-dev-extrapolated",
        "h100-80gb-extrapolated",
        "h200-141gb-extrapolated",
    ],
)
def test_profiles_reusing_the_h100_calibration_carry_the_same_overheads(name: str) -> None:
    assert get_profile(name).comm == get_profile(H100_CALIBRATION).comm


def test_gb200_is_197_mib_per_group_on_2_16_dev_without_nvls() -> None:
    profile = find_profile("gb200", "2.16-dev")
    assert profile.topology_changes == {"multicast": False}
    assert not profile.topology.multicast
    assert _mib(profile) == pytest.approx(197, abs=0.01)
    assert find_profile("gb200", "2.15").comm == profile.comm


def test_rtx3060_reproduces_sglang_35538() -> None:
    profile = find_profile("rtx3060-12gb", "2.15")
    assert _mib(profile, nranks=1) == 388
    assert _mib(profile, nranks=1, env={"NCCL_MAX_NCHANNELS": "1"}) == 10
    # The world group cost +470: the per-process overhead plus one 1-rank communicator.
    assert profile.comm.process_mib + _mib(profile, nranks=1) == 470
    assert get_gpu_kind("rtx3060-12gb").cuda_context_mib == 114


def test_extrapolated_profiles_say_so() -> None:
    for profile in builtin_profiles().values():
        if profile.name.endswith("-extrapolated"):
            assert "EXTRAPOLATED" in profile.source, profile.name


def test_builtin_profiles_returns_a_copy() -> None:
    builtin_profiles().clear()
    assert H100_CALIBRATION in builtin_profiles()


# ------------------------------------------------------------------------------------ check_env


def test_valid_knobs_and_other_variables_pass() -> None:
    profile = get_profile(H100_CALIBRATION)
    profile.check_env({})
    profile.check_env({"NCCL_DEBUG": "INFO", "NCCL_MAX_NCHANNELS": "4", "NCCL_BUFFSIZE": "1048576"})


@pytest.mark.parametrize(
    ("knob", "value"),
    [("NCCL_MAX_NCHANNELS", "abc"), ("NCCL_MAX_NCHANNELS", ""), ("NCCL_BUFFSIZE", "0"), ("NCCL_NVLS_ENABLE", "3")],
)
def test_invalid_knob_is_an_error_naming_the_variable(knob: str, value: str) -> None:
    profile = get_profile(H100_CALIBRATION)
    with pytest.raises(ProfileError) as err:
        profile.check_env({knob: value})
    assert knob in str(err.value)
    assert err.value.knob == knob


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
comm_fixed_mib = 1.5
process_mib = 50
process_first_collective_mib = 0.0

[topology]
nics_per_node = 4

[timing]
comm_init_s = 0.1
split_s = 0.1
nocolor_split_s = 0.01
collective_latency_s = 1e-5
bus_bandwidth_gbps = 100.0
p2p_latency_s = 1e-5
cuda_context_s = 0.5

[derivation]
comm_fixed_mib = "made up"
process_mib = "made up"
topology = "made up"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "custom.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_valid_file_loads(tmp_path: Path) -> None:
    path = _write(tmp_path, VALID)
    profile = load_profile(path)
    assert profile.path == str(path)
    assert profile.comm == FixedOverheads(1.5, 50.0, 0.0)
    assert isinstance(profile.comm.process_mib, float)
    assert profile.releases == ("2.15",)
    assert profile.topology.nics_per_node == 4
    assert profile.topology.interconnect == "nvswitch"  # the rest is the GPU kind's
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
        ("comm_fixed_mib = 1.5", "comm_fixed_mib = 1.5\ninit_mib = 5.0", "comm.init_mib"),
        ('process_mib = "made up"', 'process_mib = "made up"\nhunch = "x"', "derivation.hunch"),
        ("nics_per_node = 4", "nics_per_node = 4\nswitches = 2", "topology.switches"),
        # missing keys
        ('nccl_version = "2.30.7"\n', "", "nccl_version"),
        ("process_first_collective_mib = 0.0\n", "", "comm.process_first_collective_mib"),
        ("cuda_context_s = 0.5\n", "", "timing.cuda_context_s"),
        ('process_mib = "made up"\n', "", "derivation.process_mib"),
        ('topology = "made up"\n', "", "derivation.topology"),
        # wrong types
        ("comm_fixed_mib = 1.5", 'comm_fixed_mib = "1.5"', "comm.comm_fixed_mib"),
        ("process_mib = 50", "process_mib = true", "comm.process_mib"),
        ('releases = ["2.15"]', 'releases = "2.15"', "releases"),
        ("nics_per_node = 4", "nics_per_node = 1.5", "topology.nics_per_node"),
        ("nics_per_node = 4", 'interconnect = "ethernet"', "topology.interconnect"),
        ('name = "test-profile"', "name = 3", "name"),
        ('nccl_version = "2.30.7"', 'nccl_version = "recent"', "nccl_version"),
        # negative and out-of-range values
        ("process_mib = 50", "process_mib = -50", "comm.process_mib"),
        ("p2p_latency_s = 1e-5", "p2p_latency_s = -1e-5", "timing.p2p_latency_s"),
        ("bus_bandwidth_gbps = 100.0", "bus_bandwidth_gbps = 0.0", "timing.bus_bandwidth_gbps"),
        # past the input limits: 1e308 MiB overflowed converting to bytes (exit 70); a bandwidth of 1e-320 GB/s
        # "hung" every collective; a step longer than the longest simulated run
        ("process_mib = 50", "process_mib = 1e308", "comm.process_mib"),
        ("comm_fixed_mib = 1.5", "comm_fixed_mib = 1048577", "comm.comm_fixed_mib"),
        ("bus_bandwidth_gbps = 100.0", "bus_bandwidth_gbps = 1e-320", "timing.bus_bandwidth_gbps"),
        ("comm_init_s = 0.1", "comm_init_s = 1e300", "timing.comm_init_s"),
        # unknown names
        ('gpu = "h100-96gb"', 'gpu = "h800"', "gpu"),
        ('releases = ["2.15"]', 'releases = ["2.17"]', "releases[0]"),
        ('releases = ["2.15"]', 'releases = ["2.15", "2.15"]', "releases[1]"),
        # a non-zero overhead needs a derivation
        ("process_first_collective_mib = 0.0", "process_first_collective_mib = 5.0", "derivation.process_first"),
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


def test_a_lower_simulated_time_limit_leaves_the_shipped_profiles_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bandwidth floor was read from this run's limits: SIMNCCL_LIMIT_MAX_SIM_TIME_S=100 made the shipped
    10 GB/s rtx3060 profile "out of range" and every command exit 2 on an unrelated H100 scenario."""
    monkeypatch.setenv("SIMNCCL_LIMIT_MAX_SIM_TIME_S", "100")
    for name, profile in builtin_profiles().items():  # (cached: each file read again, under the override)
        assert load_profile(profile.path).name == name
