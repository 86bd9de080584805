"""One public stream per purpose: every public random number names its purpose (`PublicStream`), and no two
purposes (nor two uses of one) can draw the same numbers. Before, the first epoch's batch order of stage 1
and the labeled-row draw were one stream: under mar1 epoch 0 of stage 1 began with exactly the labeled rows."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest

from falsevfl_secure.config import Stage
from falsevfl_secure.data import make_splits
from falsevfl_secure.methods import make_config
from falsevfl_secure.methods.base import epoch_batches
from falsevfl_secure.randomness import PUBLIC_WORDS, PublicStream, public_rng

PACKAGE = Path(__file__).resolve().parents[1] / "falsevfl_secure"


def test_every_purpose_has_its_own_value_and_a_fixed_number_of_further_words():
    values = [int(p) for p in PublicStream]
    assert len(values) == len(set(values)) and set(PUBLIC_WORDS) == set(PublicStream)


def test_every_public_draw_in_the_package_names_its_purpose():
    calls = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "func", None) and getattr(node.func, "id", getattr(node.func, "attr", None))
            if isinstance(node, ast.Call) and name == "public_rng":
                purpose = node.args[1] if len(node.args) > 1 else None
                named = isinstance(purpose, ast.Attribute) and getattr(purpose.value, "id", "") == "PublicStream"
                calls.append((path.name, node.lineno, named))
    assert len(calls) >= 8 and all(named for *_, named in calls), [c for c in calls if not c[2]]


def first_draws(seed: int) -> dict[tuple, np.ndarray]:
    """The first numbers of every purpose with small further words (every use a purpose has in the code)."""
    out = {}
    for purpose in PublicStream:
        for more in itertools.product(range(3), repeat=PUBLIC_WORDS[purpose]):
            out[(purpose, *more)] = public_rng(seed, purpose, *more).integers(0, 2**62, size=4)
    return out


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_no_two_streams_draw_the_same_numbers(seed):
    draws = first_draws(seed)
    seen = {tuple(v.tolist()): k for k, v in draws.items()}
    assert len(seen) == len(draws)


def test_a_purpose_is_refused_with_the_wrong_number_of_words_or_as_a_bare_number():
    with pytest.raises(ValueError, match="further words"):
        public_rng(0, PublicStream.BATCH_ORDER, 1)
    with pytest.raises(ValueError, match="PublicStream"):
        public_rng(0, 1)


def test_the_first_batches_are_not_the_labeled_rows_under_mar1():
    cfg = make_config("digits", "quick", train_mechanism="mar1")
    _, train, _ = make_splits(cfg, ())
    labeled = set(np.flatnonzero(train.labeled).tolist())
    first = np.concatenate(epoch_batches(np.arange(train.n), 128, cfg.seed, Stage.PRETRAIN, 0))[:len(labeled)]
    overlap = len(labeled & set(first.tolist()))
    expected = len(labeled) ** 2 / train.n  # a shuffle independent of the labeled draw
    assert abs(overlap - expected) < 5 * np.sqrt(expected), (overlap, expected, len(labeled))
