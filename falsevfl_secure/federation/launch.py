"""Running the roles of a federation: one role in this process (`--party NAME`, one host each), or every
listed role as its own local process (a `runtime.world.World`), each reading only its own files.

Every role builds its spec from its own federation.toml: the cast with the pinned keys, the agreement
(`network.agreement`: what every participant must share), what it was asked to do, and its links.
One host per party, the active party listens at `[federation] rendezvous`, the he aggregator at
`[aggregator] address`, and every other party only dials out. Launched locally, the hubs listen on
loopback ports chosen at start-up.

Outputs are fail-safe: a run's models and predictions are written to their staged places (`fsio.staged`)
and moved into place only once the run has ended well here (every local role's program finished), so a
failed or killed run leaves the previous models and predictions as they were.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..errors import InputError, did_you_mean
from ..fsio import commit, discard, open_lock, settle
from ..methods import method_for
from ..network.handshake import Cast, Request, check_min_parties, check_two_parties
from ..runtime.cast import LOOPBACK, base_agreement, plan_for
from ..runtime.role import RoleSpec
from ..runtime.worker import run_role
from ..runtime.world import World
from ..transport.protocols import Protocol, protocol_named
from .config import AGGREGATOR, NOT_MODEL_KEYS, Federation
from .party import federation_program


def present_parties(fed: Federation, absent: list[str]) -> list[str]:
    return fed.present(absent)


def role_names(fed: Federation, present: list[str], protocol: Protocol) -> list[str]:
    """The names of the roles of a run: the present parties, then the protocol's helpers."""
    return [*present, *(AGGREGATOR for _ in protocol.helpers)]


def agreement_settings(fed: Federation, command: str) -> dict:
    """The run settings every participant must share besides the cast (see `network.agreement`)."""
    named = {key: value for key, value in fed.model.file_settings().items()  # as this file writes them
             if key.removeprefix("[model] ") not in NOT_MODEL_KEYS}  # (set outside [model]: named there)
    return {"command": command, "method": method_for(fed.model).label, "model": fed.model.fingerprint(),
            "task": fed.task, "max_ids": fed.max_ids, "on_party_loss": fed.on_party_loss,
            "min_parties": fed.min_parties, **named, "[model] preset": fed.preset}


def spec_of(fed: Federation, name: str, command: str, protocol: Protocol, present: list[str],
            addresses: dict[str, str]) -> RoleSpec:
    """Role `name`'s spec, from this federation file alone."""
    aggregator = AGGREGATOR if protocol.helpers else None
    cast = Cast(tuple(fed.names), fed.active, aggregator, fed.pins(with_aggregator=aggregator is not None))
    agreement = base_agreement(protocol, cast, fed.allow_two_party_disclosure, agreement_settings(fed, command))
    request = Request(tuple(present), command == "train", fed.join_timeout_s, str(fed.path), fed.round_deadline_s)
    return RoleSpec(name, cast, protocol, agreement, request, plan_for(name, cast, addresses),
                    str(fed.identity_path(name)))


def file_addresses(fed: Federation, protocol: Protocol) -> dict[str, str]:
    """Where the hubs listen one host per party: the rendezvous and, for he, the aggregator's address."""
    addresses = {fed.active: "{}:{}".format(*fed.rendezvous)}
    if protocol.helpers:
        if fed.aggregator.address is None:
            raise InputError(f"{fed.path}: protocol {protocol.name} needs [aggregator] address = \"HOST:PORT\"")
        addresses[AGGREGATOR] = "{}:{}".format(*fed.aggregator.address)
    return addresses


def run_party(fed: Federation, name: str, command: str, protocol: str, present: list[str], options: dict) -> int:
    """Run role `name` of the command in this process (one host per party; the command line checked its own
    files first); 0 when it ended well (any failure raises with one line)."""
    proto = protocol_named(protocol)
    if name not in role_names(fed, fed.names, proto):
        raise InputError(f"--party {name!r} is not a role of this run{did_you_mean(name, fed.names)}; the roles are "
                         f"{', '.join(role_names(fed, fed.names, proto))}")
    spec = spec_of(fed, name, command, proto, present, file_addresses(fed, proto))
    share_cores(fed, proto)
    print(_waiting_line(fed, spec), flush=True)
    if options.get("rejoin"):
        spec = replace(spec, request=replace(spec.request, rejoin=True))
    committed(outputs_of(fed, [name], command, options),
              lambda: run_role(spec, federation_program, (str(fed.path), command, options)),
              models_of(fed, [name], command))
    return 0


def _waiting_line(fed: Federation, spec: RoleSpec) -> str:
    """What this role waits for before anything else is printed (a party whose peers were not up yet waited
    silently until its join timeout)."""
    plan, present = spec.plan, set(spec.request.expected)
    expected = [peer for peer in plan.accept if peer in present or peer not in spec.cast.parties]  # not the absent
    waits = [f"listening at {plan.serve_at} for {', '.join(expected)}"] if plan.serve_at else []
    waits += [f"joining {peer} at {address}" for peer, address in plan.dial]
    return f"{spec.name}: {'; '.join(waits)} (join_timeout_s = {fed.join_timeout_s:g} s)"


def share_cores(fed: Federation, protocol: Protocol) -> int | None:
    """Where every role runs on this host (the file's rendezvous, and the he aggregator's address, are loopback
    addresses: every role dials them here), torch's threads in this process are this host's cores divided among
    the roles: each role's default, all of them, had six threads spin on two cores for three parties (a stage-1
    step six times slower). Elsewhere torch's default; `OMP_NUM_THREADS`, when set, wins. The threads set, or None."""
    hosts = [fed.rendezvous[0], *([fed.aggregator.address[0]] if protocol.helpers and fed.aggregator.address else [])]
    if os.environ.get("OMP_NUM_THREADS") or not all(_is_loopback(host) for host in hosts):
        return None
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // len(role_names(fed, fed.names, protocol)))
    torch.set_num_threads(threads)
    return threads


def _is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may name this host or another; not assumed
        return False


def run_all(fed: Federation, command: str, protocol: str, present: list[str], options: dict) -> dict[str, object]:
    """Every role of the command as a local process of its own, and what each returned (by name); raises
    `PartyFailure` naming the role that failed first."""
    proto = protocol_named(protocol)
    loopback = {fed.active: LOOPBACK, **({AGGREGATOR: LOOPBACK} if proto.helpers else {})}
    specs = [spec_of(fed, name, command, proto, present, loopback) for name in role_names(fed, present, proto)]
    # every role would refuse: say it now
    check_two_parties(len(present), specs[0].agreement, str(fed.path), proto.hides_contributions)
    check_min_parties(len(present), specs[0].agreement, str(fed.path))
    logs = Path(fed.path).parent / "logs" / command
    show = fed.active if options.get("progress") else None
    world = World(specs, federation_program, (str(fed.path), command, options), logs, show=show)
    returned: list[object] = []
    committed(outputs_of(fed, present, command, options), lambda: returned.extend(world.start().wait()),
              models_of(fed, present, command))
    return dict(zip(world.names, returned, strict=True))


def models_of(fed: Federation, names: list[str], command: str) -> list[Path]:
    """The model folders a prediction of the roles `names` reads (none for a training: it writes them)."""
    return [fed.party(name).model_dir for name in names if name != AGGREGATOR] if command == "predict" else []


def outputs_of(fed: Federation, names: list[str], command: str, options: dict) -> list[Path]:
    """What the roles `names` of the command write: each party's model folder (train), or the active
    party's predictions file (predict)."""
    if command == "train":
        return [fed.party(name).model_dir for name in names if name != AGGREGATOR]
    return [Path(options["out"])] if fed.active in names and options.get("out") else []


def committed(outputs: list[Path], run: Callable[[], object], reads: list[Path] = ()) -> None:
    """`run()`, with `outputs` moved into place only when it ended well; whatever stays staged is dropped
    (also an earlier run's, first: it never ended well; a commit that a killed run began is finished). Each
    output is this run's alone meanwhile, and no run writes the folders it `reads` (a prediction's models)."""
    with contextlib.ExitStack() as held:
        for path, alone in [*((p, True) for p in outputs), *((p, False) for p in reads)]:
            held.enter_context(_locked(path, alone))
            settle(path)  # under the lock: no commit of it runs meanwhile
        for path in outputs:
            discard(path)
        try:
            run()
            for path in outputs:
                commit(path)
        finally:
            for path in outputs:
                discard(path)


@contextlib.contextmanager
def _locked(path: Path, alone: bool):
    """A lock beside `path` for the run: exclusive for a run that writes it, shared for one that reads it (review
    findings: two runs of one party at once shared its staged folder, and the second's start deleted the first's
    files; a prediction read new trees beside old networks while a training committed)."""
    fd = open_lock(path.with_name(f".{path.name}.lock"))
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if alone else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InputError(f"another run of this party is using {path} (a train or predict that has not ended): wait "
                         "for it, or stop it") from None
    except OSError:  # (a file system without locks: the run goes on as before them)
        pass
    try:
        yield
    finally:
        os.close(fd)  # (the lock goes with it)

