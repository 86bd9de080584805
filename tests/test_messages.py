"""Message validation: a message that does not match its round is refused with an error that names
the round and the field; well-formed passes are accepted (fuzzed with hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.config import Stage
from falsevfl_secure.errors import ProtocolError
from falsevfl_secure.methods import METHODS
from falsevfl_secure.transport.rounds import AGGREGATES as AGGREGATE_ROUNDS
from falsevfl_secure.transport.rounds import VOCABULARY, Message
from falsevfl_secure.transport.rounds import MessageValidator as TableValidator

K, ACTIVE, B, S, H, E, T, P = 4, 3, 5, 2, 6, 7, 3, 11
SIZES = {"B": B, "S": S, "H": H, "2H": 2 * H, "2H+16": 2 * H + 16, "2": 2, "E": E, "T": T, "P": P}
SHAPES = {r.name: tuple(SIZES[symbol] for symbol in r.payload) for r in VOCABULARY}  # from the vocabulary
AGGREGATES = {r.name for r in AGGREGATE_ROUNDS}
FALSE_VFL = METHODS["false-vfl"].rounds
STAGE1_ROUNDS = tuple(r.name for r in FALSE_VFL.step(Stage.PRETRAIN))


def MessageValidator(k: int, active: int, protection: str, table=FALSE_VFL) -> TableValidator:  # noqa: N802
    """FALSE-VFL's validator unless another method's table is given."""
    return TableValidator(k, active, protection, table)


def good(name: str, sender: int = 0, protection: str = "secret-shared") -> Message:
    if name in AGGREGATES:
        return Message(name, sender, (ACTIVE,), SHAPES[name], "float32", protection)
    return Message(name, ACTIVE, (0, 1, 2), SHAPES[name], "float32", "clear")


def test_a_full_stage1_pass_and_forward_only_passes_are_accepted():
    v = MessageValidator(K, ACTIVE, "secret-shared")
    for _ in range(2):
        for name in STAGE1_ROUNDS:
            v.check(good(name))
        for name in ("posterior", "latent", "likelihood"):
            v.check(good(name))


@pytest.mark.parametrize("message, field", [
    (Message("posterior", 7, (ACTIVE,), (B, 2 * H), "float32", "secret-shared"), "sender"),
    (Message("posterior", 0, (1,), (B, 2 * H), "float32", "secret-shared"), "receivers"),
    (Message("posterior", 0, (ACTIVE,), (B, 2 * H + 1), "float32", "secret-shared"), "shape"),
    (Message("posterior", 0, (ACTIVE,), (B, 2 * H), "float64", "secret-shared"), "dtype"),
    (Message("posterior", 0, (ACTIVE,), (B, 2 * H), "float32", "clear"), "protection"),
    (Message("latent", ACTIVE, (0, 1, 2), (S, B, H), "float32", "clear"), "round"),  # out of order
    (Message("gossip", 0, (ACTIVE,), (B,), "float32", "clear"), "round"),
])
def test_bad_messages_are_refused_naming_round_and_field(message, field, refused):
    v = MessageValidator(K, ACTIVE, "secret-shared")
    with pytest.raises(ProtocolError, match=rf"round '{message.round}': field '{field}'"):
        v.check(message)
    refused("message")


def test_a_passive_party_cannot_send_a_broadcast_round_and_sizes_must_agree():
    v = MessageValidator(K, ACTIVE, "clear")
    v.check(good("posterior", protection="clear"))
    with pytest.raises(ProtocolError, match="'latent': field 'sender'"):
        v.check(Message("latent", 1, (0, 1, 2), (S, B, H), "float32", "clear"))
    with pytest.raises(ProtocolError, match="'latent': field 'shape': B"):
        v.check(Message("latent", ACTIVE, (0, 1, 2), (S, B + 1, H), "float32", "clear"))


def test_the_latent_gradient_carries_two_moments_not_the_samples():
    v = MessageValidator(K, ACTIVE, "clear")
    for name in ("posterior", "latent", "likelihood", "likelihood_grad"):
        v.check(good(name, protection="clear"))
    with pytest.raises(ProtocolError, match="'latent_grad': field 'shape'"):  # today's (S, B, H) is refused
        v.check(Message("latent_grad", 0, (ACTIVE,), (S + 1, B, H), "float32", "clear"))
    v.check(Message("latent_grad", 0, (ACTIVE,), (2, B, H), "float32", "clear"))


fields = st.sampled_from(["round", "sender", "receivers", "shape", "dtype", "protection"])


@settings(max_examples=300, deadline=None)
@given(position=st.integers(0, len(STAGE1_ROUNDS) - 1), field=fields, data=st.data())
def test_fuzzed_corruptions_of_a_valid_pass_are_refused(position, field, data, refused):
    v = MessageValidator(K, ACTIVE, "ckks")
    for name in STAGE1_ROUNDS[:position]:
        v.check(good(name, protection="ckks"))
    name = STAGE1_ROUNDS[position]
    m = good(name, protection="ckks")
    bad = {
        "round": lambda: data.draw(st.sampled_from([r for r in STAGE1_ROUNDS if r != name] + ["", "posterior "])),
        "sender": lambda: data.draw(st.sampled_from([-1, K, 99] + ([0, 1, 2] if name not in AGGREGATES else []))),
        "receivers": lambda: data.draw(st.sampled_from([(), (0,), (0, 1, 2, 3), (ACTIVE, ACTIVE)])),
        # Wrong rank, an empty axis, or (after the first round fixed B, S, d_h) a size that disagrees.
        "shape": lambda: data.draw(st.lists(st.integers(0, 9), max_size=4).map(tuple).filter(
            lambda s: len(s) != len(SHAPES[name]) or 0 in s
            or (position >= 2 and s != SHAPES[name]) or (name == "posterior" and s[1] % 2 == 1))),
        "dtype": lambda: data.draw(st.sampled_from(["float64", "int64", "float16", ""])),
        "protection": lambda: data.draw(st.sampled_from(["clear", "secret-shared", "none"]).filter(
            lambda p: p != m.protection)),
    }[field]()
    corrupted = Message(**{**m.__dict__, field: bad})
    with pytest.raises(ProtocolError, match=r"round '.*': field '"):
        v.check(corrupted)
    refused("message (fuzzed)")


def test_each_method_s_validator_accepts_its_own_passes_and_refuses_other_rounds(refused):
    for name, method in METHODS.items():
        v = MessageValidator(K, ACTIVE, "secret-shared", method.rounds)
        for _ in range(2):
            for rounds in method.rounds.passes:
                for r in rounds:
                    v.check(good(r.name))
        foreign = [r for r in VOCABULARY if r not in method.rounds.rounds]
        assert foreign, name
        with pytest.raises(ProtocolError, match=rf"round '{foreign[0].name}': field 'round': not a round of this"):
            v.check(good(foreign[0].name))
        refused("message (another method's round)")
    with pytest.raises(ProtocolError, match="no method's round table"):
        TableValidator(K, ACTIVE, "clear").check(good("posterior", protection="clear"))


def test_a_baseline_pass_needs_its_own_order_and_consistent_sizes():
    v = MessageValidator(K, ACTIVE, "clear", METHODS["laser"].rounds)
    with pytest.raises(ProtocolError, match="'subsets_grad': field 'round': out of order"):
        v.check(good("subsets_grad", protection="clear"))
    v.check(good("subsets", protection="clear"))
    with pytest.raises(ProtocolError, match="'subsets_grad': field 'shape': T"):
        v.check(Message("subsets_grad", ACTIVE, (0, 1, 2), (T + 1, B, E), "float32", "clear"))
