"""The alignment's published union, keyed by the active party (secure/align.py): what every passive party sorts its
rows by, without a value it could compute for an ID of its choice.

Why: a passive party's first list is its own word (nothing can prove it blinded H(id) and not b H(id) for a secret b
of its own, short of revealing the IDs). A union of the pseudonyms P(id) themselves let it list b P(x) for IDs x of
its choice, multiply its returned pseudonym by 1/b and look P(x) up: whether anyone else holds x (review finding).

So the active party draws a key k (public K = kG) and publishes, sorted, the points G(p) = k H_u(p) for every
pseudonym p, H_u hashing p's 32 bytes to the group (with the session): not multiplicative in p, so G(b P(x))
tells nothing about G(P(x)). Each passive party gets G of its own pseudonyms with a batched Chaum-Pedersen proof
(secure/dleq.py) that each is k H_u of the pseudonym at its place, against K; the passive parties compare K and the
union in the transcript. Cost: a hash and a multiplication per union point at the active party, and per own record
a hash and two weighted sums at a passive party (one at the active party)."""

from __future__ import annotations

from . import dleq, ristretto

DOMAIN = b"falsevfl-align-union-v1\x00"
_P = ristretto.POINT_BYTES


def hashed(session: bytes, pseudonyms: bytes, threads: int = 1) -> bytes:
    """H_u(p) for every pseudonym of the buffer (its bytes hashed to the group, with the session)."""
    points = (pseudonyms[o:o + _P] for o in range(0, len(pseudonyms), _P))
    return ristretto.hash_to_group_batch(points, prefix=DOMAIN + session, threads=threads)


def context(session: bytes, origin: int) -> bytes:
    return DOMAIN + session + origin.to_bytes(8, "little")


def prove(key: bytes, session: bytes, origin: int, pseudonyms: bytes, hashed_points: bytes, keyed: bytes,
          threads: int = 1) -> bytes:
    """The active party's proof that `keyed` is `key` times `hashed_points` (H_u of `pseudonyms`), place by place."""
    if not pseudonyms:
        return bytes(dleq.PROOF_BYTES)
    ctx = context(session, origin)
    m = dleq.combine(ctx, dleq.digest(pseudonyms), dleq.digest(keyed), hashed_points, threads)
    return dleq.prove(key, ctx, m)


def verify(public: bytes, session: bytes, origin: int, pseudonyms: bytes, keyed: bytes, proof: bytes,
           threads: int = 1) -> bool:
    """Whether `keyed` is the key of `public` times H_u of this party's own `pseudonyms`, place by place."""
    if not pseudonyms:
        return not keyed
    ctx, inp, out = context(session, origin), dleq.digest(pseudonyms), dleq.digest(keyed)
    m = dleq.combine(ctx, inp, out, hashed(session, pseudonyms, threads), threads)
    z = dleq.combine(ctx, inp, out, keyed, threads)
    return dleq.verify(public, ctx, m, z, proof)
