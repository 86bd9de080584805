"""Every registered sum cipher (and the Paillier plug-in of `bench/`) against the exact sum: protect ->
combine -> reveal, every party's cipher in one process (`Protocol.in_process`, fresh keys from the OS), over
shapes, party counts and magnitudes up to each cipher's documented range; and the refusals: an input the
cipher cannot carry is refused by its party, whose message carries none of its values, and the active party
gets no sum. Then the protocols' parameters: other values than the defaults still reveal the plain sum
within their stated error, bad values are refused, and parties whose parameters differ never start."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from falsevfl_secure.errors import InputError, ProtocolError
from falsevfl_secure.runtime.cast import base_agreement, local_specs
from falsevfl_secure.runtime.world import World
from falsevfl_secure.secure.ckks import make_secret_context, public_context_bytes
from falsevfl_secure.secure.errors import SecureParameterError, SecureRangeError
from falsevfl_secure.transport import PROTOCOLS
from falsevfl_secure.transport.protocols import He, Mpc
from falsevfl_secure.transport.rounds import POSTERIOR
from falsevfl_secure.transport.sums import sum_in_process

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from paillier import Paillier  # noqa: E402  (the plug-in outside the package: bench/paillier.py)

CIPHERS = {**PROTOCOLS, "paillier": Paillier()}  # every registered protocol, and the plug-in
EXAMPLES = {"he": 6, "paillier": 4}  # a CKKS context takes ~0.2 s to make, a 2048-bit Paillier key ~1 s


def ciphers_of(name: str, parties: int, active: int):
    return CIPHERS[name].in_process(parties, active)


def closing(ciphers, helper):
    for cipher in [*ciphers, *([helper] if helper else [])]:
        cipher.close()


@pytest.mark.parametrize("name", list(CIPHERS))
def test_every_cipher_reveals_the_exact_sum_within_its_stated_error(name):
    @settings(max_examples=EXAMPLES.get(name, 25), deadline=None, suppress_health_check=list(HealthCheck))
    @given(parties=st.integers(2, 6), rows=st.integers(1, 9), width=st.integers(1, 40), data=st.data(),
           scale=st.floats(-8, 1), active=st.integers(0, 5))
    def run(parties, rows, width, data, scale, active):
        active %= parties
        ciphers, helper = ciphers_of(name, parties, active)
        limit = min(ciphers[active].addend_range(parties), 2.0**60)
        magnitude = limit * 10.0**scale * 0.99 if scale < 0 else limit * 0.99  # up to the edge of the range
        values = [torch.from_numpy(data.draw(st.lists(st.floats(-1, 1), min_size=rows * width,
                                                       max_size=rows * width).map(np.array)) * magnitude)
                  .to(torch.float32).reshape(rows, width) for _ in range(parties)]
        try:
            revealed = sum_in_process(POSTERIOR, values, ciphers, helper, active)
        finally:
            closing(ciphers, helper)
        exact = sum(v.double() for v in values)
        largest = max(float(v.abs().max()) for v in values)
        assert revealed.shape == exact.shape
        error = float((revealed.double() - exact).abs().max())
        assert error <= ciphers[active].reveal_error(parties, largest) + 1e-300, (error, largest)

    run()


def refusals() -> list[tuple[str, str]]:
    """(protocol, bad input) pairs: NaN and inf for every cipher, a value beyond the range where one is stated."""
    cases = []
    for name, protocol in CIPHERS.items():
        bounded = protocol.addend_range(3) < float("inf")
        cases += [(name, "nan"), (name, "inf"), *([(name, "beyond the range")] if bounded else [])]
    return cases


@pytest.mark.parametrize(("name", "bad"), refusals())
def test_every_cipher_refuses_what_it_cannot_carry_without_sending_it(name, bad):
    parties, active = 3, 0
    ciphers, helper = ciphers_of(name, parties, active)
    limit = ciphers[1].addend_range(parties)
    value = torch.full((4, 6), 0.25)
    value[2, 3] = {"nan": float("nan"), "inf": float("inf")}.get(bad, min(limit * 2, 3e38))
    try:
        message, refusal = ciphers[1].protect(POSTERIOR, value, parties)
        assert isinstance(refusal, SecureRangeError)
        honest, _ = ciphers[1].protect(POSTERIOR, torch.full((4, 6), 0.25), parties)
        assert np.frombuffer(np.float32(0.25).tobytes(), np.uint8).tobytes() not in message
        if name != "mpc":  # masked messages are uniform: what the refusal hides is checked on the sum below
            assert message != honest
        own = [ciphers[k].protect(POSTERIOR, torch.full((4, 6), 0.5), parties)[0] for k in (0, 2)]
        messages = {0: own[0], 1: message, 2: own[1]}
        if helper is not None:
            messages.pop(active)
        combiner = helper or ciphers[active]
        # the sum ends naming the refusing party, not with an unrelated error (plain: its value on the wire)
        with pytest.raises((SecureRangeError, ProtocolError), match="party ?1|input of 1 party") as ended:
            combined = combiner.combine(POSTERIOR, messages, (4, 6))
            ciphers[active].reveal(POSTERIOR, combined, (4, 6), torch.full((4, 6), 0.5) if helper else None)
        assert "0.25" not in str(ended.value) and "0.5" not in str(ended.value)
    finally:
        closing(ciphers, helper)


@pytest.mark.parametrize("name", list(CIPHERS))
def test_the_active_partys_own_non_finite_input_is_refused_as_any_partys(name):
    """Where a helper combines (he), the active party adds its own contribution in clear after decrypting: a
    NaN there ended the sum as NaN (caught later as a non-finite loss), where every other party's is refused."""
    parties, active = 3, 0
    ciphers, helper = ciphers_of(name, parties, active)
    try:
        values = [torch.full((4, 6), 0.25) for _ in range(parties)]
        values[active][1, 2] = float("nan")
        with pytest.raises((SecureRangeError, ProtocolError), match="party ?0.*(non-finite|NaN)"):
            sum_in_process(POSTERIOR, values, ciphers, helper, active)
    finally:
        closing(ciphers, helper)


@pytest.mark.parametrize("name", list(CIPHERS))
def test_what_the_audit_reads_in_a_message_is_the_contribution_only_when_nothing_hides_it(name):
    """The audits ask the cipher what a recorded message may reveal. A weakened mpc party without pair keys
    (its zero share is zero) sends its contribution readably; the shipped one, masked, does not."""
    ciphers, helper = ciphers_of(name, 3, 0)
    value = torch.linspace(-3, 3, 24).reshape(4, 6)
    try:
        message, _ = ciphers[1].protect(POSTERIOR, value, 3)
        read = type(ciphers[1]).derivable(ciphers[1].seen(message, (4, 6)), (4, 6))
        if not PROTOCOLS.get(name, CIPHERS[name]).hides_contributions:
            np.testing.assert_allclose(read[0], value.numpy())
        elif read:  # the mpc share: uniform on the ring, so nothing near the value
            assert float(np.abs(read[0] - value.numpy()).min()) > 1e3
        if name == "mpc":
            weakened = type(ciphers[1])(1, {})
            readable = type(weakened).derivable(weakened.seen(weakened.protect(POSTERIOR, value, 3)[0]), (4, 6))
            np.testing.assert_allclose(readable[0], value.numpy(), atol=2.0**-16)
            weakened.close()
    finally:
        closing(ciphers, helper)


# -- the protocols' parameters ----------------------------------------------------------------------------

OTHER_PARAMETERS = {  # per registered protocol that takes parameters: values other than its defaults
    "mpc": st.builds(Mpc, precision_bits=st.integers(17, 32)),
    "he": st.sampled_from([He(coeff_mod_bit_sizes=(60, 30, 60), global_scale_bits=45), He(global_scale_bits=36)]),
}


def test_every_protocol_that_takes_parameters_is_tried_with_others():
    assert {name for name, p in PROTOCOLS.items() if p.parameters()} == set(OTHER_PARAMETERS)


@pytest.mark.parametrize("name", list(OTHER_PARAMETERS))
def test_other_parameters_reveal_the_plain_sum_within_their_stated_error(name):
    @settings(max_examples=EXAMPLES.get(name, 20), deadline=None, suppress_health_check=list(HealthCheck))
    @given(protocol=OTHER_PARAMETERS[name], parties=st.integers(3, 5), rows=st.integers(1, 6),
           width=st.integers(1, 30), data=st.data(), scale=st.floats(-8, 0))
    def run(protocol, parties, rows, width, data, scale):
        assert protocol.parameters() != PROTOCOLS[name].parameters()
        ciphers, helper = protocol.in_process(parties, 0)
        limit = min(protocol.addend_range(parties), 2.0**60)
        assert ciphers[0].addend_range(parties) == limit or limit == 2.0**60  # one statement, asked by both
        values = [torch.from_numpy(data.draw(st.lists(st.floats(-1, 1), min_size=rows * width,
                                                       max_size=rows * width).map(np.array)) * limit * 10.0**scale
                                   * 0.99).to(torch.float32).reshape(rows, width) for _ in range(parties)]
        clear, _ = PROTOCOLS["plain"].in_process(parties, 0)
        try:
            secure = sum_in_process(POSTERIOR, values, ciphers, helper, 0).double()
            plain = sum_in_process(POSTERIOR, values, clear, None, 0).double()
            stated = ciphers[0].reveal_error(parties, max(float(v.abs().max()) for v in values))
            plain_error = clear[0].reveal_error(parties, max(float(v.abs().max()) for v in values))
        finally:
            closing(ciphers, helper)
        assert float((secure - sum(v.double() for v in values)).abs().max()) <= stated + 1e-300
        assert float((secure - plain).abs().max()) <= stated + plain_error + 1e-300

    run()


@pytest.mark.parametrize("bad", [lambda: Mpc(precision_bits=15), lambda: Mpc(precision_bits=33),
                                 lambda: Mpc(precision_bits=20.0), lambda: He(poly_modulus_degree=4096),
                                 lambda: He(coeff_mod_bit_sizes=(60, 10, 60)), lambda: He(global_scale_bits=79),
                                 lambda: He(coeff_mod_bit_sizes=())])
def test_parameters_that_break_a_bound_are_refused(bad, refused):
    with pytest.raises(InputError):
        bad()
    refused("protocol parameters")


def test_a_published_ckks_context_with_other_parameters_is_refused():
    """What the agreement already refuses, a passive party also checks in the context it is sent."""
    published = public_context_bytes(make_secret_context())
    He().load_public(published)
    with pytest.raises(SecureParameterError, match="not the agreed"):
        He(global_scale_bits=45, coeff_mod_bit_sizes=(60, 30, 60)).load_public(published)


def _joined(role) -> str:
    return role.session.protocol


def test_parties_whose_protocol_parameters_differ_are_refused_at_the_handshake(tmp_path):
    """party0's own configuration says another mpc grid: every role stops at the handshake, naming the field."""
    names = ["party0", "party1", "party2"]
    specs = local_specs(Mpc(), names, "party2", tmp_path / "keys", {"command": "test"})
    other = Mpc(precision_bits=20)
    specs[0] = replace(specs[0], protocol=other, agreement=base_agreement(other, specs[0].cast, False,
                                                                          {"command": "test"}))
    outcomes = World(specs, _joined, (), tmp_path / "world").start().outcomes(120)
    assert all("differ in 'protocol.precision_bits'" in str(o.get("error")) for o in outcomes), outcomes
