"""One host per party, over real interfaces: three parties and the he aggregator, each in its own Linux network
namespace, the passive parties' hosts dropping every inbound connection (nftables), train and predict under
mpc and he (`--party NAME`, pinned identities made with `federation keygen`); with one pin wrong, every
party stops with one clear line."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from netns import available, hosts

from falsevfl_secure.data.synthetic import synthetic_split

PARTIES = ("bank", "insurer", "clinic")  # the clinic holds the labels
ROLES = (*PARTIES, "aggregator")


@pytest.fixture(autouse=True)
def _need_netns():
    ok, reason = available()
    if not ok:
        pytest.skip(reason)
    if shutil.which("nft") is None:
        pytest.skip("nftables (nft) is not installed")


def write_tables(folder: Path, which: str, n: int, seed: int) -> None:
    """Each party's own CSV: its rows (a random subset), string IDs, its own row order."""
    split = synthetic_split(n=n, parties=3, width=4, p_missing=0.3, seed=seed)
    rng = np.random.default_rng(seed)
    ids = [f"{which}-{i:05d}" for i in range(n)]
    for k, name in enumerate(PARTIES):
        rows = np.flatnonzero(~split.missing[:, k]) if k < 2 else np.arange(n)
        rows = rows[rng.permutation(rows.size)]
        header = ["id", *(f"{name}_{j}" for j in range(4)), *(["label"] if k == 2 else [])]
        lines = [header]
        for i in rows:
            features = [f"{v:.6g}" for v in split.blocks[k][i]] if not split.missing[i, k] else [""] * 4
            lines.append([ids[i], *features, *([str(split.y[i])] if k == 2 else [])])
        (folder / name).mkdir(parents=True, exist_ok=True)
        with open(folder / name / f"{which}.csv", "w", newline="") as handle:
            csv.writer(handle).writerows(lines)


def federation_file(folder: Path, machines, pins: dict[str, str] | None = None, name: str = "federation.toml") -> Path:
    host = dict(zip(ROLES, machines, strict=True))
    parties = "".join(f'\n[[party]]\nname = "{p}"\ntrain = "{p}/train.csv"\npredict = "{p}/predict.csv"\n'
                      f'model = "{p}/model"\n' + (f'key = "{pins[p]}"\n' if pins else "") for p in PARTIES)
    aggregator = f'\n[aggregator]\naddress = "{host["aggregator"].address}:29612"\n' + \
        (f'key = "{pins["aggregator"]}"\n' if pins else "")
    text = (f'[federation]\nactive = "clinic"\nprotocol = "mpc"\nid_column = "id"\nlabel_column = "label"\n'
            f'rendezvous = "{host["clinic"].address}:29611"\njoin_timeout_s = 20\n\n[model]\n'
            f'preset = "digits:quick"\nkappa = 4\n[model.pretrain]\nepochs = 3\nbatch_size = 64\n[model.train]\n'
            f'epochs = 10\n{parties}{aggregator}')
    (folder / name).write_text(text)
    return folder / name


def keygen(config: Path) -> dict[str, str]:
    """Every role's identity, made with the command each participant runs on its own host; the pins."""
    pins = {}
    for role in ROLES:
        done = subprocess.run([sys.executable, "-m", "falsevfl_secure.federation", "keygen", "--config", str(config),
                               "--party", role], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        pins[role] = re.search(r'^key = "(ed25519:[^"]+)"$', done.stdout, re.MULTILINE).group(1)
    return pins


def run_everywhere(machines, argv: list[str], configs: dict[str, Path], roles=ROLES, timeout: float = 300):
    """`python -m falsevfl_secure.federation ARGV --config FILE --party NAME` on every host at once; the
    (exit code, stderr) of every role."""
    host = dict(zip(ROLES, machines, strict=True))
    procs = {role: host[role].popen([sys.executable, "-m", "falsevfl_secure.federation", *argv, "--config",
                                     str(configs[role]), "--party", role, "--quiet"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for role in roles}
    return {role: (p.wait(timeout=timeout), p.communicate()[1]) for role, p in procs.items()}


def test_a_federation_with_one_namespace_per_role_and_outbound_only_passive_parties(tmp_path):
    write_tables(tmp_path, "train", 240, seed=1)
    write_tables(tmp_path, "predict", 80, seed=2)
    with hosts(4) as machines:
        for passive in machines[:2]:
            passive.block_inbound()  # bank and insurer accept no connection: they only dial out
        config = federation_file(tmp_path, machines)
        config = federation_file(tmp_path, machines, keygen(config))
        configs = dict.fromkeys(ROLES, config)
        for protocol in ("mpc", "he"):
            roles = ROLES if protocol == "he" else PARTIES
            for argv in (["train", "--protocol", protocol],
                         ["predict", "--protocol", protocol, "--out", str(tmp_path / f"{protocol}.csv")]):
                ended = run_everywhere(machines, argv, configs, roles)
                assert all(code == 0 for code, _ in ended.values()), {r: e[-1500:] for r, (_, e) in ended.items()}
            with open(tmp_path / f"{protocol}.csv", newline="") as handle:
                predictions = list(csv.DictReader(handle))
            assert len(predictions) == 80 and {r["parties_observed"] for r in predictions} <= {"1", "2", "3"}
            assert list(predictions[0])[:3] == ["id", "prediction", "parties_observed"]
    for name in PARTIES:
        assert (tmp_path / name / "model" / "manifest.json").is_file()


def test_a_wrong_pin_stops_every_party_with_one_clear_line(tmp_path, refused):
    """The bank's own file pins a wrong key for the clinic: the bank cannot finish the TLS handshake with
    the clinic, the clinic never hears from the bank, the insurer is told the run is refused."""
    write_tables(tmp_path, "train", 120, seed=3)
    with hosts(4) as machines:
        machines[0].block_inbound()
        config = federation_file(tmp_path, machines)
        pins = keygen(config)
        config = federation_file(tmp_path, machines, pins)
        wrong = federation_file(tmp_path, machines, {**pins, "clinic": pins["insurer"]}, "bank.toml")
        # The bank names why it could not connect by one last attempt at its deadline, so the clinic must
        # still be listening then: the bank gives up after 8 s, the others wait 20 (with equal timeouts the
        # clinic could leave first and the bank saw only "nothing answered")
        wrong.write_text(wrong.read_text().replace("join_timeout_s = 20", "join_timeout_s = 8"))
        ended = run_everywhere(machines, ["train"], {"bank": wrong, "insurer": config, "clinic": config},
                               PARTIES, timeout=120)
    for role, (code, err) in ended.items():
        lines = [line for line in err.splitlines() if line.strip()]
        assert code != 0 and len(lines) == 1 and lines[0].startswith("error:"), (role, err)
        refused("federation input")
    assert "TLS handshake failed" in ended["bank"][1] and "clinic" in ended["bank"][1]
    assert "bank did not join" in ended["clinic"][1]
    assert "refused the run" in ended["insurer"][1] and "bank did not join" in ended["insurer"][1]
