"""Each protocol executes exactly the rounds of the round table, and its reviewed spec in protocols/ names
those rounds with the protection its protocol object gives them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from falsevfl_secure.config import Stage
from falsevfl_secure.runtime.session import local_reference
from falsevfl_secure.transport import PROTOCOLS, ROUNDS, STAGE_ROUNDS, LocalTransport

SPECS = Path(__file__).resolve().parents[1] / "protocols"


def load_spec(protocol: str) -> dict:
    return tomllib.loads((SPECS / f"{protocol}.toml").read_text())


def job(stage: Stage):
    from test_equivalence import make_job

    return make_job(3, "II", 6, 2, 11, 0.3, stage.key)


def test_stage_rounds_are_the_forward_rounds_then_their_adjoints_in_reverse():
    forward = STAGE_ROUNDS[Stage.PRETRAIN][:3]
    assert [r.primitive.value for r in forward] == ["aggregate", "broadcast", "aggregate"]
    assert list(STAGE_ROUNDS[Stage.PRETRAIN][3:]) == [r.adjoint for r in reversed(forward)]
    assert all(r.adjoint.adjoint is r and r.adjoint.primitive is not r.primitive for r in ROUNDS)
    assert STAGE_ROUNDS[Stage.TRAIN] == STAGE_ROUNDS[Stage.PREDICT] == forward  # no gradient leaves stage 2


@pytest.mark.parametrize("protocol", ["plain", "mpc", "he"])
def test_executed_rounds_equal_the_table(sessions, protocol):
    for stage in (Stage.PRETRAIN, Stage.TRAIN, Stage.PREDICT):
        reports = sessions(protocol, 3).run(job(stage))
        for rank, report in reports.items():
            assert report["trace"] == [r.name for r in STAGE_ROUNDS[stage]], (protocol, stage, rank)


@pytest.mark.parametrize("protocol", ["plain", "mpc", "he"])
def test_spec_names_the_table_rounds_with_the_protocol_protection(protocol):
    spec = load_spec(protocol)
    assert spec["protocol"] == protocol and set(spec["runtimes"]) == set(PROTOCOLS[protocol].runtimes)
    assert list(spec["rounds"]) == [r.name for r in ROUNDS]
    for r in ROUNDS:
        expected = PROTOCOLS[protocol].protection if r.is_aggregate else "clear"
        assert spec["rounds"][r.name]["protection"] == expected, (protocol, r.name)
        assert spec["rounds"][r.name]["realised_by"] and spec["rounds"][r.name]["learns"]
    assert ("aggregator" in spec["roles"]) == bool(PROTOCOLS[protocol].helpers)


def test_local_runtime_executes_the_table():
    for stage in (Stage.PRETRAIN, Stage.TRAIN, Stage.PREDICT):
        assert local_reference(job(stage))["trace"] == [r.name for r in STAGE_ROUNDS[stage]]
    assert LocalTransport.protection == "clear" and "local" in PROTOCOLS["plain"].runtimes


def test_the_session_spec_names_exactly_the_control_steps():
    """protocols/session.toml specifies every message a role may receive outside the rounds: exactly the
    steps the audit accepts (anything else is reported as a leak)."""
    from falsevfl_secure.transport.rounds import CONTROL_STEPS

    spec = load_spec("session")
    assert [step["name"] for step in spec["steps"]] == list(CONTROL_STEPS)
    for step in spec["steps"]:
        assert step["senders"] and step["receivers"] and step["payload"] and step["protection"] and step["learns"]
    assert {"topology", "transport", "authentication", "relay", "liveness", "ending"} <= set(spec["links"])
