"""What one passive party learns from the latent samples h that the active party broadcasts in clear.

    python bench/disclosure.py --datasets digits isolet --out bench/results/disclosure [--seed 0]
        [--label-rows 40] [--feature-rows 100 500] [--draws 5] [--readme README.md]

In every protocol (`plain`, `mpc`, `he`) the `latent` round sends h (S, B, d_h) in clear to every
party, for every row of the batch, also rows that party does not hold. No defence is built here; this
script states the disclosure with numbers. Per dataset it trains FALSE-VFL-I with the local runtime
(digits: preset "default" as read from `config.PRESETS` at run time; isolet: preset "quick", 30 + 30
epochs, to keep CPU time sane), then records what passive party p = 0 receives in the latent round
when the trained model runs its PREDICT-stage forward rounds (S = cfg.predict_samples samples per row,
in evaluation batches, noise restarted) over the training split and over the test split under test
pattern "mcar:0" (every party holds every test row, so q's features exist on every evaluated row).
The attacker's input per row is the mean of the S samples it received ("h mean"), with the log of their
standard deviation ("h mean, log h std"), or the first sample alone ("h one sample", what one
stage-1/stage-2 batch row gives).

A broadcast of the posterior's moments (mu, sigma) instead of samples would cut the round S/2-fold; the
same attackers are run on the exact moments the active party sampled from ("mu", "mu, log sigma") and
compared per attacker draw with their sample estimates (the "moments - samples" table): a difference
beyond the spread of the draws is what the moments would disclose in addition.

(a) Label inference. p knows the labels of `--label-rows` training rows drawn at random among the
    rows it holds; it fits sklearn LogisticRegression (C = 1, L2, lbfgs) on standardised inputs and
    predicts the test rows. Baselines: the same attacker on its own features x_p of the same rows, the
    majority class of the test rows, and the trained FALSE-VFL model's accuracy on the same rows.
(b) Feature inference. p knows party q = 1's block x_q on `--feature-rows` training rows both hold;
    it fits sklearn RidgeCV (alphas 1e-2..1e4, leave-one-out) on standardised inputs and predicts x_q
    on the test rows. Metric: R^2 per feature of q, averaged over the features that vary on the test
    rows. Baselines: the same regression from x_p, and 0 (predicting the mean).

Every attacker draw is repeated `--draws` times (mean ± std). The split and the draws follow
`--seed`; the parties' weights and noise come from fresh secrets, as in every real run, so a rerun
trains a slightly different model. Writes OUT/disclosure.json (every number, the configuration, the
model's accuracy and times), OUT/disclosure.md (the table) and OUT/disclosure.png (bars).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from readme_section import relative_link, update_readme  # noqa: E402

from falsevfl_secure.bounds import latent_posterior  # noqa: E402
from falsevfl_secure.config import Stage  # noqa: E402
from falsevfl_secure.data import make_splits  # noqa: E402
from falsevfl_secure.data.loaders import canonical_name  # noqa: E402
from falsevfl_secure.errors import FalseVflError  # noqa: E402
from falsevfl_secure.fsio import atomic_write, write_json  # noqa: E402
from falsevfl_secure.methods import make_config  # noqa: E402
from falsevfl_secure.methods.false_vfl_steps import forward_rounds  # noqa: E402
from falsevfl_secure.runtime.local import run_local  # noqa: E402
from falsevfl_secure.train import host_split  # noqa: E402
from falsevfl_secure.transport.rounds import LATENT  # noqa: E402

PRESET_OF = {"digits": "default", "isolet": "quick"}  # isolet quick: 30 + 30 epochs on 2 CPU cores
PASSIVE, OTHER = 0, 1  # the attacker p and the party q whose features it targets
TEST_PATTERN = "mcar:0"  # every party holds every test row
ALPHAS = np.logspace(-2, 4, 13)
H_INPUTS = ("h mean", "h one sample", "h mean + x_p", "h mean, log h std", "h mean, log h std + x_p")  # from samples
MOMENT_INPUTS = ("mu", "mu, log sigma", "mu, log sigma + x_p")  # what a broadcast of moments would give it
INPUTS = (*H_INPUTS, *MOMENT_INPUTS, "x_p")
PAIRS = (("mu", "h mean"), ("mu, log sigma", "h mean, log h std"),  # moments against their sample estimates
         ("mu, log sigma + x_p", "h mean, log h std + x_p"))


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """Bad arguments: one `error:` line and exit code 2, no usage dump."""
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, validated (datasets known to PRESETS, positive counts)."""
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["digits", "isolet"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label-rows", type=int, nargs="+", default=[40])
    parser.add_argument("--feature-rows", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--readme", type=Path, default=None, help="rewrite its <!-- results:NAME:... --> section, "
                        "NAME = the --out folder's name")
    args = parser.parse_args(argv)
    try:
        args.datasets = [canonical_name(d) for d in args.datasets]
    except FalseVflError as error:
        parser.error(str(error))
    if any(d not in PRESET_OF for d in args.datasets):
        parser.error(f"--datasets: choose among {sorted(PRESET_OF)}")
    if min(args.label_rows) < 2 or min(args.feature_rows) < 2 or args.draws < 1 or not 0 <= args.seed < 2**32:
        parser.error("--label-rows and --feature-rows must be >= 2, --draws >= 1, --seed in 0..2^32-1")
    return args


def train(dataset: str, seed: int):
    """The trained node (local runtime, CPU) and its run record, on the dataset's preset."""
    cfg = make_config(dataset, PRESET_OF[dataset], seed=seed, device="cpu")
    nodes: list = []
    result = run_local(cfg, (TEST_PATTERN,), progress=False, keep=nodes)
    return cfg, nodes[0], result


class LatentTap:
    """While active, keeps what party `party` receives in every `latent` broadcast of `transport`."""

    def __init__(self, transport, party: int) -> None:
        self.transport, self.party, self.received = transport, party, []
        self.original = transport.broadcast

    def __enter__(self) -> LatentTap:
        self.transport.broadcast = self._broadcast  # an instance attribute shadows the method
        return self

    def __exit__(self, *exc) -> None:
        del self.transport.broadcast

    def _broadcast(self, round, value, shape):
        copies = self.original(round, value, shape)
        if round.name == LATENT.name:
            self.received.append(copies[self.party].detach())
        return copies


class MomentsTap:
    """While active, keeps the posterior moments (mu, sigma) of q(h | x_obs) the active party samples
    from: what a broadcast of moments instead of samples would give every party."""

    def __init__(self, model) -> None:
        self.model, self.moments = model, []
        self.original = model.sample_latent

    def __enter__(self) -> MomentsTap:
        self.model.sample_latent = self._sample
        return self

    def __exit__(self, *exc) -> None:
        del self.model.sample_latent

    def _sample(self, sum_posterior, n_observed, kappa, noise):
        sum_mean, sum_precision = sum_posterior.split(self.model.h_dim, dim=-1)
        q_h = latent_posterior(sum_mean, sum_precision, n_observed)
        self.moments.append(torch.cat([q_h.loc, q_h.scale.log()], dim=-1).detach())
        return self.original(sum_posterior, n_observed, kappa, noise)


def received_latents(node, view, n_classes: int) -> dict[str, np.ndarray]:
    """Per row of a split, what p received in the PREDICT-stage latent round: the mean over the S
    samples and the first sample, in evaluation batches as `train.predict_split` runs them; and what a
    broadcast of the posterior's moments would have given it instead ("mu", "mu, log sigma")."""
    data, size = host_split(view, node.device, n_classes), node.cfg.eval_batch_size
    node.restart_noise(Stage.PREDICT)
    with torch.no_grad(), LatentTap(node.transport, PASSIVE) as tap, MomentsTap(node.active.get().model) as exact:
        for start in range(0, data.n, size):
            batch = data.batch(np.arange(start, min(start + size, data.n)))
            h = forward_rounds(node, batch, node.cfg.predict_samples, Stage.PREDICT).get().h
            if not torch.equal(tap.received[-1], h):  # the tap must see exactly the broadcast value
                raise AssertionError("the recorded broadcast differs from the latent samples")
    h = torch.cat(tap.received, dim=1).numpy()  # (S, N, d_h)
    moments = torch.cat(exact.moments, dim=0).numpy()  # (N, 2 d_h)
    spread = np.log(h.std(axis=0, ddof=1) + 1e-12) if h.shape[0] > 1 else np.zeros_like(h[0])
    return {"h mean": h.mean(axis=0), "h one sample": h[0], "h mean, log h std": np.hstack([h.mean(axis=0), spread]),
            "mu": moments[:, :node.cfg.h_dim], "mu, log sigma": moments}


def attacker_inputs(latents: dict[str, np.ndarray], x_p: np.ndarray) -> dict[str, np.ndarray]:
    """Every input the attacker is scored with: from the broadcast, from its own block, both."""
    return {**latents, "h mean + x_p": np.hstack([latents["h mean"], x_p]),
            "h mean, log h std + x_p": np.hstack([latents["h mean, log h std"], x_p]),
            "mu, log sigma + x_p": np.hstack([latents["mu, log sigma"], x_p]), "x_p": x_p}


def label_attack(inputs: dict, train_y: np.ndarray, test_y: np.ndarray, candidates: np.ndarray,
                 n_rows: int, draws: int, rng: np.random.Generator) -> dict[str, list[float]]:
    """Test accuracy (%) per input of a logistic regression fitted on `n_rows` labeled candidate rows."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    scores: dict[str, list[float]] = {name: [] for name in inputs}
    for _ in range(draws):
        rows = rng.choice(candidates, size=min(n_rows, len(candidates)), replace=False)
        for name, (train_x, test_x) in inputs.items():
            if len(np.unique(train_y[rows])) < 2:  # one class known: it can only predict that class
                predicted = np.full(len(test_y), train_y[rows][0])
            else:
                model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=5000))
                with warnings.catch_warnings():  # 40 rows of 26 classes is the attack's setting, not a mistake
                    warnings.filterwarnings("ignore", message="The number of unique classes")
                    predicted = model.fit(train_x[rows], train_y[rows]).predict(test_x)
            scores[name].append(100.0 * float(np.mean(predicted == test_y)))
    return scores


def mean_r2(truth: np.ndarray, predicted: np.ndarray) -> float:
    """R^2 per column, averaged over the columns that vary (a constant pixel has no R^2)."""
    varies = truth.var(axis=0) > 1e-12
    residual = ((truth - predicted) ** 2).sum(axis=0)[varies]
    total = ((truth - truth.mean(axis=0)) ** 2).sum(axis=0)[varies]
    return float(np.mean(1.0 - residual / total))


def feature_attack(inputs: dict, train_q: np.ndarray, test_q: np.ndarray, candidates: np.ndarray,
                   n_rows: int, draws: int, rng: np.random.Generator) -> dict[str, list[float]]:
    """Mean test R^2 of q's features per input, from a ridge regression fitted on `n_rows` candidate rows."""
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    scores: dict[str, list[float]] = {name: [] for name in inputs}
    for _ in range(draws):
        rows = rng.choice(candidates, size=min(n_rows, len(candidates)), replace=False)
        for name, (train_x, test_x) in inputs.items():
            model = make_pipeline(StandardScaler(), RidgeCV(alphas=ALPHAS))
            scores[name].append(mean_r2(test_q, model.fit(train_x[rows], train_q[rows]).predict(test_x)))
    return scores


def summary(values: list[float]) -> dict:
    """Mean, population std and the draws themselves."""
    return {"mean": float(np.mean(values)), "std": float(np.std(values)), "draws": [float(v) for v in values]}


def run_dataset(dataset: str, args: argparse.Namespace) -> dict:
    """Train, record the broadcasts at p, run both attacks; the dataset's record."""
    began = time.perf_counter()
    cfg, node, result = train(dataset, args.seed)
    data, train_split, tests = make_splits(cfg, (TEST_PATTERN,))  # the run's own public split, redrawn
    test_split, everyone, n_classes = tests[TEST_PATTERN], range(cfg.parties), data.n_classes
    attacked = time.perf_counter()
    received = {name: received_latents(node, s.view(everyone, True), n_classes)
                for name, s in (("train", train_split), ("test", test_split))}
    x_p = {name: s.blocks[PASSIVE] for name, s in (("train", train_split), ("test", test_split))}
    inputs = {k: (v, attacker_inputs(received["test"], x_p["test"])[k])
              for k, v in attacker_inputs(received["train"], x_p["train"]).items()}
    held = ~train_split.missing
    rng = np.random.default_rng([args.seed, 7])  # the attacker's draws: public seed, own stream
    labels = {n: label_attack(inputs, train_split.y, test_split.y, np.flatnonzero(held[:, PASSIVE]), n,
                              args.draws, rng) for n in args.label_rows}
    features = {n: feature_attack(inputs, train_split.blocks[OTHER], test_split.blocks[OTHER],
                                  np.flatnonzero(held[:, PASSIVE] & held[:, OTHER]), n, args.draws, rng)
                for n in args.feature_rows}
    counts = np.bincount(test_split.y)
    return {
        "dataset": dataset, "preset": PRESET_OF[dataset], "parties": cfg.parties, "active_party": cfg.active_index,
        "passive_party": PASSIVE, "other_party": OTHER, "test_pattern": TEST_PATTERN,
        "rows": {"train": train_split.n, "test": test_split.n, "train_held_by_p": int(held[:, PASSIVE].sum()),
                 "train_held_by_p_and_q": int((held[:, PASSIVE] & held[:, OTHER]).sum())},
        "features_of_q": int(train_split.blocks[OTHER].shape[1]),
        "features_of_q_varying_on_test": int((test_split.blocks[OTHER].var(axis=0) > 1e-12).sum()),
        "model_accuracy": result.accuracy[TEST_PATTERN], "majority_class_accuracy": 100.0 * counts.max() / counts.sum(),
        "chance_uniform_accuracy": 100.0 / n_classes, "n_classes": n_classes,
        "label_inference": {str(n): {k: summary(v) for k, v in s.items()} for n, s in labels.items()},
        "feature_inference": {str(n): {k: summary(v) for k, v in s.items()} for n, s in features.items()},
        "config": cfg.to_dict(), "stage_time_s": result.stage_time_s,
        "train_wall_s": round(attacked - began, 1), "attack_wall_s": round(time.perf_counter() - attacked, 1),
    }


def fmt(s: dict, digits: int) -> str:
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def table(records: list[dict]) -> str:
    """The markdown table: one row per dataset, attack, auxiliary-row count and input."""
    lines = ["| dataset | K | attack | input | metric | value | baseline values |", "|---|---|---|---|---|---|---|"]
    for r in records:
        for n, scores in r["label_inference"].items():
            base = (f"own x_p: {fmt(scores['x_p'], 1)}; majority class: {r['majority_class_accuracy']:.1f}; "
                    f"FALSE-VFL model: {r['model_accuracy']:.1f}")
            lines += [f"| {r['dataset']} | {r['parties']} | label inference, {n} labeled rows | {name} | "
                      f"test accuracy % | {fmt(scores[name], 1)} | {base} |" for name in INPUTS]
        for n, scores in r["feature_inference"].items():
            base = f"own x_p: {fmt(scores['x_p'], 3)}; mean: 0"
            lines += [f"| {r['dataset']} | {r['parties']} | feature inference of x_q, {n} rows | {name} | "
                      f"mean test R^2 | {fmt(scores[name], 3)} | {base} |" for name in INPUTS]
    return "\n".join(lines) + "\n"


def moments_gaps(records: list[dict]) -> list[dict]:
    """Per attack, what the moments add over the samples: the paired difference per attacker draw (the
    same rows fit both), against the spread of the samples' own draws."""
    out = []
    for r in records:
        attacks = (("label inference", r["label_inference"]), ("feature inference", r["feature_inference"]))
        for attack, groups in attacks:
            for n, scores in groups.items():
                for moments, samples in PAIRS:
                    gap = np.subtract(scores[moments]["draws"], scores[samples]["draws"])
                    out.append({"dataset": r["dataset"], "attack": attack, "rows": int(n), "moments": moments,
                                "samples": samples, "gap_mean": float(gap.mean()), "gap_std": float(gap.std()),
                                "samples_spread": scores[samples]["std"],
                                "within_spread": bool(abs(gap.mean()) <= scores[samples]["std"])})
    return out


def gap_table(gaps: list[dict]) -> str:
    lines = ["| dataset | attack | rows | moments input | samples input | moments - samples (paired) | "
             "spread of samples' draws | within spread |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {g['dataset']} | {g['attack']} | {g['rows']} | {g['moments']} | {g['samples']} | "
              f"{g['gap_mean']:+.3f} ± {g['gap_std']:.3f} | {g['samples_spread']:.3f} | "
              f"{'yes' if g['within_spread'] else 'no'} |" for g in gaps]
    return "\n".join(lines) + "\n"


def markdown(records: list[dict], command: str) -> str:
    """The report: the command, the setting in one paragraph, the table."""
    setting = ("Passive party p = 0 attacks with what it receives in the `latent` broadcast (PREDICT stage, "
               "S = predict_samples per row); q = 1; the active party is the last one. Test rows: pattern "
               "mcar:0 (every party holds every row). Label inference: LogisticRegression (C = 1) on "
               "standardised inputs; feature inference: RidgeCV (alphas 1e-2..1e4) on standardised inputs, "
               "R^2 averaged over q's features that vary on the test rows. Mean ± std over attacker draws.")
    runs = "; ".join(f"{r['dataset']}: preset {r['preset']}, {r['config']['pretrain']['epochs']} + "
                     f"{r['config']['train']['epochs']} epochs, model accuracy {r['model_accuracy']:.1f} %"
                     for r in records)
    moments = ("What a broadcast of the posterior's moments (mu, sigma) instead of S samples would add: "
               "the same attacks on the exact moments, paired per attacker draw with the samples' input.")
    return (f"`{command}`\n\n{setting}\n\nModels: {runs}.\n\n{table(records)}\n{moments}\n\n"
            f"{gap_table(moments_gaps(records))}")


def plot(records: list[dict], path: Path) -> None:
    """Two panels per dataset: label-inference accuracy and feature-inference R^2, by input."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(records), 2, figsize=(12, 3.6 * len(records)), squeeze=False)
    for row, r in zip(axes, records, strict=True):
        _bars(row[0], r["label_inference"], [("majority", r["majority_class_accuracy"]),
                                             ("model", r["model_accuracy"])], "test accuracy %")
        _bars(row[1], r["feature_inference"], [], "mean test R^2 of x_q")
        row[0].set_title(f"{r['dataset']} (K = {r['parties']}): labels from what p receives")
        row[1].set_title(f"{r['dataset']}: party {OTHER}'s features from what p receives")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _bars(ax, groups: dict, references: list[tuple[str, float]], ylabel: str) -> None:
    """Grouped bars (auxiliary-row count x input) with error bars, and horizontal reference lines."""
    names, width = INPUTS, 0.8 / len(INPUTS)
    for i, name in enumerate(names):
        means = [groups[n][name]["mean"] for n in groups]
        stds = [groups[n][name]["std"] for n in groups]
        ax.bar(np.arange(len(groups)) + i * width, means, width, yerr=stds, label=name, capsize=3)
    for (label, value), (color, style) in zip(references, (("k", "--"), ("tab:purple", ":")), strict=False):
        ax.axhline(value, color=color, linestyle=style, linewidth=1.5, label=label)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, [f"{n} aux rows" for n in groups])
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(2)  # the machine's 2 cores are shared
    command = "python bench/disclosure.py " + " ".join(sys.argv[1:] if argv is None else argv)
    began = time.perf_counter()
    try:
        records = [run_dataset(d, args) for d in args.datasets]
    except FalseVflError as error:  # a missing data file, a preset that no longer validates
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "disclosure.json", {"command": command, "seed": args.seed, "draws": args.draws,
                                              "moments_gaps": moments_gaps(records),
                                              "wall_time_s": round(time.perf_counter() - began, 1),
                                              "torch_threads": torch.get_num_threads(), "results": records})
    atomic_write(args.out / "disclosure.md", markdown(records, command))
    plot(records, args.out / "disclosure.png")
    if args.readme:
        figure = relative_link(args.out / "disclosure.png", args.readme)
        update_readme(args.readme, args.out.name, markdown(records, command).split("\n\n", 1)[1]
                      + f"\n![disclosure]({figure})\n")
    print(table(records))
    print(gap_table(moments_gaps(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
