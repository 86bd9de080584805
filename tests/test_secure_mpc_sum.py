"""Secure sum over real CrypTen worlds of K = 2, 3, 4 forked processes: the sum reaches `dst` only, within
K * 2^-16; out-of-range input fails loudly on every rank that must know (nobody hangs); and what `dst`
receives is masked, unmaskable only by `dst` together with both ring neighbours of a party."""

from __future__ import annotations

import functools
import multiprocessing
import time

import pytest
import torch

from falsevfl_secure.crypten_shim import encode_fixed_point, import_crypten
from falsevfl_secure.secure.crypten_world import WorkerError, run_crypten_world
from falsevfl_secure.secure.errors import SecureRangeError
from falsevfl_secure.secure.mpc_sum import ReceivedShare, secure_sum, zero_share

SCALE = 2**16
SHAPES = ((4, 3), (2, 5, 7))


def _value(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Distinct per-rank values with negatives and entries near +-1000."""
    g = torch.Generator().manual_seed(1000 * rank + len(shape))
    x = (torch.rand(shape, generator=g, dtype=torch.float64) - 0.5) * 2000.0
    x.view(-1)[0] = 999.99 - rank
    x.view(-1)[1] = -999.99 + rank
    return x


def _draws(generator: torch.Generator, n: int) -> list[int]:
    """What a PRZS draw of n ring elements from `generator` gives (CrypTen's generate_random_ring_element)."""
    crypten = import_crypten()
    return crypten.common.rng.generate_random_ring_element((n,), generator=generator).tolist()


def _saved(kind: str) -> torch.Generator:
    crypten = import_crypten()
    g = torch.Generator()
    g.set_state(crypten.generators[kind][torch.device("cpu")].get_state())
    return g


def _run_sums(rank: int, world_size: int) -> dict:
    """One CrypTen party: sums for both shapes to different dsts, then a refused sum, then one more sum."""
    out: dict = {"sums": [], "views": []}
    for i, shape in enumerate(SHAPES):
        dst = (world_size - 1) if i == 0 else 0
        prev, nxt = _saved("prev"), _saved("next")
        view: list[ReceivedShare] = []
        res = secure_sum(_value(rank, shape).float() if i else _value(rank, shape), dst, view=view)
        numel = torch.Size(shape).numel() + 1
        out["sums"].append(None if res is None else res.tolist())
        out["views"].append([(v.src, v.raw.tolist()) for v in view])
        # This party's own PRZS draws for the sum, so the test can play colluding neighbours.
        out.setdefault("prev_draws", []).append(_draws(prev, numel))
        out.setdefault("next_draws", []).append(_draws(nxt, numel))
    # Rank 1 brings a value that could wrap the ring: it and dst must raise, nobody may hang.
    bad = torch.full((4, 3), 1.0)
    if rank == 1:
        bad[2, 1] = 1e15
    try:
        out["refused"] = secure_sum(bad, 0)
    except SecureRangeError as exc:
        out["refused"] = f"SecureRangeError: {exc}"
    # The world is still in step afterwards.
    res = secure_sum(torch.full((2, 2), float(rank) - 0.25), 0)
    out["after"] = None if res is None else res.tolist()
    return out


@functools.cache
def _world(world_size: int) -> list[dict]:
    """Run the parties once per world size; several tests read the same run."""
    return run_crypten_world(world_size, _run_sums, timeout_s=60)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_secure_sum_reaches_dst_only_and_is_exact_to_fixed_point(world_size: int) -> None:
    results = _world(world_size)
    for i, shape in enumerate(SHAPES):
        dst = (world_size - 1) if i == 0 else 0
        inputs = [_value(r, shape).float().double() if i else _value(r, shape) for r in range(world_size)]
        expected = torch.stack(inputs).sum(0)
        for rank, res in enumerate(results):
            if rank != dst:
                assert res["sums"][i] is None and res["views"][i] == []  # non-dst ranks receive nothing
                continue
            got = torch.tensor(res["sums"][i], dtype=torch.float64)
            assert got.shape == expected.shape
            assert torch.allclose(got, expected, rtol=0, atol=world_size / SCALE)
            view = res["views"][i]
            assert sorted(src for src, _ in view) == sorted(set(range(world_size)) - {dst})
            for src, raw in view:  # every message dst received is masked, not the party's encoded value
                encoded = encode_fixed_point(inputs[src]).reshape(-1)
                assert (torch.tensor(raw[:-1]) != encoded).all()

    assert all(isinstance(r["refused"], str) for r in (results[0], results[1]))
    assert "rank 1" in results[1]["refused"] and "safe fixed-point range" in results[1]["refused"]
    assert "refused" in results[0]["refused"] and "1 party" in results[0]["refused"]
    assert all(r["refused"] is None for r in results[2:])
    after = torch.tensor(results[0]["after"])
    assert torch.allclose(after, torch.full((2, 2), sum(r - 0.25 for r in range(world_size))), atol=1e-9)


def test_dst_plus_both_neighbours_unmask_a_party_but_dst_plus_one_does_not() -> None:
    """The collusion threshold of CrypTen's zero sharing, on the K = 4 world (dst 0, target party 2)."""
    world_size, target, shape_index = 4, 2, 1
    results = _world(world_size)
    dst = 0
    share = dict(results[dst]["views"][shape_index])[target]
    # Party r's mask is draw(prev seed shared with r-1) - draw(next seed shared with r+1); rank r-1 holds the
    # first as its "next" draw, rank r+1 the second as its "prev" draw.
    from_left = torch.tensor(results[target - 1]["next_draws"][shape_index])
    from_right = torch.tensor(results[target + 1]["prev_draws"][shape_index])
    encoded = encode_fixed_point(_value(target, SHAPES[shape_index]).float()).reshape(-1)
    unmasked = torch.tensor(share) - from_left + from_right
    assert torch.equal(unmasked[:-1], encoded)
    assert unmasked[-1] == 0  # no error flag
    assert ((torch.tensor(share) - from_left)[:-1] != encoded).all()  # one neighbour is not enough
    assert ((torch.tensor(share) + from_right)[:-1] != encoded).all()


def test_secure_sum_needs_an_initialised_crypten_world() -> None:
    with pytest.raises(RuntimeError, match="not initialized"):
        secure_sum(torch.zeros(2), 0)


def _rank1_fails(rank: int, world_size: int) -> None:
    if rank == 1:
        raise KeyError("party 1 crashed")
    secure_sum(torch.zeros(3), 0)  # rank 0 would wait for rank 1 here until its gloo timeout


def _stalls(rank: int, world_size: int) -> None:
    time.sleep(60)


@pytest.mark.parametrize(
    ("fn", "timeout_s", "message"),
    [(_rank1_fails, 10.0, "rank 1 failed first: KeyError"), (_stalls, 2.0, r"rank\(s\) \[0, 1\] missed")],
)
def test_failing_or_stalled_party_is_named_and_every_child_reaped(fn, timeout_s: float, message: str) -> None:
    before = set(multiprocessing.active_children())
    start = time.monotonic()
    with pytest.raises(WorkerError, match=message):
        run_crypten_world(2, fn, timeout_s=timeout_s)
    assert time.monotonic() - start < timeout_s + 5
    assert not [p for p in multiprocessing.active_children() if p not in before]


def _zero_share_and_crypten_przs(rank: int, world_size: int) -> dict:
    crypten = import_crypten()
    cpu = torch.device("cpu")
    states = {kind: crypten.generators[kind][cpu].get_state() for kind in ("prev", "next")}
    ours = zero_share(crypten, 37)
    for kind, state in states.items():
        crypten.generators[kind][cpu].set_state(state)
    theirs = crypten.mpc.primitives.ArithmeticSharedTensor.PRZS((37,)).share
    return {"ours": ours.tolist(), "theirs": theirs.tolist()}


def test_zero_share_draws_exactly_crypten_przs_and_the_shares_cancel() -> None:
    results = run_crypten_world(3, _zero_share_and_crypten_przs, timeout_s=60)
    for r in results:
        assert r["ours"] == r["theirs"]
        assert any(v != 0 for v in r["ours"])  # a share is not itself zero
    totals = [sum(column) % 2**64 for column in zip(*(r["ours"] for r in results), strict=True)]
    assert totals == [0] * 37


def _stream_versus_draws_on_demand(rank: int, world_size: int) -> dict:
    from falsevfl_secure.secure.mpc_sum import ZeroShareStream

    crypten = import_crypten()
    cpu = torch.device("cpu")
    states = {kind: crypten.generators[kind][cpu].get_state() for kind in ("prev", "next")}
    sizes = [5, 17, 3, 40, 40, 1]
    stream = ZeroShareStream(crypten)
    ahead = [stream.take(n).tolist() for n in sizes]
    stream.close()  # no draw may still run when the generators are rewound
    for kind, state in states.items():
        crypten.generators[kind][cpu].set_state(state)
    return {"ahead": ahead, "now": [zero_share(crypten, n).tolist() for n in sizes]}


def test_shares_drawn_ahead_are_the_shares_drawn_on_demand() -> None:
    for r in run_crypten_world(3, _stream_versus_draws_on_demand, timeout_s=60):
        assert r["ahead"] == r["now"]
