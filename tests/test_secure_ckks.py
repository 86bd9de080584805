"""CKKS aggregation: an encrypted sum decrypts to exactly the sum of the addends' fixed-point values (every
value is rounded onto the 2^-16 grid before encryption and every decryption back onto it, so no CKKS noise
survives), for magnitudes up to the documented range; the aggregator's public context cannot decrypt, weak
parameters are refused, and malformed, tampered, truncated or mismatched ciphertexts are refused.

Independent truth: the sum of `round(x * 2^16) / 2^16` over the addends, computed in float64 here. The
decryption noise (~5e-9 at scale 2^40) is far below the quarter grid step (2^-18) that the decryption
checks, also with a value near the range in the same ciphertext (float64 decoding error grows with it).
"""

from __future__ import annotations

import functools
import math

import pytest
import tenseal as ts
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.secure import ckks
from falsevfl_secure.secure.errors import SecureMessageError, SecureParameterError, SecureRangeError


@functools.cache
def _contexts() -> tuple[ts.Context, ts.Context, bytes]:
    """(active party's secret context, aggregator/party public context, the public bytes), made once."""
    secret = ckks.make_secret_context()
    public_bytes = ckks.public_context_bytes(secret)
    return secret, ckks.load_public_context(public_bytes), public_bytes


def _grid_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    return sum(torch.round(x.double() * 2**16) / 2**16 for x in xs)


@settings(max_examples=12, deadline=None)
@given(
    k=st.integers(2, 8),
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    magnitude=st.sampled_from([1e-3, 1.0, 1e3, 1e6, "range"]),
    seed=st.integers(0, 2**16),
)
def test_sum_of_k_encrypted_tensors_is_the_exact_sum_of_grid_values(k: int, shape: list[int], magnitude,
                                                                     seed: int) -> None:
    secret, public, _ = _contexts()
    g = torch.Generator().manual_seed(seed)
    scale = 0.999 * ckks.max_safe_abs(public, k) if magnitude == "range" else magnitude
    xs = [(torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * scale for _ in range(k)]
    xs[0].view(-1)[-1] = 1e-3  # a small value beside large ones in the same ciphertext
    parts = [ckks.encrypt_tensor(public, x, n_addends=k) for x in xs]
    got = ckks.decrypt_tensor(secret, ckks.sum_encrypted(public, parts), shape)
    assert got.shape == tuple(shape) and got.dtype == torch.float64
    assert torch.equal(got, _grid_sum(xs))
    assert (got - torch.stack(xs).sum(0)).abs().max() <= k * 2.0**-17  # within half a step per addend
    # Folding pairwise additions gives the same sum.
    folded = functools.reduce(lambda a, b: ckks.add_encrypted(public, a, b), parts)
    assert torch.equal(ckks.decrypt_tensor(secret, folded, shape), _grid_sum(xs))


def test_slot_packing_uses_ceil_numel_over_slots_ciphertexts() -> None:
    secret, public, _ = _contexts()
    slots = ckks.slot_count(public)
    assert slots == 4096
    for numel in (1, slots - 1, slots, slots + 1, 2 * slots + 1):
        x = torch.linspace(-5, 5, numel, dtype=torch.float64)
        chunks = ckks.encrypt_tensor(public, x)
        assert len(chunks) == math.ceil(numel / slots)
        assert torch.equal(ckks.decrypt_tensor(secret, chunks, (numel,)), _grid_sum([x]))
    empty = ckks.encrypt_tensor(public, torch.zeros(0, 3))
    assert len(empty) == 1 and ckks.decrypt_tensor(secret, empty, (0, 3)).shape == (0, 3)


def test_public_context_has_no_secret_key_and_cannot_decrypt() -> None:
    secret, public, public_bytes = _contexts()
    assert secret.has_secret_key() and not public.has_secret_key()
    assert not public.has_galois_keys() and not public.has_relin_keys()
    assert len(public_bytes) < 1_000_000  # with Galois keys it would be ~35 MB
    chunks = ckks.encrypt_tensor(public, torch.tensor([1.5, -2.0]))
    with pytest.raises(SecureParameterError, match="no secret key"):
        ckks.decrypt_tensor(public, chunks, (2,))
    # Not just our check: TenSEAL itself cannot decrypt with the public context.
    payload = chunks[0][49:]
    with pytest.raises(ValueError, match="secret"):
        ts.ckks_vector_from(public, payload).decrypt()
    # A party refuses a "public" context that carries the secret key.
    with pytest.raises(SecureMessageError, match="secret key"):
        ckks.load_public_context(secret.serialize(save_secret_key=True))
    with pytest.raises(SecureMessageError, match="not a valid TenSEAL context"):
        ckks.load_public_context(b"\x00" * 64)


@pytest.mark.parametrize(
    ("n", "bits"),
    [
        (4096, (60, 60, 60, 60)),
        (8192, (60, 60, 60, 60)),
        (2048, (30, 30)),
        (8192, (40, 40)),
        (1000, (60, 60)),
    ],
)
def test_weak_or_unworkable_parameters_are_refused(n: int, bits: tuple[int, ...], refused) -> None:
    params = ckks.CkksParams(n, bits)
    with pytest.raises(SecureParameterError):
        params.check_security()
    refused("ckks parameters")
    with pytest.raises(SecureParameterError):
        ckks.make_secret_context(params)
    refused("ckks parameters")


def test_default_and_boundary_parameters_are_accepted() -> None:
    ckks.CkksParams().check_security()
    ckks.CkksParams(4096, (60, 49)).check_security()  # exactly the 109-bit bound
    ckks.CkksParams(8192, (60, 40, 60)).check_security()
    assert ckks.CkksParams(8192, [60, 60]).coeff_mod_bit_sizes == (60, 60)


@settings(max_examples=10, deadline=None)
@given(position=st.integers(0, 10**9), flip=st.integers(1, 255))
def test_any_tampered_byte_is_refused(position: int, flip: int, refused) -> None:
    secret, public, _ = _contexts()
    chunks = ckks.encrypt_tensor(public, torch.arange(10, dtype=torch.float64))
    data = bytearray(chunks[0])
    data[position % len(data)] ^= flip
    tampered = [bytes(data)]
    with pytest.raises(SecureMessageError):
        ckks.decrypt_tensor(secret, tampered, (10,))
    refused("ciphertext (tampered)")
    with pytest.raises(SecureMessageError):
        ckks.add_encrypted(public, chunks, tampered)
    refused("ciphertext (tampered)")


@settings(max_examples=10, deadline=None)
@given(keep=st.integers(0, 10**9))
def test_truncated_ciphertext_is_refused(keep: int, refused) -> None:
    secret, public, _ = _contexts()
    chunk = ckks.encrypt_tensor(public, torch.ones(3))[0]
    with pytest.raises(SecureMessageError):
        ckks.decrypt_tensor(secret, [chunk[: keep % len(chunk)]], (3,))
    refused("ciphertext (truncated)")


def test_forged_frame_around_garbage_and_wrong_context_ciphertexts_are_refused(refused) -> None:
    import hashlib
    import struct

    secret, public, _ = _contexts()
    garbage = b"\x01" * 500
    header = struct.pack(">4sBIII32s", b"FVCK", 1, 0, 1, 3, hashlib.sha256(garbage).digest())
    with pytest.raises(SecureMessageError, match="not a valid CKKS ciphertext"):
        ckks.decrypt_tensor(secret, [header + garbage], (3,))
    refused("ciphertext (forged)")
    # A ciphertext under other parameters (N = 16384) does not belong to this context.
    other = ckks.make_secret_context(ckks.CkksParams(16384, (60, 60)))
    with pytest.raises(SecureMessageError):
        ckks.add_encrypted(
            public, ckks.encrypt_tensor(public, torch.ones(3)), ckks.encrypt_tensor(other, torch.ones(3))
        )
    refused("ciphertext (forged)")


def test_mismatched_chunk_counts_sizes_and_order_are_refused(refused) -> None:
    secret, public, _ = _contexts()
    slots = ckks.slot_count(public)
    two = ckks.encrypt_tensor(public, torch.ones(slots + 5))
    one = ckks.encrypt_tensor(public, torch.ones(5))
    with pytest.raises(SecureMessageError, match="chunks"):
        ckks.add_encrypted(public, two, one)
    refused("ciphertext (mismatched)")
    with pytest.raises(SecureMessageError, match="chunk counts"):
        ckks.sum_encrypted(public, [two, one])
    refused("ciphertext (mismatched)")
    with pytest.raises(SecureMessageError, match="needs 2 chunk"):
        ckks.decrypt_tensor(secret, two[:1], (slots + 5,))
    refused("ciphertext (mismatched)")
    with pytest.raises(SecureMessageError, match="header says chunk"):
        ckks.decrypt_tensor(secret, two[::-1], (slots + 5,))
    refused("ciphertext (mismatched)")
    with pytest.raises(SecureMessageError, match="holds 5 values"):
        ckks.decrypt_tensor(secret, one, (6,))
    refused("ciphertext (mismatched)")
    with pytest.raises(SecureMessageError, match="cannot add 5 values to 6"):
        ckks.add_encrypted(public, one, ckks.encrypt_tensor(public, torch.ones(6)))
    refused("ciphertext (mismatched)")
    with pytest.raises(SecureMessageError, match="no encrypted contributions"):
        ckks.sum_encrypted(public, [])
    refused("ciphertext (mismatched)")


def test_non_finite_or_wrapping_values_are_refused(refused) -> None:
    _, public, _ = _contexts()
    for bad in (float("nan"), float("inf")):
        with pytest.raises(SecureRangeError, match="NaN/inf"):
            ckks.encrypt_tensor(public, torch.tensor([0.0, bad]))
        refused("value beyond range (ckks)")
    limit = ckks.max_safe_abs(public, n_addends=8)
    assert limit == ckks.SUM_RANGE / 8 == 2.0**27  # the documented range of a sum, shared by 8 addends
    ckks.encrypt_tensor(public, torch.tensor([limit * 0.999]), n_addends=8)
    with pytest.raises(SecureRangeError, match="8 addend"):
        ckks.encrypt_tensor(public, torch.tensor([limit * 1.01]), n_addends=8)
    refused("value beyond range (ckks)")
    # A single 60-bit data prime leaves 2^18 above the scale: such a context carries less.
    small = ckks.make_secret_context(ckks.CkksParams(8192, (60, 60)))
    assert ckks.max_safe_abs(small, 8) == 2.0**18 / 8


def test_a_decryption_off_the_grid_is_refused(refused) -> None:
    """What the rounding guards against: a sum that is not a sum of grid values (here a raw CKKS vector)."""
    secret, public, _ = _contexts()
    chunk = ckks.encrypt_tensor(public, torch.tensor([0.5]))
    payload = ts.ckks_vector(public, [0.5 + 2.0**-17]).serialize()
    forged = ckks._frame(0, 1, 1, payload)
    assert torch.equal(ckks.decrypt_tensor(secret, chunk, (1,)), torch.tensor([0.5], dtype=torch.float64))
    with pytest.raises(SecureRangeError, match="from the fixed-point grid"):
        ckks.decrypt_tensor(secret, [forged], (1,))
    refused("value beyond range (ckks)")
