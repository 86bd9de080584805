"""Where the secure protocols' time goes: the cost of each piece of one secure sum.

    python bench/crypto_costs.py [--parties 8] [--shape 10 512 128] [--repeats 15] --out DIR [--readme README.md]

mpc: a world of `--parties` party processes (this machine's cores shared, as in bench/overhead.py) sums
one tensor of `--shape` (default: the stage-1 `latent_grad` round at Isolet's shapes, batch 512); every
piece is timed barrier to barrier on every rank and the median of the slowest rank is reported: the
X25519 key agreement of start-up, drawing one zero share from the AES-256-CTR pair streams, the
fixed-point encoding, gathering the payload as float32 (what plain sends) and as int64 ring elements
(what mpc sends), and the whole `secure_sum` (whose shares are drawn ahead while the party waits).

he: one process, one CKKS ciphertext of 8,192 values (N = 8192: 4,096 complex slots, two values each): the
message encryption and decryption the protocol uses (with the rounding onto the fixed-point grid), and
their pieces: a public-key encryption, its offline/online split (an encryption of zero; the encoded values
added onto one), serialisation, parsing, an addition, and a decryption.

Writes DIR/crypto_costs.json and DIR/crypto_costs.md. Timings are measurements on the machine that
runs it, never asserted anywhere.

    python bench/crypto_costs.py --micro [--parties 8] [--shape 10 512 128] [--repeats 15]
        [--he-values 65536] --out DIR

--micro runs only the single-process measurements (`micro_costs`, no process world, torch on one
thread) and writes DIR/crypto_micro.json and DIR/crypto_micro.md (`--readme`: its section): the
AES-256-CTR keystream written by `KeyStream.read_into`
(MB/s, beside `openssl speed -evp aes-256-ctr` at 16,384-byte blocks on the same machine), one zero
share of `--parties` - 1 pair streams and prod(`--shape`) int64 values (`zero_share`, and a `ZeroShares.take`
whose share was drawn ahead), and CKKS per thousand values of a message of a `--he-values` tensor:
encrypted at once, and online on zeros a helper process made ahead (`ZeroPool`, the protocol's way),
the aggregator's sum of two contributions (parse, add, serialise) and decryption, with the bytes sent.
"""

from __future__ import annotations

import argparse
import math
import re
import secrets
import statistics
import subprocess
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

    from falsevfl_secure.randomness import KeyStream
    from falsevfl_secure.runtime.session import barrier
    from falsevfl_secure.secure.fixed_point import encode_fixed_point
    from falsevfl_secure.secure.masks import X25519Agreement, zero_share
    from falsevfl_secure.secure.mpc_sum import secure_sum

    peers = role.peers
    rank, world_size = peers.rank, peers.n_parties
    value = torch.randn(*shape, generator=torch.Generator().manual_seed(rank))  # benchmark input, not a secret
    numel, dst = value.numel() + 1, peers.active_index
    streams = {peer: KeyStream(bytes(32)) for peer in range(world_size) if peer != rank}
    publics = [X25519Agreement().public_key() for _ in range(world_size)]

    # the bench's own rounds, declared as a method's are (a frame of an undeclared tag is refused, naming its sender)
    peers.network.allow({"bench": 8 * numel + 64, "bench_sum": 8 * numel + 64})

    def agree() -> None:
        agreement = X25519Agreement()
        agreement.pair_keys(rank, [*publics[:rank], agreement.public_key(), *publics[rank + 1:]], bytes(32))

    def gather(payload: bytes) -> None:
        if rank != dst:
            peers.send(dst, "bench", payload)
            return
        for src in (k for k in range(world_size) if k != rank):
            peers.recv(src, "bench")

    pieces = {
        "mpc: X25519 pair keys with every other party (computation, once per session)": agree,
        f"mpc: zero share, {world_size - 1} AES-256-CTR pair streams, drawn now":
            lambda: zero_share(rank, streams, numel),
        "mpc: fixed-point encoding": lambda: encode_fixed_point(value, 16, n_addends=world_size),
        "plain: gather float32 payload": lambda: gather(value.numpy().tobytes()),
        "mpc: gather int64 payload": lambda: gather(bytes(8 * numel)),
        "mpc: secure_sum, all of it (shares drawn ahead while waiting)":
            lambda: secure_sum(value, dst, role.backend.cipher.shares, peers, tag="bench_sum"),
    }
    out = {}
    for name, piece in pieces.items():
        times = []
        for _ in range(repeats):
            barrier(role)
            start = time.perf_counter()
            piece()
            barrier(role)
            times.append(1000 * (time.perf_counter() - start))
        out[name] = statistics.median(times)
    return out


def mpc_costs(parties: int, shape: tuple[int, ...], repeats: int) -> dict[str, float]:
    from falsevfl_secure.runtime.world import run_world

    per_rank = run_world("mpc", parties, _mpc_rank, args=(shape, repeats), timeout_s=900)
    return {name: round(max(r[name] for r in per_rank), 2) for name in per_rank[0]}


def he_costs(repeats: int) -> dict[str, float]:
    """Median ms of each SEAL step of one full ciphertext (8,192 values), as the protocol makes them."""
    import numpy as np
    import torch

    from falsevfl_secure.secure.ckks import (
        decrypt_tensors,
        encrypt_tensors,
        load_public_context,
        make_secret_context,
        public_context_bytes,
        values_per_ciphertext,
    )
    from falsevfl_secure.secure.ckks_seal import load_ciphertext, save_ciphertext, seal_tools

    secret = make_secret_context()
    public = load_public_context(public_context_bytes(secret))
    tools, values = seal_tools(public), np.random.default_rng(0).normal(size=values_per_ciphertext(public))
    tensor = torch.from_numpy(values)
    message = encrypt_tensors(public, [tensor], n_addends=8)
    zeros = [tools.zero() for _ in range(repeats)]
    ciphertext = tools.encrypt(values)
    payload = save_ciphertext(ciphertext)
    received = load_ciphertext(seal_tools(secret), payload)
    received_sum = load_ciphertext(tools, payload)  # the aggregator's running sum

    fresh = iter(zeros)  # the online part adds into each encryption of zero once

    def timed(piece) -> float:
        return round(_median_ms(piece, repeats), 3)

    return {
        "he: encrypt_tensors, 8,192 values (onto the grid, encrypt, serialise)":
            timed(lambda: encrypt_tensors(public, [tensor], n_addends=8)),
        "he: decrypt_tensors, 8,192 values (parse, decrypt, round onto the grid)":
            timed(lambda: decrypt_tensors(secret, message, [tensor.shape])),
        "he: encrypt one ciphertext (8,192 values in 4,096 complex slots)": timed(lambda: tools.encrypt(values)),
        "he: an encryption of zero (offline part)": timed(lambda: tools.zero()),
        "he: encoded values added onto an encryption of zero (online part)":
            timed(lambda: tools.add_values(next(fresh), values)),
        "he: serialise": timed(lambda: save_ciphertext(ciphertext)),
        "he: parse": timed(lambda: load_ciphertext(tools, payload)),
        "he: add two ciphertexts": timed(lambda: tools.evaluator.add_inplace(received_sum, ciphertext)),
        "he: decrypt": timed(lambda: seal_tools(secret).decrypt(received)),
    }


def _median_ms(piece, repeats: int) -> float:
    """Median wall milliseconds of `piece()` over `repeats` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        piece()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def _openssl_aes_ctr_mb_per_s() -> float | None:
    """`openssl speed -evp aes-256-ctr` on 16,384-byte blocks, in MB/s (None without an openssl binary)."""
    try:
        done = subprocess.run(["openssl", "speed", "-evp", "aes-256-ctr", "-bytes", "16384", "-seconds", "2"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"^AES-256-CTR\s+([0-9.]+)k", done.stdout, flags=re.MULTILINE)
    return round(float(found.group(1)) / 1000, 1) if found else None  # openssl prints 1000s of bytes/s


def keystream_costs(n_values: int, repeats: int) -> dict[str, float | None]:
    """MB/s of the mask keystream written into an int64 buffer, and of `read` (a new bytes object)."""
    import numpy as np

    from falsevfl_secure.randomness import KeyStream

    stream, out = KeyStream(secrets.token_bytes(32)), np.empty(n_values, dtype=np.int64)
    into = _median_ms(lambda: stream.read_into(out), repeats)
    read = _median_ms(lambda: stream.read(out.nbytes), repeats)
    return {"keystream MB/s, KeyStream.read_into an int64 buffer": round(out.nbytes / into / 1000, 1),
            "keystream MB/s, KeyStream.read (a new bytes object)": round(out.nbytes / read / 1000, 1),
            "keystream MB/s, openssl speed -evp aes-256-ctr, 16384-byte blocks": _openssl_aes_ctr_mb_per_s()}


def mask_costs(parties: int, n_values: int, repeats: int) -> dict[str, float]:
    """ms for one zero share of `parties` - 1 pair streams (a middle rank: both signs), drawn now and ahead."""
    from falsevfl_secure.randomness import KeyStream
    from falsevfl_secure.secure.masks import ZeroShares, zero_share

    rank, pairs = parties // 2, parties - 1
    streams = {peer: KeyStream(secrets.token_bytes(32)) for peer in range(parties) if peer != rank}
    shares = ZeroShares(rank, {peer: secrets.token_bytes(32) for peer in streams})

    ahead: list[float] = []
    shares.take(n_values)
    try:
        for _ in range(repeats):
            for pending in list(shares._pending):  # the draw ahead has finished, as while a party waits on peers
                pending.result()
            ahead.append(_median_ms(lambda: shares.take(n_values), 1))
    finally:
        shares.close()
    return {f"zero share, {pairs} pairs x {n_values:,} int64 (zero_share, drawn now), ms":
                round(_median_ms(lambda: zero_share(rank, streams, n_values), repeats), 2),
            f"zero share, {pairs} pairs x {n_values:,} int64 (ZeroShares.take, drawn ahead), ms":
                round(statistics.median(ahead), 3)}


def ckks_costs(n_values: int, repeats: int) -> dict[str, float]:
    """ms per thousand values (and bytes per value) of a message of `n_values` values: encrypted at once, or
    online on zeros that a helper made ahead; the aggregator's sum of two; decryption."""
    import torch

    from falsevfl_secure.secure import ckks

    secret = ckks.make_secret_context()
    public = ckks.load_public_context(ckks.public_context_bytes(secret))
    x = torch.randn(n_values, dtype=torch.float64)  # benchmark input, not a secret
    sent = ckks.encrypt_tensors(public, [x], n_addends=8)
    per_thousand = 1000 / n_values
    return {"he: encrypt at once, ms per 1000 values":
                round(_median_ms(lambda: ckks.encrypt_tensors(public, [x], n_addends=8), repeats) * per_thousand, 3),
            "he: encrypt online on pooled zeros, ms per 1000 values":
                round(_online_ms(public, x, repeats) * per_thousand, 3),
            "he: sum of 2, ms per 1000 values":
                round(_median_ms(lambda: ckks.sum_encrypted(public, [sent, sent]), repeats) * per_thousand, 3),
            "he: decrypt, ms per 1000 values":
                round(_median_ms(lambda: ckks.decrypt_tensors(secret, sent, [x.shape]), repeats) * per_thousand, 3),
            "he: bytes per value": round(len(sent) / n_values, 2)}


def _online_ms(public, x, repeats: int) -> float:
    """Median ms of `encrypt_tensors` on zeros a helper made ahead (each timed once its zeros are ready)."""
    from falsevfl_secure.secure import ckks

    count, times = ckks.n_chunks(x.numel(), ckks.values_per_ciphertext(public)), []
    with ckks.ZeroPool(public, idle=False) as pool:
        pool.take(count)  # the demand: the helper now keeps 3 messages' zeros ready
        for _ in range(repeats):
            _ready(pool, count)
            start = time.perf_counter()
            ckks.encrypt_tensors(public, [x], n_addends=8, zeros=pool)
            times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def _ready(pool, n: int, timeout_s: float = 300.0) -> None:
    """Wait until the pool's helper has `n` zeros ready (it runs at normal priority here)."""
    deadline = time.monotonic() + timeout_s
    while len(pool) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def micro_costs(parties: int, shape: tuple[int, ...], repeats: int, he_values: int) -> dict[str, float | None]:
    """The single-process measurements (no process world): keystream, zero share, CKKS."""
    import torch

    torch.set_num_threads(1)
    n_values = math.prod(shape)
    costs = {**keystream_costs(n_values, repeats), **mask_costs(parties, n_values, repeats)}
    costs.update(ckks_costs(he_values, max(1, repeats // 3)))
    return costs


def markdown(record: dict) -> str:
    shape = " x ".join(str(s) for s in record["config"]["shape"])
    lines = [f"One secure sum of a {shape} tensor over {record['config']['parties']} party processes "
             "(mpc; the slowest rank, barrier to barrier), and one CKKS ciphertext of the default parameters "
             "(he: N = 8192, [60, 20, 60], scale 2^40, 8,192 values in 4,096 complex slots):", "",
             "| piece | ms (median) |", "|---|---|"]
    lines += [f"| {name} | {ms:.2f} |" for name, ms in record["costs"].items()]
    return "\n".join(lines) + "\n"


def micro_markdown(record: dict) -> str:
    """The --micro measurements as a table (MB/s, ms per thousand values, bytes per value)."""
    shape = " x ".join(str(s) for s in record["config"]["shape"])
    lines = [f"Single process, torch on one thread: the mask keystream, one zero share of {record['config']['parties']}"
             f" - 1 pair streams of a {shape} int64 tensor, and CKKS (N = 8192) on a tensor of "
             f"{record['config']['he_values']:,} values:", "",
             "| measurement | value |", "|---|---|"]
    lines += [f"| {name} | {'-' if value is None else value} |" for name, value in record["costs"].items()]
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parties", type=int, default=8)
    p.add_argument("--shape", type=int, nargs="+", default=[10, 512, 128])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--micro", action="store_true", help="only the single-process measurements (crypto_micro.json)")
    p.add_argument("--he-values", type=int, default=65536, help="--micro: values of the CKKS tensor")
    p.add_argument("--out", default="runs/crypto_costs")
    p.add_argument("--readme", default=None, help="rewrite its <!-- results:NAME:... --> section, NAME the --out "
                   "folder's name")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.parties < 2 or args.repeats < 1 or min(args.shape) < 1:
        print("error: --parties must be >= 2, --repeats >= 1 and every --shape entry >= 1", file=sys.stderr)
        return 2
    if args.micro:
        return _micro_main(args)
    import torch

    record = {"config": {**vars(args), "threads": torch.get_num_threads()},
              "costs": {**mpc_costs(args.parties, tuple(args.shape), args.repeats), **he_costs(args.repeats)}}
    return publish(args, "crypto_costs", record, markdown(record))


def _micro_main(args: argparse.Namespace) -> int:
    """--micro: the single-process measurements only, to DIR/crypto_micro.json and one line each."""
    if args.he_values < 1:
        print("error: --he-values must be >= 1", file=sys.stderr)
        return 2
    costs = micro_costs(args.parties, tuple(args.shape), args.repeats, args.he_values)
    record = {"config": vars(args), "costs": costs}
    return publish(args, "crypto_micro", record, micro_markdown(record))


def publish(args: argparse.Namespace, stem: str, record: dict, table: str) -> int:
    """OUT/STEM.json and OUT/STEM.md, the table printed, and with --readme its section rewritten."""
    out = Path(args.out)
    write_json(out / f"{stem}.json", record)
    (out / f"{stem}.md").write_text(table)
    print(table)
    if args.readme:
        update_readme(Path(args.readme), out.resolve().name, table)
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
