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
# The precision of one revealed addend: mpc rounds to 2^-16 (CrypTen's fixed point); CKKS at scale
# 2^40 decrypts within ~1e-8; plain is exact. A sum of K addends is within K times that.
ENCODING_ATOL = {"plain": 1e-6, "mpc": 2.0**-16, "he": 1e-6}
AUDIT_RTOL = 1e-6


def portable_entry(entry: dict) -> dict:
    """A recorded view entry with its payload as numpy (tensors) or bytes (ciphertexts)."""
    value = entry["value"]
    if hasattr(value, "numpy"):
        value = value.detach().cpu().numpy().copy()
    return {**entry, "value": value}


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


def shadow_of_probe_step(cfg) -> list[dict]:
    """Every party's individual contribution to every sum of the audited step (`train.probe_step`),
    from a plaintext run of the same configuration and seed in one process."""
    import torch

    from .runtime.local import make_splits
    from .train import host_split, probe_step
    from .transport import LocalTransport
    from .world import make_world

    dataset, train_split, _ = make_splits(cfg, ())
    shadow: list[dict] = []
    cpu = torch.device("cpu")
    world = make_world(cfg, {k: b.shape[1] for k, b in enumerate(train_split.blocks)}, dataset.n_classes,
                       LocalTransport(cfg.parties, cfg.active, shadow=shadow), cpu)
    probe_step(world, host_split(train_split, range(cfg.parties), True, cpu, dataset.n_classes))
    return shadow


def audit_recorded_views(cfg, protocol: str, views: dict[int, list[dict]]) -> dict:
    """Audit the views of one recorded run (`simulate --audit`): the active party's against
    active_semi_honest.toml, every passive party's against passive_semi_honest.toml, the mpc shares'
    uniformity and, for he, that the aggregator received ciphertexts only (aggregator_he.toml).
    `views` maps rank -> the entries that rank received during the probe step."""
    shadow = shadow_of_probe_step(cfg)
    active = cfg.active
    active_report = audit_active_view(views[active], shadow, active,
                                      atol=cfg.parties * ENCODING_ATOL[protocol], rtol=AUDIT_RTOL)
    leaks = list(active_report.leaks)
    audited, checked = active_report.views_audited, active_report.entries_checked
    for party in range(cfg.parties):
        if party != active:
            report = audit_passive_view(views[party], shadow, party)
            leaks += report.leaks
            audited, checked = audited + 1, checked + report.entries_checked
    out = {"protocol": protocol, "views_audited": audited, "entries_checked": checked,
           "disclosed_by_design_rows": active_report.disclosed_by_design_rows}
    if protocol == "mpc":
        shares = [e["value"] for e in views[active] if e["protection"] == "secret-shared"]
        out["shares_uniform"] = None  # stays None when the step's shares are too few to test
        if sum(np.asarray(v).size for v in shares) >= 10 * 256:
            uniform, worst = share_bits_uniform(shares)
            out["shares_uniform"], out["shares_worst_z"] = uniform, round(worst, 2)
            if not uniform:
                leaks.append(f"the mpc shares the active party received are not uniform (z = {worst:.1f})")
    if protocol == "he" and cfg.parties in views:  # the aggregator's rank
        audited += 1
        out["views_audited"] = audited
        clear = [e["round"] for e in views[cfg.parties]
                 if not (isinstance(e["value"], list) and all(isinstance(c, bytes) for c in e["value"]))]
        if clear:
            leaks.append(f"the aggregator received something other than ciphertexts in rounds {clear}")
    out["leaks_found"] = len(leaks)
    out["leaks"] = leaks[:20]
    out["expected"] = ("leaks: plain sends every contribution in clear" if protocol == "plain" else "no leaks")
    out["passed"] = not leaks
    return out


def save_view(path: Path, entries: list[dict]) -> None:
    """One role's recorded view, written atomically (pickle: numpy arrays and ciphertext bytes)."""
    import os
    import pickle

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps([portable_entry(e) for e in entries]))
    os.replace(tmp, path)


def load_views(directory: Path) -> dict[int, list[dict]]:
    """rank -> recorded view, from the files `save_view` wrote (our own workers' output)."""
    import pickle

    return {int(p.stem.removeprefix("rank")): pickle.loads(p.read_bytes())
            for p in sorted(Path(directory).glob("rank*.pkl"))}
