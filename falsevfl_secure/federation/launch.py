"""Running the parties of a federation: one party in this process (`--party NAME`, one host each), or every
listed party as its own local process, each reading only its own files.

One host per party: the active party serves the rendezvous store at `[federation] rendezvous`, every
party watches the others' heartbeats, and a party's `interface` setting chooses the network interface
gloo uses (GLOO_SOCKET_IFNAME). Launched locally, the launcher serves the store and watches instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError
from ..runtime import liveness
from ..runtime.launcher import launch
from ..runtime.role import RoleSpec
from ..runtime.worker import serve_role
from ..transport.protocols import protocol_named
from . import roster
from .config import AGGREGATOR, Federation
from .party import predict_program, read_prediction_table, read_training_table, train_program


def roles_of(fed: Federation, present: list[str], protocol: str) -> list[str]:
    """The names of the world's roles in rank order: the present parties, then the protocol's helpers."""
    return [*present, *(AGGREGATOR for _ in protocol_named(protocol).helpers)]


def present_parties(fed: Federation, absent: list[str]) -> list[str]:
    unknown = [name for name in absent if name not in fed.names]
    if unknown:
        raise InputError(f"--absent {unknown}: no such party; the parties are {', '.join(fed.names)}")
    if fed.active in absent:
        raise InputError(f"the active party {fed.active!r} must be present: it holds the model's label side")
    return [name for name in fed.names if name not in absent]


def run_party(fed: Federation, name: str, command: str, protocol: str, present: list[str], **options) -> int:
    """Run role `name` of the command's world in this process; the exit code says how it ended. Launched
    locally, the launcher fixed the world; one host per party, the active party's roster does."""
    _check_role(fed, name, roles_of(fed, fed.names, protocol))
    inputs = _inputs(fed, name, command)  # this party's files are read and checked before it joins
    launched = "FALSEVFL_LAUNCHER_PID" in os.environ
    address, port = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])) if launched else fed.rendezvous
    store = liveness.connect_store(address, port, host=not launched and name == fed.active)
    if not launched:
        agreed = roster.agree(store, fed, name, command, present, protocol)
        present, protocol = agreed.present, agreed.protocol
    roles = roles_of(fed, present, protocol)
    _check_role(fed, name, roles)
    interface = fed.aggregator_interface if name == AGGREGATOR else fed.party(name).interface
    if interface:
        os.environ["GLOO_SOCKET_IFNAME"] = interface  # read by gloo when the world is joined
    spec = RoleSpec(roles.index(name), len(present), present.index(fed.active), protocol_named(protocol), address,
                    port, watch=not launched)
    program = _program(fed, name, command, present, options, inputs)
    return serve_role(spec, store, program, linger=not launched and name == fed.active)


def _check_role(fed: Federation, name: str, roles: list[str]) -> None:
    if name not in roles:
        raise InputError(f"--party {name!r} is not a role of this run; the roles are {', '.join(roles)}")


def _inputs(fed: Federation, name: str, command: str):
    """This role's checked files: the training table, or the prediction table with the saved model."""
    if name == AGGREGATOR:
        return None
    return read_training_table(fed, name) if command == "train" else read_prediction_table(fed, name)


def _program(fed: Federation, name: str, command: str, present: list[str], options: dict, inputs):
    if command == "train":
        return train_program(fed, name, inputs, options["resume"], options["progress"])
    return predict_program(fed, name, present, Path(options["out"]), inputs)


def run_all(fed: Federation, command: str, protocol: str, present: list[str], argv: list[str],
            progress: bool) -> None:
    """Every role of the command as a local process of its own; raises `PartyFailure` naming the role
    that failed first."""
    roles = roles_of(fed, present, protocol)
    logs = fed.path.parent / "logs" / command
    commands = [["-m", "falsevfl_secure.federation", command, "--config", str(fed.path), "--party", name,
                 "--protocol", protocol, *argv] for name in roles]
    launch(commands, logs, roles, show_rank=present.index(fed.active) if progress else None)
