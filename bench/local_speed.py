"""Local runtime speed: one stage-1 step at Isolet's shape, the K party networks called one after
the other (`sequential`) against the batched `PartyStack` (`stacked`), and both against one fused
network of the same FLOPs (`fused`).

    python bench/local_speed.py [--parties 8] [--width 77] [--batch 512] [--kappa 10] [--repeats 20]
        [--party-hidden 256] [--global-hidden 256] [--device cpu|cuda] [--threads N] --out DIR

A step is what `train.pretrain` does per mini-batch: zero the gradients, the forward rounds, the
backward rounds and one Adam step of every role. `fused` is the same computation with the K party
blocks concatenated along the rows and pushed through ONE party network: the same matrix products
(K B rows through the encoder, K S B rows through the decoder) in single large calls, plus the same
active-party networks -- the speed the K separate networks could at best reach. The issue's target
is stacked / fused <= 1.3.

Writes DIR/local_speed.json ({"config", "cells": [{"mode", "step_ms_median", "step_ms_min",
"step_ms_max", "gflop_per_step", "gflop_per_s"}], "ratios", "schedule"}) and DIR/local_speed.png.
`schedule` projects the step time onto Isolet's full stage-1 schedule (6238 rows, 300 epochs).
Timings are measurements on the machine that runs it, never asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from readme_section import update_readme  # noqa: E402

from falsevfl_secure.bounds import iwae_bound  # noqa: E402
from falsevfl_secure.cli import guarded  # noqa: E402
from falsevfl_secure.config import (  # noqa: E402
    Config,
    Stage,  # noqa: E402
    StageConfig,
)
from falsevfl_secure.data.synthetic import synthetic_split  # noqa: E402
from falsevfl_secure.fsio import write_json  # noqa: E402
from falsevfl_secure.methods import build_node  # noqa: E402
from falsevfl_secure.methods.false_vfl_steps import stage1_loss  # noqa: E402
from falsevfl_secure.model.party import likelihood_terms, posterior_terms  # noqa: E402
from falsevfl_secure.node import resolve_device  # noqa: E402
from falsevfl_secure.randomness import RoleSecret  # noqa: E402
from falsevfl_secure.train import host_split, optimizers_for  # noqa: E402
from falsevfl_secure.transport import LocalTransport  # noqa: E402

ISOLET_TRAIN_ROWS, ISOLET_EPOCHS = 6238, 300


def linear_macs(sizes: list[int]) -> int:
    return sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=False))


def step_gflop(cfg: Config, width: int, batch: int) -> float:
    """Matrix-product FLOPs of one stage-1 step (forward + backward = 3x forward, 2 FLOPs a MAC)."""
    party = batch * linear_macs([width, cfg.party_hidden, 2 * cfg.h_dim])
    party += cfg.kappa * batch * linear_macs([cfg.h_dim, cfg.party_hidden, 2 * width])
    if cfg.options.get("variant") == "II":
        party += cfg.kappa * batch * linear_macs([width, cfg.indicator_hidden, cfg.indicator_hidden, 1])
    active = cfg.kappa * batch * (linear_macs([cfg.h_dim, cfg.global_hidden, cfg.global_hidden, 2 * cfg.z_dim])
                                  + linear_macs([cfg.z_dim, cfg.global_hidden, cfg.global_hidden, 2 * cfg.h_dim]))
    return 3 * 2 * (cfg.parties * party + active) / 1e9


def make_cfg(args, stack: bool) -> Config:
    return Config(dataset="synthetic", parties=args.parties, options={"variant": args.variant}, h_dim=128, z_dim=64,
                  party_hidden=args.party_hidden, global_hidden=args.global_hidden, kappa=args.kappa,
                  pretrain=StageConfig(5e-4, args.batch, 1), device=args.device,
                  stack_parties="always" if stack else "never")


def world_step(cfg: Config, width: int):
    """A closure running one real stage-1 step of the local runtime."""
    device = resolve_device(cfg.device)
    split = synthetic_split(n=cfg.pretrain.batch_size, parties=cfg.parties, width=width, p_missing=0.2,
                            seed=0, n_classes=26)
    world = build_node(cfg, {k: width for k in range(cfg.parties)}, 26,
                       LocalTransport(cfg.parties, cfg.active_index), device)
    data = host_split(split.view(range(cfg.parties), True), device, 26)
    batch = data.batch(np.arange(data.n))
    optimizers = optimizers_for(world, Stage.PRETRAIN)

    def step() -> None:
        for opt in optimizers.values():
            opt.zero_grad(set_to_none=True)
        loss = stage1_loss(world, batch)
        world.transport.backward(loss)
        for opt in optimizers.values():
            opt.step()

    return step


def fused_step(cfg: Config, width: int):
    """The same FLOPs through ONE party network over the concatenated blocks (K B rows)."""
    device = resolve_device(cfg.device)
    world = build_node(replace(cfg, parties=2, active_party=0), {0: width}, 26, LocalTransport(2, 0), device)
    party, active = world.parties[0].model, world.active.get().model
    k, b = cfg.parties, cfg.pretrain.batch_size
    generator = torch.Generator(device=device).manual_seed(0)  # the benchmark's synthetic inputs, not secrets
    noise = RoleSecret.fresh().stream("bench/noise")
    x = torch.randn(k * b, width, device=device, generator=generator)
    held = torch.rand(k * b, device=device, generator=generator) > 0.2
    n_observed = held.view(k, b).sum(0).clamp(min=1).float()
    params = [*party.parameters(), *active.generative_parameters()]
    optimizer = torch.optim.Adam(params, lr=5e-4, weight_decay=1e-4)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        sum_posterior = posterior_terms(party.encoder(x), held).view(k, b, -1).sum(0)
        h, log_q_h = active.sample_latent(sum_posterior, n_observed, cfg.kappa, noise)
        h_all = h.unsqueeze(1).expand(cfg.kappa, k, b, cfg.h_dim).reshape(cfg.kappa, k * b, cfg.h_dim)
        mean, std = party.decode(h_all)
        draws = noise.normal(tuple(mean.shape), mean.dtype, device) if party.indicator is not None else None
        terms = likelihood_terms(mean, std, x, held, party.indicator, draws)
        log_lik = terms.view(cfg.kappa, k, b).sum(1)
        loss = -iwae_bound(active.log_weights(log_q_h, log_lik, active.global_terms(h, noise))).mean()
        loss.backward()
        optimizer.step()

    return step


def time_step(step, warmup: int, repeats: int, device: torch.device) -> list[float]:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    ms = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        step()
        sync()
        ms.append(1000 * (time.perf_counter() - start))
    return ms


def plot(cells: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    names = [c["mode"] for c in cells]
    ax.bar(names, [c["step_ms_median"] for c in cells], color=["#c44e52", "#4c72b0", "#55a868"][: len(cells)],
           yerr=[[c["step_ms_median"] - c["step_ms_min"] for c in cells],
                 [c["step_ms_max"] - c["step_ms_median"] for c in cells]], capsize=3)
    for i, c in enumerate(cells):
        ax.text(i, c["step_ms_median"], f"{c['step_ms_median']:.0f} ms", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("stage-1 step (ms, median)")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary_table(root: Path) -> str:
    """One row per local_speed.json below `root`: device, widths, the three step times, the ratios
    and the projected Isolet stage 1."""
    lines = ["| run | device (threads) | hidden party/global | sequential ms | stacked ms | fused ms | "
             "stacked/fused | sequential/stacked | projected Isolet stage 1 (faster runtime mode) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(root.glob("*/local_speed.json")):
        record = json.loads(path.read_text())
        config, by = record["config"], {c["mode"]: c["step_ms_median"] for c in record["cells"]}
        fastest = min((m for m in ("sequential", "stacked") if m in by), key=by.get)
        projected = record["schedule"][fastest]["stage1_projected_s"] / 60

        sequential, stacked, fused = (f"{by[m]:.1f}" if m in by else "-" for m in ("sequential", "stacked", "fused"))
        lines.append(f"| {path.parent.name} | {config['device']} ({config['threads']}) | {config['party_hidden']}/"
                     f"{config['global_hidden']} | {sequential} | {stacked} | {fused} | "
                     f"{record['ratios'].get('stacked/fused', float('nan')):.2f} | "
                     f"{record['ratios'].get('sequential/stacked', float('nan')):.2f} | "
                     f"{projected:.1f} min ({fastest}) |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parties", type=int, default=8)
    p.add_argument("--width", type=int, default=77, help="features per party (Isolet: 77)")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--kappa", type=int, default=10)
    p.add_argument("--variant", choices=["I", "II"], default="I")
    p.add_argument("--party-hidden", type=int, default=256)
    p.add_argument("--global-hidden", type=int, default=256)
    p.add_argument("--modes", nargs="+", default=["sequential", "stacked", "fused"],
                   choices=["sequential", "stacked", "fused"])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="runs/local_speed")
    p.add_argument("--summarise", default=None, metavar="DIR",
                   help="no measurement: tabulate every DIR/*/local_speed.json (with --readme: into its section "
                        "<!-- results:NAME:... -->, NAME the folder's name)")
    p.add_argument("--readme", default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.summarise:
        root = Path(args.summarise)
        table = summary_table(root)
        print(table)
        if args.readme:
            update_readme(Path(args.readme), root.resolve().name, table)
        return 0
    if min(args.parties - 1, args.width, args.batch, args.kappa, args.repeats) < 1:
        print("error: --parties must be >= 2 and --width, --batch, --kappa, --repeats >= 1", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    cfg = make_cfg(args, stack=True)
    gflop = step_gflop(cfg, args.width, args.batch)
    builders = {"sequential": lambda: world_step(make_cfg(args, stack=False), args.width),
                "stacked": lambda: world_step(cfg, args.width),
                "fused": lambda: fused_step(cfg, args.width)}
    cells = []
    for mode in args.modes:
        ms = time_step(builders[mode](), args.warmup, args.repeats, device)
        median = statistics.median(ms)
        cells.append({"mode": mode, "step_ms_median": round(median, 2), "step_ms_min": round(min(ms), 2),
                      "step_ms_max": round(max(ms), 2), "gflop_per_step": round(gflop, 2),
                      "gflop_per_s": round(gflop / (median / 1000), 1)})
        print(f"{mode:<11}{median:9.1f} ms  (min {min(ms):.1f}, max {max(ms):.1f})  "
              f"{gflop / (median / 1000):6.1f} GFLOP/s", flush=True)
    by = {c["mode"]: c["step_ms_median"] for c in cells}
    ratios = {f"{a}/fused": round(by[a] / by["fused"], 3) for a in ("sequential", "stacked")
              if a in by and "fused" in by}
    if "sequential" in by and "stacked" in by:
        ratios["sequential/stacked"] = round(by["sequential"] / by["stacked"], 3)
    steps = -(-ISOLET_TRAIN_ROWS // args.batch) * ISOLET_EPOCHS
    schedule = {mode: {"stage1_steps": steps, "stage1_projected_s": round(ms * steps / 1000, 1)}
                for mode, ms in by.items()}
    record = {"config": {**vars(args), "device": str(device), "threads": torch.get_num_threads()},
              "cells": cells, "ratios": ratios, "schedule": schedule}
    out = Path(args.out)
    write_json(out / "local_speed.json", record)
    plot(cells, out / "local_speed.png", f"K={args.parties} x {args.width} features, B={args.batch}, "
         f"kappa={args.kappa}, hidden {args.party_hidden}/{args.global_hidden}, {device} "
         f"({torch.get_num_threads()} threads)")
    for name, value in ratios.items():
        print(f"{name:<22}{value:6.2f}")
    for mode, s in schedule.items():
        print(f"{mode:<11} projected Isolet stage 1 ({steps} steps): {s['stage1_projected_s'] / 60:.1f} min")
    print(f"results: {out / 'local_speed.json'} and {out / 'local_speed.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
