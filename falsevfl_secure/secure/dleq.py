"""Batched Chaum-Pedersen proofs for the alignment's hops (secure/align.py): that a party multiplied every point
of a list by its one announced scalar a (Y = aG public), in place and in order.

A hop takes `inp` (n points) to `out` (n points). Its context names the session, the list's origin, the hop and
the prover. Weights d_i = SHA-512(seed || i) mod the group order, seed = SHA-512(DOMAIN || context || SHA-256(inp)
|| SHA-256(out)); M = sum d_i inp_i and Z = sum d_i out_i. An honest hop has Z = aM; a hop that swaps two points,
drops or adds one, or multiplies any by another scalar has Z - aM = sum d_i (out_i - a inp_i), zero only with
probability about 2^-252 for weights fixed after both lists (the same batching as RFC 9497, section 2.2.1). The
proof is a Chaum-Pedersen proof that log_G Y = log_M Z, made non-interactive by Fiat-Shamir: r random, c =
H(context, Y, M, Z, rG, rM), s = r - c a; the verifier recomputes rG = sG + cY and rM = sM + cZ.

Who computes what: the prover (which holds both lists) makes the proof; the party that sent it `inp` computes M,
the party that received `out` computes Z and verifies. Neither sees the other's list, only its digest and M or Z.
"""

from __future__ import annotations

import hashlib

from . import ristretto

DOMAIN = b"falsevfl-hop-v1\x00"
PROOF_BYTES = 2 * ristretto.SCALAR_BYTES  # c || s
DIGEST_BYTES = 32


def digest(points: bytes) -> bytes:
    """SHA-256 of a list of points (what the two checking parties tell each other instead of the list)."""
    return hashlib.sha256(points).digest()


def combine(context: bytes, inp_digest: bytes, out_digest: bytes, points: bytes, threads: int = 1) -> bytes:
    """M (of `inp`) or Z (of `out`): the hop's weighted sum of `points`."""
    seed = hashlib.sha512(DOMAIN + b"weights" + _framed(context, inp_digest, out_digest)).digest()
    return ristretto.weighted_sum(seed, points, threads)


def prove(scalar: bytes, context: bytes, m: bytes) -> bytes:
    """The prover's proof (c || s) that Z = scalar * M for its public key scalar * G."""
    r = ristretto.random_scalar()  # fresh per proof, from libsodium's CSPRNG
    public, z = ristretto.base_mult(scalar), ristretto.scalar_mult(scalar, m)
    c = _challenge(context, public, m, z, ristretto.base_mult(r), ristretto.scalar_mult(r, m))
    return c + ristretto.scalar_sub(r, ristretto.scalar_mul(c, scalar))


def verify(public: bytes, context: bytes, m: bytes, z: bytes, proof: bytes) -> bool:
    """Whether `proof` shows log_G public = log_M z for this context (False for anything malformed)."""
    if not isinstance(proof, bytes) or len(proof) != PROOF_BYTES:
        return False
    c, s = proof[:ristretto.SCALAR_BYTES], proof[ristretto.SCALAR_BYTES:]
    if not all(ristretto.is_valid_point(p) for p in (public, m, z)) or not _canonical(c) or not _canonical(s):
        return False
    try:
        t1 = ristretto.point_add(ristretto.base_mult(s), ristretto.scalar_mult(c, public))
        t2 = ristretto.point_add(ristretto.scalar_mult(s, m), ristretto.scalar_mult(c, z))
    except (ristretto.InvalidPointError, RuntimeError):  # s or c zero, or a sum that is the identity
        return False
    return _challenge(context, public, m, z, t1, t2) == c


def _challenge(context: bytes, *points: bytes) -> bytes:
    return ristretto.hash_to_scalar(DOMAIN + b"challenge", context, *points)


def _canonical(scalar: bytes) -> bool:
    """A scalar below the group order (its own reduction): no two encodings of one proof."""
    return ristretto.scalar_reduce(scalar + bytes(32)) == scalar


def _framed(*parts: bytes) -> bytes:
    return b"".join(len(p).to_bytes(8, "big") + p for p in parts)
