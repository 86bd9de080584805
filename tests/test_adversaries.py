"""Parties that cannot be overruled (threat_models/malicious_pinned_party.toml, active_network_attacker.toml):
every attack here succeeds against a deliberately weakened build and fails against the shipped one. The
runs are real: role processes over the pinned gRPC links, real masks and real CKKS; the adversaries are the
test-only roles of tests/adversaries.py."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from adversaries import (
    DowngradingActive,
    DroppingActive,
    ObedientParty,
    PublicAgreement,
    SubstitutingActive,
    TrustingParty,
    contribute,
    one_sum,
    party_input,
    unmask_from_public_data,
    unmask_with_substituted_keys,
)

from falsevfl_secure.runtime.cast import local_specs
from falsevfl_secure.runtime.world import World, run_world
from falsevfl_secure.transport import PROTOCOLS as _REGISTRY
from falsevfl_secure.transport.protocols import Mpc, protocol_named
from falsevfl_secure.transport.views import load_view

SECURE = [name for name, p in _REGISTRY.items() if p.hides_contributions]


def outcomes(tmp_path: Path, protocol, parties: int, program, args=(), classes=None, consent=False,
             needs_all=True, join_timeout_s=20.0, prepare=None) -> list[dict]:
    """How every role of a world ended ({"ok": value} or its error report), with some roles replaced."""
    proto = protocol_named(protocol)
    names = [f"party{k}" for k in range(parties)]
    specs = local_specs(proto, names, names[-1], tmp_path / "keys", {"command": "test"}, consent=consent,
                        record=True)
    specs = [dataclasses.replace(s, request=dataclasses.replace(s.request, needs_all=needs_all,
                                                                join_timeout_s=join_timeout_s)) for s in specs]
    if prepare is not None:
        prepare(specs)
    world = World(specs, program, args, tmp_path / "world", role_classes=classes)
    return world.start().outcomes(180.0)


def received_round_entries(path: Path) -> list:
    return [e for e in load_view(path) if e.kind == "received"] if path.exists() else []


# -- 1. the active party switches everyone to plain ----------------------------------------------------


@pytest.mark.parametrize("build", ["weakened: obeys the roster", "shipped"])
def test_a_downgrade_to_plain_is_refused_by_every_passive_party(tmp_path, build, attacked):
    party = ObedientParty if build.startswith("weakened") else None
    classes = {"party3": DowngradingActive, **({f"party{k}": party for k in range(3)} if party else {})}
    view = tmp_path / "active.npz"
    ended = outcomes(tmp_path, "mpc", 4, contribute, (str(view),), classes)
    captured = received_round_entries(view)
    exact = sum(any(np.array_equal(e.value, party_input(k).numpy()) for e in captured) for k in range(3))
    attacked("downgrade to plain (active's roster)", build, f"{exact} of 3 passive inputs captured in clear")
    if party is not None:
        assert all("ok" in o for o in ended) and exact == 3
        return
    for k in range(3):
        assert ended[k].get("outcome") == "error" and "never sends under weaker protection" in ended[k]["error"], \
            ended[k]
    # the refusal came before any round: the active party's program (which saves its view when it leaves)
    # never started, so it holds no view at all, not merely an empty one
    assert not view.exists() and exact == 0


@pytest.mark.parametrize("build", ["weakened: obeys the roster", "shipped"])
def test_a_two_party_roster_is_refused_by_the_party_left_with_the_active_party(tmp_path, build, attacked):
    """The active party leaves party1 out, so that the mpc sum is party0's input plus its own."""
    classes = {"party2": DroppingActive, **({"party0": ObedientParty} if build.startswith("weakened") else {})}
    view = tmp_path / "active.npz"
    ended = outcomes(tmp_path, "mpc", 3, contribute, (str(view),), classes, needs_all=False)
    assert ended[1].get("outcome") == "error" and "is not in this run" in ended[1]["error"]
    if build.startswith("weakened"):
        active = ended[2]["ok"]
        recovered = active["sum"] - active["input"]
        exact = int(np.sum(np.abs(recovered - party_input(0).numpy()) < 2.0**-15))
        attacked("two-party roster (active)", build, f"{exact} of {recovered.size} values of party 0 recovered")
        assert exact == recovered.size
        return
    assert ended[0].get("outcome") == "error" and "only two parties take part" in ended[0]["error"], ended[0]
    assert "allow_two_party_disclosure" in ended[0]["error"] and not view.exists()  # no program, no round
    attacked("two-party roster (active)", build, "refused by party 0 before any round")


# -- 2. the relay substitutes the ephemeral keys -------------------------------------------------------


@pytest.mark.parametrize("build", ["weakened: unsigned keys", "shipped"])
def test_a_relay_that_substitutes_x25519_keys_is_detected(tmp_path, build, attacked):
    weak = build.startswith("weakened")
    classes = {"party3": SubstitutingActive, **({f"party{k}": TrustingParty for k in range(3)} if weak else {})}
    ended = outcomes(tmp_path, "mpc", 4, unmask_with_substituted_keys, (), classes)
    if weak:
        got = ended[3]["ok"]
        exact = sum(np.allclose(got["recovered"][k], got["inputs"][k], atol=2.0**-16) for k in got["inputs"])
        attacked("x25519 key substitution (relay)", build, f"{exact} of 3 passive inputs unmasked exactly")
        assert exact == 3
        return
    for k in range(3):
        assert ended[k].get("outcome") == "error" and "does not carry a valid signature" in ended[k]["error"], ended[k]
    attacked("x25519 key substitution (relay)", build, "detected by 3 of 3 passive parties; nothing unmasked")


# -- 3. the active party's operator runs the he aggregator ---------------------------------------------


def he_collusion(role) -> dict:
    """The aggregator records each passive party's ciphertexts; the active party hands over its secret key."""
    if not role.is_party:
        role.membership.on_recorded = lambda view: None
        role.serve_helper()
        return {"frames": {str(e.peer): e.value for e in role.view if e.kind == "received" and e.round == "posterior"}}
    out = contribute(role)
    if role.is_active:
        out["secret"] = np.frombuffer(role.backend.cipher.secret.serialize(save_secret_key=True), dtype=np.uint8)
    return out


def _rogue_aggregator(specs) -> None:
    """The aggregator runs with a key of its own, not the one every party pinned."""
    from falsevfl_secure.secure import identity

    path = Path(specs[-1].key_path)
    path.unlink()
    identity.write_private_key(path, identity.generate())


@pytest.mark.parametrize("build", ["weakened: pins what the active party names", "shipped"])
def test_an_aggregator_that_is_not_the_pinned_one_is_refused_by_every_party(tmp_path, build, attacked):
    weak = build.startswith("weakened")
    ended = outcomes(tmp_path, "he", 3, he_collusion, (), join_timeout_s=6.0,
                     prepare=None if weak else _rogue_aggregator)
    if weak:  # every party pinned the key of the aggregator the active party's operator runs
        import tenseal as ts

        from falsevfl_secure.secure import frames
        from falsevfl_secure.secure.ckks import decrypt_tensors

        secret = ts.context_from(ended[2]["ok"]["secret"].tobytes())
        recorded = ended[3]["ok"]["frames"]
        exact = 0
        for k in (0, 1):
            blobs = frames.decode(recorded[str(k)].tobytes()).blobs
            value = decrypt_tensors(secret, blobs[0], [tuple(party_input(k).shape)])[0].float()
            exact += int(torch.allclose(value, party_input(k), atol=2.0**-16))
        attacked("rogue he aggregator (active's operator)", build, f"{exact} of 2 passive inputs decrypted")
        assert exact == 2
        return
    for k in range(3):  # each party dials the aggregator itself and refuses it for its own pin
        error = ended[k].get("error", "")
        assert "could not connect to aggregator" in error and "not issued by the key pinned" in error, (k, ended[k])
    assert all("ok" not in o for o in ended)
    attacked("rogue he aggregator (active's operator)", build, "refused at the TLS handshake by every party")


# -- 4. nothing secret follows from public data --------------------------------------------------------


@pytest.mark.parametrize("build", ["weakened: pair keys from public data", "shipped"])
def test_pair_keys_never_follow_from_public_data(build, attacked):
    """Two runs with identical public inputs: their masks must differ, and a key derived from public data
    must not unmask anything."""
    protocol = Mpc(agreement=PublicAgreement) if build.startswith("weakened") else Mpc()
    runs = [run_world(protocol, 3, one_sum, timeout_s=90) for _ in range(2)]
    shares = [run[2]["shares"]["0"] for run in runs]
    same = bool(np.array_equal(shares[0], shares[1]))
    recovered = unmask_from_public_data(shares[0], 0, 3)
    exact = bool(np.allclose(recovered, party_input(0).numpy(), atol=2.0**-15))
    attacked("pair keys from public data (active)", build, f"masks of two runs {'equal' if same else 'differ'}; "
             f"input {'recovered' if exact else 'not recovered'}")
    if build.startswith("weakened"):
        assert same and exact
    else:
        assert not same and not exact


def _refusing_program(role) -> None:
    from falsevfl_secure.transport.rounds import POSTERIOR

    if not role.is_party:
        role.serve_helper()
        return
    value = party_input(role.rank) * (1e15 if role.rank == 0 else 1.0)
    role.backend.sum_to_active(POSTERIOR, value)


@pytest.mark.parametrize("protocol", SECURE)
def test_a_refused_input_is_reported_to_others_without_its_value(tmp_path, protocol):
    """Error texts that cross a boundary carry no values: the others learn that party 0 refused its own
    input, not how large it was (its own error, which stays with it, says)."""
    ended = outcomes(tmp_path, protocol, 3, _refusing_program)
    assert ended[0].get("outcome") == "error" and "magnitude" in ended[0]["error"], ended[0]
    told = ended[2].get("error", "")  # the refusal itself, or that its sender stopped (which one comes first varies)
    assert "refused" in told or "outside the secure sum's range" in told or "no round was running" in told, ended[2]
    assert "error" in ended[2], ended[2]  # the active party is told of the refusal
    for k in (1, 2):  # the other passive party may finish or be told
        text = ended[k].get("error", "")
        assert "magnitude" not in text and not _names_a_large_number(text), (k, text)


def _names_a_large_number(text: str) -> bool:
    """Whether `text` names a number of 1e14 or more, however written (the public range bound, below 1e14
    for both protocols, may be named; the refused input, about 1e15, never)."""
    numbers = re.findall(r"\d[\d,_]*(?:\.\d+)?(?:[eE][+-]?\d+)?", text)
    return any(float(n.replace(",", "").replace("_", "")) >= 1e14 for n in numbers)


def test_the_value_detector_reads_every_way_of_writing_the_refused_value():
    """Not vacuous: texts a weakened build could write with the refused value are all caught."""
    value = float(party_input(0).abs().max()) * 1e15
    for text in (f"input {value}", f"input {value:E}", f"input {value:,.0f}", f"input {value:.3e}",
                 f"input {int(value)}"):
        assert _names_a_large_number(text), text
    assert not _names_a_large_number("outside the range 2^43 = 8796093022208 of mpc, party0 refused")
