"""Training that survives a lost party, measured: digits, four parties, FALSE-VFL-I, MCAR 0.2, one passive
party killed mid-epoch in stage 1 (a real process exit) under plain, mpc and he. Each run is compared with the
same run without the crash, and with two local plain references (one process, the same per-party secrets): the
party's step abandoned where the distributed run notices it, and the party absent from the crash's epoch on.

    .venv/bin/python bench/party_loss.py [--pretrain-epochs 40] [--train-epochs 60] [--crash-epoch 10]
                                         [--protocols plain mpc he] [--readme README.md]

Writes bench/results/party_loss/party_loss.json and .md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from party_loss_runs import Crash, distributed_run, local_run, scheduled, steps_per_epoch  # noqa: E402
from readme_section import update_readme  # noqa: E402

from falsevfl_secure.cli import guarded  # noqa: E402
from falsevfl_secure.fsio import write_json  # noqa: E402
from falsevfl_secure.methods import make_config  # noqa: E402
from falsevfl_secure.transport import PROTOCOLS  # noqa: E402

OUT = ROOT / "bench" / "results" / "party_loss"


def _timed(run) -> tuple[object, float]:
    began = time.perf_counter()
    return run(), round(time.perf_counter() - began, 1)


def _distributed(protocol: str, cfg, crash: Crash | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="falsevfl-loss-") as folder:
        ended, seconds = _timed(lambda: distributed_run(Path(folder), protocol, cfg, crash))
    active = ended[cfg.active_index]
    if "ok" not in active:
        raise RuntimeError(f"{protocol}: the run failed: {active}")
    return {"accuracy": round(active["ok"]["accuracy"], 2), "seconds": seconds, "events": active["ok"]["events"]}


def _table(record: dict) -> str:
    ref = record["references"]
    lines = ["| protocol | no crash | party 1 killed mid-epoch | - abandoned-step reference | - absent-from-epoch "
             "reference | run time (killed) |", "|---|---|---|---|---|---|"]
    for protocol, row in record["protocols"].items():
        killed = row["killed"]["accuracy"]
        lines.append(f"| {protocol} | {row['full']['accuracy']:.2f} % | {killed:.2f} % | "
                     f"{killed - ref['abandoned_step']:+.2f} pp | {killed - ref['absent_from_epoch']:+.2f} pp | "
                     f"{row['killed']['seconds']:.0f} s |")
    lines.append(f"\nLocal plain references (test accuracy): abandoned step {ref['abandoned_step']:.2f} %, absent "
                 f"from epoch {record['crash']['epoch']} on {ref['absent_from_epoch']:.2f} %. "
                 f"Schedule {record['schedule']}; crash: party {record['crash']['party']} at stage-1 epoch "
                 f"{record['crash']['epoch']}, step {record['crash']['step']} of {record['crash']['steps_per_epoch']}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-epochs", type=int, default=40)
    parser.add_argument("--train-epochs", type=int, default=60)
    parser.add_argument("--crash-epoch", type=int, default=10)
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS))
    parser.add_argument("--readme", default=None)
    args = parser.parse_args(argv)
    cfg = scheduled(make_config("digits", "quick", parties=4), args.pretrain_epochs, args.train_epochs)
    crash = Crash(party=1, epoch=args.crash_epoch, step=4, steps_per_epoch=steps_per_epoch(cfg))
    record = {"schedule": f"{args.pretrain_epochs} + {args.train_epochs} epochs (digits quick preset)",
              "crash": vars(crash), "references": {}, "protocols": {}}
    record["references"]["abandoned_step"] = round(local_run(cfg, crash)[0], 2)
    record["references"]["absent_from_epoch"] = round(local_run(cfg, crash, absent_from_epoch=True)[0], 2)
    for protocol in args.protocols:
        record["protocols"][protocol] = {"full": _distributed(protocol, cfg, None),
                                         "killed": _distributed(protocol, cfg, crash)}
        print(protocol, record["protocols"][protocol], flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    write_json(OUT / "party_loss.json", record)
    table = _table(record)
    (OUT / "party_loss.md").write_text(table + "\n")
    print(table)
    if args.readme:
        update_readme(Path(args.readme), "party_loss", table)
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
