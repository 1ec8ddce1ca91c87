"""The NCCL_DEBUG=INFO parser of `rlrun check --fabric` (rlrun/fabric/nccl_log.py), on lines in the formats
NCCL printed in public reports: NVIDIA/nccl #1189 (P2P/CUMEM beside NET/IB/GDRDMA), nccl-tests #252 (the
IBext plugin), nccl #952 and nccl-tests #188 (P2P/IPC/read, NET/Socket/3, bus-id ranks), ParCIS/Chimera #2
(the old `Channel 00 :` form with SHM/direct/direct), nccl #226 (NCCL 2.4's `Ring 00 :`), nccl #1232
(torchrun's `[rank]` prefix), nccl #1267, #1504, #1053 (Bootstrap / NET/Socket : Using / Using network /
NCCL version), nccl #529 (IPv6 interface addresses), deit #28 (NET/IB : Using ... ; OOB). Host names,
addresses and pids here are made up; the shapes are NCCL's."""

from __future__ import annotations

from rlrun.fabric.nccl_log import between, main_transport, parse, transport_family

X4_NODE1 = """\
gpu-x4:1201:1201 [0] NCCL INFO Bootstrap : Using lo:127.0.0.7<0>
gpu-x4:1201:1201 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to lo
gpu-x4:1201:1201 [0] NCCL INFO cudaDriverVersion 13000
NCCL version 2.28.9+cuda13.0
gpu-x4:1201:1288 [0] NCCL INFO NET/IB : No device found.
gpu-x4:1201:1288 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.7<0>
gpu-x4:1201:1288 [0] NCCL INFO Using network Socket
gpu-x4:1201:1288 [0] NCCL INFO comm 0x55d0c1a8 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0
gpu-x4:1201:1288 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[2] [send] via NET/Socket/0
gpu-x4:1201:1288 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[2] [send] via NET/Socket/0
gpu-x4:1201:1288 [0] NCCL INFO Channel 00/0 : 1[2] -> 0[0] [receive] via NET/Socket/0
gpu-x4:1201:1288 [0] NCCL INFO Connected all rings
"""


def test_a_socket_pair_between_two_hosts_names_net_socket_and_its_interface():
    log = parse(X4_NODE1.splitlines())
    assert log.version == "2.28.9+cuda13.0"
    assert log.network == "Socket"
    assert log.bootstrap == {"interface": "lo", "address": "127.0.0.7"}
    assert log.env == {"NCCL_SOCKET_IFNAME": "lo"}
    assert log.transports() == {"NET/Socket": 3}
    assert [(c.src, c.dst, c.direction) for c in log.channels] == [(0, 1, "send"), (0, 1, "send"), (1, 0, "receive")]
    assert {log.interface(c) for c in log.channels} == {"lo"}
    assert main_transport(between(log, 0, 1)) == "NET/Socket"
    assert log.warnings == []


def test_p2p_shm_and_ib_forms_of_every_nccl_generation():
    lines = [
        "h20-a:4015539:4015652 [0] NCCL INFO Channel 07/0 : 0[0] -> 2[0] [receive] via NET/IB/3/GDRDMA",
        "h20-a:4015540:4015653 [1] NCCL INFO Channel 00/0 : 3[1] -> 2[0] via P2P/CUMEM",
        "h20-b:1789225:1789736 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM/read",
        "node1:27225:27907 [3] NCCL INFO Channel 03/0 : 7[3] -> 3[3] [send] via NET/IBext_v8/3/GDRDMA",
        "node7:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read",
        "user:169132:169177 [7] NCCL INFO Channel 00/0 : 15[ca000] -> 0[27000] [send] via NET/Socket/3",
        "dev-box:65957:67361 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct",
        "ip-10-0-0-1:45328:45333 [0] NCCL INFO Ring 00 : 35 -> 34 [send] via NET/Socket/0",
        "[1] node2:22555:22555 [0] NCCL INFO Channel 00/0 : 2[1] -> 1[0] [receive] via NET/Socket/0",
        "gcn14:3570216:3570216 [0] NCCL INFO Channel 02 : 10[ca000] -> 8[31000] via P2P/direct pointer",
    ]
    chans = parse(lines).channels
    assert [c.transport for c in chans] == ["NET/IB", "P2P/CUMEM", "P2P/CUMEM", "NET/IB", "P2P/IPC", "NET/Socket",
                                            "SHM", "NET/Socket", "NET/Socket", "P2P/direct"]
    assert [c.gdr for c in chans[:4]] == [True, False, False, True]
    assert [c.net_device for c in chans] == [3, None, None, 3, None, 3, None, 0, 0, None]
    assert (chans[5].src, chans[5].dst) == (15, 0)  # bus ids in the brackets, not device numbers
    assert (chans[7].src, chans[7].dst, chans[7].direction) == (35, 34, "send")
    assert chans[8].via == "NET/Socket/0"


def test_transport_family_of_the_via_field():
    assert transport_family("NET/Socket/0") == ("NET/Socket", 0, False)
    assert transport_family("NET/IB/1/GDRDMA") == ("NET/IB", 1, True)
    assert transport_family("NET/IBext_v8/3/GDRDMA") == ("NET/IB", 3, True)
    assert transport_family("NET/AWS Libfabric/2") == ("NET/AWS Libfabric", 2, False)
    assert transport_family("P2P/CUMEM/read") == ("P2P/CUMEM", None, False)
    assert transport_family("P2P/direct pointer/read") == ("P2P/direct", None, False)
    assert transport_family("SHM/direct/direct") == ("SHM", None, False)


def test_several_socket_interfaces_the_channel_index_picks_one():
    lines = [
        "box:852750:852802 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.",
        "box:852750:852802 [0] NCCL INFO NET/Socket : Using [0]ibs85f0:192.168.1.14<0> [1]ib0:192.168.1.15<0>",
        "box:852750:852802 [0] NCCL INFO Using network Socket",
        "box:852750:852802 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/1",
        "box:852750:852802 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    ]
    log = parse(lines)
    assert log.env == {"NCCL_IB_DISABLE": "1"}
    assert [d["name"] for d in log.net_devices["Socket"]] == ["ibs85f0", "ib0"]
    assert [log.interface(c) for c in log.channels] == ["ib0", "ibs85f0"]


def test_ib_adapters_and_the_out_of_band_interface():
    lines = [
        "gpu-dev6:25486:25486 [0] NCCL INFO Bootstrap : Using [0]enp7s0:10.10.112.56<0> [1]virbr0:192.168.122.1<0>",
        "gpu-dev6:25486:25486 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB enp7s0:10.10.112.56<0>",
        "gpu-dev6:25486:25486 [0] NCCL INFO Using network IB",
        "gpu-dev6:25486:25486 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/1/GDRDMA",
    ]
    log = parse(lines)
    assert log.bootstrap == {"interface": "enp7s0", "address": "10.10.112.56"}
    assert [d["name"] for d in log.net_devices["IB"]] == ["mlx5_0", "mlx5_1"]  # the OOB interface is not an adapter
    assert log.network == "IB"
    assert log.interface(log.channels[0]) == "mlx5_1:1/RoCE"


def test_ipv6_addresses_warnings_and_noise():
    lines = [
        "yt-job:97:221 [0] NCCL INFO NET/Socket : Using [0]ip6tnl0:fe80::e866:19ff:fe1e:a688%ip6tnl0<0> "
        "[1]veth0:2a02:6b8:fc1d:3606:0:4457:edef:600a<0>",
        "node0:13571:13571 [0] misc/socket.cc:484 NCCL WARN socketProgress: Connection closed by remote peer node2<42830>",
        "node0:13571:13571 [0] NCCL WARN Call to connect returned Connection refused, retrying",
        "Traceback (most recent call last):",
        "some other program's line with via NET/Socket/0 in it",
        "host:1:2 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1",
        "host:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
    ]
    log = parse(lines)
    assert [(d["name"], d["address"]) for d in log.net_devices["Socket"]] == [
        ("ip6tnl0", "fe80::e866:19ff:fe1e:a688%ip6tnl0"), ("veth0", "2a02:6b8:fc1d:3606:0:4457:edef:600a")]
    assert log.warnings == ["socketProgress: Connection closed by remote peer node2<42830>",  # with its source line
                            "Call to connect returned Connection refused, retrying"]
    assert log.channels == []
    assert log.version == "2.21.5+cuda12.4"
    assert main_transport([]) is None


def test_between_keeps_the_pair_and_main_transport_counts():
    lines = [
        "n1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "n1:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "n1:1:2 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0",
        "n1:1:2 [0] NCCL INFO Channel 00/0 : 2[0] -> 0[0] [receive] via NET/Socket/0",
    ]
    log = parse(lines)
    assert main_transport(between(log, 0, 1)) == "P2P/CUMEM"
    assert main_transport(between(log, 0, 2)) == "NET/Socket"
    assert between(log, 1, 0) == between(log, 0, 1)
    assert log.to_json()["transports"] == {"P2P/CUMEM": 2, "NET/Socket": 2}
