"""The mpc secure sum over real worlds of K = 2, 3, 4 processes: the sum reaches `dst` only, exactly the sum of
the fixed-point encodings; out-of-range input fails loudly on every rank that must know (nobody hangs); what
`dst` receives is masked by pairwise keys, and unmasking one party takes every other party together."""

from __future__ import annotations

import time

import pytest
import torch

from falsevfl_secure.audit import share_bits_uniform
from falsevfl_secure.randomness import KeyStream
from falsevfl_secure.runtime.world import WorkerError, run_world
from falsevfl_secure.secure.errors import SecureRangeError
from falsevfl_secure.secure.fixed_point import encode_fixed_point
from falsevfl_secure.secure.masks import X25519Agreement, zero_share
from falsevfl_secure.secure.mpc_sum import ReceivedShare, secure_sum
from falsevfl_secure.transport.protocols import Mpc

SCALE = 2**16
SHAPES = ((4, 3), (2, 5, 7), (48, 64))  # the last: enough values to test a partial unmasking for uniformity
PAIR_KEYS: dict[int, bytes] = {}  # filled inside each rank's process by the recording agreement


class RecordingAgreement(X25519Agreement):
    """The shipped X25519 agreement that also remembers its pair keys: what a member of a coalition pools."""

    def pair_keys(self, rank, public_keys, transcript=None, purpose="secure-sum"):
        keys = super().pair_keys(rank, public_keys, transcript, purpose)
        if purpose == "secure-sum":
            PAIR_KEYS.clear()
            PAIR_KEYS.update(keys)
        return keys


RECORDING = Mpc(agreement=RecordingAgreement)


def _value(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Distinct per-rank values with negatives and entries near +-1000."""
    g = torch.Generator().manual_seed(1000 * rank + len(shape))
    x = (torch.rand(shape, generator=g, dtype=torch.float64) - 0.5) * 2000.0
    x.view(-1)[0] = 999.99 - rank
    x.view(-1)[1] = -999.99 + rank
    return x


def _run_sums(role) -> dict:
    """One party: sums for both shapes to different dsts, then a refused sum, then one more sum."""
    rank, size, shares, peers = role.rank, role.peers.n_parties, role.backend.cipher.shares, role.peers
    out: dict = {"sums": [], "views": [], "keys": {str(k): v.hex() for k, v in PAIR_KEYS.items()}}
    for i, shape in enumerate(SHAPES):
        dst = (size - 1) if i == 0 else 0
        view: list[ReceivedShare] = []
        res = secure_sum(_value(rank, shape).float() if i else _value(rank, shape), dst, shares, peers, view=view)
        out["sums"].append(None if res is None else res.numpy())
        out["views"].append([[v.src, v.raw.numpy()] for v in view])
    bad = torch.full((4, 3), 1.0)
    if rank == 1:  # a value that could wrap the ring: it and dst must raise, nobody may hang
        bad[2, 1] = 1e15
    try:
        out["refused"] = secure_sum(bad, 0, shares, peers)
    except SecureRangeError as exc:
        out["refused"] = f"SecureRangeError: {exc}"
    res = secure_sum(torch.full((2, 2), float(rank) - 0.25), 0, shares, peers)  # the world is still in step
    out["after"] = None if res is None else res.numpy()
    return out


_RESULTS: dict[int, list[dict]] = {}


def _world(size: int) -> list[dict]:
    """Run the parties once per world size; several tests read the same run."""
    if size not in _RESULTS:
        _RESULTS[size] = run_world(RECORDING, size, _run_sums, timeout_s=90)
    return _RESULTS[size]


def _inputs(i: int, size: int) -> list[torch.Tensor]:
    shape = SHAPES[i]
    return [_value(r, shape).float().double() if i else _value(r, shape) for r in range(size)]


@pytest.mark.parametrize("size", [2, 3, 4])
def test_secure_sum_reaches_dst_only_and_is_the_exact_sum_of_encodings(size: int) -> None:
    results = _world(size)
    for i, _shape in enumerate(SHAPES):
        dst = (size - 1) if i == 0 else 0
        inputs = _inputs(i, size)
        encoded = sum(encode_fixed_point(x) for x in inputs)
        for rank, res in enumerate(results):
            if rank != dst:
                assert res["sums"][i] is None and res["views"][i] == []  # non-dst ranks receive nothing
                continue
            got = torch.as_tensor(res["sums"][i])
            assert torch.equal(got, encoded.double() / SCALE)  # exact: the sum of the encodings
            assert torch.allclose(got, torch.stack(inputs).sum(0), rtol=0, atol=size / SCALE)
            assert sorted(src for src, _ in res["views"][i]) == sorted(set(range(size)) - {dst})
            for src, raw in res["views"][i]:  # every message dst received is masked
                assert (torch.as_tensor(raw)[:-1] != encode_fixed_point(inputs[src]).reshape(-1)).all()
    assert "the input of 1 party" in results[0]["refused"]
    assert "outside the range" in results[1]["refused"]
    assert all(r["refused"] is None for r in results[2:])
    expected = torch.full((2, 2), sum(r - 0.25 for r in range(size)))
    assert torch.allclose(torch.as_tensor(results[0]["after"]).float(), expected)


def _mask_from(keys_of: dict, offset: int, owner: int, peer: int, n: int) -> torch.Tensor:
    """What pair (owner, peer) adds to the owner's share, from the pooled key: every party consumes the
    same number of stream elements per sum, so a sum's range starts after the earlier sums' elements."""
    draw = torch.from_numpy(KeyStream(bytes.fromhex(keys_of[str(peer)]), 8 * offset).integers(n).copy())
    return draw if peer > owner else -draw


def test_unmasking_a_party_takes_every_other_party_together(attacked) -> None:
    """collusion.toml, mpc: dst plus all other parties unmask party 2 exactly; any smaller coalition does not."""
    size, target, i, dst = 4, 2, 1, 0
    results = _world(size)
    share = torch.as_tensor(dict((s, r) for s, r in results[dst]["views"][i])[target])
    encoded = encode_fixed_point(_inputs(i, size)[target].float()).reshape(-1)
    keys, offset = results[target]["keys"], sum(torch.Size(shape).numel() + 1 for shape in SHAPES[:i])
    masks = {peer: _mask_from(keys, offset, target, peer, share.numel()) for peer in range(size) if peer != target}
    unmasked = share - sum(masks.values())
    attacked("mpc collusion (all K-1 others)", "shipped, K=4", f"{int((unmasked[:-1] == encoded).sum())} of "
             f"{encoded.numel()} values exact")
    assert torch.equal(unmasked[:-1], encoded) and unmasked[-1] == 0  # everyone else together: exact
    # The pooled keys of every coalition that lacks one other party leave the share masked.
    for missing in (p for p in range(size) if p != target):
        partial = share - sum(m for peer, m in masks.items() if peer != missing)
        attacked("mpc collusion (one party missing)", f"shipped, K=4, without {missing}",
                 f"{int((partial[:-1] == encoded).sum())} of {encoded.numel()} values exact")
        assert (partial[:-1] != encoded).all(), missing
    # Both ends of a pair derive the same key (the agreement is symmetric).
    assert results[target]["keys"][str(dst)] == results[dst]["keys"][str(target)]


def test_what_a_coalition_short_of_the_threshold_unmasks_is_uniform(attacked) -> None:
    """collusion.toml, mpc, beyond inequality: for every target and every coalition of dst and the others but one,
    what the coalition's pooled keys leave of the target's share is uniform on Z_2^64 (every bit and the top
    byte at 5 sigma); the same statistic rejects what the full coalition unmasks (the fixed-point input)."""
    size, i, dst = 4, 2, 0
    results = _world(size)
    offset = sum(torch.Size(shape).numel() + 1 for shape in SHAPES[:i])
    for target in range(1, size):
        share = torch.as_tensor(dict((s, r) for s, r in results[dst]["views"][i])[target])
        keys = results[target]["keys"]
        masks = {p: _mask_from(keys, offset, target, p, share.numel()) for p in range(size) if p != target}
        full = (share - sum(masks.values()))[:-1]
        assert not share_bits_uniform([full.numpy()])[0]  # the threshold coalition reads the input
        for missing in (p for p in range(size) if p not in (target, dst)):
            partial = (share - sum(m for p, m in masks.items() if p != missing))[:-1]
            ok, z = share_bits_uniform([partial.numpy()])
            attacked("mpc collusion (one party missing)", f"shipped, K=4, target {target}, without {missing}",
                     f"partial unmasking uniform: worst z {z:.2f}")
            assert ok, (target, missing, z)


def _rank1_fails(role) -> None:
    if role.rank == 1:
        raise KeyError("party 1 crashed")
    secure_sum(torch.zeros(3), 0, role.backend.cipher.shares, role.peers)  # rank 0 would wait for rank 1 here


def _stalls(role) -> None:
    time.sleep(60)


@pytest.mark.parametrize(("fn", "timeout_s", "message"),
                         [(_rank1_fails, 30.0, r"party1 failed .*: KeyError"),
                          (_stalls, 8.0, r"did not finish within 8.0 s")])
def test_failing_or_stalled_party_is_named_and_every_child_reaped(fn, timeout_s: float, message: str) -> None:
    import multiprocessing

    before = set(multiprocessing.active_children())
    start = time.monotonic()
    with pytest.raises(WorkerError, match=message):
        run_world("mpc", 2, fn, timeout_s=timeout_s)
    assert time.monotonic() - start < timeout_s + 10
    assert not [p for p in multiprocessing.active_children() if p not in before]


def _shares_of(role) -> dict:
    shares = role.backend.cipher.shares
    sizes = [5, 17, 3, 40, 40, 1]
    ahead = [shares.take(n).numpy() for n in sizes]  # the first takes of fresh streams (position 0)
    replay = {k: KeyStream(s._key) for k, s in shares._streams.items()}
    now = [zero_share(role.rank, replay, n).numpy() for n in sizes]
    return {"ahead": ahead, "now": now}


def test_zero_shares_cancel_and_shares_drawn_ahead_are_the_shares_drawn_on_demand() -> None:
    results = run_world("mpc", 3, _shares_of, timeout_s=90)
    for r in results:
        assert all((a == b).all() for a, b in zip(r["ahead"], r["now"], strict=True))
        assert any(v != 0 for part in r["ahead"] for v in part)  # a share is not itself zero
    for j in range(6):
        total = sum(torch.as_tensor(r["ahead"][j]) for r in results)  # int64 addition wraps: the ring
        assert (total == 0).all()


@pytest.mark.parametrize("build", ["weakened: a refusal's value slots left at zero", "shipped"])
def test_a_refused_input_does_not_unmask_the_other_parties(build, attacked) -> None:
    """Review finding: a party that refuses its own input (NaN, or out of range) still sends its zero share, so
    the masks cancel; with its value slots left at zero the ring total was the exact sum of the other parties'
    encodings, the other passive party's own value at K = 3 once the active party takes its own off. Its value
    slots now carry uniform secret noise: the total tells nothing."""
    import secrets as secrets_module

    from falsevfl_secure.secure import mpc_sum
    from falsevfl_secure.secure.masks import ZeroShares

    keys = {(a, b): secrets_module.token_bytes(32) for a in range(3) for b in range(a + 1, 3)}
    shares = [ZeroShares(k, {j: keys[min(j, k), max(j, k)] for j in range(3) if j != k}) for k in range(3)]
    victim = torch.tensor([0.25, -3.0, 7.5])
    weak = build.startswith("weakened")
    real = mpc_sum.secrets.token_bytes
    try:
        if weak:
            mpc_sum.secrets.token_bytes = lambda n: bytes(n)
        refused, error = mpc_sum.masked_message(torch.tensor([float("nan"), 1.0, 2.0]), shares[1], 3, None)
    finally:
        mpc_sum.secrets.token_bytes = real
    honest, _ = mpc_sum.masked_message(victim, shares[2], 3, None)
    own, _ = mpc_sum.masked_message(torch.zeros(3), shares[0], 3, None)  # the active party's own: zero
    total = own + refused + honest
    recovered = mpc_sum.decode_fixed_point(total[:-1])
    exact = bool(torch.equal(recovered.float(), victim))
    attacked("a refused input unmasks the others (active, mpc)", build, f"victim's value recovered: {exact}")
    assert error is not None and int(total[-1]) == 1
    assert exact == weak
    for s in shares:
        s.close()
