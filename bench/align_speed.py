"""Speed of the private record alignment (falsevfl_secure/secure/align.py): K real processes over the pinned
gRPC links (frames between passive parties relayed by the active party and sealed, as in a federation).

    python bench/align_speed.py [--parties 4] [--ids 100000] [--overlap 0.5] [--active K-1] [--threads 1] --out DIR
        [--timeout 900] [--readme README.md]

Every party holds `--ids` string IDs; a fraction `--overlap` of them is common to all parties and
the rest are its own, so the union has overlap*n + K*(1-overlap)*n records (the script checks it).
The K processes share this machine's cores, like bench/overhead.py. The alignment is timed from a
barrier before `align` to the slowest party's return; `phases` are each party's own seconds per
phase (setup, hash_and_blind, ring, hop_checks; waiting for peers included; the ring's lists carry the
hop proofs, and `hop_checks` is the round that verifies them), `cpu_s` its process CPU time, and
`wall_s_if_the_cores_were_free` the total CPU time divided by the cores the parties could use (what the wall
time would be without other load on the machine). Where the time goes:
`libsodium` times each group operation here (process CPU time per call, one process, before the parties
start) and `libsodium_cpu_s` is what the run's K n hashes, (K^2 + 1) n multiplications, 2 K (K-1) n weighted-sum
terms (each hop's M at the party that sent its input, Z at its receiver), K (K-1) n point checks and the keyed
union's hashes, products and weighted sums cost at those rates, the floor of `cpu_s_all_parties` for this
protocol; `load_before`/`load_after` are the machine's 1-minute load averages (other processes on the same cores
slow the wall time, not the CPU time).

Writes DIR/align_speed.json ({"config", "wall_s", "ids_per_s_per_party", "n_union", "correct",
"libsodium", "libsodium_cpu_s", "parties": [{"rank", "seconds", "ids_per_s", "phases", "bytes_sent",
"bytes_received"}], ...}) and
prints a one-line summary; `--readme` rewrites the README section named after DIR. Timings are
measurements on the machine that runs it, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from readme_section import update_readme  # noqa: E402


def party_ids(rank: int, n: int, overlap: float) -> list[str]:
    """`n` IDs: the first round(overlap * n) common to every party, the rest this party's own."""
    shared = round(overlap * n)
    return [f"shared-{i:010d}" for i in range(shared)] + [f"party{rank}-{i:010d}" for i in range(n - shared)]


def timed_alignment(role, n: int, overlap: float, threads: int) -> dict:
    """One party process: align once over the run's links (the same pinned, sealed links as a federation),
    timed from a barrier; its own report."""
    import torch

    from falsevfl_secure.runtime.session import barrier
    from falsevfl_secure.secure.align import align
    from falsevfl_secure.secure.ristretto import sodium_version

    torch.set_num_threads(1)
    rank, phases, channel = role.rank, {}, role.channel()
    ids = party_ids(rank, n, overlap)
    barrier(role)
    start, cpu = time.perf_counter(), time.process_time()
    result = align(channel, ids, role.peers.active_index, timings=phases, threads=threads)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    barrier(role)
    return {"rank": rank, "seconds": seconds, "cpu_s": cpu, "ids_per_s": n / seconds if seconds else None,
            "phases": phases, "bytes_sent": channel.bytes_sent, "bytes_received": channel.bytes_received,
            "n_union": result.n_union, "positions_ok": bool((result.positions >= 0).all()),
            "libsodium": sodium_version()}


def libsodium_rates(calls: int = 3000) -> dict[str, float]:
    """Process CPU microseconds per libsodium call as the alignment makes them (its bulk functions, one thread)."""
    from falsevfl_secure.secure import ristretto

    scalar, messages = ristretto.random_scalar(), [f"id-{i:010d}".encode() for i in range(calls)]
    points, rates = ristretto.hash_to_group_batch(messages), {}
    for name, run in (("hash_us", lambda: ristretto.hash_to_group_batch(messages, prefix=b"bench")),
                      ("mult_us", lambda: ristretto.scalar_mult_batch(scalar, points)),
                      ("check_us", lambda: ristretto.first_invalid_point(points)),
                      ("weighted_us", lambda: ristretto.weighted_sum(b"bench", points))):
        start = time.process_time()
        run()
        rates[name] = (time.process_time() - start) / calls * 1e6
    return rates


def libsodium_cpu_s(rates: dict[str, float], k: int, n: int, n_union: int) -> float:
    """CPU seconds of the group operations of one run: every party hashes its n IDs and multiplies each of the
    K lists once (the active party's twice: K^2 n + n products); two weighted sums per proved hop (K (K-1) hops);
    every received list checked; the keyed union (secure/keyed.py): a hash and a product per union point, and per
    passive party's list a hash and three weighted sums (one at the active party, two at the party)."""
    hops, lists = k * (k - 1) * n, (k - 1) * n
    group = k * n * rates["hash_us"] + (k * k + 1) * n * rates["mult_us"] + hops * (2 * rates["weighted_us"]
                                                                                   + rates["check_us"])
    union = n_union * (rates["hash_us"] + rates["mult_us"]) + lists * (rates["hash_us"] + 3 * rates["weighted_us"])
    return (group + union) / 1e6


def run_parties(k: int, n: int, overlap: float, active: int, threads: int, timeout: float = 900.0) -> dict[int, dict]:
    """The K parties as a local world (`runtime.world`); {rank: report}."""
    from falsevfl_secure.runtime.world import run_world

    reports = run_world("plain", k, timed_alignment, (n, overlap, threads), timeout_s=timeout, active_index=active)
    return dict(enumerate(reports))


def summarise(args: argparse.Namespace, reports: list[dict], total: float, rates: dict[str, float],
              load: tuple[float, float]) -> dict:
    """The JSON report: config, the slowest party's wall time, per-party figures, correctness."""
    k, n = args.parties, args.ids
    shared = round(args.overlap * n)
    expected = shared + k * (n - shared)
    wall = max(r["seconds"] for r in reports)
    cpu = sum(r["cpu_s"] for r in reports)
    return {"config": {"parties": k, "ids_per_party": n, "overlap": args.overlap, "active": args.active,
                       "threads": args.threads, "cpus": os.cpu_count(), "libsodium": reports[0]["libsodium"],
                       "load_before": load[0], "load_after": load[1]},
            "wall_s": wall, "ids_per_s_per_party": n / wall if wall else None,
            "cpu_s_all_parties": cpu, "libsodium": rates,
            "libsodium_cpu_s": libsodium_cpu_s(rates, k, n, reports[0]["n_union"]),
            "wall_s_if_the_cores_were_free": cpu / min(k * args.threads, os.cpu_count() or 1),
            "n_union": reports[0]["n_union"], "expected_n_union": expected,
            "correct": all(r["n_union"] == expected and r["positions_ok"] for r in reports),
            "hop_checks_s": max(r["phases"].get("hop_checks", 0.0) for r in reports),
            "launch_and_teardown_s": total - wall, "parties": reports}


def markdown(report: dict) -> str:
    """The README table: the slowest party's wall time and what the CPU time says without other load."""
    c = report["config"]
    lines = [f"K = {c['parties']} parties of {c['ids_per_party']:,} IDs each (overlap {c['overlap']}), union "
             f"{report['n_union']:,} ({'correct' if report['correct'] else 'WRONG'}), {c['cpus']} cores shared "
             f"by all parties, libsodium {c['libsodium']}:", "",
             "| wall s (slowest party) | IDs/s per party | CPU s, all parties | of which libsodium (estimated) "
             "| wall s if the cores were free | of the wall s, the hop check round | load average before / "
             "after |",
             "|---|---|---|---|---|---|---|",
             f"| {report['wall_s']:.1f} | {report['ids_per_s_per_party']:,.0f} | {report['cpu_s_all_parties']:.1f} "
             f"| {report['libsodium_cpu_s']:.1f} | {report['wall_s_if_the_cores_were_free']:.1f} "
             f"| {report['hop_checks_s']:.1f} | {c['load_before']:.1f} / {c['load_after']:.1f} |"]
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parties", type=int, default=4)
    parser.add_argument("--ids", type=int, default=100_000)
    parser.add_argument("--overlap", type=float, default=0.5)
    parser.add_argument("--active", type=int, default=None, help="the active party's index (default K-1)")
    parser.add_argument("--threads", type=int, default=1, help="threads per party for the group operations")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before the parties are stopped")
    parser.add_argument("--readme", type=Path, default=None, help="rewrite its <!-- results:NAME:... --> section, "
                        "NAME the --out folder's name")
    parser.error = lambda message: _fail(message)  # one line, no usage block
    args = parser.parse_args(argv)
    args.active = args.parties - 1 if args.active is None else args.active
    if args.parties < 2 or args.ids < 0 or not 0.0 <= args.overlap <= 1.0 or not 0 <= args.active < args.parties \
            or args.threads < 1:
        _fail("--parties must be >= 2, --ids >= 0, --overlap in [0, 1], --active in 0..K-1 and --threads >= 1")
    if args.out.exists() and not args.out.is_dir():
        _fail(f"--out {args.out} exists and is not a directory")
    return args


def _fail(message: str, code: int = 2):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        rates, load = libsodium_rates(), os.getloadavg()[0]
        start = time.perf_counter()
        reports = run_parties(args.parties, args.ids, args.overlap, args.active, args.threads, args.timeout)
        errors = [f"party {i}: {r['error']}" for i, r in sorted(reports.items()) if "error" in r]
        if errors:
            _fail("; ".join(errors), 1)
        report = summarise(args, list(reports.values()), time.perf_counter() - start, rates,
                           (load, os.getloadavg()[0]))
        tmp = args.out / "align_speed.json.tmp"
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, args.out / "align_speed.json")
        if args.readme:
            update_readme(args.readme, args.out.name, markdown(report))
    except (OSError, RuntimeError) as exc:
        _fail(str(exc), 1)
    print(f"align K={args.parties}, {args.ids} IDs per party, overlap {args.overlap}: N={report['n_union']} "
          f"({'correct' if report['correct'] else 'WRONG'}), {report['wall_s']:.2f} s wall, "
          f"{report['ids_per_s_per_party'] or 0:.0f} IDs/s per party, {report['cpu_s_all_parties']:.1f} CPU s "
          f"in all (libsodium ~{report['libsodium_cpu_s']:.1f}), {report['hop_checks_s']:.2f} s of it the hop check "
          f"round, load {load:.1f} -> {os.getloadavg()[0]:.1f} "
          f"-> {args.out / 'align_speed.json'}")
    return 0 if report["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
