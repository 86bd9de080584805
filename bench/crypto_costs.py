"""Where the secure protocols' time goes: the cost of each piece of one secure sum.

    python bench/crypto_costs.py [--parties 8] [--shape 10 512 128] [--repeats 15] --out DIR [--readme README.md]

mpc: a world of `--parties` party processes (this machine's cores shared, as in bench/overhead.py) sums
one tensor of `--shape` (default: the stage-1 `latent_grad` round at Isolet's shapes, batch 512); every
piece is timed barrier to barrier on every rank and the median of the slowest rank is reported: the
X25519 key agreement of start-up, drawing one zero share from the AES-256-CTR pair streams, the
fixed-point encoding, gathering the payload as float32 (what plain sends) and as int64 ring elements
(what mpc sends), and the whole `secure_sum` (whose shares are drawn ahead while the party waits).

he: one process, one CKKS ciphertext of 4,096 values (N = 8192): the framed encryption and decryption
the protocol uses (with the rounding onto the fixed-point grid), and their pieces: a public-key
encryption, an encryption of zero plus the encoded values (an offline/online split), serialisation,
parsing, an addition, and a decryption.

Writes DIR/crypto_costs.json and DIR/crypto_costs.md. Timings are measurements on the machine that
runs it, never asserted anywhere.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from readme_section import update_readme  # noqa: E402

from falsevfl_secure.cli import guarded  # noqa: E402
from falsevfl_secure.fsio import write_json  # noqa: E402


def _mpc_rank(role, shape: tuple[int, ...], repeats: int) -> dict[str, float]:
    """One mpc party: the median ms of each piece, barrier to barrier (so: the slowest rank)."""
    import torch
    import torch.distributed as dist

    from falsevfl_secure.randomness import KeyStream
    from falsevfl_secure.secure.fixed_point import encode_fixed_point
    from falsevfl_secure.secure.masks import X25519Agreement, zero_share
    from falsevfl_secure.secure.mpc_sum import secure_sum
    from falsevfl_secure.transport.mpc import exchange_public_keys

    rank, world_size = role.spec.rank, role.spec.n_parties
    value = torch.randn(*shape, generator=torch.Generator().manual_seed(rank))  # benchmark input, not a secret
    numel, dst = value.numel() + 1, world_size - 1
    streams = {peer: KeyStream(bytes(32)) for peer in range(world_size) if peer != rank}

    def agree() -> None:
        agreement = X25519Agreement()
        agreement.pair_keys(rank, exchange_public_keys(agreement.public_key(), world_size))

    def gather(payload: torch.Tensor) -> None:
        buffers = [torch.empty_like(payload) for _ in range(world_size)] if rank == dst else None
        dist.gather(payload, buffers, dst=dst)

    pieces = {
        "mpc: X25519 key agreement with every other party (once, at start-up)": agree,
        f"mpc: zero share, {world_size - 1} AES-256-CTR pair streams, drawn now":
            lambda: zero_share(rank, streams, numel),
        "mpc: fixed-point encoding": lambda: encode_fixed_point(value, 16, n_addends=world_size),
        "plain: gather float32 payload": lambda: gather(value.reshape(-1)),
        "mpc: gather int64 payload": lambda: gather(torch.zeros(numel, dtype=torch.int64)),
        "mpc: secure_sum, all of it (shares drawn ahead while waiting)":
            lambda: secure_sum(value, dst, role.backend.shares),
    }
    out = {}
    for name, piece in pieces.items():
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            piece()
            dist.barrier()
            times.append(1000 * (time.perf_counter() - start))
        out[name] = statistics.median(times)
    return out


def mpc_costs(parties: int, shape: tuple[int, ...], repeats: int) -> dict[str, float]:
    from falsevfl_secure.runtime.worlds import run_world

    per_rank = run_world("mpc", parties, _mpc_rank, args=(shape, repeats), timeout_s=900)
    return {name: round(max(r[name] for r in per_rank), 2) for name in per_rank[0]}


def he_costs(repeats: int) -> dict[str, float]:
    import numpy as np
    import tenseal as ts
    import torch

    from falsevfl_secure.secure.ckks import (
        decrypt_tensor,
        encrypt_tensor,
        load_public_context,
        make_secret_context,
        public_context_bytes,
        slot_count,
    )

    secret = make_secret_context()
    public = load_public_context(public_context_bytes(secret))
    values = np.random.default_rng(0).normal(size=slot_count(public)).tolist()
    tensor = torch.tensor(values)
    framed = encrypt_tensor(public, tensor, n_addends=8)
    zeros = [ts.ckks_vector(public, [0.0] * len(values)) for _ in range(repeats)]
    vector = ts.ckks_vector(public, values)
    payload = vector.serialize()
    received = ts.ckks_vector_from(secret, payload)

    def timed(piece, n: int = repeats) -> float:
        times = []
        for i in range(n):
            start = time.perf_counter()
            piece(i)
            times.append(1000 * (time.perf_counter() - start))
        return round(statistics.median(times), 3)

    return {
        "he: encrypt_tensor, 4,096 values (onto the grid, encrypt, frame)":
            timed(lambda i: encrypt_tensor(public, tensor, n_addends=8)),
        "he: decrypt_tensor, 4,096 values (parse, decrypt, round onto the grid)":
            timed(lambda i: decrypt_tensor(secret, framed, (len(values),))),
        "he: encrypt one ciphertext (4,096 values)": timed(lambda i: ts.ckks_vector(public, values)),
        "he: Enc(0) + encoded values (online part)": timed(lambda i: zeros[i].add_(values)),
        "he: serialise": timed(lambda i: vector.serialize()),
        "he: parse": timed(lambda i: ts.ckks_vector_from(public, payload)),
        "he: add two ciphertexts": timed(lambda i: vector + vector),
        "he: decrypt": timed(lambda i: received.decrypt()),
    }


def markdown(record: dict) -> str:
    shape = " x ".join(str(s) for s in record["config"]["shape"])
    lines = [f"One secure sum of a {shape} tensor over {record['config']['parties']} party processes "
             "(mpc; the slowest rank, barrier to barrier), and one CKKS ciphertext of the default parameters "
             "(he: N = 8192, [60, 20, 60], scale 2^40):", "",
             "| piece | ms (median) |", "|---|---|"]
    lines += [f"| {name} | {ms:.2f} |" for name, ms in record["costs"].items()]
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parties", type=int, default=8)
    p.add_argument("--shape", type=int, nargs="+", default=[10, 512, 128])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", default="runs/crypto_costs")
    p.add_argument("--readme", default=None, help="rewrite its <!-- results:NAME:... --> section, NAME the --out "
                   "folder's name")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.parties < 2 or args.repeats < 1 or min(args.shape) < 1:
        print("error: --parties must be >= 2, --repeats >= 1 and every --shape entry >= 1", file=sys.stderr)
        return 2
    import torch

    record = {"config": {**vars(args), "threads": torch.get_num_threads()},
              "costs": {**mpc_costs(args.parties, tuple(args.shape), args.repeats), **he_costs(args.repeats)}}
    out = Path(args.out)
    write_json(out / "crypto_costs.json", record)
    table = markdown(record)
    (out / "crypto_costs.md").write_text(table)
    print(table)
    if args.readme:
        update_readme(Path(args.readme), out.resolve().name, table)
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
