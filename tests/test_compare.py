"""The passive parties' comparison of the active party's signed announcements (federation/aligned.py): a
digest that covers every row it announced and the alignment's transcript (every count, every public key, the
published union: secure/align.py), who is named when two differ, and a shortfall that cannot switch it off. The
federation path (real processes, a hostile active party) is in tests/test_threat_models.py."""

from __future__ import annotations

import numpy as np
import pytest

SESSION = bytes(range(16))


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


def test_the_common_digest_covers_every_part_of_the_announcement_the_alignments_transcript_and_the_run():
    from falsevfl_secure.federation.aligned import common_digest

    base = (SESSION, 30, np.array([20, 15, 12]), np.arange(0, 30, 2), np.arange(0, 10, 2), np.arange(10, 14, 2),
            bytes(32))
    digests = {common_digest(*base)}
    for k in range(7):
        changed = list(base)
        changed[k] = (bytes(16) if k == 0 else changed[k] + 1 if k == 1 else b"\x01" * 32 if k == 6
                      else np.append(changed[k], 28))
        digests.add(common_digest(*changed))
    moved = (SESSION, 30, base[2], np.arange(0, 30, 2), np.arange(0, 8, 2), np.arange(8, 14, 2))  # one moved over
    digests.add(common_digest(*moved))
    digests.add(common_digest(SESSION, 30, None, *base[3:]))
    digests.add(common_digest(*base[:6]))  # no transcript at all
    assert len(digests) == 11


def test_a_refused_alignment_frame_names_its_sender_where_the_frame_shows_it():
    """Red team: a malformed frame named its receiver as failed. Now a frame whose fault is its sender's own (not
    bytes, an invalid point, a count of its own, a hop whose proof fails) is that sender's refusal; a length that
    follows from a count the active party announced names nobody (either may be wrong)."""
    from types import SimpleNamespace

    from falsevfl_secure.federation.aligned import _named
    from falsevfl_secure.network.wire import Refused
    from falsevfl_secure.secure import align as align_module
    from falsevfl_secure.secure import ring

    role = SimpleNamespace(peers=SimpleNamespace(names=("clinic", "lab", "insurer")))

    def raising(error):
        def run():
            raise error
        return run

    with pytest.raises(Refused) as refused:
        _named(role, raising(align_module.AlignmentFrameError("align: pass1 frame from party 2: bad point", 2)))
    assert refused.value.offender == "insurer" and "from 'insurer'" in str(refused.value)
    with pytest.raises(Refused) as refused:
        _named(role, raising(ring.AlignmentFrameError("align: the list that party 1 multiplied fails its proof", 1)))
    assert refused.value.offender == "lab" and "that 'lab' multiplied" in str(refused.value)
    with pytest.raises(align_module.AlignmentFrameError) as counted:
        ring.expect_length(b"x" * 31, 32, "pass1", 2, counted=True)
    assert counted.value.sender is None
    with pytest.raises(align_module.AlignmentFrameError) as own:
        ring.expect_length(b"x" * 9, 8, "sizes", 2)
    assert own.value.sender == 2
    assert _named(role, lambda: 7) == 7


@pytest.mark.parametrize("build", ["weakened: any shortfall skips the check", "shipped"])
def test_a_shortfall_announced_into_a_prediction_cannot_switch_the_check_off(monkeypatch, build, attacked):
    """Review finding: a shortfall stops training at every party, so the passive parties skip their comparison then;
    a malicious active party signed one into a prediction's announcement (which asks for no overlap, and never
    stops on one), and the prediction went on unchecked, its records free to sit at two rows. Where the party's own
    policy asks for no minimum overlap, an announced shortfall is the active party's refusal, before any sum."""
    from types import SimpleNamespace

    from falsevfl_secure.federation import aligned as module_aligned
    from falsevfl_secure.network.wire import Refused
    from falsevfl_secure.secure.align import Alignment

    checked = []
    monkeypatch.setattr(module_aligned, "_compare_with_passive_peers", lambda *a, **k: checked.append(True))
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
