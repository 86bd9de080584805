"""Per-party atomic checkpoints: a run killed and resumed ends with exactly the parameters of an
uninterrupted run with the same seed, in the local and the distributed runtime."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from falsevfl_secure.checkpoint import Checkpointer
from falsevfl_secure.config import Stage, StageConfig
from falsevfl_secure.methods import make_config
from falsevfl_secure.randomness import RoleSecret
from falsevfl_secure.runtime.distributed import run_distributed
from falsevfl_secure.runtime.local import run_local

PATTERNS = ("mcar:0",)
# Both runs of a comparison use the same per-party secrets (a real run draws fresh ones).
SECRETS = {k: RoleSecret.for_tests(11, k) for k in range(2)}


def small_config(parties: int = 2):
    cfg = make_config("digits", "quick", parties=parties)
    return replace(cfg, pretrain=StageConfig(2e-3, 256, 3), train=StageConfig(2e-3, 64, 3))


def final_states(directory: Path, parties: int) -> list[dict]:
    return [Checkpointer(directory, k).load((Stage.TRAIN, 2)) for k in range(parties)]


def assert_same_states(a: list[dict], b: list[dict]) -> None:
    for sa, sb in zip(a, b, strict=True):
        for key in ("party_module", "active_module"):
            assert (key in sa) == (key in sb)
            for name, tensor in sa.get(key, {}).items():
                assert torch.equal(tensor, sb[key][name]), (key, name)


class Interrupt(Exception):
    pass


def interrupted(cfg, directory: Path, kill_at: tuple[int, int]) -> None:
    """A local run of `cfg` with its checkpoints in `directory`, killed after epoch `kill_at` (stage, epoch)."""
    def killer(stage, epoch, optimizers):
        if (int(stage), epoch) == kill_at:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_local(cfg, PATTERNS, progress=False, checkpoint_dir=directory, after_epoch=killer, secrets=SECRETS)


@pytest.mark.parametrize("kill_at", [(1, 0), (1, 1), (2, 0)])
def test_local_resume_equals_an_uninterrupted_run(tmp_path, kill_at):
    cfg = small_config()
    reference = run_local(cfg, PATTERNS, progress=False, checkpoint_dir=tmp_path / "a", secrets=SECRETS)

    def killer(stage, epoch, optimizers):
        if (int(stage), epoch) == kill_at:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_local(cfg, PATTERNS, progress=False, checkpoint_dir=tmp_path / "b", after_epoch=killer, secrets=SECRETS)
    resumed = run_local(cfg, PATTERNS, progress=False, checkpoint_dir=tmp_path / "b", resume=True)
    assert_same_states(final_states(tmp_path / "a", 2), final_states(tmp_path / "b", 2))
    assert resumed.accuracy == reference.accuracy


def test_each_party_stores_only_its_own_state_atomically(tmp_path):
    run_local(small_config(), PATTERNS, progress=False, checkpoint_dir=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert not [f for f in files if f.endswith(".tmp")]
    assert files == ["party0-stage2-epoch00001.pt", "party0-stage2-epoch00002.pt",
                     "party1-stage2-epoch00001.pt", "party1-stage2-epoch00002.pt"]  # the last two epochs
    passive, active = (Checkpointer(tmp_path, k).load((Stage.TRAIN, 2)) for k in (0, 1))
    assert "active_module" not in passive and set(passive["optimizers"]) <= {"party0"}
    assert "active_module" in active and "discriminator" in active["optimizers"]
    assert not torch.equal(passive["secret"], active["secret"])  # each file holds its own party's secret only


def test_distributed_run_interrupted_by_ctrl_c_resumes_to_the_same_parameters(tmp_path, terminal_ctrl_c):
    cfg = replace(small_config(), pretrain=StageConfig(2e-3, 256, 40))  # long enough to interrupt
    run_distributed(cfg, "plain", PATTERNS, progress=False, out_dir=tmp_path / "ref",
                    checkpoint_dir=tmp_path / "a", secrets=SECRETS)
    out = tmp_path / "run"
    # Interrupt a real distributed run (a child process we can SIGINT) after stage-1 epoch 1.
    script = (
        "import sys; from pathlib import Path; from dataclasses import replace;"
        "from falsevfl_secure.config import StageConfig; from falsevfl_secure.methods import make_config;"
        "from falsevfl_secure.runtime.distributed import run_distributed;"
        "from falsevfl_secure.randomness import RoleSecret;"
        "cfg = replace(make_config('digits', 'quick', parties=2), pretrain=StageConfig(2e-3, 256, 40),"
        " train=StageConfig(2e-3, 64, 3));"
        f"run_distributed(cfg, 'plain', ('mcar:0',), progress=False, out_dir=Path({str(out)!r}),"
        f" checkpoint_dir=Path({str(tmp_path / 'b')!r}), secrets={{k: RoleSecret.for_tests(11, k) for k in range(2)}})"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not list((tmp_path / "b").glob("party1-stage1-epoch00001.pt")):
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    child.communicate(timeout=30)
    kept = sorted(p.name for p in (tmp_path / "b").glob("*.pt"))
    assert kept, "the last complete checkpoint must survive Ctrl-C"
    assert not (tmp_path / "b" / "party1-stage2-epoch00002.pt").exists(), "the run ended before the interrupt"
    run_distributed(cfg, "plain", PATTERNS, progress=False, out_dir=tmp_path / "resumed",
                    checkpoint_dir=tmp_path / "b", resume=True)
    assert_same_states(final_states(tmp_path / "a", 2), final_states(tmp_path / "b", 2))


def test_a_checkpoint_whose_networks_have_other_shapes_is_refused_with_one_line(tmp_path):
    """A checkpoint of another build (an older decoder format: other output widths) under the same settings:
    resuming from it is an InputError naming the party and the module, not torch's size-mismatch traceback."""
    from falsevfl_secure.errors import InputError

    cfg = small_config()
    interrupted(cfg, tmp_path, (1, 0))
    store = Checkpointer(tmp_path, 0)
    progress = (Stage.PRETRAIN, 0)  # the last stage-1 epoch it completed
    state = store.load(progress)
    name = next(k for k in state["party_module"] if k.startswith("decoder") and k.endswith("weight"))
    state["party_module"][name] = state["party_module"][name][:-1]  # one output fewer
    store.save(progress, state)
    with pytest.raises(InputError, match="party 0: its checkpoint's party_module does not fit"):
        run_local(cfg, PATTERNS, progress=False, checkpoint_dir=tmp_path, resume=True)


def test_a_resume_from_checkpoints_of_another_configuration_is_refused_naming_what_differs(tmp_path):
    """Review finding: only `simulate` compared the checkpoints' configuration before resuming; a federation's
    --resume and --rejoin restored any checkpoint whose networks fit (another learning rate, seed or schedule).
    Every restore now compares it, naming the settings that differ; a checkpoint without its secret is refused."""
    from falsevfl_secure.errors import InputError

    cfg = small_config()
    interrupted(cfg, tmp_path, (1, 0))
    other = replace(cfg, pretrain=replace(cfg.pretrain, lr=1e-3))
    with pytest.raises(InputError, match="another configuration: .*lr"):
        run_local(other, PATTERNS, progress=False, checkpoint_dir=tmp_path, resume=True)
    store = Checkpointer(tmp_path, 1)
    state = store.load((Stage.PRETRAIN, 0))
    del state["secret"]
    store.save((Stage.PRETRAIN, 0), state)
    with pytest.raises(InputError, match=r"party 1: its checkpoint lacks \['secret'\]"):
        run_local(cfg, PATTERNS, progress=False, checkpoint_dir=tmp_path, resume=True)


@pytest.mark.parametrize("kill_at", [(2, 0), (2, 1)])
def test_a_cached_stage_two_resumes_from_stage_one_to_the_same_parameters(tmp_path, kill_at):
    """Review finding: with stage2_pass = "once" the passive parties run through stage 2's epochs at once and kept
    only its last two, so an active party killed mid stage 2 left no epoch every party held; and the cache's
    pass would have drawn other samples from the streams of a later epoch. Its last stage-1 checkpoint is kept,
    and a resume in stage 2 starts stage 2 again from it: the same samples, the same parameters."""
    cfg = make_config("digits", "quick", parties=2, stage2_pass="once")
    cfg = replace(cfg, pretrain=StageConfig(2e-3, 256, 3), train=StageConfig(2e-3, 64, 3))
    run_local(cfg, PATTERNS, progress=False, checkpoint_dir=tmp_path / "a", secrets=SECRETS)
    interrupted(cfg, tmp_path / "b", kill_at)
    assert (Stage.PRETRAIN, 2) in Checkpointer(tmp_path / "b", 0).available()
    run_local(cfg, PATTERNS, progress=False, checkpoint_dir=tmp_path / "b", resume=True)
    assert_same_states(final_states(tmp_path / "a", 2), final_states(tmp_path / "b", 2))


# Checkpoint files as a GPU host writes them: every storage tagged "cuda:0" (in its own process: the tag stays).
AS_ON_A_GPU = """
import sys, torch
torch.serialization.register_package(0, lambda storage: "cuda:0", lambda storage, location: None)
for path in sys.argv[1:]:
    torch.save(torch.load(path, weights_only=True), path)
"""


def test_checkpoints_written_on_a_gpu_resume_on_a_host_without_one(tmp_path):
    """A run killed on a GPU host resumes where there is none (`[model] device` is each party's own): torch reads
    CUDA storages only where CUDA is, unless the reader maps them to the host; the resumed run ends where an
    uninterrupted one does."""
    cfg = small_config()
    run_local(cfg, PATTERNS, progress=False, checkpoint_dir=tmp_path / "a", secrets=SECRETS)
    interrupted(cfg, tmp_path / "b", (1, 1))
    files = sorted(str(p) for p in (tmp_path / "b").glob("*.pt"))
    done = subprocess.run([sys.executable, "-c", AS_ON_A_GPU, *files], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and files, done.stderr
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(files[0], weights_only=True)  # the files are what a GPU host writes
    run_local(cfg, PATTERNS, progress=False, checkpoint_dir=tmp_path / "b", resume=True)
    assert_same_states(final_states(tmp_path / "a", 2), final_states(tmp_path / "b", 2))


def test_a_resumed_he_run_tells_the_aggregator_its_answer_and_goes_on(tmp_path):
    """he, four parties: every party sends the aggregator the digest of its resume answer before its first round
    (`resume-ack`), which the aggregator compares before any sum; an honest resumed run goes on through it (the
    stage-2 epoch whose checkpoints are removed runs again) and ends with a result."""
    cfg = replace(make_config("digits", "quick", parties=4), pretrain=StageConfig(2e-3, 256, 2),
                  train=StageConfig(2e-3, 64, 2))
    run_distributed(cfg, "he", PATTERNS, progress=False, out_dir=tmp_path / "first", checkpoint_dir=tmp_path / "c")
    for path in (tmp_path / "c").glob("*-stage2-epoch00001.pt"):
        path.unlink()
    result = run_distributed(cfg, "he", PATTERNS, progress=False, out_dir=tmp_path / "again",
                             checkpoint_dir=tmp_path / "c", resume=True)
    assert 0.0 <= result.accuracy["mcar:0"] <= 100.0
    assert sorted(p.name for p in (tmp_path / "c").glob("party0-stage2-*.pt")) == [
        "party0-stage2-epoch00000.pt", "party0-stage2-epoch00001.pt"]  # the epoch ran again and was saved
