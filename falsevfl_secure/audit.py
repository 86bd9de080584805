"""Audits of recorded views against the threat models in `threat_models/`.

A view is everything one role received during a run (clear tensors, the raw int64 shares of
`mpc`, the decrypted sums of `he`). The forbidden quantities come from a plaintext shadow run with
the same seed: every party's individual contribution to every sum (`LocalTransport(shadow=...)`).

The per-row rule. The active party knows which parties hold each row and knows its own
contribution, so from a sum it learns `sum - own` exactly. On a row that only one passive party
holds, that IS the passive party's contribution: the protocols hide party k's contribution to a
row only when the other passive parties' contributions to that row are distinguishable from zero
(at the encoding's precision). The audit checks party k on those rows ("protected rows") and
counts the others as disclosed by design (reported, not a failure).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

THREAT_MODELS = Path(__file__).resolve().parents[1] / "threat_models"
BATCH_AXIS = {"posterior": 0, "likelihood": 1, "latent_grad": 1}
AGGREGATE_ROUNDS = tuple(BATCH_AXIS)


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


def _rows(value: np.ndarray, name: str) -> np.ndarray:
    """(B, -1): one row per batch sample."""
    axis = BATCH_AXIS[name]
    return np.moveaxis(np.asarray(value, dtype=np.float64), axis, 0).reshape(value.shape[axis], -1)


def contributions_by_round(shadow: list[dict]) -> dict[str, dict[int, np.ndarray]]:
    """The last pass's individual contributions, per round and party (from the shadow run)."""
    out: dict[str, dict[int, np.ndarray]] = {}
    for entry in shadow:
        value = entry["value"]
        out.setdefault(entry["round"], {})[entry["party"]] = value.numpy() if hasattr(value, "numpy") else value
    return out


def audit_active_view(view: list[dict], shadow: list[dict], active: int, atol: float, rtol: float,
                      report: AuditReport | None = None) -> AuditReport:
    """The active party must not learn any single passive party's contribution on a protected row."""
    report = report or AuditReport()
    report.views_audited += 1
    truth = contributions_by_round(shadow)
    for entry in view:
        name = entry["round"]
        value = entry["value"]
        if name not in truth or not isinstance(value, np.ndarray) or value.dtype.kind != "f":
            continue
        contributions = truth[name]
        own = contributions[active]
        if value.shape != own.shape:
            continue
        report.entries_checked += 1
        passive = {k: _rows(v, name) for k, v in contributions.items() if k != active}
        total = sum(passive.values())
        # What the active party can compute: the value itself and the value minus its own share.
        candidates = [_rows(value, name)]
        if entry["protection"] != "clear":
            candidates.append(_rows(value - own, name))
        for k, rows in passive.items():
            others = total - rows
            protected = np.abs(others).max(axis=1) > 10 * (atol + rtol * np.abs(rows).max(axis=1))
            report.disclosed_by_design_rows += int((~protected).sum())
            for seen in candidates:
                close = np.isclose(seen, rows, atol=atol, rtol=rtol).all(axis=1) & protected
                if close.any():
                    report.leaks.append(f"round {name!r}: the active party's view (from {entry['from']}) "
                                        f"contains party {k}'s contribution on {int(close.sum())} protected rows")
                    break
    return report


def share_bits_uniform(raw_shares: list[np.ndarray], sigmas: float = 5.0) -> tuple[bool, float]:
    """Do the received int64 shares look uniform on Z_2^64? Two tests, both at `sigmas`:
    every bit is set about half the time, and the top byte is uniform over its 256 values
    (chi-square; a per-bit test alone misses symmetric data, whose high bits are all 0 or all 1).
    Returns (ok, worst z-score)."""
    values = np.concatenate([np.asarray(r, dtype=np.int64).reshape(-1) for r in raw_shares]).view(np.uint64)
    n = values.size
    if n < 10 * 256:  # at least 10 expected per top-byte bin for the chi-square test
        raise ValueError(f"{n} share values are too few for a uniformity test (need {10 * 256})")
    bits = ((values[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).astype(np.float64)
    z_bits = np.abs(bits.mean(axis=0) - 0.5) / np.sqrt(0.25 / n)
    counts = np.bincount((values >> np.uint64(56)).astype(np.int64), minlength=256)
    expected = n / 256
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    z_chi2 = (chi2 - 255) / np.sqrt(2 * 255)
    worst = max(float(z_bits.max()), z_chi2)
    return worst < sigmas, worst


def audit_passive_view(view: list[dict], shadow: list[dict], party: int, atol: float = 1e-6) -> AuditReport:
    """A passive party receives only the active party's broadcasts: never an aggregate round, and
    nothing equal to another party's contribution."""
    report = AuditReport(views_audited=1)
    truth = contributions_by_round(shadow)
    for entry in view:
        report.entries_checked += 1
        if entry["round"] in AGGREGATE_ROUNDS:
            report.leaks.append(f"party {party} received a message of the aggregate round {entry['round']!r}")
            continue
        value = np.asarray(entry["value"], dtype=np.float64)
        for contributions in truth.values():
            for k, c in contributions.items():
                if k != party and c.shape == value.shape and np.abs(c).max() > 0 and np.allclose(value, c, atol=atol):
                    report.leaks.append(f"party {party}'s view of {entry['round']!r} equals party {k}'s contribution")
    return report
