"""GPU kinds and cluster layout: the data file's figures, rank placement, and errors that name the key."""

from __future__ import annotations

import dataclasses

import pytest

from simnccl.cluster import (
    BYTES_PER_MIB,
    Cluster,
    ClusterError,
    Device,
    GpuKind,
    get_gpu_kind,
    gpu_kinds,
    mib_to_bytes,
    parse_gpu_kinds,
)

REQUIRED_KINDS = ("h100-80gb", "h100-96gb", "h200-141gb", "gb200", "a100-80gb", "l4", "rtx3060-12gb")

GIB_IN_MIB = 1024


# ------------------------------------------------------------------------------------------- GPU kinds


def test_every_required_kind_is_present_with_sourced_figures() -> None:
    kinds = gpu_kinds()
    for key in REQUIRED_KINDS:
        kind = kinds[key]
        assert kind.key == key
        assert kind.display
        assert 0 < kind.cuda_context_mib < kind.total_mib
        # Both numbers carry a source, composed from the file's two source strings.
        assert kind.source.startswith("total: ")
        assert "\nCUDA context: " in kind.source


def test_l4_total_is_what_vllm_printed_in_pytorch_175666() -> None:
    # "Free memory on device cuda:1 (19.77/22.05 GiB)"
    assert get_gpu_kind("l4").total_mib == pytest.approx(22.05 * GIB_IN_MIB)


def test_rtx3060_context_is_the_measured_114_mib() -> None:
    kind = get_gpu_kind("rtx3060-12gb")
    assert kind.cuda_context_mib == 114.0
    assert "measured" in kind.source and "#35538" in kind.source


def test_estimated_contexts_say_so() -> None:
    for key in REQUIRED_KINDS:
        if key != "rtx3060-12gb":
            assert "ESTIMATE" in get_gpu_kind(key).source.split("CUDA context: ")[1], key


def test_bytes_are_whole_and_exact() -> None:
    kind = get_gpu_kind("h200-141gb")
    assert kind.total_bytes == round(kind.total_mib * BYTES_PER_MIB)
    assert kind.cuda_context_bytes == round(kind.cuda_context_mib * BYTES_PER_MIB)
    assert isinstance(kind.total_bytes, int)
    assert mib_to_bytes(1.5) == 1572864


def test_nodes_of_a_member_list_are_node_of_each_and_checked_alike() -> None:
    """``Cluster.nodes_of`` counts a group's members per node at once; it must answer as ``node_of`` would for
    each rank, and refuse what ``node_of`` refuses, with its text."""
    cluster = Cluster(get_gpu_kind("h100-80gb"), 4, 8)
    ranks = (31, 0, 9, 8, 17, 24)
    assert cluster.nodes_of(ranks) == [cluster.node_of(r) for r in ranks] == [3, 0, 1, 1, 2, 3]
    assert cluster.nodes_of(()) == []
    for bad in ((0, 32), (-1, 3), (0, True), (1, 2.0)):
        with pytest.raises(ClusterError) as listed:
            cluster.nodes_of(bad)
        wrong = next(r for r in bad if type(r) is not int or not 0 <= r < 32)
        with pytest.raises(ClusterError) as single:
            cluster.node_of(wrong)
        assert str(listed.value) == str(single.value)


def test_unknown_kind_lists_known_keys() -> None:
    with pytest.raises(ClusterError) as err:
        get_gpu_kind("h800")
    message = str(err.value)
    assert "'h800'" in message
    for key in REQUIRED_KINDS:
        assert key in message


def test_gpu_kinds_returns_a_copy() -> None:
    first = gpu_kinds()
    first.clear()
    assert set(REQUIRED_KINDS) <= set(gpu_kinds())


_GOOD_KIND = """
[x]
display = "X"
total_mib = 1000.0
total_source = "t"
cuda_context_mib = 100.0
cuda_context_source = "c"
"""


def test_parse_accepts_a_good_kind() -> None:
    kinds = parse_gpu_kinds(_GOOD_KIND, "kinds.toml")
    assert kinds["x"] == GpuKind("x", "X", 1000.0, 100.0, "total: t\nCUDA context: c")


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('display = "X"', 'display = "X"\ncolour = "green"', "colour"),
        ('display = "X"\n', "", "display"),
        ("total_mib = 1000.0", 'total_mib = "1000"', "total_mib"),
        ("total_mib = 1000.0", "total_mib = true", "total_mib"),
        ("cuda_context_mib = 100.0", "cuda_context_mib = -1", "cuda_context_mib"),
        ("cuda_context_mib = 100.0", "cuda_context_mib = 2000.0", "cuda_context_mib"),
        ('total_source = "t"', 'total_source = ""', "total_source"),
    ],
)
def test_parse_errors_name_file_kind_and_key(old: str, new: str, key: str) -> None:
    assert old in _GOOD_KIND
    with pytest.raises(ClusterError) as err:
        parse_gpu_kinds(_GOOD_KIND.replace(old, new), "kinds.toml")
    message = str(err.value)
    assert "kinds.toml" in message and "[x]" in message and key in message


def test_parse_rejects_malformed_toml_naming_the_file() -> None:
    with pytest.raises(ClusterError, match=r"kinds\.toml: not valid TOML"):
        parse_gpu_kinds("[x\n", "kinds.toml")


# --------------------------------------------------------------------------------------------- devices


def test_device_names() -> None:
    device = Device(1, 3)
    assert device.key == "n1:cuda:3"
    assert device.label == "node1/cuda:3"
    assert str(device) == "cuda:3"


def test_device_rejects_negative_index() -> None:
    with pytest.raises(ClusterError, match=r"Device\.index"):
        Device(0, -1)


# --------------------------------------------------------------------------------------------- cluster


@pytest.fixture
def h100() -> GpuKind:
    return get_gpu_kind("h100-80gb")


def test_ranks_are_laid_out_node_major(h100: GpuKind) -> None:
    cluster = Cluster(h100, nodes=2, gpus_per_node=4)
    assert cluster.ranks_per_node == 4
    assert cluster.world_size == 8
    assert [cluster.node_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [cluster.local_rank(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_fewer_ranks_than_gpus_per_node(h100: GpuKind) -> None:
    cluster = Cluster(h100, nodes=3, gpus_per_node=8, ranks_per_node=2)
    assert cluster.world_size == 6
    assert cluster.device_count == 8
    assert (cluster.node_of(5), cluster.local_rank(5)) == (2, 1)


@pytest.mark.parametrize("shape", [(2, 4, None), (3, 8, 2), (1, 2, 5)])
def test_placements_are_each_ranks_node_and_local_rank(h100: GpuKind, shape: tuple[int, int, int | None]) -> None:
    nodes, gpus, per_node = shape
    cluster = Cluster(h100, nodes=nodes, gpus_per_node=gpus, ranks_per_node=per_node)
    expected = [(cluster.node_of(r), cluster.local_rank(r)) for r in range(cluster.world_size)]
    assert cluster.placements() == expected and len(expected) == cluster.world_size


def test_devices_in_node_then_index_order(h100: GpuKind) -> None:
    cluster = Cluster(h100, nodes=2, gpus_per_node=2)
    assert cluster.devices() == (Device(0, 0), Device(0, 1), Device(1, 0), Device(1, 1))
    assert cluster.device(1, 1) == Device(1, 1)
    assert cluster.total_bytes == h100.total_bytes


def test_cpu_only_host(h100: GpuKind) -> None:
    cluster = Cluster(h100, nodes=1, gpus_per_node=0, ranks_per_node=2)
    assert cluster.device_count == 0
    assert cluster.devices() == ()
    assert cluster.world_size == 2
    with pytest.raises(ClusterError, match="device index 0 out of range"):
        cluster.device(0, 0)


def test_cpu_only_host_needs_ranks_per_node(h100: GpuKind) -> None:
    with pytest.raises(ClusterError, match="ranks_per_node"):
        Cluster(h100, nodes=1, gpus_per_node=0)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"nodes": 0, "gpus_per_node": 1}, "Cluster.nodes"),
        ({"nodes": True, "gpus_per_node": 1}, "Cluster.nodes"),
        ({"nodes": 1, "gpus_per_node": -1}, "Cluster.gpus_per_node"),
        ({"nodes": 1, "gpus_per_node": 2.0}, "Cluster.gpus_per_node"),
        ({"nodes": 1, "gpus_per_node": 2, "ranks_per_node": 0}, "Cluster.ranks_per_node"),
    ],
)
def test_cluster_validation_names_the_key(h100: GpuKind, kwargs: dict, key: str) -> None:
    with pytest.raises(ClusterError, match=key.replace(".", r"\.")):
        Cluster(h100, **kwargs)


def test_cluster_needs_a_gpu_kind() -> None:
    with pytest.raises(ClusterError, match=r"Cluster\.gpu"):
        Cluster("h100-80gb", nodes=1, gpus_per_node=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("rank", [-1, 4, True])
def test_rank_out_of_range(h100: GpuKind, rank: int) -> None:
    cluster = Cluster(h100, nodes=2, gpus_per_node=2)
    with pytest.raises(ClusterError, match="out of range"):
        cluster.node_of(rank)
    with pytest.raises(ClusterError, match="out of range"):
        cluster.local_rank(rank)


def test_device_out_of_range(h100: GpuKind) -> None:
    cluster = Cluster(h100, nodes=2, gpus_per_node=2)
    with pytest.raises(ClusterError, match="node 2 out of range"):
        cluster.device(2, 0)
    with pytest.raises(ClusterError, match="device index 2 out of range"):
        cluster.device(0, 2)


def test_cluster_is_frozen(h100: GpuKind) -> None:
    cluster = Cluster(h100, nodes=1, gpus_per_node=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cluster.nodes = 2  # type: ignore[misc]


def test_a_misspelt_kind_key_is_refused_with_the_nearest_key() -> None:
    with pytest.raises(ClusterError) as err:
        parse_gpu_kinds(_GOOD_KIND.replace("total_mib", "totl_mib"), "kinds.toml")
    assert str(err.value) == (
        "kinds.toml: [x].totl_mib: unknown key; expected one of cuda_context_mib, cuda_context_source, display, "
        "topology, total_mib, total_source; did you mean 'total_mib'?"
    )


def test_an_unknown_gpu_kind_is_quoted_briefly() -> None:
    """A GPU name of a million characters (``--gpu``, a sweep's matrix) was quoted whole in the one-line error."""
    with pytest.raises(ClusterError) as raised:
        get_gpu_kind("x" * 10**6)
    assert len(str(raised.value)) < 400 and "unknown GPU kind 'xxx" in str(raised.value)
