"""Audits of recorded views against the threat models in `threat_models/`.

A view is everything one role received in a recorded step, plus what it sent itself (`transport.views`).
The forbidden quantities are the parties' own contributions, taken from their own "sent" records of the
same step, so the audit needs no second run and no knowledge of any party's secret.

The per-row rule. The active party knows which parties hold each row and knows its own contribution, so
from a sum it learns `sum - own` exactly. On a row that only one passive party holds, that IS the passive
party's contribution: the protocols hide party k's contribution on a row only when the other passive
parties' contributions to that row are distinguishable from zero ("protected rows"). The audit checks
party k on its protected rows and counts the others as disclosed by design (reported, not a failure).

What the active party can compute from each entry is checked per row like any view: a clear value as it
is, a revealed sum as it is and minus its own contribution, and every int64 share it received decoded as
fixed point (an unmasked share decodes to the contribution). mpc shares must also look uniform on
Z_2^64; a step with too few share values to test fails the audit instead of skipping the test.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import numpy as np

from .secure.fixed_point import PRECISION_BITS
from .transport.protocols import cipher_protecting, protocol_named
from .transport.rounds import AGGREGATES, CONTROL_STEPS, by_name
from .transport.views import Entry, View

THREAT_MODELS = Path(__file__).resolve().parents[1] / "threat_models"
AGGREGATE_NAMES = tuple(r.name for r in AGGREGATES)
MIN_SHARE_VALUES = 10 * 256  # at least 10 expected values per top-byte bin of the chi-square test
# One revealed addend is exact to 2^-16 (both secure protocols reveal the sum of fixed-point encodings);
# plain is exact. A sum of K addends is within K times that.
ADDEND_ATOL = 2.0**-PRECISION_BITS
AUDIT_RTOL = 1e-6


def load_threat_model(name: str, root: Path = THREAT_MODELS) -> dict:
    path = root / f"{name}.toml"
    model = tomllib.loads(path.read_text())
    for key in ("name", "corrupted", "behaviour", "protocols", "may_learn", "must_not_learn", "enforced_by"):
        if key not in model:
            raise ValueError(f"threat model {path} lacks the field {key!r}")
    return model


@dataclass
class AuditReport:
    views_audited: int = 0
    entries_checked: int = 0
    leaks: list[str] = field(default_factory=list)
    disclosed_by_design_rows: int = 0

    @property
    def passed(self) -> bool:
        return not self.leaks


def _rows(value: np.ndarray, round_name: str) -> np.ndarray:
    """(B, -1): one row per batch sample (one row for a payload without a batch axis: model parameters)."""
    axis = by_name(round_name).batch_axis
    if axis is None:
        return np.asarray(value, dtype=np.float64).reshape(1, -1)
    return np.moveaxis(np.asarray(value, dtype=np.float64), axis, 0).reshape(value.shape[axis], -1)


def contributions(views: dict[int, View]) -> dict[str, dict[int, np.ndarray]]:
    """Every party's own contribution to every sum of the recorded step, from its "sent" records."""
    out: dict[str, dict[int, np.ndarray]] = {}
    for view in views.values():
        for entry in view.of("sent"):
            out.setdefault(entry.round, {})[entry.peer] = entry.value
    return out


def derivable(entry: Entry, own: np.ndarray) -> list[np.ndarray]:
    """What the active party can compute from one entry of its view, in the shape of the contributions: a
    revealed sum as it is and minus its own contribution; a received message, what its protocol's cipher
    says it may reveal (a clear value as it is, an mpc share decoded as fixed point, a ciphertext nothing)."""
    if entry.kind == "revealed":
        return [entry.value, entry.value - own] if entry.value.shape == own.shape else []
    cipher = cipher_protecting(entry.protection)
    return cipher.derivable(entry.value, own.shape) if cipher is not None else []


def audit_active_view(view: View, truth: dict[str, dict[int, np.ndarray]], active: int, atol: float,
                      rtol: float = AUDIT_RTOL, report: AuditReport | None = None) -> AuditReport:
    """The active party must not learn any single passive party's contribution on a protected row."""
    report = report or AuditReport()
    report.views_audited += 1
    for entry in view:
        if entry.kind == "sent" or entry.round not in truth or active not in truth[entry.round]:
            continue
        candidates = derivable(entry, truth[entry.round][active])
        if candidates:
            report.entries_checked += 1
            _check_rows(entry, candidates, truth[entry.round], active, atol, rtol, report)
    return report


def _check_rows(entry: Entry, candidates: list[np.ndarray], parts: dict[int, np.ndarray], active: int,
                atol: float, rtol: float, report: AuditReport) -> None:
    passive = {k: _rows(v, entry.round) for k, v in parts.items() if k != active}
    total = sum(passive.values())
    for k, rows in passive.items():
        others = total - rows
        protected = np.abs(others).max(axis=1) > 10 * (atol + rtol * np.abs(rows).max(axis=1))
        report.disclosed_by_design_rows += int((~protected).sum())
        for seen in candidates:
            close = np.isclose(_rows(seen, entry.round), rows, atol=atol, rtol=rtol).all(axis=1) & protected
            if close.any():
                report.leaks.append(f"round {entry.round!r}: the active party's view ({entry.kind} from "
                                    f"{entry.peer}) contains party {k}'s contribution on {int(close.sum())} "
                                    "protected rows")
                break


def share_bits_uniform(raw_shares: list[np.ndarray], sigmas: float = 5.0) -> tuple[bool, float]:
    """Do the int64 shares look uniform on Z_2^64? Every bit set about half the time, and the top byte
    uniform over its 256 values (chi-square; a per-bit test alone misses symmetric data). Both at `sigmas`.
    Returns (ok, worst z-score); too few values to test is a failure, not a pass."""
    values = np.concatenate([np.asarray(r, dtype=np.int64).reshape(-1) for r in raw_shares]).view(np.uint64)
    n = values.size
    if n < MIN_SHARE_VALUES:
        return False, float("inf")
    bits = ((values[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).astype(np.float64)
    z_bits = np.abs(bits.mean(axis=0) - 0.5) / np.sqrt(0.25 / n)
    counts = np.bincount((values >> np.uint64(56)).astype(np.int64), minlength=256)
    chi2 = float(((counts - n / 256) ** 2 / (n / 256)).sum())
    worst = max(float(z_bits.max()), (chi2 - 255) / np.sqrt(2 * 255))
    return worst < sigmas, worst


def audit_passive_view(view: View, truth: dict[str, dict[int, np.ndarray]], party: int,
                       atol: float = 1e-6) -> AuditReport:
    """A passive party receives only the active party's broadcasts: never a message of an aggregate round,
    and no row of another party's contribution, at any position of a broadcast cut into rows of that width
    (`atol`: n x 2^-16 under mpc and he, whose revealed sums are on the fixed-point grid)."""
    report = AuditReport(views_audited=1)
    for entry in view.of("received") + view.of("revealed"):
        report.entries_checked += 1
        if entry.round in AGGREGATE_NAMES:
            report.leaks.append(f"party {party} received a message of the aggregate round {entry.round!r}")
            continue
        for name, parts in truth.items():
            for k, c in parts.items():
                rows = _rows_found(entry.value, c, atol) if k != party else 0
                if rows:
                    report.leaks.append(f"party {party}'s view of {entry.round!r} holds party {k}'s {name!r} "
                                        f"contribution on {rows} rows")
    return report


def _rows_found(seen: np.ndarray, contribution: np.ndarray, atol: float) -> int:
    """How many rows of `seen`, cut into rows of the contribution's width (its last axis), lie within `atol` of
    some non-trivial row of `contribution` (every value; any position)."""
    from scipy.spatial import cKDTree

    width = contribution.shape[-1] if contribution.ndim else 0
    if width < 2 or seen.size == 0 or seen.size % width:
        return 0
    theirs = contribution.reshape(-1, width).astype(np.float64)
    theirs = theirs[np.abs(theirs).max(axis=1) > 10 * atol]
    if not len(theirs):
        return 0
    distance, _ = cKDTree(theirs).query(seen.reshape(-1, width).astype(np.float64), p=np.inf,
                                        distance_upper_bound=atol)
    return int(np.isfinite(distance).sum())


def audit_aggregator_view(view: View, truth: dict[str, dict[int, np.ndarray]] | None = None) -> AuditReport:
    """The he aggregator must receive ciphertext frames only: every blob a CKKS message, none holding the
    float32 or float64 bytes of a row of any party's contribution (plaintext behind the magic bytes)."""
    from .secure import frames
    from .secure.ckks import MESSAGE_MAGIC
    from .secure.errors import SecureMessageError

    report = AuditReport(views_audited=1)
    for entry in view.of("received"):
        report.entries_checked += 1
        try:
            frame = frames.decode(entry.value.tobytes())
        except SecureMessageError as error:
            report.leaks.append(f"the aggregator received something other than a frame in {entry.round!r}: {error}")
            continue
        if frame.kind is not frames.Kind.DATA:
            continue
        if not all(blob[:4] == MESSAGE_MAGIC for blob in frame.blobs):
            report.leaks.append(f"the aggregator received something other than ciphertexts in {entry.round!r}")
        for round_name, parts in (truth or {}).items():  # a sender can only leak what it holds: its own
            own = parts.get(entry.peer)
            if own is not None and any(_carries(blob, own, round_name) for blob in frame.blobs):
                report.leaks.append(f"the aggregator's {entry.round!r} message carries party {entry.peer}'s "
                                    f"{round_name!r} contribution in clear")
    return report


def _carries(payload: bytes, contribution: np.ndarray, round_name: str) -> bool:
    """Whether `payload` holds the float32 or float64 bytes of any non-trivial row of a contribution (512 rows
    against 2 MB of ciphertext: 0.2 s)."""
    for row in _rows(contribution, round_name):
        if np.abs(row).max() > 1e-6 and row.size >= 2:
            if row.astype("<f4").tobytes() in payload or row.astype("<f8").tobytes() in payload:
                return True
    return False


_NUMBER = re.compile(rb"[-+]?(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?")
_DIGITS = 7  # fewer significant digits are not read as a leaked float: a random number matches too often
_BITS = 12  # nor, as bytes, a value of fewer significant bits (0.125, 2.5: they occur in integer arrays)


def _statistics(contribution: np.ndarray, round_name: str) -> np.ndarray:
    """The single numbers a contribution could leak as, sorted: each value, each row's largest |value| and norm,
    and the largest |value| of all; non-integral ones only (a count or an epoch is integral, a leaked float is not)."""
    rows = _rows(contribution, round_name)
    values = np.concatenate([rows.reshape(-1), np.abs(rows).max(axis=1), np.linalg.norm(rows, axis=1),
                             [np.abs(rows).max(initial=0.0)]])
    return np.unique(values[(np.abs(values) > 1e-6) & (values != np.round(values))])


def _words(stats: np.ndarray) -> np.ndarray:
    """The float64 bit patterns of the values of `_BITS` significant bits or more, sorted."""
    words = stats.astype("<f8").view("<u8")
    mantissa = words & np.uint64((1 << 52) - 1)
    lowest = mantissa & (~mantissa + np.uint64(1))  # the lowest set bit (0 for a power of two's mantissa)
    trailing = np.where(mantissa > 0, np.log2(np.maximum(lowest, 1).astype(np.float64)), 52)
    return np.sort(words[52 - trailing >= _BITS])


def _in_bytes(payload: bytes, words: np.ndarray) -> bool:
    """Whether one of `words` (`_words`) lies in `payload` as 8 bytes, at any offset."""
    raw = np.frombuffer(payload, dtype=np.uint8)
    for offset in range(min(8, max(len(raw) - 7, 0)) if len(words) else 0):
        window = raw[offset:offset + (len(raw) - offset) // 8 * 8].view("<u8")
        at = np.minimum(np.searchsorted(words, window), len(words) - 1)
        if (words[at] == window).any():
            return True
    return False


def _in_text(payload: bytes, stats: np.ndarray) -> bool:
    """Whether a number of `_DIGITS` significant digits or more in `payload` is one of `stats` written out: within
    its last digit's rounding (and float32's precision)."""
    for match in _NUMBER.findall(payload):
        written = Decimal(match.decode())
        digits = written.as_tuple()
        if len(str(int("".join(map(str, digits.digits)) or "0"))) < _DIGITS or not len(stats):
            continue
        value, tolerance = float(written), 0.5 * 10.0 ** digits.exponent + 1e-7 * abs(float(written))
        at = np.searchsorted(stats, value)
        near = stats[max(at - 1, 0):at + 1]
        if (np.abs(near - value) <= tolerance).any():
            return True
    return False


def audit_control(view: View, truth: dict[str, dict[int, np.ndarray]], party: int,
                  report: AuditReport | None = None) -> AuditReport:
    """Everything a role received outside the rounds: each message must be a declared set-up or control step
    (`transport.rounds.CONTROL_STEPS`) and carry no other party's contribution: none of its rows, and none of
    its single values or rows' peaks and norms as float64 bytes or written out in text (a float32 value's 4
    bytes are not looked for: they would occur by chance in any large payload)."""
    report = report or AuditReport()
    others = [(r, k, c, _statistics(c, r)) for r, parts in truth.items() for k, c in parts.items() if k != party]
    others = [(r, k, c, stats, _words(stats)) for r, k, c, stats in others]
    for entry in view.of("control"):
        report.entries_checked += 1
        if entry.round not in CONTROL_STEPS:
            report.leaks.append(f"rank {party} received an undeclared message {entry.round!r} from rank {entry.peer}")
            continue
        payload = entry.value.tobytes()
        for round_name, k, contribution, stats, words in others:
            if _carries(payload, contribution, round_name) or _in_bytes(payload, words) or _in_text(payload, stats):
                report.leaks.append(f"rank {party}'s {entry.round!r} message from rank {entry.peer} carries "
                                    f"party {k}'s {round_name!r} contribution")
    return report


def audit_recorded_views(views: dict[int, View], n_parties: int, active: int, protocol_name: str) -> dict:
    """Audit the views of one recorded step (`simulate --audit`): the active party's against
    active_semi_honest.toml, every passive party's against passive_semi_honest.toml, the mpc shares'
    uniformity and, for he, the aggregator's (aggregator_he.toml)."""
    truth = contributions(views)
    report = audit_active_view(views[active], truth, active, atol=n_parties * ADDEND_ATOL)
    for party in range(n_parties):
        if party != active:
            _merge(report, audit_passive_view(views[party], truth, party, atol=n_parties * ADDEND_ATOL))
    for rank in range(n_parties, max(views) + 1):
        _merge(report, audit_aggregator_view(views[rank], truth))
    for rank, view in views.items():
        audit_control(view, truth, rank, report)
    out = {"protocol": protocol_name, "views_audited": report.views_audited,
           "entries_checked": report.entries_checked, "disclosed_by_design_rows": report.disclosed_by_design_rows}
    shares = [e.value for e in views[active].of("received") if e.protection == "secret-shared"]
    if shares:
        uniform, worst = share_bits_uniform(shares)
        out.update(shares_tested=int(sum(s.size for s in shares)), shares_uniform=uniform,
                   shares_worst_z=round(worst, 2))
        if not uniform:
            report.leaks.append(f"the mpc shares the active party received are not uniform or too few to test "
                                f"({out['shares_tested']} values, z = {worst:.1f})")
    hides = protocol_named(protocol_name).hides_contributions
    expected = "no leaks" if hides else f"leaks: {protocol_name} sends every contribution in clear"
    return {**out, "leaks_found": len(report.leaks), "leaks": report.leaks[:20], "expected": expected,
            "passed": report.passed}


def _merge(into: AuditReport, other: AuditReport) -> None:
    into.views_audited += other.views_audited
    into.entries_checked += other.entries_checked
    into.leaks += other.leaks
