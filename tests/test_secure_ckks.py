"""CKKS aggregation: an encrypted sum decrypts to exactly the sum of the addends' fixed-point values (every
value is rounded onto the 2^-16 grid before encryption and every decryption back onto it, so no CKKS noise
survives), for magnitudes up to the documented range, whether a ciphertext was encrypted at once or as a
pooled encryption of zero plus the values; pooled zeros are never used twice; the aggregator's public
context cannot decrypt, weak parameters are refused, and malformed, tampered, truncated, mismatched or
foreign messages are refused.

Independent truth: the sum of `round(x * 2^16) / 2^16` over the addends, computed in float64 here. The
decryption noise (~5e-9 at scale 2^40) is far below the quarter grid step (2^-18) that the decryption
checks, also with a value near the range in the same ciphertext (float64 decoding error grows with it).
A zero used twice is detected by the first coefficient of c_1, which adding a plaintext leaves unchanged
and which two fresh encryptions share with probability about 2^-60.
"""

from __future__ import annotations

import functools
import os
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import tenseal as ts
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.secure import ckks
from falsevfl_secure.secure.ckks_seal import load_ciphertext, save_ciphertext, seal_tools
from falsevfl_secure.secure.errors import SecureMessageError, SecureParameterError, SecureRangeError

PER = 8192  # values per ciphertext: 4,096 complex slots, two values each


@functools.cache
def _contexts() -> tuple[ts.Context, ts.Context, bytes]:
    """(active party's secret context, aggregator/party public context, the public bytes), made once."""
    secret = ckks.make_secret_context()
    public_bytes = ckks.public_context_bytes(secret)
    return secret, ckks.load_public_context(public_bytes), public_bytes


def _grid_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    return sum(torch.round(x.double() * 2**16) / 2**16 for x in xs)


@pytest.fixture(scope="module")
def pool():
    """One pool of the shared contexts for the module, its helper at normal priority (so that it makes
    zeros on a busy test host too)."""
    with ckks.ZeroPool(_contexts()[1], idle=False) as shared:
        yield shared


def _wait_ready(pool: ckks.ZeroPool, n: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(pool) < n:
        assert time.monotonic() < deadline, f"the helper made {len(pool)} of {n} zeros in {timeout_s:.0f} s"
        time.sleep(0.05)


def _c1_heads(message: bytes) -> list[int]:
    """The first coefficient of c_1 of every ciphertext of a message (adding a plaintext never changes c_1)."""
    ciphertexts, _ = ckks._load_message(_contexts()[1], message, 0)
    return [c.data(1) for c in ciphertexts]


# Sizes around the slot count: empty, one value, one ciphertext exactly, one more than a full one.
_SIZES = st.sampled_from([0, 1, 7, PER - 1, PER, PER + 1, 2 * PER]) | st.integers(0, 70)
_SHAPES = st.lists(st.lists(_SIZES, min_size=1, max_size=1) | st.lists(st.integers(0, 9), max_size=3),
                   min_size=1, max_size=3)


@settings(max_examples=15, deadline=None)
@given(k=st.integers(2, 6), shapes=_SHAPES, magnitude=st.sampled_from([1e-3, 1.0, 1e3, 1e6, "range"]),
       pooled=st.booleans(), seed=st.integers(0, 2**16))
def test_a_sum_of_k_messages_of_several_tensors_is_the_exact_sum_of_grid_values(pool, k: int, shapes, magnitude,
                                                                                  pooled: bool, seed: int) -> None:
    secret, public, _ = _contexts()
    g = torch.Generator().manual_seed(seed)
    scale = 0.999 * ckks.max_safe_abs(public, k) if magnitude == "range" else magnitude
    messages = [[(torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * scale for shape in shapes]
                for _ in range(k)]
    if messages[0][0].numel():
        messages[0][0].view(-1)[-1] = 1e-3  # a small value beside large ones in the same ciphertext
    sent = [ckks.encrypt_tensors(public, tensors, n_addends=k, zeros=pool if pooled else None) for tensors in messages]
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


def test_a_message_packs_its_tensors_densely_into_ceil_total_over_slots_ciphertexts(pool) -> None:
    secret, public, _ = _contexts()
    assert ckks.values_per_ciphertext(public) == PER == 2 * ckks.slot_count(public)
    for sizes in ([1], [PER], [PER + 1], [PER // 2, PER // 2], [PER // 2, PER // 2 + 1],
                  [3, 5, 2 * PER], [], [0, 0]):
        tensors = [torch.linspace(-5, 5, n, dtype=torch.float64) for n in sizes]
        for zeros in (None, pool):
            message = ckks.encrypt_tensors(public, tensors, zeros=zeros)
            count = ckks.n_chunks(sum(sizes), PER)
            assert struct.unpack_from(">4sBQI", message) == (b"FVCT", 3, sum(sizes), count)
            assert len(_c1_heads(message)) == count
            assert all(torch.equal(a, _grid_sum([t])) for a, t in zip(
                ckks.decrypt_tensors(secret, message, [(n,) for n in sizes]), tensors, strict=True))
    # Two half-full tensors share one ciphertext.
    halves = [torch.ones(PER // 2), torch.ones(PER // 2)]
    assert len(ckks.encrypt_tensors(public, halves)) < 0.6 * 2 * len(ckks.encrypt_tensors(public, halves[:1]))


# ----------------------------------------------------------------------------------------------
# Pooled encryptions of zero: made ahead, each used once


def test_the_helper_keeps_depth_times_the_largest_demand_ready_and_the_rest_is_encrypted_at_once() -> None:
    secret, public, _ = _contexts()
    with ckks.ZeroPool(public, depth=2, idle=False) as fresh:
        assert len(fresh) == 0 and fresh.capacity == 0  # no demand yet: nothing is made ahead
        assert len(fresh.take(2)) == 2 and fresh.capacity == 4 and (fresh.taken_ahead, fresh.taken_now) == (0, 2)
        _wait_ready(fresh, 4)
        time.sleep(1.0)
        assert len(fresh) == 4  # and no more: the helper blocks once the pipe is full
        assert len(fresh.take(3)) == 3 and (fresh.taken_ahead, fresh.taken_now) == (3, 2) and fresh.capacity == 6
        message = ckks.encrypt_tensors(public, [torch.arange(3 * PER, dtype=torch.float64)], zeros=fresh)
        assert fresh.taken_ahead + fresh.taken_now == 8
        assert torch.equal(ckks.decrypt_tensors(secret, message, [(3 * PER,)])[0], torch.arange(3.0 * PER))


def test_the_helper_runs_at_idle_priority_and_ends_with_its_pool_or_its_party() -> None:
    _, public, public_bytes = _contexts()
    with ckks.ZeroPool(public) as idle:
        helper = idle._maker._process
        if hasattr(os, "sched_getscheduler"):
            assert os.sched_getscheduler(helper.pid) == os.SCHED_IDLE
    assert helper.poll() is not None  # closed with its pool
    # A party that ends without closing its pool (a crash): its helper's next write fails and it ends.
    party = subprocess.run([sys.executable, "-c", _ABANDON], input=public_bytes, capture_output=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    pid = int(party.stdout.split()[-1])
    deadline = time.monotonic() + 60
    while _alive(pid):
        assert time.monotonic() < deadline, "the helper outlived its party by 60 s"
        time.sleep(0.1)


_ABANDON = """
import os, sys, time
from falsevfl_secure.secure import ckks
from falsevfl_secure.secure.ckks_seal import load_ciphertext, save_ciphertext, seal_tools
pool = ckks.ZeroPool(ckks.load_public_context(sys.stdin.buffer.read()), idle=False)
pool.take(1)
time.sleep(1)
print(pool._maker._process.pid, flush=True)
os._exit(0)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_pool_whose_helper_died_encrypts_at_once() -> None:
    secret, public, _ = _contexts()
    with ckks.ZeroPool(public, idle=False) as orphan:
        orphan._maker._process.kill()
        orphan._maker._process.wait()
        message = ckks.encrypt_tensors(public, [torch.ones(PER + 1)], zeros=orphan)
        assert (orphan.taken_ahead, orphan.taken_now) == (0, 2)
        got = ckks.decrypt_tensors(secret, message, [(PER + 1,)])[0]
        assert torch.equal(got, torch.ones(PER + 1, dtype=torch.float64))


@settings(max_examples=5, deadline=None)
@given(sizes=st.lists(st.sampled_from([1, PER, PER + 1, 3 * PER]), min_size=2, max_size=5),
       wait_between=st.booleans())
def test_no_pooled_zero_is_ever_used_twice(pool, sizes: list[int], wait_between: bool) -> None:
    """Across the messages of one pool (its helper's zeros, or zeros encrypted at once), every ciphertext
    has its own c_1, and no zero object is handed out twice."""
    _, public, _ = _contexts()
    heads, handed, kept = [], set(), []
    original_take = pool.take

    def take(n: int) -> list:
        zeros = original_take(n)
        assert not handed & {id(z) for z in zeros}
        handed.update(id(z) for z in zeros)
        kept.extend(zeros)  # kept alive, so an id cannot be recycled
        return zeros

    pool.take = take
    try:
        for n in sizes:
            heads += _c1_heads(ckks.encrypt_tensors(public, [torch.ones(n)], zeros=pool))
            if wait_between:
                _wait_ready(pool, 1)
    finally:
        del pool.take
    assert len(heads) == sum(ckks.n_chunks(n, PER) for n in sizes)
    assert len(set(heads)) == len(heads)


def test_the_reuse_check_catches_a_zero_used_twice() -> None:
    """The check above is not vacuous: a pool that hands out copies of one zero fails it."""
    _, public, _ = _contexts()

    class Reusing(ckks.ZeroPool):
        def take(self, n: int) -> list:
            self._one = getattr(self, "_one", None) or save_ciphertext(self._tools.zero())
            return [_parsed(self._one) for _ in range(n)]  # copies of one zero

    with Reusing(public, idle=False) as reusing:
        heads = _c1_heads(ckks.encrypt_tensors(public, [torch.ones(5)], zeros=reusing))
        heads += _c1_heads(ckks.encrypt_tensors(public, [torch.arange(9.0)], zeros=reusing))
    assert len(set(heads)) == 1 < len(heads)


def _parsed(data: bytes) -> ts.sealapi.Ciphertext:
    return load_ciphertext(seal_tools(_contexts()[1]), data)


def test_a_pool_of_another_context_is_refused(refused) -> None:
    _, public, public_bytes = _contexts()
    with ckks.ZeroPool(ckks.load_public_context(public_bytes), idle=False) as other:
        with pytest.raises(SecureParameterError, match="another CKKS context"):
            ckks.encrypt_tensors(public, [torch.ones(3)], zeros=other)
    refused("ckks parameters")


# ----------------------------------------------------------------------------------------------
# Keys and parameters


def test_public_context_has_no_secret_key_and_cannot_decrypt() -> None:
    secret, public, public_bytes = _contexts()
    assert secret.has_secret_key() and not public.has_secret_key()
    assert not public.has_galois_keys() and not public.has_relin_keys()
    assert len(public_bytes) < 1_000_000  # with Galois keys it would be ~35 MB
    message = ckks.encrypt_tensors(public, [torch.tensor([1.5, -2.0])])
    with pytest.raises(SecureParameterError, match="no secret key"):
        ckks.decrypt_tensors(public, message, [(2,)])
    # Not just our check: the public context holds no secret key to decrypt with.
    with pytest.raises(ValueError, match="Secret key"):
        public.secret_key()
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


# ----------------------------------------------------------------------------------------------
# Refused messages


@settings(max_examples=12, deadline=None)
@given(position=st.integers(0, 10**9), flip=st.integers(1, 255), keep=st.integers(0, 10**9),
       sizes=st.sampled_from([[10, 4], [PER], [PER, 1]]))
def test_a_tampered_or_truncated_message_is_refused(pool, position: int, flip: int, keep: int, sizes,
                                                    refused) -> None:
    secret, public, _ = _contexts()
    tensors = [torch.arange(n, dtype=torch.float64) for n in sizes]
    message = ckks.encrypt_tensors(public, tensors, zeros=pool)
    shapes = [(n,) for n in sizes]
    data = bytearray(message)
    data[position % len(data)] ^= flip
    for bad in (bytes(data), message[: keep % len(message)], message + bytes([flip])):
        with pytest.raises(SecureMessageError):
            ckks.decrypt_tensors(secret, bad, shapes)
        refused("ciphertext (tampered)")
        with pytest.raises(SecureMessageError):
            ckks.sum_encrypted(public, [message, bad])
        refused("ciphertext (tampered)")


def test_mismatched_forged_or_foreign_messages_are_refused(refused) -> None:
    secret, public, _ = _contexts()
    five, six = ckks.encrypt_tensors(public, [torch.ones(5)]), ckks.encrypt_tensors(public, [torch.ones(6)])
    one = save_ciphertext(ckks._load_message(public, five, 0)[0][0])
    zero = seal_tools(public).zero()
    zero.scale = 2.0**20  # a valid ciphertext at another scale
    scaled = save_ciphertext(zero)
    cases = [
        (lambda: ckks.decrypt_tensors(secret, five, [(6,)]), "holds 5 values, shapes \\[\\(6,\\)\\] need 6"),
        (lambda: ckks.decrypt_tensors(secret, five, [(2,), (2,)]), "need 4"),
        (lambda: ckks.sum_encrypted(public, [five, six]), "contribution 1 holds 6 values, the first holds 5"),
        (lambda: ckks.sum_encrypted(public, [five, five[:40]]), "contribution 1: truncated"),
        (lambda: ckks.sum_encrypted(public, [five, [five]]), "contribution 1: expected bytes"),
        (lambda: ckks.sum_encrypted(public, []), "no encrypted contributions"),
        (lambda: ckks.decrypt_tensors(secret, b"FVCK" + five[4:], [(5,)]), "bad magic"),
        (lambda: ckks.decrypt_tensors(secret, five[:4] + b"\x02" + five[5:], [(5,)]), "bad magic/version"),
        (lambda: ckks.decrypt_tensors(secret, ckks._pack(5, [b"\x01" * ckks.min_ciphertext_bytes(public)]), [(5,)]),
         "not a valid CKKS message"),
        (lambda: ckks.decrypt_tensors(secret, ckks._pack(5, [b"\x01" * 500]), [(5,)]), "below the"),
        (lambda: ckks.decrypt_tensors(secret, ckks._pack(5 + PER, [one]), [(5 + PER,)]), "header says 1"),
        (lambda: ckks.decrypt_tensors(secret, ckks._pack(5, [one, one]), [(5,)]), "header says 2"),
        (lambda: ckks.decrypt_tensors(secret, ckks._pack(5, [scaled]), [(5,)]), "do not match"),
        (lambda: ckks.decrypt_tensors(secret, _huge_count(), [(5,)]), "its header alone needs"),
    ]
    other = ckks.make_secret_context(ckks.CkksParams(16384, (60, 60)))  # other parameters: a foreign message
    cases.append((lambda: ckks.sum_encrypted(public, [five, ckks.encrypt_tensors(other, [torch.ones(5)])]),
                  "contribution 1: (not a valid CKKS message|ciphertexts do not match|header says)"))
    for call, message in cases:
        with pytest.raises(SecureMessageError, match=message):
            call()
        refused("ciphertext (mismatched)")
    with pytest.raises(SecureParameterError, match="no secret key"):
        ckks.decrypt_tensors(public, five, [(5,)])
    refused("ciphertext (mismatched)")


def _zeroed(ctx: ts.Context) -> bytes:
    """A valid ciphertext whose coefficients are all zero, as SEAL serialises it (compressed: about 111 bytes
    that load as 2 N coefficients per prime, 256 KiB here)."""
    ciphertext = seal_tools(ctx).zero()
    coefficients = ciphertext.dyn_array()
    size = coefficients.size()
    coefficients.resize(0, False)
    coefficients.resize(size, True)
    return save_ciphertext(ciphertext)


def _raw_bytes(ctx: ts.Context) -> int:
    """The memory a loaded fresh ciphertext holds: 2 polynomials of N coefficients per data prime, 8 bytes each."""
    primes = ctx.seal_context().data.first_context_data().parms().coeff_modulus()
    return 2 * PER * 8 * len(primes)  # N = PER here


def test_a_message_cannot_make_its_receiver_hold_far_more_than_its_bytes(monkeypatch) -> None:
    """The attack: a party packs compressed all-zero ciphertexts, each a hundred bytes on the wire and 256 KiB
    once loaded, into a message its round's byte bound admits, declaring as many values as they carry. Against
    a build without the floor the aggregator loads them all (memory ~2,000 times the message); the shipped one
    refuses every ciphertext below the entropy of a valid one before loading any, so what it loads is at most
    raw / floor (1.6) times the bytes it received, for honest messages of any size too."""
    secret, public, _ = _contexts()
    zeroed, honest = _zeroed(public), ckks.encrypt_tensors(public, [torch.ones(3)])
    forged = ckks._pack(40 * PER, [zeroed] * 40)  # 40 ciphertexts in about 5 KB
    assert len(forged) < ckks.message_bound(public, 1) / 40
    loaded = []
    spy = lambda tools, data: loaded.append(len(data)) or load_ciphertext(tools, data)  # noqa: E731
    monkeypatch.setattr(ckks, "load_ciphertext", spy)
    with monkeypatch.context() as weakened:
        weakened.setattr(ckks, "min_ciphertext_bytes", lambda ctx: 0)
        assert len(ckks._load_message(public, forged, 0)[0]) == 40  # the attack works without the floor
    loaded.clear()
    for call in (lambda: ckks.sum_encrypted(public, [forged, forged]),
                 lambda: ckks.decrypt_tensors(secret, forged, [(40 * PER,)])):
        with pytest.raises(SecureMessageError, match="below the"):
            call()
    with pytest.raises(SecureMessageError, match="the first holds 3"):  # headers first: the forged one never loads
        ckks.sum_encrypted(public, [honest, forged])
    assert loaded == []
    floor = ckks.min_ciphertext_bytes(public)
    assert _raw_bytes(public) / floor < 1.7 and len(zeroed) < floor / 1000


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([1, PER - 1, PER + 1, 3 * PER]), st.sampled_from([1e-3, 1.0, 1e6]), st.booleans())
def test_every_honest_ciphertext_is_above_the_floor(numel, magnitude, summed) -> None:
    """No valid message is refused by the floor: fresh encryptions and sums of them, of any size and magnitude."""
    secret, public, _ = _contexts()
    message = ckks.encrypt_tensors(public, [torch.full((numel,), magnitude)], n_addends=2)
    message = ckks.sum_encrypted(public, [message, message]) if summed else message
    lengths = ckks._header_of(memoryview(message), PER, "x")[1]
    assert min(lengths) >= ckks.min_ciphertext_bytes(public)
    assert ckks.decrypt_tensors(secret, message, [(numel,)])[0].shape == (numel,)


def _huge_count() -> bytes:
    """A header announcing 2^32 - 1 ciphertexts (and values to match) on a few bytes: refused before any
    allocation of that size."""
    count = 2**32 - 1
    return struct.pack(">4sBQI", b"FVCT", 3, count * PER, count) + bytes(64)


def test_a_decryption_off_the_grid_is_refused(refused) -> None:
    """What the rounding guards against: a sum that is not a sum of grid values (here a raw CKKS vector),
    and padding that does not decrypt to zero."""
    secret, public, _ = _contexts()
    seal, row = seal_tools(public), np.zeros(PER)
    row[1] = 0.5 + 2.0**-17  # not a grid value (an imaginary part): as if someone encrypted without rounding
    off_grid = ckks._pack(2, [save_ciphertext(seal.encrypt(row))])
    with pytest.raises(SecureRangeError, match="from the fixed-point grid"):
        ckks.decrypt_tensors(secret, off_grid, [(2,)])
    refused("value beyond range (ckks)")
    row[1], row[2] = 0.5, -1.0  # a grid value, and a padding value (a real part) that is not zero
    padded = ckks._pack(2, [save_ciphertext(seal.encrypt(row))])
    with pytest.raises(SecureMessageError, match="padding"):
        ckks.decrypt_tensors(secret, padded, [(2,)])
    refused("ciphertext (forged)")
    row[2] = 0.0
    exact = ckks._pack(2, [save_ciphertext(seal.encrypt(row))])
    assert torch.equal(ckks.decrypt_tensors(secret, exact, [(2,)])[0], torch.tensor([0.0, 0.5], dtype=torch.float64))


@pytest.mark.parametrize("build", ["weakened: decryption not rounded", "shipped"])
def test_no_decryption_noise_leaves_the_active_party(build, pool, attacked) -> None:
    """aggregator_he.toml (Li and Micciancio 2021: the decryption noise of a CKKS ciphertext gives away the
    secret key). Whoever sees a revealed sum and knows its addends' grid values (a coalition of every other
    party, the worst case) subtracts them and keeps the noise: it reads the noise of every value where the
    decryption is not rounded, and exactly nothing from the shipped one."""
    secret, public, _ = _contexts()
    seal = seal_tools(secret)

    def revealed(message: bytes) -> torch.Tensor:  # the weakened build releases the raw decryption
        if build == "shipped":
            return ckks.decrypt_tensors(secret, message, [(300,)])[0]
        ciphertexts, _ = ckks._load_message(secret, message, 0)
        return torch.from_numpy(np.concatenate([seal.decrypt(c) for c in ciphertexts])[:300])

    noisy, largest = 0, 0.0
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)  # test inputs only
        parts = [torch.randn(300, generator=g, dtype=torch.float64) * 10 ** seed for _ in range(3)]
        message = ckks.sum_encrypted(public, [ckks.encrypt_tensors(public, [x], n_addends=3, zeros=pool)
                                              for x in parts])
        noise = revealed(message) - _grid_sum(parts)  # what the coalition subtracts it from
        noisy += int((noise != 0).sum())
        largest = max(largest, float(noise.abs().max()))
    attacked("CKKS decryption noise (he)", build, f"{noisy} of 1200 values carry noise (largest {largest:.2g})")
    if build.startswith("weakened"):
        assert noisy > 1000 and 0 < largest < 2.0**-17  # the noise itself, below half a grid step
    else:
        assert noisy == 0


def test_non_finite_or_wrapping_values_are_refused(pool, refused) -> None:
    _, public, _ = _contexts()
    limit = ckks.max_safe_abs(public, n_addends=8)
    assert limit == ckks.SUM_RANGE / 8 == 2.0**27  # the documented range of a sum, shared by 8 addends
    taken = pool.taken_ahead + pool.taken_now
    ckks.encrypt_tensors(public, [torch.zeros(3), torch.tensor([limit * 0.999])], n_addends=8, zeros=pool)
    for bad, message in ((torch.tensor([limit * 1.01]), "tensor 1 of 2: .*8 addend"),
                         (torch.tensor([float("nan")]), "tensor 1 of 2: .*NaN/inf"),
                         (torch.tensor([0.0, float("inf")]), "tensor 1 of 2: .*NaN/inf")):
        with pytest.raises(SecureRangeError, match=message):
            ckks.encrypt_tensors(public, [torch.zeros(3), bad], n_addends=8, zeros=pool)
        refused("value beyond range (ckks)")
    assert pool.taken_ahead + pool.taken_now == taken + 1  # a refused input took no zero
    with pytest.raises(TypeError, match="tensor 0: expected a torch.Tensor"):
        ckks.encrypt_tensors(public, [[1.0]])
    # A single 60-bit data prime leaves 2^18 above the scale: such a context carries less.
    small = ckks.make_secret_context(ckks.CkksParams(8192, (60, 60)))
    assert ckks.max_safe_abs(small, 8) == 2.0**18 / 8


def test_a_published_context_with_galois_or_relinearisation_keys_is_refused() -> None:
    """Review finding: a context carrying them (16 MB; nothing here needs them to add) loaded; the documented
    public context holds the parameters and the public key only."""
    secret, _, public_bytes = _contexts()
    other = ckks.make_secret_context()
    other.generate_galois_keys()
    for galois, relin in ((True, False), (False, True)):
        data = other.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=galois,
                               save_relin_keys=relin)
        with pytest.raises(SecureMessageError, match="Galois or relinearisation keys"):
            ckks.load_public_context(data)
    assert not ckks.load_public_context(public_bytes).has_galois_keys()
