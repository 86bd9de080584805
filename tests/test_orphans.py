"""No orphans: every process a launcher starts (fork server, resource tracker, every role) ends within
10 s of the launcher's death, even a SIGKILL that gives it no chance to stop them."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_runtime import alive, wait_for_training, world_pids

from falsevfl_secure.federation.__main__ import main

GRACE_S = 10.0
HERE = Path(__file__).resolve().parent


def children_of() -> dict[int, list[int]]:
    """Every running process's children, read from /proc (ppid is the 4th field of /proc/PID/stat)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, found, todo = children_of(), [], [pid]
    while todo:
        kids = tree.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def killed_leaves_nothing(launcher: subprocess.Popen, roles: list[int]) -> None:
    """SIGKILL the launcher; every descendant it had (roles included) must end within GRACE_S."""
    family = set(descendants(launcher.pid)) | set(roles)
    assert set(roles) <= family, f"the roles {roles} are not descendants of the launcher {launcher.pid}"
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    killed_at = time.monotonic()
    while alive(family) and time.monotonic() - killed_at < GRACE_S:
        time.sleep(0.1)
    left = alive(family)
    print(f"{len(family)} processes, {len(left)} left {time.monotonic() - killed_at:.2f} s after the SIGKILL")
    for pid in left:  # never leave them running past the test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} of {len(family)} processes outlived their launcher by {GRACE_S:.0f} s: " + \
        "; ".join(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:90].decode() for p in left
                  if Path(f"/proc/{p}").exists())


def launch(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=HERE.parent)


def test_a_killed_simulate_leaves_no_process(tmp_path):
    launcher = launch([sys.executable, "-m", "falsevfl_secure.simulate", "--protocol", "plain", "--runtime",
                       "distributed", "--parties", "2", "--pretrain-epochs", "200", "--quiet", "--out", str(tmp_path)])
    try:
        roles = list(world_pids(tmp_path).values())
        wait_for_training(tmp_path / "checkpoints")
        killed_leaves_nothing(launcher, roles)
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_a_killed_federation_train_launched_locally_leaves_no_process(tmp_path):
    folder = tmp_path / "fed"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["demo", "--dataset", "wine", "--parties", "3", "--protocol", "plain", "--preset", "quick",
                     "--out", str(folder)]) == 0
    config = folder / "federation.toml"
    config.write_text(config.read_text().replace("seed = 0\n", "seed = 0\n[model.pretrain]\nepochs = 500\n"))
    launcher = launch([sys.executable, "-m", "falsevfl_secure.federation", "train", "--config", str(config), "--quiet"])
    try:
        roles = list(world_pids(folder / "logs" / "train").values())
        wait_for_training(folder / "clinic" / "model" / "checkpoints")
        killed_leaves_nothing(launcher, roles)
    finally:
        if launcher.poll() is None:
            launcher.kill()
