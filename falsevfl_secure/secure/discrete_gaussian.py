"""Exact discrete Gaussian noise from a party's secret AES-CTR stream, vectorised.

The algorithm is Canonne, Kamath and Steinke's (NeurIPS 2020, "The Discrete Gaussian for Differential
Privacy", Algorithm 3): a discrete Laplace proposal of scale t, accepted with probability
exp(-(|Y| - s2/t)^2 / (2 s2)). The proposal's magnitude is one geometric count per uniform real U,
floor(-t ln U), whose law P(V >= k) = P(U < exp(-k/t)) = exp(-k/t) is the discrete Laplace's (their
Algorithm 2 builds it from a uniform remainder and an exp(-1) count, four draws and a 0.6 acceptance at the
scales used here, where this one takes one draw and accepts nearly all). Every random decision compares a
uniform real with exp(-gamma) for an exact rational gamma: the real's first 53 bits against float64 bounds
with a rigorous margin (no float decides a close call), and, in the rare case that the bits fall inside the
margin, more bits against mpmath intervals of exp(-gamma) until they fall outside them. The output is
therefore distributed exactly as the discrete Gaussian, not approximately.

Randomness comes from one of the party's own secret streams (`randomness.KeyStream`: AES-256-CTR under a
key derived from its role secret, drawn from the operating system; tests inject one); never from numpy's,
torch's or Python's generators.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from ..randomness import KeyStream

MARGIN = 2.0**-45  # relative bound on the float64 evaluation of gamma; larger margins only slow it down
# The Gaussian proposal's acceptance, a little below the measured 0.66-0.75: one pass fills most calls
GAUSSIAN_ACCEPTANCE = 0.62
_U53 = 2.0**-53
# Outputs per pass: a pass's dozens of temporaries then stay in cache and in malloc's free lists (a pass of a
# million faulted fresh pages in for each of them and took twice as long)
CHUNK = 2**14


def bernoulli_exp(gamma: np.ndarray, error: np.ndarray, exact: Callable[[int], Fraction],
                  stream: KeyStream) -> np.ndarray:
    """Bernoulli(exp(-gamma_i)) per element, exactly: `gamma` is float64 within `error` of the exact
    rational `exact(i)`; a uniform real U is drawn lazily and the result is U < exp(-gamma_i)."""
    u53 = stream.words(gamma.size) >> np.uint64(11)
    u = u53.astype(np.float64) * _U53
    low, high = exp_bounds(gamma, error)
    yes, no = u + _U53 <= low, (u >= high) & (u53 != 0)  # exp may underflow to 0: U's next bits decide
    for i in np.flatnonzero(~(yes | no)):
        yes[i] = _below(exact(int(i)), [int(u53[i]), 53], stream)
    return yes


def exp_bounds(gamma: np.ndarray, error: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Floats below and above exp(-g) for every g >= 0 within `error` of `gamma`, from one exp: exp(-e) >= 1 - e and
    exp(e) <= 1 + 2e for e <= 1, numpy's exp within 2^-51 (tested), the products' roundings inside the 2^-49
    and 2^-48 terms, 2^-1000 apart at least (a denormal exp's products round coarsely, or are flushed to 0);
    an error of 1 or more gets no upper bound but 1."""
    base = np.exp(-gamma)
    low, high = base * (1 - error - 2.0**-49) - 2.0**-1000, base * (1 + 2 * error + 2.0**-48) + 2.0**-1000
    np.putmask(high, error >= 1, 1.0)
    return low, high


def _below(gamma: Fraction, u: list[int], stream: KeyStream) -> bool:
    """U < exp(-gamma), for the uniform real U whose known bits are `u` = [numerator, bits]: more bits are
    drawn 64 at a time (and kept in `u`, so later comparisons read the same U) until the bits decide it."""
    precision = u[1] + 75
    while True:
        low, high = _exp_interval(gamma, precision)
        if Fraction(u[0] + 1, 2 ** u[1]) <= low:
            return True
        if Fraction(u[0], 2 ** u[1]) >= high:
            return False
        u[0], u[1], precision = (u[0] << 64) | int(stream.words(1)[0]), u[1] + 64, precision + 64


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


def geometric(t: int, n: int, stream: KeyStream) -> np.ndarray:
    """n draws of V with P(V >= k) = exp(-k / t), exactly, one uniform real U each: V = floor(-t ln U). The
    float count is kept where -t ln U over U's whole 53-bit interval, widened by the float error, has one
    floor; elsewhere (where the interval or the margin meets an integer: about 2^-21 of the draws at the scales
    DP-SGD uses, t near 2^26; none in 2 million measured) more bits of U decide it against mpmath intervals."""
    return _counts(t, stream.words(n) >> np.uint64(11), stream)


def _counts(t: int, u53: np.ndarray, stream: KeyStream) -> np.ndarray:
    """floor(-t ln U) for each U whose first 53 bits are `u53` (the stream supplies more where they must).
    Over U's interval [low, low + 2^-53) the count lies between -t ln(low) and -t ln(low) - t 2^-53 / low
    (ln(1 + y) <= y): one log bounds both ends."""
    _check_scale(t)
    low = u53.astype(np.float64) * _U53
    with np.errstate(divide="ignore", invalid="ignore"):  # U's interval starts at 0: no upper end, decided below
        x = -t * np.log(low)
        most = np.floor(x * (1 + COUNT_MARGIN))  # the largest count U's interval allows
        least = np.floor(x * (1 - COUNT_MARGIN) - (t * _U53) / low * (1 + COUNT_MARGIN))  # and the smallest
        v = least.astype(np.int64)
    for i in np.flatnonzero(most != least):
        guess = least[i] if np.isfinite(least[i]) else t * 53 * math.log(2)  # U < 2^-53: V > 36.7 t
        v[i] = _exact_geometric(t, int(u53[i]), max(int(guess), 0), stream)
    return v


# Relative error allowed to numpy's log and the products: numpy's log is within 2^-51 (tests check it against
# mpmath on this machine, shift it by ULPs to exercise this margin, and widen it to exercise the exact path)
COUNT_MARGIN = 2.0**-48


def _check_scale(t: int) -> None:
    if not 1 <= t < 2**52:  # larger counts would not fit the float path's int64
        raise ValueError(f"scale {t} outside [1, 2^52)")


def _exact_geometric(t: int, head: int, guess: int, stream: KeyStream) -> int:
    """max{k : U < exp(-k / t)} for U with first 53 bits `head` (more drawn as needed), by bisection between
    a k that U is below (V >= lo) and one it is not (V < hi), each decided exactly."""
    u = [head, 53]
    lo = max(0, guess - 1)
    while lo > 0 and not _below(Fraction(lo, t), u, stream):
        lo //= 2  # k = 0 always holds: U < 1
    hi = max(lo + 1, guess + 2)
    while _below(Fraction(hi, t), u, stream):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _below(Fraction(mid, t), u, stream) else (lo, mid)
    return lo


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


def _laplace_candidates(t: int, m: int, stream: KeyStream) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """m discrete Laplace candidates of scale t: (value, magnitude, kept). The magnitude is one geometric count
    from a word's top 53 bits, the sign that word's lowest bit (independent of them); -0 is refused, so
    zero comes once, not twice."""
    words = stream.words(m)
    size = _counts(t, words >> np.uint64(11), stream)
    negative = (words & np.uint64(1)).astype(np.int64)
    return size - 2 * negative * size, size, (size != 0) | (negative == 0)


def _kept(t: int) -> float:
    return 1 - (1 - math.exp(-1 / t)) / 2  # the share of Laplace candidates that are not -0


def discrete_laplace(t: int, n: int, stream: KeyStream) -> np.ndarray:
    """n draws of P(y) proportional to exp(-|y| / t), exactly: a sign and a count V with P(V >= k) =
    exp(-k / t), -0 refused."""
    _check_scale(t)  # before `_kept` divides by it
    return _accepted(n, lambda m: _laplace_candidates(t, m, stream)[::2], 0.99 * _kept(t))


def discrete_gaussian(variance: int, n: int, stream: KeyStream) -> np.ndarray:
    """n draws of the discrete Gaussian N_Z(0, variance) on the integers (int64), exactly (CKS Algorithm 3):
    P(y) proportional to exp(-y^2 / (2 variance)); `variance` is a positive integer. A candidate is kept when
    the Laplace proposal keeps it and its Bernoulli accepts: one selection for both."""
    if not isinstance(variance, int) or variance < 1:
        raise ValueError(f"variance must be a positive integer, got {variance!r}")
    t = math.isqrt(variance) + 1

    def draw(m: int) -> tuple[np.ndarray, np.ndarray]:
        y, size, kept = _laplace_candidates(t, m, stream)
        magnitude, centre = size.astype(np.float64), variance / t
        gamma = (magnitude - centre) ** 2 / (2 * variance)
        # MARGIN (1 + gamma + (m + c)^2 / variance) bounds gamma's float error; (m + c)^2 <= 2 (m - c)^2 + 8 c^2
        # makes that at most this, in two array operations instead of six
        error = MARGIN * (1 + 8 * centre**2 / variance) + (5 * MARGIN) * gamma
        exact = lambda i: Fraction((int(size[i]) * t - variance) ** 2, 2 * variance * t * t)  # noqa: E731
        return y, kept & bernoulli_exp(gamma, error, exact, stream)

    out, rate = np.empty(n, np.int64), GAUSSIAN_ACCEPTANCE * _kept(t)
    for start in range(0, n, CHUNK):  # iid chunks: their concatenation is iid too
        out[start:start + CHUNK] = _accepted(min(CHUNK, n - start), draw, rate)
    return out


def pmf(variance: int, support: np.ndarray) -> np.ndarray:
    """The exact discrete Gaussian's probabilities on `support` (mpmath normaliser: tests' reference)."""
    import mpmath

    with mpmath.workdps(30):
        scale = mpmath.mpf(variance)
        norm = mpmath.nsum(lambda k: mpmath.exp(-k * k / (2 * scale)), [-mpmath.inf, mpmath.inf])
        return np.array([float(mpmath.exp(-int(k) ** 2 / (2 * scale)) / norm) for k in support])
