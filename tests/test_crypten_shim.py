"""The CrypTen import shim and our fixed-point coding: CrypTen imports on this torch, the shares of our mpc
sum are valid CrypTen shares (CrypTen's own reveal gives the exact sum of our encodings), and our decoder
fixes CrypTen's off-by-one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from crypten_compat import reveal_with_crypten
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.runtime.world import run_world
from falsevfl_secure.secure.crypten_shim import import_crypten
from falsevfl_secure.secure.errors import SecureRangeError
from falsevfl_secure.secure.fixed_point import decode_fixed_point, encode_fixed_point, max_safe_abs

SCALE = 2**16
WORLD = 3
SHAPE = (3, 4)


def _rank_input(rank: int) -> torch.Tensor:
    """Deterministic per-rank input with negatives, including one of CrypTen's mis-decoded values."""
    g = torch.Generator().manual_seed(100 + rank)
    x = (torch.rand(SHAPE, generator=g, dtype=torch.float64) - 0.5) * 200.0
    x[0, 0] = -1.0 - rank  # integers and just-above-integers are where CrypTen's decoder slips
    x[0, 1] = -2.0 + 1.0 / SCALE
    return x


def _masked_share(role) -> dict:
    """Each party's masked share of its input (what it would send in a secure sum)."""
    x = _rank_input(role.rank)
    share = encode_fixed_point(x) + role.backend.cipher.shares.take(x.numel()).reshape(SHAPE)
    return {"share": share.numpy()}


def test_import_crypten_is_cached_and_aliases_the_moved_torch_module() -> None:
    crypten = import_crypten()
    assert import_crypten() is crypten
    assert crypten.__version__ == "0.4.1"
    assert "torch.onnx._internal.registration" in sys.modules
    # None of the optional dependencies that --no-deps skipped is needed to import it.
    assert "torchvision" not in sys.modules and "tensorboard" not in sys.modules


def _install_check(blocked: tuple[str, ...] | None = None) -> subprocess.CompletedProcess:
    """The Makefile's install check in a fresh interpreter (optionally blocking other names)."""
    patch = f"crypten_shim.DECLARED_NOT_NEEDED = {blocked!r}; " if blocked else ""
    code = f"from falsevfl_secure.secure import crypten_shim; {patch}raise SystemExit(crypten_shim.main())"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # this checkout's package
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_the_install_check_imports_crypten_without_its_declared_extras_and_has_teeth() -> None:
    ok = _install_check()
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("CrypTen 0.4.1 imports with its runtime needs present (torch ")
    assert "future, sklearn, tensorboard, torchvision are not needed" in ok.stdout
    # Blocking a module CrypTen does import fails the check with one clear line: the blocking is real.
    bad = _install_check(("onnx",))
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "error: CrypTen does not import: onnx (blocked: CrypTen must import without it) "
        "(`make venv` installs it and what it needs)"]


def test_our_masked_shares_are_crypten_shares_of_the_exact_sum() -> None:
    results = run_world("mpc", WORLD, _masked_share, timeout_s=90)
    shares = [torch.as_tensor(res["share"]) for res in results]
    raw, decoded = reveal_with_crypten(shares)
    encoded = sum(encode_fixed_point(_rank_input(r)) for r in range(WORLD))
    assert torch.equal(raw, encoded)  # CrypTen's ring, CrypTen's reveal
    for rank, share in enumerate(shares):
        assert (share != encode_fixed_point(_rank_input(rank))).all()  # masked
    expected = sum(_rank_input(r) for r in range(WORLD))
    assert torch.allclose(decode_fixed_point(encoded), expected, rtol=0, atol=WORLD / SCALE)
    # CrypTen's decoder of the very same revealed integers is off by 1.0 somewhere; ours is exact.
    assert (decoded.double() - expected).abs().max() > 0.99


def test_our_decoder_is_exact_where_cryptens_is_off_by_one() -> None:
    crypten = import_crypten()
    raw = torch.tensor([-131071], dtype=torch.int64)  # -2 + 2^-16
    theirs = crypten.encoder.FixedPointEncoder().decode(raw).double()
    ours = decode_fixed_point(raw)
    assert ours.item() == -2.0 + 1.0 / SCALE
    assert theirs.item() == pytest.approx(ours.item() - 1.0, abs=1e-9)


@settings(max_examples=50, deadline=None)
@given(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False))
def test_encode_decode_round_trip_within_half_a_step(x: float) -> None:
    t = torch.tensor([x], dtype=torch.float64)
    assert abs(decode_fixed_point(encode_fixed_point(t)).item() - x) <= 0.5 / SCALE


def test_encode_refuses_non_finite_and_ring_wrapping_values(refused) -> None:
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(SecureRangeError, match="NaN/inf"):
            encode_fixed_point(torch.tensor([1.0, bad]))
        refused("value beyond range (mpc)")
    limit = max_safe_abs(n_addends=8)
    encode_fixed_point(torch.tensor([-limit * 0.999], dtype=torch.float64), n_addends=8)
    with pytest.raises(SecureRangeError, match="outside the range") as err:
        encode_fixed_point(torch.tensor([limit * 1.001], dtype=torch.float64), n_addends=8)
    refused("value beyond range (mpc)")
    assert isinstance(err.value, ValueError) and "8 addend" in str(err.value)
    # A value that is fine alone can wrap once summed over many parties.
    x = torch.tensor([2.0**44])
    encode_fixed_point(x, n_addends=1)
    with pytest.raises(SecureRangeError):
        encode_fixed_point(x, n_addends=8)
    refused("value beyond range (mpc)")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=-2.0**40, max_value=2.0**40, allow_nan=False, width=32), min_size=1, max_size=40),
       st.integers(0, 30))
def test_float32_encoding_equals_the_exact_float64_rounding(values, exponent) -> None:
    """The float32 fast path is not an approximation: same integers as rounding in float64."""
    x = torch.tensor(values, dtype=torch.float32) / 2.0**exponent
    expected = torch.round(x.double() * SCALE).to(torch.int64)
    assert torch.equal(encode_fixed_point(x, n_addends=2), expected)
