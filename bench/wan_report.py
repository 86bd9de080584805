"""The records and the report of bench/wan.py: one record per (link, protocol) cell from the roles' own run
files, and the table (OUT/wan.md), the plot (OUT/wan.png) and the README section made from those records."""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
from pathlib import Path

from readme_section import relative_link, update_readme

from falsevfl_secure.fsio import atomic_write
from falsevfl_secure.transport import PROTOCOLS  # noqa: E402

STAGES = ("pretrain", "train")
PARTS = ("compute_s", "protocol_s", "network_s")
PART_NAMES = {"compute_s": "compute", "protocol_s": "protocol (encoding, masks, encryption)",
              "network_s": "waiting for peers' frames"}
SHAPING = {"netem": "tc netem delay RTT/2 + rate on each host's uplink, tbf on its downlink",
           "relay": "tc tbf on each host's uplink and downlink; the delay added by a relay in each dialer's "
                    "namespace (this kernel has no sch_netem)"}
MIB = float(1 << 20)


def cell_header(link, protocol: str, mode: str, dataset: str, parties: int) -> dict:
    return {"link": link.name, "rtt_ms": link.rtt_ms, "mbit": link.mbit, "protocol": protocol, "dataset": dataset,
            "parties": parties, "shaping": mode}


def key_of(cell: dict) -> tuple:
    return cell["link"], cell["protocol"], cell["dataset"], cell["parties"]


def _git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent)
    return done.stdout.strip() or "unknown"


def _traffic_mib(rows: list[dict]) -> float:
    return round(sum(r["bytes_sent"] + r["bytes_received"] for r in rows) / MIB, 2)


def mean_split(logs: list[dict]) -> dict:
    """Per stage, each part of the time split averaged over the parties' own records."""
    return {stage: {part: round(sum(log["stage_split"][stage][part] for log in logs) / len(logs), 3)
                    for part in PARTS} for stage in STAGES}


def per_round(rows: list[dict]) -> dict:
    """The active party's seconds in each round and the part of them spent waiting."""
    out: dict[str, dict] = {}
    for row in rows:
        entry = out.setdefault(row["round"], {"seconds": 0.0, "waiting": 0.0, "mib": 0.0})
        entry["seconds"] = round(entry["seconds"] + row.get("seconds", 0.0), 3)
        entry["waiting"] = round(entry["waiting"] + row.get("waiting", 0.0), 3)
        entry["mib"] = round(entry["mib"] + (row["bytes_sent"] + row["bytes_received"]) / MIB, 2)
    return out


def cell_record(demo: Path, names: list[str], active: str, header: dict, measured: dict, wall_s: float) -> dict:
    """A finished cell: the active party's train_result.json and every party's train_log.json, summarised."""
    logs = {n: json.loads((demo / n / "model" / "train_log.json").read_text()) for n in names}
    result = json.loads((demo / active / "model" / "train_result.json").read_text())
    cfg, align = result["config"], result["alignment"]
    steps = {"pretrain": math.ceil(align["records"] / cfg["pretrain"]["batch_size"]),
             "train": math.ceil(align["labeled"] / cfg["train"]["batch_size"])}
    passive = [logs[n] for n in names if n != active]
    return {**header, "measured": measured, "epoch_s": {s: result["stage_time_s"][s] for s in STAGES},
            "steps": steps, "split_mean": mean_split(list(logs.values())),
            "split_active": {s: result["stage_split"][s] for s in STAGES},
            "mib_active": _traffic_mib(result["communication"]),
            "mib_passive_max": max(_traffic_mib(log["communication"]) for log in passive),
            "rounds_active": per_round(result["communication"]), "alignment_s": align["seconds"],
            "train_wall_s": result["wall_time_s"], "launch_to_exit_s": round(wall_s, 1),
            "commit": _git_commit(), "cpus": os.cpu_count(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}


def one_line(cell: dict) -> str:
    where = f"{cell['link']} / {cell['protocol']}"
    if "error" in cell:
        return f"{where}: failed: {cell['error']}"
    m, e = cell["measured"], cell["epoch_s"]
    return (f"{where}: stage 1 epoch {e['pretrain']:.1f} s, stage 2 epoch {e['train']:.1f} s "
            f"(link measured: RTT {m['rtt_ms_median']:.2f} ms, {m['up_mbit']:.0f} / {m['down_mbit']:.0f} Mbit/s)")


# -- the report ---------------------------------------------------------------------------------------------


def _link_label(cell: dict) -> str:
    rate = f"{cell['mbit'] / 1000:g} Gbit/s" if cell["mbit"] >= 1000 else f"{cell['mbit']:g} Mbit/s"
    return f"{cell['rtt_ms']:g} ms / {rate}"


def ordered(cells: list[dict]) -> list[dict]:
    """Cells by link (fastest first: lowest RTT, then highest rate) and protocol (plain, mpc, he)."""
    order = {"plain": 0, "mpc": 1, "he": 2}
    return sorted(cells, key=lambda c: (c["dataset"], c["parties"], c["rtt_ms"], -c["mbit"],
                                        order.get(c["protocol"], 9)))


def _baseline(cells: list[dict], cell: dict) -> dict | None:
    """The same protocol's finished cell on the fastest link measured (what the slower links add to)."""
    same = [c for c in ordered(cells) if "error" not in c and key_of(c)[1:] == key_of(cell)[1:]]
    return same[0] if same else None


def _split_text(split: dict) -> str:
    return " / ".join(f"{split[p]:.1f}" for p in PARTS)


def _row(cells: list[dict], cell: dict) -> str:
    head = f"| {_link_label(cell)} | {cell['protocol']} |"
    if "error" in cell:
        return f"{head} failed: {cell['error'][:300]} |" + " |" * 8
    m, e = cell["measured"], cell["epoch_s"]
    both = e["pretrain"] + e["train"]
    base = _baseline(cells, cell)
    extra = "-" if base is None or base is cell else f"+{both - sum(base['epoch_s'].values()):.1f}"
    return (f"{head} {m['rtt_ms_median']:.2f} | {m['up_mbit']:.0f} / {m['down_mbit']:.0f} | {e['pretrain']:.1f} | "
            f"{e['train']:.1f} | **{both:.1f}** | {extra} | {_split_text(cell['split_mean']['pretrain'])} | "
            f"{_split_text(cell['split_mean']['train'])} | {cell['mib_active']:.0f} | {cell['alignment_s']:.1f} |")


def summary(cells: list[dict]) -> str:
    """One sentence per protocol: what one epoch of each stage costs on every link measured, with the share
    of it the parties spent waiting on the network; the links not measured are named."""
    lines = []
    for protocol in sorted({c["protocol"] for c in cells}, key=list(PROTOCOLS).index):
        mine = [c for c in ordered(cells) if c["protocol"] == protocol and "error" not in c]
        parts = []
        for c in mine:
            mean = [c["split_mean"][s][part] for s in STAGES for part in PARTS]
            waiting = sum(c["split_mean"][s]["network_s"] for s in STAGES)
            parts.append(f"{sum(c['epoch_s'].values()):.1f} s on {_link_label(c)} "
                         f"({100 * waiting / max(sum(mean), 1e-9):.0f}% waiting)")
        failed = [_link_label(c) for c in ordered(cells) if c["protocol"] == protocol and "error" in c]
        text = f"`{protocol}`: " + ("; ".join(parts) if parts else "no cell finished")
        lines.append(text + (f"; failed on {', '.join(failed)}" if failed else "") + ".")
    return "One epoch of each stage (stage 1 + stage 2, the active party's wall time; waiting: the parties' mean " \
           "share blocked on a peer's frame) -- " + " ".join(lines)


def render_markdown(cells: list[dict]) -> str:
    cells = ordered(cells)
    done = [c for c in cells if "error" not in c]
    first = done[0] if done else cells[0]
    modes = sorted({c["shaping"] for c in cells})
    steps = (f"{first['steps']['pretrain']} stage-1 steps and {first['steps']['train']} stage-2 steps"
             if done else "no cell finished")
    lines = [f"**{first['dataset']}, K = {first['parties']}: one epoch of each stage ({steps}), every role in its "
             "own network namespace on this machine**", "",
             "Shaping: " + "; ".join(SHAPING[m] for m in modes) + ". Measured: a 64-byte ping-pong (median RTT) "
             "and a bulk upload / download (goodput) between a passive party's host and the active party's, "
             "before training, on the path the parties' frames take.", "", summary(cells), "",
             "| link (configured RTT / rate) | protocol | measured RTT (ms) | measured goodput up / down (Mbit/s) | "
             "stage 1 epoch (s) | stage 2 epoch (s) | both (s) | over the fastest link (s) | stage 1: compute / "
             "protocol / waiting (s, mean of parties) | stage 2: compute / protocol / waiting (s) | MiB in and out "
             "of the active party (counted in its rounds) | alignment (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(cells, c) for c in cells]
    if done:
        lines += ["", "The MiB column is the active party's round log (`communication` in its train_result.json): "
                      "every frame it sent in a round, and every frame it received, counted when the round read it "
                      "(also a frame a peer sent ahead of it).",
                  "", f"Measured at commit {', '.join(sorted({c['commit'] for c in done}))} on {first['cpus']} "
                      f"CPUs shared by all {first['parties'] + 1} roles."]
    return "\n".join(lines)


def plot(cells: list[dict], path: Path) -> None:
    """Stacked bars per link and protocol (compute / protocol / waiting, mean of the parties), one panel per
    stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = ordered([c for c in cells if "error" not in c])
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    colors = {"compute_s": "#4c72b0", "protocol_s": "#dd8452", "network_s": "#8c8c8c"}
    for ax, stage in zip(axes, STAGES, strict=True):
        bottom = [0.0] * len(done)
        for part in PARTS:
            values = [c["split_mean"][stage][part] for c in done]
            ax.bar(range(len(done)), values, bottom=bottom, color=colors[part], label=PART_NAMES[part])
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_xticks(range(len(done)), [f"{c['protocol']}\n{_link_label(c).replace(' / ', chr(10))}" for c in done],
                      fontsize=7)
        ax.set_title(f"stage {1 if stage == 'pretrain' else 2}: one epoch")
        ax.set_ylabel("seconds (mean of the parties)")
    axes[0].legend(fontsize=8)
    fig.suptitle("One training epoch over emulated links (each party's own time split)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(cells: list[dict], out: Path, readme: Path | None) -> None:
    text = render_markdown(cells)
    atomic_write(out / "wan.md", text + "\n")
    plot(cells, out / "wan.png")
    if readme is not None:
        update_readme(readme, "wan", f"{text}\n\n![wan]({relative_link(out / 'wan.png', readme)})\n")
