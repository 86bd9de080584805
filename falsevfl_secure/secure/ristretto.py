"""The ristretto255 group (the prime-order group over Curve25519), through the `rbcl` wheel.

`rbcl` bundles libsodium (1.0.18 in rbcl 1.1.2) and binds its ristretto255 functions, so a fresh host
needs no system library: ``pip install rbcl`` is the whole installation. Nothing is loaded when this
module is imported: the first call imports rbcl (about 0.1 s: it writes its copy of libsodium to the
temporary directory and loads it); if that fails, the call raises `SodiumUnavailableError`.

Encodings: points and scalars are 32-byte strings (libsodium's canonical encodings). Batches are one
contiguous ``bytes`` buffer of ``n * 32`` bytes. The batch functions call rbcl's libsodium directly, through
their own ctypes function objects with declared signatures, on addresses into one input copy and one output
buffer (no bytes object per point; the single-point functions go through rbcl's checked wrappers). ctypes
releases the GIL during every call, so batches split over threads run in parallel. Where the time goes
(measured on this project's 2-core machine, one thread, process CPU time): about 50 us per
``crypto_scalarmult_ristretto255``, 14 us per ``from_hash``, 4.6 us per point check, against about 1 us of
Python per call (rbcl's wrappers cost about 5 us): the group operations themselves are the cost.

`hash_to_group` hashes inside: it takes the message itself (never a digest), computes its SHA-512
digest and maps the 64 bytes to the group with ``crypto_core_ristretto255_from_hash`` (Elligator 2
twice and an addition, so the discrete log of the result is unknown).

Received points are always validated: `scalar_mult` and `scalar_mult_batch` decode every point with
libsodium (a non-canonical encoding fails) and refuse the identity, as input and as result;
`first_invalid_point` checks a buffer without multiplying.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import os
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import numpy as np

from .errors import SecureMessageError, SecureParameterError

__all__ = [
    "POINT_BYTES", "SCALAR_BYTES", "InvalidPointError", "SodiumUnavailableError", "hash_to_group",
    "hash_to_group_batch", "is_valid_point", "random_scalar", "scalar_mult", "scalar_mult_batch",
    "first_invalid_point", "sodium_version", "base_mult", "point_add", "hash_to_scalar", "scalar_invert",
    "scalar_mul", "scalar_reduce", "scalar_sub", "weighted_sum",
]

POINT_BYTES = 32
SCALAR_BYTES = 32
_MIN_CHUNK = 256  # points per thread below which a thread pool costs more than it saves
_IDENTITY = bytes(POINT_BYTES)  # libsodium accepts the identity's encoding as a point; we do not
_INSTALL = ("install it with `pip install 'rbcl>=1.1'` (it bundles libsodium); if the temporary directory "
            "is mounted noexec, point TMPDIR at one that is not")


class SodiumUnavailableError(SecureParameterError):
    """rbcl (the wheel that bundles libsodium's ristretto255) is missing or its libsodium cannot be loaded."""


class InvalidPointError(SecureMessageError):
    """A 32-byte string that is not the canonical encoding of a ristretto255 point, or the identity."""


@functools.cache
def _rbcl() -> ModuleType:
    """rbcl, imported on first use (cached; raises `SodiumUnavailableError`)."""
    try:
        module = importlib.import_module("rbcl")
    except (ImportError, OSError, RuntimeError) as exc:  # no wheel, or its libsodium would not load
        raise SodiumUnavailableError(f"rbcl could not be loaded ({type(exc).__name__}: {exc}): {_INSTALL}") from None
    if module.crypto_core_ristretto255_BYTES != POINT_BYTES or module.crypto_core_ristretto255_SCALARBYTES != 32:
        raise SodiumUnavailableError(f"rbcl's libsodium has unexpected ristretto255 sizes: {_INSTALL}")
    _forget_extracted_library(module)
    return module


def _forget_extracted_library(module: ModuleType) -> None:
    """Delete the copy of libsodium rbcl wrote to the temporary directory on import (it never does, so every
    process would leave 2.8 MB behind); once loaded, POSIX keeps the mapping without the file."""
    path = Path(getattr(getattr(module, "_sodium", None), "_name", None) or "")
    if os.name == "posix" and path.suffix == ".so" and path.parent == Path(tempfile.gettempdir()):
        try:
            path.unlink()
        except OSError:
            pass  # already gone, or not ours to delete: nothing depends on it


def sodium_version() -> str:
    """The bundled libsodium's version string, e.g. '1.0.18' (or rbcl's version if it cannot say)."""
    try:
        fn = _rbcl()._sodium["sodium_version_string"]  # a fresh function object: rbcl's own stay untouched
    except (AttributeError, KeyError, TypeError):
        return f"bundled with rbcl {metadata.version('rbcl')}"
    fn.restype = ctypes.c_char_p
    return fn().decode()


class _Bound(NamedTuple):
    """libsodium's bulk-loop functions, taking raw addresses into buffers (no per-point bytes objects)."""

    mult: Callable[..., int]  # crypto_scalarmult_ristretto255(q, n, p): 0, or -1 (not a point, or the identity)
    from_hash: Callable[..., int]  # crypto_core_ristretto255_from_hash(p, r): 0
    valid: Callable[..., int]  # crypto_core_ristretto255_is_valid_point(p): 1 if p decodes
    add: Callable[..., int]  # crypto_core_ristretto255_add(r, p, q): 0, or -1 (p or q does not decode)
    reduce: Callable[..., int]  # crypto_core_ristretto255_scalar_reduce(r, s): s (64 bytes) mod the group order


@functools.cache
def _bound(module: ModuleType) -> _Bound:
    """Fresh ctypes function objects of rbcl's libsodium with declared signatures (rbcl's own stay
    untouched); ctypes drops the GIL during each call, so chunks on threads run in parallel."""
    lib, ptr, data = module._sodium, ctypes.c_void_p, ctypes.c_char_p

    def bind(name: str, *argtypes: type) -> Callable[..., int]:
        fn = lib[name]
        fn.argtypes, fn.restype = argtypes, ctypes.c_int  # 64-bit addresses: undeclared ints would be truncated
        return fn

    return _Bound(bind("crypto_scalarmult_ristretto255", ptr, data, ptr),
                  bind("crypto_core_ristretto255_from_hash", ptr, data),
                  bind("crypto_core_ristretto255_is_valid_point", ptr),
                  bind("crypto_core_ristretto255_add", ptr, ptr, ptr),
                  bind("crypto_core_ristretto255_scalar_reduce", ptr, data))


def _pinned(data: bytes) -> ctypes.Array:
    """A private C copy of `data` that libsodium reads by address (alive while the caller holds it)."""
    return (ctypes.c_char * len(data)).from_buffer_copy(data)


def _check_len(value: bytes, size: int, what: str) -> bytes:
    """`value` as bytes, refusing anything but a bytes-like object of exactly `size` bytes."""
    if not isinstance(value, bytes | bytearray | memoryview) or len(value) != size:
        raise InvalidPointError(f"{what} must be {size} bytes, got {type(value).__name__} "
                                f"of length {len(value) if hasattr(value, '__len__') else '?'}")
    return bytes(value)


def random_scalar() -> bytes:
    """A uniformly random non-zero scalar mod the group order, from libsodium's CSPRNG."""
    return _rbcl().crypto_core_ristretto255_scalar_random()


def hash_to_group(data: bytes) -> bytes:
    """The point ristretto255_from_hash(SHA-512(data)): the message goes in, never a digest."""
    return _rbcl().crypto_core_ristretto255_from_hash(hashlib.sha512(data).digest())


def hash_to_group_batch(messages: Iterable[bytes], prefix: bytes = b"", threads: int = 1) -> bytes:
    """`hash_to_group(prefix + m)` for every message, concatenated (n * 32 bytes)."""
    messages = list(messages)
    if not messages:
        return b""
    from_hash, sha = _bound(_rbcl()).from_hash, hashlib.sha512(prefix)
    out = ctypes.create_string_buffer(POINT_BYTES * len(messages))
    base = ctypes.addressof(out)

    def work(lo: int, hi: int) -> int:
        for i in range(lo, hi):
            h = sha.copy()  # the prefix is hashed once; each message continues from its state
            h.update(messages[i])
            from_hash(base + POINT_BYTES * i, h.digest())
        return -1

    _run_chunks(len(messages), threads, work)
    return out.raw


def _run_chunks(n: int, threads: int, work: Callable[[int, int], int]) -> int:
    """work(lo, hi) -> first failing index in [lo, hi) or -1, over [0, n) in `threads` contiguous chunks on a
    thread pool (libsodium runs without the GIL; each chunk writes its own slice of an output buffer);
    returns the smallest failing index, or -1."""
    threads = max(1, min(int(threads), n // _MIN_CHUNK))
    if threads == 1:
        return work(0, n)
    bounds = [n * t // threads for t in range(threads + 1)]
    with ThreadPoolExecutor(threads) as pool:
        failed = [bad for bad in pool.map(work, bounds[:-1], bounds[1:]) if bad >= 0]
    return min(failed, default=-1)


def _count_points(points: bytes) -> int:
    """The number of points in a buffer, after checking it holds whole points."""
    if not isinstance(points, bytes | bytearray) or len(points) % POINT_BYTES:
        raise InvalidPointError(f"a point buffer must be a multiple of {POINT_BYTES} bytes, got "
                                f"{len(points) if isinstance(points, bytes | bytearray) else type(points).__name__}")
    return len(points) // POINT_BYTES


def is_valid_point(point: bytes) -> bool:
    """Whether `point` is the canonical encoding of a ristretto255 point other than the identity."""
    if not isinstance(point, bytes | bytearray) or len(point) != POINT_BYTES or point[-1] & 0x80:
        return False
    return point != _IDENTITY and _rbcl().crypto_core_ristretto255_is_valid_point(bytes(point))


def _first_refused(copy: ctypes.Array, n: int, threads: int, work: Callable[[int, int], int],
                   identity: bool) -> int:
    """The first point `work` (libsodium) refuses, or that is refused before it: a set top bit (libsodium before
    1.0.19 ignores it, so such a point is an alias of another, and 00..80 one of the identity: review finding)
    and, with `identity`, the zero bytes (the identity, which libsodium decodes); -1 if none."""
    rows = np.frombuffer(copy, dtype=np.uint8).reshape(n, POINT_BYTES)
    flagged = (rows[:, -1] & 0x80).astype(bool) | (~rows.any(axis=1) if identity else False)
    first = np.flatnonzero(flagged)
    stop = int(first[0]) if len(first) else n
    bad = _run_chunks(stop, threads, work) if stop else -1
    return bad if bad >= 0 else (stop if stop < n else -1)


def first_invalid_point(points: bytes, threads: int = 1) -> int:
    """Index of the first invalid 32-byte point (non-canonical or the identity), or -1 if none."""
    n = _count_points(points)
    if n == 0:
        return -1
    valid, copy = _bound(_rbcl()).valid, _pinned(points)
    base = ctypes.addressof(copy)

    def work(lo: int, hi: int) -> int:
        for offset in range(POINT_BYTES * lo, POINT_BYTES * hi, POINT_BYTES):
            if valid(base + offset) != 1:
                return offset // POINT_BYTES
        return -1

    return _first_refused(copy, n, threads, work, identity=True)


def scalar_mult(scalar: bytes, point: bytes) -> bytes:
    """scalar * point; raises `InvalidPointError` if the point is invalid or the result the identity."""
    scalar, point = _check_len(scalar, SCALAR_BYTES, "a scalar"), _check_len(point, POINT_BYTES, "a point")
    refused = InvalidPointError("not a valid ristretto255 point (non-canonical encoding or the identity)")
    if point[-1] & 0x80:  # an alias libsodium 1.0.18 would multiply as its point
        raise refused
    try:
        return _rbcl().crypto_scalarmult_ristretto255(scalar, point)
    except RuntimeError:  # libsodium returned -1: the point did not decode, or the product is the identity
        raise refused from None


def scalar_mult_batch(scalar: bytes, points: bytes, threads: int = 1) -> bytes:
    """scalar * P for every 32-byte point P of the buffer (n * 32 bytes in, n * 32 out).

    Every input point is decoded and checked by libsodium; the first invalid one (or one whose
    product is the identity) raises `InvalidPointError` naming its index. `threads` > 1 splits
    the buffer over a thread pool (worth it only with idle cores)."""
    scalar, n = _check_len(scalar, SCALAR_BYTES, "a scalar"), _count_points(points)
    if n == 0:
        return b""
    mult, copy = _bound(_rbcl()).mult, _pinned(points)
    out = ctypes.create_string_buffer(POINT_BYTES * n)
    source, target = ctypes.addressof(copy), ctypes.addressof(out)

    def work(lo: int, hi: int) -> int:
        for offset in range(POINT_BYTES * lo, POINT_BYTES * hi, POINT_BYTES):
            if mult(target + offset, scalar, source + offset) != 0:  # libsodium's -1: not a point, or the identity
                return offset // POINT_BYTES
        return -1

    bad = _first_refused(copy, n, threads, work, identity=False)  # (an identity product: libsodium refuses it)
    if bad >= 0:
        raise InvalidPointError(f"point {bad} of {n} is not a valid ristretto255 point "
                                "(non-canonical encoding or the identity)")
    return out.raw


def base_mult(scalar: bytes) -> bytes:
    """scalar * G, the group's generator (a party's public key Y = aG)."""
    return _rbcl().crypto_scalarmult_ristretto255_base(_check_len(scalar, SCALAR_BYTES, "a scalar"))


def point_add(p: bytes, q: bytes) -> bytes:
    """p + q; raises `InvalidPointError` where either does not decode or has its top bit set."""
    p, q = _check_len(p, POINT_BYTES, "a point"), _check_len(q, POINT_BYTES, "a point")
    if (p[-1] | q[-1]) & 0x80:
        raise InvalidPointError("not a valid ristretto255 point (non-canonical encoding)")
    try:
        return _rbcl().crypto_core_ristretto255_add(p, q)
    except (RuntimeError, ValueError):
        raise InvalidPointError("not a valid ristretto255 point (non-canonical encoding)") from None


def hash_to_scalar(*parts: bytes) -> bytes:
    """SHA-512 of the parts, each length-prefixed (no two part lists hash alike), reduced mod the group order."""
    h = hashlib.sha512()
    for part in parts:
        h.update(len(part).to_bytes(8, "big") + part)
    return _rbcl().crypto_core_ristretto255_scalar_reduce(h.digest())


def scalar_reduce(wide: bytes) -> bytes:
    """A 64-byte little-endian number mod the group order."""
    return _rbcl().crypto_core_ristretto255_scalar_reduce(_check_len(wide, 64, "a wide scalar"))


def scalar_invert(s: bytes) -> bytes:
    return _rbcl().crypto_core_ristretto255_scalar_invert(_check_len(s, SCALAR_BYTES, "a scalar"))


def scalar_mul(a: bytes, b: bytes) -> bytes:
    return _rbcl().crypto_core_ristretto255_scalar_mul(a, b)


def scalar_sub(a: bytes, b: bytes) -> bytes:
    return _rbcl().crypto_core_ristretto255_scalar_sub(a, b)


def weighted_sum(seed: bytes, points: bytes, threads: int = 1) -> bytes:
    """sum_i d_i P_i over the buffer's points, with d_i = SHA-512(seed || i as 8 little-endian bytes) reduced mod
    the group order (the weights of a batched proof: secure/dleq.py). Every point is decoded by libsodium as it is
    multiplied (no second pass over a list already checked on receipt); an invalid one (or one with the top bit set,
    which libsodium 1.0.18 ignores) raises `InvalidPointError`, as does an empty buffer or a sum that is the
    identity."""
    n = _count_points(points)
    if n == 0 or (np.frombuffer(points, dtype=np.uint8)[POINT_BYTES - 1::POINT_BYTES] & 0x80).any():
        raise InvalidPointError("a weighted sum needs one or more valid ristretto255 points")
    bound, copy = _bound(_rbcl()), _pinned(points)
    threads = max(1, min(int(threads), n // _MIN_CHUNK))
    partial = ctypes.create_string_buffer(POINT_BYTES * threads)
    edges = [n * t // threads for t in range(threads + 1)]

    def work(chunk: int) -> None:
        term, weight = ctypes.create_string_buffer(POINT_BYTES), ctypes.create_string_buffer(SCALAR_BYTES)
        source, acc, sha = ctypes.addressof(copy), ctypes.addressof(partial) + POINT_BYTES * chunk, hashlib.sha512(seed)
        for i in range(edges[chunk], edges[chunk + 1]):
            h = sha.copy()
            h.update(i.to_bytes(8, "little"))
            bound.reduce(ctypes.addressof(weight), h.digest())
            target = acc if i == edges[chunk] else ctypes.addressof(term)
            if bound.mult(target, weight.raw, source + POINT_BYTES * i) != 0:  # not a point, or the identity
                raise InvalidPointError(f"point {i} of {n} is not a valid ristretto255 point (or the identity)")
            if i != edges[chunk]:
                bound.add(acc, acc, ctypes.addressof(term))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))
    total = partial.raw[:POINT_BYTES]
    for chunk in range(1, threads):
        total = point_add(total, partial.raw[POINT_BYTES * chunk:POINT_BYTES * (chunk + 1)])
    if total == _IDENTITY:
        raise InvalidPointError("a weighted sum is the identity")
    return total
