"""Each protocol executes exactly the rounds its reviewed spec in protocols/ lists."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from falsevfl_secure.runtime.session import WorldSession
from falsevfl_secure.transport import STAGE1_ROUNDS, LocalTransport
from falsevfl_secure.transport.mpc import MpcBackend
from falsevfl_secure.transport.plain import PlainBackend

SPECS = Path(__file__).resolve().parents[1] / "protocols"


def load_spec(protocol: str) -> dict:
    return tomllib.loads((SPECS / f"{protocol}.toml").read_text())


def job(stage: str) -> dict:
    from test_equivalence import make_job

    return make_job(3, "II", 6, 2, 11, 0.3, stage)


@pytest.mark.parametrize("protocol", ["plain", "mpc", "he"])
def test_executed_rounds_equal_the_spec(protocol):
    spec = load_spec(protocol)
    assert [r["name"] for r in spec["rounds"]] == list(STAGE1_ROUNDS)
    with WorldSession(protocol, 3) as world:
        for stage in ("pretrain", "train", "predict"):
            reports = world.run(job(stage))
            for rank, report in reports.items():
                assert report["trace"] == spec["stages"][stage], (protocol, stage, rank)


def test_spec_protection_matches_the_backends():
    from falsevfl_secure.transport.he import HeBackend

    for protocol, backend in (("plain", PlainBackend), ("mpc", MpcBackend), ("he", HeBackend)):
        spec = load_spec(protocol)
        for r in spec["rounds"]:
            expected = backend.protection if r["senders"] == "every party" else "clear"
            assert r["protection"] == expected, (protocol, r["name"])


def test_local_runtime_executes_the_plain_spec():
    from test_equivalence import local_reference

    spec = load_spec("plain")
    assert "local" in spec["runtimes"]
    for stage in ("pretrain", "train", "predict"):
        assert local_reference(job(stage))["trace"] == spec["stages"][stage]
    assert LocalTransport.protocol == "plain"
