"""Emulated wide-area links between the hosts of a `tests/netns.py` network, and a probe that measures them.

Model: every host (one role of a federation) sits on an access link of round-trip time RTT and rate R,
the same R in both directions; any two hosts reach each other with a one-way delay of RTT / 2. So the
active party, which relays every passive party's frames, shares its one link among all of them, as a
real institution's uplink would be shared.

Two ways to build that link, chosen per kernel (`has_netem`):
- `netem` (a standard Linux kernel): `tc netem delay RTT/2 rate R` on each host's interface (its uplink)
  and a token bucket (`tc tbf rate R`) on the bridge port that faces it (its downlink).
- `relay` (a kernel without `sch_netem`, as on this project's build machine): token buckets on both sides
  of each host's link for the rate, and the delay in user space: every role that dials out dials a local
  `relay` in its own namespace, which forwards to the real peer and holds every chunk for RTT / 2 in each
  direction, order preserved. Each connection of a federation is dialed by exactly one side (the passive
  parties dial the active party and the he aggregator, the active party dials the aggregator), so each
  connection crosses exactly one relay and sees RTT / 2 each way. The parties pin keys, not addresses, so
  the relay (which sees only TLS records) changes nothing else. What the relay does not reproduce: the
  kernel's TCP congestion window over the delay (its TCP legs have no delay of their own); gRPC's HTTP/2
  flow control, which is end to end, does see the full RTT.

`probe` measures what a link really is (the round trip of a 64-byte ping-pong, and the goodput of a bulk
upload and download between two hosts, through a relay where the relay mode puts one); the benchmark
reports those measurements next to every result, so an emulation that falls short is visible.

Command line (each runs inside a namespace, started by the benchmark or a test):

    python bench/wanlink.py relay --delay-ms D --map LOCALPORT=HOST:PORT [--map ...]
    python bench/wanlink.py probe-server --listen HOST:PORT
    python bench/wanlink.py probe --to HOST:PORT [--pings N] [--bytes N]     (prints one JSON object)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import queue
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

CHUNK = 1 << 20
PING_BYTES = 64
_HEADER = struct.Struct("!cQ")  # command (b"p" ping, b"u" upload, b"d" download) and a length


@dataclass(frozen=True)
class Link:
    """An access link: round-trip time in ms, rate in Mbit/s (each direction)."""

    name: str
    rtt_ms: float
    mbit: float

    @property
    def one_way_s(self) -> float:
        return self.rtt_ms / 2000.0

    def label(self) -> str:
        rate = f"{self.mbit / 1000:g} Gbit/s" if self.mbit >= 1000 else f"{self.mbit:g} Mbit/s"
        return f"{self.rtt_ms:g} ms RTT / {rate}"


LINKS = {link.name: link for link in (Link("1ms-10gbit", 1.0, 10_000.0), Link("20ms-100mbit", 20.0, 100.0),
                                      Link("50ms-20mbit", 50.0, 20.0))}
MODES = ("netem", "relay")


# -- shaping ------------------------------------------------------------------------------------------


def tbf_command(dev: str, link: Link) -> list[str]:
    """A token bucket of the link's rate on `dev`'s egress: a burst of 2 ms of traffic (at least 64 KiB, so
    that a segmentation-offloaded packet fits) and a queue of one RTT plus 20 ms."""
    burst = max(64 << 10, int(link.mbit * 1e6 / 8 * 0.002))
    return ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{link.mbit:g}mbit", "burst", str(burst),
            "latency", f"{link.rtt_ms + 20:g}ms"]


def netem_command(dev: str, link: Link) -> list[str]:
    """netem on `dev`'s egress: half the round trip, the link's rate, a queue long enough for any BDP here."""
    return ["tc", "qdisc", "replace", "dev", dev, "root", "netem", "delay", f"{link.rtt_ms / 2:g}ms",
            "rate", f"{link.mbit:g}mbit", "limit", "100000"]


def _in_netns(netns: str, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", "netns", "exec", netns, *argv], capture_output=True, text=True, timeout=20,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` in {netns} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def has_netem(netns: str) -> bool:
    """Whether the kernel has `sch_netem` (tried on the loopback of namespace `netns`, then removed)."""
    probe = _in_netns(netns, ["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], check=False)
    if probe.returncode != 0:
        return False
    _in_netns(netns, ["tc", "qdisc", "del", "dev", "lo", "root"], check=False)
    return True


def bridge_netns(host) -> str:
    """The namespace of the bridge behind a `tests/netns.py` host (`<tag>-<i>` -> `<tag>-br`)."""
    return host.name.rsplit("-", 1)[0] + "-br"


def shape(hosts, link: Link, mode: str) -> None:
    """Give every host its access link: uplink on its interface, downlink on the bridge port facing it
    (`p<i>`, tests/netns.py's fixed name); `mode` is "netem" or "relay" (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    for host in hosts:
        uplink = netem_command(host.interface, link) if mode == "netem" else tbf_command(host.interface, link)
        _in_netns(host.name, uplink)
        _in_netns(bridge_netns(host), tbf_command(f"p{host.index}", link))


# -- the delay relay ----------------------------------------------------------------------------------


def _nodelay(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_into(src: socket.socket, held: queue.SimpleQueue, delay_s: float) -> None:
    """Read `src` until it ends; every chunk goes into `held` with the time it may leave."""
    total = 0
    while True:
        try:
            data = src.recv(CHUNK)
        except OSError as error:
            _note(f"{_ends(src)}: read failed after {total} bytes: {error}")
            data = b""
        total += len(data)
        held.put((time.monotonic() + delay_s, data))
        if not data:
            _note(f"{_ends(src)}: ended after {total} bytes")
            return


def _ends(sock: socket.socket) -> str:
    with contextlib.suppress(OSError):
        return f"{sock.getpeername()} -> {sock.getsockname()}"
    return "a closed socket"


def _note(text: str) -> None:
    """One line on stderr per connection event (the launcher keeps it in the relay's log)."""
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def delayed_pump(src: socket.socket, dst: socket.socket, delay_s: float) -> None:
    """Copy `src` to `dst`, each chunk `delay_s` after it arrived, in order; `dst`'s write side is shut when
    `src` ends (or `dst` fails)."""
    held: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read_into, args=(src, held, delay_s), daemon=True).start()
    while True:
        due, data = held.get()
        if (wait := due - time.monotonic()) > 0:
            time.sleep(wait)
        try:
            if not data:
                break
            dst.sendall(data)
        except OSError as error:
            _note(f"{_ends(dst)}: write failed: {error}")
            break
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _relay_one(client: socket.socket, target: tuple[str, int], delay_s: float) -> None:
    try:
        upstream = _nodelay(socket.create_connection(target, timeout=10))
    except OSError:
        client.close()  # the dialer sees a closed connection and retries, as it would without a relay
        return
    upstream.settimeout(None)
    pumps = [threading.Thread(target=delayed_pump, args=pair, daemon=True)
             for pair in ((client, upstream, delay_s), (upstream, client, delay_s))]
    for pump in pumps:
        pump.start()
    for pump in pumps:
        pump.join()
    client.close()
    upstream.close()


def _accept_loop(listener: socket.socket, target: tuple[str, int], delay_s: float) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_relay_one, args=(_nodelay(client), target, delay_s), daemon=True).start()


def serve_relay(maps: dict[int, tuple[str, int]], delay_s: float) -> list[socket.socket]:
    """Listen on 127.0.0.1:PORT for every PORT of `maps` and relay each connection to its target with
    `delay_s` each way (threads; returns the listeners, already serving)."""
    listeners = []
    for port, target in maps.items():
        listener = socket.create_server(("127.0.0.1", port))
        threading.Thread(target=_accept_loop, args=(listener, target, delay_s), daemon=True).start()
        listeners.append(listener)
    return listeners


# -- the probe ----------------------------------------------------------------------------------------


def _recv_exact(sock: socket.socket, n: int, digest=None) -> bytes | None:
    """n bytes from `sock` (into `digest` instead of memory when given); raises ConnectionError at EOF."""
    parts, left = [], n
    while left:
        data = sock.recv(min(left, CHUNK))
        if not data:
            raise ConnectionError(f"the peer closed the connection with {left} of {n} bytes to come")
        left -= len(data)
        if digest is not None:
            digest.update(data)
        else:
            parts.append(data)
    return None if digest is not None else b"".join(parts)


def _serve_probe_connection(conn: socket.socket) -> None:
    block = bytes(range(256)) * (CHUNK // 256)
    with conn:
        while True:
            try:
                command, n = _HEADER.unpack(_recv_exact(conn, _HEADER.size))
            except (ConnectionError, OSError):
                return
            if command == b"p":
                conn.sendall(_recv_exact(conn, n))
            elif command == b"u":
                digest = hashlib.sha256()
                _recv_exact(conn, n, digest)
                conn.sendall(digest.digest())
            elif command == b"d":
                for start in range(0, n, CHUNK):
                    conn.sendall(block[:min(CHUNK, n - start)])


def serve_probe(listener: socket.socket) -> None:
    """The far end of `probe` on a bound listener: echo pings, hash uploads, send downloads (forever; one
    thread per client)."""
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_probe_connection, args=(_nodelay(conn),), daemon=True).start()


def _ping_ms(sock: socket.socket) -> float:
    payload = b"x" * PING_BYTES
    began = time.perf_counter()
    sock.sendall(_HEADER.pack(b"p", PING_BYTES) + payload)
    _recv_exact(sock, PING_BYTES)
    return (time.perf_counter() - began) * 1000.0


def _upload_s(sock: socket.socket, n: int) -> float:
    data = bytes(range(256)) * (CHUNK // 256)
    expected = hashlib.sha256()
    began = time.perf_counter()
    sock.sendall(_HEADER.pack(b"u", n))
    for start in range(0, n, CHUNK):
        piece = data[:min(CHUNK, n - start)]
        expected.update(piece)
        sock.sendall(piece)
    if _recv_exact(sock, 32) != expected.digest():
        raise ConnectionError("the upload arrived altered")
    return time.perf_counter() - began


def _download_s(sock: socket.socket, n: int) -> float:
    began = time.perf_counter()
    sock.sendall(_HEADER.pack(b"d", n))
    _recv_exact(sock, n, hashlib.sha256())
    return time.perf_counter() - began


def probe(to: tuple[str, int], pings: int = 20, n_bytes: int = 8 << 20, deadline_s: float = 30.0) -> dict:
    """Measure the link to a `serve_probe` at `to`: the median and min round trip of `pings` 64-byte
    ping-pongs (after 3 unrecorded ones), and the goodput in Mbit/s of an `n_bytes` upload (checked against
    its SHA-256 at the far end) and download, each as n_bytes / (its time - the median round trip)."""
    sock = _connect(to, deadline_s)
    with sock:
        for _ in range(3):
            _ping_ms(sock)
        rtts = [_ping_ms(sock) for _ in range(pings)]
        rtt_s = statistics.median(rtts) / 1000.0
        up, down = _upload_s(sock, n_bytes), _download_s(sock, n_bytes)
    mbit = [n_bytes * 8 / max(t - rtt_s, 1e-9) / 1e6 for t in (up, down)]
    return {"rtt_ms_median": round(statistics.median(rtts), 3), "rtt_ms_min": round(min(rtts), 3),
            "up_mbit": round(mbit[0], 1), "down_mbit": round(mbit[1], 1), "bytes": n_bytes,
            "up_s": round(up, 4), "down_s": round(down, 4)}


def _connect(to: tuple[str, int], deadline_s: float) -> socket.socket:
    """A connection to `to`, retried until `deadline_s` (the far end may still be starting)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return _nodelay(socket.create_connection(to, timeout=deadline_s))
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


# -- command line -------------------------------------------------------------------------------------


def address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def mapping(text: str) -> tuple[int, tuple[str, int]]:
    port, sep, target = text.partition("=")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not LOCALPORT=HOST:PORT")
    return int(port), address(target)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    relay = commands.add_parser("relay", help="forward local ports to peers with a delay each way")
    relay.add_argument("--delay-ms", type=float, required=True, help="one-way delay added in each direction")
    relay.add_argument("--map", type=mapping, action="append", required=True, help="LOCALPORT=HOST:PORT")
    server = commands.add_parser("probe-server", help="the far end of a probe")
    server.add_argument("--listen", type=address, required=True)
    client = commands.add_parser("probe", help="measure round trip and goodput to a probe-server")
    client.add_argument("--to", type=address, required=True)
    client.add_argument("--pings", type=int, default=20)
    client.add_argument("--bytes", type=int, default=8 << 20)
    args = parser.parse_args(argv)
    if args.command == "relay" and args.delay_ms < 0:
        parser.error(f"--delay-ms {args.delay_ms:g}: a delay cannot be negative")
    if args.command == "probe" and (args.pings < 1 or args.bytes < 1):
        parser.error("--pings and --bytes must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "relay":
        serve_relay(dict(args.map), args.delay_ms / 1000.0)
        print("relaying", flush=True)  # the listeners are bound: a launcher may go on
        threading.Event().wait()
    elif args.command == "probe-server":
        listener = socket.create_server(args.listen)
        print("listening", flush=True)
        serve_probe(listener)
    else:
        print(json.dumps(probe(args.to, args.pings, args.bytes)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
