"""The benchmarks' reports: the README's results sections are generated from the JSON files, so the
generation itself must be right (means and stds over seeds, the paper row, marker handling)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import accuracy  # noqa: E402
from readme_section import update_readme  # noqa: E402

from falsevfl_secure.data import TEST_PATTERNS  # noqa: E402


def cells(seeds: dict[int, float]) -> list[dict]:
    return [{"dataset": "isolet", "train": "mcar:0.2", "variant": "I", "seed": seed, "parties": 8, "preset": "paper",
             "overrides": {}, "test": test, "accuracy": value + i, "wall_time_s": 100.0 + seed,
             "stage_time_s": {"pretrain": 80.0, "train": 15.0, "evaluate": 5.0 + seed}, "device": "cpu", "threads": 2}
            for seed, value in seeds.items() for i, test in enumerate(TEST_PATTERNS)]


def test_the_accuracy_report_is_the_mean_and_std_over_seeds_next_to_the_paper(tmp_path):
    out = tmp_path / "isolet"
    out.mkdir()
    (out / "accuracy.json").write_text(json.dumps(cells({0: 80.0, 1: 84.0})))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:isolet:start -->\nstale\n<!-- results:isolet:end -->\nend\n")
    assert accuracy.main(["--report-only", "--out", str(out), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "stale" not in text and text.startswith("intro\n") and text.endswith("end\n")
    row = next(line for line in text.splitlines() if line.startswith("| FALSE-VFL-I, trained mcar:0.2, K=8"))
    assert row.split(" | ")[1] == "82.0 ± 2.0"  # MCAR0: seeds 80 and 84
    assert "| 2 | 100 | 80 / 15 / 6 |" in row  # n, mean wall time, mean stage times
    paper = accuracy.PAPER[("isolet", "mcar:0.2", "false-vfl-i")]
    diff = next(line for line in text.splitlines() if line.startswith("| ours − paper"))
    assert diff.split(" | ")[1] == f"{82.0 - paper['mcar:0']:+.1f}"
    assert (out / "accuracy.png").stat().st_size > 0 and (out / "accuracy.md").read_text() in text


def test_the_ranking_counts_the_patterns_where_false_vfl_is_above_every_baseline(tmp_path):
    """LASER-VFL above FALSE-VFL-I on the first three patterns only: FALSE-VFL first on the other four. The
    paper's Isolet rows (read by hand): FALSE-VFL-I above all four baselines on all seven."""
    runs = []
    for method in ("false-vfl-i", "vanilla", "laser", "plugvfl", "fedhssl"):
        for cell in cells({0: 0.0}):
            i = TEST_PATTERNS.index(cell["test"])
            value = {"false-vfl-i": 50.0, "laser": 60.0 if i < 3 else 40.0}.get(method, 30.0)
            runs.append({**cell, "method": method, "accuracy": value})
    out = tmp_path / "isolet"
    out.mkdir()
    (out / "accuracy.json").write_text(json.dumps(runs))
    assert accuracy.main(["--report-only", "--out", str(out)]) == 0
    assert "on **4 of 7** test patterns; in the paper's rows on 7 of 7." in (out / "accuracy.md").read_text()
    (out / "accuracy.json").write_text(json.dumps([c for c in runs if c["method"] != "fedhssl"]))
    assert accuracy.main(["--report-only", "--out", str(out)]) == 0
    assert "above every baseline" not in (out / "accuracy.md").read_text()  # not every baseline was run


def test_a_readme_without_the_section_is_refused(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    with pytest.raises(SystemExit, match="no <!-- results:x:start -->"):
        update_readme(readme, "x", "table")


def test_federation_equivalence_resumes_its_own_settings_and_refuses_others(tmp_path, capsys):
    import federation_equivalence as fe

    argv = ["--dataset", "digits", "--parties", "4", "--seeds", "0", "--preset", "quick", "--out", str(tmp_path)]
    cells = [{"seed": 0, "simulate": {"accuracy": 88.0, "seconds": 1.0},
              "federation": {"accuracy": 87.5, "seconds": 2.0, "scored": 10, "protocol": "mpc"}}]
    settings = {"dataset": "digits", "parties": 4, "preset": "quick", "protocol": "mpc", "test_pattern": "mcar:0.2"}
    (tmp_path / "equivalence.json").write_text(json.dumps({"settings": settings, "cells": cells}))
    assert fe.main(argv) == 0  # both sides stored: nothing is re-run
    assert "| 0 | 88.00 | 87.50 | -0.50 |" in (tmp_path / "equivalence.md").read_text()
    assert fe.main([*argv[:7], "default", "--out", str(tmp_path)]) != 0
    assert "preset 'quick' (asked: 'default')" in capsys.readouterr().err


def test_the_crypto_micro_benchmark_runs_in_one_process_and_writes_every_measurement(tmp_path, capsys):
    """--micro needs no process world; tiny sizes, so this checks the wiring, never a speed."""
    import crypto_costs

    out = tmp_path / "micro"
    argv = ["--micro", "--parties", "3", "--shape", "5000", "--repeats", "1", "--he-values", "8200",
            "--out", str(out)]
    assert crypto_costs.main(argv) == 0
    record = json.loads((out / "crypto_micro.json").read_text())
    costs = record["costs"]
    assert record["config"]["micro"] is True and "mpc: gather int64 payload" not in costs
    assert costs["keystream MB/s, KeyStream.read_into an int64 buffer"] > 0
    assert costs["zero share, 2 pairs x 5,000 int64 (zero_share, drawn now), ms"] > 0
    for piece in ("encrypt at once", "encrypt online on pooled zeros", "sum of 2", "decrypt"):
        assert costs[f"he: {piece}, ms per 1000 values"] > 0
    assert costs["he: bytes per value"] > 40  # two ~187 kB ciphertexts for 8,200 values
    rows = [line for line in (out / "crypto_micro.md").read_text().splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0][2:] for row in rows] == list(costs)  # one row per measurement, in order
    assert (out / "crypto_micro.md").read_text() in capsys.readouterr().out


def test_a_schedule_from_the_command_line_is_recorded_with_the_cell():
    # Otherwise a run with --pretrain-epochs 0 is labelled (and resumed) as the preset's schedule.
    args = accuracy.parse_args(["--methods", "laser", "--seeds", "0", "--pretrain-epochs", "0", "--set",
                                "standardize=zscore"])
    [(cfg, recorded)] = accuracy.planned_configs(args)
    assert cfg.pretrain.epochs == 0 and cfg.train.epochs > 0 and cfg.standardize == "zscore"
    assert recorded == {"standardize": "zscore", "pretrain_epochs": 0}


def test_every_piece_of_one_secure_sum_is_timed_across_party_processes():
    # Review finding: the bench's gather used a tag no round declares and its sum a set-up step bounded at 256 KiB,
    # so the network refused them both; the default shape is 5 MiB a party.
    import crypto_costs

    costs = crypto_costs.mpc_costs(3, (4, 128, 128), 1)
    assert len(costs) == 6 and all(ms > 0 for ms in costs.values()), costs


def test_every_piece_of_one_ckks_ciphertext_is_timed():
    # The README's crypto-costs table: each SEAL call the protocol makes, on real ciphertexts.
    import crypto_costs

    costs = crypto_costs.he_costs(1)
    assert len(costs) == 9 and all(ms > 0 for ms in costs.values()), costs


def test_the_local_speed_bench_times_every_mode(tmp_path):
    # the fused mode built its node without a transport and failed once build_node began to need one; the bench
    # had no test, so the README's table went stale. A tiny run of every mode, then the summary row.
    import local_speed

    out = tmp_path / "cpu-tiny"
    args = ["--parties", "2", "--width", "4", "--batch", "8", "--kappa", "2", "--party-hidden", "8",
            "--global-hidden", "8", "--repeats", "1", "--warmup", "0", "--out", str(out)]
    assert local_speed.main(args) == 0
    record = json.loads((out / "local_speed.json").read_text())
    assert [c["mode"] for c in record["cells"]] == ["sequential", "stacked", "fused"]
    assert all(c["step_ms_median"] > 0 for c in record["cells"])
    assert local_speed.summary_table(tmp_path).count("| cpu-tiny |") == 1


def test_the_price_of_security_reports_each_roles_cpu_per_step():
    # what says which role is the critical path (README "Real tables": the active party's CPU fills its step)
    import overhead

    steps = [{0: 0.010, 1: 0.020, 2: 0.040}, {0: 0.030, 1: 0.010, 2: 0.050}, {0: 0.012, 1: 0.011, 2: 0.042}]
    assert overhead.role_cpu_ms(steps, active=2) == {"active": 42.0, "busiest_passive": 20.0, "all_roles": 70.0}


def test_the_price_of_security_reports_where_each_role_waits_in_the_step():
    # medians per round of the active party and a passive party; a step that ran other rounds is left out
    import overhead

    def step(shift: float, names=("posterior", "latent")) -> dict:
        return {k: [[n, i * 10 + shift + k, i * 10 + shift + k + 1] for i, n in enumerate(names)] for k in (0, 1, 2)}

    steps = [step(0.0), step(2.0), step(1.0), step(50.0, ("posterior",))]
    timeline = overhead.role_timeline(steps, active=2)
    assert timeline == {"active": [["posterior", 3.0, 4.0], ["latent", 13.0, 14.0]],
                        "passive": [["posterior", 1.0, 2.0], ["latent", 11.0, 12.0]]}
    assert overhead.timeline_text(timeline).splitlines()[0].split() == ["active:", "posterior", "3.0-4.0", "latent",
                                                                         "13.0-14.0"]


def test_the_alignment_bench_gives_the_true_union_and_times_the_hop_checks(tmp_path):
    """bench/align_speed.py on a small world (real processes): the union is right (half of each list shared by
    all, the rest each party's own), every party placed every row, and the hop check round is timed."""
    import align_speed

    assert align_speed.main(["--parties", "4", "--ids", "120", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "align_speed.json").read_text())
    assert report["correct"] and report["n_union"] == 60 + 4 * 60
    assert all(p["positions_ok"] and p["phases"]["hop_checks"] > 0 for p in report["parties"])
    assert report["hop_checks_s"] > 0 and report["libsodium"]["weighted_us"] > 0
