"""The network-namespace harness (tests/netns.py): hosts reach each other over real interfaces and
nothing else, a host can refuse every inbound connection and still connect out, and teardown leaves
nothing behind.

Every test skips, with the reason, where namespaces cannot be created (not root, no iproute2, a
sandbox without netns support)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import netns
import pytest
from netns import available, hosts, netns_names, sweep_stale


@pytest.fixture(autouse=True)
def _need_netns():
    ok, reason = available()
    if not ok:
        pytest.skip(reason)


def _root_links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout


def _wait_in_namespace(name: str, pid: int, timeout_s: float = 5.0) -> None:
    """Until `ip netns exec` has entered the namespace (pid listed by `ip netns pids`)."""
    end = time.monotonic() + timeout_s
    while pid not in netns._netns_pids(name):
        assert time.monotonic() < end, f"pid {pid} never appeared in namespace {name}"
        time.sleep(0.02)


# --- 1. reachability --------------------------------------------------------------------------------

ECHO_SERVER = """
import socket, sys
s = socket.socket()
s.settimeout(10)
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
conn, peer = s.accept()
data = conn.recv(100)
conn.sendall(b"pong:" + data)
print(peer[0], flush=True)
"""

ECHO_CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
c.sendall(b"ping")
print(c.recv(100).decode())
"""

PROBE = """
import errno, json, socket, sys
out = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        out[target] = "connected"
    except OSError as exc:
        out[target] = errno.errorcode.get(exc.errno, type(exc).__name__)
print(json.dumps(out))
"""


def test_two_hosts_talk_over_their_interfaces():
    with hosts(2) as (a, b):
        assert a.address.rsplit(".", 1)[0] == b.address.rsplit(".", 1)[0]  # one /24
        assert (a.address.rsplit(".", 1)[1], b.address.rsplit(".", 1)[1]) == ("1", "2")
        # each host sees exactly loopback and its own interface, holding its address
        addrs = a.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
        assert f"{a.interface}    inet {a.address}/24" in addrs and "127.0.0.1/8" in addrs
        assert len(addrs.splitlines()) == 2, addrs

        server = a.popen([sys.executable, "-c", ECHO_SERVER, a.address], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        port = server.stdout.readline().strip()
        assert port.isdigit(), server.communicate(timeout=5)
        client = b.run([sys.executable, "-c", ECHO_CLIENT, a.address, port], capture_output=True,
                       text=True, timeout=10)
        assert client.returncode == 0, client.stderr
        assert client.stdout.strip() == "pong:ping"
        out, err = server.communicate(timeout=10)
        assert server.returncode == 0, err
        assert out.strip() == b.address  # the connection came from b's interface


def test_hosts_cannot_reach_the_root_namespace():
    """A server on 127.0.0.1 in this (root-namespace) process is refused from inside a namespace --
    the namespace's own, empty loopback answers -- and the root's real addresses have no route."""
    root_addrs = [line.split()[3].split("/")[0] for line in subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, check=True
    ).stdout.splitlines()]
    with socket.socket() as loopback, socket.socket() as anywhere:
        loopback.bind(("127.0.0.1", 0))
        loopback.listen()
        anywhere.bind(("0.0.0.0", 0))
        anywhere.listen()
        targets = [f"127.0.0.1:{loopback.getsockname()[1]}"]
        targets += [f"{ip}:{anywhere.getsockname()[1]}" for ip in root_addrs]
        # control: the servers are there for a client in the root namespace
        socket.create_connection(("127.0.0.1", loopback.getsockname()[1]), timeout=2).close()
        with hosts(1) as (h,):
            probe = h.run([sys.executable, "-c", PROBE, *targets], capture_output=True, text=True, timeout=20)
    assert probe.returncode == 0, probe.stderr
    outcome = json.loads(probe.stdout)
    assert outcome[targets[0]] == "ECONNREFUSED", outcome
    for target in targets[1:]:
        assert outcome[target] in ("ENETUNREACH", "EHOSTUNREACH", "timeout", "TimeoutError"), outcome


# --- 2. a host that accepts no inbound connection ------------------------------------------------


def test_a_host_that_blocks_inbound_connections_can_still_connect_out():
    """`Host.block_inbound`: a server on the blocked host is unreachable from another host (its SYN is
    dropped: the client times out), while the blocked host reaches a server on the other host."""
    import shutil

    if shutil.which("nft") is None:
        pytest.skip("nftables (nft) is not installed")
    with hosts(2) as (open_host, closed):
        closed.block_inbound()
        server = closed.popen([sys.executable, "-c", ECHO_SERVER, closed.address], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        port = server.stdout.readline().strip()
        probe = open_host.run([sys.executable, "-c", PROBE, f"{closed.address}:{port}"], capture_output=True,
                              text=True, timeout=20)
        assert json.loads(probe.stdout)[f"{closed.address}:{port}"] in ("timeout", "TimeoutError"), probe.stdout
        server.kill()
        out_server = open_host.popen([sys.executable, "-c", ECHO_SERVER, open_host.address], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        out_port = out_server.stdout.readline().strip()
        client = closed.run([sys.executable, "-c", ECHO_CLIENT, open_host.address, out_port], capture_output=True,
                            text=True, timeout=10)
        assert client.returncode == 0 and client.stdout.strip() == "pong:ping", client.stderr
        out_server.communicate(timeout=10)


# --- 3. teardown -----------------------------------------------------------------------------------

def _assert_gone(names: list[str], tag: str, pids: list[int]) -> None:
    left = set(names) & set(netns_names())
    assert not left, f"namespaces left behind: {left}"
    assert tag not in _root_links()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"process {pid} survived the teardown"


def _populate(hs) -> tuple[list[str], str, list[int], subprocess.Popen]:
    """Names, tag and the pids of stray processes: one started with Host.popen, one started around it
    (`Host.command`), which teardown must find with `ip netns pids`."""
    tag = hs[0].name.rsplit("-", 1)[0]
    names = [h.name for h in hs] + [f"{tag}-br"]
    assert set(names) <= set(netns_names())
    registered = hs[0].popen(["sleep", "60"])
    stray = subprocess.Popen(hs[-1].command(["sleep", "60"]))
    for h, p in ((hs[0], registered), (hs[-1], stray)):
        _wait_in_namespace(h.name, p.pid)
    return names, tag, [registered.pid, stray.pid], stray


@pytest.mark.timed
def test_teardown_leaves_nothing():
    t0 = time.monotonic()
    with hosts(3) as hs:
        names, tag, pids, stray = _populate(hs)
        assert all(len(h.interface) <= 15 for h in hs)
    assert stray.wait(timeout=5) == -9  # killed by the teardown (we reap it: it is our child)
    _assert_gone(names, tag, pids)
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("exc", [ValueError, KeyboardInterrupt])
def test_teardown_after_an_exception(exc):
    with pytest.raises(exc):
        with hosts(2) as hs:
            names, tag, pids, stray = _populate(hs)
            raise exc("boom")
    assert stray.wait(timeout=5) == -9
    _assert_gone(names, tag, pids)


def test_names_are_unique_per_run_and_fit_interface_limits():
    with hosts(2) as outer, hosts(2, prefix="abc") as inner:
        everything = [h.name for h in outer + inner] + [h.interface for h in outer + inner]
        assert len(set(everything)) == len(everything)
        assert all(h.name.startswith("fv") for h in outer) and all(h.name.startswith("abc") for h in inner)
        assert all(len(h.interface) <= 15 for h in outer + inner)
        command = outer[0].command(["true"], env={"A": "1"})
        assert command == ["ip", "netns", "exec", outer[0].name, "env", "A=1", "true"]
        assert outer[1].env(base={}, RANK=1) == {"RANK": "1"}
    for bad in ("", "toolong", "Fv", "f1"):
        with pytest.raises(ValueError):
            with hosts(1, prefix=bad):
                pass
    with pytest.raises(ValueError):
        with hosts(0):
            pass


def test_sweep_removes_namespaces_of_dead_runs_only():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"fv{dead.pid}zz-0"
    live = f"{netns._new_tag('fv')}-0"  # this process's pid: alive
    try:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "add", name], check=True)
        assert stale in sweep_stale()
        names = netns_names()
        assert stale not in names and live in names
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
