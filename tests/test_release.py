"""The release model's own rules (the probes in test_torch_probes.py compare them with real torch)."""

from __future__ import annotations

import pytest

from simnccl.release import RELEASES, Impl, ReleaseError, get_release, resolve_backend


@pytest.mark.parametrize(
    ("release", "value", "impl"),
    [
        ("2.15", None, Impl.NCCL2),
        ("2.15", "0", Impl.LEGACY),
        ("2.15", "1", Impl.NCCL2),
        ("2.15", "false", Impl.NCCL2),
        ("2.15", " 0", Impl.NCCL2),
        ("2.14", None, Impl.LEGACY),
        ("2.14", "1", Impl.NCCL2),
        ("2.14", "true", Impl.LEGACY),
        ("2.16-dev", "0", Impl.LEGACY),
    ],
)
def test_torch_dist_use_nccl2_is_an_exact_string_rule_per_release(release, value, impl) -> None:
    env = {} if value is None else {"TORCH_DIST_USE_NCCL2": value}
    assert get_release(release).nccl_impl(env) is impl


def test_explicit_names_ignore_the_environment() -> None:
    r = get_release("2.15")
    for env in ({}, {"TORCH_DIST_USE_NCCL2": "0"}):
        assert r.impl_for_name("nccl2", env) is Impl.NCCL2
        assert r.impl_for_name("nccl-legacy", env) is Impl.LEGACY
        assert r.impl_for_name("nccl-lazy", env) is Impl.NCCL_LAZY


def test_mixed_backend_strings_parse_per_device() -> None:
    config = resolve_backend(get_release("2.15"), "cpu:gloo,cuda:nccl", {})
    assert [(p.device_type, p.name, p.impl) for p in config.pairs] == [
        ("cpu", "gloo", Impl.GLOO),
        ("cuda", "nccl", Impl.NCCL2),
    ]
    assert resolve_backend(get_release("2.15"), None, {}, has_cuda=False).pairs[0].name == "gloo"


@pytest.mark.parametrize("bad", ["ncl", "cpu:gloo,cpu:gloo", "cpu-gloo,cuda", "tpu:xla"])
def test_bad_backend_strings_are_rejected(bad) -> None:
    with pytest.raises(ReleaseError):
        resolve_backend(get_release("2.15"), bad, {})


def test_unknown_release_lists_the_known_ones() -> None:
    with pytest.raises(ReleaseError, match=r"2\.14, 2\.15"):
        get_release("3.0")
    assert {"2.14", "2.15", "2.15-dev", "2.16-dev"} <= set(RELEASES)


def test_cpp_names_are_what_torch_reports() -> None:
    assert Impl.LEGACY.cpp_name == "nccl" and Impl.NCCL2.cpp_name == "nccl2"
