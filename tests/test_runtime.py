"""The distributed runtime always reaps its processes: after a run, after a party dies, after Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from falsevfl_secure.config import StageConfig
from falsevfl_secure.errors import PartyFailure
from falsevfl_secure.methods import make_config
from falsevfl_secure.runtime.distributed import run_distributed


def world_pids(out: Path, timeout: float = 60) -> dict[str, int]:
    """The process ids of a world's roles (it writes OUT/world.pids as soon as they have started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads((out / "world.pids").read_text())
        except (OSError, ValueError):
            time.sleep(0.1)
    raise AssertionError(f"no world started within {timeout} s")


def alive(pids) -> list[int]:
    """The pids among `pids` of processes that still run (a zombie counts as gone)."""
    running = []
    for pid in pids:
        try:
            state = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if "zombie" not in state:
            running.append(pid)
    return running


def tiny_config(epochs: int = 1):
    cfg = make_config("digits", "quick", parties=2)
    return replace(cfg, pretrain=StageConfig(2e-3, 128, epochs), train=StageConfig(2e-3, 64, epochs))


def test_a_finished_run_leaves_no_process(tmp_path):
    result = run_distributed(tiny_config(), "plain", ("mcar:0",), progress=False, out_dir=tmp_path,
                             allow_two_party_disclosure=True)
    assert 0.0 <= result.accuracy["mcar:0"] <= 100.0
    assert {r["party"] for r in result.communication} == {0, 1}
    assert alive(world_pids(tmp_path).values()) == []


def wait_for_training(checkpoints: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not list(checkpoints.glob("party*-stage1-*.pt")):
        time.sleep(0.05)


def test_a_killed_party_ends_the_run_with_an_error_naming_it(tmp_path):
    def kill_party_one():
        pid = world_pids(tmp_path)["party1"]
        wait_for_training(tmp_path / "ckpt")
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_party_one, daemon=True)
    killer.start()
    start = time.monotonic()
    with pytest.raises(PartyFailure, match=r"party1 died \(signal 9\) in round '[a-z_]+'"):
        run_distributed(tiny_config(epochs=200), "plain", ("mcar:0",), progress=False, out_dir=tmp_path,
                        checkpoint_dir=tmp_path / "ckpt", allow_two_party_disclosure=True)
    assert time.monotonic() - start < 90
    killer.join(timeout=5)
    assert alive(world_pids(tmp_path).values()) == []


def test_ctrl_c_stops_every_process(tmp_path, terminal_ctrl_c):
    cmd = [sys.executable, "-m", "falsevfl_secure.simulate", "--protocol", "plain", "--runtime", "distributed",
           "--parties", "2", "--pretrain-epochs", "200", "--quiet", "--out", str(tmp_path)]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pids = world_pids(tmp_path)
        wait_for_training(tmp_path / "checkpoints")
        launcher.send_signal(signal.SIGINT)
        try:
            _, err = launcher.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            launcher.kill()
            _, err = launcher.communicate()
            logs = {p.name: p.read_text()[-400:] for p in tmp_path.glob("logs/*.log")}
            pytest.fail(f"the launcher was still running 30 s after Ctrl-C; stderr: {err.decode()[-1500:]}; "
                        f"worker logs: {logs}")
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, err.decode()
    last = err.decode().splitlines()[-1]  # on a line of its own, saying how to go on
    assert last.startswith("interrupted: ") and "--resume" in last, err.decode()[-500:]
    assert alive(pids.values()) == []


def test_a_stalled_party_ends_the_run_within_the_timeout_naming_it(tmp_path):
    def stop_party_one():
        pid = world_pids(tmp_path)["party1"]
        wait_for_training(tmp_path / "ckpt")
        os.kill(pid, signal.SIGSTOP)
        return time.monotonic()

    stopped_at = []
    thread = threading.Thread(target=lambda: stopped_at.append(stop_party_one()), daemon=True)
    thread.start()
    with pytest.raises(PartyFailure, match=r"party1 stalled .* in round '[a-z_]+'"):
        run_distributed(tiny_config(epochs=200), "plain", ("mcar:0",), progress=False, out_dir=tmp_path,
                        checkpoint_dir=tmp_path / "ckpt", allow_two_party_disclosure=True)
    elapsed = time.monotonic() - stopped_at[0]
    print(f"the stall ended the run {elapsed:.1f} s after party1 stopped")
    assert elapsed < 30
    assert alive(world_pids(tmp_path).values()) == []


def test_a_party_that_fails_is_named_with_its_own_message_not_a_peers_timeout(tmp_path):
    """Party 1 alone cannot load its checkpoint on resume (its file is corrupt); the others go on and then
    lose it. The launcher reports party 1's own error, not the peers' failures that followed."""
    cfg = tiny_config(epochs=2)
    run_distributed(cfg, "plain", ("mcar:0",), progress=False, out_dir=tmp_path / "first",
                    checkpoint_dir=tmp_path / "ckpt", allow_two_party_disclosure=True)
    for path in (tmp_path / "ckpt").glob("party1-*.pt"):
        path.write_bytes(b"not a checkpoint")
    start = time.monotonic()
    with pytest.raises(PartyFailure, match=r"party1 failed .*: .*not a checkpoint of this program"):
        run_distributed(cfg, "plain", ("mcar:0",), progress=False, out_dir=tmp_path / "again",
                        checkpoint_dir=tmp_path / "ckpt", resume=True, allow_two_party_disclosure=True)
    assert time.monotonic() - start < 60
    assert alive(world_pids(tmp_path / "again").values()) == []


def test_a_slow_world_pinned_to_one_core_completes(tmp_path):
    """Alive but slow is not dead: every role of an he run (three parties and the aggregator) on one core."""
    import shutil

    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed")
    cmd = ["taskset", "-c", "0", sys.executable, "-m", "falsevfl_secure.simulate", "--protocol", "he",
           "--dataset", "digits", "--parties", "4", "--preset", "quick", "--pretrain-epochs", "2",
           "--train-epochs", "2", "--quiet", "--out", str(tmp_path)]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "result.json").is_file()
    print(f"he, 4 parties + aggregator on one core: {time.monotonic() - start:.0f} s")


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_a_run_keeps_freed_blocks_for_the_next_tensors():
    """A step's activations are a few MB each, made and freed every step; with glibc's own thresholds the heap's
    top went back to the kernel and the next step's tensors came back as fresh pages, a fault per page. In a fresh
    process (transparent huge pages off, so a page is the kernel's base page): rounds of six 4 MB tensors under
    glibc's static defaults (128 KB) fault every page, after `heap.keep_freed_memory` (which every run calls where
    it builds its node) almost none; `give_back_freed_memory` then returns them (the next round faults again)."""
    code = ("import ctypes, resource, torch\nfrom falsevfl_secure import heap\n"
            "libc = ctypes.CDLL('libc.so.6'); libc.prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE\n"
            "def faults():\n"
            "    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "    for _ in range(10):\n"
            "        tensors = [torch.ones(1 << 20) for _ in range(6)]\n"
            "        del tensors\n"
            "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start\n"
            "libc.mallopt(heap.M_MMAP_THRESHOLD, 128 << 10); libc.mallopt(heap.M_TRIM_THRESHOLD, 128 << 10)\n"
            "faults(); before = faults(); heap.keep_freed_memory(); faults(); after = faults()\n"
            "heap.give_back_freed_memory(); start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "tensors = [torch.ones(1 << 20) for _ in range(6)]\n"
            "print(before, after, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start, resource.getpagesize())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, after, returned, page = map(int, out.stdout.split())
    pages = 10 * 6 * (4 << 20) // page  # every tensor's every page
    assert before >= 0.9 * pages and after < 100 and returned >= 0.9 * pages // 10, (before, after, returned)


def test_a_bar_written_to_a_file_redraws_at_its_interval_with_the_epochs_done(tmp_path, monkeypatch):
    # A trial: with stderr in a file the bar was redrawn every epoch (its loss's refresh) while its count, which
    # moves at the 30 s interval only, read 0/70 for the first 18 s. Now the loss waits for the interval's redraw.
    from falsevfl_secure.runtime.local import run_local

    with open(tmp_path / "stderr", "w") as log:
        monkeypatch.setattr(sys, "stderr", log)
        run_local(replace(tiny_config(epochs=6), max_rows=200), ("mcar:0",), progress=True)
    draws = [d for d in (tmp_path / "stderr").read_text().replace("\r", "\n").splitlines() if " stage " in d]
    stale, done = [d for d in draws if " 0/6 " in d], [d for d in draws if " 6/6 " in d]
    assert len(stale) == 2 and len(done) == 2 and len(draws) == 4, draws  # per stage: its start, then its end
