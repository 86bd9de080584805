"""The price of security: one step of each stage in the distributed runtime, per protocol.

    python bench/overhead.py --protocols plain mpc he --parties 2 4 8 12 --batch 128 512 [--repeats N] --out DIR

For every K one process world per protocol (one process per party, plus the aggregator for `he`)
is started and kept alive; every (batch, stage) cell then runs `--warmup` unrecorded steps per
protocol and `--repeats` timed rounds in which the protocols take turns (plain, mpc, he, plain, ...),
so a drift of the machine's load hits every protocol alike and the ratios are measured side by side.
The job is a synthetic split with Isolet's shapes (77 features per party, d_h 128, d_z 64, hidden
widths 256, kappa 10, float32), or with `--shape tables` a table's as `preset = "auto"` builds it (10
encoded columns per party, d_h 32, d_z 16, hidden 128 / 64). The parties start each step together (a
barrier) and a step's time is the longest any role spent in it (the critical path), measured inside the
workers, so process start-up, key agreement and CKKS key generation are not counted. Bytes are what one passive party
sent plus received in the step. On one machine all K (K + 1) processes share its cores, so a step
also pays for every party's work one after the other; with one host per party it would not.

`--ciphers` instead times the sum alone, every registered sum cipher side by side (the Paillier plug-in of
`bench/paillier.py` registered by one line below): every party's cipher in one process with fresh keys
(`Protocol.in_process`); per cell the time one passive party takes to protect its contribution, the
combiner's time to combine K messages, the active party's time to reveal, and the bytes of one message.
Writes DIR/ciphers.json and DIR/ciphers.md.

Writes DIR/overhead.json (a list of {"protocol", "parties", "batch", "stage", "step_ms_median",
"step_ms_min", "step_ms_max", "bytes_per_party", "rounds", "cpu_ms": the median CPU ms of the active party's
process, the busiest passive party's and all roles' together (the he aggregator not counted), "timeline": for the
active party and one passive party each round of the step as [name, ms from the step's start when the role
entered it, ms when it left], medians: what a role computes between its rounds, and how long it waits in them}),
DIR/overhead_summary.json (the ratios mpc/plain and he/plain per cell, the ratio of the plain distributed step
to the local single-process step, and the threat-model audit of one recorded step per protocol and K) and
DIR/overhead.png. Every cell is written as soon as it is measured and a rerun skips finished
cells, so a killed benchmark resumes. Timings are measurements on this machine, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from readme_section import relative_link, update_readme  # noqa: E402

from falsevfl_secure.audit import ADDEND_ATOL, audit_active_view, contributions  # noqa: E402
from falsevfl_secure.cli import guarded  # noqa: E402
from falsevfl_secure.config import Config, PrivacyConfig, Stage, StageConfig  # noqa: E402
from falsevfl_secure.fsio import write_json  # noqa: E402
from falsevfl_secure.runtime.session import StepJob, StepSession, local_reference  # noqa: E402
from falsevfl_secure.transport import PROTOCOLS, register  # noqa: E402
from falsevfl_secure.transport.rounds import POSTERIOR  # noqa: E402
from falsevfl_secure.transport.views import Entry, View  # noqa: E402

STAGES = ("pretrain", "train", "predict")
# The job's shapes (`--shape`): Isolet's (77 features per party, the paper's widths), or a table's as the
# federation's `preset = "auto"` builds it (10 encoded columns per party, the digits widths: issue 26's
# "3 parties and ~30 encoded columns").
SHAPES = {"isolet": dict(width=77, h_dim=128, z_dim=64, party_hidden=256, global_hidden=256, discriminator_hidden=256),
          "tables": dict(width=10, h_dim=32, z_dim=16, party_hidden=128, global_hidden=64, discriminator_hidden=128)}
SHAPE = dict(SHAPES["isolet"])  # main() sets the one asked for


def make_job(parties: int, batch: int, stage: str, seed: int = 0, record: bool = False,
             latent_broadcast: str = "samples", private: bool = False) -> StepJob:
    """One step of `stage` on a synthetic split with Isolet's shapes; 20 % of the blocks missing; every
    party's secret drawn afresh, as in a real run. `private`: under a privacy budget (the noise stage before
    every sum, DP-SGD of the party networks; the noise multiplier stated, 1.0)."""
    privacy = PrivacyConfig(epsilon=8.0, noise_multiplier=1.0) if private else PrivacyConfig()
    widths = {k: v for k, v in SHAPE.items() if k != "width"}
    cfg = Config(dataset="synthetic", parties=parties, **widths, kappa=10, predict_samples=10,
                 pretrain=StageConfig(5e-4, batch, 1), train=StageConfig(2e-4, batch, 1), seed=seed,
                 options={"latent_broadcast": latent_broadcast}, privacy=privacy)
    split = dict(n=batch, parties=parties, width=SHAPE["width"], p_missing=0.2, seed=seed, n_classes=26)
    return StepJob(cfg, split, tuple(range(batch)), Stage[stage.upper()], secret_seed=None, record=record)


def passive_bytes(reports: dict[int, dict], active: int) -> int:
    """The most any passive party sent plus received in the step."""
    totals = [sum(r["bytes_sent"] + r["bytes_received"] for r in report["communication"] if r["party"] == k)
              for k, report in reports.items() if k != active]
    return max(totals) if totals else 0


def step_ms(world: StepSession, job: dict) -> tuple[float, dict[int, dict]]:
    """One step on every role: its critical-path time (the longest any role spent in it) and the reports."""
    reports = world.run(job)
    return 1000 * max(report["seconds"] for report in reports.values()), reports


def time_cells(worlds: dict[str, StepSession], job: dict, warmup: int, repeats: int) -> dict[str, dict]:
    """The same step on every protocol's world, the protocols taking turns; one cell per protocol."""
    for world in worlds.values():
        for _ in range(warmup):
            world.run(job)
    ms: dict[str, list[float]] = {protocol: [] for protocol in worlds}
    cpu: dict[str, list[dict]] = {protocol: [] for protocol in worlds}
    spans: dict[str, list[dict]] = {protocol: [] for protocol in worlds}
    reports: dict[str, dict] = {}
    for _ in range(repeats):
        for protocol, world in worlds.items():
            elapsed, reports[protocol] = step_ms(world, job)
            ms[protocol].append(elapsed)
            cpu[protocol].append({k: r["cpu_seconds"] for k, r in reports[protocol].items()})
            spans[protocol].append({k: r["timeline"] for k, r in reports[protocol].items()})
    active = job.config.parties - 1
    return {protocol: {"step_ms_median": round(statistics.median(values), 2), "step_ms_min": round(min(values), 2),
                       "step_ms_max": round(max(values), 2),
                       "bytes_per_party": passive_bytes(reports[protocol], active),
                       "rounds": len(reports[protocol][active]["trace"]),
                       "cpu_ms": role_cpu_ms(cpu[protocol], active),
                       "timeline": role_timeline(spans[protocol], active)}
            for protocol, values in ms.items()}


def role_cpu_ms(steps: list[dict[int, float]], active: int) -> dict[str, float]:
    """Median CPU ms a step of the active party's process and of the busiest passive party's (the critical path
    is the role whose CPU fills its step; on one machine the roles' sum over the cores bounds the step from below)."""
    passive = [max(v for k, v in step.items() if k != active) for step in steps]
    total = [sum(step.values()) for step in steps]
    return {"active": round(1000 * statistics.median(s[active] for s in steps), 1),
            "busiest_passive": round(1000 * statistics.median(passive), 1),
            "all_roles": round(1000 * statistics.median(total), 1)}


def role_timeline(steps: list[dict[int, list]], active: int) -> dict[str, list[list]]:
    """Per role (the active party and passive party 0), each round of the step as [name, ms from the step's
    start when the role entered it, ms when it left], medians over the steps: where each role waits on whom."""
    out = {}
    for label, role in (("active", active), ("passive", 0 if active else 1)):
        runs = [step[role] for step in steps if role in step]
        names = [span[0] for span in runs[0]] if runs else []
        runs = [run for run in runs if [span[0] for span in run] == names]  # (a step with other rounds: skipped)
        out[label] = [[name, round(statistics.median(run[i][1] for run in runs), 2),
                       round(statistics.median(run[i][2] for run in runs), 2)] for i, name in enumerate(names)]
    return out


def timeline_text(timeline: dict[str, list[list]]) -> str:
    """Two lines: each round as `name start-end` (ms within the step) for the active and a passive party."""
    return "\n".join(f"      {label:>7}: " + "  ".join(f"{name} {a:.1f}-{b:.1f}" for name, a, b in spans)
                     for label, spans in timeline.items())


def time_local(job: StepJob, warmup: int, repeats: int) -> float:
    """Median ms of the same step in the local runtime (one process, this process's threads)."""
    ms = [1000 * local_reference(job)["seconds"] for _ in range(warmup + repeats)]
    return round(statistics.median(ms[warmup:]), 2)


def audit_cell(world: StepSession, protocol: str, parties: int, batch: int) -> dict:
    """Record every party's view of one stage-1 step and audit the active party's against the parties'
    own records of what they sent."""
    reports = world.run(make_job(parties, batch, "pretrain", seed=1, record=True))
    views = {r: View(Entry(**e) for e in report["view"]) for r, report in reports.items()}
    report = audit_active_view(views[parties - 1], contributions(views), parties - 1, atol=parties * ADDEND_ATOL)
    return {"protocol": protocol, "parties": parties, "batch": batch, "views_audited": report.views_audited,
            "entries_checked": report.entries_checked, "leaks_found": len(report.leaks),
            "disclosed_by_design_rows": report.disclosed_by_design_rows,
            "expected": "leaks (plain sends every contribution in clear)" if protocol == "plain" else "no leaks"}


def ratios(cells: list[dict]) -> list[dict]:
    by = {(c["protocol"], c["parties"], c["batch"], c["stage"]): c["step_ms_median"] for c in cells}
    out = []
    for (protocol, parties, batch, stage), ms in sorted(by.items()):
        plain = by.get(("plain", parties, batch, stage))
        if protocol != "plain" and plain:
            out.append({"ratio": f"{protocol}/plain", "parties": parties, "batch": batch, "stage": stage,
                        "value": round(ms / plain, 3)})
    return out


def plot(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"plain": "#4c72b0", "mpc": "#55a868", "he": "#c44e52"}
    stages = [s for s in STAGES if any(c["stage"] == s for c in cells)]
    fig, axes = plt.subplots(2, len(stages), figsize=(4.3 * len(stages), 6.2), squeeze=False)
    for col, stage in enumerate(stages):
        for protocol in colors:
            for batch, style in zip(sorted({c["batch"] for c in cells}), ("--", "-", ":"), strict=False):
                rows = sorted((c for c in cells if (c["protocol"], c["stage"], c["batch"]) == (protocol, stage, batch)),
                              key=lambda c: c["parties"])
                if not rows:
                    continue
                ks = [c["parties"] for c in rows]
                axes[0][col].plot(ks, [c["step_ms_median"] for c in rows], style, marker="o", color=colors[protocol],
                                  label=f"{protocol} B={batch}")
                axes[1][col].plot(ks, [c["bytes_per_party"] / 2**20 for c in rows], style, marker="o",
                                  color=colors[protocol], label=f"{protocol} B={batch}")
        axes[0][col].set_title(f"{stage}: step time (median)", fontsize=9)
        axes[0][col].set_ylabel("ms")
        axes[0][col].set_yscale("log")
        axes[1][col].set_title(f"{stage}: bytes per passive party", fontsize=9)
        axes[1][col].set_ylabel("MiB per step")
        axes[1][col].set_yscale("log")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xlabel("parties K")
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(cells: list[dict], summary: dict) -> str:
    """Per stage: step time (median ms) per protocol and K x batch, the ratios to plain, the bytes one
    passive party moves per step; then plain distributed / local, and the audits."""
    by = {(c["protocol"], c["parties"], c["batch"], c["stage"]): c for c in cells}
    protocols = [p for p in PROTOCOLS if any(c["protocol"] == p for c in cells)]
    lines = []
    for stage in STAGES:
        keys = sorted({(c["parties"], c["batch"]) for c in cells if c["stage"] == stage})
        if not keys:
            continue
        head = " | ".join(f"{p} ms" + ("" if p == "plain" else f" ({p}/plain)") for p in protocols)
        lines += [f"**{stage}** (median of the timed steps; MiB one passive party sends + receives per step)", "",
                  f"| K | batch | {head} | " + " | ".join(f"{p} MiB" for p in protocols) + " |",
                  "|---|---|" + "---|" * (2 * len(protocols))]
        for parties, batch in keys:
            plain = by.get(("plain", parties, batch, stage))
            times, sizes = [], []
            for p in protocols:
                c = by.get((p, parties, batch, stage))
                if c is None:
                    times.append("-")
                    sizes.append("-")
                    continue
                ratio = f" ({c['step_ms_median'] / plain['step_ms_median']:.2f}x)" if plain and p != "plain" else ""
                times.append(f"{c['step_ms_median']:.0f}{ratio}")
                sizes.append(f"{c['bytes_per_party'] / 2**20:.2f}")
            lines.append(f"| {parties} | {batch} | " + " | ".join(times) + " | " + " | ".join(sizes) + " |")
        lines.append("")
    if summary.get("local"):
        lines += ["**plain distributed step / the same step in the local runtime (one process)**", "",
                  "| K | batch | stage | distributed ms | local ms | ratio |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['parties']} | {r['batch']} | {r['stage']} | {r['plain_distributed_ms']:.0f} | "
                  f"{r['local_ms']:.0f} | {r['distributed_over_local']:.2f} |"
                  for r in sorted(summary["local"], key=lambda r: (r["parties"], r["batch"], STAGES.index(r["stage"])))]
        lines.append("")
    if summary.get("audit"):
        lines += ["**audit of one recorded stage-1 step per protocol and K** (the active party's view against a "
                  "plaintext shadow of the same step)", "",
                  "| protocol | K | entries checked | leaks found | rows disclosed by design | expected |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {a['protocol']} | {a['parties']} | {a['entries_checked']} | {a['leaks_found']} | "
                  f"{a['disclosed_by_design_rows']} | {a['expected']} |"
                  for a in sorted(summary["audit"], key=lambda a: (a["parties"], a["protocol"]))]
        lines.append("")
    return "\n".join(lines)


def time_cipher(name: str, parties: int, numel: int, repeats: int) -> dict:
    """One sum of `numel` values at K = `parties` with every party's cipher in this process: the median of
    `repeats` of each step (ms), and the bytes of one passive party's message."""
    ciphers, helper = PROTOCOLS[name].in_process(parties, 0)
    combiner, rows = helper or ciphers[0], max(1, numel // 256)
    values = [torch.from_numpy(np.random.default_rng(k).standard_normal((rows, numel // rows)).astype(np.float32))
              for k in range(parties)]
    times: dict[str, list[float]] = {"protect_ms": [], "combine_ms": [], "reveal_ms": []}
    try:
        for _ in range(repeats):
            senders = range(1 if helper is not None else 0, parties)  # with a helper the active party adds its own
            start = time.perf_counter()
            messages = {k: ciphers[k].protect(POSTERIOR, values[k], parties)[0] for k in senders}
            times["protect_ms"].append((time.perf_counter() - start) * 1e3 / len(senders))
            start = time.perf_counter()
            combined = combiner.combine(POSTERIOR, messages, tuple(values[0].shape))
            times["combine_ms"].append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            total = ciphers[0].reveal(POSTERIOR, combined, tuple(values[0].shape), values[0] if helper else None)
            times["reveal_ms"].append((time.perf_counter() - start) * 1e3)
        error = float((total.double() - sum(v.double() for v in values)).abs().max())
    finally:
        for cipher in [*ciphers, *([helper] if helper else [])]:
            cipher.close()
    return {"protocol": name, "parties": parties, "values": rows * (numel // rows),
            **{k: round(statistics.median(v), 3) for k, v in times.items()},
            "message_bytes": len(messages[1]), "max_error": error}


def cipher_table(args) -> int:
    """`--ciphers`: the sum alone, per registered cipher; resumes like the step cells."""
    from paillier import Paillier  # here: python-paillier (the dev extra) is needed by --ciphers alone

    register(Paillier())  # the plug-in outside the package: one line
    out = Path(args.out)
    path = out / "ciphers.json"
    cells: list[dict] = json.loads(path.read_text()) if path.exists() else []
    done = {(c["protocol"], c["parties"], c["values"]) for c in cells}
    for numel in args.values:
        for parties in args.parties:
            for name in PROTOCOLS:
                if (name, parties, numel) in done or args.report_only:
                    continue
                cells.append(time_cipher(name, parties, numel, args.repeats))
                c = cells[-1]
                print(f"{name:>9} K={parties:<3} {numel:>7} values: protect {c['protect_ms']:9.1f} ms/party, combine "
                      f"{c['combine_ms']:9.1f} ms, reveal {c['reveal_ms']:9.1f} ms, {c['message_bytes'] / 2**20:.2f} "
                      f"MiB/message", flush=True)
                write_json(path, cells)
    lines = ["| cipher | K | values | protect ms (one party) | combine ms | reveal ms | MiB per message | "
             "values/s per party | max error |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {c['protocol']} | {c['parties']} | {c['values']:,} | {c['protect_ms']:.1f} | {c['combine_ms']:.1f} | "
              f"{c['reveal_ms']:.1f} | {c['message_bytes'] / 2**20:.3f} | "
              f"{c['values'] / max(c['protect_ms'], 1e-3) * 1e3:,.0f} | {c['max_error']:.1e} |"
              for c in sorted(cells, key=lambda c: (c["values"], c["parties"], list(PROTOCOLS).index(c["protocol"])))]
    table = "\n".join(lines)
    (out / "ciphers.md").write_text(table + "\n")
    print(f"results: {path}, {out / 'ciphers.md'}")
    if args.readme:
        update_readme(Path(args.readme), out.resolve().name, table + "\n")
    return 0


def privacy_table(args) -> int:
    """The DP step against the same step without DP, per protocol, K, batch and stage: both jobs on the same
    warm world, taking turns. Writes DIR/privacy_overhead.json and .md."""
    out = Path(args.out)
    path = out / "privacy_overhead.json"
    cells: list[dict] = json.loads(path.read_text()) if path.exists() and not args.report_only else []
    done = {(c["protocol"], c["parties"], c["batch"], c["stage"]) for c in cells}
    for parties in [] if args.report_only else args.parties:
        with contextlib.ExitStack() as stack:
            worlds = {p: stack.enter_context(StepSession(p, parties)) for p in args.protocols}
            for batch, stage in [(b, st) for b in args.batch for st in args.stages]:
                jobs = {dp: make_job(parties, batch, stage, private=dp) for dp in (False, True)}
                for protocol, world in worlds.items():
                    if (protocol, parties, batch, stage) in done:
                        continue
                    ms = {dp: [] for dp in jobs}
                    for turn in range(args.warmup + args.repeats):
                        for dp, job in jobs.items():
                            elapsed = step_ms(world, job)[0]
                            if turn >= args.warmup:
                                ms[dp].append(elapsed)
                    bare, noised = statistics.median(ms[False]), statistics.median(ms[True])
                    cells.append({"protocol": protocol, "parties": parties, "batch": batch, "stage": stage,
                                  "step_ms": round(bare, 2), "dp_step_ms": round(noised, 2),
                                  "ratio": round(noised / bare, 3)})
                    print(f"{protocol:>5} K={parties:<3} B={batch:<4} {stage:<8} {bare:8.1f} ms -> {noised:8.1f} ms "
                          f"with DP ({noised / bare:.2f}x)", flush=True)
                    write_json(path, cells)
    lines = ["| protocol | K | batch | stage | step ms | with DP ms | ratio |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {c['protocol']} | {c['parties']} | {c['batch']} | {c['stage']} | {c['step_ms']:.0f} | "
              f"{c['dp_step_ms']:.0f} | {c['ratio']:.2f} |" for c in cells]
    table = "\n".join(lines) + "\n"
    (out / "privacy_overhead.md").write_text(table)
    print(table + f"\nresults: {path} and {out / 'privacy_overhead.md'}")
    if args.readme:
        update_readme(Path(args.readme), out.resolve().name, table)
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=list(PROTOCOLS))
    p.add_argument("--ciphers", action="store_true", help="time the sum alone for every registered cipher and "
                   "the Paillier plug-in (see above), not the steps")
    p.add_argument("--privacy", action="store_true", help="time each step with and without a privacy budget (the "
                   "noise stage and DP-SGD) side by side; DIR/privacy_overhead.json and .md")
    p.add_argument("--values", nargs="+", type=int, default=[4096, 32768], help="--ciphers: values per sum")
    p.add_argument("--parties", nargs="+", type=int, default=[2, 4, 8, 12])
    p.add_argument("--batch", nargs="+", type=int, default=[128, 512])
    p.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--latent-broadcast", choices=["samples", "moments"], default="samples",
                   help="FALSE-VFL's latent round (moments: the measured alternative, not the default)")
    p.add_argument("--no-audit", action="store_true", help="skip the recorded-view audit")
    p.add_argument("--shape", choices=sorted(SHAPES), default="isolet",
                   help="the job's widths: Isolet's, or a 10-column-per-party table's (preset auto)")
    p.add_argument("--out", default="runs/overhead")
    p.add_argument("--readme", default=None, help="rewrite this file's generated section <!-- results:NAME:... -->, "
                   "NAME the --out folder's name")
    p.add_argument("--report-only", action="store_true", help="no measurements: tables and plot from the JSON")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    SHAPE.update(SHAPES[args.shape])
    if args.ciphers:
        return cipher_table(args)
    if args.privacy:
        return privacy_table(args)
    if min(args.parties) < 2 or min(args.batch) < 1 or args.repeats < 1 or args.warmup < 0:
        print("error: --parties must be >= 2, --batch >= 1, --repeats >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    job = functools.partial(make_job, latent_broadcast=args.latent_broadcast)
    out = Path(args.out)
    path, summary_path = out / "overhead.json", out / "overhead_summary.json"
    cells: list[dict] = json.loads(path.read_text()) if path.exists() else []
    summary: dict = json.loads(summary_path.read_text()) if summary_path.exists() else {"local": [], "audit": []}
    done = {(c["protocol"], c["parties"], c["batch"], c["stage"]) for c in cells}
    audited = {(a["protocol"], a["parties"]) for a in summary["audit"]}
    for parties in [] if args.report_only else args.parties:
        todo = [(b, st) for b in args.batch for st in args.stages
                if any((p, parties, b, st) not in done for p in args.protocols)]
        need_audit = [p for p in args.protocols if not args.no_audit and (p, parties) not in audited]
        if not todo and not need_audit:
            continue
        started = time.perf_counter()
        with contextlib.ExitStack() as stack:
            worlds = {p: stack.enter_context(StepSession(p, parties)) for p in args.protocols}
            for batch, stage in todo:
                measured = time_cells(worlds, job(parties, batch, stage), args.warmup, args.repeats)
                for protocol, timing in measured.items():
                    cells = [c for c in cells if (c["protocol"], c["parties"], c["batch"], c["stage"])
                             != (protocol, parties, batch, stage)]
                    cell = {"protocol": protocol, "parties": parties, "batch": batch, "stage": stage, **timing}
                    cells.append(cell)
                    print(f"{protocol:>5} K={parties:<3} B={batch:<4} {stage:<8} {cell['step_ms_median']:9.1f} ms "
                          f"(min {cell['step_ms_min']:.1f}, max {cell['step_ms_max']:.1f})  "
                          f"{cell['bytes_per_party'] / 2**20:8.2f} MiB/party  {cell['rounds']} rounds  CPU ms: "
                          f"active {cell['cpu_ms']['active']}, busiest passive {cell['cpu_ms']['busiest_passive']}, "
                          f"all roles {cell['cpu_ms']['all_roles']}", flush=True)
                    print(timeline_text(cell["timeline"]), flush=True)
                write_json(path, cells)
            for protocol in need_audit:
                audit = audit_cell(worlds[protocol], protocol, parties, min(args.batch))
                summary["audit"].append(audit)
                print(f"{protocol:>5} K={parties:<3} audit: {audit['entries_checked']} entries of "
                      f"{audit['views_audited']} view checked, {audit['leaks_found']} leaks found "
                      f"({audit['expected']})", flush=True)
        print(f"      ({time.perf_counter() - started:.0f} s for K={parties})", flush=True)
        summary["ratios"] = ratios(cells)
        write_json(summary_path, summary)
    local_done = {(r["parties"], r["batch"], r["stage"]) for r in summary["local"]}
    for parties in [] if args.report_only else args.parties:
        for batch in args.batch:
            for stage in args.stages:
                plain = next((c for c in cells if (c["protocol"], c["parties"], c["batch"], c["stage"])
                              == ("plain", parties, batch, stage)), None)
                if plain is None or (parties, batch, stage) in local_done:
                    continue
                local_ms = time_local(job(parties, batch, stage), args.warmup, args.repeats)
                summary["local"].append({"parties": parties, "batch": batch, "stage": stage, "local_ms": local_ms,
                                         "plain_distributed_ms": plain["step_ms_median"],
                                         "distributed_over_local": round(plain["step_ms_median"] / local_ms, 3)})
    summary["ratios"] = ratios(cells)
    write_json(summary_path, summary)
    plot(cells, out / "overhead.png")
    print(f"\n{'ratio':<12}{'K':>4}{'batch':>7}{'stage':>10}{'value':>8}")
    for r in summary["ratios"]:
        print(f"{r['ratio']:<12}{r['parties']:>4}{r['batch']:>7}{r['stage']:>10}{r['value']:>8.2f}")
    for r in summary["local"]:
        print(f"plain distributed / local  K={r['parties']} B={r['batch']} {r['stage']}: "
              f"{r['plain_distributed_ms']:.1f} / {r['local_ms']:.1f} ms = {r['distributed_over_local']:.2f}")
    table = markdown(cells, summary)
    (out / "overhead.md").write_text(table + "\n")
    print(f"\nresults: {path}, {summary_path}, {out / 'overhead.md'} and {out / 'overhead.png'}")
    if args.readme:
        readme = Path(args.readme)
        update_readme(readme, out.resolve().name,
                      f"{table}\n![overhead]({relative_link(out / 'overhead.png', readme)})\n")
        print(f"rewrote the results section of {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
