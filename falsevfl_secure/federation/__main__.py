"""Command line of a federation on separately held tables.

    python -m falsevfl_secure.federation demo --dataset digits|isolet|fashion-mnist|hapt --parties K --out DIR
        [--seed N] [--protocol P] [--preset quick|default|paper] [--test-pattern MECHANISM] [--validation-fraction F]
    python -m falsevfl_secure.federation demo --dataset breast-cancer|wine|diabetes --out DIR [--missing F]
        [--categorical] [--mixed-ids]
    python -m falsevfl_secure.federation keygen --config DIR/federation.toml --party NAME
    python -m falsevfl_secure.federation check --config DIR/federation.toml [--party NAME]
    python -m falsevfl_secure.federation train --config DIR/federation.toml [--party NAME] [--protocol P]
        [--resume | --rejoin] [--quiet]
    python -m falsevfl_secure.federation predict --config DIR/federation.toml [--party NAME] [--protocol P]
        [--absent NAME ...] [--out PREDICTIONS.csv] [--quiet]
    python -m falsevfl_secure.federation score --predictions PREDICTIONS.csv --truth DIR/truth.csv [--config F]
        [--id-column C] [--label-column C]
    python -m falsevfl_secure.federation privacy --config DIR/federation.toml --party NAME
    python -m falsevfl_secure.federation propose-clips --config DIR/federation.toml --party NAME [--quantile Q]
        [--multiplier M] [--records N]

`check` reads a role's own files as `train` and `predict` will (its key against its own pin, its tables),
without starting a federation; `train` and `predict` run it for every local role before anything
connects. Without --party, every listed party (and the he aggregator) runs as its own local process,
each reading only its own files; with --party, this process is that role alone (one host per party: the
active party listens at the rendezvous, the he aggregator at its address, every other party only
connects out over mutual TLS to the identities pinned in its own file; only the active party writes
predictions, so only it needs --out). Every participant passes the same --protocol, or none. The
federation file's format: docs/federation-toml.md. Every expected failure ends with one `error:` line per
problem and a non-zero exit.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from ..cli import Parser, guarded
from ..config import MULTIPLIER_RANGE
from ..data import DataError
from ..errors import InputError, PartyFailure, did_you_mean
from ..fsio import file_in_the_way, read_regular
from ..heap import peak_rss_mib
from ..privacy import LEDGER, all_spent, before_model, ledger_epsilon, read_ledger, threshold_delta
from ..transport.protocols import PROTOCOLS
from .check import has_aggregator
from .config import AGGREGATOR, MAX_VALIDATION_FRACTION, load_federation
from .tables_demo import DEMO_TABLES as TABLES


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(prog="python -m falsevfl_secure.federation", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    _demo_options(commands.add_parser("demo", help="write per-party tables (a benchmark's split, or tables as a "
                                                       "new user's would look) and a federation.toml"))
    keygen = commands.add_parser("keygen", help="create a participant's identity key and print the line to pin")
    keygen.add_argument("--config", required=True, help="the federation.toml that names the participant")
    keygen.add_argument("--party", required=True, help="a party's name, or 'aggregator'")
    check = commands.add_parser("check", help="check a role's own key and tables against its federation file")
    check.add_argument("--config", required=True, help="the federation.toml")
    check.add_argument("--party", default=None, help="check this role only (default: every party whose files the "
                                                     "file names)")
    for name in ("train", "predict"):
        sub = commands.add_parser(name, help=f"{name} the federation")
        sub.add_argument("--config", required=True, help="the federation.toml")
        sub.add_argument("--party", default=None, help="run this party only (one host per party)")
        sub.add_argument("--protocol", choices=tuple(PROTOCOLS), default=None,
                         help="as if this party's file said so (every participant passes the same, or nobody runs)")
        sub.add_argument("--quiet", action="store_true", help="no progress bars")
    commands.choices["train"].add_argument(
        "--resume", action="store_true", help="continue from the last epoch every party completed (each party's own "
        "checkpoints, of the same configuration), ending with the parameters of an uninterrupted run")
    commands.choices["train"].add_argument(
        "--rejoin", action="store_true", help="a passive party that left a run that went on (on_party_loss = "
        "\"continue\"): come back from its own latest checkpoint, readmitted at the next epoch's start (with --party)")
    commands.choices["predict"].add_argument("--absent", nargs="*", default=[], help="listed parties that are away")
    commands.choices["predict"].add_argument("--out", default=None,
                                             help="the predictions CSV (needed where the active party runs)")
    privacy = commands.add_parser("privacy", help="what a party's rows spent of its own privacy budget ([privacy])")
    privacy.add_argument("--config", required=True, help="the party's own federation.toml")
    privacy.add_argument("--party", required=True, help="the party (its own ledger, in its model folder)")
    _propose_options(commands.add_parser(
        "propose-clips", help="propose the [privacy] clip norms from a party's own rows, released with DP"))
    _score_options(commands.add_parser("score", help="accuracy, ROC AUC, PR AUC, balanced accuracy, log loss and "
                                       "ECE, or RMSE, MAE and R^2, of a predictions CSV against the truth"))
    return parser.parse_args(argv)


def _score_options(score: argparse.ArgumentParser) -> None:
    score.add_argument("--predictions", required=True)
    score.add_argument("--truth", required=True)
    score.add_argument("--config", help="a federation.toml: the truth's ID and label columns default to its "
                       "id_column and label_column, and both files' IDs are compared by its ID rule (id_pattern, ...)")
    score.add_argument("--id-column", help="the truth's ID column (default: the --config's id_column, else id)")
    score.add_argument("--label-column", help="the truth's label column (default: the --config's label_column, "
                       "else label)")


def _propose_options(propose: argparse.ArgumentParser) -> None:
    propose.add_argument("--config", required=True, help="the party's own federation.toml (its [privacy] budget)")
    propose.add_argument("--party", required=True, help="the party (its own training table and ledger)")
    propose.add_argument("--quantile", type=float, default=0.5, help="the share of rows a clip should not cut")
    propose.add_argument("--multiplier", type=float, default=8.0,
                         help="noise multiplier of the histograms' release (its epsilon joins the party's ledger)")
    propose.add_argument("--records", type=int, default=None,
                         help="records of the shared order, if known (sizes the stand-in's batch as training will)")


def _demo_options(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--dataset", choices=("digits", "isolet", "fashion-mnist", "hapt", *TABLES), default="digits",
                      help="a benchmark's split (digits, isolet, fashion-mnist, hapt) or tables as a new user's would "
                           "look (breast-cancer, wine, diabetes)")
    demo.add_argument("--parties", type=int, default=4)
    demo.add_argument("--out", required=True)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--protocol", choices=tuple(PROTOCOLS), default="mpc")
    demo.add_argument("--test-pattern", default="mcar:0.2", help="the missingness of the prediction set")
    demo.add_argument("--preset", choices=("quick", "default", "paper"), default="default",
                      help="the model's schedule written into federation.toml")
    demo.add_argument("--missing", type=float, default=0.0,
                      help="breast-cancer, wine, diabetes: the share of cells removed inside held rows")
    demo.add_argument("--categorical", action="store_true",
                      help="breast-cancer, wine, diabetes: add text columns (smoker, region)")
    demo.add_argument("--mixed-ids", action="store_true",
                      help="breast-cancer, wine, diabetes: each party writes its IDs differently")
    demo.add_argument("--validation-fraction", type=float, default=None,
                      help="[federation] validation_fraction written into federation.toml (default: 0 for a "
                           "benchmark's split, every labeled row trains as in `simulate`; 0.1 for the tables)")


def demo(args: argparse.Namespace) -> int:
    if args.parties < 2:
        raise InputError(f"--parties {args.parties}: a federation needs at least 2 parties")
    if not 0 <= args.seed < 2**32:
        raise InputError(f"--seed {args.seed}: an integer in [0, 2^32)")
    if (Path(args.out) / "federation.toml").exists():  # (review finding: it replaced every key and table, exit 0)
        raise InputError(f"--out {args.out}: a federation is there already (its federation.toml, keys and tables); "
                         "name a new folder, or remove that one first")
    fraction, most = args.validation_fraction, MAX_VALIDATION_FRACTION
    if fraction is not None and not (math.isfinite(fraction) and 0 <= fraction <= most):
        # before anything is written: the file's own check (`[federation] validation_fraction`) would refuse it
        raise InputError(f"--validation-fraction {fraction:g}: a fraction in [0, {most:g}] (e.g. 0.1)")
    _demo_flags_apply(args)
    if args.dataset in TABLES:
        return _tables_demo(args)
    from .demo import write_demo

    path = write_demo(args.dataset, args.parties, Path(args.out), args.seed, args.protocol, args.test_pattern,
                      args.preset, args.validation_fraction or 0.0)
    print(f"wrote {path}, one folder per party and {Path(args.out) / 'truth.csv'}")
    return 0


def _demo_flags_apply(args: argparse.Namespace) -> None:
    """A flag of the other kind of demo is refused, not ignored (a fuzzer's --missing on digits wrote no gap)."""
    table = args.dataset in TABLES
    given = [flag for flag, used, applies in (("--missing", args.missing != 0.0, table),
                                              ("--categorical", args.categorical, table),
                                              ("--mixed-ids", args.mixed_ids, table),
                                              ("--test-pattern", args.test_pattern != "mcar:0.2", not table)) if used
             and not applies]
    if given:
        kind = "a benchmark's split (digits, isolet, fashion-mnist, hapt)" if table else \
            f"the table datasets ({', '.join(TABLES)})"
        raise InputError(f"--dataset {args.dataset}: {' and '.join(given)} appl{'ies' if len(given) == 1 else 'y'} "
                         f"to {kind} only")


def _tables_demo(args: argparse.Namespace) -> int:
    from .tables_demo import NAMES, Spec, write_federation

    if args.parties > len(NAMES) or not 0 <= args.missing < 1:
        raise InputError(f"--dataset {args.dataset}: at most {len(NAMES)} parties and --missing in [0, 1)")
    spec = Spec(args.dataset, args.parties, args.seed, missing=args.missing, categorical=args.categorical,
                ids="mixed" if args.mixed_ids else "plain", protocol=args.protocol,
                extra={"validation_fraction": 0.1 if args.validation_fraction is None else args.validation_fraction},
                model=f'preset = "{args.preset}"\nseed = {args.seed}\n')
    written = write_federation(Path(args.out), spec)
    print(f"wrote {written.path}, one folder per party ({', '.join(written.names)}; {written.names[0]} holds the "
          f"labels) and {Path(args.out) / 'truth.csv'}")
    return 0


def keygen(args: argparse.Namespace) -> int:
    from ..secure import identity

    fed = load_federation(args.config)
    if args.party != AGGREGATOR:
        fed.party(args.party)  # an unknown name is refused, naming the parties
    path = fed.identity_path(args.party)
    if path.exists():
        raise InputError(_existing_key(fed, args.party, path))
    key = identity.generate()
    identity.write_private_key(path, key)
    public = identity.public_bytes(key)
    section = "[aggregator]" if args.party == AGGREGATOR else f"[[party]] name = {args.party!r}"
    print(f"wrote {path} (readable by its owner only; it never leaves this host)")
    print(f"pin it in {section} of every participant's federation.toml:")
    print(f'key = "{identity.pin_text(public)}"')
    print(f"fingerprint (compare it out of band): {identity.fingerprint(public)}")
    return 0


def _existing_key(fed, name: str, path: Path) -> str:
    """Why keygen leaves `path` alone (a key is never replaced), whose key it holds by this file's pins, and
    what to do."""
    from ..secure import identity

    fix = (f"remove it to make a new key (every participant must then pin the new line), or give {name} another "
           f"key file with its `identity` setting in {fed.path}")
    try:
        public = identity.public_bytes(identity.read_private_key(path))
    except identity.IdentityError as error:
        return f"{path} exists (written by an earlier keygen?) but holds no usable key ({error}); {fix}"
    owner = next((role for role, key in fed.pinned().items() if key == public), None)
    if owner == name:
        return (f"{path} exists (written by an earlier keygen): it holds {name}'s key, pinned in {fed.path}; "
                f"nothing to do (`federation check --party {name}` uses it), or {fix}")
    if owner is not None:
        return f"{path} exists (written by an earlier keygen): it holds {owner}'s key, not {name}'s; {fix}"
    return (f"{path} exists (written by an earlier keygen): its key is not pinned in {fed.path} yet; keep it and "
            f'pin its line key = "{identity.pin_text(public)}" in every participant\'s file, or {fix}')


def run(args: argparse.Namespace) -> int:
    """train or predict: this host's own files checked first (each local role's key, tables, the settings a
    run needs), then one role here, or every role as a local process."""
    fed = load_federation(args.config)
    present = fed.present(getattr(args, "absent", []))
    protocol = args.protocol or fed.protocol
    roles = _roles(fed, args.party, present, protocol)
    options = {"resume": getattr(args, "resume", False), "progress": not args.quiet,
               "out": _predictions_path(fed, args, roles), "rejoin": getattr(args, "rejoin", False)}
    if options["rejoin"]:
        if options["resume"]:  # a run that went on has no resume step to agree on (review finding)
            raise InputError("--rejoin and --resume cannot go together: a party that rejoins comes back from its own "
                             "latest checkpoint at the epoch the active party readmits it at; drop --resume")
        check_rejoin(fed, args.party)
    if options["resume"] and fed.model.privacy.enabled:  # before any party agrees and charges (review finding)
        raise InputError("--resume: a run under a privacy budget cannot resume: the interrupted epoch's rows would "
                         "be released again, which the budget does not count; train again from the start")
    if not _ready(fed, roles, args.command, protocol, args.party is not None, quiet=args.quiet):
        return 2
    from .launch import run_all, run_party  # only now: its imports take seconds a refusal should not wait for

    args.started = time.perf_counter()  # (a trial found no time for a prediction run)
    if args.party is not None:
        code = _explained(fed, args.party, present, protocol,
                          lambda: run_party(fed, args.party, args.command, protocol, present, options))
        print(_party_done(fed, args))
        return code
    saved = [name for name in present if (fed.party(name).model_dir / "manifest.json").exists()]
    returned = run_all(fed, args.command, protocol, present, options)
    _summarise(fed, args, saved, returned)
    return 0


def _party_done(fed, args: argparse.Namespace) -> str:
    """One host per party: what this role's run left here (the active party's predictions, each party's model)."""
    if args.command == "predict":
        peak = f" (peak RSS {peak_rss_mib():,.0f} MiB)"  # (run_party ran the role in this process)
        if args.party == fed.active:
            return _predictions_summary(Path(args.out), time.perf_counter() - args.started) + peak
        return (f"{args.party}: prediction done{peak}; the active party {fed.active} writes the predictions, nothing "
                "here")
    if args.party == AGGREGATOR:
        return "aggregator: training done (it keeps nothing)"
    folder = fed.party(args.party).model_dir
    if args.party != fed.active:
        return f"{args.party}: trained; its model is in {folder}{_peak(folder)}"
    record = json.loads(read_regular(folder / "train_result.json"))  # (a trial: --party said less than one host)
    return "\n".join([_trained_line(fed, record, f"models in {folder} here and in each party's own folder")
                      + _peak(folder), _schedule_line(record), _listed_line(fed, record["alignment"]["overlap"])])


def _schedule_line(record: dict) -> str:
    """The stages' schedule and times (a trial found the times only in the JSON)."""
    one, two = record["schedule"]["pretrain"], record["schedule"]["train"]
    took = record.get("stage_time_s", {})
    return (f"schedule: stage 1 {one['epochs']} epochs of batch {one['batch_size']}"
            + (f" ({took['pretrain']:.1f} s)" if "pretrain" in took else "") + f", stage 2 {two['epochs']} epochs "
            f"of batch {two['batch_size']}" + (f" ({took['train']:.1f} s)" if "train" in took else ""))


def _listed_line(fed, overlap: dict[str, dict]) -> str:
    """The records each party listed, how many no other party listed, and (a passive party) how many the active
    party listed too (a trial read 'payroll: 52027 of 54120 / 54120' twice before seeing 2,093 held by it alone)."""
    said = [f"{name} {o['listed']:,} ({o['listed'] - o['shared']:,} by no other party"
            + ("" if name == fed.active else f"; {o['with_active']:,} also by the active party") + ")"
            for name, o in overlap.items()]
    return "records listed by each party: " + ", ".join(said)


def _say_peaks(peaks: dict[str, float | None]) -> None:
    """Each party's peak memory, where every one is known (a trial could not measure them: `time` saw the
    launcher, the parties are its grandchildren)."""
    if peaks and all(mib is not None for mib in peaks.values()):
        print("peak RSS per party (resident memory, shared pages included): "
              + ", ".join(f"{name} {mib:,.0f} MiB" for name, mib in peaks.items()))


def _peak(folder: Path) -> str:
    mib = _peak_mib(folder)
    return "" if mib is None else f" (peak RSS {mib:,.0f} MiB)"


def _peak_mib(folder: Path) -> float | None:
    """A party's peak resident memory during its training, from its own counters (None: an earlier version's)."""
    try:
        return float(json.loads(read_regular(folder / "train_log.json"))["peak_rss_mib"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_rejoin(fed, party: str | None) -> None:
    """`train --rejoin`: one passive party, in a run that goes on without a lost party, that trained before."""
    from .aligned import ALIGNMENT_FILE

    if party is None or party == fed.active or party == AGGREGATOR:
        raise InputError("--rejoin is for one passive party that left a run that went on: pass --party NAME (the "
                         "active party and the aggregator cannot be lost without ending the run)")
    if fed.on_party_loss != "continue":
        raise InputError(f"--rejoin: {fed.path} sets on_party_loss = {fed.on_party_loss!r}: a run that stops when a "
                         "party is lost has nothing to rejoin")
    if fed.model.privacy.enabled:
        raise InputError(f"--rejoin: {fed.path} sets a privacy budget: a party cannot come back to such a run (its "
                         "noise streams would restart at its checkpoint and repeat noise it already released)")
    saved = fed.party(party).model_dir / "checkpoints" / ALIGNMENT_FILE
    if not saved.is_file():
        raise InputError(f"--rejoin: {saved} does not exist: {party} has not trained in this run (start it "
                         "without --rejoin while the others start)")


def _roles(fed, party: str | None, present: list[str], protocol: str) -> list[str]:
    """The roles this process runs: --party, or every present party and the protocol's aggregator."""
    roles = [*fed.names, *([AGGREGATOR] if has_aggregator(protocol) else [])]
    if party is not None and party not in roles:
        raise InputError(f"--party {party!r} is not a role of this run{did_you_mean(party, roles)}; the roles are "
                         f"{', '.join(roles)}")
    return [party] if party is not None else [p for p in roles if p in present or p == AGGREGATOR]


def _predictions_path(fed, args: argparse.Namespace, roles: list[str]) -> str | None:
    """`predict --out`: needed where the active party runs (it alone writes the predictions), checked now."""
    if args.command != "predict" or (args.out is None and fed.active not in roles):
        return None
    if args.out is None:
        raise InputError(f"predict: --out PREDICTIONS.csv is needed where the active party {fed.active!r} runs: it "
                         "writes the predictions there (the other parties write nothing)")
    out = Path(args.out).resolve()
    blocker = file_in_the_way(out.parent)
    if out.is_dir() or blocker is not None:
        raise InputError(f"--out {args.out}: cannot write the predictions there "
                         f"({'it is a folder' if blocker is None else f'{blocker} is a file'}); name a CSV file")
    folders = [Path(spec.model_dir).resolve() for spec in map(fed.party, fed.names) if spec.model_dir is not None]
    if out in _inputs_of(fed) or any(folder in out.parents for folder in folders):  # (review finding: it replaced
        # federation.toml or a party's table, exit 0)
        raise InputError(f"--out {args.out}: that is an input of the federation (its file, a party's table, key or "
                         "model folder); name a new CSV file for the predictions")
    return str(out)


def _inputs_of(fed) -> set[Path]:
    """The files a run reads: the federation file, each role's key and each party's tables (resolved)."""
    paths = [fed.path, *(fed.identity_path(name) for name in [*fed.names, AGGREGATOR])]
    paths += [p for spec in map(fed.party, fed.names) for p in (spec.train, spec.predict) if p is not None]
    return {Path(p).resolve() for p in paths}


def check(args: argparse.Namespace) -> int:
    """`check`: a role's own files (or those of every party the file names), without starting a federation."""
    fed = load_federation(args.config)
    if args.party is not None:  # the aggregator's key is checked under any protocol
        names = [AGGREGATOR] if args.party == AGGREGATOR else _roles(fed, args.party, fed.names, fed.protocol)
    else:
        every = fed.local == fed.names and has_aggregator(fed.protocol)  # one operator plays every role
        names = [*fed.local, *([AGGREGATOR] if every else [])]
    if not names:
        raise InputError(f"{fed.path} names no party's own files (train, predict, model): pass --party NAME")
    if len(fed.names) == 2 and PROTOCOLS[fed.protocol].hides_contributions and not fed.allow_two_party_disclosure:
        raise InputError(f"{fed.path}: two parties under {fed.protocol}: the sum minus the active party's own "
                         "contribution is the other party's, so training would refuse; use 3 or more parties, or set "
                         "allow_two_party_disclosure = true in [federation]")  # (review finding: check passed it)
    if args.party is None:  # a check of one role reports on that role alone
        print(_pins_line(fed))
        for name in (n for n in fed.names if n not in fed.local):
            print(f"party {name!r}: another host's party (its entry here is its name and key)")
    return 0 if _ready(fed, names, "check", fed.protocol, args.party is not None, quiet=False) else 2


def _pins_line(fed) -> str:
    """Every pin's fingerprint, to compare with the one each participant's keygen printed (a mistyped pin
    that is still a valid key is found here, or at the TLS handshake)."""
    from ..secure.identity import fingerprint

    pins = ", ".join(f"{name} {fingerprint(key)}" for name, key in fed.pinned().items())
    return f"{fed.path}: protocol {fed.protocol}; pins (compare each with the fingerprint its keygen printed): " + (
        pins or "none yet")


def _ready(fed, names: list[str], command: str, protocol: str, one_host: bool, quiet: bool) -> bool:
    """Check the named roles' own files for `command` and what the run needs of the file; print the report
    (stdout) and one `error:` line per problem (stderr). True when there is none."""
    from .check import run_problems, shared_folders, timed_check

    reports, seconds = timed_check(fed, names, command)
    for report in reports:
        for line in report.notes if quiet else report.lines:
            print(line)
    for line in _hides_less(reports, protocol):
        print(line)
    problems = [(None, p) for p in run_problems(fed, protocol, one_host) + shared_folders(fed, names)]
    gone = _lost_for_good(fed) if command == "predict" else {}
    problems += [(None, gone[r.name]) for r in reports if r.errors and r.name in gone]  # its cause, once
    problems += [(r.name, e) for r in reports if r.name not in gone for e in r.errors]
    for name, problem in problems:
        before = "" if command == "check" else f"{command}: " + (
            f"the files of {name} need fixing (nothing was started): " if name else "nothing was started: ")
        print(f"error: {before}{problem}", file=sys.stderr)
    if problems:
        return False
    if not quiet:
        print(f"checked the files of {_whom(names)} in {seconds:.2f} s")
    return True


def _hides_less(reports: list, protocol: str) -> list[str]:
    """A note where a prediction runs under a protocol that hides the contributions where its model's training hid
    them (a trial's `--protocol plain` on a model trained under mpc went without a word)."""
    trained = {r.inputs.manifest.protocol for r in reports if r.inputs is not None and r.inputs.manifest is not None}
    if PROTOCOLS[protocol].hides_contributions:
        return []
    return [f"note: predicting under {protocol}, where the model was trained under {was}: each party's contributions "
            "reach the active party in clear (every participant predicts under the same protocol, or none does)"
            for was in sorted(trained) if was in PROTOCOLS and PROTOCOLS[was].hides_contributions]


def _lost_for_good(fed) -> dict[str, str]:
    """Where this host holds the active party's model: each party that left its training run and never came
    back, with what to do (its folder keeps a model of another run or other settings, which is not the cause)."""
    from .quality import still_out

    if fed.active not in fed.local:
        return {}
    try:
        record = json.loads(read_regular(fed.party(fed.active).model_dir / "train_result.json"))
    except (OSError, ValueError):
        return {}
    return {e["party"]: f"{e['party']} left the training run of this model (stage {e['stage']}, epoch {e['epoch']}) "
            f"and did not come back: predict with --absent {e['party']}"
            for e in still_out(record.get("lost_parties", []))}


def _whom(names: list[str]) -> str:
    """'3 parties', 'the aggregator', '3 parties and the aggregator'."""
    parties = sum(name != AGGREGATOR for name in names)
    counted = [f"{parties} {'party' if parties == 1 else 'parties'}"] if parties else []
    return " and ".join(counted + (["the aggregator"] if AGGREGATOR in names else []))


def _explained(fed, name: str, present: list[str], protocol: str, run) -> int:
    """`run()`; a failure whose words come from elsewhere (a TLS refusal, the two-party rule) retold with
    what this party's own file says."""
    try:
        return run()
    except (PartyFailure, InputError) as error:
        text = str(error)
        better = _pin_hint(fed, name, protocol, text) or _two_party_cause(fed, present, text)
        if better is None:
            raise
        raise (InputError if isinstance(error, InputError) else PartyFailure)(better) from None


def _pin_hint(fed, name: str, protocol: str, text: str) -> str | None:
    """A refused TLS handshake with a peer this role dials, with the pins its own file holds for both ends."""
    from ..secure.identity import fingerprint, pin_text

    dials = ([fed.active] if name not in (fed.active, AGGREGATOR) else []) + (
        [AGGREGATOR] if has_aggregator(protocol) and name != AGGREGATOR else [])
    peer = next((p for p in dials if f"could not connect to {p} at" in text and "TLS handshake" in text), None)
    pins = fed.pinned()
    if peer is None or peer not in pins or name not in pins:
        return None
    return (f"{text}. {fed.path} pins {peer} as key = \"{pin_text(pins[peer])}\" (fingerprint "
            f"{fingerprint(pins[peer])}): compare it with the line {peer}'s `federation keygen` printed; {peer}'s "
            f"own file must pin {name} as fingerprint {fingerprint(pins[name])}")


_TWO_PARTIES = "only two parties take part"


def _two_party_cause(fed, present: list[str], text: str) -> str | None:
    """The two-party refusal where this file expects more parties: its cause is a party that did not join,
    not the consent setting it would point at."""
    if _TWO_PARTIES not in text or len(present) <= 2:
        return None
    return (f"{text[:text.index(_TWO_PARTIES)]}only two of the {len(present)} parties expected "
            f"({', '.join(present)}) joined within join_timeout_s = {fed.join_timeout_s:g} s ({fed.path}), and two "
            "parties would hide nothing from each other, so nothing was sent. A party that could not connect says "
            "why on its own host (a pin that does not match, its key file, an address); `federation check --party "
            "NAME` there checks its key and pins. A party that is away is declared with --absent NAME")


def _summarise(fed, args: argparse.Namespace, saved: list[str], returned: dict[str, object]) -> None:
    """What every local role's run did; `saved`: the parties whose folder held a model before it; `returned`: what
    each role's process returned (a prediction: its peak memory)."""
    from ..reference import lift_lines
    from .quality import lost_lines, selection_lines, trees_lines, validation_summary

    for line in _spent_lines(fed):
        print(line)
    if args.command == "predict":
        print(_predictions_summary(Path(args.out), time.perf_counter() - args.started))
        _say_peaks({name: value.get("peak_rss_mib") for name, value in returned.items() if isinstance(value, dict)})
        return
    record = json.loads(read_regular(fed.party(fed.active).model_dir / "train_result.json"))
    replaced = f" (replacing the models saved there before: {', '.join(saved)})" if saved else ""
    print(_trained_line(fed, record, f"models in each party's folder{replaced}"))  # (a trial did not expect it)
    _say_peaks({name: _peak_mib(fed.party(name).model_dir) for name in fed.present([])})
    print(_schedule_line(record))
    for line in lost_lines(record.get("lost_parties", [])):
        print(line)
    print(_listed_line(fed, record["alignment"]["overlap"]))
    print(validation_summary(record["validation"]))
    lift = lift_lines(record["lift"], record.get("config")) if record.get("lift") else []
    for line in [*selection_lines(record.get("selection"), record.get("config")), *trees_lines(record.get("trees")),
                 *lift]:
        print(line)


def _spent_lines(fed) -> list[str]:
    """Under a budget, where each local party's rows stand after the run (its own ledger's total)."""
    if not fed.model.privacy.enabled:
        return []
    ledgers = {name: read_ledger(fed.party(name).model_dir) for name in fed.local}
    return [f"privacy: {name}'s rows at epsilon = {ledger['epsilon']:.3g} per row of its budget "
            f"{fed.model.privacy.epsilon:g} (delta {fed.model.privacy.delta:g})"
            for name, ledger in ledgers.items() if "epsilon" in ledger]


def _resumed(record: dict) -> str:
    """What a resumed run's time and losses cover ('' for a run from the start)."""
    done = record.get("resumed_after_epochs") or {}
    after = ", ".join(f"stage {1 if key == 'pretrain' else 2} epoch {n}" for key, n in done.items())
    return f" (resumed after {after}: the time and losses are the resumed part's)" if done else ""


def _trained_line(fed, record: dict, where: str) -> str:
    from .quality import still_out

    alignment, out = record["alignment"], [e["party"] for e in still_out(record.get("lost_parties", []))]
    parties = f"{len(fed.parties) - len(out)} parties ({', '.join(out)} lost)" if out else f"{len(fed.parties)} parties"
    dropped = alignment.get("dropped_no_observed_party", 0)  # (a trial found them only in the JSON)
    gone = f", {dropped} dropped: no party holds a cell of them" if dropped else ""
    return (f"trained {parties} under {record['protocol']} in {record['wall_time_s']:.1f} s{_resumed(record)}: "
            f"{alignment['union_size']} records aligned in {alignment['seconds']:.1f} s "
            f"({', '.join(f'{k}: {v}' for k, v in alignment['rows_per_party'].items())}{gone}), "
            f"{alignment['labeled']} labeled for training, {alignment['validation']} held out; {where}")


def _predictions_summary(path: Path, seconds: float) -> str:
    """Where the predictions are, how many records each number of parties observed, and how long the run took."""
    rows = _table(path, ("id", "prediction", "parties_observed"))
    counts = Counter(row["parties_observed"] for row in rows)
    held = [f"{counts[k]} held by {k} {'party' if k == '1' else 'parties'}"
            for k in sorted(counts, key=int, reverse=True) if k != "0"]
    return (f"predictions: {path} ({len(rows)} records: {', '.join([*held, f'{counts.get(chr(48), 0)} by none'])}) "
            f"in {seconds:.1f} s")


def score(args: argparse.Namespace) -> int:
    """Accuracy and the class probabilities' scores (a file with p_<class> columns), or RMSE, MAE and R^2 (a
    regression file)."""
    truth_rows = _table(Path(args.truth), ())
    key, args.id_column, args.label_column = _score_columns(args, list(truth_rows[0]))
    _has_columns(Path(args.truth), list(truth_rows[0]), (args.id_column, args.label_column), len(truth_rows),
                 " (name the truth's own columns with --id-column and --label-column" + ("" if args.config else
                                                                                         ", or --config") + ")")
    rows = _table(Path(args.predictions), ("id", "prediction"))
    truth_ids, ids = _keys(args.truth, [r[args.id_column] for r in truth_rows], key), \
        _keys(args.predictions, [r["id"] for r in rows], key)
    predicted = dict(zip(ids, rows, strict=True))
    truth = {i: row[args.label_column] for i, row in zip(truth_ids, truth_rows, strict=True)}
    missing = [i for i in truth if i not in predicted]
    if missing:
        how = "" if args.config else "; IDs are compared as written: --config compares them by the federation's ID rule"
        raise InputError(f"{args.predictions} has no row for {len(missing)} IDs of {args.truth} (e.g. {missing[0]!r})"
                         + how)
    scored = [i for i in truth if predicted[i]["prediction"] != "" and truth[i] != ""]
    if not scored:
        raise InputError(f"{args.predictions}: no record has both a prediction and a true label in {args.truth}")
    regression = not any(name.startswith("p_") for name in rows[0])
    print(f"{_score_line(scored, predicted, truth, regression, args)} {_left_out(scored, predicted, truth, args)}")
    if not regression and (recall := _recall_line(scored, predicted, truth)):
        print(recall)
    groups: dict[str, list[str]] = {}
    for i in scored:
        groups.setdefault(predicted[i].get("parties_observed", ""), []).append(i)
    if len(groups) > 1 and all(g.isdigit() for g in groups):
        print("by parties observed: " + ", ".join(
            f"{g}: {_score_line(ids, predicted, truth, regression, args, short=True)} ({len(ids)})"
            for g, ids in sorted(groups.items(), key=lambda item: int(item[0]))))
    return 0


def _left_out(scored: list, predicted: dict, truth: dict, args: argparse.Namespace) -> str:
    """Which records the score covers, and why the others are not in it (a trial: 186 predictions without a truth
    row were left out without a word)."""
    unheld = sum(predicted[i]["prediction"] == "" for i in truth)
    unlabeled = sum(truth[i] == "" and predicted[i]["prediction"] != "" for i in truth)
    untold = sum(i not in truth for i in predicted)
    return (f"on {len(scored)} records ({unheld} held by no present party"
            + (f", {unlabeled} with no true label" if unlabeled else "")
            + (f"; {untold} predicted records have no row in {args.truth}" if untold else "") + ")")


def _score_columns(args: argparse.Namespace, header: list[str]) -> tuple:
    """The ID rule (a function, or None: IDs compared as written) and the truth's two columns: the command line's,
    else the federation file's where the truth has them, else id and label (a trial's truth used the file's
    columns and another party's ID format)."""
    fed = load_federation(args.config) if args.config else None

    def column(given: str | None, in_file: str | None, default: str) -> str:  # (neither there: the file's named)
        return given or (in_file if in_file and (in_file in header or default not in header) else default)
    columns = (column(args.id_column, fed and fed.id_column, "id"),
               column(args.label_column, fed and fed.label_column, "label"))
    return (None if fed is None or fed.id_rule.is_plain else fed.id_rule.key), *columns


def _keys(path: str, ids: list[str], key) -> list[str]:
    """The file's IDs as the federation compares them, each once (review finding: the later row silently won)."""
    keys = list(ids)
    for row, i in enumerate(ids if key is not None else ()):
        try:
            keys[row] = key(i)
        except DataError as error:
            raise InputError(f"{path}, line {row + 2}: {error}") from None
    twice = [i for i, n in Counter(keys).items() if n > 1]
    if twice:
        raise InputError(f"{path}: {len(twice)} IDs appear more than once (e.g. {twice[0]!r}); one row per record")
    return keys


def _score_line(ids: list[str], predicted: dict, truth: dict, regression: bool, args, short: bool = False) -> str:
    from ..data.targets import accuracy, regression_metrics

    if not regression:
        value = accuracy(np.array([predicted[i]["prediction"] for i in ids]), np.array([truth[i] for i in ids]))
        return f"accuracy {value:.2f} %" + _probability_scores(ids, predicted, truth, args, short)
    metrics = regression_metrics(_numbers([predicted[i]["prediction"] for i in ids], args.predictions, "prediction"),
                                 _numbers([truth[i] for i in ids], args.truth, args.label_column))
    if short:
        return f"RMSE {metrics['rmse']:.4g}"
    return f"RMSE {metrics['rmse']:.4g}, MAE {metrics['mae']:.4g}, R^2 {metrics['r2']:.3f}"


def _probability_scores(ids: list[str], predicted: dict, truth: dict, args, short: bool) -> str:
    """What a tabular user reads from the p_<class> columns: ROC AUC (one-vs-rest macro for several classes),
    and in full PR AUC (of the second class of two: its name is given), balanced accuracy, log loss and ECE.
    A true class the file has no column for has probability 0 there."""
    from ..metrics import classification_metrics

    classes = [name[2:] for name in predicted[ids[0]] if name.startswith("p_")]
    unseen = sorted({truth[i] for i in ids} - set(classes))
    if not short and len(unseen) == len({truth[i] for i in ids}):  # (a fuzzer's: accuracy 0 %, exit 0; a group
        # of the records by parties observed may hold only unseen classes: its scores say so)
        raise InputError(f"{args.truth}: none of its labels is a class of {args.predictions} (the predictions' "
                         f"classes: {', '.join(map(repr, classes[:5]))}; the truth's labels: "
                         f"{', '.join(map(repr, unseen[:5]))})")
    if unseen and not short:  # (a trial's truth wrote 'Benign' for 'benign': every such record scored as wrong)
        counts = ", ".join(f"{c!r} ({sum(truth[i] == c for i in ids)})" for c in unseen[:5])
        print(f"warning: the truth holds classes the predictions have no p_<class> column for: {counts}; each scores "
              f"probability 0 (the model's classes: {', '.join(repr(c) for c in classes)}; a class written another "
              "way?)", file=sys.stderr)
    columns = [*classes, *unseen]
    probabilities = np.zeros((len(ids), len(columns)))
    for row, i in enumerate(ids):
        probabilities[row, :len(classes)] = _numbers([predicted[i][f"p_{c}"] for c in classes], args.predictions,
                                                     "p_<class>")
    if not short:  # (a group's rows are the file's, checked once)
        _are_probabilities(probabilities[:, :len(classes)], ids, args.predictions)
    y = np.array([columns.index(truth[i]) for i in ids])
    m = {k: v if v == v else "n/a (one class)" for k, v in classification_metrics(probabilities, y).items()}
    if short:
        return f", ROC AUC {_rounded(m['roc_auc'], 3)}"
    two = len(columns) == 2  # (a trial had to check that the multi-class ROC AUC was the macro one-vs-rest one)
    pr = f"PR AUC ({columns[1]}) {_rounded(m['pr_auc'], 3)}" if two else f"PR AUC (macro) {_rounded(m['pr_auc'], 3)}"
    return (f", ROC AUC{'' if two else ' (macro, one-vs-rest)'} {_rounded(m['roc_auc'], 4)}, {pr}, balanced accuracy "
            f"{100 * m['balanced_accuracy']:.2f} %, log loss {m['log_loss']:.4f}, ECE {m['ece']:.4f}")


def _recall_line(ids: list[str], predicted: dict, truth: dict) -> str | None:
    """Each true class's share of records predicted as it, and its records, for three classes or more (a trial's
    rarest class of seven got one prediction in 3,860, and nothing said so)."""
    classes = sorted({truth[i] for i in ids})
    if len(classes) < 3:
        return None
    said = [f"{c} {100 * sum(predicted[i]['prediction'] == c for i in ids if truth[i] == c) / n:.1f} % ({n:,})"
            for c in classes for n in [sum(truth[i] == c for i in ids)]]
    return "recall by class (records): " + ", ".join(said)


def _rounded(value, digits: int) -> str:
    return value if isinstance(value, str) else f"{value:.{digits}f}"


def _numbers(cells: list[str], path: str, column: str) -> np.ndarray:
    try:
        values = np.array([float(cell) for cell in cells])
    except ValueError:
        bad = next(cell for cell in cells if not _is_float(cell))
        raise InputError(f"{path}: column {column!r} holds {bad!r}, not a number (a regression file needs numbers; "
                         "a classification file has p_<class> columns)") from None
    if not np.isfinite(values).all():
        raise InputError(f"{path}: column {column!r} holds a value that is not a finite number")
    return values


def _is_float(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _are_probabilities(p: np.ndarray, ids: list[str], path: str) -> None:
    """Each row's p_<class> values in [0, 1], summing to 1 within 0.01 (rounded cells); a fuzzer's 5, -3, 0.2 was
    scored without a word."""
    bad = np.flatnonzero((p < 0).any(axis=1) | (p > 1).any(axis=1) | (np.abs(p.sum(axis=1) - 1) > 0.01))
    if bad.size:
        values = ", ".join(f"{v:g}" for v in p[bad[0]])
        raise InputError(f"{path}: the p_<class> cells of ID {ids[bad[0]]!r} ({values}) are not probabilities (each in "
                         f"[0, 1], a row's summing to 1); {bad.size} of {len(ids)} rows are not")


def _table(path: Path, needed: tuple[str, ...], hint: str = "") -> list[dict[str, str]]:
    """The rows of a CSV file (BOM, CRLF and spaces around cells allowed) with the `needed` columns; `hint`
    follows a refusal of its header."""
    try:
        with io.StringIO(read_regular(path).decode("utf-8-sig"), newline="") as handle:
            reader = csv.reader(handle)
            header = [cell.strip() for cell in next(reader, [])]
            rows = [dict(zip(header, (cell.strip() for cell in row), strict=False)) for row in reader if row]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise InputError(f"{path}: cannot read the file ({getattr(error, 'strerror', None) or error})") from None
    _has_columns(path, header, needed, len(rows), hint)
    return rows


def _has_columns(path: Path, header: list[str], needed: tuple[str, ...], rows: int, hint: str = "") -> None:
    if any(name not in header for name in needed) or not rows:
        wanted = f"a header with the columns {', '.join(map(repr, needed))} and " if needed else ""
        raise InputError(f"{path}: expected {wanted}at least one row; found columns "
                         f"{', '.join(map(repr, header)) or 'none'}, {rows} rows{hint}")


def privacy(args: argparse.Namespace) -> int:
    """A party's epsilon from its own ledger and its own file's budget (nothing is asked of a peer)."""
    fed = load_federation(args.config)
    folder = fed.own(args.party).model_dir  # another host's party (or a name not listed): its ledger is not here
    budget = fed.model.privacy
    if not budget.enabled:
        print(f"{args.party}: no privacy budget in {fed.path} (no [privacy] epsilon): nothing is noised")
        return 0
    ledger = read_ledger(folder)
    events = all_spent(ledger)
    if not events:
        print(f"{args.party}: budget epsilon = {budget.epsilon:g} at delta {budget.delta:g}; nothing spent yet "
              f"(no {LEDGER} in {folder})")
        return 0
    epsilon = ledger_epsilon(1.0, 0, budget, args.party, threshold_delta(ledger), events)
    model = (f"its model: {ledger['releases_per_row']} releases per row at noise multiplier "
             f"{ledger['noise_multiplier']:g}, {ledger.get('prediction_runs', 0)} prediction run(s) since training"
             f"{_reruns(ledger)}; "
             if "releases_per_row" in ledger else "no model trained under it yet; ")
    before = before_model(ledger)
    print(f"{args.party}: epsilon = {epsilon:.3g} per row of its budget {budget.epsilon:g} (delta {budget.delta:g}): "
          f"{model}before it {sum(r for _, r in before)} release(s) (its encodings, clip proposals, earlier models)")
    if epsilon > budget.epsilon * (1 + 1e-9):  # the file's budget was lowered after these releases
        print(f"warning: {args.party}'s rows have spent more than the budget its file now sets (epsilon = "
              f"{epsilon:.3g} > {budget.epsilon:g}): every run that releases them more is refused")
        return 1
    return 0


def _reruns(ledger: dict) -> str:
    """The batches a pass ran again without a lost party (each 2 more releases of its rows), where any."""
    count = int(ledger.get("reruns", 0))
    return f", {count} batch(es) run again without a lost party" if count else ""


def _check_proposal_options(args: argparse.Namespace) -> None:
    """propose-clips' own options, each out of its range named (a trial read three ranges for one wrong value)."""
    (low, high), records = MULTIPLIER_RANGE, 1 if args.records is None else args.records
    wrong = [f"{name} {value:g} must be {want}" for name, value, ok, want in (
        ("--quantile", args.quantile, 0 < args.quantile < 1, "in (0, 1)"),
        ("--multiplier", args.multiplier, low <= args.multiplier <= high, f"in [{low:g}, {high:g}]"),
        ("--records", records, records >= 1, "at least 1")) if not ok]
    if wrong:
        raise InputError(f"propose-clips: {'; '.join(wrong)}")


def propose_clips(args: argparse.Namespace) -> int:
    """The clip norms from the party's own rows (clip_proposal.py), charged to its own ledger before release."""
    from ..clip_proposal import NAMES, measure_norms, quantile, release
    from ..model.likelihood import CellLayout
    from ..privacy import charge_proposal
    from ..randomness import RoleSecret
    from .inputs import read_training_table

    fed = load_federation(args.config)
    me = fed.own(args.party)  # its own table and ledger: another host's party has none here
    if not fed.model.privacy.enabled:
        raise InputError(f"{fed.path}: no [privacy] epsilon: a clip proposal is released under the party's budget")
    _check_proposal_options(args)
    inputs = read_training_table(fed, args.party, private=True)
    held = inputs.block.held
    norms = measure_norms(fed.model, inputs.block.x[held], inputs.block.observed[held],
                          CellLayout.from_kinds(inputs.encoding.kinds()), records=args.records)
    me.model_dir.mkdir(parents=True, exist_ok=True)
    epsilon = charge_proposal(fed.model, args.party, me.model_dir, args.multiplier)  # before anything is shown
    counts = release(norms, args.multiplier, RoleSecret.fresh().stream("clip-proposal"))
    print(f"# {args.party}: the {args.quantile:g} quantile of its rows' norms, released with noise multiplier "
          f"{args.multiplier:g} (its ledger now: epsilon = {epsilon:.3g} at delta "
          f"{fed.model.privacy.delta:g}, its encoding's charge included); agree on one value per line with the "
          "other parties")
    for name in NAMES:
        value = quantile(counts[name], args.quantile)
        print(f"clip_{name} = {value:.3g}" if value == value else  # NaN: the noise left no positive count
              f"# clip_{name}: no proposal (the noise left no positive count; more rows or a larger --multiplier)")
    if fed.model.kappa == 1:  # a trial asked why this clip always came out at the lowest bin
        print("# clip_likelihood is unused with kappa = 1: the likelihood round, centred over one sample, is zero")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = {"demo": demo, "keygen": keygen, "check": check, "train": run, "predict": run,
               "score": score, "privacy": privacy, "propose-clips": propose_clips}[args.command]
    return guarded(lambda: command(args), resumable=args.command == "train")


if __name__ == "__main__":
    sys.exit(main())
