"""simnccl.nccl: each memory mechanism, each knob moving memory the right way, bad input refused by name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simnccl.cluster import parse_gpu_kinds
from simnccl.nccl import (
    UNMEASURED_ASSUMPTIONS,
    Breakdown,
    NcclInputError,
    NcclVersion,
    Use,
    communicator_bytes,
    constants,
    settings_from,
    topology_for,
)
from simnccl.nccl.algorithms import algorithm_for
from simnccl.nccl.channels import channel_counts
from simnccl.nccl.connections import Connection
from simnccl.nccl.constants import parse_constants
from simnccl.nccl.hardware import parse_topology
from simnccl.nccl.layout import Layout
from simnccl.nccl.transports import connection_allocation, protocol_buffers

MIB = 1024 * 1024
H100_8 = ("h100-80gb", 8, 8, 1, "2.30.7")
H100_2 = ("h100-96gb", 2, 2, 1, "2.30.7")
ONE_RANK = ("rtx3060-12gb", 1, 1, 1, "2.30.7")


def mib(breakdown: Breakdown, **kwargs: str) -> float:
    return breakdown.bytes(**kwargs) / MIB  # type: ignore[arg-type]


def used(
    *layout: object, env: dict[str, str] | None = None, uses: list[object] | None = None, **kw: object
) -> Breakdown:
    return communicator_bytes(*layout, env, None, "used", uses or [], **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ constants, data


def test_protocol_buffers_sum_to_nccls_9_19_mib_per_connection() -> None:
    buffers = protocol_buffers(settings_from())
    assert (buffers.ll, buffers.ll128, buffers.simple) == (524288, 4915200, 4194304)
    assert round(buffers.total / MIB, 2) == 9.19


def test_every_constant_cites_its_source() -> None:
    for key, entry in constants().entries.items():
        assert entry.source, key
        assert "ASSUMPTION" in entry.source or "src/" in entry.source or "NCCL" in entry.source, key


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[a]\nx = 1\n", "a.x: expected {value"),
        ('[a]\nx = { value = 1, source = "" }\n', "a.x.source"),
        ("[a\n", "not valid TOML"),
    ],
)
def test_constants_file_errors_name_the_entry(text: str, needle: str) -> None:
    with pytest.raises(NcclInputError, match=r"c\.toml") as err:
        parse_constants(text, "c.toml")
    assert needle in str(err.value)


def test_gpu_kinds_with_topology_still_load_and_unknown_keys_still_fail() -> None:
    kind = (
        '[x]\ndisplay = "X"\ntotal_mib = 10.0\ntotal_source = "t"\ncuda_context_mib = 1.0\ncuda_context_source = "c"\n'
    )
    topology = '[x.topology]\ncompute_capability = 90\ninterconnect = "pcie"\n'
    assert parse_gpu_kinds(kind + topology, "k.toml")["x"].total_mib == 10.0
    with pytest.raises(ValueError, match="colour"):
        parse_gpu_kinds(kind + 'colour = "red"\n', "k.toml")


def test_every_gpu_kind_has_a_topology() -> None:
    for key in ("h100-80gb", "h100-96gb", "h200-141gb", "gb200", "a100-80gb", "l4", "rtx3060-12gb"):
        assert topology_for(key).source


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"interconnect": "infiniband"}, "interconnect"),
        ({"nvlink_links": 0}, "nvlink_links"),
        ({"multicast": "yes"}, "multicast"),
        ({"speed": 1}, "speed"),
        ({"interconnect": "pcie", "nvlink_links": 0}, "pcie_bw"),
    ],
)
def test_topology_errors_name_the_key(change: dict[str, object], needle: str) -> None:
    table = {
        "compute_capability": 90,
        "interconnect": "nvswitch",
        "nvlink_links": 18,
        "multicast": True,
        "gdr": True,
        "nics_per_node": 8,
        "nic_bw": 50.0,
        "cpu_arm": False,
        "source": "s",
    }
    parse_topology("t.toml: [x]", "x", table)
    with pytest.raises(NcclInputError, match=needle):
        parse_topology("t.toml: [x]", "x", {**table, **change})


def test_unknown_gpu_kind_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(NcclInputError, match="h100-80gb"):
        topology_for("tpu-v5")


def test_unmeasured_assumptions_are_listed() -> None:
    assert len(UNMEASURED_ASSUMPTIONS) >= 8
    assert any("granularity" in a for a in UNMEASURED_ASSUMPTIONS)


def test_importing_the_model_imports_neither_simpy_nor_torch() -> None:
    code = (
        "import sys, simnccl.nccl.command\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('simpy', 'torch')]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------------------------ knobs, versions


def test_environment_wins_over_the_config_like_nccl() -> None:
    settings = settings_from({"NCCL_MAX_CTAS": "4"}, {"max_ctas": 16})
    assert settings.max_ctas == 4
    assert settings_from({"NCCL_MAX_CTAS": "0"}, {"max_ctas": 16}).max_ctas == 16  # NCCL ignores <= 0
    assert settings_from({"NCCL_COMM_SPLIT_SHARE_RESOURCES": "0"}, {"split_share": True}).split_share is False
    assert settings_from({"NCCL_MAX_CTAS": "1000"}).max_ctas == 64


@pytest.mark.parametrize(("text", "value"), [("4", 4), (" 4\n", 4), ("010", 8), ("0x10", 16), ("+3", 3), ("-0", 0)])
def test_integer_knobs_read_as_nccls_strtoll_reads_them(text: str, value: int) -> None:
    assert settings_from({"NCCL_MAX_CTAS": text}, {"max_ctas": 16}).max_ctas == (value if value > 0 else 16)


# Each is a number to Python's int(text, 0) but not to NCCL's strtoll(text, NULL, 0), which reads "0b1" and "0o1"
# as 0 (it stops at the letter) and finds no digit in a non-ASCII one: run as Python read them, NCCL_RUNTIME_CONNECT
# "0b1" simulated lazy connection while NCCL connected at init (a false pass of the startup memory check).
@pytest.mark.parametrize("text", ["0b1", "0o1", "\u0661", "1e3", "08", "0x", "", "1_0", "99999999999999999999"])
def test_integer_knobs_nccl_would_read_otherwise_are_refused(text: str) -> None:
    with pytest.raises(NcclInputError, match="NCCL_RUNTIME_CONNECT: expected an integer >= 0"):
        settings_from({"NCCL_RUNTIME_CONNECT": text})


@pytest.mark.parametrize(
    ("env", "options", "needle"),
    [
        ({"NCCL_BUFFSIZE": "big"}, None, "NCCL_BUFFSIZE"),
        ({"NCCL_RUNTIME_CONNECT": "2"}, None, "NCCL_RUNTIME_CONNECT"),
        ({"NCCL_NVLS_ENABLE": "3"}, None, "NCCL_NVLS_ENABLE"),
        ({"NCCL_ALGO": "Ring,Bogus"}, None, "NCCL_ALGO"),
        ({"NCCL_PROTO": "LL256"}, None, "NCCL_PROTO"),
        (None, {"cga": 4}, r"options\.cga: unknown key"),
        (None, {"max_ctas": 0}, "options.max_ctas"),
    ],
)
def test_bad_knobs_are_refused_by_name(
    env: dict[str, str] | None, options: dict[str, object] | None, needle: str
) -> None:
    with pytest.raises(NcclInputError, match=needle):
        settings_from(env, options)


def test_algo_and_proto_lists_follow_nccl_syntax() -> None:
    settings = settings_from({"NCCL_ALGO": "^NVLS,collnetdirect", "NCCL_PROTO": "LL,Simple"})
    allowed = settings.algorithms_allowed("allreduce")
    assert allowed is not None and "nvls" not in allowed and "ring" in allowed
    assert settings.proto == frozenset({"ll", "simple"})
    per_function = settings_from({"NCCL_ALGO": "allreduce:ring;allgather:pat"})
    assert per_function.algorithms_allowed("allgather") == frozenset({"pat"})


def test_versions_switch_features_on_at_their_release() -> None:
    assert NcclVersion.parse("2.22.3").feature("runtime_connect_since")
    assert not NcclVersion.parse("2.21.5").feature("runtime_connect_since")
    assert NcclVersion.parse("2.19").feature("cumem_default_since")
    assert NcclVersion.parse("2.30.7").single_rank_net_shared_defect
    assert not NcclVersion.parse("2.30.7+pr2366").single_rank_net_shared_defect
    with pytest.raises(NcclInputError, match="nccl_version"):
        NcclVersion.parse("latest")


# ------------------------------------------------------------------------------------------ channels


@pytest.mark.parametrize(
    ("kind", "layout", "coll", "p2p", "per_peer", "nvls"),
    [
        ("h100-80gb", (8, 8, 1), 24, 32, 32, 16),  # nccl#1781: 24 coll channels; nccl#1685: 32 per pair
        ("h100-96gb", (2, 2, 1), 24, 32, 32, 16),
        ("gb200", (2, 2, 1), 32, 32, 32, 24),
        ("a100-80gb", (4, 4, 1), 24, 32, 32, 0),
        ("rtx3060-12gb", (1, 1, 1), 64, 64, 64, 0),
        ("l4", (2, 2, 1), 4, 4, 2, 0),
    ],
)
def test_channel_counts_follow_ncclS_search(
    kind: str, layout: tuple[int, int, int], coll: int, p2p: int, per_peer: int, nvls: int
) -> None:
    b = communicator_bytes(kind, *layout, "2.30.7")
    assert (b.channels.coll, b.channels.p2p, b.channels.p2p_per_peer, b.channels.nvls) == (coll, p2p, per_peer, nvls)


def test_an_8_link_hopper_gets_16_channels_like_nccl_892() -> None:
    h800 = topology_for("h100-80gb").with_changes(nvlink_links=8)
    channels = channel_counts(h800, Layout(8, 8, 1), settings_from(), nvls_active=False)
    assert channels.coll == 16


def test_remembered_channel_counts_are_those_computed_afresh_for_every_input_they_read() -> None:
    """``channel_counts`` keeps its answers (a property run asks it thousands of times): the answer for a layout,
    topology, settings, NVLS and parent must be the one computed afresh, and a changed input (another topology
    object with the same name, other settings, another node layout, a parent) must not get another's answer."""
    from simnccl.nccl import channels as module
    from simnccl.nccl.channels import ParentChannels

    h100 = topology_for("h100-80gb")
    inputs = [
        (h100, Layout(8, 8, 1), settings_from(), True, None),
        (h100, Layout(8, 8, 1, rank=5), settings_from(), True, None),  # the rank priced is not read
        (h100, Layout(8, 8, 1), settings_from({"NCCL_MAX_NCHANNELS": "8"}), True, None),
        (h100, Layout(8, 8, 1), settings_from(), False, None),
        (h100, Layout(16, 8, 2), settings_from(), True, None),
        (h100, Layout(4, 3, 2, node_sizes=(3, 1)), settings_from(), False, None),
        (h100, Layout(8, 8, 1), settings_from(), True, ParentChannels(8, 8, 0)),
        (h100.with_changes(nvlink_links=8), Layout(8, 8, 1), settings_from(), False, None),
        (h100.with_changes(nics_per_node=2), Layout(16, 8, 2), settings_from(), False, None),
    ]
    first = [channel_counts(t, lay, s, nvls_active=n, parent=p) for t, lay, s, n, p in inputs]
    again = [channel_counts(t, lay, s, nvls_active=n, parent=p) for t, lay, s, n, p in inputs]
    afresh = [module._channel_counts(constants(), t, lay, s, n, p) for t, lay, s, n, p in inputs]
    assert first == again == afresh
    assert all(a is b for a, b in zip(first, again, strict=True))  # remembered, not recomputed
    assert len({(c.coll, c.p2p, c.p2p_per_peer, c.nvls) for c in first}) >= 5  # the inputs do move the answer


@pytest.mark.parametrize(
    ("env", "options", "coll", "tables"),
    [
        ({"NCCL_MAX_NCHANNELS": "8"}, None, 8, 8),
        ({"NCCL_MAX_CTAS": "4"}, None, 4, 4),
        (None, {"max_ctas": 2}, 2, 2),
        ({"NCCL_MIN_NCHANNELS": "32"}, None, 32, 32),
        (None, {"min_ctas": 40}, 40, 64),  # 40 ring channels, 64 send/recv channels (next power of two)
    ],
)
def test_channel_knobs_move_channel_tables_the_right_way(
    env: dict[str, str] | None, options: dict[str, object] | None, coll: int, tables: int
) -> None:
    b = communicator_bytes(*H100_8, env, options, "init")
    assert (b.channels.coll, b.channels.initialized) == (coll, tables)
    assert b.mechanism_bytes("channels") == tables * 3 * 2 * MIB  # default: 32 tables (24 ring, 32 send/recv)


def test_max_p2p_nchannels_shrinks_the_all_to_all_fan_out() -> None:
    full = used(*H100_8, uses=["all_to_all"])
    capped = used(*H100_8, env={"NCCL_MAX_P2P_NCHANNELS": "8"}, uses=["all_to_all"])
    assert full.mechanism_bytes("p2p") == 7 * 32 * 12 * MIB
    assert capped.channels.p2p_per_peer == 8
    assert capped.mechanism_bytes("p2p") == 7 * 8 * 12 * MIB


# ------------------------------------------------------------------------------------------ init mechanisms


def test_init_is_device_comm_plus_channel_tables_plus_nvls_rounded_to_the_granule() -> None:
    b = communicator_bytes(*H100_2)
    assert b.mechanism_bytes("device-comm") == 2 * 2 * MIB
    assert b.mechanism_bytes("channels") == 32 * 3 * 2 * MIB  # max(24 ring, 32 p2p) channels
    assert b.mechanism_bytes("nvls-channels") == 16 * 2 * MIB
    assert b.mechanism_bytes("nvls-credit") == 2 * MIB
    assert b.init_device_bytes == 230 * MIB
    assert b.host_bytes == 1 * MIB  # the work FIFO, pinned host
    assert b.multicast_objects == 1


def test_one_rank_communicator_pays_64_channels_of_tables_and_nothing_else() -> None:
    b = communicator_bytes(*ONE_RANK)
    assert b.channels.coll == 64 and b.init_device_bytes == 388 * MIB
    assert used(*ONE_RANK, uses=["all_reduce", "all_gather"]).device_bytes == 388 * MIB


def test_cumem_off_drops_the_granule_rounding_and_connects_at_init() -> None:
    b = communicator_bytes(*H100_8, {"NCCL_CUMEM_ENABLE": "0"})
    assert b.mechanism_bytes("channels") == 0 and not b.runtime_connect and not b.cumem
    assert b.mechanism_bytes("ring") > 0 and b.mechanism_bytes("net-shared-buffers") > 0
    assert any("cuMem off" in note for note in b.notes)


def test_nvls_enable_0_removes_nvls_memory_and_slots() -> None:
    on = used(*H100_8, uses=["all_reduce"])
    off = used(*H100_8, env={"NCCL_NVLS_ENABLE": "0"}, uses=["all_reduce"])
    assert on.multicast_objects == 2 and on.mechanism_bytes("nvls-buffers") == 16 * 2 * 8 * 128 * 1024 * 8
    assert off.multicast_objects == 0 and off.mechanism_bytes("nvls-buffers") == 0
    assert off.mechanism_bytes("ring") > 0  # its all_reduce rings instead


def test_nvls_needs_nvswitch_multicast_hopper_and_two_local_ranks() -> None:
    assert communicator_bytes(*H100_8).nvls_active
    assert not communicator_bytes("a100-80gb", 8, 8, 1, "2.30.7").nvls_active
    assert not communicator_bytes("h100-80gb", 8, 1, 8, "2.30.7").nvls_active
    assert not communicator_bytes("h100-80gb", 8, 8, 1, "2.16.5").nvls_active


# ------------------------------------------------------------------------------------------ connections


def test_runtime_connect_pays_at_first_use_and_0_pays_at_init() -> None:
    lazy = used(*H100_8, env={"NCCL_NVLS_ENABLE": "0"}, uses=["all_reduce"])
    eager = used(*H100_8, env={"NCCL_NVLS_ENABLE": "0", "NCCL_RUNTIME_CONNECT": "0"}, uses=["all_reduce"])
    assert lazy.by_paid_at() == {"init": 196 * MIB, "first all_reduce (ring)": 24 * 12 * MIB}
    assert eager.init_device_bytes == eager.device_bytes > lazy.device_bytes  # ring, tree and the NET pool at init
    old = used("h100-80gb", 8, 8, 1, "2.21.5", uses=["all_reduce"])
    assert not old.runtime_connect and old.device_bytes == old.init_device_bytes


def test_a_two_rank_tree_adds_nothing_to_the_ring_and_a_chain_head_adds_one_receive() -> None:
    env = {"NCCL_NVLS_ENABLE": "0"}
    two = used("h100-80gb", 2, 2, 1, "2.30.7", env=env, uses=["all_reduce", Use("all_reduce", 1 << 30)])
    assert two.mechanism_bytes("tree") == 0
    four_ring = used("a100-80gb", 4, 4, 1, "2.18.3", uses=["all_reduce"])
    assert four_ring.mechanism_bytes("tree") == 24 * 6 * MIB  # rank 0: one receive (P2P read: 6 MiB) per channel
    middle = used("a100-80gb", 4, 4, 1, "2.18.3", uses=["all_reduce"], rank=1)
    assert middle.mechanism_bytes("tree") == 24 * 12 * MIB


def test_p2p_read_on_ampere_moves_simple_to_the_sender() -> None:
    topo = topology_for("a100-80gb")
    buffers = protocol_buffers(settings_from())
    send = connection_allocation(Connection(0, 1, "send", 0, "p2p"), topo, buffers, cumem=True)
    recv = connection_allocation(Connection(0, 1, "recv", 0, "p2p"), topo, buffers, cumem=True)
    assert (send.device, recv.device) == (6 * MIB, 6 * MIB)
    hopper = topology_for("h100-80gb")
    send = connection_allocation(Connection(0, 1, "send", 0, "p2p"), hopper, buffers, cumem=True)
    recv = connection_allocation(Connection(0, 1, "recv", 0, "p2p"), hopper, buffers, cumem=True)
    assert (send.device, recv.device) == (2 * MIB, 10 * MIB)  # nccl#1685's two allocation sizes


@pytest.mark.parametrize("knob", ["NCCL_BUFFSIZE", "NCCL_LL128_BUFFSIZE", "NCCL_LL_BUFFSIZE"])
def test_smaller_protocol_buffers_shrink_connections(knob: str) -> None:
    env = {"NCCL_NVLS_ENABLE": "0"}
    base = used(*H100_8, env=env, uses=["all_reduce"])
    small = used(*H100_8, env={**env, knob: "131072"}, uses=["all_reduce"])
    assert small.mechanism_bytes("ring") <= base.mechanism_bytes("ring")
    assert small.init_device_bytes == base.init_device_bytes
    bigger = used(*H100_8, env={**env, knob: str(16 * MIB)}, uses=["all_reduce"])
    assert bigger.mechanism_bytes("ring") > base.mechanism_bytes("ring")


def test_nccl_proto_changes_no_buffer() -> None:
    base = used(*H100_8, uses=["all_reduce", "all_gather"])
    simple_only = used(*H100_8, env={"NCCL_PROTO": "Simple"}, uses=["all_reduce", "all_gather"])
    assert simple_only.device_bytes == base.device_bytes


def test_nccl_algo_decides_what_the_first_call_connects() -> None:
    nvls = used(*H100_8, uses=["all_reduce"])
    ring = used(*H100_8, env={"NCCL_ALGO": "Ring"}, uses=["all_reduce"])
    assert "nvls" in nvls.algorithms_connected and "ring" in ring.algorithms_connected
    with pytest.raises(NcclInputError, match="NCCL_ALGO"):
        used("a100-80gb", 8, 8, 1, "2.30.7", env={"NCCL_ALGO": "NVLS"}, uses=["all_reduce"])


def test_algorithm_rule() -> None:
    settings = settings_from()
    one_node, nodes, one_gpu = Layout(8, 8, 1), Layout(16, 8, 2), Layout(4, 1, 4)
    assert algorithm_for(Use("all_reduce"), one_node, settings, nvls_active=True) == "nvls"
    assert algorithm_for(Use("all_reduce"), one_node, settings, nvls_active=False) == "ring"
    assert algorithm_for(Use("all_reduce", 1024), nodes, settings, nvls_active=False) == "tree"
    assert algorithm_for(Use("all_reduce", 1 << 24), nodes, settings, nvls_active=False) == "ring"
    assert algorithm_for(Use("all_gather", 1024), one_gpu, settings, nvls_active=False) == "pat"
    assert algorithm_for(Use("send"), one_node, settings, nvls_active=True) == "p2p"
    assert algorithm_for(Use("all_reduce"), Layout(1, 1, 1), settings, nvls_active=False) is None
    with pytest.raises(NcclInputError, match="unknown collective"):
        Use("allreduce")


def test_send_recv_connects_per_peer_once() -> None:
    b = used(*H100_8, uses=[Use("send", peers=(3,)), Use("recv", peers=(3,)), Use("send", peers=(3,))])
    assert b.mechanism_bytes("p2p") == 32 * 12 * MIB
    assert b.by_paid_at() == {"init": 230 * MIB, "first send (p2p)": 32 * 2 * MIB, "first recv (p2p)": 32 * 10 * MIB}


def test_a_send_connects_only_the_send_side() -> None:
    """src/enqueue.cc: a send marks connectSend[peer], a receive connectRecv[peer]; each its own first use."""
    send = used(*H100_8, uses=[Use("send", peers=(3,))])
    assert {p.what.split(" connection")[0].split()[-1] for p in send.parts if p.mechanism == "p2p"} == {"send"}
    assert send.mechanism_bytes("p2p") == 32 * 2 * MIB  # ncclSendMem, rounded to 2 MiB, per channel
    recv = used(*H100_8, uses=[Use("recv", peers=(3,))])
    assert recv.mechanism_bytes("p2p") == 32 * 10 * MIB  # the receiver holds LL + LL128 + Simple


# ------------------------------------------------------------------------------------------ network


def test_network_buffers_live_in_host_memory_without_gdr() -> None:
    spark = topology_for("l4")
    b = used(spark, 4, 1, 4, "2.30.7", uses=[Use("all_reduce", 1 << 24)])
    ring_host = [p for p in b.parts if p.mechanism == "ring" and p.ledger == "host"]
    assert ring_host and all(p.bytes_each == 9633792 + 8192 for p in ring_host)
    assert b.mechanism_bytes("ring") == 0
    gdr = used(spark.with_changes(gdr=True), 4, 1, 4, "2.30.7", uses=[Use("all_reduce", 1 << 24)])
    assert gdr.mechanism_bytes("ring") > 0 and gdr.host_bytes < b.host_bytes


def test_network_sends_share_one_pool_and_receives_another() -> None:
    """src/transport/net.cc sharedNetBuffersInit: one pool per proxy peer and direction (type 0 send, 1 recv)."""
    pool = 32 * 16 * 128 * 1024
    sends = used("h100-80gb", 16, 8, 2, "2.30.7", uses=[Use("send", peers=(8,)), Use("send", peers=(9,))])
    assert sends.channels.p2p == 32
    assert sends.mechanism_bytes("net-shared-buffers") == pool
    both = used("h100-80gb", 16, 8, 2, "2.30.7", uses=[Use("send", peers=(8,)), Use("recv", peers=(9,))])
    assert both.mechanism_bytes("net-shared-buffers") == 2 * pool
    assert [p.paid_at for p in both.parts if p.mechanism == "net-shared-buffers"] == [
        "first send (p2p)",
        "first recv (p2p)",
    ]
    # runtime connect off: the send pool is allocated at init (proxySharedInit), the receive pool at first use
    off = used("h100-80gb", 16, 8, 2, "2.30.7", env={"NCCL_RUNTIME_CONNECT": "0"}, uses=[Use("recv", peers=(9,))])
    assert [p.paid_at for p in off.parts if p.mechanism == "net-shared-buffers"] == ["init", "first recv (p2p)"]


def test_single_rank_net_pool_defect_with_runtime_connect_off() -> None:
    off = communicator_bytes(*ONE_RANK, {"NCCL_RUNTIME_CONNECT": "0"})
    assert off.mechanism_bytes("net-shared-buffers") == 64 * 16 * 512 * 1024  # 536,870,912 B
    fixed = communicator_bytes("rtx3060-12gb", 1, 1, 1, "2.30.7+pr2366", {"NCCL_RUNTIME_CONNECT": "0"})
    assert fixed.mechanism_bytes("net-shared-buffers") == 0
    assert communicator_bytes(*ONE_RANK).mechanism_bytes("net-shared-buffers") == 0


# ------------------------------------------------------------------------------------------ split sharing


def test_split_sharing_is_decided_by_the_parent() -> None:
    share = {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}
    plain_parent = communicator_bytes(*H100_2)
    sharing_parent = communicator_bytes(*H100_2, share)
    child_asks = communicator_bytes(*H100_2, share, parent=plain_parent)
    assert not child_asks.split_shared and child_asks.device_bytes == 230 * MIB
    child = communicator_bytes(*H100_2, parent=sharing_parent)
    assert child.split_shared and child.nvls_shared and child.device_bytes == 132 * MIB


def test_nvls_is_shared_only_at_equal_local_rank_count() -> None:
    share = {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}
    parent = communicator_bytes(*H100_8, share)
    narrow = communicator_bytes("h100-80gb", 4, 4, 1, "2.30.7", share, parent=parent, members=(0, 1, 2, 3))
    assert narrow.split_shared and not narrow.nvls_shared
    assert narrow.mechanism_bytes("nvls-channels") > 0
    with pytest.raises(NcclInputError, match="members"):
        communicator_bytes("h100-80gb", 4, 4, 1, "2.30.7", share, parent=parent, members=(0, 1, 9, 3))


def test_a_sharing_child_reuses_its_parents_connections() -> None:
    share = {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}
    parent = used(*H100_8, env=share, uses=["all_gather"])
    child = used(*H100_8, env=share, uses=["all_gather"], parent=parent)
    assert child.mechanism_bytes("ring") == 0 and any("reused" in note for note in child.notes)
    fresh_child = used(*H100_8, env=share, uses=["all_gather"], parent=communicator_bytes(*H100_8, share))
    assert fresh_child.mechanism_bytes("ring") == 24 * 12 * MIB


# ------------------------------------------------------------------------------------------ phases, ledgers


def test_suspend_releases_channels_and_connections_not_device_comm_or_nvls() -> None:
    b = used(*H100_8, uses=["all_reduce", "all_gather"])
    kept = b.mechanism_bytes("device-comm") + sum(
        b.mechanism_bytes(m) for m in ("nvls-channels", "nvls-credit", "nvls-buffers")
    )
    assert b.suspendable_device_bytes == b.device_bytes - kept


def test_phase_init_ignores_uses_and_bad_phase_is_refused() -> None:
    assert communicator_bytes(*H100_8, None, None, "init", ["all_to_all"]).device_bytes == 230 * MIB
    with pytest.raises(NcclInputError, match="phase"):
        communicator_bytes(*H100_8, None, None, "later")  # type: ignore[arg-type]


def test_measured_overheads_are_separate_parts() -> None:
    b = communicator_bytes(
        *H100_8, fixed_overhead_bytes=3 * MIB, fixed_overhead_source="profile x", process_overhead_bytes=82 * MIB
    )
    assert b.mechanism_bytes("fixed-overhead") == 3 * MIB and b.mechanism_bytes("process-overhead") == 82 * MIB
    assert {p.figure for p in b.parts if p.mechanism.endswith("overhead")} == {"measured"}
    with pytest.raises(NcclInputError, match="fixed_overhead_bytes"):
        communicator_bytes(*H100_8, fixed_overhead_bytes=-1)


@pytest.mark.parametrize(("layout", "needle"), [((8, 4, 1), "nranks"), ((0, 1, 1), "nranks"), ((2, 2, 1, 2), "rank")])
def test_bad_layout_is_refused(layout: tuple[int, ...], needle: str) -> None:
    with pytest.raises(NcclInputError, match=needle):
        communicator_bytes("h100-80gb", *layout[:3], "2.30.7", rank=layout[3] if len(layout) > 3 else 0)


def test_uneven_groups_price_each_rank_by_its_own_node() -> None:
    big = [Use("all_reduce", 1 << 24)]  # a ring all_reduce across nodes
    three = used("h100-80gb", 4, 3, 2, "2.30.7", uses=big, node_sizes=(3, 1))
    alone = used("h100-80gb", 4, 1, 2, "2.30.7", uses=big, node_sizes=(3, 1), rank=3)
    assert three.nvls_active and not alone.nvls_active
    ring_transports = {p.what.split(" over ")[1].split()[0] for p in alone.parts if p.mechanism == "ring"}
    assert ring_transports == {"NET"}  # the lone rank reaches both ring neighbours over the network
    with pytest.raises(NcclInputError, match="node_sizes"):
        communicator_bytes("h100-80gb", 4, 3, 2, "2.30.7", node_sizes=(2, 1))
    with pytest.raises(NcclInputError, match="local_ranks"):
        communicator_bytes("h100-80gb", 4, 2, 2, "2.30.7", node_sizes=(3, 1))


def test_same_input_same_breakdown() -> None:
    first = used("h100-80gb", 32, 8, 4, "2.30.7", uses=["all_reduce", "all_to_all", "all_gather"], rank=13)
    second = used("h100-80gb", 32, 8, 4, "2.30.7", uses=["all_reduce", "all_to_all", "all_gather"], rank=13)
    assert first.to_dict() == second.to_dict()
    assert first.to_dict()["schema_version"] == 1


# ------------------------------------------------------------------------------------------ pricing one use at a time

RESUMED_USES = [
    Use("all_reduce", 64 * MIB),
    Use("all_gather", 1024),
    Use("send", peers=(1,)),
    Use("all_reduce", 1024),
    Use("all_to_all"),
    Use("broadcast", MIB),
]


@pytest.mark.parametrize(
    ("layout", "env", "kw"),
    [
        (H100_8, {}, {}),
        (("h100-80gb", 16, 8, 2, "2.30.7"), {}, {"rank": 9}),
        (("h100-80gb", 4, 1, 4, "2.30.7"), {"NCCL_RUNTIME_CONNECT": "0"}, {"rank": 2}),
        (("h100-80gb", 5, 3, 2, "2.30.7"), {}, {"rank": 4, "node_sizes": (2, 3)}),
        (("a100-80gb", 2, 1, 2, "2.21.5"), {"NCCL_CUMEM_ENABLE": "0"}, {"rank": 1}),
    ],
)
def test_resuming_from_the_breakdown_before_a_use_equals_pricing_every_use_again(layout, env, kw) -> None:
    """``resume``: what a first use adds on top of the breakdown before it is what pricing every phase from the
    start gives, part for part, connection for connection, note for note (Pricer extends one use at a time)."""
    before = used(*layout, env=env, uses=RESUMED_USES[:1], **kw)
    for k in range(2, len(RESUMED_USES) + 1):
        resumed = used(*layout, env=env, uses=RESUMED_USES[:k], resume=before, **kw)
        assert resumed == used(*layout, env=env, uses=RESUMED_USES[:k], **kw), RESUMED_USES[k - 1]
        before = resumed


CONNECT_CASES = [
    (H100_8, {}, {}),
    (("h100-80gb", 16, 8, 2, "2.30.7"), {}, {"rank": 9}),
    (("h100-80gb", 4, 1, 4, "2.30.7"), {"NCCL_RUNTIME_CONNECT": "0"}, {"rank": 2}),
    (("h100-80gb", 5, 3, 2, "2.30.7"), {}, {"rank": 4, "node_sizes": (2, 3)}),
    (("a100-80gb", 2, 1, 2, "2.21.5"), {"NCCL_CUMEM_ENABLE": "0"}, {"rank": 1}),
    (("a100-80gb", 8, 8, 1, "2.21.5"), {"NCCL_ALGO": "tree"}, {"rank": 3}),
    (("h100-80gb", 32, 8, 4, "2.30.7"), {"NCCL_COLLNET_ENABLE": "1"}, {"rank": 13}),
]


@pytest.mark.parametrize(("layout", "env", "kw"), CONNECT_CASES)
def test_connect_takes_from_its_table_what_the_connection_by_connection_walk_makes(
    layout, env, kw, monkeypatch
) -> None:
    """``_connect`` takes a communicator's first connections of an algorithm from a table made once per wanted
    tuple; every breakdown (fresh, each use added, a sharing child of each) must equal the one it gets when it
    walks every connection (``_walk``, which a sharing parent always takes)."""
    from simnccl.nccl import model

    taken = []
    real_takes = model._takes_the_table
    monkeypatch.setattr(model, "_takes_the_table", lambda *a: taken.append(real_takes(*a)) or taken[-1])

    def priced(**more: object) -> list[Breakdown]:
        out = [used(*layout, env=env, uses=RESUMED_USES[:k], **kw, **more) for k in range(len(RESUMED_USES) + 1)]
        parent = used(*layout, env={**env, "NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}, uses=RESUMED_USES, **kw)
        out.append(used(*layout, env=env, uses=RESUMED_USES, parent=parent, **kw, **more))
        return out

    fast = priced()
    assert any(taken) and not all(taken)  # the table was taken, and (for the sharing child) the walk too
    monkeypatch.setattr(model, "_takes_the_table", lambda *a: False)
    assert priced() == fast


def test_the_connection_tables_stay_bounded() -> None:
    """One table per wanted tuple, remembered by identity: a long run making ever new tuples must not grow it
    past what the connection caches can still hand back."""
    from simnccl.nccl import model

    for channel in range(model._WANTED_KEPT + 10):
        model._wanted((Connection(channel, 1, "send", 0, "p2p"),))
    assert 0 < len(model._WANTED) <= model._WANTED_KEPT


def test_resume_needs_a_use_to_add() -> None:
    base = used(*H100_8)
    with pytest.raises(NcclInputError, match="resume"):
        communicator_bytes(*H100_8, phase="init", resume=base)


def test_nchannels_per_net_peer_sets_the_network_peers_channels() -> None:
    """src/graph/paths.cc: NCCL_NCHANNELS_PER_NET_PEER replaces max(NICs, NIC bw / 14) per network peer, and
    NCCL then skips halving it to fit every peer in one round (ncclTopoComputeP2pChannels)."""
    default = communicator_bytes("h100-80gb", 64, 8, 8, "2.30.7")
    assert default.channels.p2p_per_peer == 4  # 8 NICs, halved once: 64 peers in batches of 8 over 32 channels
    set_ = communicator_bytes("h100-80gb", 64, 8, 8, "2.30.7", {"NCCL_NCHANNELS_PER_NET_PEER": "2"})
    assert set_.channels.p2p_per_peer == 2
    wide = communicator_bytes("h100-80gb", 64, 8, 8, "2.30.7", {"NCCL_NCHANNELS_PER_NET_PEER": "16"})
    assert wide.channels.p2p_per_peer == 16  # not halved: the user chose it
    ignored = communicator_bytes("h100-80gb", 64, 8, 8, "2.30.7", {"NCCL_NCHANNELS_PER_NET_PEER": "0"})
    assert ignored.channels == default.channels
    with pytest.raises(NcclInputError, match="NCCL_NCHANNELS_PER_NET_PEER"):
        communicator_bytes("h100-80gb", 64, 8, 8, "2.30.7", {"NCCL_NCHANNELS_PER_NET_PEER": "many"})


@pytest.mark.parametrize(
    ("version", "two_gpu_nvls"), [("2.17.1", True), ("2.18.3", False), ("2.28.3", False), ("2.28.7", True)]
)
def test_nvls_needs_three_gpus_from_2_18_to_2_28_3(version: str, two_gpu_nvls: bool) -> None:
    """src/transport/nvls.cc ncclNvlsInit: 'gpuCount <= 2' returned without NVLS until 2.28.7 ('< 2')."""
    assert communicator_bytes("h100-80gb", 2, 2, 1, version).nvls_active is two_gpu_nvls
    assert communicator_bytes("h100-80gb", 3, 3, 1, version).nvls_active


def test_a_child_of_more_ranks_than_its_parent_is_refused_with_or_without_members() -> None:
    """``members`` defaults to the parent's first ranks, valid exactly when the parent has as many: the default
    is checked by that count, given members rank by rank (the same errors either way)."""
    parent = communicator_bytes("h100-80gb", 4, 4, 1, "2.28.7")
    with pytest.raises(NcclInputError, match=r"members: expected 8 ranks of the parent \(0\.\.3\)"):
        communicator_bytes("h100-80gb", 8, 8, 1, "2.28.7", parent=parent)
    with pytest.raises(NcclInputError, match=r"members: expected 2 ranks of the parent \(0\.\.3\), got \(0, 4\)"):
        communicator_bytes("h100-80gb", 2, 2, 1, "2.28.7", parent=parent, members=(0, 4))
    default = communicator_bytes("h100-80gb", 2, 2, 1, "2.28.7", parent=parent)
    assert default == communicator_bytes("h100-80gb", 2, 2, 1, "2.28.7", parent=parent, members=(0, 1))
