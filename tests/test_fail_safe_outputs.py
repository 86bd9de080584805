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


KILLED_COMMIT = """
import os, sys
from falsevfl_secure import fsio
calls, replace = [0], os.replace
def dying(a, b):
    calls[0] += 1
    if calls[0] == 3:  # the journal's rename, one file's, then the kill
        os._exit(9)
    replace(a, b)
os.replace = dying
fsio.commit(sys.argv[1])
"""


def test_a_commit_killed_between_two_files_is_finished_by_the_next_run_never_mixed(tmp_path):
    # Review finding: a kill while a retrain moved its folder into place file by file left the new manifest and
    # networks beside the previous run's trees and own rows, which predict then refitted from without a word.
    from falsevfl_secure.federation.launch import committed
    from falsevfl_secure.fsio import staged

    model, names = tmp_path / "model", ("manifest.json", "model.pt", "own_reference.npz", "trees.npz")
    for folder, text in ((model, "old"), (staged(model), "new")):
        folder.mkdir()
        for name in names:
            (folder / name).write_text(text)
    ended = subprocess.run([sys.executable, "-c", KILLED_COMMIT, str(model)], capture_output=True, text=True)
    assert ended.returncode == 9, ended.stderr
    assert {(model / n).read_text() for n in names} == {"old", "new"}  # killed half-way
    committed([model], lambda: None)  # the next run of this party (train or, through load_manifest, predict)
    assert {n: (model / n).read_text() for n in names} == dict.fromkeys(names, "new")
    assert not staged(model).exists() and sorted(p.name for p in tmp_path.iterdir()) == [".model.lock", "model"]


def test_a_second_run_of_one_party_at_once_is_refused_and_the_first_commits_whole(tmp_path):
    # Review finding: both runs staged into one folder, and the second's start deleted the first's files.
    import threading

    from falsevfl_secure.errors import InputError
    from falsevfl_secure.federation.launch import committed
    from falsevfl_secure.fsio import staged

    model, started, finish = tmp_path / "model", threading.Event(), threading.Event()

    def first() -> None:
        staged(model).mkdir()
        (staged(model) / "manifest.json").write_text("first")
        started.set()
        finish.wait(30)

    runner = threading.Thread(target=committed, args=([model], first))
    runner.start()
    assert started.wait(30)
    with pytest.raises(InputError, match="another run of this party is using .*model"):
        committed([model], lambda: None)
    finish.set()
    runner.join(30)
    assert (model / "manifest.json").read_text() == "first"


@pytest.mark.parametrize("damage", ["truncated", "a key missing", "not a zip", "another shape"])
def test_a_damaged_file_of_the_active_partys_rows_is_one_error_line(tmp_path, damage):
    # Review finding: a truncated trees.npz ended predict in BadZipFile, one without a key in KeyError, a foreign
    # own_reference.npz in numpy's ValueError: tracebacks where one line should say which file and what to do.
    import numpy as np

    from falsevfl_secure import reference
    from falsevfl_secure.errors import InputError
    from falsevfl_secure.model.trees import SAVED, TreesHead

    rows = {"features": np.zeros((4, 2)), "y": np.zeros(4), "weight": np.float64(0.5), "x": np.zeros((4, 2)),
            "observed": np.ones((4, 2)), "held": np.ones(4)}
    if damage == "another shape":
        rows.update(features=np.zeros(4), weight=np.zeros(2), x=np.zeros(4))
    for name in (SAVED, reference.SAVED):
        path = tmp_path / name
        np.savez(path, **{k: v for k, v in rows.items() if damage != "a key missing" or k not in ("y", "x")})
        if damage == "truncated":
            path.write_bytes(path.read_bytes()[:200])
        elif damage == "not a zip":
            path.write_bytes(b"id,label\n1,0\n")
    with pytest.raises(InputError, match=f"{SAVED}: not the trees' rows a training of this program wrote"):
        TreesHead.load(tmp_path, "classification", 2, 0, ())
    with pytest.raises(InputError, match=f"{reference.SAVED}: not the active party's own rows a training"):
        reference.refit_scores(tmp_path, None, "classification", 2, 0)


def test_a_checkpoint_holding_no_mapping_is_one_error_line(tmp_path):
    # Review finding: weights_only allows a list, and --resume then ended in "'list' object has no attribute 'get'".
    import torch

    from falsevfl_secure.checkpoint import Checkpointer
    from falsevfl_secure.config import Stage
    from falsevfl_secure.errors import InputError

    saver = Checkpointer(tmp_path, 1)
    torch.save([1, 2, 3], saver.path((Stage(1), 3)))
    with pytest.raises(InputError, match=r"not a checkpoint of this program \(a list, not its mapping\)"):
        saver.load((Stage(1), 3))


def test_a_prediction_holds_its_models_so_no_training_commits_them_meanwhile(tmp_path):
    # Review finding: predict read a party's manifest and networks first and its trees after the rounds, so a training
    # of the same party committing meanwhile paired new trees with old networks. A prediction holds a shared lock.
    import threading

    from falsevfl_secure.errors import InputError
    from falsevfl_secure.federation.launch import committed

    model, started, finish = tmp_path / "model", threading.Event(), threading.Event()
    model.mkdir()
    reader = threading.Thread(target=committed, args=([], lambda: (started.set(), finish.wait(30)), [model]))
    reader.start()
    assert started.wait(30)
    with pytest.raises(InputError, match="another run of this party is using .*model"):
        committed([model], lambda: None)  # a training of that party
    committed([tmp_path / "p.csv"], lambda: None, [model])  # another prediction may read it too
    finish.set()
    reader.join(30)


def test_a_planted_fifo_or_link_at_the_lock_is_one_error_line_not_a_hang(tmp_path):
    # Review finding: opening a FIFO planted at the lock's name for writing waited for a reader forever.
    from falsevfl_secure.errors import InputError
    from falsevfl_secure.federation.launch import committed

    os.mkfifo(tmp_path / ".p.csv.lock")
    with pytest.raises(InputError, match="lock file cannot be opened"):
        committed([tmp_path / "p.csv"], lambda: None)
    (tmp_path / ".q.csv.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InputError, match="lock file cannot be opened"):
        committed([tmp_path / "q.csv"], lambda: None)
    assert not (tmp_path / "elsewhere").exists()
