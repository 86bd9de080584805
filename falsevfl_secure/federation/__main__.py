"""Command line of a federation on separately held tables.

    python -m falsevfl_secure.federation demo --dataset digits|isolet --parties K --out DIR [--seed N]
    python -m falsevfl_secure.federation keygen --config DIR/federation.toml --party NAME
    python -m falsevfl_secure.federation train --config DIR/federation.toml [--party NAME] [--protocol P]
    python -m falsevfl_secure.federation predict --config DIR/federation.toml [--party NAME]
        [--absent NAME ...] --out PREDICTIONS.csv
    python -m falsevfl_secure.federation score --predictions PREDICTIONS.csv --truth DIR/truth.csv

Without --party, every listed party (and the he aggregator) runs as its own local process, each reading
only its own files; with --party, this process is that party alone (one host per party: the active party
listens at the rendezvous, the he aggregator at its address, every other party only connects out over
mutual TLS to the identities pinned in its own file). Every expected failure ends with one `error:` line
and a non-zero exit.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from ..cli import guarded
from ..errors import InputError
from ..transport.protocols import PROTOCOLS
from .config import load_federation


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m falsevfl_secure.federation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="write per-party tables of a benchmark dataset and a federation.toml")
    demo.add_argument("--dataset", choices=("digits", "isolet", "fashion-mnist", "hapt"), default="digits")
    demo.add_argument("--parties", type=int, default=4)
    demo.add_argument("--out", required=True)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--protocol", choices=tuple(PROTOCOLS), default="mpc")
    demo.add_argument("--test-pattern", default="mcar:0.2", help="the missingness of the prediction set")
    demo.add_argument("--preset", choices=("quick", "default", "paper"), default="default",
                      help="the model's schedule written into federation.toml")
    keygen = commands.add_parser("keygen", help="create a participant's identity key and print the line to pin")
    keygen.add_argument("--config", required=True, help="the federation.toml that names the participant")
    keygen.add_argument("--party", required=True, help="a party's name, or 'aggregator'")
    for name in ("train", "predict"):
        sub = commands.add_parser(name, help=f"{name} the federation")
        sub.add_argument("--config", required=True, help="the federation.toml")
        sub.add_argument("--party", default=None, help="run this party only (one host per party)")
        sub.add_argument("--protocol", choices=tuple(PROTOCOLS), default=None,
                         help="as if this party's file said so (every participant must agree, or nobody runs)")
        sub.add_argument("--quiet", action="store_true", help="no progress bars")
    commands.choices["train"].add_argument("--resume", action="store_true")
    commands.choices["predict"].add_argument("--absent", nargs="*", default=[], help="listed parties that are away")
    commands.choices["predict"].add_argument("--out", required=True, help="the predictions CSV (active party)")
    score = commands.add_parser("score", help="accuracy of a predictions CSV against a truth CSV")
    score.add_argument("--predictions", required=True)
    score.add_argument("--truth", required=True)
    return parser.parse_args(argv)


def demo(args: argparse.Namespace) -> int:
    from .demo import write_demo

    if args.parties < 2:
        raise InputError(f"--parties {args.parties}: a federation needs at least 2 parties")
    path = write_demo(args.dataset, args.parties, Path(args.out), args.seed, args.protocol, args.test_pattern,
                      args.preset)
    print(f"wrote {path}, one folder per party and {Path(args.out) / 'truth.csv'}")
    return 0


def keygen(args: argparse.Namespace) -> int:
    from ..secure import identity
    from .config import AGGREGATOR

    fed = load_federation(args.config)
    if args.party != AGGREGATOR:
        fed.party(args.party)  # an unknown name is refused, naming the parties
    path = fed.identity_path(args.party)
    key = identity.generate()
    identity.write_private_key(path, key)
    public = identity.public_bytes(key)
    section = "[aggregator]" if args.party == AGGREGATOR else f"[[party]] name = {args.party!r}"
    print(f"wrote {path} (readable by its owner only; it never leaves this host)")
    print(f"pin it in {section} of every participant's federation.toml:")
    print(f'key = "{identity.pin_text(public)}"')
    print(f"fingerprint (compare it out of band): {identity.fingerprint(public)}")
    return 0


def run(args: argparse.Namespace) -> int:
    """train or predict: one party here, or all of them as local processes."""
    from .launch import present_parties, run_all, run_party

    fed = load_federation(args.config)
    present = present_parties(fed, getattr(args, "absent", []))
    protocol = args.protocol or fed.protocol
    out = str(Path(args.out).resolve()) if getattr(args, "out", None) else None
    options = {"resume": getattr(args, "resume", False), "progress": not args.quiet, "out": out}
    if args.party is not None:
        return run_party(fed, args.party, args.command, protocol, present, options)
    run_all(fed, args.command, protocol, present, options)
    _summarise(fed, args)
    return 0


def _summarise(fed, args: argparse.Namespace) -> None:
    if args.command == "predict":
        print(f"predictions: {args.out}")
        return
    record = json.loads((fed.party(fed.active).model_dir / "train_result.json").read_text())
    alignment = record["alignment"]
    print(f"trained {len(fed.parties)} parties under {record['protocol']} in {record['wall_time_s']:.1f} s: "
          f"{alignment['union_size']} records aligned in {alignment['seconds']:.1f} s "
          f"({', '.join(f'{k}: {v}' for k, v in alignment['rows_per_party'].items())}), "
          f"{alignment['labeled']} labeled; models in each party's folder")


def score(args: argparse.Namespace) -> int:
    truth = _column(Path(args.truth), "label")
    predicted = _column(Path(args.predictions), "prediction")
    missing = [i for i in truth if i not in predicted]
    if missing:
        raise InputError(f"{args.predictions} has no row for {len(missing)} IDs of {args.truth} (e.g. {missing[0]!r})")
    scored = [i for i in truth if predicted[i] != ""]
    accuracy = 100.0 * sum(predicted[i] == truth[i] for i in scored) / max(len(scored), 1)
    print(f"accuracy {accuracy:.2f} % on {len(scored)} records ({len(truth) - len(scored)} held by no present party)")
    return 0


def _column(path: Path, name: str) -> dict[str, str]:
    try:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as error:
        raise InputError(f"{path}: {error.strerror}") from error
    if not rows or "id" not in rows[0] or name not in rows[0]:
        raise InputError(f"{path}: expected the columns 'id' and {name!r}")
    return {row["id"]: row[name] for row in rows}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = {"demo": demo, "keygen": keygen, "train": run, "predict": run, "score": score}[args.command]
    return guarded(lambda: command(args))


if __name__ == "__main__":
    sys.exit(main())
