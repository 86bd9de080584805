"""The path of one sum round at a passive party: every function of the package it calls, in order.

    python bench/round_path.py [--protocol mpc] [--parties 4] [--out DIR]

Real role processes over the real network (as `bench/overhead.py`): K parties (the last one active) run one
FALSE-VFL stage-1 step of a small synthetic job; party 1 traces, with `sys.setprofile` on its own thread,
the first `posterior` sum of the step, from the transport's `aggregate` to its return. A hop is one call
of a named Python function of `falsevfl_secure` (properties included; comprehensions, lambdas, background
threads, torch and the standard library not counted), split by layer: the round's bookkeeping (the
transport, placement), the cipher and secure primitives, and the network below `Network.send`. Writes
DIR/round_path.json ({"hops", "by_layer", "files", "calls": [[file, function], ...]}) and prints the path.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from overhead import make_job  # noqa: E402

from falsevfl_secure.fsio import write_json  # noqa: E402
from falsevfl_secure.runtime.cast import local_specs  # noqa: E402
from falsevfl_secure.runtime.world import World  # noqa: E402
from falsevfl_secure.transport import PROTOCOLS  # noqa: E402

PACKAGE = str(Path(__file__).resolve().parents[1] / "falsevfl_secure")


class Tracer:
    """Records the package's calls made inside the first call of `aggregate` for `round_name`."""

    def __init__(self, round_name: str) -> None:
        self.round_name, self.depth, self.calls, self.done = round_name, 0, [], False

    def __call__(self, frame, event, arg) -> None:
        code = frame.f_code
        if event != "call" and event != "return" or not code.co_filename.startswith(PACKAGE) or self.done:
            return
        opening = code.co_name == "aggregate" and getattr(frame.f_locals.get("round"), "name", "") == self.round_name
        if event == "call" and (self.depth or opening):
            self.depth += 1
            self.calls.append((code.co_filename.removeprefix(PACKAGE + "/"), code.co_qualname))
        elif event == "return" and self.depth:
            self.depth -= 1
            self.done = self.depth == 0


def traced_step(role, traced: int, round_name: str) -> dict:
    """One stage-1 step; the role of rank `traced` records its first `round_name` sum's path. A helper (he's
    aggregator) serves its protocol until the parties are done."""
    from falsevfl_secure.runtime.session import build_step, run_step

    if not role.is_party:
        role.serve_helper()
        return {"calls": None}
    job = make_job(role.peers.n_parties, 16, "pretrain")
    node, data = build_step(job, [role.rank], role.is_active, role.transport(__import__("torch").device("cpu")))
    tracer = Tracer(round_name) if role.rank == traced else None
    sys.setprofile(tracer)
    try:
        run_step(node, data, job)
    finally:
        sys.setprofile(None)
    return {"calls": tracer.calls if tracer else None}


NETWORK = ("network/network.py", "network/wire.py", "network/link.py", "network/")


def by_layer(calls: list) -> dict[str, int]:
    """Hops per layer: the network (its entry point `Network.send` and everything below it), the cipher and
    secure primitives, and the round's bookkeeping (everything else)."""
    network = sum(f.startswith(NETWORK) for f, _ in calls)
    crypto = sum(f.startswith(("secure/", "transport/ciphers/")) for f, _ in calls)
    return {"bookkeeping": len(calls) - network - crypto, "cipher": crypto, "network": network}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocol", default="mpc", choices=list(PROTOCOLS))
    p.add_argument("--parties", type=int, default=4)
    p.add_argument("--round", default="posterior")
    p.add_argument("--out", default="runs/round_path")
    args = p.parse_args(argv)
    names = [f"party{k}" for k in range(args.parties)]
    with tempfile.TemporaryDirectory() as keys:
        specs = local_specs(PROTOCOLS[args.protocol], names, names[-1], Path(keys), {"command": "trace"},
                            consent=True)
        reports = World(specs, traced_step, (1, args.round)).start().wait()
    calls = [c for c in reports[1]["calls"] if "<" not in c[1].split(".")[-1]]  # named functions only
    record = {"protocol": args.protocol, "parties": args.parties, "round": args.round, "hops": len(calls),
              "by_layer": by_layer(calls), "files": len({f for f, _ in calls}), "calls": calls}
    for number, (file, function) in enumerate(calls, 1):
        print(f"{number:3d}  {file:<32} {function}")
    print(f"{record['hops']} hops through {record['files']} files ({args.protocol}, K = {args.parties}, "
          f"one {args.round!r} sum at party 1): {record['by_layer']}")
    write_json(Path(args.out) / "round_path.json", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
