"""Training that survives a lost passive party (`on_party_loss = "continue"` in every party's file).

A passive party that crashes, loses its link, stalls or misses its round deadline is, from then on, treated
exactly as FALSE-VFL treats a party that does not hold a record: it adds nothing to any sum. The active party
alone decides (its network names the loss); it checks its own file (`min_parties`, the two-party consent),
announces who left and the step every role resumes at (`lost`), and every other role answers `lost-ack`
after its last frame of the abandoned step, so each side drops exactly the stale frames in between. The step
in flight is abandoned by everyone (no optimiser step, and no sum over fewer parties is revealed for a step
that started with more); under mpc the masks are re-keyed among the parties still in the run, from fresh
pair keys (a keystream is never reused with another set of parties). What a continued run discloses that a
full one does not is stated in threat_models/passive_semi_honest.toml.
"""

from __future__ import annotations

import json
import sys

from ..errors import PartyFailure
from ..network.handshake import pair_keys
from ..network.network import Blame, PartyLost

POLICY_FIELDS = ("on_party_loss", "min_parties")


def tolerated(role) -> set[str]:
    """The passive parties whose loss this role's own file lets the run survive (none unless "continue")."""
    fields = role.spec.agreement.fields
    if fields.get("on_party_loss", "stop") != "continue":
        return set()
    return {name for name in role.session.present if name != role.session.active}


class PartyLoss:
    """A role's handler of a lost party, called by the training loop with the step it was in."""

    def __init__(self, role) -> None:
        self.role = role
        self.events: list[dict] = []  # who left, how, and where (train_result.json)

    @property
    def lost(self) -> set[int]:
        """The parties (ranks) that left."""
        return set(self.role.peers.lost)

    def __call__(self, lost: PartyLost, position: tuple[int, int, int]) -> int:
        """The index of the step to resume at (in the same stage and epoch)."""
        if self.role.is_active:
            return self._announce(position)
        return self._follow(position)

    # -- at the active party --------------------------------------------------------------------------

    def _announce(self, position: tuple[int, int, int]) -> int:
        role, peers = self.role, self.role.peers
        losses = role.network.take_losses()
        if not losses:
            raise PartyFailure("a party was reported lost, but the active party's network names none")
        peers.lose(peers.names.index(b.role) for b in losses)
        self._check_policy(losses[0])
        stage, epoch, index = position
        notice = {"lost": sorted(peers.names[k] for k in peers.lost), "stage": stage, "epoch": epoch,
                  "index": index + 1}
        others = [name for k, name in enumerate(peers.names) if k not in peers.lost and k != peers.rank]
        for name in others:
            role.network.send(name, "lost", json.dumps(notice).encode())
        self._rekey()
        for name in others:
            role.network.drain(name, "lost-ack")
        self._record(losses, notice)
        return index + 1

    def _check_policy(self, blame: Blame) -> None:
        """This party's own file decides whether the run goes on with the parties left."""
        role, fields = self.role, self.role.spec.agreement.fields
        alive = len(role.peers.alive)
        floor = max(2, int(fields.get("min_parties", 2)))
        two_party = alive == 2 and role.protocol.hides_contributions and not fields.get("allow_two_party_disclosure")
        if alive >= floor and not two_party:
            return
        why = (f"only {alive} parties would be left (min_parties = {floor})" if alive < floor else
               "two parties would be left, and allow_two_party_disclosure is not set")
        role.network.fail(blame)
        raise PartyFailure(f"{blame.text()}; the run stops: {why} in {role.spec.request.source}")

    # -- at every other role --------------------------------------------------------------------------

    def _follow(self, position: tuple[int, int, int]) -> int:
        role, peers = self.role, self.role.peers
        notice = role.network.take_notice()
        peers.lose(peers.names.index(name) for name in notice["lost"])
        self._rekey()
        for k in (peers.active_index, *range(peers.n_parties, len(peers.names))):  # the active party, helpers
            peers.send(k, "lost-ack", b"")
        self._record([], notice)
        ours, theirs = tuple(position), (notice["stage"], notice["epoch"], notice["index"])
        if theirs[:2] == ours[:2]:
            return max(ours[2], theirs[2])
        if theirs[:2] < ours[:2]:
            return ours[2]  # it abandoned the previous epoch's last step; this role redoes its current one
        raise PartyFailure(f"the active party resumes at stage {theirs[0]} epoch {theirs[1]}, ahead of "
                           f"{role.spec.name} (stage {ours[0]} epoch {ours[1]})")

    # -- both -----------------------------------------------------------------------------------------

    def _rekey(self) -> None:
        """mpc: masks among the parties left, from pair keys of a purpose that names who left."""
        role = self.role
        if hasattr(role.backend, "rekey"):
            gone = ",".join(sorted(role.peers.names[k] for k in role.peers.lost))
            role.backend.rekey(pair_keys(role.session, role.spec.name, role.membership.exchange,
                                         f"secure-sum/without:{gone}"))

    def _record(self, losses: list[Blame], notice: dict) -> None:
        how = {b.role: f"{b.how} in round {b.round!r}" for b in losses}
        for name in notice["lost"]:
            if any(e["party"] == name for e in self.events):
                continue
            self.events.append({"party": name, "how": how.get(name, "announced by the active party"),
                                "stage": notice["stage"], "epoch": notice["epoch"], "resumed_at": notice["index"]})
            print(f"warning: {name} left the run ({how.get(name, 'announced by the active party')}); training "
                  f"goes on without it from stage {notice['stage']} epoch {notice['epoch']} step "
                  f"{notice['index']} (on_party_loss = \"continue\")", file=sys.stderr, flush=True)
