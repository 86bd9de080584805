"""Exact discrete Gaussian noise from a party's secret AES-CTR stream, vectorised.

The algorithm is Canonne, Kamath and Steinke's (NeurIPS 2020, "The Discrete Gaussian for Differential
Privacy", Algorithms 1-3): a discrete Laplace proposal (a uniform remainder below t plus t times a geometric
count), accepted with probability exp(-(|Y| - s2/t)^2 / (2 s2)). Every random decision is a Bernoulli of
exp(-gamma) for an exact rational gamma, decided by comparing a uniform real with exp(-gamma): the real's
first 53 bits against a float64 bound with a rigorous margin (no float decides a close call), and, in the
rare case (about 2^-35 per decision) that the bits fall inside the margin, more bits against an mpmath
interval of exp(-gamma) until they fall outside it. The output is therefore distributed exactly as the
discrete Gaussian, not approximately.

Randomness comes from one of the party's own secret streams (`randomness.KeyStream`: AES-256-CTR under a
key derived from its role secret, drawn from the operating system; tests inject one); never from numpy's,
torch's or Python's generators.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from ..randomness import KeyStream

MARGIN = 2.0**-45  # relative bound on the float64 evaluation of gamma; larger margins only slow it down
# Each proposal's acceptance, a little below the measured (0.63 and 0.66-0.75): one pass fills most calls
LAPLACE_ACCEPTANCE, GAUSSIAN_ACCEPTANCE = 0.6, 0.62
COUNT_MARGIN = 0.0  # extra relative margin on exp(-k) in `geometric_exp1` (its bounds are rigorous; tests widen it)
_U53 = 2.0**-53


def uniform_below(bound: int, n: int, stream: KeyStream) -> np.ndarray:
    """n uniform integers in [0, bound) (int64), by rejection: no modulo bias."""
    if not 1 <= bound < 2**62:
        raise ValueError(f"bound {bound} outside [1, 2^62)")
    excess = 2**64 % bound  # the top `excess` words would favour small remainders
    limit = np.uint64(2**64 - excess) if excess else None
    out, todo = np.empty(n, np.int64), np.arange(n)
    while todo.size:
        words = stream.words(todo.size)
        ok = words < limit if limit is not None else np.ones(words.size, bool)
        out[todo[ok]] = (words[ok] % np.uint64(bound)).astype(np.int64)
        todo = todo[~ok]
    return out


def bernoulli_exp(gamma: np.ndarray, error: np.ndarray, exact: Callable[[int], Fraction],
                  stream: KeyStream) -> np.ndarray:
    """Bernoulli(exp(-gamma_i)) per element, exactly: `gamma` is float64 within `error` of the exact
    rational `exact(i)`; a uniform real U is drawn lazily and the result is U < exp(-gamma_i)."""
    u53 = stream.words(gamma.size) >> np.uint64(11)
    u = u53.astype(np.float64) * _U53
    low = np.exp(-(gamma + error)) * (1 - 2.0**-50)  # exp within an ulp or two: 2^-50 is ample
    high = np.exp(-np.maximum(gamma - error, 0.0)) * (1 + 2.0**-50)
    yes, no = u + _U53 <= low, u >= high
    for i in np.flatnonzero(~(yes | no)):
        yes[i] = _exact_comparison(exact(int(i)), int(u53[i]), stream)
    return yes


def _exact_comparison(gamma: Fraction, head: int, stream: KeyStream) -> bool:
    """U < exp(-gamma), with U's first 53 bits `head` and the rest drawn 64 at a time as needed."""
    numerator, bits, precision = head, 53, 128
    while True:
        low, high = _exp_interval(gamma, precision)
        if Fraction(numerator + 1, 2**bits) <= low:
            return True
        if Fraction(numerator, 2**bits) >= high:
            return False
        numerator = (numerator << 64) | int(stream.words(1)[0])
        bits, precision = bits + 64, precision + 64


def _exp_interval(gamma: Fraction, precision: int) -> tuple[Fraction, Fraction]:
    """Rationals below and above exp(-gamma), from mpmath's interval arithmetic at `precision` bits."""
    import mpmath  # here: the rare close call needs it, start-up should not

    iv, saved = mpmath.iv, mpmath.iv.prec
    iv.prec = precision
    try:
        low, high = iv.exp(-iv.mpf(gamma.numerator) / gamma.denominator)._mpi_
        return _fraction(low), _fraction(high)
    finally:
        iv.prec = saved


def _fraction(raw: tuple) -> Fraction:
    """The exact value of one raw mpmath endpoint (sign, mantissa, exponent, bits): read as it is, never
    through `mpmath.mpf`, which would round it to the global 53-bit context (both ends to one double)."""
    sign, mantissa, exponent, _ = raw
    value = Fraction(mantissa) * (Fraction(2) ** exponent)
    return -value if sign else value


def geometric_exp1(n: int, stream: KeyStream) -> np.ndarray:
    """n draws of V with P(V >= k) = exp(-k), exactly, in one pass: V = #{k >= 1 : U < exp(-k)} for one uniform
    real U each (the number of Bernoulli(exp(-1)) successes before a failure, without drawing them one by one).
    The float count floor(-ln U) is kept where U's 53-bit interval lies clear of exp(-V) and exp(-V-1) by the
    margin; elsewhere (about 2^-40 per draw) more bits of U decide it against mpmath intervals."""
    u53 = stream.words(n) >> np.uint64(11)
    low, high = u53.astype(np.float64) * _U53, (u53.astype(np.float64) + 1) * _U53
    v = np.floor(-np.log(np.maximum((low + high) / 2, _U53))).clip(0, COUNTS - 2).astype(np.int64)
    below_exp, above_exp = _exp_bounds()
    below = (high <= below_exp[v] * (1 - COUNT_MARGIN)) | (v == 0)  # U < exp(-v), certainly
    above = low >= above_exp[v + 1] * (1 + COUNT_MARGIN)  # U >= exp(-(v + 1)), certainly
    for i in np.flatnonzero(~(below & above)):
        v[i] = _exact_count(int(u53[i]), stream)
    return v


COUNTS = 40  # U >= 2^-53, so the count is at most 36: exp(-k) for k < 40 covers every draw


@functools.cache
def _exp_bounds() -> tuple[np.ndarray, np.ndarray]:
    """float64 values below and above exp(-k), k = 0..COUNTS-1, from mpmath's interval arithmetic: the fast
    path's comparisons then rest on no float library's rounding."""
    bounds = [_exp_interval(Fraction(k), 80) for k in range(COUNTS)]
    below = np.array([float(low) for low, _ in bounds]) * (1 - 2.0**-52)  # float() rounds to nearest: step off
    above = np.array([float(high) for _, high in bounds]) * (1 + 2.0**-52)
    return below, above


def _exact_count(head: int, stream: KeyStream) -> int:
    """#{k >= 1 : U < exp(-k)} for U with first 53 bits `head`, more bits drawn 64 at a time (one real U for
    every comparison) until each comparison from k = 1 up to the first failure is decided."""
    numerator, bits, precision = head, 53, 128
    while True:
        count = 0
        while True:
            low, high = _exp_interval(Fraction(count + 1), precision)
            if Fraction(numerator + 1, 2**bits) <= low:  # U < exp(-(count + 1))
                count += 1
            elif Fraction(numerator, 2**bits) >= high:  # U >= exp(-(count + 1)): V = count
                return count
            else:
                break  # undecided at these bits: draw more
        numerator = (numerator << 64) | int(stream.words(1)[0])
        bits, precision = bits + 64, precision + 64


def _accepted(n: int, draw: Callable[[int], tuple[np.ndarray, np.ndarray]], rate: float) -> np.ndarray:
    """The first n accepted of `draw(m)`'s candidates (values, accepted), in order: the candidates are iid, so
    the accepted ones are iid from the target law. Each pass draws enough for the rest at acceptance `rate`,
    so most calls take one pass (every pass costs the stream and numpy a fixed overhead)."""
    out, filled = np.empty(n, np.int64), 0
    while filled < n:
        values, ok = draw(math.ceil((n - filled) / rate) + 16)
        taken = values[ok][:n - filled]
        out[filled:filled + taken.size] = taken
        filled += taken.size
    return out


def discrete_laplace(t: int, n: int, stream: KeyStream) -> np.ndarray:
    """n draws of P(y) proportional to exp(-|y| / t), exactly (CKS Algorithm 2)."""

    def draw(m: int) -> tuple[np.ndarray, np.ndarray]:
        u = uniform_below(t, m, stream)
        keep = bernoulli_exp(u / t, (u / t) * 2.0**-51, lambda i, u=u: Fraction(int(u[i]), t), stream)
        x = u + t * geometric_exp1(m, stream)  # the count of Bernoulli(exp(-1)) successes before a failure
        negative = (stream.words(m) & np.uint64(1)).astype(bool)
        return np.where(negative, -x, x), keep & ~(negative & (x == 0))  # zero only once, not as +0 and -0

    return _accepted(n, draw, LAPLACE_ACCEPTANCE)


def discrete_gaussian(variance: int, n: int, stream: KeyStream) -> np.ndarray:
    """n draws of the discrete Gaussian N_Z(0, variance) on the integers (int64), exactly (CKS Algorithm 3):
    P(y) proportional to exp(-y^2 / (2 variance)); `variance` is a positive integer."""
    if not isinstance(variance, int) or variance < 1:
        raise ValueError(f"variance must be a positive integer, got {variance!r}")
    t = math.isqrt(variance) + 1

    def draw(m: int) -> tuple[np.ndarray, np.ndarray]:
        y = discrete_laplace(t, m, stream)
        size, centre = np.abs(y).astype(np.float64), variance / t
        gamma = (size - centre) ** 2 / (2 * variance)
        error = MARGIN * (1 + gamma + (size + centre) ** 2 / variance)
        exact = lambda i, y=y: Fraction((abs(int(y[i])) * t - variance) ** 2, 2 * variance * t * t)  # noqa: E731
        return y, bernoulli_exp(gamma, error, exact, stream)

    return _accepted(n, draw, GAUSSIAN_ACCEPTANCE)


def pmf(variance: int, support: np.ndarray) -> np.ndarray:
    """The exact discrete Gaussian's probabilities on `support` (mpmath normaliser: tests' reference)."""
    import mpmath

    with mpmath.workdps(30):
        scale = mpmath.mpf(variance)
        norm = mpmath.nsum(lambda k: mpmath.exp(-k * k / (2 * scale)), [-mpmath.inf, mpmath.inf])
        return np.array([float(mpmath.exp(-int(k) ** 2 / (2 * scale)) / norm) for k in support])
