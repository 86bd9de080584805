"""A thin ctypes binding to libsodium's ristretto255 group (the prime-order group over Curve25519).

PyNaCl does not bind the ristretto255 functions, but libsodium >= 1.0.18 exports them, so this
module loads the system library directly. Nothing is loaded at import time: the first call finds
the library (``$FALSEVFL_LIBSODIUM``, then ``ctypes.util.find_library("sodium")``, then common file
names), calls ``sodium_init`` and checks that every needed symbol exists; a missing or too old
library raises `SodiumUnavailableError`.

Encodings: points and scalars are 32-byte strings (libsodium's canonical encodings). Batches are
one contiguous ``bytes`` buffer of ``n * 32`` bytes, processed by a Python loop of ctypes calls;
ctypes releases the GIL during every call, so batches on different threads run in parallel.

`hash_to_group` hashes inside: it takes the message itself (never a digest), computes its SHA-512
digest and maps the 64 bytes to the group with ``crypto_core_ristretto255_from_hash`` (Elligator 2
twice and an addition, so the discrete log of the result is unknown).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from .errors import SecureMessageError, SecureParameterError

__all__ = [
    "POINT_BYTES", "SCALAR_BYTES", "InvalidPointError", "SodiumUnavailableError", "hash_to_group",
    "hash_to_group_batch", "is_valid_point", "random_scalar", "scalar_mult", "scalar_mult_batch",
    "first_invalid_point",
]

POINT_BYTES = 32
SCALAR_BYTES = 32
_MIN_CHUNK = 256  # points per thread below which a thread pool costs more than it saves
_IDENTITY = bytes(POINT_BYTES)  # libsodium accepts the identity's encoding as a point; we do not
_SYMBOLS = ("sodium_init", "sodium_version_string", "crypto_core_ristretto255_from_hash",
            "crypto_core_ristretto255_is_valid_point", "crypto_core_ristretto255_scalar_random",
            "crypto_scalarmult_ristretto255", "crypto_core_ristretto255_bytes",
            "crypto_core_ristretto255_scalarbytes")
_FALLBACKS = ("libsodium.so.23", "libsodium.so.26", "libsodium.so", "/lib/x86_64-linux-gnu/libsodium.so.23",
              "/usr/lib/x86_64-linux-gnu/libsodium.so.23", "/usr/local/lib/libsodium.so",
              "/usr/lib/libsodium.so", "libsodium.dylib", "/opt/homebrew/lib/libsodium.dylib", "libsodium.dll")
_INSTALL = "install libsodium >= 1.0.18 (Debian/Ubuntu: apt-get install libsodium23; macOS: brew install libsodium)"
_lib: ctypes.CDLL | None = None
_LOADING = threading.Lock()


class SodiumUnavailableError(SecureParameterError):
    """libsodium is missing, cannot be loaded or is older than 1.0.18 (no ristretto255)."""


class InvalidPointError(SecureMessageError):
    """A 32-byte string that is not the canonical encoding of a ristretto255 point, or the identity."""


def _candidates() -> list[str]:
    """Library names to try, most specific first (an explicit override wins)."""
    found = ctypes.util.find_library("sodium")
    names = [os.environ.get("FALSEVFL_LIBSODIUM", ""), found or "", *_FALLBACKS]
    return [name for name in dict.fromkeys(names) if name]


def _open() -> ctypes.CDLL:
    """The first candidate that loads and has every ristretto255 symbol, initialised and annotated."""
    tried, old = [], []
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            tried.append(f"{name} ({exc})")
            continue
        missing = [sym for sym in _SYMBOLS if not hasattr(lib, sym)]
        if not missing:
            return _initialise(lib)
        old.append(f"{name} lacks {', '.join(missing)}")
    if old:
        raise SodiumUnavailableError(f"libsodium older than 1.0.18 ({'; '.join(old)}): {_INSTALL}")
    raise SodiumUnavailableError(f"libsodium not found (tried {'; '.join(tried)}): {_INSTALL}")


def _initialise(lib: ctypes.CDLL) -> ctypes.CDLL:
    """sodium_init (thread-safe, idempotent) and a check of the encoding sizes."""
    _annotate(lib)
    if lib.sodium_init() < 0:
        raise SodiumUnavailableError(f"sodium_init failed for {lib._name}: {_INSTALL}")
    if lib.crypto_core_ristretto255_bytes() != POINT_BYTES or lib.crypto_core_ristretto255_scalarbytes() != 32:
        raise SodiumUnavailableError(f"libsodium at {lib._name} has unexpected ristretto255 sizes: {_INSTALL}")
    return lib


def _annotate(lib: ctypes.CDLL) -> None:
    """Declare argument types: pointers are passed as integers (addresses), which need c_void_p."""
    ptr = ctypes.c_void_p
    lib.sodium_init.restype = ctypes.c_int
    lib.sodium_version_string.restype = ctypes.c_char_p
    lib.crypto_core_ristretto255_bytes.restype = ctypes.c_size_t
    lib.crypto_core_ristretto255_scalarbytes.restype = ctypes.c_size_t
    for name, argtypes in (("crypto_core_ristretto255_from_hash", [ptr, ptr]),
                           ("crypto_core_ristretto255_is_valid_point", [ptr]),
                           ("crypto_scalarmult_ristretto255", [ptr, ptr, ptr])):
        getattr(lib, name).argtypes = argtypes
        getattr(lib, name).restype = ctypes.c_int
    lib.crypto_core_ristretto255_scalar_random.argtypes = [ptr]
    lib.crypto_core_ristretto255_scalar_random.restype = None


def library() -> ctypes.CDLL:
    """The loaded libsodium (loaded on first use; raises `SodiumUnavailableError`)."""
    global _lib
    if _lib is None:
        with _LOADING:  # K party threads may ask at once
            if _lib is None:
                _lib = _open()
    return _lib


def sodium_version() -> str:
    """The loaded libsodium's version string, e.g. '1.0.18'."""
    return library().sodium_version_string().decode()


def _check_len(value: bytes, size: int, what: str) -> None:
    """Refuse anything but a bytes-like object of exactly `size` bytes before it reaches C."""
    if not isinstance(value, bytes | bytearray | memoryview) or len(value) != size:
        raise InvalidPointError(f"{what} must be {size} bytes, got {type(value).__name__} "
                                f"of length {len(value) if hasattr(value, '__len__') else '?'}")


def random_scalar() -> bytes:
    """A uniformly random non-zero scalar mod the group order, from libsodium's CSPRNG."""
    out = ctypes.create_string_buffer(SCALAR_BYTES)
    library().crypto_core_ristretto255_scalar_random(out)
    return out.raw


def hash_to_group(data: bytes) -> bytes:
    """The point ristretto255_from_hash(SHA-512(data)): the message goes in, never a digest."""
    out = ctypes.create_string_buffer(POINT_BYTES)
    digest = hashlib.sha512(data).digest()
    library().crypto_core_ristretto255_from_hash(out, digest)
    return out.raw


def hash_to_group_batch(messages: Iterable[bytes], prefix: bytes = b"", threads: int = 1) -> bytes:
    """`hash_to_group(prefix + m)` for every message, concatenated (n * 32 bytes)."""
    messages = list(messages)
    out = ctypes.create_string_buffer(POINT_BYTES * len(messages))
    base, fn, sha = ctypes.addressof(out), library().crypto_core_ristretto255_from_hash, hashlib.sha512(prefix)

    def work(lo: int, hi: int) -> int:
        for i in range(lo, hi):
            h = sha.copy()  # the prefix is hashed once; each message continues from its state
            h.update(messages[i])
            fn(base + POINT_BYTES * i, h.digest())
        return -1

    _run_chunks(len(messages), threads, work)
    return out.raw


def _run_chunks(n: int, threads: int, work: Callable[[int, int], int]) -> int:
    """work(lo, hi) over [0, n) in `threads` contiguous chunks on a thread pool (libsodium runs
    without the GIL); returns the smallest index a chunk reported as failing, or -1."""
    threads = max(1, min(int(threads), n // _MIN_CHUNK))
    if threads == 1:
        return work(0, n)
    bounds = [n * t // threads for t in range(threads + 1)]
    with ThreadPoolExecutor(threads) as pool:
        failed = [i for i in pool.map(work, bounds[:-1], bounds[1:]) if i >= 0]
    return min(failed, default=-1)


def _point_buffer(points: bytes) -> tuple[int, ctypes.Array | None]:
    """(number of points, a C copy of the buffer) after checking it holds whole points."""
    if not isinstance(points, bytes | bytearray) or len(points) % POINT_BYTES:
        raise InvalidPointError(f"a point buffer must be a multiple of {POINT_BYTES} bytes, got "
                                f"{len(points) if isinstance(points, bytes | bytearray) else type(points).__name__}")
    return len(points) // POINT_BYTES, (ctypes.c_char * len(points)).from_buffer_copy(points) if points else None


def is_valid_point(point: bytes) -> bool:
    """Whether `point` is the canonical encoding of a ristretto255 point other than the identity."""
    if not isinstance(point, bytes | bytearray) or len(point) != POINT_BYTES:
        return False
    return point != _IDENTITY and library().crypto_core_ristretto255_is_valid_point(bytes(point)) == 1


def first_invalid_point(points: bytes, threads: int = 1) -> int:
    """Index of the first invalid 32-byte point (non-canonical or the identity), or -1 if none."""
    n, buf = _point_buffer(points)
    if n == 0:
        return -1
    fn, base = library().crypto_core_ristretto255_is_valid_point, ctypes.addressof(buf)

    def work(lo: int, hi: int) -> int:
        for i in range(lo, hi):
            if fn(base + POINT_BYTES * i) != 1 or points[POINT_BYTES * i:POINT_BYTES * (i + 1)] == _IDENTITY:
                return i
        return -1

    return _run_chunks(n, threads, work)


def scalar_mult(scalar: bytes, point: bytes) -> bytes:
    """scalar * point; raises `InvalidPointError` if the point is invalid or the result the identity."""
    _check_len(scalar, SCALAR_BYTES, "a scalar")
    _check_len(point, POINT_BYTES, "a point")
    out = ctypes.create_string_buffer(POINT_BYTES)
    if library().crypto_scalarmult_ristretto255(out, bytes(scalar), bytes(point)) != 0:
        raise InvalidPointError("not a valid ristretto255 point (non-canonical encoding or the identity)")
    return out.raw


def scalar_mult_batch(scalar: bytes, points: bytes, threads: int = 1) -> bytes:
    """scalar * P for every 32-byte point P of the buffer (n * 32 bytes in, n * 32 out).

    Every input point is decoded and checked by libsodium; the first invalid one (or one whose
    product is the identity) raises `InvalidPointError` naming its index. `threads` > 1 splits
    the buffer over a thread pool (worth it only with idle cores)."""
    _check_len(scalar, SCALAR_BYTES, "a scalar")
    n, src = _point_buffer(points)
    if n == 0:
        return b""
    out, key = ctypes.create_string_buffer(len(points)), ctypes.create_string_buffer(bytes(scalar), SCALAR_BYTES)
    fn, src_at, out_at = library().crypto_scalarmult_ristretto255, ctypes.addressof(src), ctypes.addressof(out)

    def work(lo: int, hi: int) -> int:
        for offset in range(POINT_BYTES * lo, POINT_BYTES * hi, POINT_BYTES):
            if fn(out_at + offset, key, src_at + offset) != 0:
                return offset // POINT_BYTES
        return -1

    bad = _run_chunks(n, threads, work)
    if bad >= 0:
        raise InvalidPointError(f"point {bad} of {n} is not a valid ristretto255 point "
                                "(non-canonical encoding or the identity)")
    return out.raw
