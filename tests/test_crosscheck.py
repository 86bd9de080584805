"""The passive parties' check of the active party's placement (`secure.crosscheck`), in one process: every
rank a thread of a `MemoryWorld`. Independent truth: the test's own record sets and rows. The federation
path (real processes, a hostile active party) is in tests/test_threat_models.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from align_channels import MemoryWorld
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.secure import crosscheck as module
from falsevfl_secure.secure.crosscheck import Agreement, MisplacedRecords, crosscheck

SESSION = bytes(range(16))


def _world(held: list[np.ndarray], rows: list[np.ndarray]) -> list:
    """Every rank runs the check on its records (`held`: record numbers; `rows`: each one's row)."""
    names = {r: f"p{r}" for r in range(len(held))}

    def party(channel):
        rank = channel.rank
        ids = [f"rec-{i}".encode() for i in held[rank]]
        others = {r: n for r, n in names.items() if r != rank}
        return crosscheck(channel, others, {r: held[r].size for r in others}, ids, rows[rank], SESSION)

    return MemoryWorld(len(held), timeout=30).run([party] * len(held))


def _records(draw, parties: int, union: int) -> list[np.ndarray]:
    return [np.flatnonzero(np.array(draw(st.lists(st.booleans(), min_size=union, max_size=union))))
            for _ in range(parties)]


@settings(max_examples=12, deadline=None)
@given(st.data(), st.integers(2, 3), st.integers(1, 40))
def test_an_honest_placement_passes_and_each_pair_learns_how_many_records_it_shares(data, parties, union):
    held = _records(data.draw, parties, union)
    order = np.random.default_rng(union).permutation(union)  # the shared order: any row per record
    out = _world(held, [order[h] for h in held])
    for rank, found in enumerate(out):
        truth = [Agreement(p, int(np.intersect1d(held[rank], held[p]).size),
                           int(np.intersect1d(held[rank], held[p]).size)) for p in range(parties) if p != rank]
        assert sorted(found, key=lambda a: a.peer) == truth


@settings(max_examples=12, deadline=None)
@given(st.data(), st.integers(2, 40), st.sampled_from(["swap", "drop", "fresh"]))
def test_one_shared_record_at_two_rows_is_refused_by_both_holders(data, union, how):
    """Whatever row the active party gives one holder's copy of one shared record (another record's, none,
    a row nobody has), both holders refuse, naming it, and say how many of their shared records moved."""
    held = _records(data.draw, 2, union)
    shared = np.intersect1d(*held)
    if shared.size == 0:  # at least one record both hold
        held = [np.union1d(h, [0]) for h in held]
        shared = np.intersect1d(*held)
    order = np.random.default_rng(union).permutation(union)
    rows = [order[h] for h in held]
    moved = int(np.flatnonzero(held[1] == data.draw(st.sampled_from(shared.tolist())))[0])
    if how == "swap" and held[1].size > 1:  # with the next record of the same holder
        partner = (moved + 1) % held[1].size
        rows[1][[moved, partner]] = rows[1][[partner, moved]]
        split = 1 + int(held[1][partner] in shared)
    else:
        rows[1][moved], split = (-1 if how == "drop" else union + 3), 1
    for error in _world(held, rows):
        assert isinstance(error, MisplacedRecords), error
        assert str(error).startswith(f"{split} of the {shared.size} records this party shares with")


def _role(pins: dict[str, bytes]):
    from types import SimpleNamespace

    return SimpleNamespace(session=SimpleNamespace(active="A", id=SESSION),
                           spec=SimpleNamespace(cast=SimpleNamespace(pins=pins)))


def test_announcements_compared_between_passive_parties_name_whoever_forged_or_equivocated():
    """Two digests the active party signed that differ prove it announced differently (it is named); a digest it
    did not sign is the peer's forgery (the peer is named); an equal one passes."""
    from falsevfl_secure.federation.aligned import _same_announcement, common_digest
    from falsevfl_secure.network.wire import Refused
    from falsevfl_secure.secure.identity import generate, public_bytes, sign

    active, other = generate(), generate()
    role = _role({"A": public_bytes(active)})

    def signed(key, labeled: int) -> bytes:
        digest = common_digest(SESSION, 20, np.array([30, 25]), np.arange(20), np.arange(labeled), np.arange(0))
        return digest + sign(key, "common rows", SESSION + digest)

    mine = signed(active, 3)
    _same_announcement(role, mine, signed(active, 3), "C")
    for theirs, offender in ((signed(active, 4), "A"), (signed(other, 3), "C"), (signed(other, 4), "C"),
                             (mine[:-1], "C"), (mine[:32] + bytes(64), "C")):
        with pytest.raises(Refused) as refused:
            _same_announcement(role, mine, theirs, "C")
        assert refused.value.offender == offender, (offender, refused.value)


def test_the_common_digest_covers_every_part_of_the_announcement_and_the_run():
    from falsevfl_secure.federation.aligned import common_digest

    base = (SESSION, 30, np.array([20, 15, 12]), np.arange(0, 30, 2), np.arange(0, 10, 2), np.arange(10, 14, 2))
    digests = {common_digest(*base)}
    for k in range(6):
        changed = list(base)
        changed[k] = (bytes(16) if k == 0 else changed[k] + 1 if k == 1 else np.append(changed[k], 28))
        digests.add(common_digest(*changed))
    moved = (SESSION, 30, base[2], np.arange(0, 30, 2), np.arange(0, 8, 2), np.arange(8, 14, 2))  # one moved over
    digests.add(common_digest(*moved))
    digests.add(common_digest(SESSION, 30, None, *base[3:]))
    assert len(digests) == 9


def _views(monkeypatch, shuffle: bool, held: list[np.ndarray]) -> tuple[list[bytes], list[bytes], np.ndarray]:
    """Party 0's frames (sent, received) in one check, and the order in which it sent its own X list."""
    sent, received, orders = [], [], {}
    real = module.secret_permutation

    def permutation(n):  # the own lists (first two draws) always shuffled; the returned ones only where `shuffle`
        drawn = orders.setdefault(threading.current_thread().name, [])
        order = real(n) if shuffle or len(drawn) < 2 else np.arange(n)
        drawn.append(order)
        return order

    monkeypatch.setattr(module, "secret_permutation", permutation)
    world = MemoryWorld(2, timeout=30)
    original = world.channel

    def channel(rank):
        end = original(rank)
        if rank == 0:
            send, recv = end.send, end.recv
            end.send = lambda dst, p: (sent.append(p), send(dst, p))[1]
            end.recv = lambda src: received.append(recv(src)) or received[-1]
        return end

    world.channel = channel
    ends = {}

    def party(ch):
        ends[ch.rank] = threading.current_thread().name
        ids = [f"rec-{i}".encode() for i in held[ch.rank]]
        return crosscheck(ch, {1 - ch.rank: "q"}, {1 - ch.rank: held[1 - ch.rank].size}, ids, held[ch.rank], SESSION)

    out = world.run([party, party])
    assert all(isinstance(o, list) for o in out), out
    return sent, received, orders[ends[0]][0]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_party_cannot_tell_which_of_its_records_the_other_holds(monkeypatch, shuffle, attacked):
    """Party 0 attacks: it knows the order in which it sent its blinded records, receives them back with both
    scalars on, and holds the other's records with both scalars (what it returned). Reading the returned list in
    its own order tells it exactly which records the other holds where nobody shuffles (weakened build); the
    shipped check returns them shuffled and the same reading is at chance. (Each party's own lists are shuffled in
    both builds: only the return differs.)"""
    union = 2000  # about 1,000 records each: chance is 50 % +- 1.6 %
    rng = np.random.default_rng(5)  # the parties' records, not a secret
    held = [np.flatnonzero(rng.random(union) < 0.5), np.flatnonzero(rng.random(union) < 0.5)]
    sent, received, order = _views(monkeypatch, shuffle, held)
    p = 32
    theirs = {sent[2][i:i + p] for i in range(0, len(sent[2]), p)}  # the other's X, both scalars, as returned
    mine = [received[2][i:i + p] for i in range(0, len(received[2]), p)]  # ours (X), both scalars, as sent back
    guess = np.zeros(held[0].size, dtype=bool)
    guess[order] = [point in theirs for point in mine]  # the returned list read in the order we sent ours
    truth = np.isin(held[0], held[1])
    accuracy = float((guess == truth).mean())
    base = max(truth.mean(), 1 - truth.mean())
    attacked("which records the other passive party holds (crosscheck)", "shipped" if shuffle else
             "weakened: returned unshuffled", f"{accuracy:.1%} of {truth.size} records (base rate {base:.1%})")
    assert guess.sum() == truth.sum()  # the count is disclosed by design
    if shuffle:
        assert accuracy < 0.62
    else:
        assert accuracy == 1.0


@pytest.mark.parametrize("sent", [33, 64, 128])
def test_a_list_of_other_than_the_peers_count_is_refused_naming_it(sent):
    """Not whole points, or another number of points than the peer listed in the alignment (a larger set would
    probe more IDs than it holds): refused, naming that peer."""
    from falsevfl_secure.secure.crosscheck import MalformedList

    def liar(ch):
        ch.exchange(0, b"x" * sent, 0)

    out = MemoryWorld(2, timeout=5).run([lambda ch: crosscheck(ch, {1: "q"}, {1: 3}, [b"a"], np.zeros(1, np.int64),
                                                               SESSION), liar])
    assert isinstance(out[0], MalformedList) and out[0].peer == 1, out[0]
    assert f"party 1 sent a list of {sent} bytes, not 3 points" in str(out[0])


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=2, max_size=9, unique=True))
def test_the_pairs_meet_once_each_in_rounds_of_disjoint_pairs(ranks):
    """Whatever the ranks: every party meets every other exactly once, in n - 1 rounds (n even; n rounds with a
    bye each when odd), and in each round its partner has it as partner (disjoint pairs, the same rounds)."""
    from falsevfl_secure.secure.crosscheck import pair_rounds

    schedule = {r: pair_rounds(r, [p for p in ranks if p != r]) for r in ranks}
    rounds = len(ranks) - 1 + len(ranks) % 2
    for r, order in schedule.items():
        assert len(order) == rounds and sorted(p for p in order if p is not None) == sorted(set(ranks) - {r})
        assert all(p is None or schedule[p][k] == r for k, p in enumerate(order))
    assert all(sum(order[k] is None for order in schedule.values()) == len(ranks) % 2 for k in range(rounds))


def test_five_passive_parties_check_every_pair_in_rounds():
    held = [np.arange(k, k + 30) for k in range(5)]
    out = _world(held, [h * 2 for h in held])
    for rank, found in enumerate(out):
        assert sorted(a.peer for a in found) == [p for p in range(5) if p != rank]
        assert all(a.shared == a.placed_alike == 30 - abs(rank - a.peer) for a in found), found


def _split(buf: bytes) -> list[bytes]:
    return [buf[i:i + 32] for i in range(0, len(buf), 32)]


def _probe(candidates: list[bytes], tagged: bool, n: int):
    """A malicious passive party's side of one check: it blinds `candidates` instead of its records (each with
    its own scalar where `tagged`, else each repeated as often as its index + 1, up to `n` points), returns the
    other's lists reblinded by a scalar it uses nowhere else, and keeps what it needs to read membership offline."""
    from falsevfl_secure.secure import ristretto

    def party(ch):
        hashed = _split(module._hashed(candidates, np.zeros(len(candidates), np.int64), SESSION)[0])
        if tagged:
            keys = [ristretto.random_scalar() for _ in candidates]
            mine = b"".join(ristretto.scalar_mult(k, h) for k, h in zip(keys, hashed, strict=True))
        else:
            keys = ristretto.random_scalar()
            picks = np.repeat(np.arange(len(candidates)), np.arange(1, len(candidates) + 1))  # the i-th, i + 1 times
            pad = ristretto.hash_to_group_batch([f"pad-{i}".encode() for i in range(n - picks.size)])
            mine = b"".join(ristretto.scalar_mult(keys, hashed[i]) for i in picks) + pad
        filler = ristretto.hash_to_group_batch([f"filler-{i}".encode() for i in range(n)])
        theirs = ch.exchange(1, module._shuffled(mine), 1)
        their_y = ch.exchange(1, filler, 1)
        junk = ristretto.random_scalar()  # the other's lists back under a scalar that matches nothing of its
        back = ch.exchange(1, module._shuffled(ristretto.scalar_mult_batch(junk if tagged else keys, theirs)), 1)
        ch.exchange(1, module._shuffled(ristretto.scalar_mult_batch(junk, their_y)), 1)
        return keys, theirs, back

    return party


def test_a_chosen_id_sent_several_times_is_refused(monkeypatch, attacked):
    """Red team, attack A: a malicious passive party sends its i-th chosen ID i times; the reblinded list comes
    back shuffled but with the same multiplicities, so each group names its ID and, matched against the other's
    list, tells which the other holds. A build that takes repeated points (weakened) lets it read every one; the
    shipped check refuses the list, naming its sender."""
    held = np.arange(0, 40, 2)  # the honest party's records: the even numbers
    candidates = [f"rec-{i}".encode() for i in range(5)]  # 15 points of the 20 it listed
    n = held.size

    def honest(ch):
        return crosscheck(ch, {0: "M"}, {0: n}, [f"rec-{i}".encode() for i in held], held, SESSION)

    for build in ("weakened: repeated points taken", "shipped"):
        if build.startswith("weakened"):
            monkeypatch.setattr(module, "_repeats", lambda points: False)
        out = MemoryWorld(2, timeout=3).run([_probe(candidates, False, n), honest])
        monkeypatch.undo()
        if not isinstance(out[0], tuple):  # it never got its list back
            attacked("which chosen IDs another passive party holds: repeated points (passive)", build,
                     f"refused: {str(out[1])[:50]}")
            assert build == "shipped" and "holds a point twice" in str(out[1]) and out[1].peer == 0, out
            continue
        key, theirs, back = out[0]
        mine = set(_split(module.ristretto.scalar_mult_batch(key, theirs)))
        sizes: dict = {}
        for point in _split(back):
            sizes[point] = sizes.get(point, 0) + 1
        named = sorted(sizes[p] - 1 for p in sizes if p in mine)  # a group of i + 1 points is the i-th ID
        attacked("which chosen IDs another passive party holds: repeated points (passive)", build,
                 f"named {named} of ids 0..4, truth {[i for i in range(5) if i in held]}")
        assert build.startswith("weakened") and named == [i for i in range(5) if i in held]


def test_a_malicious_passive_party_learns_which_of_its_chosen_ids_the_other_holds(attacked):
    """Red team, attack B, disclosed and stated (threat_models/malicious_pinned_party.toml): with one scalar per
    chosen ID, a malicious passive party reads, offline, which of them the other holds (its ID list is its own
    word: nothing ties it to what it listed in the alignment), at len(chosen) x len(other's) multiplications; it
    returns junk, so the other counts 0 shared of 0 and notices nothing. Bounded by its own count in the
    alignment (at most max_ids) per peer and run."""
    from falsevfl_secure.secure import ristretto

    held = np.arange(0, 120, 3)
    candidates = [f"rec-{i}".encode() for i in range(60)]

    def honest(ch):
        return crosscheck(ch, {0: "M"}, {0: len(candidates)}, [f"rec-{i}".encode() for i in held], held, SESSION)

    out = MemoryWorld(2, timeout=30).run([_probe(candidates, True, len(candidates)), honest])
    assert out[1] == [Agreement(0, 0, 0)]  # the honest party's check passed: it learned nothing amiss
    keys, theirs, back = out[0]
    returned = set(_split(back))
    named = [i for i, k in enumerate(keys) if returned & set(_split(ristretto.scalar_mult_batch(k, theirs)))]
    truth = [i for i in range(60) if i in held]
    attacked("which chosen IDs another passive party holds: one scalar each (passive)", "shipped (stated)",
             f"named {len(named)} of {len(truth)} held, {len(set(named) - set(truth))} false, of 60 chosen")
    assert named == truth


def test_a_refused_alignment_or_crosscheck_frame_names_its_sender_where_the_frame_shows_it():
    """Red team: a malformed frame named its receiver as failed. Now a frame whose fault is its sender's own (not
    bytes, an invalid point, a repeated point, a count of its own) is that sender's refusal; a length that follows
    from a count the active party announced names nobody (either may be wrong)."""
    from types import SimpleNamespace

    from falsevfl_secure.federation.aligned import _named
    from falsevfl_secure.network.wire import Refused
    from falsevfl_secure.secure import align as align_module
    from falsevfl_secure.secure.crosscheck import MalformedList

    role = SimpleNamespace(peers=SimpleNamespace(names=("clinic", "lab", "insurer")))

    def raising(error):
        def run():
            raise error
        return run

    with pytest.raises(Refused) as refused:
        _named(role, raising(align_module.AlignmentFrameError("align: pass1 frame from party 2: bad point", 2)))
    assert refused.value.offender == "insurer" and "from 'insurer'" in str(refused.value)
    with pytest.raises(Refused) as refused:
        _named(role, raising(MalformedList("crosscheck: party 1 sent a list that holds a point twice", 1)))
    assert refused.value.offender == "lab" and "'lab' sent a list" in str(refused.value)
    with pytest.raises(align_module.AlignmentFrameError) as counted:
        align_module._expect_length(b"x" * 31, 32, "pass1", 2, counted=True)
    assert counted.value.sender is None
    with pytest.raises(align_module.AlignmentFrameError) as own:
        align_module._expect_length(b"x" * 9, 8, "sizes", 2)
    assert own.value.sender == 2
    assert _named(role, lambda: 7) == 7


@pytest.mark.parametrize("build", ["weakened: any shortfall skips the check", "shipped"])
def test_a_shortfall_announced_into_a_prediction_cannot_switch_the_check_off(monkeypatch, build, attacked):
    """Review finding: a shortfall stops training at every party, so the passive parties skip their crosscheck then;
    a malicious active party signed one into a prediction's announcement (which asks for no overlap, and never
    stops on one), and the prediction went on unchecked, its records free to sit at two rows. Where the party's own
    policy asks for no minimum overlap, an announced shortfall is the active party's refusal, before any sum."""
    from types import SimpleNamespace

    from falsevfl_secure.federation import aligned as module_aligned
    from falsevfl_secure.network.wire import Refused
    from falsevfl_secure.secure.align import Alignment

    checked = []
    monkeypatch.setattr(module_aligned, "_check_with_passive_peers", lambda *a, **k: checked.append(True))
    monkeypatch.setattr(module_aligned, "align", lambda *a, **k: Alignment(4, np.arange(4), None, np.array([4, 4, 4])))
    short = (module_aligned.Shortfall(2, 0, 0),)
    monkeypatch.setattr(module_aligned, "_announced",
                        lambda role, result, listed: (np.arange(4), np.arange(0), np.arange(0), (4, 4), short, b"s"))
    if build.startswith("weakened"):
        monkeypatch.setattr(module_aligned, "_refuse_unasked_shortfall", lambda *a: None)
    role = SimpleNamespace(is_active=False, peers=SimpleNamespace(active_index=0, n_parties=3, rank=1,
                                                                  names=("lab", "bank", "clinic")),
                           network=SimpleNamespace(tighten=lambda *a: None), channel=lambda: None)
    try:  # as `predict` aligns: restricted to the active party's records, no minimum overlap
        module_aligned.align_table(role, ("a", "b", "c", "d"), np.ones(4, bool), None, restrict=True,
                                   policy=module_aligned.Policy(max_ids=100))
        outcome = "went on, checked" if checked else "went on unchecked"
    except Refused as refusal:
        outcome = f"refused, naming {refusal.offender}"
    attacked("a shortfall signed into a prediction (active)", build, outcome)
    assert outcome == ("went on unchecked" if build.startswith("weakened") else "refused, naming lab"), outcome
