"""Per-row accounting of the differential privacy of the summed rounds (README "Output privacy").

Every release of a row in a summed round, and every DP-SGD update of a party's networks
(`model.private_sgd`), is a Gaussian mechanism: the party's contribution for the row is
clipped to the round's norm C (the sensitivity under adding or removing the party's block of the record)
and the revealed sum carries noise of standard deviation z C from the honest parties (transport.ciphers
.noise). A row is released once per summed round each time its batch runs: 3 times per stage-1 epoch
(posterior, likelihood, latent_grad) plus once in its party's DP-SGD update, 2 per stage-2 epoch (2 in all
with `stage2_pass = "once"`, which runs stage 2's rounds once) and per prediction (posterior, likelihood). The
releases compose without subsampling amplification: every party knows which rows are in each batch (the
public order), so a row's releases are not hidden among others; they are R self-composed Gaussian events,
accounted with dp-accounting's privacy loss distributions (PLD).

Each party computes its own epsilon in its own process from its own configuration; a schedule that would
spend more than a party's budget is refused before anything is sent, naming the party.

The discrete Gaussian on the grid is accounted as the continuous Gaussian of the same variance: for an
integer-valued sensitivity the discrete Gaussian's privacy loss is at most the continuous one's up to a term
that vanishes with the scale (Canonne, Kamath and Steinke 2020, Sec. 4), and here the scale is thousands of
grid steps; `tests/test_privacy.py` compares the two with dp-accounting's own discrete Gaussian PLD.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .config import MULTIPLIER_RANGE, Config, Stage
from .errors import InputError
from .fsio import open_lock, read_regular, write_json

# A row's Gaussian releases per pass (FALSE-VFL): in stage 1 three summed rounds and one DP-SGD update of
# the party's own networks; in stage 2 (networks frozen) and each prediction, two summed rounds.
RELEASES = {"pretrain": 4, "train": 2, "predict": 2}
# The summed rounds of one training step of each stage (its DP-SGD update is not one: a step run again after a
# loss was abandoned, with no update): what a party charges when the active party names a step again.
STEP_RELEASES = {Stage.PRETRAIN: RELEASES["pretrain"] - 1, Stage.TRAIN: RELEASES["train"]}


def step_releases(cfg: Config, stage: Stage) -> int:
    """The summed rounds that release a row in one training step of `stage` (what a party charges when a step
    runs again). With one importance sample (kappa 1) a row's likelihood, centred over its samples, is exactly 0
    at every party: stage 1's likelihood round then releases nothing about it."""
    return STEP_RELEASES[stage] - (1 if stage == Stage.PRETRAIN and cfg.kappa == 1 else 0)


def exposure(cfg: Config, hides_contributions: bool, active: bool, helpers: bool) -> int:
    """How many releases one summed release of a row counts as at a party. Where the active party sees only the
    sum (mpc; he, whose aggregator does not pool with it) the sum carries sigma^2 from the honest parties: 1; so
    at the active party itself, whose contribution nobody sees alone. Under plain the active party sees a passive
    party's noised contribution alone, protected by that party's own share sigma^2 / (n - 1 - collusion) only:
    the loss of n - 1 - collusion releases at sigma (Gaussian losses add as 1 / multiplier^2). So under he
    (`helpers`: the sums pass the aggregator) at a party whose own file sets trust_aggregator = false: an
    aggregator that forwards its ciphertext alone lets the active party decrypt it."""
    if active or (hides_contributions and not (helpers and not cfg.privacy.trust_aggregator)):
        return 1
    return max(1, cfg.parties - 1 - cfg.privacy.collusion)


def releases_per_row(cfg: Config, predictions: int = 1, tests: int = 0, exposure: int = 1) -> int:
    """The most times any row is released: every stage-1 epoch, every stage-2 epoch (once in all with
    `stage2_pass = "once"`), the trees' pass (`head = "network+trees"`) and `predictions` prediction passes
    of the training rows (the validation pass; in a federation every later prediction run, as the same records
    may come back); or `tests` passes of records that never train (a simulation's test rows under each test
    pattern), whichever is more. Each summed release counts `exposure` times (see `exposure`); a DP-SGD update once."""
    summed1 = step_releases(cfg, Stage.PRETRAIN)
    stage1 = summed1 * exposure + 1  # and the epoch's DP-SGD update of the party's own networks
    trees = 1 if cfg.options.get("head") == "network+trees" and cfg.train.epochs else 0  # the trees' pass
    stage2 = min(cfg.train.epochs, 1) if cfg.options.get("stage2_pass") == "once" else cfg.train.epochs
    training = (stage1 * cfg.pretrain.epochs + RELEASES["train"] * exposure * stage2
                + RELEASES["predict"] * exposure * (predictions + trees))
    return max(training, RELEASES["predict"] * exposure * tests)


def gaussian_delta(multiplier: float, epsilon: float) -> float:
    """delta(epsilon) of one Gaussian mechanism of noise multiplier sigma / sensitivity (Balle and Wang
    2018, Theorem 8): the closed form the PLD accountant must agree with."""
    from scipy.stats import norm  # here: scipy.stats costs every command half a second at start-up

    a = 1 / (2 * multiplier)
    return float(norm.cdf(a - epsilon * multiplier) - math.exp(epsilon + norm.logcdf(-a - epsilon * multiplier)))


Event = tuple[float, int]  # (noise multiplier, releases of a row): Gaussian events in a party's ledger


@functools.lru_cache(maxsize=64)  # a PLD takes a second or so; a run asks for the same one at every check
def epsilon_of(multiplier: float, releases: int, delta: float, earlier: tuple[Event, ...] = ()) -> float:
    """epsilon after `releases` self-composed Gaussian events of `multiplier` (dp-accounting, PLD), and the
    `earlier` events (the party's clip proposals, its earlier models' releases): Gaussian mechanisms compose
    exactly into one whose 1 / multiplier^2 is the sum of theirs (Dong, Roth and Su 2022, Corollary 3.3)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    if earlier:
        inverse = (releases / multiplier**2 if releases else 0.0) + sum(r / z**2 for z, r in earlier)
        return epsilon_of(inverse**-0.5, 1, delta)
    if releases == 0:
        return 0.0
    if multiplier / math.sqrt(releases) < 0.1:  # next to no noise: PLD's grid would take gigabytes
        return _closed_form_epsilon(multiplier / math.sqrt(releases), delta)
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(multiplier), releases)
    return float(accountant.get_epsilon(delta))


def _closed_form_epsilon(multiplier: float, delta: float) -> float:
    """epsilon of one Gaussian mechanism at `delta`, from `gaussian_delta` (decreasing in epsilon)."""
    from scipy.optimize import brentq

    high = 1.0
    while gaussian_delta(multiplier, high) > delta:
        high *= 4
    return float(brentq(lambda e: gaussian_delta(multiplier, e) - delta, 0.0, high, xtol=1e-12))


def calibrate(epsilon: float, releases: int, delta: float, earlier: tuple[Event, ...] = ()) -> float:
    """The smallest noise multiplier whose `releases` compositions, after the `earlier` events, stay within
    (epsilon, delta): Gaussian releases compose exactly into one whose 1 / multiplier^2 is the sum of theirs."""
    single = _single(epsilon, delta)
    left = single**-2 - sum(r / z**2 for z, r in earlier)
    if left <= 0:
        raise InputError(f"privacy epsilon={epsilon:g}: what the rows spent before the schedule (its encoding, its "
                         "clip proposals, earlier models) already takes the whole budget; raise epsilon")
    return math.sqrt(releases / left) * (1 + 1e-6)  # just above the boundary, so PLD's epsilon stays within


def _single(epsilon: float, delta: float) -> float:
    """The noise multiplier of one Gaussian release at exactly (epsilon, delta), solved in closed form."""
    from scipy.optimize import brentq

    low, high = 1e-4, 1e4
    if gaussian_delta(low, epsilon) <= delta:
        return low  # a budget this large needs next to no noise
    if gaussian_delta(high, epsilon) > delta:  # (brentq would fail: no multiplier up to 1e4 fits one release)
        raise InputError(f"privacy epsilon={epsilon:g}: no noise multiplier up to {high:g} keeps even one release "
                         f"within it at delta {delta:g}; raise epsilon")
    return brentq(lambda z: gaussian_delta(z, epsilon) - delta, low, high, xtol=1e-12, rtol=1e-12)


# A party's encoding, released under its budget (data/private_encoding.py), spends this share of it: two Gaussian
# mechanisms whose 1 / multiplier^2 sum to ENCODING_SHARE of one release's that spends the whole budget; its
# categories' threshold adds ENCODING_DELTA_SHARE x delta (the chance a category one row holds is kept).
ENCODING_SHARE = 0.1
ENCODING_DELTA_SHARE = 0.01


def encoding_multiplier(privacy) -> float:
    """The noise multiplier of each of the private encoding's two releases, from the party's own budget."""
    from .data.private_encoding import RELEASES

    return _single(privacy.epsilon, privacy.delta) * math.sqrt(RELEASES / ENCODING_SHARE)


def encoding_events(cfg: Config) -> tuple[Event, ...]:
    """Under a budget, what a party's private encoding releases before training (none where nothing is fitted on
    the rows: a simulation with `standardize = "none"`)."""
    if not cfg.privacy.enabled or cfg.standardize == "none":
        return ()
    from .data.private_encoding import RELEASES

    return ((encoding_multiplier(cfg.privacy), RELEASES),)


def noise_multiplier(cfg: Config, predictions: int = 1, tests: int = 0, exposure: int = 1,
                     earlier: tuple[Event, ...] | None = None) -> float:
    """The configuration's multiplier, or the smallest that fits its budget for the schedule after `earlier`
    (by default the party's private encoding, which every run under a budget releases first). It is solved at the
    whole delta: a calibrated multiplier serves simulations, whose blocks are numeric (no category threshold takes
    a part of delta); a federation states its multiplier."""
    privacy = cfg.privacy
    if privacy.noise_multiplier > 0:
        return privacy.noise_multiplier
    releases = releases_per_row(cfg, predictions, tests, exposure)
    z = calibrate(privacy.epsilon, releases, privacy.delta, encoding_events(cfg) if earlier is None else earlier)
    if z > MULTIPLIER_RANGE[1]:
        raise InputError(f"privacy epsilon={privacy.epsilon:g}: {releases} releases per row would need a noise "
                         f"multiplier of {z:.3g}, past {MULTIPLIER_RANGE[1]:g}; shorten the schedule or raise epsilon")
    return z


@dataclass(frozen=True)
class Spent:
    """What one party's rows spend: releases per row, the noise multiplier, epsilon at delta."""

    party: str
    releases: int
    multiplier: float
    epsilon: float
    delta: float
    budget: float
    earlier: tuple[Event, ...] = ()  # what the rows spent before this model: encodings, clip proposals, earlier models
    exposure: int = 1  # releases a summed release counts as at this party (`exposure`: n - 1 - collusion under plain)
    threshold_delta: float = 0.0  # of `delta`, what the encodings' category thresholds took (the rest: Gaussian)

    def to_dict(self) -> dict:
        """The ledger's entry (`epsilon` composes `earlier` with this model's releases)."""
        return {"ledger_version": LEDGER_VERSION, "party": self.party, "releases_per_row": self.releases,
                "noise_multiplier": self.multiplier, "exposure": self.exposure,
                "epsilon": self.epsilon, "delta": self.delta, "budget_epsilon": self.budget,
                "earlier": [list(e) for e in self.earlier], "clip_proposals": [], "encodings": [],
                "threshold_delta": self.threshold_delta,
                "covers": "the party's encoding (released with DP), the summed rounds, the parties' own networks "
                          "(DP-SGD) and everything computed from them; "
                          "not the alignment's membership, the record counts or a party's own data at itself"}


def spent(cfg: Config, party: str, predictions: int = 1, tests: int = 0, earlier: tuple[Event, ...] = (),
          exposure: int = 1, threshold_delta: float = 0.0) -> Spent:
    """Party `party`'s epsilon for this schedule after its `earlier` releases, from its own file and ledger."""
    privacy, releases = cfg.privacy, releases_per_row(cfg, predictions, tests, exposure)
    z = noise_multiplier(cfg, predictions, tests, exposure)
    earlier = tuple((float(m), int(r)) for m, r in earlier)
    epsilon = ledger_epsilon(z, releases, privacy, party, threshold_delta, earlier)
    return Spent(party, releases, z, epsilon, privacy.delta, privacy.epsilon, earlier, exposure, threshold_delta)


def ledger_epsilon(multiplier: float, releases: int, privacy, party: str, taken: float,
                   earlier: tuple[Event, ...] = ()) -> float:
    """epsilon at the party's delta of its Gaussian releases and its encodings' category thresholds, which kept a
    category that one row holds with probability p (`taken`: their sum). Such a release is Gaussian on the
    categories both neighbours hold and, with probability p, a category only one of them holds: P[S] <= e^eps
    P'[S] + delta_G + p one way, P'[S] <= e^eps P[S] / (1 - p) + delta_G the other; so delta_G = delta - p and
    epsilon grows by -ln(1 - p) (superadditive: the sum's covers each encoding's)."""
    return epsilon_of(multiplier, releases, gaussian_part(privacy, party, taken), earlier) - math.log1p(-taken)


def gaussian_part(privacy, party: str, threshold_delta: float) -> float:
    """What of the party's delta is left for its Gaussian releases after its encodings' thresholds took theirs."""
    left = privacy.delta - threshold_delta
    if left <= privacy.delta * 1e-6:
        raise InputError(f"{party}: its encodings' category thresholds have taken {threshold_delta:.3g} of its "
                         f"delta {privacy.delta:g} (ENCODING_DELTA_SHARE each encoding); nothing is left for a "
                         "release: raise delta or start a ledger for new rows")
    return left


def check_budget(cfg: Config, party: str, predictions: int = 1, tests: int = 0,
                 earlier: tuple[Event, ...] = (), exposure: int = 1, threshold_delta: float = 0.0) -> Spent | None:
    """Refuse a schedule that would take `party` past its budget after its `earlier` releases (before anything is
    sent); what it spends otherwise (None without a budget)."""
    privacy = cfg.privacy
    if not privacy.enabled:
        return None
    used = spent(cfg, party, predictions, tests, earlier, exposure, threshold_delta)
    _check_cap(privacy, party, "the schedule", used.releases, earlier)
    if used.epsilon > privacy.epsilon * (1 + 1e-9):
        raise InputError(f"{party}: the schedule would spend epsilon = {above(used.epsilon)} per row (delta "
                         f"{privacy.delta:g}, {used.releases} releases at noise multiplier {used.multiplier:.3g}), "
                         f"more than its budget epsilon = {privacy.epsilon:g}; shorten the schedule or raise the "
                         "noise" + _earlier_note(earlier))
    return used


def above(epsilon: float) -> str:
    """An epsilon past a budget, rounded up at three decimals so that it never reads as the budget itself (a trial
    read "epsilon = 8 ... more than its budget epsilon = 8" for 8.0046)."""
    return f"{math.ceil(epsilon * 1000 - 1e-9) / 1000:g}"


def _check_cap(privacy, party: str, what: str, releases: int, earlier: tuple[Event, ...]) -> None:
    """`max_releases_per_row` caps every release of a row the party's ledger records, not one model's."""
    total = releases + sum(r for _, r in earlier)
    if privacy.max_releases_per_row and total > privacy.max_releases_per_row:
        before = f" ({total - releases} of them before this model, in its ledger)" if earlier else ""
        raise InputError(f"{party}: {what} would release each row up to {total} times{before}, more than its "
                         f"max_releases_per_row = {privacy.max_releases_per_row}")


def _earlier_note(earlier: tuple[Event, ...]) -> str:
    """What the ledger held before, as a reader can check it: each release count at its own noise multiplier
    (privacy review: one total added releases made at different noises)."""
    if not earlier:
        return ""
    counts: dict[float, int] = {}
    for z, releases in earlier:
        counts[float(z)] = counts.get(float(z), 0) + int(releases)
    each = ", ".join(f"{r} at noise multiplier {z:.3g}" for z, r in counts.items())
    return (f" (composed with what its ledger records from before the schedule: {each}; its encoding's, its clip "
            "proposals' and earlier models' releases; `federation privacy` shows the epsilon they reach)")


LEDGER = "privacy.json"  # in a party's own model folder: what its rows have spent so far
LEDGER_VERSION = 2  # 1 (unstated): a prediction run recounted the releases from the file's schedule


def _write_ledger(folder: Path, ledger: dict) -> None:
    """The party's ledger, owner-only like its other own files (a trial found it world-readable)."""
    write_json(Path(folder) / LEDGER, ledger, private=True)


def read_ledger(folder: Path) -> dict:
    """A party's own ledger: its training's releases per row and the prediction runs since (none: empty)."""
    path = Path(folder) / LEDGER
    if not path.exists():
        return {}
    try:
        ledger = json.loads(read_regular(path))
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: the party's privacy ledger cannot be read ({error}); it is its budget's only "
                         "record, so nothing runs until it is restored") from error
    _well_formed(ledger, path)
    if "ledger_version" not in ledger and int(ledger.get("prediction_runs", 0)) > 0:
        raise InputError(f"{path}: written by an earlier version, whose prediction runs recounted the releases "
                         "from the file's schedule and may understate what the rows spent; set its releases_per_row "
                         "to the trained schedule's plus 2 per prediction run and add \"ledger_version\": 2, or "
                         "remove it (the party's own decision)")
    return ledger


def _well_formed(ledger, path: Path) -> None:
    """A ledger of the shape this version writes (review finding: a mistyped one ended `check`, `train` and `privacy`
    in tracebacks): its events, counts and multiplier read as numbers, each finite."""
    try:
        numbers = [float(z) for z, _ in all_spent(ledger)] + [float(r) for _, r in all_spent(ledger)]
        numbers += [threshold_delta(ledger), float(ledger.get("epsilon", 0))]
        counts = [ledger.get(k, 0) for k in ("prediction_runs", "exposure", "reruns", "releases_per_row")]
        ok = all(math.isfinite(v) and v >= 0 for v in numbers) and all(type(c) is int for c in counts)
    except (TypeError, ValueError, AttributeError, KeyError):  # (KeyError: a multiplier without its releases)
        ok = False
    if not ok:
        raise InputError(f"{path}: not a privacy ledger this version wrote (its events must be [noise multiplier, "
                         "releases] pairs of numbers); it is its budget's only record, so nothing runs until it is "
                         "restored")


def before_model(ledger: dict) -> tuple[Event, ...]:
    """What a ledger's rows spent before its current model: earlier models' releases, the clip proposals and the
    encodings released since (the model's own, each proposal's)."""
    return (*(tuple(e) for e in ledger.get("earlier", [])), *((float(z), 1) for z in ledger.get("clip_proposals", [])),
            *((float(z), int(r)) for z, r in ledger.get("encodings", [])))


def threshold_delta(ledger: dict) -> float:
    """The part of delta the ledger's encodings' category thresholds took, all models and proposals together."""
    return float(ledger.get("threshold_delta", 0.0))


def with_encoding(ledger: dict, encoding) -> dict:
    """The ledger with one more private encoding released (`EncodingRelease`, or None: nothing)."""
    if encoding is None:
        return ledger
    return {**ledger, "encodings": [*ledger.get("encodings", []), list(encoding.event)],
            "threshold_delta": threshold_delta(ledger) + encoding.delta}


def all_spent(ledger: dict) -> tuple[Event, ...]:
    """Every release a ledger records: before its model, and the model's training and prediction runs."""
    model = ((float(ledger["noise_multiplier"]), int(ledger["releases_per_row"])),) if "releases_per_row" in ledger \
        else ()
    return (*before_model(ledger), *model)


# How long a run waits for another run of the same party to finish charging its ledger: short, since the holder
# waits on its peers' verdicts meanwhile, and two runs over the same parties may hold their locks in opposite
# orders (review: they then waited on each other); within a round's deadline, for a batch run again (charge_rerun)
LEDGER_WAIT_S = 10.0
_holding = threading.local()  # the ledger folders this thread holds (a charge inside a held verdict takes no lock)


@contextlib.contextmanager
def ledger_held(cfg: Config, party: str, folder: Path):
    """An exclusive lock on `party`'s ledger for what the block does: a charge, or a run's verdict, its agreement
    with the other parties and its charge together, so that another run of the same party neither charges between
    them (review finding: both runs' verdicts passed, the second's charge was then refused after every other party
    had charged) nor waits past LEDGER_WAIT_S for it."""
    held = getattr(_holding, "folders", set())
    key = str(Path(folder).resolve())
    if not cfg.privacy.enabled or key in held:
        yield
        return
    with open(open_lock(Path(folder) / ".privacy.lock"), "a") as lock:  # released when the file closes
        _acquire(lock, party, Path(folder))
        _holding.folders = held | {key}
        try:
            yield
        finally:
            _holding.folders = held


def _acquire(lock, party: str, folder: Path) -> None:
    deadline = time.monotonic() + LEDGER_WAIT_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise InputError(f"{party}: another run of this party has held its privacy ledger ({folder / LEDGER}) "
                                 f"for over {LEDGER_WAIT_S:g} s (its parties' budget agreement); nothing of this run's "
                                 "schedule was charged; run again when it has finished") from None
            time.sleep(0.05)


def _locked(charge):
    """A charge reads and rewrites the party's ledger under `ledger_held`, so that two runs of one party at once
    (two prediction runs) each count (review finding: one charge was lost)."""
    @functools.wraps(charge)
    def run(cfg: Config, party: str, folder: Path, *args, **kwargs):
        with ledger_held(cfg, party, folder):
            return charge(cfg, party, folder, *args, **kwargs)
    return run


@_locked
def charge_encoding(cfg: Config, party: str, folder: Path, encoding) -> float:
    """Before a private encoding (`EncodingRelease`: its multiplier, releases and threshold delta, none of them
    depending on the rows) is drawn: refuse it past `party`'s own budget with what its ledger records; else record
    it there first, so that nothing computed from it (a refusal included) is ever uncounted."""
    ledger = with_encoding(read_ledger(folder), encoding)
    _check_cap(cfg.privacy, party, "releasing its encoding", 0, all_spent(ledger))
    epsilon = ledger_epsilon(1.0, 0, cfg.privacy, party, threshold_delta(ledger), all_spent(ledger))
    if epsilon > cfg.privacy.epsilon:
        raise InputError(f"{party}: releasing its encoding would take its rows to epsilon = {above(epsilon)} (delta "
                         f"{cfg.privacy.delta:g}), more than its budget epsilon = {cfg.privacy.epsilon:g}")
    _warn_if_unledgered(party, Path(folder))  # (before its own ledger: a trial's retraining wrote it, then checked)
    _write_ledger(folder, {**ledger, "ledger_version": LEDGER_VERSION})
    return epsilon


@_locked
def charge_proposal(cfg: Config, party: str, folder: Path, multiplier: float) -> float:
    """Before a clip proposal is released: refuse it when it would take `party` past its own budget with what its
    ledger records (the encoding it was measured under included); else record it there first; the epsilon of
    everything the ledger records then."""
    ledger = read_ledger(folder)
    _check_cap(cfg.privacy, party, "a clip proposal", 1, all_spent(ledger))
    epsilon = ledger_epsilon(multiplier, 1, cfg.privacy, party, threshold_delta(ledger), all_spent(ledger))
    if epsilon > cfg.privacy.epsilon:
        raise InputError(f"{party}: with this clip proposal its rows would have spent epsilon = {above(epsilon)} "
                         f"(delta {cfg.privacy.delta:g}), more than its budget epsilon = {cfg.privacy.epsilon:g}; "
                         "raise --multiplier")
    _write_ledger(folder, {**ledger, "ledger_version": LEDGER_VERSION,
                           "clip_proposals": [*ledger.get("clip_proposals", []), multiplier]})
    return epsilon


def _training_spend(cfg: Config, party: str, folder: Path, exposure: int) -> Spent | None:
    """What training would spend after everything `party`'s ledger records (None without a budget); refused past
    its budget (an earlier model's releases of the same rows count: retraining does not reset them; the private
    encoding its block was encoded with is there already, charge_encoding)."""
    ledger = read_ledger(folder) if cfg.privacy.enabled else {}
    return check_budget(cfg, party, TRAINING_PREDICTIONS, earlier=all_spent(ledger), exposure=exposure,
                        threshold_delta=threshold_delta(ledger))


def training_refusal(cfg: Config, party: str, folder: Path, exposure: int = 1) -> InputError | None:
    """What `charge_training` would refuse, found without charging (every party's verdict is agreed first:
    federation/party.py); None where the schedule fits `party`'s budget."""
    try:
        _training_spend(cfg, party, folder, exposure)
    except InputError as refusal:
        return refusal
    return None


TRAINING_TRACES = ("model.pt", "manifest.json", "train_result.json")  # (checkpoints/: a passive party's alignment
# is saved there before its first training charges: review)


def _warn_if_unledgered(party: str, folder: Path) -> None:
    """A folder that holds an earlier training's files but no ledger (restored from a backup, copied, or the
    ledger deleted): what those rows spent is not counted (red team), which the party's operator must know."""
    traces = [name for name in TRAINING_TRACES if (folder / name).exists()]
    if traces and not (folder / LEDGER).exists():
        print(f"warning: {party}: {folder} holds an earlier training's files ({', '.join(traces)}) but no privacy "
              f"ledger ({LEDGER}): the epsilon reported from now on does not count what those rows spent before; "
              "if they were released under a budget, restore that run's ledger with its folder", file=sys.stderr,
              flush=True)


@_locked
def charge_training(cfg: Config, party: str, folder: Path, exposure: int = 1,
                    trained_in: str | None = None) -> tuple[Spent | None, dict]:
    """Before training: `_training_spend`, recorded in the ledger as the new model's entry (its run `trained_in`);
    what it spends and that entry."""
    used = _training_spend(cfg, party, folder, exposure)
    if used is None:
        return None, {}
    _warn_if_unledgered(party, Path(folder))
    entry = {**used.to_dict(), "prediction_runs": 0, **({"trained_in": trained_in} if trained_in else {})}
    _write_ledger(folder, entry)  # first: a run that fails later (a peer ends it) has still spent it
    return used, entry


def _prediction_spend(cfg: Config, party: str, folder: Path, exposure: int,
                      trained_in: str | None) -> tuple[Spent, dict] | None:
    """What one more prediction run would spend and the ledger that records it (None without a budget); refused
    when it would take `party` past its own budget. The run noises at the multiplier its model was trained at, as
    recorded (a calibrated multiplier recomputed from the file's unsized schedule is another number), and adds one
    prediction's releases to those recorded."""
    if not cfg.privacy.enabled:
        return None
    ledger = read_ledger(folder)
    if "releases_per_row" not in ledger:
        raise InputError(f"{party}: its privacy ledger ({Path(folder) / LEDGER}) records no training of this model; "
                         "a model trained without it cannot be accounted, so it does not predict under a budget")
    ledger = _of_saved_model(ledger, cfg, trained_in)
    z = float(ledger["noise_multiplier"])
    if cfg.privacy.noise_multiplier > 0 and not math.isclose(cfg.privacy.noise_multiplier, z, rel_tol=1e-9):
        raise InputError(f"{party}: its file's noise_multiplier = {cfg.privacy.noise_multiplier:g} differs from the "
                         f"{z:g} its model was trained at (its ledger); predict with the trained one")
    return _more(cfg, party, ledger, "prediction_runs", "one more prediction run", RELEASES["predict"] * exposure)


def prediction_refusal(cfg: Config, party: str, folder: Path, exposure: int = 1,
                       trained_in: str | None = None) -> InputError | None:
    """What `charge_prediction` would refuse, found without charging (every party's verdict is agreed first, as
    for training: a trial found the others charged for a run one party refused); None where it fits."""
    try:
        _prediction_spend(cfg, party, folder, exposure, trained_in)
    except InputError as refusal:
        return refusal
    return None


@_locked
def charge_prediction(cfg: Config, party: str, folder: Path, exposure: int = 1,
                      trained_in: str | None = None) -> Spent | None:
    """Before a prediction run: `_prediction_spend`, recorded in the ledger first (a run that fails later has
    still spent it); what the rows have spent then."""
    found = _prediction_spend(cfg, party, folder, exposure, trained_in)
    if found is None:
        return None
    _write_ledger(folder, found[1])
    return found[0]


def _of_saved_model(ledger: dict, cfg: Config, trained_in: str | None) -> dict:
    """The ledger with the saved model as its model. A training charged and then ended before it saved its model (a
    peer stopped it) left the ledger describing that run's model: its releases stay counted, among the earlier
    ones, and the saved model (`trained_in` its manifest's run, at its file's noise, which its fingerprint matched)
    starts a new entry of no releases (privacy review: the saved model could no longer predict)."""
    if not trained_in or ledger.get("trained_in", trained_in) == trained_in:
        return ledger
    earlier = [list(e) for e in all_spent(ledger)]
    return {**ledger, "earlier": earlier, "clip_proposals": [], "encodings": [], "releases_per_row": 0,
            "noise_multiplier": cfg.privacy.noise_multiplier, "prediction_runs": 0, "reruns": 0,
            "trained_in": trained_in}


@_locked
def charge_rerun(cfg: Config, party: str, folder: Path, releases: int = RELEASES["predict"],
                 exposure: int = 1) -> Spent:
    """During training or a prediction run, when a pass runs a batch again without a lost party (each_batch), or
    the active party names a training step again: its rows are released once more (`releases` summed rounds; the
    abandoned try may have revealed them). Recorded first; past `party`'s own budget it is refused, and that
    party's run ends (naming it) rather than release them uncounted."""
    return _charge_more(cfg, party, folder, read_ledger(folder), "reruns", "running a batch again without a lost party",
                        releases * exposure)


def _charge_more(cfg: Config, party: str, folder: Path, ledger: dict, counter: str, what: str, extra: int) -> Spent:
    """`_more`, written to the ledger first."""
    used, ledger = _more(cfg, party, ledger, counter, what, extra)
    _write_ledger(folder, ledger)
    return used


def _more(cfg: Config, party: str, ledger: dict, counter: str, what: str, extra: int) -> tuple[Spent, dict]:
    """`extra` more releases of some rows (a prediction pass, a batch or step run again) at the model's recorded
    multiplier, composed with everything the ledger records: what they spend and the ledger that counts them;
    refused past the budget."""
    privacy = cfg.privacy
    z, releases = float(ledger["noise_multiplier"]), int(ledger["releases_per_row"]) + int(extra)
    earlier, taken = before_model(ledger), threshold_delta(ledger)
    _check_cap(privacy, party, what, releases, earlier)
    epsilon = ledger_epsilon(z, releases, privacy, party, taken, earlier)
    used = Spent(party, releases, z, epsilon, privacy.delta, privacy.epsilon, earlier, int(ledger.get("exposure", 1)),
                 taken)
    if used.epsilon > privacy.epsilon * (1 + 1e-9):
        raise InputError(f"{party}: {what} would spend epsilon = {above(used.epsilon)} per row (delta "
                         f"{privacy.delta:g}, {releases} releases at noise multiplier {z:.3g}), more than its "
                         f"budget epsilon = {privacy.epsilon:g}" + _earlier_note(earlier))
    return used, {**ledger, **used.to_dict(), counter: int(ledger.get(counter, 0)) + 1}


TRAINING_PREDICTIONS = 1  # the validation pass at the end of training
