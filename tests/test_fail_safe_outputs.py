"""Fail-safe outputs: a failed `predict` or `train` leaves the previous predictions and models byte for byte,
and a listed party that does not come is an error at `predict` unless it is declared absent."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from align_channels import free_port
from federation_cli import cli
from test_runtime import alive, world_pids

PARTIES = ("clinic", "lab", "insurer")  # the wine demo's; clinic is active
SHORT = "seed = 0\n[model.pretrain]\nepochs = 1\n[model.train]\nepochs = 2\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Three parties on the wine tables, trained (plain, a few epochs) and predicted once."""
    folder = tmp_path_factory.mktemp("fail-safe")
    assert cli("demo", "--dataset", "wine", "--parties", "3", "--protocol", "plain", "--preset", "quick",
               "--out", str(folder))[0] == 0
    config = folder / "federation.toml"
    config.write_text(config.read_text().replace("seed = 0\n", SHORT))
    code, _, err = cli("train", "--config", str(config), "--quiet")
    assert code == 0, err
    code, _, err = cli("predict", "--config", str(config), "--quiet", "--out", str(folder / "pred.csv"))
    assert code == 0, err
    return folder


def copy(trained: Path, tmp_path: Path, settings: str = "", model: str = SHORT) -> Path:
    """A copy of the trained federation on a free rendezvous port, with extra [federation] settings."""
    folder = tmp_path / "copy"
    shutil.copytree(trained, folder, ignore=shutil.ignore_patterns("checkpoints", "logs"))
    config = folder / "federation.toml"
    text = config.read_text().replace("127.0.0.1:29611", f"127.0.0.1:{free_port()}").replace(SHORT, model)
    config.write_text(text.replace("[model]\n", f"{settings}[model]\n"))
    return config


def outputs(folder: Path) -> dict[str, bytes]:
    """Every file a run leaves for its users: the predictions and each party's saved model files."""
    files = {"pred.csv": (folder / "pred.csv").read_bytes()}
    for name in PARTIES:
        files.update({f"{name}/{p.name}": p.read_bytes() for p in (folder / name / "model").iterdir() if p.is_file()})
    return files


def mistype_pin(config: Path, party: str) -> None:
    """One character of `party`'s pinned key changed (inside the key, not in base64's padding bits)."""
    text = config.read_text()
    at = text.index(f'name = "{party}"')
    start = text.index('key = "ed25519:', at) + len('key = "ed25519:') + 10
    swapped = "B" if text[start] != "B" else "C"
    config.write_text(text[:start] + swapped + text[start + 1:])


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_a_predict_with_a_mistyped_pin_fails_and_leaves_the_previous_predictions_and_models(trained, tmp_path):
    config = copy(trained, tmp_path, "join_timeout_s = 3\n")
    mistype_pin(config, "lab")
    before = outputs(config.parent)
    code, _, err = cli("predict", "--config", str(config), "--quiet", "--out", str(config.parent / "pred.csv"))
    assert code != 0 and len(error_lines(err)) == 1 and "lab" in error_lines(err)[0], err
    assert outputs(config.parent) == before


def test_a_predict_without_a_listed_party_is_an_error_unless_it_is_declared_absent(trained, tmp_path):
    """One host per party: only the active party comes. Without consent it stops, naming the others;
    with `--absent` it predicts from its own columns."""
    config = copy(trained, tmp_path, "join_timeout_s = 2\n")
    out = config.parent / "pred.csv"
    before = outputs(config.parent)
    code, _, err = cli("predict", "--config", str(config), "--party", "clinic", "--quiet", "--out", str(out))
    assert code == 2 and "Traceback" not in err, err
    assert len(error_lines(err)) == 1 and "lab, insurer did not join" in err and "--absent lab insurer" in err, err
    assert outputs(config.parent) == before
    code, _, err = cli("predict", "--config", str(config), "--party", "clinic", "--absent", "lab", "insurer",
                       "--quiet", "--out", str(out))
    assert code == 0, err
    assert out.read_bytes() != before["pred.csv"] and b",clinic," in out.read_bytes()


def test_a_retrain_that_never_completes_leaves_the_previous_models(trained, tmp_path):
    """Every party finishes its program, but the launcher is killed before it sees them all end well
    (frozen first, so it cannot finish): the previous models and train_result.json stay as they were."""
    config = copy(trained, tmp_path, model="seed = 0\n[model.pretrain]\nepochs = 60\n[model.train]\nepochs = 2\n")
    before = outputs(config.parent)
    launcher = subprocess.Popen([sys.executable, "-m", "falsevfl_secure.federation", "train", "--config", str(config),
                                 "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        roles = list(world_pids(config.parent / "logs" / "train").values())
        checkpoints = config.parent / "clinic" / "model" / "checkpoints"
        deadline = time.monotonic() + 60
        while not list(checkpoints.glob("*.pt")) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(launcher.pid, signal.SIGSTOP)  # training has begun: the address book is out
        while alive(roles) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(roles), "the parties did not finish training within 60 s"
    finally:
        launcher.kill()
        launcher.wait()
    assert outputs(config.parent) == before
