"""Command line: train a method on a simulated federation of one dataset and report per-pattern accuracy.

    python -m falsevfl_secure.simulate --protocol plain|mpc|he [--method false-vfl-i] [--dataset digits] [--out runs/x]

`--method` is FALSE-VFL-I or -II or one of the paper's baselines (vanilla, laser, plugvfl, fedhssl), each
with its own schedule for the dataset (`config.METHOD_SCHEDULES`); `--variant I|II` is the older spelling
of `--method false-vfl-i|false-vfl-ii`.

Writes OUT/result.json (accuracy in percent per test pattern, the fraction of parties observed under each,
wall times, the per-round communication) and OUT/result.png. Every expected failure ends with one
`error:` line and a non-zero exit code; the output and checkpoint folders are checked before any work.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from .cli import guarded
from .config import (
    CELL_HANDLING,
    ENCODE_MISSING,
    LASER_BATCHES,
    LATENT_BROADCAST,
    METHOD_LABELS,
    PLUG_DROPS,
    Config,
    make_config,
    parse_method,
)
from .data import TEST_PATTERNS, TRAIN_MECHANISMS
from .data.mechanisms import MECHANISM_ROWS
from .errors import InputError
from .fsio import atomic_write, write_json
from .privacy import check_budget, noise_multiplier, spent
from .transport.protocols import PROTOCOLS, protocol_named

TESTS = len(TEST_PATTERNS)  # a test row's prediction passes (test rows never train; training rows: 1 validation pass)


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    """The options that change the model or its schedule (not the split, runtime or output)."""
    parser.add_argument("--pretrain-epochs", type=int, default=None)
    parser.add_argument("--train-epochs", type=int, default=None)
    parser.add_argument("--cell-missing", type=float, default=None, metavar="FRACTION",
                        help="remove this fraction of cells at random inside the blocks parties hold (train and test)")
    parser.add_argument("--cell-handling", choices=CELL_HANDLING, default=None,
                        help="empty cells: mask (the encoder sees which cells are empty, the likelihood covers "
                             "the observed ones; default) or mean (mean-imputed and treated as observed)")
    parser.add_argument("--latent-broadcast", choices=LATENT_BROADCAST, default="samples",
                        help="FALSE-VFL's latent round: samples (default) or moments (mean, scale and a sampling "
                             "key per record: fewer bytes, but every party learns the exact posterior)")
    _add_protocol_options(parser)


def _add_protocol_options(parser: argparse.ArgumentParser) -> None:
    """Readings of the paper's protocol (README "Comparison with the paper"); default: the preset's."""
    parser.add_argument("--laser-batches", choices=LASER_BATCHES, default=None,
                        help="LASER-VFL's batches: grouped by observed set, only full such batches, or plain shuffles")
    parser.add_argument("--plug-drop", choices=PLUG_DROPS, default=None,
                        help="PlugVFL drops a passive party per row or per mini-batch")
    parser.add_argument("--mechanism-rows", choices=MECHANISM_ROWS, default=None,
                        help="the training mechanism removes blocks from all training rows or the labeled ones only")
    parser.add_argument("--encode-missing", choices=ENCODE_MISSING, default=None,
                        help="FALSE-VFL's posterior over the parties holding a row (skip) or all, missing blocks "
                             "encoded as zeros (MIWAE's convention)")
    _add_privacy_options(parser)
    parser.add_argument("--steps-per-epoch", type=int, default=None, metavar="N",
                        help="stage 2: at most N steps per epoch (0: every batch)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m falsevfl_secure.simulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=tuple(PROTOCOLS), default="plain")
    parser.add_argument("--runtime", choices=("local", "distributed"), default=None,
                        help="default: local for plain, distributed for mpc and he")
    parser.add_argument("--dataset", default="digits", help="digits (embedded), isolet, hapt, fashion-mnist")
    parser.add_argument("--parties", type=int, default=None, help="number of parties K (default: preset)")
    parser.add_argument("--method", choices=tuple(METHOD_LABELS), default=None,
                        help="the method (default false-vfl-i): FALSE-VFL-I or -II, or a baseline of the paper")
    parser.add_argument("--variant", choices=("I", "II"), default=None,
                        help="FALSE-VFL's variant: --variant II is --method false-vfl-ii")
    parser.add_argument("--train-mechanism", default="mcar:0.2",
                        help=f"one of {', '.join(TRAIN_MECHANISMS)} or dirichlet:ALPHA")
    parser.add_argument("--preset", choices=("quick", "default", "paper", "paper-protocol"), default="default",
                        help="quick: a smoke test; default: the demo schedule (the paper's for its datasets); "
                             "paper: the paper's schedule; paper-protocol: the paper's schedule under the readings "
                             "of its protocol that reproduce its rows best")
    _add_model_options(parser)
    parser.add_argument("--seed", type=int, default=0, help="the public seed: batch order and the simulated split")
    parser.add_argument("--max-rows", type=int, default=None,
                        help="a smoke test of a configuration: at most this many training and test rows")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--out", default="runs/simulate", help="output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--checkpoint-dir", default=None, help="per-party checkpoints (default: OUT/checkpoints)")
    parser.add_argument("--resume", action="store_true", help="continue from the last epoch every party completed")
    parser.add_argument("--audit", action="store_true",
                        help="record every role's view of one probe step and audit it against the threat models "
                             "(distributed runtime; results under \"audit\" in result.json)")
    parser.add_argument("--allow-two-party-disclosure", action="store_true",
                        help="run mpc or he with 2 parties although they then hide nothing from the active party "
                             "(the sum minus its own contribution is the other party's)")
    return parser.parse_args(argv)


def _add_privacy_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("differential privacy of the sums (README \"Output privacy\")")
    group.add_argument("--epsilon", type=float, default=None,
                       help="each party's budget per row (default: no DP); FALSE-VFL only")
    group.add_argument("--delta", type=float, default=None, help="delta of the budget (default 1e-5)")
    group.add_argument("--noise-multiplier", type=float, default=None,
                       help="sigma / clip of every summed round (default: the smallest that fits the budget)")
    group.add_argument("--collusion", type=int, default=None,
                       help="parties besides the active one that may collude with it or drop (default 0)")
    group.add_argument("--clip", type=float, nargs=3, default=None, metavar=("POSTERIOR", "LIKELIHOOD", "GRAD"),
                       help="per-row L2 clip norms of the posterior, likelihood and latent_grad rounds")


def privacy_of(args: argparse.Namespace, cfg: Config) -> Config:
    """The configuration with the command line's privacy settings (unset ones keep the config's)."""
    given = {"epsilon": args.epsilon, "delta": args.delta, "noise_multiplier": args.noise_multiplier,
             "collusion": args.collusion}
    if args.clip is not None:
        given.update(zip(("clip_posterior", "clip_likelihood", "clip_latent_grad"), args.clip, strict=True))
    given = {k: v for k, v in given.items() if v is not None}
    return replace(cfg, privacy=replace(cfg.privacy, **given)) if given else cfg


def method_label(args: argparse.Namespace) -> str:
    """The method asked for: `--method`, or `--variant` (its alias for FALSE-VFL); both must agree."""
    alias = f"false-vfl-{args.variant.lower()}" if args.variant else None
    if args.method and alias and args.method != alias:
        raise InputError(f"--method {args.method} and --variant {args.variant} disagree (--variant {args.variant} "
                         f"means --method {alias}); give one of them")
    return args.method or alias or "false-vfl-i"


def configure(args: argparse.Namespace) -> tuple[Config, str]:
    """The run's configuration and runtime, refusing impossible combinations before any work."""
    protocol = protocol_named(args.protocol)
    runtime = args.runtime or ("local" if "local" in protocol.runtimes else "distributed")
    if runtime not in protocol.runtimes:
        raise InputError(f"--protocol {protocol.name} needs --runtime distributed (one process per party)")
    if runtime == "local" and args.audit:
        raise InputError("--audit needs --runtime distributed: in the local runtime no party receives anything")
    if args.threads is not None and args.threads < 1:
        raise InputError("--threads must be at least 1")
    method, variant = parse_method(method_label(args))
    cfg = make_config(args.dataset, args.preset, parties=args.parties, method=method, variant=variant,
                      train_mechanism=args.train_mechanism, seed=args.seed, device=args.device,
                      max_rows=args.max_rows, cell_missing=args.cell_missing, cell_handling=args.cell_handling,
                      latent_broadcast=args.latent_broadcast, laser_batches=args.laser_batches,
                      plug_drop=args.plug_drop, mechanism_rows=args.mechanism_rows, encode_missing=args.encode_missing)
    if args.pretrain_epochs is not None:
        cfg = replace(cfg, pretrain=replace(cfg.pretrain, epochs=args.pretrain_epochs))
    if args.train_epochs is not None:
        cfg = replace(cfg, train=replace(cfg.train, epochs=args.train_epochs))
    if args.steps_per_epoch is not None:
        cfg = replace(cfg, train=replace(cfg.train, steps_per_epoch=args.steps_per_epoch))
    cfg = privacy_of(args, cfg).validate()
    protocol.check_parties(cfg.parties, args.allow_two_party_disclosure)
    if cfg.privacy.enabled:  # the noise every party adds, stated once; then each party's own budget checked
        cfg = replace(cfg, privacy=replace(cfg.privacy, noise_multiplier=noise_multiplier(cfg, 1, TESTS)))
    for k in range(cfg.parties):  # (here every party runs from the same settings)
        check_budget(cfg, f"party {k}", 1, TESTS)
    return cfg, runtime


def check_folders(out: Path, checkpoints: Path, resume: bool, cfg: Config) -> None:
    """Refuse unusable output or checkpoint folders, and a resume that does not fit, before any work."""
    from .checkpoint import check_resumable

    for folder, what in ((out, "--out"), (checkpoints, "--checkpoint-dir")):
        if folder.exists() and not folder.is_dir():
            raise InputError(f"{what} {folder} is a file, not a folder")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write(folder / ".write-test", b"")
            (folder / ".write-test").unlink()
        except OSError as error:
            raise InputError(f"{what} {folder} cannot be written: {error.strerror or error}") from error
    if resume:
        check_resumable(checkpoints, range(cfg.parties), cfg)


def run(args: argparse.Namespace, cfg: Config, runtime: str, checkpoints: Path):
    if runtime == "local":
        from .runtime.local import run_local

        return run_local(cfg, TEST_PATTERNS, progress=not args.quiet, checkpoint_dir=checkpoints, resume=args.resume)
    from .runtime.distributed import run_distributed

    return run_distributed(cfg, args.protocol, TEST_PATTERNS, progress=not args.quiet, out_dir=Path(args.out),
                           checkpoint_dir=checkpoints, resume=args.resume, audit=args.audit,
                           allow_two_party_disclosure=args.allow_two_party_disclosure)


def simulate(args: argparse.Namespace) -> int:
    from .report import plot_result, print_result

    cfg, runtime = configure(args)
    out = Path(args.out)
    checkpoints = Path(args.checkpoint_dir or out / "checkpoints")
    check_folders(out, checkpoints, args.resume, cfg)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    result = run(args, cfg, runtime, checkpoints)
    if cfg.privacy.enabled:
        result.privacy = [spent(cfg, f"party {k}", 1, TESTS).to_dict() for k in range(cfg.parties)]
    write_json(out / "result.json", result.to_dict())
    plot_result(result, out / "result.png")
    print_result(result, out)
    if result.audit is not None and not result.audit["passed"] and args.protocol != "plain":
        print("error: the audit found leaks in a secure protocol", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return guarded(lambda: simulate(args))


if __name__ == "__main__":
    sys.exit(main())
