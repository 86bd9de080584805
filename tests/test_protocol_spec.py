"""Each protocol executes exactly the rounds of each method's round table, and its reviewed spec in
protocols/ names every round of the vocabulary with the protection its protocol object gives it and the
methods that run it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from falsevfl_secure.config import Stage
from falsevfl_secure.methods import METHODS
from falsevfl_secure.runtime.session import local_reference
from falsevfl_secure.transport import PROTOCOLS, VOCABULARY, LocalTransport

SPECS = Path(__file__).resolve().parents[1] / "protocols"
FALSE_VFL = METHODS["false-vfl"].rounds
STAGES = (Stage.PRETRAIN, Stage.TRAIN, Stage.PREDICT)


def load_spec(protocol: str) -> dict:
    return tomllib.loads((SPECS / f"{protocol}.toml").read_text())


# Every round table: each method's, and FALSE-VFL's with the moments broadcast (a configured variant).
TABLES = [(name, "samples", method.rounds) for name, method in METHODS.items()] + [
    ("false-vfl", "moments", variant.rounds) for variant in METHODS["false-vfl"].variants]


def job(stage: Stage, method: str = "false-vfl", latent_broadcast: str = "samples"):
    from test_equivalence import make_job

    return make_job(3, "II" if method == "false-vfl" else "I", 6, 2, 11, 0.3, stage.key, method=method,
                    latent_broadcast=latent_broadcast)


def test_stage_rounds_are_the_forward_rounds_then_their_adjoints_in_reverse():
    forward = FALSE_VFL.step(Stage.PRETRAIN)[:3]
    assert [r.primitive.value for r in forward] == ["aggregate", "broadcast", "aggregate"]
    assert list(FALSE_VFL.step(Stage.PRETRAIN)[3:]) == [r.adjoint for r in reversed(forward)]
    assert all(r.adjoint.adjoint is r and r.adjoint.primitive is not r.primitive for r in VOCABULARY)
    assert FALSE_VFL.step(Stage.TRAIN) == FALSE_VFL.step(Stage.PREDICT) == forward  # no gradient leaves stage 2


@pytest.mark.parametrize("name", [n for n in METHODS if n != "false-vfl"])
def test_a_baseline_fuses_by_one_sum_whose_adjoint_is_its_only_backward_round(name):
    table = METHODS[name].rounds
    fusion, adjoint = table.step(Stage.TRAIN)
    assert fusion.is_aggregate and adjoint is fusion.adjoint and table.step(Stage.PREDICT)[0].is_aggregate
    assert len(table.step(Stage.PREDICT)) == 1  # prediction: the fused embedding only


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_executed_rounds_equal_the_table(sessions, protocol):
    for name, broadcast, table in TABLES:
        for stage in STAGES:
            reports = sessions(protocol, 3).run(job(stage, name, broadcast))
            for rank, report in reports.items():
                assert report["trace"] == [r.name for r in table.step(stage)], (protocol, name, stage, rank)
                assert_timeline(report)


def assert_timeline(report: dict) -> None:
    """The step's timeline (bench/overhead.py): each round of the trace once, in order, inside the step."""
    spans = report["timeline"]
    assert [name for name, _, _ in spans] == report["trace"]
    edges = [t for _, start, end in spans for t in (start, end)]
    assert edges == sorted(edges) and all(0 <= t <= 1000 * report["seconds"] + 1e-3 for t in edges)


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_spec_names_the_vocabulary_with_the_protocol_protection_and_the_methods(protocol):
    spec = load_spec(protocol)
    assert spec["protocol"] == protocol and set(spec["runtimes"]) == set(PROTOCOLS[protocol].runtimes)
    assert list(spec["rounds"]) == [r.name for r in VOCABULARY]
    for r in VOCABULARY:
        entry = spec["rounds"][r.name]
        expected = PROTOCOLS[protocol].protection if r.is_aggregate else "clear"
        assert entry["protection"] == expected, (protocol, r.name)
        assert entry["realised_by"] and entry["learns"]
        assert entry["methods"] == sorted({n for n, _, t in TABLES if r in t.rounds}, key=list(METHODS).index), \
            (protocol, r.name)
    assert ("aggregator" in spec["roles"]) == bool(PROTOCOLS[protocol].helpers)


def test_local_runtime_executes_the_table():
    for name, broadcast, table in TABLES:
        for stage in STAGES:
            assert local_reference(job(stage, name, broadcast))["trace"] == [r.name for r in table.step(stage)]
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
