"""Command line: train FALSE-VFL on one dataset and report per-pattern test accuracy.

    python -m falsevfl_secure.simulate --protocol plain [--dataset digits] [--out runs/x]

Writes OUT/result.json (accuracy in percent per test pattern, wall time, communication table) and
OUT/result.png (a bar chart of the accuracies).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from .config import make_config
from .data import TEST_PATTERNS, TRAIN_MECHANISMS
from .errors import FalseVflError

PROTOCOLS = ("plain", "mpc", "he")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m falsevfl_secure.simulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=PROTOCOLS, default="plain")
    parser.add_argument("--runtime", choices=("local", "distributed"), default=None,
                        help="default: local for plain, distributed for mpc and he")
    parser.add_argument("--dataset", default="digits", help="digits (embedded), isolet, hapt, fashion-mnist")
    parser.add_argument("--parties", type=int, default=None, help="number of parties K (default: preset)")
    parser.add_argument("--variant", choices=("I", "II"), default="I")
    parser.add_argument("--train-mechanism", default="mcar:0.2",
                        help=f"one of {', '.join(TRAIN_MECHANISMS)} or dirichlet:ALPHA")
    parser.add_argument("--preset", choices=("quick", "paper"), default="quick")
    parser.add_argument("--pretrain-epochs", type=int, default=None)
    parser.add_argument("--train-epochs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--out", default="runs/simulate", help="output directory")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--checkpoint-dir", default=None, help="per-party checkpoints (default: OUT/checkpoints)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the last epoch that every party completed")
    parser.add_argument("--audit", action="store_true",
                        help="record every role's view of one probe step and audit it against the threat "
                             "models (distributed runtime; results under \"audit\" in result.json)")
    return parser.parse_args(argv)


def write_json_atomic(path: Path, record: dict) -> None:
    """Write via a temporary file and rename, so a killed run never leaves a truncated file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=2)
    os.replace(tmp, path)


def plot_accuracy(accuracy: dict[str, float], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    names = list(accuracy)
    ax.bar(names, [accuracy[n] for n in names], color="#4c72b0")
    for i, n in enumerate(names):
        ax.text(i, accuracy[n] + 0.5, f"{accuracy[n]:.1f}", ha="center", fontsize=8)
    ax.set_ylabel("test accuracy (%)")
    ax.set_xlabel("test pattern")
    ax.set_ylim(0, 105)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_report(result: dict) -> None:
    print(f"\n{'test pattern':<12} accuracy (%)")
    for pattern, acc in result["accuracy"].items():
        print(f"{pattern:<12} {acc:6.2f}")
    rows = result.get("communication", [])
    if rows:
        print(f"\n{'round':<16}{'party':>6}{'messages':>10}{'bytes sent':>14}{'bytes recv':>14}{'seconds':>10}")
        for r in rows:
            print(f"{r['round']:<16}{r['party']:>6}{r['messages']:>10}{r['bytes_sent']:>14}"
                  f"{r['bytes_received']:>14}{r['seconds']:>10.3f}")
    print(f"\nwall time {result['wall_time_s']:.1f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch

        if args.threads is not None:
            if args.threads < 1:
                raise FalseVflError("--threads must be at least 1")
            torch.set_num_threads(args.threads)
        runtime = args.runtime or ("local" if args.protocol == "plain" else "distributed")
        if runtime == "local" and args.protocol != "plain":
            raise FalseVflError(f"--protocol {args.protocol} needs --runtime distributed "
                                "(secure protocols run one process per party)")
        if runtime == "local" and args.audit:
            raise FalseVflError("--audit needs --runtime distributed: in the local runtime no party "
                                "receives anything (all roles share one process)")
        cfg = make_config(args.dataset, args.preset, parties=args.parties, variant=args.variant,
                          train_mechanism=args.train_mechanism, seed=args.seed, device=args.device)
        from dataclasses import replace

        if args.pretrain_epochs is not None:
            cfg = replace(cfg, pretrain=replace(cfg.pretrain, epochs=args.pretrain_epochs))
        if args.train_epochs is not None:
            cfg = replace(cfg, train=replace(cfg.train, epochs=args.train_epochs))
        cfg.validate()
        checkpoints = Path(args.checkpoint_dir or Path(args.out) / "checkpoints")
        if runtime == "local":
            from .runtime.local import run_local

            result = run_local(cfg, TEST_PATTERNS, progress=not args.quiet, checkpoint_dir=checkpoints,
                               resume=args.resume)
        else:
            from .runtime.distributed import run_distributed

            result = run_distributed(cfg, args.protocol, TEST_PATTERNS, progress=not args.quiet,
                                     out_dir=Path(args.out), checkpoint_dir=checkpoints, resume=args.resume,
                                     audit=args.audit)
    except FalseVflError as error:  # includes DataError and InputError: a clear message, no traceback
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    result.pop("_world", None)
    result["config"] = cfg.to_dict()
    out = Path(args.out)
    write_json_atomic(out / "result.json", result)
    plot_accuracy(result["accuracy"], f"FALSE-VFL-{cfg.variant} on {cfg.dataset}, K={cfg.parties}, "
                  f"trained {cfg.train_mechanism}, {result['protocol']}/{result['runtime']}", out / "result.png")
    print_report(result)
    print(f"results: {out / 'result.json'} and {out / 'result.png'}")
    audit = result.get("audit")
    if audit is not None:
        print(f"\naudit ({audit['protocol']}): {audit['views_audited']} views, {audit['entries_checked']} entries "
              f"checked, {audit['leaks_found']} leaks found, {audit['disclosed_by_design_rows']} rows disclosed "
              f"by design (held by one passive party); expected: {audit['expected']}")
        for leak in audit["leaks"][:5]:
            print(f"  leak: {leak}")
        if not audit["passed"] and args.protocol != "plain":
            print("error: the audit found leaks in a secure protocol", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
