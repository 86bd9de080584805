"""One host per party, over real interfaces: three parties and the he aggregator, each in its own Linux network
namespace with its own federation.toml (its own paths only), the passive parties' hosts dropping every inbound
connection (nftables). The commands of docs/federation-examples.md ("One host per party") run as written, on
the host each line names (keygen, check, train and predict under he, the aggregator too); then train and
predict under mpc. With one pin wrong, every party stops with one clear line, the wrong one naming the pin."""

from __future__ import annotations

import csv
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from netns import available, hosts

from falsevfl_secure.data.synthetic import synthetic_split
from falsevfl_secure.secure import identity

PARTIES = ("clinic", "lab", "insurer")  # as in the docs; the clinic holds the labels
ROLES = (*PARTIES, "aggregator")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "federation-examples.md"
DOCUMENTED = re.compile(r"^(clinic|lab|insurer|aggregator)\$\s+python -m falsevfl_secure\.federation (.+)$")


@pytest.fixture(autouse=True)
def _need_netns():
    ok, reason = available()
    if not ok:
        pytest.skip(reason)
    if shutil.which("nft") is None:
        pytest.skip("nftables (nft) is not installed")


def write_tables(folder: Path, which: str, n: int, seed: int) -> None:
    """Each party's own CSV in its host's folder: its rows (a random subset), string IDs, its own row order."""
    split = synthetic_split(n=n, parties=3, width=4, p_missing=0.3, seed=seed)
    rng = np.random.default_rng(seed)
    ids = [f"{which}-{i:05d}" for i in range(n)]
    for k, name in enumerate(PARTIES):
        rows = np.flatnonzero(~split.missing[:, k]) if k else np.arange(n)
        rows = rows[rng.permutation(rows.size)]
        header = ["patient_id", *(f"{name}_{j}" for j in range(4)), *(["outcome"] if k == 0 else [])]
        lines = [header]
        for i in rows:
            features = [f"{v:.6g}" for v in split.blocks[k][i]] if not split.missing[i, k] else [""] * 4
            lines.append([ids[i], *features, *([str(split.y[i])] if k == 0 else [])])
        (folder / name).mkdir(parents=True, exist_ok=True)
        with open(folder / name / f"{which}.csv", "w", newline="") as handle:
            csv.writer(handle).writerows(lines)


def host_file(folder: Path, role: str, machines, pins: dict[str, str] | None = None, edit=lambda t: t) -> Path:
    """`role`'s own federation.toml in its host's folder: every participant's name and pin, its own paths."""
    host = dict(zip(ROLES, machines, strict=True))
    parties = "".join(f'\n[[party]]\nname = "{p}"\n' + (f'key = "{pins[p]}"\n' if pins else "")
                      + ('train = "train.csv"\npredict = "predict.csv"\nmodel = "model"\n' if p == role else "")
                      for p in PARTIES)
    aggregator = f'\n[aggregator]\naddress = "{host["aggregator"].address}:29612"\n' + \
        (f'key = "{pins["aggregator"]}"\n' if pins else "")
    text = (f'[federation]\nactive = "clinic"\nprotocol = "mpc"\nid_column = "patient_id"\nlabel_column = "outcome"\n'
            f'rendezvous = "{host["clinic"].address}:29611"\njoin_timeout_s = 20\n\n[model]\n'
            f'preset = "digits:quick"\nkappa = 4\n[model.pretrain]\nepochs = 3\nbatch_size = 64\n[model.train]\n'
            f'epochs = 10\n{parties}{aggregator}')
    (folder / role).mkdir(parents=True, exist_ok=True)
    (folder / role / "federation.toml").write_text(edit(text))
    return folder / role / "federation.toml"


def documented() -> dict[str, list[tuple[str, list[str]]]]:
    """The commands of the docs' one-host-per-party section (its code blocks of commands only, not the
    examples of output), by subcommand in order: (host, argv)."""
    section = DOCS.read_text().split("## One host per party", 1)[1]
    steps: dict[str, list[tuple[str, list[str]]]] = {}
    for block in section.split("```")[1::2]:
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        matches = [DOCUMENTED.match(line) for line in lines]
        if not lines or not all(matches):
            continue
        for match in matches:
            argv = shlex.split(match.group(2))
            steps.setdefault(argv[0], []).append((match.group(1), argv))
    return steps


def run_on_hosts(machines, folder: Path, commands: list[tuple[str, list[str]]], timeout: float = 300):
    """`python -m falsevfl_secure.federation ARGV` on each named host at once, in that host's folder; the
    (exit code, stdout, stderr) of every role."""
    host = dict(zip(ROLES, machines, strict=True))
    procs = {role: host[role].popen([sys.executable, "-m", "falsevfl_secure.federation", *argv], cwd=folder / role,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for role, argv in commands}
    return {role: (p.wait(timeout=timeout), *p.communicate()) for role, p in procs.items()}


def test_every_host_runs_the_documented_commands_then_mpc(tmp_path):
    steps = documented()
    assert list(steps) == ["keygen", "check", "train", "predict"], steps
    assert all(sorted(role for role, _ in commands) == sorted(ROLES) for commands in steps.values()), steps
    write_tables(tmp_path, "train", 240, seed=1)
    write_tables(tmp_path, "predict", 80, seed=2)
    with hosts(4) as machines:
        for passive in machines[1:3]:
            passive.block_inbound()  # lab and insurer accept no connection: they only dial out
        for role in ROLES:
            host_file(tmp_path, role, machines)
        made = run_on_hosts(machines, tmp_path, steps["keygen"], timeout=60)
        assert all(code == 0 for code, _, _ in made.values()), made
        pins = {role: re.search(r'^key = "(ed25519:[^"]+)"$', out, re.MULTILINE).group(1)
                for role, (_, out, _) in made.items()}
        for role in ROLES:  # every host pins the lines the others' keygens printed
            host_file(tmp_path, role, machines, pins)
        for step in ("check", "train", "predict"):
            ended = run_on_hosts(machines, tmp_path, steps[step])
            assert all(code == 0 for code, _, _ in ended.values()), {r: e[-1500:] for r, (_, _, e) in ended.items()}
        assert_predictions(tmp_path / "clinic" / "predictions.csv")
        for argv in (["train", "--protocol", "mpc"], ["predict", "--protocol", "mpc"]):
            commands = [(p, [*argv, "--config", "federation.toml", "--party", p, "--quiet"]
                         + (["--out", "mpc.csv"] if p == "clinic" and argv[0] == "predict" else [])) for p in PARTIES]
            ended = run_on_hosts(machines, tmp_path, commands)
            assert all(code == 0 for code, _, _ in ended.values()), {r: e[-1500:] for r, (_, _, e) in ended.items()}
        assert_predictions(tmp_path / "clinic" / "mpc.csv")
    for name in PARTIES:
        assert (tmp_path / name / "model" / "manifest.json").is_file()


def assert_predictions(path: Path) -> None:
    with open(path, newline="") as handle:
        predictions = list(csv.DictReader(handle))
    assert len(predictions) == 80 and {r["parties_observed"] for r in predictions} <= {"1", "2", "3"}
    assert list(predictions[0])[:3] == ["id", "prediction", "parties_observed"]


def test_a_wrong_pin_stops_every_party_with_one_clear_line(tmp_path, refused):
    """The lab's own file pins a wrong key for the clinic (a key, but not the clinic's): the lab cannot finish
    the TLS handshake with the clinic and names the pin, the clinic never hears from the lab, the insurer is
    told the run is refused."""
    write_tables(tmp_path, "train", 120, seed=3)
    wrong = identity.pin_text(identity.public_bytes(identity.generate()))
    with hosts(4) as machines:
        machines[1].block_inbound()
        for role in ROLES:
            host_file(tmp_path, role, machines)
        made = run_on_hosts(machines, tmp_path, [(r, ["keygen", "--config", "federation.toml", "--party", r])
                                                 for r in PARTIES], timeout=60)
        pins = {role: re.search(r'key = "(ed25519:[^"]+)"', out).group(1) for role, (_, out, _) in made.items()}
        pins["aggregator"] = identity.pin_text(identity.public_bytes(identity.generate()))
        for role in ("clinic", "insurer"):
            host_file(tmp_path, role, machines, pins)
        # The lab names why it could not connect by one last attempt at its deadline, so the clinic must
        # still be listening then: the lab gives up after 8 s, the others wait 20 (with equal timeouts the
        # clinic could leave first and the lab saw only "nothing answered")
        host_file(tmp_path, "lab", machines, {**pins, "clinic": wrong},
                  lambda text: text.replace("join_timeout_s = 20", "join_timeout_s = 8"))
        ended = run_on_hosts(machines, tmp_path, [(p, ["train", "--config", "federation.toml", "--party", p, "--quiet"])
                                                  for p in PARTIES], timeout=120)
    for role, (code, _, err) in ended.items():
        lines = [line for line in err.splitlines() if line.strip()]
        assert code != 0 and len(lines) == 1 and lines[0].startswith("error:"), (role, err)
        refused("federation input")
    assert "TLS handshake failed" in ended["lab"][2] and f'pins clinic as key = "{wrong}"' in ended["lab"][2]
    assert "lab did not join" in ended["clinic"][2]
    assert "refused the run" in ended["insurer"][2] and "lab did not join" in ended["insurer"][2]
