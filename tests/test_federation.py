"""A federation on separately held tables, end to end: the demo's per-party files, private alignment,
training under a secure protocol, each party's saved part, prediction with every party and with one
absent, and one clear error for each kind of bad input."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from federation_cli import cli

from falsevfl_secure import privacy
from falsevfl_secure.config import PrivacyConfig
from falsevfl_secure.data.private_encoding import RELEASES

EPOCHS = "[model.pretrain]\nepochs = 3\n[model.train]\nepochs = 30\n"


def short(path: Path, protocol: str | None = None) -> None:
    """Few epochs (the schedule is not what these tests check)."""
    text = path.read_text().replace("seed = 0\n", "seed = 0\n" + EPOCHS)
    if protocol:
        text = text.replace('protocol = "mpc"', f'protocol = "{protocol}"')
    path.write_text(text)


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The digits demo with four parties, trained under mpc (once for the module)."""
    folder = tmp_path_factory.mktemp("federation")
    assert cli("demo", "--dataset", "digits", "--parties", "4", "--out", str(folder))[0] == 0
    short(folder / "federation.toml")
    code, out, err = cli("train", "--config", str(folder / "federation.toml"), "--quiet")
    assert code == 0, err
    assert "records aligned" in out
    return folder


def test_demo_tables_are_separately_held_and_the_truth_covers_the_prediction_set(trained):
    ids = {name: [r["id"] for r in rows(trained / name / "train.csv")] for name in ("party0", "party3")}
    assert len(set(ids["party0"]) & set(ids["party3"])) < len(ids["party0"])  # partly overlapping ID sets
    assert ids["party0"] != sorted(ids["party0"])  # each party's own row order
    assert "label" in rows(trained / "party3" / "train.csv")[0]
    assert "label" not in rows(trained / "party0" / "train.csv")[0]
    truth = {r["id"] for r in rows(trained / "truth.csv")}
    assert truth == {r["id"] for r in rows(trained / "party3" / "predict.csv")}  # the active party lists them all
    assert not truth & set(ids["party3"])  # a separate prediction set


def test_each_party_saves_only_its_own_part_with_a_manifest(trained):
    record = json.loads((trained / "party3" / "model" / "train_result.json").read_text())
    tables = {name: rows(trained / name / "train.csv") for name in ("party0", "party1", "party2", "party3")}
    held = {r["id"] for table in tables.values() for r in table if r[next(c for c in r if c.endswith("_x0"))]}
    assert record["alignment"]["union_size"] == len({r["id"] for table in tables.values() for r in table})
    assert record["alignment"]["records"] == len(held) and record["protocol"] == "mpc"
    # 400 labeled rows: the digits default of data.split.DEFAULT_LABELED
    assert record["alignment"]["labeled"] == 400
    assert set(record["alignment"]["rows_per_party"]) == {"party0", "party1", "party2", "party3"}
    assert record["losses"]["pretrain"] and {r["round"] for r in record["communication"]} >= {"posterior", "latent"}
    import torch

    for name in ("party0", "party3"):
        manifest = json.loads((trained / name / "model" / "manifest.json").read_text())
        assert manifest["party"] == name and manifest["protocol"] == "mpc"
        encoding = manifest["encoding"]
        assert encoding["columns"][0].startswith(f"p{name[-1]}_x") and len(encoding["standardizer"]["mean"]) == 16
        path = trained / name / "model" / "model.pt"
        state = torch.load(path, weights_only=True)
        assert ("active_module" in state) == (name == "party3")
        assert state["secret"].numel() == 32 and path.stat().st_mode & 0o077 == 0  # the secret: owner-only
    assert not (trained / "party0" / "model" / "train_result.json").exists()


def test_prediction_with_every_party_and_with_one_absent(trained):
    config = str(trained / "federation.toml")
    for absent, out in (((), "all.csv"), (("party1",), "without-party1.csv")):
        code, said, err = cli("predict", "--config", config, "--out", str(trained / out), "--quiet",
                              *(["--absent", *absent] if absent else []))
        assert code == 0, err
        peaks = re.search(r"^peak RSS per party \(resident memory, shared pages included\): (.*)$", said, re.M)
        assert peaks, said  # each present party's own process's peak, as training says it (a trial missed it)
        assert [n for n, mib in re.findall(r"(party\d) ([\d,]+) MiB", peaks[1]) if int(mib.replace(",", "")) > 50] \
            == [p for p in ("party0", "party1", "party2", "party3") if p not in absent], said
        predictions = rows(trained / out)
        assert list(predictions[0])[:3] == ["id", "prediction", "parties_observed"]
        assert [c for c in predictions[0] if c.startswith("p_")] == [f"p_{d}" for d in range(10)]
        assert {r["id"] for r in predictions} == {r["id"] for r in rows(trained / "truth.csv")}
        observed = [int(r["parties_observed"]) for r in predictions]
        assert max(observed) == 4 - len(absent) and min(observed) >= 0
        # as written, each row's probabilities sum to 1 within 1e-9 (six decimals of float32 values made scikit-learn's
        # log loss warn that they do not: a trial)
        sums = [sum(float(r[f"p_{d}"]) for d in range(10)) for r in predictions if r["prediction"]]
        assert sums and max(abs(total - 1.0) for total in sums) < 1e-9, max(abs(total - 1.0) for total in sums)
    code, out, _ = cli("score", "--predictions", str(trained / "all.csv"), "--truth", str(trained / "truth.csv"))
    assert code == 0 and float(out.split()[1]) > 20.0  # better than chance (10 %) after a few epochs


def test_two_predictions_of_one_saved_model_agree(trained):
    """Each record's prediction noise comes from the party's saved secret and the record's key, so a
    second run gives the same labels and probabilities (fresh per-run secrets moved a probability by up
    to 0.33 and flipped labels before; what remains is float rounding, which can move a value by one
    2^-16 step of the secure sum's fixed point and so the 6th decimal)."""
    config = str(trained / "federation.toml")
    for out in ("again-1.csv", "again-2.csv"):
        code, _, err = cli("predict", "--config", config, "--out", str(trained / out), "--quiet")
        assert code == 0, err
    first, second = rows(trained / "again-1.csv"), rows(trained / "again-2.csv")
    assert [r["prediction"] for r in first] == [r["prediction"] for r in second] and len(first) > 100
    columns = [c for c in first[0] if c.startswith("p_")]
    gap = max(abs(float(a[c] or 0) - float(b[c] or 0)) for a, b in zip(first, second, strict=True) for c in columns)
    assert gap <= 1e-4


# Each party's saved model written as a GPU host writes it: every storage tagged "cuda:0" (a tag torch gives a
# CUDA tensor's storage), its manifest naming the new file's digest. In its own process: the tag stays registered.
AS_ON_A_GPU = """
import hashlib, io, json, sys, torch
from pathlib import Path
torch.serialization.register_package(0, lambda storage: "cuda:0", lambda storage, location: None)
for folder in map(Path, sys.argv[1:]):
    buffer = io.BytesIO()
    torch.save(torch.load(folder / "model.pt", weights_only=True), buffer)
    (folder / "model.pt").write_bytes(buffer.getvalue())
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["weights_sha256"] = hashlib.sha256(buffer.getvalue()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
"""


def test_a_model_trained_on_a_gpu_predicts_on_a_host_without_one(trained, tmp_path):
    """`[model] device` is each party's own choice, not agreed: a party trains on its GPU and predicts where it
    has none. Its model.pt then names CUDA storages, which torch refuses to read without a CUDA device unless
    the reader maps them to the host (found on a lent H200: the federation had only been run on CPUs)."""
    import subprocess
    import sys

    import torch

    _broken(trained, tmp_path, "party0", "predict.csv", lambda text: text)  # a copy, models included
    folders = [str(tmp_path / "copy" / f"party{k}" / "model") for k in range(4)]
    done = subprocess.run([sys.executable, "-c", AS_ON_A_GPU, *folders], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    probe = "import torch; torch.load(sys.argv[1], weights_only=True)"
    refused = subprocess.run([sys.executable, "-c", "import sys; " + probe, folders[0] + "/model.pt"],
                             capture_output=True, text=True, timeout=120)
    assert torch.cuda.is_available() or "CUDA" in refused.stderr  # the file is one a GPU host writes
    for folder, out in ((trained, "before.csv"), (tmp_path / "copy", "after.csv")):
        code, _, err = cli("predict", "--config", str(folder / "federation.toml"), "--out", str(tmp_path / out),
                           "--quiet")
        assert code == 0, err
    assert [r["prediction"] for r in rows(tmp_path / "before.csv")] == \
        [r["prediction"] for r in rows(tmp_path / "after.csv")]


def _broken(trained: Path, tmp_path: Path, party: str, which: str, edit) -> Path:
    """A copy of the federation (models included) whose `party` file `which` is edited; None removes it."""
    import shutil

    shutil.copytree(trained, tmp_path / "copy", ignore=shutil.ignore_patterns("checkpoints", "logs"))
    path = tmp_path / "copy" / party / which
    if edit is None:
        path.unlink()
    else:
        path.write_text(edit(path.read_text()))
    return tmp_path / "copy" / "federation.toml"


def cell(line: int, column: int, value: str):
    """An edit that sets one cell (line 1 is the header)."""
    def edit(text: str) -> str:
        lines = text.splitlines()
        cells = lines[line - 1].split(",")
        cells[column] = value
        lines[line - 1] = ",".join(cells)
        return "\n".join(lines) + "\n"
    return edit


def repeat_first_row(text: str) -> str:
    return text + text.splitlines()[1] + "\n"


def with_labels(*values: str):
    """An edit that adds a label column to a prediction table (labels there are for scoring only)."""
    def edit(text: str) -> str:
        lines = text.splitlines()
        labels = [values[i % len(values)] for i in range(len(lines) - 1)]
        body = [f"{row},{v}" for row, v in zip(lines[1:], labels, strict=True)]
        return "\n".join([lines[0] + ",label", *body]) + "\n"
    return edit


BAD_TABLES = {
    "missing ID column": ("party1", "train.csv", cell(1, 0, "key"), "no ID column 'id'"),
    "duplicate IDs": ("party1", "train.csv", repeat_first_row, "appears twice"),
    "non-numeric feature": ("party1", "train.csv", cell(2, 3, "abc"), "line 2, column 'p1_x2'"),
    "non-finite feature": ("party2", "train.csv", cell(3, 1, "inf"), "line 3, column 'p2_x0'"),
    "missing file": ("party0", "train.csv", None, "train.csv"),
}


@pytest.mark.parametrize("case", list(BAD_TABLES))
def test_bad_training_tables_get_one_error_naming_party_file_and_place(trained, tmp_path, case, refused):
    party, which, edit, message = BAD_TABLES[case]
    config = _broken(trained, tmp_path, party, which, edit)
    code, _, err = cli("train", "--config", str(config), "--party", party, "--quiet")
    assert code == 2 and err.startswith("error:") and "Traceback" not in err, err
    assert f"party '{party}'" in err and message in err, err
    refused("federation input")


def test_launched_locally_a_bad_table_is_named_by_the_launcher(trained, tmp_path, refused):
    config = _broken(trained, tmp_path, "party1", "train.csv", cell(2, 3, "abc"))
    code, _, err = cli("train", "--config", str(config), "--quiet")
    assert code != 0 and err.startswith("error:") and "Traceback" not in err, err
    assert "party1" in err and "line 2, column 'p1_x2'" in err, err
    refused("federation input")


def test_prediction_input_is_checked_against_the_saved_model(trained, tmp_path, refused):
    config = _broken(trained, tmp_path, "party2", "predict.csv", cell(1, 4, "p2_renamed"))
    code, _, err = cli("predict", "--config", str(config), "--party", "party2", "--out", str(tmp_path / "p.csv"))
    assert code == 2 and "p2_renamed" in err and "p2_x3" in err and "Traceback" not in err, err
    refused("federation input")
    config = _broken(trained, tmp_path / "b", "party3", "predict.csv", with_labels("7", "seven"))
    code, _, err = cli("predict", "--config", str(config), "--party", "party3", "--out", str(tmp_path / "p.csv"))
    assert code == 2 and "never saw" in err and "seven" in err, err
    refused("federation input")
    for argv, message in ((["--party", "nobody"], "nobody"), (["--absent", "party3"], "active party"),
                          (["--absent", "ghost"], "ghost"),
                          (["--absent", "party0", "party1"], "allow_two_party_disclosure = true in [federation]")):
        code, _, err = cli("predict", "--config", str(trained / "federation.toml"), "--out", str(tmp_path / "p.csv"),
                           *argv)
        assert code == 2 and message in err and "Traceback" not in err, err
        refused("federation input")


def test_a_federation_file_with_mistakes_is_refused_naming_the_setting(tmp_path, refused):
    good = tmp_path / "good"
    cli("demo", "--dataset", "digits", "--parties", "2", "--out", str(good))
    text = (good / "federation.toml").read_text()
    for edit, message in ((lambda t: t.replace('active = "party1"', 'active = "bank"'), "bank"),
                          (lambda t: t.replace('protocol = "mpc"', 'protocol = "tls"'), "tls"),
                          (lambda t: t.replace('"127.0.0.1:29611"', '"nowhere"'), "HOST:PORT"),
                          (lambda t: t.replace("seed = 0", "seed = 0\nwidth = 3"), "width"),
                          (lambda t: t.replace("[model]", 'allow_two_party_disclosure = "no"\n[model]'),
                           "allow_two_party_disclosure"),
                          (lambda t: t.replace("[model]", "join_timeout_s = 0\n[model]"), "join_timeout_s"),
                          (lambda t: t + "[extra]\n", "extra")):
        (good / "federation.toml").write_text(edit(text))
        code, _, err = cli("train", "--config", str(good / "federation.toml"))
        assert code == 2 and message in err and "Traceback" not in err, err
        refused("federation input")


def _copy(trained: Path, tmp_path: Path, settings: str = "", epochs: str = "") -> Path:
    """A copy of the trained federation (models included) on a free port, with extra [federation] settings."""
    import shutil

    from align_channels import free_port

    folder = tmp_path / "copy"
    shutil.copytree(trained, folder, ignore=shutil.ignore_patterns("checkpoints", "logs"))
    text = (folder / "federation.toml").read_text().replace("127.0.0.1:29611", f"127.0.0.1:{free_port()}")
    text = text.replace("127.0.0.1:29612", f"127.0.0.1:{free_port()}")
    text = text.replace("[model]\n", f"{settings}[model]\n").replace(EPOCHS, epochs or EPOCHS)
    (folder / "federation.toml").write_text(text)
    return folder / "federation.toml"


def test_one_host_per_party_a_party_declared_absent_is_not_waited_for(trained, tmp_path):
    """party1 is away and every present party says so (`--absent party1`); only the active party writes
    the predictions, so only it passes --out."""
    import subprocess
    import sys

    config = _copy(trained, tmp_path, "join_timeout_s = 60\n")
    out = {"party3": ["--out", str(tmp_path / "p.csv")]}
    procs = {name: subprocess.Popen([sys.executable, "-m", "falsevfl_secure.federation", "predict", "--config",
                                     str(config), "--party", name, "--quiet", "--absent", "party1",
                                     *out.get(name, [])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("party3", "party0", "party2")}  # party1 never comes
    outputs = {name: proc.communicate(timeout=240) for name, proc in procs.items()}
    assert all(proc.returncode == 0 for proc in procs.values()), {k: v[1] for k, v in outputs.items()}
    # each host says what its run left there (a new user saw nothing at the active party)
    assert outputs["party3"][0].splitlines()[-1].startswith(f"predictions: {tmp_path / 'p.csv'} (")
    # how long the run took, and its process's peak memory
    assert re.search(r"\) in \d+\.\d s \(peak RSS [\d,]+ MiB\)$", outputs["party3"][0].splitlines()[-1])
    assert " for party0, party2 (join_timeout_s" in outputs["party3"][0].splitlines()[0]  # not for the absent
    assert re.fullmatch(r"party0: prediction done \(peak RSS [\d,]+ MiB\); the active party party3 writes the "
                        "predictions, nothing here", outputs["party0"][0].splitlines()[-1])
    predictions = rows(tmp_path / "p.csv")
    assert {r["id"] for r in predictions} == {r["id"] for r in rows(trained / "truth.csv")}
    assert max(int(r["parties_observed"]) for r in predictions) == 3


def test_one_host_per_party_training_needs_every_listed_party(trained, tmp_path, refused):
    config = _copy(trained, tmp_path, "join_timeout_s = 2\n")
    code, out, err = cli("train", "--config", str(config), "--party", "party3", "--quiet")
    assert code == 2 and "Traceback" not in err, err
    assert "party0, party1, party2 did not join within 2 s" in err and "training needs every listed party" in err
    # what it waited for, said before it waited (a new user's passive party waited a minute in silence)
    first = out.splitlines()[0]
    assert first.startswith("party3: listening at 127.0.0.1:") and first.endswith(
        " for party0, party1, party2 (join_timeout_s = 2 s)"), err
    refused("federation input")


def test_training_and_prediction_under_he_with_the_aggregator_as_its_own_process(trained, tmp_path):
    """`--protocol he` overrides the file's mpc: the aggregator runs as a fifth process, and the record
    and every manifest name the protocol that actually ran."""
    config = _copy(trained, tmp_path, epochs="[model.pretrain]\nepochs = 1\n[model.train]\nepochs = 2\n")
    code, out, err = cli("train", "--config", str(config), "--protocol", "he", "--quiet")
    assert code == 0 and "under he" in out, err
    # the copied folders held the fixture's models: the summary says they were replaced (a trial did not expect it)
    assert "(replacing the models saved there before: party0, party1, party2, party3)" in out, out
    assert re.search(r"schedule: stage 1 \d+ epochs of batch \d+ \(\d+\.\d s\), stage 2 \d+ epochs of batch \d+ "
                     r"\(\d+\.\d s\)", out), out  # the stages' times (a trial found them only in the JSON)
    peaks = re.search(r"peak RSS per party \(resident memory, shared pages included\): party0 ([\d,]+) MiB, "
                      r"party1 [\d,]+ MiB, party2 [\d,]+ MiB, party3 ([\d,]+) MiB", out)  # each party's own counters
    assert peaks and 100 < int(peaks.group(2).replace(",", "")) < 8000, out
    assert _listed_line(config) in out.splitlines(), out  # counted here from the tables themselves
    model = config.parent / "party3" / "model"
    assert json.loads((model / "train_result.json").read_text())["protocol"] == "he"
    assert {json.loads((config.parent / f"party{k}" / "model" / "manifest.json").read_text())["protocol"]
            for k in range(4)} == {"he"}
    assert {r["round"] for r in json.loads((model / "train_result.json").read_text())["communication"]} >= {
        "posterior", "likelihood"}
    code, _, err = cli("predict", "--config", str(config), "--protocol", "he", "--quiet", "--out",
                       str(tmp_path / "he.csv"))
    assert code == 0, err
    predictions = rows(tmp_path / "he.csv")
    assert {r["id"] for r in predictions} == {r["id"] for r in rows(trained / "truth.csv")}
    for r in predictions[:50]:
        assert abs(sum(float(r[f"p_{d}"]) for d in range(10)) - 1.0) < 1e-4


def _listed_line(config: Path) -> str:
    """The summary's line of the records each party listed, from its CSV: the active party (party3) lists every row,
    another party its rows holding a cell (IDs compared stripped, as the demo's file says)."""
    listed = {}
    for k in range(4):
        table = rows(config.parent / f"party{k}" / "train.csv")
        cells = lambda r: [v for c, v in r.items() if c not in ("id", "label")]  # noqa: E731
        listed[f"party{k}"] = {r["id"].strip() for r in table if k == 3 or any(v.strip() for v in cells(r))}
    said = []
    for name, ids in listed.items():
        others = set().union(*(v for n, v in listed.items() if n != name))
        said.append(f"{name} {len(ids):,} ({len(ids - others):,} by no other party"
                    + ("" if name == "party3" else f"; {len(ids & listed['party3']):,} also by the active party") + ")")
    return "records listed by each party: " + ", ".join(said)


def test_a_privacy_budget_is_each_partys_own_spent_and_reported(trained, tmp_path, refused):
    """[privacy]: each party checks its own budget before any sum, writes what its rows spent to its own
    ledger; the active party's train_result.json has it; `federation privacy` reads a party's own ledger."""
    import tomllib

    config = _copy(trained, tmp_path, epochs="[model.pretrain]\nepochs = 1\n[model.train]\nepochs = 3\n")
    text = config.read_text()
    config.write_text(text + "\n[privacy]\nepsilon = 0.5\nnoise_multiplier = 10.0\n")
    code, _, err = cli("train", "--config", str(config), "--quiet")
    assert code != 0 and "would spend epsilon" in err and "more than its budget epsilon = 0.5" in err, err
    config.write_text(text + "\n[privacy]\nepsilon = 8.0\nnoise_multiplier = 10.0\n")
    code, out, err = cli("train", "--config", str(config), "--quiet")
    assert code == 0, err
    fed = tomllib.loads(config.read_text())
    for party in fed["party"]:
        ledger = json.loads((config.parent / party["model"] / "privacy.json").read_text())
        assert ledger["epsilon"] <= 8.0 and ledger["noise_multiplier"] == 10.0 and ledger["prediction_runs"] == 0
        # its encoding is charged before it is drawn, among the model's earlier releases: the refused run's too (at
        # its budget's multiplier: a kept encoding is reused at the same budget only)
        drawn = [[privacy.encoding_multiplier(PrivacyConfig(epsilon=e)), RELEASES] for e in (0.5, 8.0)]
        assert ledger["earlier"] == drawn, ledger
        manifest = json.loads((config.parent / party["model"] / "manifest.json").read_text())
        assert manifest["encoding"]["binary"] == [], "two-valued columns are read off the rows only in clear"
    active = next(p for p in fed["party"] if p["name"] == fed["federation"]["active"])
    result = json.loads((config.parent / active["model"] / "train_result.json").read_text())
    assert result["privacy"]["epsilon"] == ledger["epsilon"]
    code, out, _ = cli("privacy", "--config", str(config), "--party", "party0")
    assert code == 0 and "party0: epsilon = " in out and "0 prediction run(s)" in out
    code, out, err = cli("check", "--config", str(config), "--party", "party0")  # (a reviewer read "is released")
    assert code == 0 and "training reuses the encoding released for this table before" in out, out + err
    trained_ledger = _ledger(config.parent / "party0")
    code, _, err = cli("train", "--config", str(config), "--resume", "--quiet")  # refused before anyone charges
    assert code == 2 and "cannot resume" in err and _ledger(config.parent / "party0") == trained_ledger, err
    code, out, err = cli("predict", "--config", str(config), "--out", str(tmp_path / "p.csv"), "--quiet")
    assert code == 0, err
    after = json.loads((config.parent / active["model"] / "privacy.json").read_text())
    assert after["prediction_runs"] == 1
    # each party says what the prediction run spent (a reviewer found it only through `privacy`)
    mine = json.loads((config.parent / "party0" / "model" / "privacy.json").read_text())
    assert f"privacy: party0's rows at epsilon = {mine['epsilon']:.3g} per row of its budget 8 " in out, out
    assert (config.parent / "party0" / "model" / "privacy.json").stat().st_mode & 0o077 == 0  # owner-only
    _one_refused_prediction_charges_no_party(config, mine["epsilon"])
    # a budget lowered after the releases: `privacy` says so and exits 1 (a reviewer saw 3.25 "of its budget 3", 0)
    config.write_text(text + "\n[privacy]\nepsilon = 0.01\nnoise_multiplier = 10.0\n")
    code, out, _ = cli("privacy", "--config", str(config), "--party", "party3")
    assert code == 1 and "warning: party3's rows have spent more than the budget its file now sets" in out, out
    code, out, err = cli("check", "--config", str(config), "--party", "party3")  # (a privacy reviewer's trial: check
    assert code == 0 and "note: `predict` would be refused: party3:" in out, out + err  # said nothing of it)
    # a party whose ledger is on another host: one error line, not a traceback from reading a folder of None
    config.write_text(config.read_text().replace('model = "party0/model"\n', ""))
    code, _, err = cli("privacy", "--config", str(config), "--party", "party0")
    assert code == 2 and "Traceback" not in err and "party0" in err and "has no model" in err, err
    refused("privacy budget")


def test_an_active_party_that_announces_a_longer_schedule_is_refused_at_the_handshake(trained, tmp_path, attacked):
    """threat_models/dp.toml: the active party's own file says 80 stage-1 epochs where the passive parties'
    budgets were checked against 3. A weakened party that followed it would spend epsilon 9.7 of its 8 (its
    own accountant on the announced schedule); the shipped parties' hellos carry other model settings, and
    every party stops before any sum is sent, naming the differing setting and both values, its ledger untouched."""
    from falsevfl_secure.errors import InputError
    from falsevfl_secure.federation.config import load_federation

    config = _copy(trained, tmp_path)
    config.write_text(config.read_text() + "\n[privacy]\nepsilon = 8.0\nnoise_multiplier = 10.0\n")
    longer = config.with_name("active.toml")
    longer.write_text(config.read_text().replace("[model.pretrain]\nepochs = 3\n", "[model.pretrain]\nepochs = 80\n"))
    assert longer.read_text() != config.read_text()
    own, announced = load_federation(config).model, load_federation(longer).model
    privacy.check_budget(own, "party0")  # its own schedule fits its budget (epsilon 3.7)
    with pytest.raises(InputError, match="epsilon"):  # the weakened party: the announced one would not
        privacy.check_budget(announced, "party0")
    weak = privacy.spent(announced, "party0").epsilon
    ledgers = {name: _ledger(config.parent / name) for name in ("party0", "party1", "party2", "party3")}
    codes, errors = _each_party("train", config, {"party3": longer})
    attacked("a longer schedule announced (active, dp)", "weakened: a party follows it",
             f"epsilon {weak:.1f} of its budget 8")
    attacked("a longer schedule announced (active, dp)", "shipped", "refused at the handshake by every party")
    assert weak > 8
    assert all(code != 0 for code in codes.values()), errors
    named = {name for name, err in errors.items()  # the setting and both values, not a fingerprint
             if "differ in [model.pretrain] epochs (" in err and "party3: 80" in err
             and re.search(r"party[0-2]: 3\b", err) and "before any data is sent" in err}
    # a party another's stop reached before it compared the active party's hello (a loaded CI machine) reads that
    # stop: that party's own error at set-up, no field (an ABORT carries no other role's text)
    told = {name for name, err in errors.items()
            if "stopped with an error of its own (InputError" in err and "no round was running" in err}
    assert "party3" in named and named | told == set(errors), errors
    assert {name: _ledger(config.parent / name) for name in ledgers} == ledgers  # nothing charged
    before = {name: (trained / name / "model" / "model.pt").read_bytes() for name in ("party0", "party3")}
    assert all((config.parent / name / "model" / "model.pt").read_bytes() == saved for name, saved in before.items())


def test_one_partys_budget_refusal_stops_every_party_before_any_charges(trained, tmp_path):
    """Privacy review finding: party1's own budget (epsilon 0.5) refused the schedule after the others had charged
    theirs (epsilon 8): they were charged for a run that never happened and refused every retrain after. Now the
    parties agree on their verdicts first (one bit each): every party stops, naming party1, no schedule charged."""
    config = _copy(trained, tmp_path)
    config.write_text(config.read_text() + "\n[privacy]\nepsilon = 8.0\nnoise_multiplier = 10.0\n")
    low = config.with_name("party1.toml")
    low.write_text(config.read_text().replace("epsilon = 8.0", "epsilon = 0.5"))
    codes, errors = _each_party("train", config, {"party1": low})
    assert all(code == 2 for code in codes.values()), errors
    assert "party1: the schedule would spend epsilon" in errors["party1"], errors
    assert "no party charged this schedule to its ledger" in errors["party1"]
    for name in ("party0", "party2", "party3"):
        assert "party1: its own privacy budget or ledger refuses the schedule every party sized" in errors[name], errors
        ledger = json.loads((config.parent / name / "model" / "privacy.json").read_text())
        assert "releases_per_row" not in ledger and len(ledger["encodings"]) == 1, ledger  # its encoding only


def _one_refused_prediction_charges_no_party(config: Path, spent: float) -> None:
    """A trial's finding: a prediction run that party1's own budget refused had charged the others first (no
    verdicts were agreed for predictions). party1's file now sets its budget at what its rows have spent, so one
    more prediction run passes it: every party stops, naming party1, and no ledger moves."""
    low = config.with_name("party1.toml")
    low.write_text(config.read_text().replace("epsilon = 8.0", f"epsilon = {spent!r}"))
    ledgers = {name: _ledger(config.parent / name) for name in ("party0", "party1", "party2", "party3")}
    codes, errors = _each_party("predict", config, {"party1": low}, "--out", str(config.parent / "refused.csv"))
    assert all(code == 2 for code in codes.values()), errors
    assert "party1: one more prediction run would spend epsilon" in errors["party1"], errors
    assert "no party charged this prediction run to its ledger" in errors["party1"], errors
    for name in ("party0", "party2", "party3"):
        assert "party1: its own privacy budget or ledger refuses one more prediction run" in errors[name], errors
    assert {name: _ledger(config.parent / name) for name in ledgers} == ledgers
    assert not (config.parent / "refused.csv").exists()
    low.unlink()


def _each_party(command: str, config: Path, own: dict[str, Path], *extra: str) -> tuple[dict, dict]:
    """`command` run by each of the four parties in a process of its own (`--party`), from its own file (`own`,
    else `config`): each one's exit code and error output."""
    import subprocess
    import sys

    procs = {name: subprocess.Popen([sys.executable, "-m", "falsevfl_secure.federation", command, "--config",
                                     str(own.get(name, config)), "--party", name, "--quiet", *extra],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("party3", "party0", "party1", "party2")}
    errors = {name: proc.communicate(timeout=240)[1] for name, proc in procs.items()}
    return {name: proc.returncode for name, proc in procs.items()}, errors


def _ledger(party: Path) -> bytes | None:
    path = party / "model" / "privacy.json"
    return path.read_bytes() if path.exists() else None


def test_one_host_per_party_a_killed_party_rejoins_from_its_own_checkpoint(trained, tmp_path, refused):
    """`on_party_loss = "continue"`: party1's process is killed (SIGKILL) in stage 1 after its first checkpoint;
    the run goes on without it, `train --party party1 --rejoin` brings it back from its own checkpoint and saved
    alignment at the next epoch's start, and every party ends well, party1 with a model trained after its return."""
    import signal
    import subprocess
    import sys
    import time

    config = _copy(trained, tmp_path, 'on_party_loss = "continue"\nmin_parties = 3\n',
                   epochs="kappa = 2\n[model.pretrain]\nepochs = 40\n[model.train]\nepochs = 20\n")
    code, _, err = cli("train", "--config", str(config), "--party", "party1", "--rejoin", "--quiet")
    assert code == 2 and "has not trained in this run" in err, err  # nothing saved to come back from yet
    refused("federation input")
    code, _, err = cli("train", "--config", str(config), "--party", "party1", "--rejoin", "--resume", "--quiet")
    assert code == 2 and "--rejoin and --resume cannot go together" in err, err
    refused("federation input")

    def start(name: str, *extra: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "falsevfl_secure.federation", "train", "--config", str(config),
                                 "--party", name, "--quiet", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    procs = {name: start(name) for name in ("party3", "party0", "party1", "party2")}
    checkpoints = config.parent / "party1" / "model" / "checkpoints"
    deadline = time.monotonic() + 120
    while not list(checkpoints.glob("party*-stage1-epoch00002.pt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(checkpoints.glob("party*-stage1-epoch00002.pt")), "no stage-1 checkpoint within 120 s"
    procs["party1"].send_signal(signal.SIGKILL)
    procs["party1"].wait()
    procs["party1"] = start("party1", "--rejoin")
    outputs = {name: proc.communicate(timeout=300) for name, proc in procs.items()}
    errors = {name: err for name, (_, err) in outputs.items()}
    assert all(proc.returncode == 0 for proc in procs.values()), errors
    # each host says where its model is; the active party also what the run did
    folder = config.parent / "party2" / "model"
    assert re.fullmatch(rf"party2: trained; its model is in {re.escape(str(folder))} \(peak RSS [\d,]+ MiB\)",
                        outputs["party2"][0].splitlines()[-1]), outputs["party2"][0]  # its own peak, from its counters
    said = outputs["party3"][0].splitlines()  # as one host running every role says it (a trial: --party said less)
    assert said[-3].startswith("trained 4 parties under ") and re.search(r"\(peak RSS [\d,]+ MiB\)$", said[-3])
    assert re.fullmatch(r"schedule: stage 1 \d+ epochs of batch \d+ \(\d+\.\d s\), stage 2 .*", said[-2]), said
    assert said[-1].startswith("records listed by each party: party0 "), said
    record = json.loads((config.parent / "party3" / "model" / "train_result.json").read_text())
    events = [(e["party"], e["how"] == "rejoined") for e in record["lost_parties"]]
    assert events == [("party1", False), ("party1", True)], record["lost_parties"]
    back = record["lost_parties"][1]
    print(f"party1 lost at stage 1 epoch {record['lost_parties'][0]['epoch']}, back at stage {back['stage']} epoch "
          f"{back['epoch']} (of 40 + 20)")
    assert (back["stage"], back["epoch"]) > (1, 2) and "rejoined the run" in errors["party1"]
    latest = max(checkpoints.glob("party*-stage*-epoch*.pt"))
    assert latest.name.startswith("party1-stage2"), latest  # it trained on to the end after its return
    assert (config.parent / "party1" / "model" / "manifest.json").is_file()


def _training_parties(config: Path) -> dict:
    """`train --party NAME` of each of the demo's four parties, each its own process."""
    import subprocess
    import sys

    return {name: subprocess.Popen([sys.executable, "-m", "falsevfl_secure.federation", "train", "--config",
                                    str(config), "--party", name, "--quiet"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
            for name in ("party3", "party0", "party1", "party2")}


def _stage1_checkpoint(folder: Path, epoch: int) -> None:
    """Wait (at most 120 s) for a checkpoint of stage 1's epoch `epoch` in `folder`."""
    import time

    deadline, pattern = time.monotonic() + 120, f"party*-stage1-epoch{epoch:05d}.pt"
    while not list(folder.glob(pattern)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(folder.glob(pattern)), f"no {pattern} in {folder} within 120 s"


def test_a_party_lost_for_good_is_left_out_of_the_summary_and_named_when_predicting_with_it(trained, tmp_path):
    """Operations trial findings: after party1 left a run that went on (killed in stage 1, never back), the active
    party still said "trained 4 parties" and counted 4 holders per validation record; predicting with party1 blamed
    its model folder's run ("restore every party's model folder") where the cause is that it left: predict
    without it."""
    import signal

    config = _copy(trained, tmp_path, 'on_party_loss = "continue"\nmin_parties = 3\n')  # trained's model settings
    config.write_text(config.read_text().replace("validation_fraction = 0.0", "validation_fraction = 0.2"))
    procs = _training_parties(config)
    _stage1_checkpoint(config.parent / "party1" / "model" / "checkpoints", 1)
    killed = procs.pop("party1")
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    outputs = {name: proc.communicate(timeout=300) for name, proc in procs.items()}
    assert all(proc.returncode == 0 for proc in procs.values()), {n: e for n, (_, e) in outputs.items()}
    lines = outputs["party3"][0].splitlines()
    assert lines[-3].startswith("trained 3 parties (party1 lost) under "), lines  # then the schedule, the records
    record = json.loads((config.parent / "party3" / "model" / "train_result.json").read_text())
    assert max(map(int, record["validation"]["by_parties_observed"])) <= 3, record["validation"]
    manifest = config.parent / "party1" / "model" / "manifest.json"
    for folder in ("its earlier run's", "other settings"):  # found as the parties meet, or before any starts
        if folder == "other settings":
            manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "fingerprint": "0" * 16}))
        code, _, err = cli("predict", "--config", str(config), "--out", str(tmp_path / "p.csv"), "--quiet")
        assert code != 0 and "party1 left the training run of this model" in err and "--absent party1" in err, err
        assert "restore" not in err and not (tmp_path / "p.csv").exists(), (folder, err)
    code, _, err = cli("predict", "--config", str(config), "--out", str(tmp_path / "p.csv"), "--quiet",
                       "--absent", "party1")
    assert code == 0, err


def test_a_run_stopped_by_a_lost_party_resumes_and_says_what_its_record_covers(trained, tmp_path):
    """`on_party_loss = "stop"`: party1 is killed in stage 1, every party stops; `train --resume` goes on from the
    last epoch every party completed, and its record and summary say so (operations trial: they read as a whole
    run's, 38 of 60 epochs' losses and the resumed part's time, with no word of the resume)."""
    import signal

    config = _copy(trained, tmp_path, epochs="kappa = 2\n[model.pretrain]\nepochs = 8\n[model.train]\nepochs = 4\n")
    procs = _training_parties(config)
    _stage1_checkpoint(config.parent / "party3" / "model" / "checkpoints", 2)
    procs["party1"].send_signal(signal.SIGKILL)
    errors = {name: proc.communicate(timeout=120)[1] for name, proc in procs.items()}
    assert all(procs[n].returncode != 0 for n in procs), errors
    code, out, err = cli("train", "--config", str(config), "--resume", "--quiet")
    assert code == 0, err
    record = json.loads((config.parent / "party3" / "model" / "train_result.json").read_text())
    done = record["resumed_after_epochs"]["pretrain"]
    assert 2 <= done < 8 and len(record["losses"]["pretrain"]) == 8 - done, record["resumed_after_epochs"]
    assert f"(resumed after stage 1 epoch {done}: the time and losses are the resumed part's)" in out, out


@pytest.mark.parametrize("edit", [
    lambda m: {**m, "settings": "x"}, lambda m: {**m, "classes": ["1", "1"]}, lambda m: {**m, "classes": []},
    lambda m: {**m, "classes": "xy"}, lambda m: {**m, "settings": {"a": [[[[]]]]}, "fingerprint": "f"},
    lambda m: {**m, "party": 3},
], ids=["settings text", "a class twice", "no class", "classes text", "other fingerprint", "party number"])
def test_a_manifest_edited_by_hand_is_refused_in_one_line(trained, tmp_path, edit):
    # Review finding: settings that were no object gave an AttributeError traceback, deeply nested JSON a
    # RecursionError one, and a list of classes with a repeat, none or a text was taken.
    from falsevfl_secure.errors import InputError
    from falsevfl_secure.federation.config import load_federation
    from falsevfl_secure.federation.store import load_manifest

    manifest = json.loads((trained / "party3" / "model" / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps(edit(manifest)))
    with pytest.raises(InputError) as refused:
        load_manifest(tmp_path, "party3", load_federation(trained / "federation.toml").model)
    assert "\n" not in str(refused.value) and "party3" in str(refused.value)
    (tmp_path / "manifest.json").write_text('{"a":' * 5000 + "1" + "}" * 5000)
    with pytest.raises(InputError, match="is not a model manifest"):
        load_manifest(tmp_path, "party3", load_federation(trained / "federation.toml").model)


def test_a_model_folder_pairs_its_manifest_with_its_own_weights_only(trained, tmp_path):
    # Review finding: a retrain commits its model folder file by file, so a kill between two moves could pair a
    # new manifest (encoding, classes) with the old weights, and predict took them. The manifest names its
    # weights by their SHA-256 now; other weights are refused in one line before they are loaded.
    import hashlib
    import shutil

    from falsevfl_secure.errors import InputError
    from falsevfl_secure.federation.config import load_federation
    from falsevfl_secure.federation.store import load_manifest, load_weights

    folder = tmp_path / "model"
    shutil.copytree(trained / "party3" / "model", folder)
    manifest = load_manifest(folder, "party3", load_federation(trained / "federation.toml").model)
    assert manifest.weights == hashlib.sha256((folder / "model.pt").read_bytes()).hexdigest()
    shutil.copy(trained / "party0" / "model" / "model.pt", folder / "model.pt")  # weights of another save
    with pytest.raises(InputError, match="not the weights its manifest.json names"):
        load_weights(folder, None, 3, manifest.weights)


def test_a_prediction_refuses_models_of_different_training_runs(trained):
    """A retrain of one party (or a run killed while the parties committed their folders one by one) leaves
    models of two runs: predict names the party whose model is not of the active party's run and writes
    nothing (before, it predicted with one run's encoder and another run's decoder, silently)."""
    names = ("party0", "party1", "party2", "party3")
    manifests = {n: json.loads((trained / n / "model" / "manifest.json").read_text()) for n in names}
    runs = {m["trained_in"] for m in manifests.values()}
    assert len(runs) == 1 and len(runs.pop()) == 64  # one training run, named alike by every party
    path, out = trained / "party1" / "model" / "manifest.json", trained / "mixed.csv"
    original = path.read_text()
    try:
        path.write_text(json.dumps({**manifests["party1"], "trained_in": "ab" * 32}))  # another run's folder
        code, _, err = cli("predict", "--config", str(trained / "federation.toml"), "--out", str(out), "--quiet")
    finally:
        path.write_text(original)
    assert code != 0 and "the saved model of party1 is not of the training run that saved party3's" in err, err
    assert not out.exists() and "Traceback" not in err


@pytest.mark.parametrize("rendezvous, shared", [("127.0.0.1:29611", True), ("localhost:29611", True),
                                                ("[::1]:29611", True), ("10.0.0.1:29611", False),
                                                ("parties.example:29611", False)])
def test_roles_on_one_host_share_its_cores_and_each_host_of_its_own_keeps_them(tmp_path, monkeypatch, rendezvous,
                                                                                shared):
    """Three roles on two cores each with torch's default (all the cores) spun six threads on two: a stage-1 step
    several times slower. A loopback rendezvous means every role is on this host: each takes its share."""
    import os

    import torch

    from falsevfl_secure.federation.config import load_federation
    from falsevfl_secure.federation.launch import share_cores
    from falsevfl_secure.transport.protocols import protocol_named

    assert cli("demo", "--dataset", "breast-cancer", "--parties", "3", "--out", str(tmp_path))[0] == 0
    config = tmp_path / "federation.toml"
    config.write_text(config.read_text().replace('rendezvous = "127.0.0.1:29611"', f'rendezvous = "{rendezvous}"'))
    fed, before = load_federation(config), torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        torch.set_num_threads(7)
        threads = share_cores(fed, protocol_named("plain"))
        expected = max(1, len(os.sched_getaffinity(0)) // 3) if shared else None
        assert threads == expected and torch.get_num_threads() == (expected or 7)
        if shared:  # he: the aggregator is a role of this host too
            assert share_cores(fed, protocol_named("he")) == max(1, len(os.sched_getaffinity(0)) // 4)
            monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the operator's own setting wins
            assert share_cores(fed, protocol_named("plain")) is None
    finally:
        torch.set_num_threads(before)


def test_check_tells_each_party_what_training_would_spend_and_the_noise_that_fits(tmp_path):
    """Privacy review: nothing said what the schedule would spend, or what noise would fit the budget, before
    `train` refused it. `check` now says both, from the party's own file and ledger, as training counts them. A
    trial then set the noise `check` proposed and trained a model that could never predict: the proposal now fits
    the schedule and one prediction run, and the real runs spend what `check` said. A schedule past the budget or
    the release cap is a note (a trial saw `check` silent and `train` refuse)."""
    import re

    assert cli("demo", "--dataset", "wine", "--parties", "3", "--out", str(tmp_path))[0] == 0
    config = tmp_path / "federation.toml"
    text = config.read_text() + ("\n[model.pretrain]\nepochs = 2\n[model.train]\nepochs = 2\n"
                                 "[privacy]\nepsilon = 1.0\nnoise_multiplier = 4.0\n")
    config.write_text(text.replace("epsilon = 1.0", "epsilon = 5e-4"))  # (once proposed 49000, which it refuses)
    fits = re.search(r"only a noise_multiplier of ([\d.e+]+) or more fits both, past the 10000 the file allows: "
                     "fewer epochs", _schedule_line(config))
    assert fits and float(fits.group(1)) > 1e4, _schedule_line(config)
    config.write_text(text)
    line = _schedule_line(config)
    said, then, fits = re.search(r"about epsilon = ([\d.]+) .*one prediction run after it to ([\d.]+); "
                                 r"noise_multiplier = ([\d.]+) or more fits both; that is past its budget epsilon = 1:",
                                 line).groups()
    assert line.startswith("  note: ") and float(then) > float(said) > 1, line
    code, _, err = cli("train", "--config", str(config), "--quiet")
    refused = float(re.search(r"the schedule would spend epsilon = ([\d.]+) per row", err).group(1))
    assert code != 0 and abs(refused - float(said)) <= 0.006 * float(said), (line, err)
    config.write_text(text.replace("noise_multiplier = 4.0", f"noise_multiplier = {fits}"))  # exactly what it said
    line = _schedule_line(config)
    said, then = re.search(r"about epsilon = ([\d.]+) .*one prediction run after it to ([\d.]+);", line).groups()
    assert not line.startswith("  note: ") and float(said) < float(then) <= 1.0, line
    config.write_text(config.read_text() + "max_releases_per_row = 10\n")
    assert "past its max_releases_per_row = 10: training would refuse it" in _schedule_line(config)
    config.write_text(config.read_text().replace("max_releases_per_row = 10\n", ""))
    assert cli("train", "--config", str(config), "--quiet")[0] == 0
    code, _, err = cli("predict", "--config", str(config), "--quiet", "--out", str(tmp_path / "p.csv"))
    assert code == 0, err
    ledger = json.loads((tmp_path / "clinic" / "model" / "privacy.json").read_text())
    assert ledger["prediction_runs"] == 1 and float(f"{ledger['epsilon']:.3g}") == float(then), (line, ledger)
    config.write_text(text.replace("epsilon = 1.0", "epsilon = 1e9"))  # once proposed a multiplier the file refuses
    assert "any noise_multiplier the file allows (from 0.05) fits both" in _schedule_line(config)


def test_under_he_a_party_that_does_not_trust_the_aggregator_counts_as_under_plain(tmp_path):
    """[privacy] trust_aggregator = false, in a passive party's own file: under he it counts each summed release
    as plain does (an aggregator forwarding its ciphertext alone would show it to the active party); the active
    party's count is unchanged; the setting is the party's own (another file's value changes no fingerprint)."""
    import re

    from falsevfl_secure.federation.config import load_federation

    assert cli("demo", "--dataset", "wine", "--parties", "3", "--out", str(tmp_path))[0] == 0
    config = tmp_path / "federation.toml"
    text = config.read_text() + ("\n[model.pretrain]\nepochs = 2\n[model.train]\nepochs = 2\n"
                                 "[privacy]\nepsilon = 100.0\nnoise_multiplier = 4.0\n")

    def releases(protocol: str, trust: str, party: str = "lab") -> int:
        config.write_text(text.replace('protocol = "mpc"', f'protocol = "{protocol}"') + trust)
        return int(re.search(r"\((\d+) releases per row", _schedule_line(config, party)).group(1))

    distrust = "trust_aggregator = false\n"
    assert releases("he", "") == releases("mpc", "") < releases("he", distrust) == releases("plain", "")
    assert releases("he", distrust, "clinic") == releases("he", "", "clinic")
    assert releases("mpc", distrust) == releases("mpc", "")
    trusting = load_federation(config).model.fingerprint()
    config.write_text(config.read_text().replace(distrust, ""))
    assert load_federation(config).model.fingerprint() == trusting
    config.write_text(config.read_text() + 'trust_aggregator = "no"\n')
    code, _, err = cli("check", "--config", str(config), "--party", "lab")
    assert code == 2 and "[privacy] trust_aggregator = 'no' must be true or false" in err, err


def _schedule_line(config: Path, party: str = "clinic") -> str:
    code, out, err = cli("check", "--config", str(config), "--party", party)
    assert code == 0, err
    return next(line for line in out.splitlines() if "privacy: training" in line)


def test_min_parties_holds_for_a_prediction_with_parties_absent(trained, tmp_path):
    # Red team: a file saying min_parties = 4 refused a loss that left 3 parties but predicted with 3 started with
    # --absent. Every run now needs min_parties; a passive party checks the active party's roster against its own
    # file the same way (network/handshake.py, check_roster).
    from falsevfl_secure.errors import InputError
    from falsevfl_secure.network.agreement import Agreement
    from falsevfl_secure.network.handshake import check_min_parties

    config = _copy(trained, tmp_path, "min_parties = 4\n")
    code, _, err = cli("predict", "--config", str(config), "--out", str(tmp_path / "p.csv"), "--quiet",
                       "--absent", "party1")
    assert code != 0 and "only 3 parties take part, fewer than min_parties = 4" in err, err
    assert err.count("error:") == 1 and not (tmp_path / "p.csv").exists()
    check_min_parties(4, Agreement({"min_parties": 4}), "f.toml")
    check_min_parties(2, Agreement({}), "f.toml")  # a test session's agreement: no policy, two parties suffice
    check_min_parties(1, Agreement({"min_parties": 3}), "f.toml")  # the active party alone involves nobody else
    with pytest.raises(InputError, match="fewer than min_parties = 3 in \\[federation\\] of f.toml"):
        check_min_parties(2, Agreement({"min_parties": 3}), "f.toml")


def test_a_passive_party_refuses_a_roster_shorter_than_its_own_min_parties():
    # Review finding: only the launcher's check was tested; a malicious active party sends its own roster, so each
    # passive party checks it against its own file (the hellos' signatures are checked as before; stubbed here).
    from falsevfl_secure.errors import InputError
    from falsevfl_secure.network.agreement import Agreement
    from falsevfl_secure.network.handshake import Cast, Handshake, Request

    shake = Handshake.__new__(Handshake)
    shake.me, shake.hides, shake.check_hello = "lab", True, lambda hello: None
    shake.cast = Cast(("clinic", "lab", "insurer", "bank"), "clinic", None, {})
    shake.request = Request(("clinic", "lab", "insurer", "bank"), False, 60.0, "lab.toml")
    hellos = [{"name": name} for name in ("clinic", "lab", "insurer")]
    roster = {"present": ["clinic", "lab", "insurer"], "hellos": hellos, "protocol": "mpc"}
    shake.agreement = Agreement({"protocol": "mpc", "min_parties": 3})
    assert shake.check_roster(roster, hellos[1]) == ("clinic", "lab", "insurer")
    shake.agreement = Agreement({"protocol": "mpc", "min_parties": 4})
    with pytest.raises(InputError, match="only 3 parties take part, fewer than min_parties = 4 in \\[federation\\] "
                                         "of lab.toml"):
        shake.check_roster(roster, hellos[1])


def test_check_reads_the_saved_weights_against_their_manifest_and_says_when_none_are_trained(trained, tmp_path):
    # A fuzzer's garbage, truncated or swapped model.pt passed `check` (which had read the manifest only) and was
    # refused by `predict`; a missing model passed as a prediction table matched "against the training table".
    config = _copy(trained, tmp_path)
    code, out, err = cli("check", "--config", str(config), "--party", "party1")
    assert code == 0 and "match the saved model by name" in out and "no trained model" not in out, out + err
    weights = config.parent / "party1" / "model" / "model.pt"
    weights.write_bytes((config.parent / "party2" / "model" / "model.pt").read_bytes())
    code, out, err = cli("check", "--config", str(config), "--party", "party1")
    assert code == 2 and "model.pt: not the weights its manifest.json names" in err, out + err
    (config.parent / "party1" / "model" / "manifest.json").unlink()
    code, out, err = cli("check", "--config", str(config), "--party", "party1")
    assert code == 0 and f"no trained model in {weights.parent} yet: `predict` needs `train` first" in out, out + err


def test_a_prediction_under_a_protocol_that_hides_less_than_its_training_says_so(trained, tmp_path):
    # A trial: `predict --protocol plain` on a model trained under mpc went without a word.
    config = _copy(trained, tmp_path)
    said = "note: predicting under plain, where the model was trained under mpc: each party's contributions reach"
    code, out, err = cli("predict", "--config", str(config), "--out", str(tmp_path / "p.csv"), "--quiet",
                         "--protocol", "plain")
    assert code == 0 and said in out, out + err
    code, out, err = cli("predict", "--config", str(config), "--out", str(tmp_path / "q.csv"), "--quiet")
    assert code == 0 and "note: predicting under" not in out, out + err
