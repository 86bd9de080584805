"""CKKS (TenSEAL and its SEAL binding) for additive aggregation: parties encrypt, an aggregator adds, the
active party decrypts.

Roles:
* the active party makes the secret context (`make_secret_context`) and publishes
  `public_context_bytes` (public key only: no secret key, and no Galois or relinearisation keys because
  addition needs neither);
* passive parties load it (`load_public_context`, which re-checks the parameters' security: weak
  parameters would let the aggregator decrypt) and encrypt their contributions: `encrypt_tensors` packs
  every tensor of one message densely into as few ciphertexts as its values fill, optionally on
  encryptions of zero made ahead of need (`ZeroPool`);
* the aggregator, holding only the public context, adds contributions (`sum_encrypted`);
* the active party decrypts the sum (`decrypt_tensors`).

Packing. A CKKS plaintext of degree N holds N / 2 complex slots, and addition adds slot by slot, real
and imaginary parts independently. So a ciphertext carries N real values: values 2i and 2i + 1 of its
share of the message are the real and imaginary parts of slot i (TenSEAL's own vectors use the real
parts only, half the capacity; this module encodes and encrypts with SEAL's `CKKSEncoder`, `Encryptor`,
`Evaluator` and `Decryptor` through TenSEAL's binding, under the keys of the TenSEAL context).

Offline/online encryption. A CKKS public-key encryption of a plaintext m is an encryption of zero,
(c_0, c_1) = (p_0 u + e_0, p_1 u + e_1) with fresh u, e_0, e_1, plus m added into c_0 at m's scale: that
is how SEAL's `Encryptor::encrypt_internal` does it (native/src/seal/encryptor.cpp: `encrypt_zero_internal`,
then "The plaintext gets added into the c_0 term of ciphertext (c_0,c_1)", then the scale set to the
plaintext's), and `Evaluator::add_plain_inplace` adds a CKKS plaintext into c_0 the same way. So a fresh
`Encryptor::encrypt_zero` at the scale of the values plus the encoded values (`ZeroPool`,
`encrypt_tensors(..., zeros=pool)`) is exactly a fresh encryption of the values: the same key, the same
noise (so the bounds below are unchanged), the same security. Each zero must be used once: two
ciphertexts on one zero share c_1, and their difference is a noiseless encoding of the difference of
their values, which anybody decrypts with any key of these parameters. `ZeroPool.take` therefore hands
each zero out once and keeps no reference to it, and `encrypt_tensors` adds into it in place.

Threads. Everything runs on the calling thread: SEAL's calls through TenSEAL keep the GIL, so Python
threads cannot run two at once (contexts are made with a TenSEAL pool of one thread, which only its
batched tensors would use).

Exact sums, no decryption noise. CKKS decrypts to the plaintext plus noise that depends on the
parties' encryption randomness; whoever sees ciphertexts and exact decryptions can recover the secret
key (Li and Micciancio, EUROCRYPT 2021). So every value is put on the fixed-point grid of
`secure.fixed_point` (2^-16) before encryption, and every decryption is rounded back onto that grid
before any use: the sum of grid values is a grid value, the noise (about 2^-28 at scale 2^40 in each of
a slot's two parts, checked against a quarter of the grid step on every decryption) is removed
completely, and what the active party obtains is a deterministic function of the inputs -- the same
number the `mpc` protocol reveals.

Range. A plaintext's coefficients are at most the scale times the largest slot modulus, which is at most
sqrt(2) times the largest value (two values per slot). The default chain [60, 20, 60] at scale 2^40 has
80 data bits, so a sum may reach 2^38 before it wraps (2^38 sqrt(2) 2^40 < 2^79). Decoding in float64
loses accuracy as the largest slot of a ciphertext grows: measured with full ciphertexts of uniform
values, the largest error is 2^-20 at |values| < 2^30 (a quarter of the 2^-18 every decryption checks;
0.19 of it with real parts only) and doubles with every further bit. So the documented range of a sum is
SUM_RANGE = 2^30 and each of n addends is refused beyond SUM_RANGE / n (`sum_range`, `max_safe_abs`).

Wire format of one message (`encrypt_tensors`, format version 3), all integers big-endian: a 17-byte
header -- magic ``FVCT``, format version (uint8), number of values (uint64), number of ciphertexts c
(uint32) -- then c uint32 lengths, the SHA-256 of the header, the lengths and the ciphertexts, and the c
ciphertexts, each SEAL's serialised ``Ciphertext`` (two polynomials at the first data level, at the
context's scale): ciphertext j holds values j * N .. (j + 1) * N - 1 of the message (its tensors
flattened row-major and concatenated), the last one padded with zeros, which must decrypt to exactly zero.

CKKS ciphertexts are malleable and SEAL accepts most bit flips as another valid ciphertext, so the
digest is what turns a tampered or truncated message into a `SecureMessageError` instead of a silently
wrong sum. It is an integrity check against corruption, not a MAC (the threat models here are
semi-honest).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import tenseal as ts
import torch
from tenseal import sealapi

from .ckks_seal import load_ciphertext, save_ciphertext, seal_tools
from .errors import SecureMessageError, SecureParameterError, SecureRangeError
from .fixed_point import PRECISION_BITS, decode_fixed_point, encode_fixed_point
from .zero_maker import ZeroMaker

__all__ = [
    "MAX_MODULUS_BITS_128",
    "MESSAGE_MAGIC",
    "SUM_RANGE",
    "CkksParams",
    "ContributionError",
    "CountMismatch",
    "ZeroPool",
    "decrypt_tensors",
    "encrypt_tensors",
    "load_public_context",
    "make_secret_context",
    "max_safe_abs",
    "n_chunks",
    "params_of",
    "public_context_bytes",
    "slot_count",
    "sum_encrypted",
    "sum_range",
    "values_per_ciphertext",
]

#: HomomorphicEncryption.org security standard (2018), table 1: largest total coefficient-modulus bit
#: count for 128-bit classical security with uniform ternary secrets, per polynomial degree N.
MAX_MODULUS_BITS_128: dict[int, int] = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}

#: The documented range of one encrypted sum (see the module docstring).
SUM_RANGE = 2.0**30
#: A decryption farther than this from the grid means the noise budget was exceeded (it is ~2^-28).
_NOISE_BOUND = 2.0 ** -(PRECISION_BITS + 2)

#: What every message starts with (`audit` recognises ciphertext frames by it).
MESSAGE_MAGIC = b"FVCT"
_MAGIC, _VERSION = MESSAGE_MAGIC, 3
_HEADER = struct.Struct(">4sBQI")  # magic, version, n_values, n_ciphertexts
_LENGTH = struct.Struct(">I")  # one per ciphertext: its serialised bytes
_DIGEST_BYTES = 32  # SHA-256 of the header, the lengths and the ciphertexts


@dataclass(frozen=True)
class CkksParams:
    """CKKS parameters for addition-only aggregation.

    Default N = 8192 with a [60, 20, 60] chain: 80 data bits plus the 60-bit special prime (140 bits,
    under the 218-bit bound for 128-bit security), scale 2^40. Addition never rescales, so no level is
    consumed; the second data prime only widens the range (see the module docstring). Measured here: a
    ciphertext of 8,192 values (4,096 complex slots) is 187 kB (131 kB with a single 60-bit data prime,
    whose range of 2^18 could not carry the likelihood sums), encryption ~3 ms either way, decryption
    noise ~5e-9.
    """

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = field(default=(60, 20, 60))
    global_scale_bits: int = 40

    def __post_init__(self) -> None:
        object.__setattr__(self, "coeff_mod_bit_sizes", tuple(int(b) for b in self.coeff_mod_bit_sizes))

    @property
    def total_modulus_bits(self) -> int:
        return int(sum(self.coeff_mod_bit_sizes))

    @property
    def data_bits(self) -> int:
        """The bits of the data modulus: every prime but the last (the special prime)."""
        return int(sum(self.coeff_mod_bit_sizes[:-1]))

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2

    def check_security(self) -> None:
        """Refuse parameters below 128-bit security or that cannot hold a value at the chosen scale.

        Raises:
            SecureParameterError: unknown N, total modulus bits above the standard's bound, primes that
                SEAL cannot use, or a scale that leaves no room for values in the data primes.
        """
        bits = tuple(self.coeff_mod_bit_sizes)
        if len(bits) < 2 or any(not 17 <= b <= 60 for b in bits):
            raise SecureParameterError(
                f"coeff_mod_bit_sizes {list(bits)} must have >= 2 primes (data + special) of 17..60 bits each"
            )
        _check_modulus(self.poly_modulus_degree, self.total_modulus_bits, self.global_scale_bits, self.data_bits)


def make_secret_context(params: CkksParams | None = None) -> ts.Context:
    """The active party's CKKS context (holds the secret key). No Galois keys are generated."""
    params = CkksParams() if params is None else params
    params.check_security()
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, params.poly_modulus_degree,
                     coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes), n_threads=1)
    ctx.global_scale = 2.0**params.global_scale_bits
    return ctx


def public_context_bytes(ctx: ts.Context) -> bytes:
    """Serialise the public part of `ctx`: parameters + public key; no secret, Galois or relin keys."""
    return ctx.serialize(
        save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
    )


def load_public_context(data: bytes) -> ts.Context:
    """Load a context published by the active party, refusing one that carries the secret key or is weak.

    Raises:
        SecureMessageError: the bytes are not a TenSEAL context, or contain a secret key (sending it
            would let every receiver decrypt).
        SecureParameterError: the parameters are below 128-bit security.
    """
    try:
        ctx = ts.context_from(bytes(data), n_threads=1)
    except Exception as exc:  # TenSEAL raises ValueError/RuntimeError with protobuf/SEAL messages
        raise SecureMessageError(f"not a valid TenSEAL context ({len(data)} bytes): {exc}") from exc
    if ctx.has_secret_key():
        raise SecureMessageError("the published CKKS context contains the secret key; refusing it")
    if not ctx.has_public_key():
        raise SecureMessageError("the published CKKS context has no public key")
    if ctx.has_galois_keys() or ctx.has_relin_keys():  # none is needed to add; they only cost memory (16 MB)
        raise SecureMessageError("the published CKKS context carries Galois or relinearisation keys; refusing it")
    n, total_bits, data_bits, scale_bits = _modulus_of(ctx)
    _check_modulus(n, total_bits, scale_bits, data_bits)
    return ctx


def params_of(ctx: ts.Context) -> CkksParams:
    """The parameters a context was made with (N, every prime's bits, the scale), read from SEAL."""
    parms = ctx.seal_context().data.key_context_data().parms()
    bits = tuple(int(q.bit_count()) for q in parms.coeff_modulus())
    return CkksParams(int(parms.poly_modulus_degree()), bits, _modulus_of(ctx)[3])


def slot_count(ctx: ts.Context) -> int:
    """Number of complex slots of one ciphertext (N / 2)."""
    return _degree(ctx) // 2


def values_per_ciphertext(ctx: ts.Context) -> int:
    """Number of real values one ciphertext carries: two per slot (N)."""
    return _degree(ctx)


def message_bound(ctx: ts.Context, numel: int) -> int:
    """The most bytes an `encrypt_tensors` message of `numel` values can take: its header and digest, and per
    ciphertext two polynomials of N coefficients under every prime of the data modulus, 8 bytes each, plus
    SEAL's own header (serialization only compresses)."""
    degree = _degree(ctx)
    primes = len(ctx.seal_context().data.first_context_data().parms().coeff_modulus())
    per_ciphertext = 2 * degree * 8 * primes + 1024
    chunks = n_chunks(numel, values_per_ciphertext(ctx))
    return _HEADER.size + _DIGEST_BYTES + chunks * (_LENGTH.size + per_ciphertext)


def n_chunks(numel: int, per_ciphertext: int) -> int:
    """Ciphertexts needed for `numel` values: ceil(numel / per_ciphertext), and at least one."""
    return max(1, math.ceil(numel / per_ciphertext))


def max_safe_abs(ctx: ts.Context, n_addends: int = 1) -> float:
    """Largest |x| such that a sum of `n_addends` such values decrypts exactly under `ctx` (`sum_range`)."""
    _, _, data_bits, scale_bits = _modulus_of(ctx)
    return sum_range(data_bits, scale_bits) / n_addends


def sum_range(data_bits: int, scale_bits: int) -> float:
    """The range of one encrypted sum under a data modulus of `data_bits` bits at scale 2^`scale_bits`:
    SUM_RANGE, or less when the data modulus is smaller (|sum| * scale must stay under a quarter of it, so a
    slot of two such values, sqrt(2) |sum| at most, stays under half of it)."""
    return min(SUM_RANGE, 2.0 ** (data_bits - scale_bits - 2))


class ZeroPool:
    """Fresh public-key encryptions of zero under `context` (a passive party's public context), made ahead
    of need by a helper process on otherwise idle CPU (`secure.zero_maker`), so that encrypting a message
    online is only encoding its values and adding them (`encrypt_tensors`; see "Offline/online encryption"
    in the module docstring). When none is ready (the host is busy), `take` encrypts zeros at once.

    Single use: `take` removes the zeros it hands out, the pool keeps no other reference to them, and
    `encrypt_tensors` adds the message into each in place, so no zero can ever enter two ciphertexts (two
    ciphertexts on one zero differ by a noiseless encoding of the difference of their values). `capacity`
    is `depth` times the most zeros one `take` has asked for: what the helper keeps ready. `idle=False`
    runs the helper at normal priority (tests that need its zeros on a busy host). One owner; `close` it.
    """

    def __init__(self, context: ts.Context, depth: int = 3, idle: bool = True) -> None:
        self.context, self.depth, self.capacity = context, depth, 0
        self.taken_ahead = self.taken_now = 0  # zeros handed out from the helper / encrypted at once
        self._tools = seal_tools(context)
        self._maker = ZeroMaker(public_context_bytes(context), self._tools, idle)

    def __len__(self) -> int:
        return len(self._maker)

    def __enter__(self) -> ZeroPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def take(self, n: int) -> list[sealapi.Ciphertext]:
        """`n` encryptions of zero, each handed out once: the helper's first, the rest encrypted now."""
        if n > self.capacity // self.depth:
            self.capacity = self.depth * n
            self._maker.want(self.capacity)
        zeros = [self._maker.pop() for _ in range(n)]
        self.taken_ahead += sum(z is not None for z in zeros)
        self.taken_now += sum(z is None for z in zeros)
        return [zero if zero is not None else self._tools.zero() for zero in zeros]

    def close(self) -> None:
        self._maker.close()


def encrypt_tensors(ctx: ts.Context, tensors: Sequence[torch.Tensor], n_addends: int = 1,
                    zeros: ZeroPool | None = None) -> bytes:
    """Encrypt the tensors of one message, each value first rounded onto the fixed-point grid, densely packed
    into ceil(total values / N) CKKS ciphertexts (at least one), with an integrity header (see the module
    docstring). With `zeros` (a pool under `ctx`) each ciphertext is a pooled encryption of zero plus the
    encoded values (the same distribution as a fresh encryption); without, each is encrypted now. Decrypt
    with the same tensors' shapes, in the same order (`decrypt_tensors`).

    `n_addends` is how many such messages will be summed. Raises `SecureRangeError` for NaN/inf and for
    values beyond `max_safe_abs(ctx, n_addends)`, naming the tensor; `TypeError` for a non-tensor;
    `SecureParameterError` for a pool under another context.
    """
    flat, seal = _grid_values(ctx, tensors, n_addends), seal_tools(ctx)
    per = values_per_ciphertext(ctx)
    rows = np.zeros((n_chunks(flat.size, per), per))  # row j: the values of ciphertext j, zero-padded
    rows.reshape(-1)[: flat.size] = flat
    if zeros is None:
        ciphertexts = [seal.encrypt(row) for row in rows]
    else:
        if zeros.context is not ctx:
            raise SecureParameterError("the pool of encryptions of zero belongs to another CKKS context")
        ciphertexts = zeros.take(len(rows))
        for ciphertext, row in zip(ciphertexts, rows, strict=True):
            seal.add_values(ciphertext, row)  # into c_0 (see the module docstring)
    return _pack(flat.size, [save_ciphertext(ciphertext) for ciphertext in ciphertexts])


def _grid_values(ctx: ts.Context, tensors: Sequence[torch.Tensor], n_addends: int) -> np.ndarray:
    """The tensors' values, flattened row-major and concatenated, rounded onto the grid (float64), range-checked."""
    limit, parts = max_safe_abs(ctx, n_addends), []
    for i, t in enumerate(tensors):
        if not torch.is_tensor(t):
            raise TypeError(f"tensor {i}: expected a torch.Tensor, got {type(t).__name__}")
        try:
            parts.append(encode_fixed_point(t, n_addends=n_addends, limit=limit).reshape(-1))
        except SecureRangeError as exc:
            raise SecureRangeError(f"tensor {i} of {len(tensors)}: {exc}") from None
    return decode_fixed_point(torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)).numpy()


class ContributionError(SecureMessageError):
    """One contribution to a sum is malformed, tampered, truncated or foreign on its own: `index` is its place
    among the parts (the aggregator names its sender: it was named itself for the message)."""

    def __init__(self, text: str, index: int) -> None:
        super().__init__(text)
        self.index = index


class CountMismatch(SecureMessageError):
    """Well-formed contributions to one sum hold different numbers of values (`counts`, in the parts' order): which
    one is wrong, only a party that knows the sum's shape can tell (the active party)."""

    def __init__(self, text: str, counts: list[int]) -> None:
        super().__init__(text)
        self.counts = counts


def sum_encrypted(ctx: ts.Context, parts: Sequence[bytes]) -> bytes:
    """Aggregator side: the sum of several `encrypt_tensors` messages as one such message, ciphertext by
    ciphertext (needs only the public context; each message parsed once, the sum serialised once).

    Raises:
        ContributionError: a malformed, tampered, truncated or foreign message (its index).
        CountMismatch: parts of different value counts.
        SecureMessageError: no parts.
    """
    if not parts:
        raise SecureMessageError("nothing to sum: no encrypted contributions")
    evaluator = seal_tools(ctx).evaluator
    counts = [_contribution(_values_of, ctx, part, j) for j, part in enumerate(parts)]  # every header first
    if len(set(counts)) > 1:
        j = next(j for j, m in enumerate(counts) if m != counts[0])
        raise CountMismatch(f"contribution {j} holds {counts[j]} values, the first holds {counts[0]}", counts)
    acc, _ = _contribution(_load_message, ctx, parts[0], 0)
    for j, part in enumerate(parts[1:], start=1):
        ciphertexts, _ = _contribution(_load_message, ctx, part, j)
        for total, ciphertext in zip(acc, ciphertexts, strict=True):
            evaluator.add_inplace(total, ciphertext)
    return _pack(counts[0], [save_ciphertext(ciphertext) for ciphertext in acc])


def _contribution(parse, ctx: ts.Context, part: bytes, index: int):
    """`parse(ctx, part, index)`, its refusal as the `ContributionError` of that part."""
    try:
        return parse(ctx, part, index)
    except SecureMessageError as error:
        raise ContributionError(str(error), index) from None


def decrypt_tensors(secret_ctx: ts.Context, message: bytes, shapes: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Active party: decrypt a message of `encrypt_tensors` (or their `sum_encrypted`) into float64 tensors of
    `shapes`, every value rounded onto the fixed-point grid (no decryption noise survives).

    Raises:
        SecureRangeError: a decryption lies farther from the grid than the noise allows.
        SecureParameterError: `secret_ctx` has no secret key (e.g. the aggregator's public context).
        SecureMessageError: the message holds another number of values than `shapes` need, its padding
            does not decrypt to zero, or it is malformed, tampered, truncated or foreign.
    """
    if not secret_ctx.has_secret_key():
        raise SecureParameterError("this CKKS context has no secret key: only the active party can decrypt")
    shapes = [tuple(int(s) for s in shape) for shape in shapes]
    sizes = [math.prod(shape) for shape in shapes]
    if (n_values := _values_of(secret_ctx, message, 0)) != sum(sizes):  # before any ciphertext is loaded
        raise SecureMessageError(f"the message holds {n_values} values, shapes {shapes} need {sum(sizes)}")
    ciphertexts, _ = _load_message(secret_ctx, message, 0)
    seal = seal_tools(secret_ctx)
    values = _onto_grid(torch.from_numpy(np.concatenate([seal.decrypt(c) for c in ciphertexts])))
    if values[n_values:].any():  # padding decrypts to exactly zero; anything else was never encrypted by us
        raise SecureMessageError("the padding after the message's values does not decrypt to zero")
    return [part.reshape(shape) for part, shape in zip(values[:n_values].split(sizes), shapes, strict=True)]


def _onto_grid(decrypted: torch.Tensor) -> torch.Tensor:
    """Round decrypted values to the fixed-point grid, refusing any that the noise bound cannot explain."""
    grid = torch.round(decrypted * 2**PRECISION_BITS) / 2**PRECISION_BITS
    off = float((decrypted - grid).abs().max()) if decrypted.numel() else 0.0
    if off > _NOISE_BOUND:
        raise SecureRangeError(f"a decrypted value lies {off:.3g} from the fixed-point grid (the CKKS noise is "
                               f"below {_NOISE_BOUND:.3g}): the inputs were not grid values or the sum overflowed")
    return grid


# -- the wire format ---------------------------------------------------------------------------------------

def _pack(n_values: int, ciphertexts: list[bytes]) -> bytes:
    """A message: header, ciphertext lengths, the digest of all three parts, then the ciphertexts."""
    head = _HEADER.pack(_MAGIC, _VERSION, n_values, len(ciphertexts))
    head += b"".join(_LENGTH.pack(len(c)) for c in ciphertexts)
    digest = hashlib.sha256(head)
    for ciphertext in ciphertexts:
        digest.update(ciphertext)
    return b"".join([head, digest.digest(), *ciphertexts])


def _load_message(ctx: ts.Context, message: bytes, index: int) -> tuple[list[sealapi.Ciphertext], int]:
    """Parse and validate one `encrypt_tensors` message (contribution `index`); returns its ciphertexts
    (under `ctx`) and its number of values."""
    what, view = _view_of(message, index)
    n_values, lengths = _header_of(view, values_per_ciphertext(ctx), what)
    if lengths and min(lengths) < (floor := min_ciphertext_bytes(ctx)):
        raise SecureMessageError(f"{what}: a ciphertext of {min(lengths)} bytes, below the {floor} bytes a valid one "
                                 "holds (its coefficients are uniform: no compression goes below their entropy)")
    body = _HEADER.size + len(lengths) * _LENGTH.size + _DIGEST_BYTES
    digest = hashlib.sha256(view[: body - _DIGEST_BYTES])
    digest.update(view[body:])
    if digest.digest() != view[body - _DIGEST_BYTES : body]:
        raise SecureMessageError(f"{what}: ciphertext digest mismatch (tampered or truncated)")
    offsets = np.cumsum([body, *lengths]).tolist()
    return [_ciphertext(ctx, view[a:b], what) for a, b in itertools.pairwise(offsets)], n_values


def _view_of(message: bytes, index: int) -> tuple[str, memoryview]:
    """How errors name message `index`, and its bytes."""
    what = f"contribution {index}" if index else "the message"
    if not isinstance(message, bytes | bytearray | memoryview):
        raise SecureMessageError(f"{what}: expected bytes, got {type(message).__name__}")
    return what, memoryview(message).cast("B")


def _values_of(ctx: ts.Context, message: bytes, index: int) -> int:
    """The number of values a message's header declares (checked against its size; nothing loaded)."""
    what, view = _view_of(message, index)
    return _header_of(view, values_per_ciphertext(ctx), what)[0]


def min_ciphertext_bytes(ctx: ts.Context) -> int:
    """The fewest bytes a serialised valid ciphertext takes: its 2 N coefficients under each data prime q are
    uniform, log2 q bits of entropy each, which SEAL's compression cannot undercut (less 1 %: a string
    compresses k bits below its entropy with probability 2^-k). A shorter one was crafted to decompress into
    far more memory than it took on the wire (a zeroed ciphertext: 111 bytes, loaded as 256 KiB)."""
    primes = ctx.seal_context().data.first_context_data().parms().coeff_modulus()
    return math.floor(0.99 * 2 * _degree(ctx) * sum(math.log2(p.value()) for p in primes) / 8)


def _header_of(view: memoryview, per_ciphertext: int, what: str) -> tuple[int, list[int]]:
    """(number of values, ciphertext lengths) from a message's header, checked against its size."""
    if len(view) < _HEADER.size + _DIGEST_BYTES:
        raise SecureMessageError(f"{what}: truncated ({len(view)} bytes)")
    magic, version, n_values, count = _HEADER.unpack_from(view)
    if magic != _MAGIC or version != _VERSION:
        raise SecureMessageError(f"{what}: not a FALSE-VFL CKKS message (bad magic/version)")
    if count != n_chunks(n_values, per_ciphertext):
        raise SecureMessageError(f"{what}: header says {count} ciphertexts for {n_values} values")
    body = _HEADER.size + count * _LENGTH.size + _DIGEST_BYTES
    if len(view) < body:
        raise SecureMessageError(f"{what}: truncated ({len(view)} bytes, its header alone needs {body})")
    lengths = [_LENGTH.unpack_from(view, _HEADER.size + i * _LENGTH.size)[0] for i in range(count)]
    if len(view) != body + sum(lengths):
        raise SecureMessageError(f"{what}: truncated or extended ({len(view)} bytes, its header says "
                                 f"{body + sum(lengths)})")
    return n_values, lengths


def _ciphertext(ctx: ts.Context, payload: memoryview, what: str) -> sealapi.Ciphertext:
    """One serialised ciphertext of a message, parsed under `ctx` (SEAL checks it is valid for the
    context's parameters) and checked to be a fresh-size ciphertext at the first data level and scale."""
    seal = seal_tools(ctx)
    try:
        ciphertext = load_ciphertext(seal, payload)
    except Exception as exc:  # SEAL raises ValueError/RuntimeError for malformed or foreign data
        raise SecureMessageError(f"{what}: not a valid CKKS message for this context: {exc}") from exc
    if (ciphertext.size() != 2 or ciphertext.parms_id() != seal.first or not ciphertext.is_ntt_form()
            or not math.isclose(ciphertext.scale, seal.scale)):
        raise SecureMessageError(f"{what}: ciphertexts do not match the header or this context's parameters/scale")
    return ciphertext


def _check_modulus(n: int, total_bits: int, scale_bits: int, data_bits: int) -> None:
    """The checks that apply to any context: 128-bit security for (N, total bits), room above the scale."""
    if n not in MAX_MODULUS_BITS_128:
        raise SecureParameterError(
            f"poly_modulus_degree {n} is not one of the standard's degrees {sorted(MAX_MODULUS_BITS_128)}"
        )
    bound = MAX_MODULUS_BITS_128[n]
    if total_bits > bound:
        raise SecureParameterError(
            f"insecure CKKS parameters: N={n} with {total_bits} coefficient-modulus bits exceeds the "
            f"{bound}-bit bound for 128-bit security (HomomorphicEncryption.org standard, ternary secrets)"
        )
    if scale_bits + 2 > data_bits:
        raise SecureParameterError(
            f"scale 2^{scale_bits} leaves no room for values under the {data_bits}-bit data modulus"
        )


def _degree(ctx: ts.Context) -> int:
    return int(ctx.seal_context().data.key_context_data().parms().poly_modulus_degree())


def _modulus_of(ctx: ts.Context) -> tuple[int, int, int, int]:
    """(N, total modulus bits, data modulus bits, scale bits) of a context, read from SEAL."""
    seal = ctx.seal_context().data
    total = int(seal.key_context_data().total_coeff_modulus_bit_count())
    data = int(seal.first_context_data().total_coeff_modulus_bit_count())
    scale_bits = round(math.log2(ctx.global_scale)) if ctx.global_scale > 0 else 0
    return _degree(ctx), total, data, scale_bits
