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
import hashlib
import math
import struct

import numpy as np
import pytest
import tenseal as ts
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.secure import ckks
from falsevfl_secure.secure.errors import SecureMessageError, SecureParameterError, SecureRangeError


@functools.cache
def _contexts(n_threads: int | None = None) -> tuple[ts.Context, ts.Context, bytes]:
    """(active party's secret context, aggregator/party public context, the public bytes), made once per
    thread count (the same keys: the secret context is made once and reloaded with other thread counts)."""
    if n_threads is not None:
        secret, _, public_bytes = _contexts()
        again = ts.context_from(secret.serialize(save_secret_key=True), n_threads=n_threads)
        return again, ckks.load_public_context(public_bytes, n_threads=n_threads), public_bytes
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


# ----------------------------------------------------------------------------------------------
# Messages of several tensors, densely packed (encrypt_tensors / sum_encrypted / decrypt_tensors)

_SHAPES = st.lists(st.lists(st.integers(0, 70), min_size=0, max_size=3), min_size=1, max_size=4)


@settings(max_examples=12, deadline=None)
@given(k=st.integers(2, 8), shapes=_SHAPES, magnitude=st.sampled_from([1e-3, 1.0, 1e3, 1e6, "range"]),
       n_threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_a_sum_of_k_messages_of_several_tensors_is_the_exact_sum_of_grid_values(k: int, shapes, magnitude,
                                                                                  n_threads: int, seed: int) -> None:
    secret, public, _ = _contexts(n_threads)
    g = torch.Generator().manual_seed(seed)
    scale = 0.999 * ckks.max_safe_abs(public, k) if magnitude == "range" else magnitude
    messages = [[(torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * scale for shape in shapes]
                for _ in range(k)]
    if messages[0][0].numel():
        messages[0][0].view(-1)[-1] = 1e-3  # a small value beside large ones in the same ciphertext
    sent = [ckks.encrypt_tensors(public, tensors, n_addends=k) for tensors in messages]
    got = ckks.decrypt_tensors(secret, ckks.sum_encrypted(public, sent), shapes)
    for i, shape in enumerate(shapes):
        truth = _grid_sum([tensors[i] for tensors in messages])
        assert got[i].shape == tuple(shape) and got[i].dtype == torch.float64
        assert torch.equal(got[i], truth)
        if truth.numel():
            assert (got[i] - sum(tensors[i] for tensors in messages)).abs().max() <= k * 2.0**-17
    # One contribution alone decrypts to its own grid values (what the active party + aggregator could see).
    alone = ckks.decrypt_tensors(secret, sent[0], shapes)
    assert all(torch.equal(a, _grid_sum([t])) for a, t in zip(alone, messages[0], strict=True))


def test_a_message_packs_its_tensors_densely_into_ceil_total_over_slots_ciphertexts() -> None:
    secret, public, _ = _contexts()
    slots = ckks.slot_count(public)
    for sizes in ([1], [slots], [slots + 1], [slots // 2, slots // 2], [slots // 2, slots // 2 + 1], [3, 5, 2 * slots],
                  [], [0, 0]):
        tensors = [torch.linspace(-5, 5, n, dtype=torch.float64) for n in sizes]
        message = ckks.encrypt_tensors(public, tensors)
        count = ckks.n_chunks(sum(sizes), slots)
        assert struct.unpack_from(">4sBQI", message) == (b"FVCT", 2, sum(sizes), count)
        assert len(ts.ckks_tensor_from(public, message[49:]).ciphertext()) == count
        assert all(torch.equal(a, _grid_sum([t])) for a, t in zip(
            ckks.decrypt_tensors(secret, message, [(n,) for n in sizes]), tensors, strict=True))
    # Two half-full tensors share one ciphertext where the per-tensor format needs one each.
    halves = [torch.ones(slots // 2), torch.ones(slots // 2)]
    assert len(ckks.encrypt_tensors(public, halves)) < 0.6 * sum(len(b"".join(ckks.encrypt_tensor(public, h)))
                                                                  for h in halves)


@settings(max_examples=10, deadline=None)
@given(position=st.integers(0, 10**9), flip=st.integers(1, 255), keep=st.integers(0, 10**9))
def test_a_tampered_or_truncated_message_is_refused(position: int, flip: int, keep: int, refused) -> None:
    secret, public, _ = _contexts()
    message = ckks.encrypt_tensors(public, [torch.arange(10, dtype=torch.float64), torch.ones(2, 2)])
    shapes = [(10,), (2, 2)]
    data = bytearray(message)
    data[position % len(data)] ^= flip
    for bad in (bytes(data), message[: keep % len(message)]):
        with pytest.raises(SecureMessageError):
            ckks.decrypt_tensors(secret, bad, shapes)
        refused("ciphertext (tampered)")
        with pytest.raises(SecureMessageError):
            ckks.sum_encrypted(public, [message, bad])
        refused("ciphertext (tampered)")


def test_mismatched_forged_or_foreign_messages_are_refused(refused) -> None:
    secret, public, _ = _contexts()
    slots = ckks.slot_count(public)
    five, six = ckks.encrypt_tensors(public, [torch.ones(5)]), ckks.encrypt_tensors(public, [torch.ones(6)])
    cases = [
        (lambda: ckks.decrypt_tensors(secret, five, [(6,)]), "holds 5 values, shapes \\[\\(6,\\)\\] need 6"),
        (lambda: ckks.decrypt_tensors(secret, five, [(2,), (2,)]), "need 4"),
        (lambda: ckks.sum_encrypted(public, [five, six]), "contribution 1 holds 6 values, the first holds 5"),
        (lambda: ckks.sum_encrypted(public, [five, ckks.encrypt_tensor(public, torch.ones(5))]), "cannot sum"),
        (lambda: ckks.sum_encrypted(public, [five, five[:40]]), "contribution 1: truncated"),
        (lambda: ckks.decrypt_tensors(secret, ckks.encrypt_tensor(public, torch.ones(5))[0], [(5,)]), "bad magic"),
        (lambda: ckks.decrypt_tensors(secret, _forged(b"\x01" * 500, 5, 1), [(5,)]), "not a valid CKKS message"),
        (lambda: ckks.decrypt_tensors(secret, _forged(five[49:], 5 + slots, 1), [(5 + slots,)]), "header says 1"),
        (lambda: ckks.decrypt_tensors(secret, _forged(five[49:], 5 + slots, 2), [(5 + slots,)]), "do not match"),
    ]
    other = ckks.make_secret_context(ckks.CkksParams(16384, (60, 60)))  # other parameters: a foreign message
    cases.append((lambda: ckks.sum_encrypted(public, [five, ckks.encrypt_tensors(other, [torch.ones(5)])]),
                  "contribution 1: (not a valid CKKS message|ciphertexts do not match)"))
    for call, message in cases:
        with pytest.raises(SecureMessageError, match=message):
            call()
        refused("ciphertext (mismatched)")
    with pytest.raises(SecureParameterError, match="no secret key"):
        ckks.decrypt_tensors(public, five, [(5,)])
    refused("ciphertext (mismatched)")


def _forged(payload: bytes, n_values: int, count: int) -> bytes:
    """A message header with a correct digest around any payload (what the digest alone cannot refuse)."""
    return struct.pack(">4sBQI32s", b"FVCT", 2, n_values, count, hashlib.sha256(payload).digest()) + payload


def test_off_grid_values_non_zero_padding_and_out_of_range_inputs_are_refused(refused) -> None:
    secret, public, _ = _contexts()
    slots = ckks.slot_count(public)
    column = np.zeros(slots)  # one ciphertext: a 1-D batched tensor, as encrypt_tensors makes it
    column[0] = 0.5 + 2.0**-17  # not a grid value: as if someone encrypted without rounding
    off_grid = _forged(ts.ckks_tensor(public, ts.plain_tensor(column), batch=True).serialize(), 1, 1)
    with pytest.raises(SecureRangeError, match="from the fixed-point grid"):
        ckks.decrypt_tensors(secret, off_grid, [(1,)])
    refused("value beyond range (ckks)")
    column[0], column[1] = 0.5, 1.0  # a grid value, and a padding slot that is not zero
    padded = _forged(ts.ckks_tensor(public, ts.plain_tensor(column), batch=True).serialize(), 1, 1)
    with pytest.raises(SecureMessageError, match="padding"):
        ckks.decrypt_tensors(secret, padded, [(1,)])
    refused("ciphertext (forged)")
    limit = ckks.max_safe_abs(public, n_addends=8)
    ckks.encrypt_tensors(public, [torch.zeros(3), torch.tensor([limit * 0.999])], n_addends=8)
    for bad, message in ((torch.tensor([limit * 1.01]), "tensor 1 of 2: .*8 addend"),
                         (torch.tensor([float("nan")]), "tensor 1 of 2: .*NaN/inf")):
        with pytest.raises(SecureRangeError, match=message):
            ckks.encrypt_tensors(public, [torch.zeros(3), bad], n_addends=8)
        refused("value beyond range (ckks)")
    with pytest.raises(TypeError, match="tensor 0: expected a torch.Tensor"):
        ckks.encrypt_tensors(public, [[1.0]])
    for bad_threads in (0, -1, 1.5):
        with pytest.raises(SecureParameterError, match="n_threads"):
            ckks.load_public_context(ckks.public_context_bytes(secret), n_threads=bad_threads)
        refused("ckks parameters")
