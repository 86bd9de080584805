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

A lost party may come back (`--rejoin`): it links to the active party again, from its own latest checkpoint,
and says hello. The active party readmits it at the start of the next epoch only (`at_epoch`): it checks the
hello as at the start, answers with the run's signed roster, every party's current signed key and where to
rejoin, takes its fresh signed key and tells every other role in that epoch's `epoch` frame (sent at every
epoch's start while losses are tolerated, so every party knows the membership before its first sum). Every
membership change (a loss, a return) counts a version; under mpc the masks are re-keyed under a purpose that
names the version, where the run goes on and the digest of every earlier such word (and of the resume answer) this
party heard, from a transcript that binds every current key. The active party tells a returning party that digest,
signed, in its readmission: two parties ever told different places to go on from hold different keys from then on.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable

from ..errors import FalseVflError, PartyFailure, ProtocolError
from ..network.handshake import pair_keys
from ..network.network import Blame, PartyLost, RunAborted, epoch_notice, notice_digest
from ..privacy import RELEASES

POLICY_FIELDS = ("on_party_loss", "min_parties")


def tolerated(role) -> set[str]:
    """The passive parties whose loss this role's own file lets the run survive (none unless "continue")."""
    fields = role.spec.agreement.fields
    if fields.get("on_party_loss", "stop") != "continue":
        return set()
    return {name for name in role.session.present if name != role.session.active}



def mask_purpose(version: int, gone: list[str], at: tuple[int, ...], chain: str = "") -> str:
    """The purpose of the masks' pair keys after a change of membership (a loss, a return): its version, who is
    out, where the run goes on (stage, epoch, step) and `chain`, the digest of the earlier purposes (and resume
    answer) this party keyed under; every party derives it from what it was told."""
    where = ",".join(str(int(v)) for v in at)
    return f"secure-sum/v{version}/without:{','.join(sorted(gone))}/at:{where}/after:{chain}"


def chained(purpose: str) -> str:
    """The digest every later purpose names (review finding: two parties told different steps or resume answers,
    then one notice alike, were keyed alike again while a step or an epoch apart)."""
    return hashlib.sha256(purpose.encode()).hexdigest()

class PartyLoss:
    """A role's handler of a lost party, called by the training loop with the step it was in."""

    def __init__(self, role, version: int = 0, chain: str = "", plan: int = 0) -> None:
        self.role = role
        self.chain = chain  # what this party was told so far (a digest): every later key names it
        # The run's collective batches in order (every epoch's steps and every pass's batches, `begin`): the index
        # of the current unit's first and how many it has. Where a party resumes, as one number that no two places
        # share (review finding: a notice alike to parties a malicious active party had run to different places,
        # or to another pass named by the same (stage, epoch), keyed them alike while their batches differed).
        self.plan, self.size = plan, 0
        self.version = version  # membership changes so far (a loss, a return): each re-keys under its own purpose
        self.keyed = version  # the last version this party keyed its masks under: it only ever grows
        self.events: list[dict] = []  # who left or came back, how, and where (train_result.json)
        self.on_rerun: Callable[[int], object] | None = None  # under a privacy budget: its own ledger's charge
        self.reruns = 0  # batches or steps run again without a lost party

    @property
    def lost(self) -> set[int]:
        """The parties (ranks) that left."""
        return set(self.role.peers.lost)

    def begin(self, batches: int) -> None:
        """The training loop starts a unit of `batches` collective batches (an epoch's steps, a pass)."""
        self.plan, self.size = self.plan + self.size, int(batches)

    def _planned(self, begun: bool, index: int) -> int:
        """Where batch `index` of this party's unit sits in the run's plan; `begun`: the unit has started (else
        the loss came between units and `index` counts in the next one)."""
        return (self.plan if begun else self.plan + self.size) + max(0, index)

    def __call__(self, lost: PartyLost, position: tuple[int, int, int], begun: bool = True) -> int:
        """The index of the step to resume at (in the same stage and epoch)."""
        if self.role.is_active:
            return self._announce(position, begun)
        return self._follow(position, begun)

    # -- at the active party --------------------------------------------------------------------------

    def _announce(self, position: tuple[int, int, int], begun: bool) -> int:
        role, peers = self.role, self.role.peers
        losses = role.network.take_losses()
        if not losses:
            raise PartyFailure("a party was reported lost, but the active party's network names none")
        peers.lose(peers.names.index(b.role) for b in losses)
        self._check_policy(losses[0])
        self.version += 1
        stage, epoch, index = position
        notice = {"lost": sorted(peers.names[k] for k in peers.lost), "stage": stage, "epoch": epoch,
                  "index": index + 1, "plan": self._planned(begun, index + 1)}
        others = [name for k, name in enumerate(peers.names) if k not in peers.lost and k != peers.rank]
        for name in others:
            role.network.send(name, "lost", json.dumps(notice).encode())
        self._rekey((stage, epoch, index + 1, notice["plan"]))
        for name in others:
            role.network.drain(name, "lost-ack")
        self._record(losses, notice)
        return index + 1

    def _check_policy(self, blame: Blame | None = None) -> None:
        """This party's own file decides whether the run goes on with the parties left (every party checks it,
        whatever the active party announces)."""
        role, fields = self.role, self.role.spec.agreement.fields
        alive = len(role.peers.alive)
        floor = max(2, int(fields.get("min_parties", 2)))
        two_party = alive == 2 and role.protocol.hides_contributions and not fields.get("allow_two_party_disclosure")
        if alive >= floor and not two_party:
            return
        why = (f"only {alive} parties would be left (min_parties = {floor})" if alive < floor else
               "two parties would be left, and allow_two_party_disclosure is not set")
        if blame is not None:
            role.network.fail(blame)
        out = sorted(role.peers.names[k] for k in role.peers.lost)
        said = blame.text() if blame is not None else f"the active party announces {out} out of the run"
        raise PartyFailure(f"{said}; the run stops: {why} in {role.spec.request.source}")

    # -- at every other role --------------------------------------------------------------------------

    def _follow(self, position: tuple[int, int, int], begun: bool) -> int:
        role, peers = self.role, self.role.peers
        notice = role.network.take_notice()
        if role.session.active in notice["lost"] or not set(notice["lost"]) <= set(peers.names[:peers.n_parties]):
            raise ProtocolError("the active party announced a loss of itself or of a role that is not a party")
        if not set(notice["lost"]) - {peers.names[k] for k in peers.lost}:  # each notice reruns a step: no more of
            raise ProtocolError("the active party announced a loss that names no party newly lost")  # them than losses
        theirs = (notice["stage"], notice["epoch"], notice["index"])
        resumed = self._resumed(tuple(position), theirs)
        if notice["plan"] != self._planned(begun, resumed):  # its own place, not the word it was told (review)
            raise ProtocolError(f"the active party resumes at batch {notice['plan']} of the run, where "
                                f"{role.spec.name} resumes at batch {self._planned(begun, resumed)}")
        peers.lose(peers.names.index(name) for name in notice["lost"])
        self._check_policy()  # its own file: never fewer parties, nor two, than it consents to
        self.version += 1
        self._rekey((*theirs, notice["plan"]))
        for k in (peers.active_index, *range(peers.n_parties, len(peers.names))):  # the active party, helpers
            peers.send(k, "lost-ack", notice_digest(notice))  # what it was told (the he aggregator compares)
        self._record([], notice)
        return resumed

    def _resumed(self, ours: tuple[int, int, int], theirs: tuple[int, int, int]) -> int:
        """The step this party resumes at, from where it is (`ours`) and where the active party says (`theirs`)."""
        name = self.role.spec.name
        if theirs[:2] == ours[:2]:
            if not ours[2] <= theirs[2] <= ours[2] + 1:  # a step every role is in, or the next
                raise ProtocolError(f"the active party resumes at step {theirs[2]}, where {name} is at "
                                    f"step {ours[2]} of stage {ours[0]} epoch {ours[1]}")
            return theirs[2]
        if theirs[:2] < ours[:2]:
            return ours[2]  # it abandoned the previous epoch's last step; this role redoes its current one
        raise PartyFailure(f"the active party resumes at stage {theirs[0]} epoch {theirs[1]}, ahead of "
                           f"{name} (stage {ours[0]} epoch {ours[1]})")

    # -- in a forward pass ----------------------------------------------------------------------------

    def charge(self, releases: int = RELEASES["predict"]) -> None:
        """Rows this party released run again (`releases` summed rounds each): its own ledger counts them first."""
        self.reruns += 1
        if self.on_rerun is not None:
            self.on_rerun(releases)

    def pass_done(self, where: tuple[int, int], batches: int) -> None:
        """After a forward pass (passes.each_batch): the active party's word that every batch is in. Without it a
        party could start the next pass or epoch while the active party reruns this pass's last batch without a
        lost party, and resume there at the wrong batch (review finding)."""
        peers, word = self.role.peers, json.dumps({"stage": where[0], "epoch": where[1], "batches": batches}).encode()
        if self.role.is_active:
            for k in peers.alive:
                if k != peers.rank:
                    peers.send(k, "pass-done", word)
        elif peers.recv(peers.active_index, "pass-done") != word:
            raise ProtocolError(f"the active party ended a pass {self.role.spec.name} is not in (it ends stage "
                                f"{where[0]} epoch {where[1]}'s pass of {batches} batches)")

    # -- at every epoch's start: parties that come back -------------------------------------------------

    def at_epoch(self, stage: int, epoch: int) -> list[str]:
        """Before each epoch: the active party readmits a lost party whose hello waits (the first it can: one an
        epoch) and tells every other role the epoch's membership; every other party follows its word. The names of
        those that rejoined."""
        return self._readmit(stage, epoch) if self.role.is_active else self._follow_epoch(stage, epoch)

    def _readmit(self, stage: int, epoch: int) -> list[str]:
        role, net, peers = self.role, self.role.network, self.role.peers
        joined = {}
        for name in net.returned():
            lost = sorted(peers.names[k] for k in peers.lost if peers.names[k] != name)
            where = {"lost": lost, "stage": stage, "epoch": epoch, "chain": self.chain, "plan": self.plan + self.size}
            try:
                entry = role.handshake.admit(role.session, name, self.version + 1, where, net.deadline_s)
                role.protocol.welcome(role.membership, role.backend.bare, name)
                role.handshake.accept_key(role.session, entry)  # only now: a party turned away changes no key
                net.readmit(name)
            except RunAborted:
                raise
            except (FalseVflError, PartyFailure, ValueError) as error:  # it stays out; the run goes on
                net.turn_away(name)
                print(f"warning: {name} could not rejoin: {error}", file=sys.stderr, flush=True)
                continue
            joined[name], self.version = entry, self.version + 1
            peers.restore([peers.names.index(name)])
            break  # one a epoch: a second's answer would name the first as out, and its version not count it (review)
        notice = json.dumps({"stage": stage, "epoch": epoch, "version": self.version,
                             "joined": list(joined.values())}).encode()
        helpers = range(peers.n_parties, len(peers.names)) if joined else ()
        for k in helpers:  # a helper combines over the new membership before any party sends to it
            peers.send(k, "epoch", notice)
            net.recv(peers.names[k], "epoch-ack", net.deadline_s)
        for k in peers.alive:
            if k != peers.rank:
                peers.send(k, "epoch", notice)
        return self._returned(list(joined), stage, epoch)

    def _follow_epoch(self, stage: int, epoch: int) -> list[str]:
        role, peers = self.role, self.role.peers
        notice = epoch_notice(peers.recv(peers.active_index, "epoch"))
        if (notice["stage"], notice["epoch"]) != (stage, epoch):
            raise ProtocolError(f"the active party opened stage {notice['stage']} epoch {notice['epoch']} where "
                                f"{role.spec.name} opens stage {stage} epoch {epoch}")
        names = [e["record"]["name"] for e in notice["joined"]]
        out = {peers.names[k] for k in peers.lost} | {role.spec.name}  # (a returning party reads its own entry)
        if not set(names) <= out or len(set(names)) != len(names) or notice["version"] < self.version + len(names):
            raise ProtocolError("the active party's epoch frame readmits a party that is in the run, or does not "
                                "count the change")
        for entry in notice["joined"]:
            role.handshake.accept_key(role.session, entry)
        if names:
            self.version = notice["version"]  # a new version: the masks are keyed afresh (`_rekey`)
        return self._returned(names, stage, epoch)

    def _returned(self, names: list[str], stage: int, epoch: int) -> list[str]:
        """Every party that rejoined is in every later sum: masks among the new membership, and the record."""
        if not names:
            return []
        self.role.peers.restore(self.role.peers.names.index(n) for n in names)
        self._rekey((stage, epoch, 0, self.plan + self.size))
        for name in names:
            self.events.append({"party": name, "how": "rejoined", "stage": stage, "epoch": epoch, "resumed_at": 0})
            print(f"{name} rejoined the run at stage {stage} epoch {epoch}", file=sys.stderr, flush=True)
        return names

    def close(self) -> None:
        """At the active party, when its run is over: a returning party not readmitted is told why (signed)."""
        net = self.role.network
        waiting = set(net.returned())
        for name in sorted(net.returning):
            if name in waiting:
                self.role.handshake.announce([name], {"refused": "the run's training ended before it could rejoin"},
                                             "rejoin")
            net.turn_away(name)

    # -- both -----------------------------------------------------------------------------------------

    def _rekey(self, at: tuple[int, int, int]) -> None:
        """mpc: masks among the parties in the run, from pair keys of a purpose that names the membership's
        version, who is out, the step the run resumes at and the chain of what this party was told before (the
        transcript binds every current key): two parties told different steps, now or at any earlier change (a
        malicious active party), hold different keys, so their masks do not cancel and no sum of rows they
        misalign is revealed."""
        role = self.role
        if self.version <= self.keyed and role.backend is not None and hasattr(role.backend, "rekey"):
            raise ProtocolError(f"membership version {self.version} was keyed before: a keystream is never reused")
        self.keyed = self.version
        if hasattr(role.backend, "rekey"):
            gone = [role.peers.names[k] for k in role.peers.lost]
            purpose = mask_purpose(self.version, gone, at, self.chain)
            role.backend.rekey(pair_keys(role.session, role.spec.name, role.membership.exchange, purpose))
            self.chain = chained(purpose)

    def _record(self, losses: list[Blame], notice: dict) -> None:
        how = {b.role: f"{b.how} in round {b.round!r}" for b in losses}
        for name in notice["lost"]:
            mine = [e for e in self.events if e["party"] == name]
            if mine and mine[-1]["how"] != "rejoined":
                continue  # announced before
            self.events.append({"party": name, "how": how.get(name, "announced by the active party"),
                                "stage": notice["stage"], "epoch": notice["epoch"], "resumed_at": notice["index"]})
            print(f"warning: {name} left the run ({how.get(name, 'announced by the active party')}); training "
                  f"goes on without it from stage {notice['stage']} epoch {notice['epoch']} step "
                  f"{notice['index']} (on_party_loss = \"continue\")", file=sys.stderr, flush=True)

