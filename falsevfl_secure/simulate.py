"""Command line: train a method on a simulated federation of one dataset and report per-pattern accuracy.

    python -m falsevfl_secure.simulate --protocol plain|mpc|he [--method false-vfl-i] [--dataset digits] [--out runs/x]

`--method` is FALSE-VFL-I or -II or one of the paper's baselines (vanilla, laser, plugvfl, fedhssl), each
with its own schedule for the dataset (its `schedules`, methods/); every method's own options are flags too
(`--variant I|II` is the older spelling of `--method false-vfl-i|false-vfl-ii`).

Writes OUT/result.json (accuracy in percent per test pattern, the fraction of parties observed under each,
wall times, the per-round communication) and OUT/result.png. Every expected failure ends with one
`error:` line and a non-zero exit code; the output and checkpoint folders are checked before any work.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from .cli import Parser, guarded
from .config import CELL_HANDLING, Config
from .data import TEST_PATTERNS, TRAIN_MECHANISMS
from .data.mechanisms import MECHANISM_ROWS
from .errors import InputError
from .fsio import atomic_write, write_json
from .methods import METHODS, make_config, method_for, method_labels, parse_method
from .privacy import check_budget, encoding_events, exposure, noise_multiplier, spent
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
    parser.add_argument("--mechanism-rows", choices=MECHANISM_ROWS, default=None,
                        help="the training mechanism removes blocks from all training rows or the labeled ones only")
    _add_method_options(parser)
    _add_privacy_options(parser)
    parser.add_argument("--steps-per-epoch", type=int, default=None, metavar="N",
                        help="stage 2: at most N steps per epoch (0: every batch)")


def method_options() -> dict[str, tuple[str, tuple]]:
    """Every registered method's options that a flag can set (those with named choices): name -> (the
    method's name and the option's help, its choices)."""
    return {name: (f"{method.name}: {option.help}", option.choices) for method in METHODS.values()
            for name, option in method.options.items() if all(isinstance(c, str) for c in option.choices)}


def _add_method_options(parser: argparse.ArgumentParser) -> None:
    """A flag for each method's own options (default: the method's preset, else its default)."""
    group = parser.add_argument_group("the methods' own options (each method's `options`, methods/)")
    for name, (help, choices) in method_options().items():
        group.add_argument(f"--{name.replace('_', '-')}", choices=choices, default=None, help=help)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(prog="python -m falsevfl_secure.simulate", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=tuple(PROTOCOLS), default="plain")
    parser.add_argument("--runtime", choices=("local", "distributed"), default=None,
                        help="default: local for plain, distributed for mpc and he")
    parser.add_argument("--dataset", default="digits", help="digits (embedded), isolet, hapt, fashion-mnist")
    parser.add_argument("--parties", type=int, default=None, help="number of parties K (default: preset)")
    parser.add_argument("--method", choices=tuple(method_labels()), default=None,
                        help="the method (default false-vfl-i): FALSE-VFL-I or -II, or a baseline of the paper")
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


def method_of(args: argparse.Namespace) -> dict:
    """The method asked for and its options: `--method` (default the first registered name) and the option
    flags; a flag that disagrees with the option the name sets (`--method false-vfl-i --variant II`) is refused."""
    method, implied = parse_method(args.method or next(iter(method_labels())))
    flags = {name: getattr(args, name) for name in method_options() if getattr(args, name) is not None}
    if args.method is None:  # a flag alone picks the name that sets it (`--variant II`: false-vfl-ii)
        return {"method": method, **implied, **flags}
    for name, value in flags.items():
        if name in implied and implied[name] != value:
            raise InputError(f"--method {args.method} and --{name.replace('_', '-')} {value} disagree "
                             f"({args.method} sets {name} = {implied[name]!r}); give one of them")
    return {"method": method, **implied, **flags}


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
    cfg = make_config(args.dataset, args.preset, parties=args.parties, **method_of(args),
                      train_mechanism=args.train_mechanism, seed=args.seed, device=args.device,
                      max_rows=args.max_rows, cell_missing=args.cell_missing, cell_handling=args.cell_handling,
                      mechanism_rows=args.mechanism_rows)
    if args.pretrain_epochs is not None:
        cfg = replace(cfg, pretrain=replace(cfg.pretrain, epochs=args.pretrain_epochs))
    if args.train_epochs is not None:
        cfg = replace(cfg, train=replace(cfg.train, epochs=args.train_epochs))
    if args.steps_per_epoch is not None:
        cfg = replace(cfg, train=replace(cfg.train, steps_per_epoch=args.steps_per_epoch))
    cfg = privacy_of(args, cfg).validate()
    if cfg.privacy.enabled and (args.audit or args.resume):  # a probe restores the noise streams; a resume repeats
        raise InputError(f"--{'audit' if args.audit else 'resume'} is refused under a privacy budget: it would "
                         "release rows again (the probe step with noise drawn twice, a resumed epoch's rows anew), "
                         "which the budget does not count")
    method_for(cfg)  # a budget refused for a method that it does not cover
    protocol.check_parties(cfg.parties, args.allow_two_party_disclosure)
    if cfg.privacy.enabled:  # the noise every party adds, stated once (for the party most exposed: under plain a
        worst = max(exposures(cfg, protocol))  # passive one), then each party's own budget checked
        z = noise_multiplier(cfg, 1, TESTS, worst)  # (after each party's private standardisation: encoding_events)
        cfg = replace(cfg, privacy=replace(cfg.privacy, noise_multiplier=z))
    for k, seen in enumerate(exposures(cfg, protocol)):  # (here every party runs from the same settings)
        check_budget(cfg, f"party {k}", 1, TESTS, encoding_events(cfg), exposure=seen)
    return cfg, runtime


def exposures(cfg: Config, protocol) -> list[int]:
    """Each party's `privacy.exposure` under the run's protocol (a simulation plays every party)."""
    return [exposure(cfg, protocol.hides_contributions, k == cfg.active_index, bool(protocol.helpers))
            for k in range(cfg.parties)]


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
    from .node import flush_denormals
    from .report import plot_result, print_result

    flush_denormals()  # before any product: torch's worker threads, started later, inherit it
    cfg, runtime = configure(args)
    out = Path(args.out)
    checkpoints = Path(args.checkpoint_dir or out / "checkpoints")
    check_folders(out, checkpoints, args.resume, cfg)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    result = run(args, cfg, runtime, checkpoints)
    if cfg.privacy.enabled:
        result.privacy = [spent(cfg, f"party {k}", 1, TESTS, encoding_events(cfg), exposure=seen).to_dict()
                          for k, seen in enumerate(exposures(cfg, protocol_named(args.protocol)))]
    write_json(out / "result.json", result.to_dict())
    plot_result(result, out / "result.png")
    print_result(result, out)
    if result.audit is not None and not result.audit["passed"] and protocol_named(args.protocol).hides_contributions:
        print("error: the audit found leaks in a secure protocol", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return guarded(lambda: simulate(args), resumable=True)


if __name__ == "__main__":
    sys.exit(main())
