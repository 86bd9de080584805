"""The AES-256-CTR streams behind the masks (`randomness.KeyStream`, `secure.masks`), in one process.

Independent truth: the keystream is AES-256-CTR of zeros from counter block 0, computed here with
`cryptography` directly and sliced at the stream's byte position; the zero share is the sum, in uint64
arithmetic (the ring Z_2^64 by definition), of + the keystreams of higher-ranked peers and - those of
lower-ranked ones, as the module docstring of `secure.masks` states. `_read_before` is `KeyStream.read` as it
was before `read_into` existed: the bytes at every position must not change.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.randomness import KeyStream
from falsevfl_secure.secure.masks import ZeroShares, zero_share

CHUNK = 1 << 18  # read_into's zero source: lengths around it cross the chunk boundary


def _aes_ctr(key: bytes, position: int, n: int) -> bytes:
    """Bytes position..position+n of AES-256-CTR(key) from counter 0."""
    return Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(position + n))[position:]


def _read_before(key: bytes, position: int, n: int) -> bytes:
    """The previous `KeyStream.read`: encrypt whole counter blocks of zeros, slice."""
    block, offset = divmod(position, 16)
    encryptor = Cipher(algorithms.AES(key), modes.CTR(block.to_bytes(16, "big"))).encryptor()
    return encryptor.update(bytes(math.ceil((offset + n) / 16) * 16))[offset:offset + n]


def _reference_share(rank: int, keys: dict[int, bytes], position: int, n: int) -> np.ndarray:
    """The zero share of `n` elements from byte `position` of every pair stream, in uint64 arithmetic."""
    total = np.zeros(n, dtype=np.uint64)
    for peer, key in keys.items():
        draw = np.frombuffer(_aes_ctr(key, position, 8 * n), dtype=np.uint64)
        total = total + draw if peer > rank else total - draw
    return total.view(np.int64)


@settings(max_examples=40, deadline=None)
@given(key=st.binary(min_size=32, max_size=32), position=st.integers(0, 5000),
       sizes=st.lists(st.sampled_from([0, 1, 7, 8, 15, 16, 17, 1000, CHUNK - 3, CHUNK, CHUNK + 9]), max_size=4))
def test_read_into_writes_the_bytes_read_gives_at_every_position(key: bytes, position: int, sizes: list[int]) -> None:
    into, reading = KeyStream(key, position), KeyStream(key, position)
    at = position
    for n in sizes:
        out = np.empty(n, dtype=np.uint8)
        into.read_into(out)
        assert out.tobytes() == reading.read(n) == _aes_ctr(key, at, n) == _read_before(key, at, n)
        at += n
        assert into.position == reading.position == at
    grid = np.empty((3, 5), dtype=np.int64)  # any C-contiguous buffer, any dtype
    into.read_into(grid)
    assert grid.tobytes() == _aes_ctr(key, at, 120) and into.position == at + 120
    ints = KeyStream(key, at).integers(15)
    assert ints.dtype == np.int64 and ints.tobytes() == grid.tobytes() and ints.flags.writeable


def test_read_into_refuses_a_buffer_it_cannot_fill_in_place() -> None:
    stream = KeyStream(bytes(32))
    for bad in (bytes(16), np.zeros((4, 4), dtype=np.int64)[:, 1]):
        with pytest.raises(ValueError, match="writable, C-contiguous"):
            stream.read_into(bad)
    assert stream.position == 0  # nothing consumed


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 8), data=st.data(), position=st.integers(0, 300), n=st.integers(0, 3000),
       scratch=st.sampled_from([None, 0, 1, 5000]))
def test_zero_share_is_the_signed_sum_of_the_pair_keystreams(k: int, data, position: int, n: int, scratch) -> None:
    rank = data.draw(st.integers(0, k - 1))
    keys = {peer: data.draw(st.binary(min_size=32, max_size=32)) for peer in range(k) if peer != rank}
    streams = {peer: KeyStream(key, position) for peer, key in keys.items()}
    buffer = None if scratch is None else np.full(scratch, 7, dtype=np.int64)
    share = zero_share(rank, streams, n, buffer)
    assert share.dtype.is_signed and share.numpy().dtype == np.int64
    assert np.array_equal(share.numpy(), _reference_share(rank, keys, position, n))
    assert all(s.position == position + 8 * n for s in streams.values())


@settings(max_examples=15, deadline=None)
@given(k=st.integers(2, 5), sizes=st.lists(st.integers(0, 2500), min_size=1, max_size=8),
       keys=st.lists(st.binary(min_size=32, max_size=32), min_size=10, max_size=10))
def test_zero_shares_drawn_ahead_are_the_stream_and_cancel_over_all_parties(k: int, sizes: list[int],
                                                                            keys: list[bytes]) -> None:
    """Uneven take() sizes: each party's takes, concatenated, are its zero share of the whole count (the
    draws ahead of need change nothing), and at every take the K shares add up to zero on the ring."""
    pair = {(a, b): keys[i] for i, (a, b) in enumerate((a, b) for a in range(k) for b in range(a + 1, k))}
    parties = [ZeroShares(r, {p: pair[min(r, p), max(r, p)] for p in range(k) if p != r}) for r in range(k)]
    try:
        taken = [[party.take(n).numpy() for n in sizes] for party in parties]
    finally:
        for party in parties:
            party.close()
    for rank, takes in enumerate(taken):
        keys_of = {p: pair[min(rank, p), max(rank, p)] for p in range(k) if p != rank}
        assert np.array_equal(np.concatenate(takes), _reference_share(rank, keys_of, 0, sum(sizes)))
    for j, n in enumerate(sizes):
        total = sum(takes[j].astype(np.uint64) for takes in taken)
        assert np.array_equal(total, np.zeros(n, dtype=np.uint64))
        assert n < 4 or any(takes[j].any() for takes in taken)  # the shares themselves are not zero


@pytest.mark.parametrize("point", [bytes(32), (1).to_bytes(32, "little")])  # low-order points of X25519
def test_a_low_order_x25519_key_is_refused_with_one_error(point: bytes) -> None:
    """A party that announces a low-order point (its exchange would give the all-zero secret) is refused with the
    protocol's message error, never a traceback from deep inside the crypto library."""
    from falsevfl_secure.secure.errors import SecureMessageError
    from falsevfl_secure.secure.masks import X25519Agreement

    mine = X25519Agreement()
    with pytest.raises(SecureMessageError, match="rank 1 is not a valid public key"):
        mine.pair_keys(0, [mine.public_key(), point], b"t" * 32, "secure-sum")
