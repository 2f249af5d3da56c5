"""The real tier's docker daemon helper (tests/helpers/dockerd.py), its logic without a daemon: the
subnet of its own bridge never overlaps the host's routes or addresses, and only dead test daemons'
folders are cleaned (what a killed run left made every later daemon's container unreachable)."""

from __future__ import annotations

import ipaddress
import random
from pathlib import Path

import pytest

from tests.helpers.dockerd import SUBNET_POOL, find_leftovers, mounts_under, pick_subnet, route_networks

N = ipaddress.IPv4Network

# `ip -4 -j route show table all` and `ip -4 -j addr` as a docker host with a compose network says them
ROUTES = [
    {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0", "flags": []},
    {"dst": "192.0.2.0/24", "dev": "eth0", "protocol": "kernel", "scope": "link", "prefsrc": "192.0.2.2"},
    {"dst": "10.213.7.0/24", "dev": "br-3f2a", "protocol": "kernel", "scope": "link", "prefsrc": "10.213.7.1"},
    {"dst": "10.213.64.0/20", "dev": "wg0", "scope": "link"},
    {"type": "local", "dst": "127.0.0.1", "dev": "lo", "table": "local", "scope": "host"},
    {"dst": "10.213.200.9", "gateway": "192.0.2.1", "dev": "eth0"},
]
ADDRS = [
    {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    {"ifname": "docker0", "addr_info": [{"family": "inet", "local": "172.17.0.1", "prefixlen": 16}]},
    {"ifname": "vtb4242", "addr_info": [{"family": "inet", "local": "10.213.130.1", "prefixlen": 24}]},
]


def test_the_hosts_networks_are_its_routes_and_addresses_not_the_default_route() -> None:
    nets = route_networks(ROUTES, ADDRS)
    for want in ("192.0.2.0/24", "10.213.7.0/24", "10.213.64.0/20", "127.0.0.1/32", "10.213.200.9/32",
                 "127.0.0.0/8", "172.17.0.0/16", "10.213.130.0/24"):
        assert N(want) in nets, want
    assert all(n.prefixlen > 0 for n in nets)  # the default route overlaps everything: not taken


def test_the_picked_subnet_overlaps_no_route_or_address() -> None:
    taken = route_networks(ROUTES, ADDRS)
    busy = {n for n in SUBNET_POOL.subnets(new_prefix=24) if any(n.overlaps(t) for t in taken)}
    assert len(busy) == 1 + 16 + 1 + 1  # .7, the /20 at .64, .130, and .200 (a host route in it)
    for seed in range(300):
        got = pick_subnet(taken, random.Random(seed))
        assert got.prefixlen == 24 and got.subnet_of(SUBNET_POOL) and got not in busy, (seed, got)


def test_the_one_free_subnet_is_found_and_none_free_is_said() -> None:
    free = N("10.213.77.0/24")
    taken = [n for n in SUBNET_POOL.subnets(new_prefix=24) if n != free]
    assert {pick_subnet(taken, random.Random(seed)) for seed in range(50)} == {free}
    with pytest.raises(ValueError, match="overlaps"):
        pick_subnet([*taken, N("10.213.77.128/25")], random.Random(0))


def _folder(tmp: Path, owner: int, *, dockerd: int | None = None, containerd: int | None = None,
            bridge: str | None = None) -> Path:
    d = tmp / f"vtop-docker-{owner}"
    (d / "exec" / "netns").mkdir(parents=True)
    (d / "exec" / "containerd").mkdir()
    if dockerd is not None:
        (d / "dockerd.pid").write_text(f"{dockerd}\n")
    if containerd is not None:
        (d / "exec" / "containerd" / "containerd.pid").write_text(str(containerd))
    if bridge is not None:
        (d / "bridge").write_text(bridge + "\n")
    return d


def _mountinfo(tmp: Path) -> str:
    """/proc/self/mountinfo text: two netns of a dead daemon (one path with a space), its shm, and one
    netns each of a live daemon and of a folder whose name only starts like the dead one's."""
    lines = [
        "22 27 0:21 / /proc rw,relatime - proc proc rw",
        f"501 27 0:4 net:[4026532301] {tmp}/vtop-docker-111/exec/netns/61226ecad913 rw shared:5 - nsfs nsfs rw",
        f"502 27 0:4 net:[4026532302] {tmp}/vtop-docker-111/exec/netns/a\\040b rw shared:5 - nsfs nsfs rw",
        f"503 27 0:55 / {tmp}/vtop-docker-111/data/containers/c1/mounts/shm rw - tmpfs shm rw,size=2097152k",
        f"504 27 0:4 net:[4026532303] {tmp}/vtop-docker-222/exec/netns/ff45abefcb9a rw - nsfs nsfs rw",
        f"505 27 0:4 net:[4026532304] {tmp}/vtop-docker-1111/exec/netns/0b1e rw - nsfs nsfs rw",
    ]
    return "\n".join(lines) + "\n"


def test_mounts_under_a_folder_deepest_first_and_only_its_own(tmp_path: Path) -> None:
    got = mounts_under(_mountinfo(tmp_path), tmp_path / "vtop-docker-111")
    assert got[0] == f"{tmp_path}/vtop-docker-111/data/containers/c1/mounts/shm"  # deepest first
    assert sorted(got[1:]) == [f"{tmp_path}/vtop-docker-111/exec/netns/61226ecad913",
                               f"{tmp_path}/vtop-docker-111/exec/netns/a b"]


def test_only_dead_test_daemons_folders_are_leftovers(tmp_path: Path) -> None:
    live = {2001, 3001, 4000, 6001}
    dead = _folder(tmp_path, 111, dockerd=1001, containerd=1002, bridge="vtb111")  # all of it dead
    _folder(tmp_path, 222, dockerd=2001)  # its daemon runs (the test process that made it is gone)
    _folder(tmp_path, 1111, dockerd=1501, containerd=3001)  # containerd outlived its dockerd
    _folder(tmp_path, 4000)  # its test process runs; its daemon starting has no pid file yet
    _folder(tmp_path, 5000, dockerd=5001)  # dead daemon, but a container's shim names the folder
    mine = _folder(tmp_path, 6000, dockerd=6101)  # this process's own folder from a dead earlier run
    _folder(tmp_path, 7000, dockerd=6001)  # live by its dockerd only
    (tmp_path / "vtop-docker-notapid").mkdir()
    (tmp_path / "vtop-docker-8000").write_text("a file, not a folder")
    shim = (f"/usr/bin/containerd-shim-runc-v2 -namespace moby -id c1 -address "
            f"{tmp_path}/vtop-docker-5000/exec/containerd/containerd.sock")
    found = find_leftovers(tmp_path, _mountinfo(tmp_path), lambda pid: pid in live, me=6000,
                           cmdlines=["/usr/sbin/sshd -D", shim])
    assert [lo.root for lo in found] == [dead, mine]
    assert found[0].bridge == "vtb111" and found[1].bridge is None
    assert set(found[0].mounts) == {f"{dead}/exec/netns/61226ecad913", f"{dead}/exec/netns/a b",
                                    f"{dead}/data/containers/c1/mounts/shm"}
    assert found[1].mounts == ()
    # the same tree seen by another process: 6000's folder is alive while its test process runs
    found = find_leftovers(tmp_path, _mountinfo(tmp_path), lambda pid: pid in live | {6000}, me=9,
                           cmdlines=[shim])
    assert [lo.root for lo in found] == [dead]
