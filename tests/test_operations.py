"""A peer cannot take more than its round (threat_models/malicious_pinned_party.toml): a pinned party that
floods another with frames (an undeclared tag before the handshake, one relayed through the active party's
hub, a round's frame far over its declared size, more frames than a step holds) is refused before its frames
are read whole and named, and the victim's memory grows by at most 64 MiB; a party whose protocol stops while
its heartbeat goes on is named within its round deadline. Real role processes over real mutual-TLS links;
each victim reports its own peak resident memory (VmHWM) against its resident memory before the attack."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from adversaries import hold

from falsevfl_secure.network.network import RunAborted
from falsevfl_secure.runtime.cast import local_specs
from falsevfl_secure.runtime.role import Role
from falsevfl_secure.runtime.world import World
from falsevfl_secure.transport.protocols import protocol_named

FLOOD_BYTES = 128 << 20  # each flooded frame (today's code reassembled every one whole: +384 MiB)
GROWTH_BOUND = 64 << 20


def _memory(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


class MeasuredRole(Role):
    """An honest role that writes its resident memory at start and its peak at the end (`<name>.memory`)."""

    def __init__(self, spec, parent=None) -> None:
        super().__init__(spec, parent)
        self.rss_before = _memory("VmRSS")

    def leave(self, clean: bool) -> None:
        super().leave(clean)
        out = Path(self.spec.key_path).parent.parent / f"{self.spec.name}.memory"
        out.write_text(f"{self.rss_before} {_memory('VmHWM')}")


class Flooder(Role):
    """A pinned party that, once linked, sends three huge frames (`target`, `tag`) before anything else."""

    target, tag, when = "party2", "junk", "before the handshake"

    def join(self, addresses=None):
        if self.when != "before the handshake":
            return super().join(addresses)
        self.network.connect(time.monotonic() + 30, addresses)
        self._flood()
        self.network.connect = lambda *args: None  # linked already
        return super().join(addresses)

    def _flood(self) -> None:
        """Its frames straight onto its link: an attacker's code need not wait, as `send` does, for them to drain."""
        from falsevfl_secure.network import wire

        network, junk = self.network, bytes(FLOOD_BYTES)
        link = network.links.get(self.target) or network.links[network.plan.relay]
        for _ in range(3):
            link.put(wire.fragments(wire.Kind.DATA, network.me, self.target, self.tag, junk))


class RelayedFlooder(Flooder):
    target = "party1"  # a passive party: the frames go through the active party's hub


class RoundFlooder(Flooder):
    tag, when = "posterior", "after the handshake"  # a round's tag, far over the round's declared size


class RepeatingFlooder(Flooder):
    """Many frames of a round, each of the right size, never read: it is held back, at its own cost."""

    when = "after the handshake"

    def _flood(self) -> None:
        for _ in range(20):  # 80 MiB: more than the 64 MiB a victim may grow by, were they all read
            self.network.send("party2", "likelihood", bytes(4 << 20))


def _after_handshake(role) -> str:
    """Every victim declares two rounds (as a transport does) and waits on the flooder, which floods."""
    if not isinstance(role, Flooder):
        role.network.allow({"posterior": 1 << 20, "likelihood": 4 << 20})
        deadline = time.monotonic() + 10
        while role.network.aborted is None and time.monotonic() < deadline:
            time.sleep(0.1)  # a refused flood ends the run within seconds
        if role.network.aborted is not None:
            raise RunAborted(role.network.aborted)
        return "not refused"
    if role.when == "after the handshake":
        time.sleep(2)  # the victims have declared their rounds
        role._flood()
    hold(role, 8)
    return "flooded"


def _world(tmp_path: Path, program, classes: dict, protocol: str = "plain") -> World:
    names = ["party0", "party1", "party2"]
    specs = local_specs(protocol_named(protocol), names, names[-1], tmp_path / "keys", {"command": "test"},
                        consent=True)
    return World(specs, program, (), tmp_path / "world", role_classes=classes)


def _growth(tmp_path: Path, name: str) -> int:
    before, peak = map(int, (tmp_path / f"{name}.memory").read_text().split())
    return peak - before


@pytest.mark.parametrize("flooder", [Flooder, RelayedFlooder, RoundFlooder, RepeatingFlooder],
                         ids=["undeclared-tag", "relayed", "oversized-round", "too-many-frames"])
def test_a_flooding_party_is_named_and_cannot_grow_another_partys_memory(tmp_path, flooder, attacked):
    classes = {"party0": flooder, "party1": MeasuredRole, "party2": MeasuredRole}
    ended = _world(tmp_path, _after_handshake, classes).start().outcomes(120)
    victims = {name: _growth(tmp_path, name) for name in ("party1", "party2")}
    words = [ended[r].get("error", "") for r in (1, 2)]
    attacked("a pinned party floods (active)", f"shipped: {flooder.__name__}",
             f"growth {', '.join(f'{n} {g / 2**20:.0f} MiB' for n, g in victims.items())}; {words[1][:60]}")
    assert all(growth <= GROWTH_BOUND for growth in victims.values()), victims
    if flooder is RepeatingFlooder:  # frames within their bounds: held back, never read; the run goes on
        assert [ended[r].get("ok") for r in (1, 2)] == ["not refused"] * 2, ended
    else:
        assert all("party0" in w and "refused" in w for w in words), words


class Staller(Role):
    """A party whose protocol stops after two sums while its heartbeat goes on."""


def _sums_then_stall(role) -> str:
    from falsevfl_secure.transport.rounds import POSTERIOR

    role.network.allow({"posterior": 1 << 20})
    for i in range(6):
        if isinstance(role, Staller) and i == 2:
            hold(role, 9)  # stuck (its heartbeat thread still beats) well past its 4 s deadline
        role.network.enter("posterior")
        role.backend.sum_to_active(POSTERIOR, torch.full((4, 8), float(i)))
    return "done"


class QuickRole(Role):
    """A role whose round deadline is 4 s (its file's `round_deadline_s`; 45 s by default)."""

    def __init__(self, spec, parent=None) -> None:
        super().__init__(spec, parent)
        self.network.min_deadline_s = 4.0


class QuickStaller(QuickRole, Staller):
    pass


@pytest.mark.parametrize("protocol", ["mpc"])  # the deadline is the network's: the same under every protocol
def test_a_party_that_heartbeats_but_delivers_nothing_is_named_within_its_deadline(tmp_path, protocol):
    classes = {"party0": QuickStaller, "party1": QuickRole, "party2": QuickRole}
    began = time.time()
    ended = _world(tmp_path, _sums_then_stall, classes, protocol).start().outcomes(90)
    active = ended[2].get("error", "")
    assert "party0 delivered nothing" in active and "'posterior'" in active, ended
    assert ended[2]["at"] - began < 15, ended[2]["at"] - began  # its deadline (4 s here, 45 s by default)


class Accuser(Role):
    """A pinned party that ends the run with an ABORT blaming another party (party1) for its own stop."""


def _accuse(role) -> str:
    from falsevfl_secure.network.network import Blame

    if isinstance(role, Accuser):
        time.sleep(1)
        role.network.fail(Blame("party1", "failed", "posterior", "InputError"))
        time.sleep(5)
        return "accused"
    deadline = time.monotonic() + 30
    while role.network.aborted is None and time.monotonic() < deadline:
        time.sleep(0.1)
    raise RunAborted(role.network.aborted)


def test_an_abort_is_believed_only_as_its_senders_word(tmp_path):
    """party0's ABORT says party1 failed: the others report that party0 says so (the active party, which heard
    it from party0), or that the active party relays it (party1), never party1's failure as a fact."""
    ended = _world(tmp_path, _accuse, {"party0": Accuser}).start().outcomes(60)
    active, accused = ended[2].get("error", ""), ended[1].get("error", "")
    assert active.startswith("party0 reports: party1 stopped with an error"), ended
    assert accused.startswith("party2 reports: party1"), ended  # flooded onward by the active party
    assert ended[2]["blame"]["by"] == "party0", ended[2]


class AggregatorFlooder(Flooder):
    """A passive party that sends the he aggregator three sum frames far over the size the active party declared."""

    target, tag, when = "aggregator", "posterior", "after the handshake"


class LooseAggregator(MeasuredRole):
    """A weakened aggregator that ignores the active party's bounds: every sum up to 2^22 values, as an earlier
    build took, since it holds no model configuration."""

    def serve_helper(self) -> None:
        from falsevfl_secure.network.network import Network
        from falsevfl_secure.transport.sums import AGGREGATED_VALUES

        network = self.network
        network.allow = lambda bounds, depth=2: Network.allow(network, {k: 400 * AGGREGATED_VALUES for k in bounds},
                                                              depth)
        network.min_deadline_s = 3.0  # (it then waits on the parties' round, which never comes: not 45 s of it)
        super().serve_helper()


def _declared_then_flooded(role) -> str:
    """Under he, the active party declares the sum's size to the aggregator, as a transport does; then a passive
    party floods the aggregator, and the others wait for the run to end."""
    if not role.is_party:
        role.serve_helper()
        return "served"
    if role.is_active:
        role.backend.declare({"posterior": 32})
    if isinstance(role, Flooder):
        time.sleep(1)  # the aggregator holds the declared bounds
        role._flood()
        hold(role, 3)
        return "flooded"
    deadline = time.monotonic() + 6
    while role.network.aborted is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if role.network.aborted is not None:
        raise RunAborted(role.network.aborted)
    return "not refused"


@pytest.mark.parametrize("build", ["weakened: ignores the declared bounds", "shipped"])
def test_a_party_flooding_the_he_aggregator_is_refused_at_the_size_the_active_party_declared(tmp_path, build,
                                                                                             attacked):
    weak = build.startswith("weakened")
    classes = {"party0": AggregatorFlooder, "aggregator": LooseAggregator if weak else MeasuredRole}
    ended = _world(tmp_path, _declared_then_flooded, classes, "he").start().outcomes(120)
    growth = _growth(tmp_path, "aggregator")
    attacked("a pinned party floods the he aggregator", build, f"growth {growth / 2**20:.0f} MiB; "
             f"{ended[3].get('error', 'not refused')[:60]}")
    if weak:  # the measurement sees the flood where nothing bounds it
        assert growth > GROWTH_BOUND, growth
        return
    assert growth <= GROWTH_BOUND, growth
    assert "party0" in ended[3].get("error", "") and "refused" in ended[3]["error"], ended[3]
