"""Training over wide-area links: one epoch of each stage, every role of the federation on a host of its own.

    python bench/wan.py --out bench/results/wan [--links 1ms-10gbit 20ms-100mbit 50ms-20mbit]
        [--protocols plain mpc he] [--dataset isolet] [--parties 8] [--shaping auto|netem|relay]
        [--work DIR] [--timeout S] [--readme README.md] [--report-only]

The transport users deploy, as they deploy it: `federation demo` writes each party's tables, identities and
federation file; every role (each party, and the aggregator under he) runs `python -m falsevfl_secure.federation
train --config F --party NAME --protocol P --quiet` in a Linux network namespace of its own (tests/netns.py:
a private bridge, nothing routed outside), with one epoch of stage 1 and one of stage 2 ([model.pretrain]
and [model.train] epochs = 1; the preset's batch sizes). Each host sits on an access link of the cell's
round trip and rate (`wanlink.py`: `tc netem` where the kernel has it, else token buckets plus a delay
relay; the mode is recorded), and before training a probe measures what that link really is: the round
trip of a ping-pong and the goodput of a bulk upload and download between a passive party's host and the
active party's, through the same path the party's frames take.

Per cell the benchmark keeps each stage's wall time at the active party (the epoch time: every role runs the
stage in lock step) and every party's own split of it (`stage_split` in its model/train_log.json):
compute (outside the rounds), protocol (in the rounds but not blocked: encoding, masks, encryption,
framing) and waiting (blocked until a peer's frame arrived: transit over the link, and a peer's work that
did not overlap with this party's). All roles share this machine's cores, so compute and protocol work
queue behind each other's; with one machine per party they would overlap.

Writes OUT/wan.json (one record per link and protocol, written as each cell finishes; a rerun skips the
finished cells and retries failed ones), OUT/wan.md and OUT/wan.png; `--readme` rewrites the README's
`results:wan` section. Timings are measurements on this machine, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests/netns.py: the namespaces and their teardown
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import wan_report  # noqa: E402
import wanlink  # noqa: E402
from netns import available, hosts  # noqa: E402

from falsevfl_secure.fsio import atomic_write, write_json  # noqa: E402
from falsevfl_secure.transport import PROTOCOLS  # noqa: E402

RENDEZVOUS_PORT, AGGREGATOR_PORT, PROBE_PORT = 29611, 29612, 29613
AGGREGATOR = "aggregator"
JOIN_TIMEOUT_S = 180
ROLE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # nine processes on this machine's cores
# The emulated network runs ahead of the roles, as a kernel's netem (in softirq) would: the relays and the
# probe's two ends get a higher CPU priority, so that the link's delay is not the roles' CPU queue.
LINK_PRIORITY = ["nice", "-n", "-10"]
WANLINK = [sys.executable, str(ROOT / "bench" / "wanlink.py")]


# -- the federation's files -----------------------------------------------------------------------------


def prepare_demo(work: Path, dataset: str, parties: int, seed: int = 0) -> Path:
    """The demo federation (tables, identities, federation.toml) under work/demo, written once."""
    demo = work / "demo"
    if not (demo / "federation.toml").is_file():
        if demo.exists():
            shutil.rmtree(demo)
        argv = [sys.executable, "-m", "falsevfl_secure.federation", "demo", "--dataset", dataset, "--parties",
                str(parties), "--seed", str(seed), "--out", str(demo)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT, env=_env())
        if done.returncode != 0:
            raise RuntimeError(f"federation demo failed: {done.stderr.strip()[-2000:]}")
    return demo / "federation.toml"


def role_config(base: str, rendezvous: str, aggregator: str) -> str:
    """The demo's federation.toml as one role sees it: the active party's hub at `rendezvous`, the aggregator's
    at `aggregator` (each role's own file names the addresses it dials or listens on), a join timeout for slow
    links, and one epoch of each stage."""
    text, hits = re.subn(r'^rendezvous = "[^"]*"$', f'rendezvous = "{rendezvous}"\njoin_timeout_s = {JOIN_TIMEOUT_S}',
                         base, flags=re.MULTILINE)
    text, hits2 = re.subn(r'^address = "[^"]*"$', f'address = "{aggregator}"', text, flags=re.MULTILINE)
    if hits != 1 or hits2 != 1:
        raise RuntimeError("the demo's federation.toml has no single rendezvous / [aggregator] address line")
    return text + "\n[model.pretrain]\nepochs = 1\n[model.train]\nepochs = 1\n"


def seen_addresses(role: str, active: str, where: dict[str, str], mode: str) -> tuple[str, str]:
    """(rendezvous, aggregator address) in `role`'s own file: a hub listens at its host's address; a dialer
    dials the peer's address, or with the relay its local relay's port (same port number, 127.0.0.1)."""
    real = (f"{where[active]}:{RENDEZVOUS_PORT}", f"{where[AGGREGATOR]}:{AGGREGATOR_PORT}")
    if mode == "netem":
        return real
    local = (f"127.0.0.1:{RENDEZVOUS_PORT}", f"127.0.0.1:{AGGREGATOR_PORT}")
    if role == active:
        return real[0], local[1]
    return (real[0], real[1]) if role == AGGREGATOR else local


def relay_maps(role: str, active: str, where: dict[str, str]) -> dict[int, str]:
    """The relay ports of `role`'s namespace (relay mode): what it dials, and the probe's port at a party."""
    if role == AGGREGATOR:
        return {}
    maps = {AGGREGATOR_PORT: f"{where[AGGREGATOR]}:{AGGREGATOR_PORT}"}
    if role != active:
        maps |= {RENDEZVOUS_PORT: f"{where[active]}:{RENDEZVOUS_PORT}", PROBE_PORT: f"{where[active]}:{PROBE_PORT}"}
    return maps


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **ROLE_ENV, "PYTHONPATH": path}


# -- one cell ---------------------------------------------------------------------------------------------


def _started(proc: subprocess.Popen, what: str, timeout_s: float = 30.0) -> None:
    """Wait for a helper's first line ("relaying", "listening"): it is bound and serving."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready or not proc.stdout.readline().strip():
        raise RuntimeError(f"{what} did not start within {timeout_s:g} s (exit code {proc.poll()})")


def start_relays(machine: dict, roles: list[str], active: str, where: dict[str, str], link, logs: Path) -> None:
    """One relay process per dialing role's namespace (relay mode), each holding chunks for RTT / 2; its
    connection events go to logs/relay-ROLE.log."""
    logs.mkdir(parents=True, exist_ok=True)
    for role in roles:
        maps = relay_maps(role, active, where)
        if not maps:
            continue
        argv = [*LINK_PRIORITY, *WANLINK, "relay", "--delay-ms", f"{link.rtt_ms / 2:g}",
                *(f"--map={port}={target}" for port, target in maps.items())]
        with open(logs / f"relay-{role}.log", "w") as log:
            relay = machine[role].popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
        _started(relay, f"the relay in {role}'s namespace")


def measure_link(machine: dict, active: str, passive: str, where: dict[str, str], link, mode: str) -> dict:
    """The probe between a passive party's host and the active party's, on the path its frames take."""
    listen = f"{where[active]}:{PROBE_PORT}"
    server = machine[active].popen([*LINK_PRIORITY, *WANLINK, "probe-server", "--listen", listen],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        _started(server, "the probe server")
        to = f"{where[active]}:{PROBE_PORT}" if mode == "netem" else f"127.0.0.1:{PROBE_PORT}"
        n_bytes = int(min(max(link.mbit * 1e6 / 8 * 1.5, 4e6), 64e6))  # about 1.5 s of the configured rate
        done = machine[passive].run([*LINK_PRIORITY, *WANLINK, "probe", "--to", to, "--bytes", str(n_bytes)],
                                    capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"the link probe failed: {done.stderr.strip()[-1500:]}")
        return json.loads(done.stdout)
    finally:
        server.kill()
        server.wait()


def launch_roles(machine: dict, roles: list[str], configs: dict[str, Path], protocol: str, logs: Path) -> dict:
    """Start `federation train --party NAME` for every role in its namespace; role -> (process, log path)."""
    logs.mkdir(parents=True, exist_ok=True)
    started = {}
    for role in roles:
        log = logs / f"{role}.log"
        argv = [sys.executable, "-m", "falsevfl_secure.federation", "train", "--config", str(configs[role]),
                "--party", role, "--protocol", protocol, "--quiet"]
        with open(log, "w") as handle:
            proc = machine[role].popen(argv, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, env=_env())
        started[role] = (proc, log)
    return started


def wait_roles(started: dict, timeout_s: float) -> float:
    """Wait until every role has exited (at most `timeout_s`); the seconds from launch to the last exit.
    A role that failed, or the deadline, raises with the roles' last lines."""
    began = time.monotonic()
    while any(p.poll() is None for p, _ in started.values()):
        if time.monotonic() - began > timeout_s:
            raise RuntimeError(f"the cell ran past --timeout {timeout_s:g} s; {_tails(started)}")
        time.sleep(0.5)
    failed = [role for role, (p, _) in started.items() if p.returncode != 0]
    if failed:
        raise RuntimeError(f"{', '.join(failed)} failed; {_tails(started)}")
    return time.monotonic() - began


def _tails(started: dict) -> str:
    def last(log: Path) -> str:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1][:300] if lines else "(no output)"

    return "; ".join(f"{role}: {last(log)}" for role, (_, log) in started.items())


def write_configs(base: str, demo: Path, roles: list[str], active: str, where: dict[str, str], mode: str) -> dict:
    """Each role's own federation file (next to the demo's, so that its relative paths hold)."""
    configs = {}
    for role in roles:
        rendezvous, aggregator = seen_addresses(role, active, where, mode)
        configs[role] = demo / f"wan-{role}.toml"
        atomic_write(configs[role], role_config(base, rendezvous, aggregator))
    return configs


def run_cell(args: argparse.Namespace, link, protocol: str, mode: str) -> dict:
    """One link and protocol: namespaces, shaping, the link probe, the federation's training, its records."""
    demo_toml = prepare_demo(args.work, args.dataset, args.parties)
    base, demo = demo_toml.read_text(), demo_toml.parent
    names = [f"party{k}" for k in range(args.parties)]
    active = re.search(r'^active = "([^"]+)"$', base, re.MULTILINE).group(1)
    passive = next(n for n in names if n != active)
    roles = [*names, AGGREGATOR]
    for name in names:  # an earlier cell's records must not be taken for this one's
        for record in ("train_log.json", "train_result.json"):
            (demo / name / "model" / record).unlink(missing_ok=True)
    logs = args.work / "logs" / f"{link.name}-{protocol}"
    load_before = [round(v, 2) for v in os.getloadavg()]  # other work on this machine (1, 5, 15 min)
    with hosts(len(roles), prefix="wan") as machines:
        machine = dict(zip(roles, machines, strict=True))
        where = {role: h.address for role, h in machine.items()}
        wanlink.shape(machines, link, mode)
        if mode == "relay":
            start_relays(machine, roles, active, where, link, logs)
        measured = measure_link(machine, active, passive, where, link, mode)
        configs = write_configs(base, demo, roles, active, where, mode)
        running = roles if protocol == "he" else names
        started = launch_roles(machine, running, configs, protocol, logs)
        wall = wait_roles(started, args.timeout)
    header = {**wan_report.cell_header(link, protocol, mode, args.dataset, args.parties),
              "load_before": load_before, "load_after": [round(v, 2) for v in os.getloadavg()]}
    return wan_report.cell_record(demo, names, active, header, measured, wall)


# -- the grid ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the results folder (wan.json, wan.md, wan.png)")
    parser.add_argument("--links", nargs="+", default=list(wanlink.LINKS), choices=list(wanlink.LINKS))
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    parser.add_argument("--dataset", default="isolet", choices=("digits", "isolet", "fashion-mnist", "hapt"))
    parser.add_argument("--parties", type=int, default=8)
    parser.add_argument("--shaping", default="auto", choices=("auto", *wanlink.MODES),
                        help="netem (tc netem delay + rate), relay (token buckets + a delay relay) or auto: "
                             "netem where the kernel has it")
    parser.add_argument("--work", type=Path, default=Path("/tmp/falsevfl-wan"),
                        help="the demo federation, its models and the roles' logs (not results)")
    parser.add_argument("--timeout", type=float, default=1500.0, help="seconds one cell may take")
    parser.add_argument("--readme", type=Path, default=None, help="rewrite this README's results:wan section")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the report from OUT/wan.json")
    args = parser.parse_args(argv)
    if not 2 <= args.parties <= 32:
        parser.error(f"--parties {args.parties}: a federation here has 2 to 32 parties")
    if args.timeout <= 0:
        parser.error(f"--timeout {args.timeout:g}: must be a positive number of seconds")
    if args.readme is not None and not args.readme.is_file():
        parser.error(f"--readme {args.readme}: no such file")
    if args.report_only and not (args.out / "wan.json").is_file():
        parser.error(f"--report-only: {args.out / 'wan.json'} does not exist; run the benchmark first")
    return args


def shaping_mode(requested: str) -> str:
    """The shaping this kernel gets: netem when asked for (or available under auto), else the relay."""
    with hosts(1, prefix="wan") as (machine,):
        netem = wanlink.has_netem(machine.name)
    if requested == "netem" and not netem:
        raise SystemExit("error: --shaping netem: this kernel has no sch_netem (`tc qdisc ... netem` fails: "
                         "\"Specified qdisc kind is unknown\"); use --shaping relay or auto")
    return "netem" if requested == "auto" and netem else ("relay" if requested == "auto" else requested)


def load_cells(out: Path) -> list[dict]:
    path = out / "wan.json"
    return json.loads(path.read_text()) if path.is_file() else []


def run_grid(args: argparse.Namespace) -> list[dict]:
    """Every requested cell not already finished, each recorded (wan.json) as soon as it ends."""
    ok, reason = available()
    if not ok:
        raise SystemExit(f"error: this benchmark needs Linux network namespaces: {reason}")
    mode = shaping_mode(args.shaping)
    args.work.mkdir(parents=True, exist_ok=True)
    cells = load_cells(args.out)
    for link in (wanlink.LINKS[name] for name in args.links):
        for protocol in args.protocols:
            key = (link.name, protocol, args.dataset, args.parties)
            if any(wan_report.key_of(c) == key and "error" not in c for c in cells):
                continue
            print(f"{link.name} / {protocol}: running ({mode})", flush=True)
            try:
                record = run_cell(args, link, protocol, mode)
            except RuntimeError as error:
                record = {**wan_report.cell_header(link, protocol, mode, args.dataset, args.parties),
                          "error": str(error)}
            cells = [c for c in cells if wan_report.key_of(c) != key] + [record]
            write_json(args.out / "wan.json", cells)
            print(wan_report.one_line(record), flush=True)
    return cells


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cells = load_cells(args.out) if args.report_only else run_grid(args)
    if not cells:
        raise SystemExit(f"error: {args.out / 'wan.json'} holds no cell")
    wan_report.write_report(cells, args.out, args.readme)
    return 0 if all("error" not in c for c in cells) else 3


def _terminated(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through `hosts()`, which kills every role and deletes the namespaces


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    try:
        with contextlib.suppress(BrokenPipeError):
            sys.exit(main())
    except KeyboardInterrupt:
        print("error: interrupted; every role and namespace of the running cell was removed", file=sys.stderr)
        sys.exit(130)
