"""The alignment's star ring and its hop proofs (`secure.ring`, `secure.dleq`): the schedule against its own
definition, the batched Chaum-Pedersen proof against tampered lists, and the attacks it stops, each against a
weakened build (no hop checks) where it succeeds and the shipped one where it is refused naming the party.
Independent truth: the raw ID lists and set arithmetic (tests/test_align.py's `check_against_truth`)."""

from __future__ import annotations

import numpy as np
import pytest
from align_channels import MemoryWorld
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.secure import align as align_module
from falsevfl_secure.secure import dleq, ristretto
from falsevfl_secure.secure import keyed as keyed_module
from falsevfl_secure.secure import ring as ring_module
from falsevfl_secure.secure.align import align, group_hash
from falsevfl_secure.secure.ring import AlignmentFrameError, hops


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9).flatmap(lambda k: st.tuples(st.just(k), st.integers(0, k - 1))))
def test_every_list_gets_every_scalar_once_and_each_hop_is_checked_by_a_third_party(world):
    """Per origin: the origin's own scalar (the active party's list: its throwaway, then its own scalar last) and
    the provers of its hops are every rank once; each hop's input comes from the previous hop's prover and its
    output goes to the next hop's prover (the last to the origin); no prover checks or feeds itself."""
    k, active = world
    schedule = hops(k, active)
    assert len(schedule) == k * (k - 1)
    for origin in range(k):
        chain = sorted((h for h in schedule if h.origin == origin), key=lambda h: h.index)
        assert [h.index for h in chain] == list(range(1, k))
        provers = [h.prover for h in chain]
        assert sorted(provers + [origin]) == list(range(k))  # (the active party's own scalar: applied after)
        assert chain[0].source == origin
        assert all(a.receiver == b.prover and b.source == a.prover for a, b in zip(chain, chain[1:], strict=False))
        assert chain[-1].receiver == origin
        assert all(h.prover not in (h.source, h.receiver) for h in chain)
        assert (origin == active) == (active not in provers)  # the active party multiplies every other list last
        assert origin == active or chain[-1].prover == active


def _hop(n, tamper=None):
    """A hop of n points by a fresh scalar, then `tamper` applied to its output; (verified?, public key)."""
    scalar = ristretto.random_scalar()
    inp = ristretto.hash_to_group_batch([b"%d" % i for i in range(n)], prefix=ristretto.random_scalar())
    out = ristretto.scalar_mult_batch(scalar, inp)
    context = b"session" + bytes(24)
    m_prover = dleq.combine(context, dleq.digest(inp), dleq.digest(out), inp)
    proof = dleq.prove(scalar, context, m_prover)
    if tamper is not None:
        out = tamper(out)
    m = dleq.combine(context, dleq.digest(inp), dleq.digest(out), inp)  # the sender of the input, as it is asked
    z = dleq.combine(context, dleq.digest(inp), dleq.digest(out), out)  # the receiver
    return dleq.verify(ristretto.base_mult(scalar), context, m, z, proof)


def _points(out):
    return [out[o:o + 32] for o in range(0, len(out), 32)]


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 40), st.data())
def test_a_hop_verifies_exactly_when_every_point_is_its_inputs_times_the_announced_scalar(n, data):
    i, j = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, n - 1))
    other = ristretto.random_scalar()
    assert _hop(n)
    swapped = (lambda out: b"".join(_swap(_points(out), i, j))) if i != j else None
    for tamper in (swapped,  # two points exchanged: two rows of the origin misplaced
                   lambda out: b"".join(p if t != i else ristretto.scalar_mult(other, p)  # one under another scalar
                                        for t, p in enumerate(_points(out))),
                   lambda out: ristretto.scalar_mult_batch(other, out)):  # the whole list under another scalar
        if tamper is not None:
            assert not _hop(n, tamper)


def _swap(points, i, j):
    points[i], points[j] = points[j], points[i]
    return points


def test_a_proof_holds_for_its_context_and_key_only_and_malformed_proofs_fail():
    scalar, context = ristretto.random_scalar(), b"ctx"
    inp = ristretto.hash_to_group_batch([b"a", b"b", b"c"])
    out = ristretto.scalar_mult_batch(scalar, inp)
    m = dleq.combine(context, dleq.digest(inp), dleq.digest(out), inp)
    z = dleq.combine(context, dleq.digest(inp), dleq.digest(out), out)
    proof, public = dleq.prove(scalar, context, m), ristretto.base_mult(scalar)
    assert dleq.verify(public, context, m, z, proof)
    assert not dleq.verify(public, b"another hop", m, z, proof)  # replayed into another hop
    assert not dleq.verify(ristretto.base_mult(ristretto.random_scalar()), context, m, z, proof)
    order = (2**252 + 27742317777372353535851937790883648493).to_bytes(32, "little")
    s_plus_order = (int.from_bytes(proof[32:], "little") + int.from_bytes(order, "little")).to_bytes(33, "little")
    for bad in (proof[:63], bytes(64), proof[:32] + s_plus_order[:32], b"\xff" * 64):
        assert not dleq.verify(public, context, m, z, bad)
    assert not dleq.verify(public, context, bytes(32), z, proof)  # the identity as M
    with pytest.raises(ristretto.InvalidPointError):
        dleq.combine(context, b"", b"", b"")


def _ids(k):
    shared = [f"shared-{i}" for i in range(12)]
    return [shared + [f"own-{r}-{i}" for i in range(8)] for r in range(k)]


def _run(id_lists, active, timeout=10):
    return MemoryWorld(len(id_lists), timeout=timeout).run(
        [lambda ch, r=r: align(ch, id_lists[r], active) for r in range(len(id_lists))])


def _misplaced(id_lists, results, ranks):
    """Records two parties both hold that the alignment gave each a different position."""
    rows = [dict(zip(id_lists[r], results[r].positions.tolist(), strict=True)) for r in ranks]
    return sum(rows[0][i] != rows[1][i] for i in set(rows[0]) & set(rows[1]))


def _weaken(monkeypatch, build, attacker):
    """The weakened build skips the hop checks; in both, the attacker proves its hops on whatever M it is given (an
    honest prover refuses to prove lists other than it multiplied)."""
    if build == "weakened: no hop checks":
        monkeypatch.setattr(align_module, "check_hops", lambda *args: None)
    real = ring_module._prove

    def prove(ring, hop, part):
        if ring.rank == attacker:
            return dleq.prove(ring.scalar, ring.context(hop), part[64:])
        return real(ring, hop, part)

    monkeypatch.setattr(ring_module, "_prove", prove)


@pytest.mark.parametrize("build", ["weakened: no hop checks", "shipped"])
@pytest.mark.parametrize("how", ["pseudonyms", "keyed points"])
def test_an_active_party_that_splits_a_record_two_parties_hold_is_refused(monkeypatch, build, how, attacked):
    """The active party (0) returns party 1 its pseudonyms (or their keyed points, by which the union is sorted) with
    those of two records it shares with party 2 exchanged: those rows would be one holder's alone, and their sums
    that holder's contribution. The weakened build checks neither the hops nor the keyed points."""
    _weaken(monkeypatch, build, 0)
    if build.startswith("weakened"):
        monkeypatch.setattr(keyed_module, "verify", lambda *args: True)
    if how == "keyed points":
        real = align_module._shared_order

        def split(lists, counts, active, restrict):
            found = real(lists, counts, active, restrict)
            lists[1] = b"".join(_swap(_points(lists[1]), 0, 1))  # after the true order: what party 1 receives
            return found

        monkeypatch.setattr(align_module, "_shared_order", split)
    else:
        multiply = ring_module.Ring.multiply

        def swapped(self, origin, index, points):
            out = multiply(self, origin, index, points)
            return b"".join(_swap(_points(out), 0, 1)) if self.rank == 0 and origin == 1 else out

        monkeypatch.setattr(ring_module.Ring, "multiply", swapped)
    id_lists = _ids(3)
    id_lists[2] = id_lists[1] + ["two-only"]  # every record of party 1 is shared with party 2
    results = _run(id_lists, 0)
    attack = f"split a shared record by its {how} (malicious active)"
    if build == "shipped":
        said = {"pseudonyms": "that party 0 multiplied (hop 2) fails its proof",
                "keyed points": "keyed pseudonyms fail"}
        assert isinstance(results[1], AlignmentFrameError) and said[how] in str(results[1]), results[1]
        assert results[1].sender == (0 if how == "keyed points" else None)  # (a hop's failure: 0 or its input's sender)
        attacked(attack, build, "refused by party 1, naming party 0")
        return
    moved = _misplaced(id_lists, results, (1, 2))
    attacked(attack, build, f"{moved} shared records split")
    assert moved == 2


@pytest.mark.parametrize("build", ["weakened: no hop checks", "shipped"])
@pytest.mark.parametrize("how", ["reorders", "re-blinds one point"])
def test_a_passive_party_that_tampers_with_a_list_it_relays_is_refused(monkeypatch, build, how, attacked):
    """Party 2 (passive, K = 4: it relays party 1's list on the ring) exchanges two of its points, or multiplies one
    by another scalar, before sending it on: party 1's rows would be misplaced (or dropped) at every party."""
    _weaken(monkeypatch, build, 2)
    real, other = ring_module.Ring.send_list, ristretto.random_scalar()

    def tampered(self, dst, origin, index, points):
        if self.rank == 2 and origin == 1 and index == 1:
            listed = _points(points)
            listed = _swap(listed, 0, 1) if how == "reorders" else [ristretto.scalar_mult(other, listed[0])] + \
                listed[1:]
            points = b"".join(listed)
        return real(self, dst, origin, index, points)

    monkeypatch.setattr(ring_module.Ring, "send_list", tampered)
    id_lists = _ids(4)
    id_lists[0] = sorted(set().union(*id_lists))  # the active party holds every record: each one is compared
    results = _run(id_lists, 0)
    refused = [r for r in results if isinstance(r, Exception)]
    if build == "shipped":
        assert refused and all(isinstance(e, AlignmentFrameError) and "party 2 multiplied" in str(e) for e in refused)
        attacked(f"relay {how} a list (malicious passive)", build, f"refused by {len(refused)} party, naming it")
        return
    moved = _misplaced(id_lists, results, (1, 0))
    attacked(f"relay {how} a list (malicious passive)", build, f"{moved} of party 1's records misplaced, accepted")
    assert not refused and moved == (2 if how == "reorders" else 1)


def test_an_active_party_that_publishes_another_union_to_one_party_is_seen_in_the_transcript(monkeypatch):
    """The union is not proved (the active party sorts it); a party given another one gets another transcript,
    which the passive parties compare through the signed announcement (tests/test_threat_models.py runs it)."""
    real_send = ring_module.Wire.send

    def send(self, dst, payload):
        if self.channel.rank == 0 and dst == 2 and len(payload) == 32 * 36:  # the union of 12 + 3 x 8 records
            payload = bytes(31) + b"\x01" + payload  # a first record added: every later position one on
        return real_send(self, dst, payload)

    monkeypatch.setattr(ring_module.Wire, "send", send)
    id_lists = _ids(3)
    results = _run(id_lists, 0)
    assert results[1].transcript == results[0].transcript != results[2].transcript
    assert _misplaced(id_lists, results, (1, 2)) == 12  # what it would split, were the transcripts not compared


def test_two_parties_align_and_check_their_hops_alone():
    """K = 2: the passive party checks the active party's hop on its list itself (it sent the input: nobody to ask),
    and the active party the passive party's hop on its own; each gives the other M for its proof."""
    id_lists = [["a", "b", "c"], ["b", "c", "d", "e"]]
    views = [[], []]
    results = MemoryWorld(2).run([lambda ch, r=r: align(ch, id_lists[r], 0, view=views[r]) for r in range(2)])
    assert results[0].n_union == results[1].n_union == 5
    assert _misplaced(id_lists, results, (0, 1)) == 0
    assert [[e["step"] for e in view if e["step"].startswith("hop")] for view in views] == [["hop-answer",
                                                                                              "hop-proof"]] * 2
    assert np.array_equal(results[0].sizes, [3, 4]) and results[0].transcript == results[1].transcript


@pytest.mark.parametrize("build", ["weakened: a union of the pseudonyms themselves", "shipped"])
def test_a_passive_party_cannot_test_ids_of_its_choice_against_the_union(monkeypatch, build, attacked):
    """Review finding: a passive party lists b H(x) (times its scalar) for 60 IDs x of its choice, 30 of them held
    by another party; its returned point for x is then the union's point for b P(x). Were the union the pseudonyms
    themselves (or any multiplicative function of them), 1/b times it would be P(x)'s, looked up in the union: who
    else holds x. The shipped union keys each pseudonym through a hash (secure/keyed.py)."""
    import threading

    if build.startswith("weakened"):
        monkeypatch.setattr(keyed_module, "hashed", lambda session, pseudonyms, threads=1: pseudonyms)
    b, who, real = ristretto.random_scalar(), threading.local(), align_module._blind_own

    def blind(encoded, order, session, scalar, threads=1):
        out = _points(real(encoded, order, session, scalar, threads))
        if getattr(who, "attacker", False):
            out = [ristretto.scalar_mult(b, p) if encoded[r].startswith(b"probe") else p
                   for r, p in zip(order, out, strict=True)]
        return b"".join(out)

    monkeypatch.setattr(align_module, "_blind_own", blind)
    probes = [f"probe{i}" for i in range(60)]
    lists = [[f"a{i}" for i in range(40)] + probes[:20], [f"c{i}" for i in range(10)] + probes,
             [f"b{i}" for i in range(30)] + probes[20:30]]
    view, secrets_of = [], {}

    def attacker(ch):
        who.attacker = True
        return align(ch, lists[1], 0, view=view, secrets_out=secrets_of)

    results = MemoryWorld(3, timeout=30).run([lambda ch: align(ch, lists[0], 0), attacker,
                                              lambda ch: align(ch, lists[2], 0)])
    assert not [r for r in results if isinstance(r, Exception)], results
    mine = _points(next(e["payload"] for e in view if e["step"] == "keyed")[32:-64])
    union = set(_points(next(e["payload"] for e in view if e["step"] == "union")))
    unblind = ristretto.scalar_invert(b)
    named = {lists[1][r] for r, p in zip(secrets_of["order"], mine, strict=True)
             if lists[1][r].startswith("probe") and ristretto.scalar_mult(unblind, p) in union}
    held = set(probes[:30])
    attacked("test chosen IDs against the union (malicious passive)", build,
             f"named {len(named & held)} of the 30 held by others, {len(named - held)} false, of 60 chosen")
    assert named == (held if build.startswith("weakened") else set())


@pytest.mark.parametrize("build", ["weakened: the prover proves on any weighted sum", "shipped"])
def test_with_two_parties_the_active_party_gets_no_proof_on_a_point_of_its_choice(monkeypatch, build, attacked):
    """Review finding: with two parties the active party is both the source and the receiver of the passive party's
    hop on its list, so a proof on M = H(x) for an ID x it did not list would let it test a_1 H(x) against the
    passive party's list it received: whether that party holds x, one ID beyond max_ids. The prover recomputes M
    there."""
    import threading

    if build.startswith("weakened"):
        monkeypatch.setattr(ring_module, "_prove", lambda ring, hop, part: dleq.prove(ring.scalar, ring.context(hop),
                                                                                      part[64:]))
    who, real_combine, real_check, probe = threading.local(), dleq.combine, align_module.check_hops, {}

    def combine(context, inp, out, points, threads=1):
        if getattr(who, "checking", False) and not probe.get("sent"):  # the active party's M of its own list
            probe["sent"] = group_hash(context[:16], "x-held")
            return probe["sent"]
        return real_combine(context, inp, out, points, threads)

    def check(ring, schedule):
        who.checking = ring.rank == 0
        return real_check(ring, schedule)

    monkeypatch.setattr(dleq, "combine", combine)
    monkeypatch.setattr(align_module, "check_hops", check)
    views = [[], []]
    lists = [[f"a{i}" for i in range(5)], ["x-held"] + [f"p{i}" for i in range(5)]]
    results = MemoryWorld(2, timeout=3).run([lambda ch, r=r: align(ch, lists[r], 0, view=views[r]) for r in range(2)])
    proofs = [e["payload"] for e in views[0] if e["step"] == "hop-proof"]
    if build == "shipped":
        assert isinstance(results[1], AlignmentFrameError) and results[1].sender == 0 and not proofs, results
        attacked("a proof on a point of its choice, K = 2 (malicious active)", build, "refused by the passive party")
        return
    final = next(e["payload"] for e in views[0] if e["step"] == "final")
    session = next(e["payload"] for e in views[1] if e["step"] == "session")[:16]
    ctx = session + ring_module._HOP.pack(0, 1, 1)
    public = next(e["payload"] for e in views[0] if e["step"] == "sizes")[8:]
    held = any(dleq.verify(public, ctx, probe["sent"], z, proofs[0]) for z in _points(final))
    attacked("a proof on a point of its choice, K = 2 (malicious active)", build, f"tested x-held: {held}")
    assert held


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 700), st.sampled_from([1, 2]), st.binary(min_size=0, max_size=16), st.data())
def test_a_weighted_sum_is_the_sum_of_its_hashed_weights_times_its_points_and_refuses_invalid_ones(n, threads, seed,
                                                                                                   data):
    """ristretto.weighted_sum against one libsodium call at a time (weights reduced SHA-512 of seed || i), on one
    thread and split over two (above 256 points a thread); an invalid point anywhere is refused."""
    import hashlib

    points = ristretto.hash_to_group_batch([b"%d" % i for i in range(n)], prefix=seed)
    total = None
    for i in range(n):
        weight = ristretto.scalar_reduce(hashlib.sha512(seed + i.to_bytes(8, "little")).digest())
        term = ristretto.scalar_mult(weight, points[32 * i:32 * i + 32])
        total = term if total is None else ristretto.point_add(total, term)
    assert ristretto.weighted_sum(seed, points, threads) == total
    at = data.draw(st.integers(0, n - 1))
    bad = data.draw(st.sampled_from([b"\xff" * 32, bytes(32), points[32 * at:32 * at + 31] + bytes([points[32 * at + 31]
                                                                                                     | 0x80])]))
    with pytest.raises(ristretto.InvalidPointError):
        ristretto.weighted_sum(seed, points[:32 * at] + bad + points[32 * at + 32:], threads)
