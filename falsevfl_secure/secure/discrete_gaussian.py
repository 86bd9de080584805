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


def bernoulli_exp(gamma: np.ndarray, error: np.ndarray, exact: Callable[[int], Fraction],
                  stream: KeyStream) -> np.ndarray:
    """Bernoulli(exp(-gamma_i)) per element, exactly: `gamma` is float64 within `error` of the exact
    rational `exact(i)`; a uniform real U is drawn lazily and the result is U < exp(-gamma_i)."""
    u53 = stream.words(gamma.size) >> np.uint64(11)
    u = u53.astype(np.float64) * _U53
    low = np.exp(-(gamma + error)) * (1 - 2.0**-50)  # exp within an ulp or two: 2^-50 is ample
    high = np.exp(-np.maximum(gamma - error, 0.0)) * (1 + 2.0**-50)
    yes, no = u + _U53 <= low, (u >= high) & (u53 != 0)  # exp may underflow to 0: U's next bits decide
    for i in np.flatnonzero(~(yes | no)):
        yes[i] = _below(exact(int(i)), [int(u53[i]), 53], stream)
    return yes


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
    if not 1 <= t < 2**52:
        raise ValueError(f"scale {t} outside [1, 2^52)")
    return _counts(t, stream.words(n) >> np.uint64(11), stream)


def _counts(t: int, u53: np.ndarray, stream: KeyStream) -> np.ndarray:
    """floor(-t ln U) for each U whose first 53 bits are `u53` (the stream supplies more where they must)."""
    low = u53.astype(np.float64) * _U53
    with np.errstate(divide="ignore"):  # U's interval starts at 0: no upper end, decided below
        most = np.floor(-t * np.log(low) * (1 + COUNT_MARGIN))  # the largest count U's interval allows
    least = np.floor(-t * np.log(low + _U53) * (1 - COUNT_MARGIN))  # and the smallest
    v = least.astype(np.int64)
    for i in np.flatnonzero(most != least):
        v[i] = _exact_geometric(t, int(u53[i]), int(least[i]), stream)
    return v


# Relative error allowed to numpy's log and the product: 4x the 2^-50 that `bernoulli_exp` allows numpy's exp
# (tests check both functions against mpmath on this machine, and widen this margin to exercise the exact path)
COUNT_MARGIN = 2.0**-48


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


def discrete_laplace(t: int, n: int, stream: KeyStream) -> np.ndarray:
    """n draws of P(y) proportional to exp(-|y| / t), exactly: a sign and a count V with P(V >= k) =
    exp(-k / t); -0 is refused so zero comes once, not twice (acceptance 1 - (1 - exp(-1/t)) / 2)."""

    def draw(m: int) -> tuple[np.ndarray, np.ndarray]:
        x = geometric(t, m, stream)
        negative = (stream.words(m) & np.uint64(1)).astype(bool)
        return np.where(negative, -x, x), ~(negative & (x == 0))

    return _accepted(n, draw, 0.99 - (1 - math.exp(-1 / t)) / 2)


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
