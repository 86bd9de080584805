"""bench/wan.py's own machinery: the emulated links (the delay relay, the token buckets, netem where the kernel
has it) measured on real sockets between network namespaces, each role's federation file, and the report."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns import available, hosts, netns_names

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import wan  # noqa: E402
import wan_report  # noqa: E402
import wanlink  # noqa: E402

from falsevfl_secure.federation.config import load_federation  # noqa: E402
from falsevfl_secure.federation.demo import write_demo  # noqa: E402

WANLINK = [sys.executable, str(BENCH / "wanlink.py")]


def need_netns() -> None:
    ok, reason = available()
    if not ok:
        pytest.skip(reason)


def serve(host, argv: list[str]) -> subprocess.Popen:
    """A wanlink helper in `host`, once it says it is bound."""
    proc = host.popen([*WANLINK, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip(), proc.stderr.read()
    return proc


def measure(host, to: str, n_bytes: int) -> dict:
    done = host.run([*WANLINK, "probe", "--to", to, "--bytes", str(n_bytes), "--pings", "10"], capture_output=True,
                    text=True, timeout=60)
    assert done.returncode == 0, done.stderr  # the probe also checks the upload's SHA-256 at the far end
    return json.loads(done.stdout)


def test_the_relay_holds_every_chunk_half_the_round_trip_each_way_and_keeps_the_bytes():
    need_netns()
    with hosts(2, prefix="wlt") as (near, far):
        serve(far, ["probe-server", "--listen", f"{far.address}:29613"])
        direct = measure(near, f"{far.address}:29613", 1 << 20)
        serve(near, ["relay", "--delay-ms", "40", f"--map=29613={far.address}:29613"])
        relayed = measure(near, "127.0.0.1:29613", 4 << 20)
    assert direct["rtt_ms_median"] < 10
    assert 80 <= relayed["rtt_ms_min"] and relayed["rtt_ms_median"] < 80 + 30
    # 4 MiB unshaped: the relay's own throughput is far above the links it emulates
    assert relayed["up_s"] < 5 and relayed["down_s"] < 5


def test_token_buckets_give_every_host_the_configured_rate_both_ways():
    need_netns()
    link = wanlink.Link("test", 2.0, 20.0)
    with hosts(2, prefix="wlt") as machines:
        wanlink.shape(machines, link, "relay")  # rate only: the relay mode leaves the delay to the relays
        serve(machines[1], ["probe-server", "--listen", f"{machines[1].address}:29613"])
        got = measure(machines[0], f"{machines[1].address}:29613", 3_000_000)
    for direction in ("up_mbit", "down_mbit"):
        assert 0.75 * link.mbit <= got[direction] <= 1.05 * link.mbit, got
    assert got["rtt_ms_median"] < 10


def test_netem_gives_the_round_trip_and_the_rate_where_the_kernel_has_it():
    need_netns()
    link = wanlink.Link("test", 30.0, 20.0)
    with hosts(2, prefix="wlt") as machines:
        if not wanlink.has_netem(machines[0].name):
            pytest.skip("this kernel has no sch_netem (tc qdisc ... netem: unknown qdisc kind)")
        wanlink.shape(machines, link, "netem")
        serve(machines[1], ["probe-server", "--listen", f"{machines[1].address}:29613"])
        got = measure(machines[0], f"{machines[1].address}:29613", 3_000_000)
    assert 30 <= got["rtt_ms_min"] and got["rtt_ms_median"] < 30 + 20
    assert 0.7 * link.mbit <= got["up_mbit"] <= 1.05 * link.mbit, got


def test_a_cell_s_relays_and_probe_see_the_configured_round_trip_and_rate(tmp_path):
    """The benchmark's own set-up of one cell (token buckets, a relay in each dialer's namespace, the probe
    from a passive party's host to the active party's), measured on real sockets."""
    need_netns()
    link = wanlink.Link("test", 30.0, 20.0)
    roles = ["party0", "party1", wan.AGGREGATOR]
    with hosts(len(roles), prefix="wlt") as machines:
        machine = dict(zip(roles, machines, strict=True))
        where = {role: h.address for role, h in machine.items()}
        wanlink.shape(machines, link, "relay")
        wan.start_relays(machine, roles, "party1", where, link, tmp_path / "logs")
        got = wan.measure_link(machine, "party1", "party0", where, link, "relay")
    assert 30 <= got["rtt_ms_min"] and got["rtt_ms_median"] < 30 + 20, got
    for direction in ("up_mbit", "down_mbit"):
        assert 0.7 * link.mbit <= got[direction] <= 1.05 * link.mbit, got
    logs = tmp_path / "logs"
    assert (logs / "relay-party0.log").is_file() and not (logs / "relay-aggregator.log").exists()  # it dials nobody


def test_a_role_past_the_deadline_ends_the_cell_and_nothing_is_left_running(tmp_path):
    need_netns()
    log = tmp_path / "party0.log"
    with pytest.raises(RuntimeError, match=r"ran past --timeout 1 s; party0: waiting"):
        with hosts(1, prefix="wlt") as (host,):
            name = host.name
            with open(log, "w") as handle:
                proc = host.popen([sys.executable, "-c", "import time; print('waiting', flush=True); time.sleep(600)"],
                                  stdout=handle, stderr=subprocess.STDOUT)
            time.sleep(0.5)
            wan.wait_roles({"party0": (proc, log)}, timeout_s=1.0)
    assert proc.poll() is not None and name not in netns_names()


def test_a_terminated_benchmark_kills_every_role_and_deletes_its_namespaces(tmp_path):
    """SIGTERM while the roles train: the benchmark exits 143 and leaves no namespace and no role behind."""
    need_netns()
    work = tmp_path / "work"
    argv = [sys.executable, str(BENCH / "wan.py"), "--out", str(tmp_path / "out"), "--work", str(work), "--dataset",
            "digits", "--parties", "2", "--links", "1ms-10gbit", "--protocols", "plain", "--timeout", "120"]
    bench = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        log, end = work / "logs" / "1ms-10gbit-plain" / "party1.log", time.monotonic() + 60
        while not log.exists() and bench.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        assert log.exists(), bench.stderr.read() if bench.poll() is not None else "no role started in 60 s"
        ours = [n for n in netns_names() if n.startswith(f"wan{bench.pid}")]
        assert len(ours) == 4  # the bridge, two parties and the aggregator
        bench.terminate()
        assert bench.wait(timeout=30) == 143
    finally:
        bench.kill()
        bench.wait()
    assert not [n for n in netns_names() if n.startswith(f"wan{bench.pid}")]
    roles = subprocess.run(["pgrep", "-f", str(work)], capture_output=True, text=True)
    assert roles.stdout == "", roles.stdout


def test_the_shaping_commands_put_half_the_round_trip_on_each_uplink():
    link = wanlink.LINKS["50ms-20mbit"]
    assert wanlink.netem_command("v0", link)[5:11] == ["root", "netem", "delay", "25ms", "rate", "20mbit"]
    tbf = wanlink.tbf_command("p3", link)
    assert tbf[4] == "p3" and tbf[7:9] == ["rate", "20mbit"] and int(tbf[10]) >= 64 << 10
    with pytest.raises(ValueError, match="mode"):
        wanlink.shape([], link, "wire")


@pytest.mark.parametrize("mode", wanlink.MODES)
def test_each_role_file_names_what_that_role_listens_on_or_dials(tmp_path, mode):
    """The files each role gets, read back by the federation's own parser."""
    toml = write_demo("digits", 4, tmp_path)
    base, active = toml.read_text(), load_federation(toml).active
    where = {**{f"party{k}": f"10.9.9.{k + 1}" for k in range(4)}, "aggregator": "10.9.9.5"}
    files = wan.write_configs(base, tmp_path, list(where), active, where, mode)
    seen = {role: load_federation(path) for role, path in files.items()}
    for role, fed in seen.items():
        assert fed.model.pretrain.epochs == 1 and fed.model.train.epochs == 1
        assert fed.join_timeout_s == wan.JOIN_TIMEOUT_S and fed.pins(True) == load_federation(toml).pins(True)
        dials_active = role not in (active, "aggregator")  # the aggregator dials nobody: its file keeps the hubs
        assert fed.rendezvous == ((where[active] if mode == "netem" or not dials_active else "127.0.0.1"),
                                  wan.RENDEZVOUS_PORT)
        at_aggregator = role == "aggregator" or mode == "netem"
        assert fed.aggregator.address == ((where["aggregator"] if at_aggregator else "127.0.0.1"),
                                          wan.AGGREGATOR_PORT)
    relays = {role: wan.relay_maps(role, active, where) for role in where}
    assert relays["aggregator"] == {} and set(relays[active]) == {wan.AGGREGATOR_PORT}
    assert all(set(m) == {wan.RENDEZVOUS_PORT, wan.AGGREGATOR_PORT, wan.PROBE_PORT}
               for role, m in relays.items() if role not in (active, "aggregator"))


def cell(link: str, rtt: float, mbit: float, protocol: str, pretrain: float, train: float) -> dict:
    split = {"compute_s": pretrain / 2, "protocol_s": pretrain / 4, "network_s": pretrain / 4}
    small = {"compute_s": train, "protocol_s": 0.0, "network_s": 0.0}
    return {"link": link, "rtt_ms": rtt, "mbit": mbit, "protocol": protocol, "dataset": "isolet", "parties": 8,
            "shaping": "relay", "measured": {"rtt_ms_median": rtt + 0.5, "up_mbit": mbit * 0.9, "down_mbit": mbit},
            "epoch_s": {"pretrain": pretrain, "train": train}, "steps": {"pretrain": 13, "train": 4},
            "split_mean": {"pretrain": split, "train": small}, "mib_active": 360.0, "alignment_s": 12.0,
            "commit": "abc1234", "cpus": 2}


def test_the_report_adds_up_the_epoch_and_what_each_slower_link_costs(tmp_path):
    cells = [cell("50ms-20mbit", 50, 20, "plain", 120.0, 6.0), cell("1ms-10gbit", 1, 10_000, "plain", 20.0, 1.0),
             {**wan_report.cell_header(wanlink.LINKS["20ms-100mbit"], "he", "relay", "isolet", 8),
              "error": "party3 stalled"}]
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:wan:start -->\nstale\n<!-- results:wan:end -->\nend\n")
    wan_report.write_report(cells, tmp_path / "out", readme)
    rows = [line for line in (tmp_path / "out" / "wan.md").read_text().splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| 1 ms / 10 Gbit/s | plain | 1.50 | 9000 / 10000 | 20.0 | 1.0 | **21.0** | - |")
    assert rows[2].startswith("| 20 ms / 100 Mbit/s | he | failed: party3 stalled |")
    assert rows[3].startswith("| 50 ms / 20 Mbit/s | plain | 50.50 | 18 / 20 | 120.0 | 6.0 | **126.0** | +105.0 |")
    assert "| 60.0 / 30.0 / 30.0 | 6.0 / 0.0 / 0.0 | 360 | 12.0 |" in rows[3]
    # waiting: (120 / 4 + 0) of (120 + 6) s and (20 / 4) of (20 + 1) s
    assert ("`plain`: 21.0 s on 1 ms / 10 Gbit/s (24% waiting); 126.0 s on 50 ms / 20 Mbit/s (24% waiting). "
            "`he`: no cell finished; failed on 20 ms / 100 Mbit/s.") in (tmp_path / "out" / "wan.md").read_text()
    text = readme.read_text()
    assert "stale" not in text and "![wan](out/wan.png)" in text and text.endswith("end\n")
    assert (tmp_path / "out" / "wan.png").stat().st_size > 10_000


@pytest.mark.parametrize(("argv", "message"), [
    (["--parties", "1"], "error: --parties 1"),
    (["--links", "2ms-1gbit"], "error: argument --links: invalid choice: '2ms-1gbit'"),
    (["--report-only"], "error: --report-only:"),
])
def test_bad_arguments_end_with_one_error_line(tmp_path, argv, message):
    done = subprocess.run([sys.executable, str(BENCH / "wan.py"), "--out", str(tmp_path / "none"), *argv],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr.splitlines()[-1], done.stderr
