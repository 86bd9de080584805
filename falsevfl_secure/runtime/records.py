"""The typed records of a run: the `Job` every role of a distributed run reads, and the `RunResult`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..config import Config
from ..errors import InputError


@dataclass(frozen=True)
class Job:
    """What every role of a simulated distributed run is told (written once by the launcher as JSON)."""

    config: Config
    protocol: str
    test_patterns: tuple[str, ...]
    checkpoint_dir: str | None = None
    resume: bool = False
    views_dir: str | None = None  # --audit: every role records its view of one probe step here

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "config": self.config.to_dict(), "test_patterns": list(self.test_patterns)})

    @classmethod
    def from_json(cls, text: str) -> Job:
        try:
            d = json.loads(text)
            unknown = set(d) - {f.name for f in fields(cls)}
            if unknown:
                raise InputError(f"unknown job fields {sorted(unknown)}")
            return cls(**{**d, "config": Config.from_dict(d["config"]), "test_patterns": tuple(d["test_patterns"])})
        except (ValueError, KeyError, TypeError) as error:
            raise InputError(f"not a job file: {error}") from error

    @classmethod
    def read(cls, path: Path | str) -> Job:
        try:
            return cls.from_json(Path(path).read_text())
        except OSError as error:
            raise InputError(f"cannot read the job file {path}: {error.strerror}") from error
        except UnicodeDecodeError as error:
            raise InputError(f"{path} is not a job file (not UTF-8 text)") from error


@dataclass
class RunResult:
    """What a run reports (written as result.json): accuracy in percent per test pattern, the fraction of
    parties observed under each, times, losses, sample counts and the communication per round and party
    (`seconds` only where the runtime measured them: `timed`)."""

    accuracy: dict[str, float]
    observed_fraction: dict[str, float]
    wall_time_s: float
    stage_time_s: dict[str, float]
    protocol: str
    runtime: str
    device: str
    losses: dict[str, list[float]]
    samples: dict
    dropped_no_observed_party: dict[str, int]
    communication: list[dict]
    timed: bool
    config: dict
    audit: dict | None = field(default=None)
    stage_split: dict[str, dict[str, float]] | None = None  # the active party's `train.Fit.split` (timed runs)
    privacy: list[dict] | None = None  # each party's epsilon per row (privacy.Spent), under a privacy budget

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunResult:
        return cls(**d)
