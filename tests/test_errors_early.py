"""Errors early and in the user's words: `check` and every command check a role's own files (its key
against its own pin, its tables, the settings) in seconds and before anything connects; a party's own
file needs only its own paths; a passive party needs no --out; keygen never replaces a key and says whose
it is; a TLS refusal names the pin; the two-party rule is never the symptom of a party that did not join."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from align_channels import free_port
from federation_cli import cli

from falsevfl_secure.federation.config import load_federation
from falsevfl_secure.secure import identity

PARTIES = ("clinic", "lab", "insurer")  # the tables demo's; clinic holds the labels
SHORT = "seed = 0\n[model.pretrain]\nepochs = 1\n[model.train]\nepochs = 2\n"
FAST = 5.0  # seconds: the most a refusal may take, process start-up included (the bound)


def command(*argv: str, timeout: float = 60.0) -> tuple[int, str, str, float]:
    """`python -m falsevfl_secure.federation ARGV` as a user runs it: (exit code, stdout, stderr, seconds)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "falsevfl_secure.federation", *argv], capture_output=True,
                          text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr, time.perf_counter() - started


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def demo(folder: Path, protocol: str = "mpc") -> Path:
    """The wine tables of three parties, one operator's file, on a free port, a short schedule."""
    code, _, err = cli("demo", "--dataset", "wine", "--parties", "3", "--protocol", protocol, "--preset", "quick",
                       "--out", str(folder))
    assert code == 0, err
    config = folder / "federation.toml"
    text = config.read_text().replace("seed = 0\n", SHORT).replace("127.0.0.1:29611", f"127.0.0.1:{free_port()}")
    config.write_text(text.replace("127.0.0.1:29612", f"127.0.0.1:{free_port()}"))
    return config


def check_refused(config: Path, party: str = "lab") -> str:
    """`check --party`: refused in seconds with one `error:` line; what it says."""
    code, _, err, seconds = command("check", "--config", str(config), "--party", party)
    assert code == 2 and seconds < FAST and len(error_lines(err)) == 1, (seconds, err)
    return err


def own_file(config: Path, name: str, edit=lambda text: text) -> Path:
    """Party `name`'s own file: every party's name and key, only its own paths (beside the demo's file)."""
    text = re.sub(rf'^(train|predict|model) = "(?!{name}/)[^"]*"\n', "", config.read_text(), flags=re.MULTILINE)
    path = config.parent / f"{name}.toml"
    path.write_text(edit(text))
    return path


def mistyped(pin: str, on_curve: bool) -> str:
    """`pin` with one character of its key changed, still a point of the curve or not (a typo is either)."""
    for at in range(len("ed25519:") + 5, len(pin) - 2):
        for char in "ABCDEFGH":
            if char == pin[at]:
                continue
            typo = pin[:at] + char + pin[at + 1:]
            if is_point(base64.b64decode(typo[len("ed25519:"):])) == on_curve:
                return typo
    raise AssertionError("no such typo")


def is_point(raw: bytes) -> bool:
    """Whether 32 bytes encode a point of Ed25519, worked out here on its own (Euler's criterion: x^2 =
    (y^2 - 1) / (d y^2 + 1) has a root), not with the code under test."""
    p = 2**255 - 19
    y = int.from_bytes(raw, "little") & (2**255 - 1)
    x2 = (y * y - 1) * pow(-121665 * pow(121666, -1, p) * y * y + 1, -1, p) % p
    return y < p and pow(x2, (p - 1) // 2, p) in (0, 1)


def key_file(config: Path, name: str) -> Path:
    """Where role `name` keeps its key (by its file)."""
    return load_federation(config).identity_path(name)


def set_cell(table: Path, line: int, column: int, value: str) -> None:
    """One cell of a CSV table changed (line 1 is the header)."""
    lines = table.read_text(encoding="utf-8-sig").splitlines()
    cells = lines[line - 1].split(",")
    cells[column] = value
    lines[line - 1] = ",".join(cells)
    table.write_text("\n".join(lines) + "\n")


def waiting(seconds: float):
    """An edit of a file's text: `join_timeout_s = seconds`."""
    return lambda text: text.replace("[model]", f"join_timeout_s = {seconds:g}\n[model]")


def pin_of(config: Path, name: str) -> str:
    text = config.read_text()
    return re.search(r'key = "(ed25519:[^"]+)"', text[text.index(f'name = "{name}"'):]).group(1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The wine demo trained under mpc (a few epochs), once for the module."""
    config = demo(tmp_path_factory.mktemp("early"))
    code, _, err = cli("train", "--config", str(config), "--quiet")
    assert code == 0, err
    return config


# -- check: the key against the own pin, every pin, the tables; in seconds -------------------------------


@pytest.mark.timed
def test_check_refuses_another_roles_key_file_naming_whose_it_is(tmp_path, refused):
    config = demo(tmp_path)
    key_file(config, "lab").write_bytes(key_file(config, "insurer").read_bytes())
    err = check_refused(config)
    assert "lab.key holds the key" in err and "pins for party 'insurer', not for party 'lab'" in err, err
    refused("federation key")


@pytest.mark.timed
@pytest.mark.parametrize("content, said", [("not a key\n", "not a key written by `federation keygen` (no PEM private "
                                                           "key in it)"),
                                          ("", "the identity key file is empty"),  # (a bad-input sweep: the library's
                                          ("PIN", "holds a public pin (ed25519:...), which goes in federation.toml")])
def test_check_refuses_a_key_file_that_is_no_key(tmp_path, refused, content, said):  # FAQ link answered both)
    config = demo(tmp_path)
    pin = next(line for line in config.read_text().splitlines() if line.startswith("key = "))
    key_file(config, "lab").write_text(pin + "\n" if content == "PIN" else content)
    err = check_refused(config)
    assert err.startswith("error: party 'lab': ") and said in err and "cryptography.io" not in err, err
    refused("federation key")


@pytest.mark.timed
def test_check_refuses_a_mistyped_own_pin_and_a_peer_pin_that_is_no_key(tmp_path, refused):
    config = demo(tmp_path)
    text = config.read_text()
    config.write_text(text.replace(pin_of(config, "lab"), mistyped(pin_of(config, "lab"), on_curve=True)))
    err = check_refused(config)
    assert "does not pin for lab" in err and "mistyped" in err, err
    refused("federation key")
    config.write_text(text.replace(pin_of(config, "clinic"), mistyped(pin_of(config, "clinic"), on_curve=False)))
    err = check_refused(config)
    assert "[party 'clinic'] key: " in err and "no Ed25519 public key" in err, err
    refused("federation key")


@pytest.mark.timed
def test_check_refuses_one_key_pinned_for_two_roles(tmp_path, refused):
    config = demo(tmp_path)
    config.write_text(config.read_text().replace(pin_of(config, "clinic"), pin_of(config, "insurer")))
    code, _, err = cli("check", "--config", str(config), "--party", "lab")
    assert code == 2 and "clinic and insurer are pinned with the same key" in err, err
    refused("federation key")


@pytest.mark.timed
def test_check_shows_a_decimal_comma_in_seconds(tmp_path, refused):
    config = demo(tmp_path)
    set_cell(tmp_path / "lab" / "train.csv", 2, 1, '"1,5"')
    err = check_refused(config)
    assert "'1,5' looks like a number written with a decimal comma" in err and "line 2" in err, err
    refused("federation input")


# -- train and predict: their own files first, before anything connects --------------------------------


@pytest.mark.timed
def test_train_with_a_bad_table_stops_in_seconds_with_one_line(tmp_path, refused):
    config = demo(tmp_path)
    set_cell(tmp_path / "lab" / "train.csv", 2, 1, "abc")
    code, _, err, seconds = command("train", "--config", str(config), "--party", "lab", "--quiet")
    assert code == 2 and seconds < FAST and len(error_lines(err)) == 1, (seconds, err)
    assert err.startswith("error: train: the files of lab need fixing") and "line 2" in err, err
    refused("federation input")


@pytest.mark.timed
def test_train_with_another_roles_key_stops_before_connecting(tmp_path, refused):
    """Before: the party connected, and the peers' words came back after the join timeout."""
    config = demo(tmp_path)
    config.write_text(waiting(30)(config.read_text()))
    key = key_file(config, "lab")
    key.unlink()
    identity.write_private_key(key, identity.generate())
    code, _, err, seconds = command("train", "--config", str(config), "--party", "lab", "--quiet")
    assert code == 2 and seconds < FAST and len(error_lines(err)) == 1, (seconds, err)
    assert "does not pin for lab" in err and "Traceback" not in err, err
    refused("federation key")


def test_predict_asks_the_active_party_alone_for_out(tmp_path, refused):
    config = demo(tmp_path)
    code, _, err = cli("predict", "--config", str(config), "--party", "clinic")
    assert code == 2 and "--out PREDICTIONS.csv is needed where the active party 'clinic' runs" in err, err
    refused("cli option")


# -- one host per party: own paths only, no --out at a passive party ------------------------------------


def run_hosts(argv: list[str], configs: dict[str, Path], outs: dict[str, list[str]], timeout: float = 180):
    """Every party as its own process with its own file (one host each); (exit code, stderr) of each."""
    procs = {name: subprocess.Popen([sys.executable, "-m", "falsevfl_secure.federation", *argv, "--config",
                                     str(path), "--party", name, "--quiet", *outs.get(name, [])],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for name, path in configs.items()}
    try:
        return {name: (p.wait(timeout=timeout), p.communicate()[1]) for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def test_each_party_runs_from_a_file_with_its_own_paths_and_passive_parties_need_no_out(trained):
    configs = {name: own_file(trained, name) for name in PARTIES}
    assert 'train = "clinic/' not in configs["lab"].read_text()
    out = trained.parent / "own-files.csv"
    ended = run_hosts(["predict"], configs, {"clinic": ["--out", str(out)]})
    assert all(code == 0 for code, _ in ended.values()), ended
    assert len(out.read_text().splitlines()) > 10


def test_a_mistyped_pin_under_mpc_is_named_not_the_two_party_rule(trained, tmp_path):
    """lab's file pins a wrong key for clinic (still a key): lab's TLS handshake fails, and names the pin;
    clinic and insurer are told a party did not join, never to set allow_two_party_disclosure."""
    wrong = mistyped(pin_of(trained, "clinic"), on_curve=True)
    text = trained.read_text()
    configs = {name: tmp_path / f"{name}.toml" for name in PARTIES}
    # lab gives up first, so that its last attempt still finds clinic listening (and hears the TLS refusal)
    configs["lab"].write_text(waiting(4)(text.replace(pin_of(trained, "clinic"), wrong)))
    for name in ("clinic", "insurer"):
        configs[name].write_text(waiting(12)(text))
    for folder in (*PARTIES, "keys"):  # the trained demo's tables, models and keys, beside these files
        if (trained.parent / folder).exists():
            (tmp_path / folder).symlink_to(trained.parent / folder)
    out = ["--out", str(tmp_path / "p.csv")]
    ended = run_hosts(["predict"], configs, dict.fromkeys(PARTIES, out), timeout=120)
    for name, (code, err) in ended.items():
        assert code != 0 and len(error_lines(err)) == 1 and "allow_two_party_disclosure" not in err, (name, err)
    assert f'pins clinic as key = "{wrong}"' in ended["lab"][1], ended["lab"][1]
    assert "lab did not join within 12 s" in ended["clinic"][1], ended["clinic"][1]  # the cause, named
    assert not (tmp_path / "p.csv").exists()


# -- keygen ---------------------------------------------------------------------------------------------


def test_keygen_gives_each_role_its_own_file_and_never_replaces_one(tmp_path, refused):
    """Two parties whose model folders share a parent once met in one key file; a second keygen says
    whose key the file holds and what to do."""
    config = demo(tmp_path)
    text = re.sub(r'^key = "[^"]*"\n', "", config.read_text(), flags=re.MULTILINE)
    config.write_text(re.sub(r'model = "(\w+)/model"', r'model = "models/\1"', text))
    for path in tmp_path.rglob("*.key"):
        path.unlink()
    for name in ("clinic", "lab"):
        code, out, err = cli("keygen", "--config", str(config), "--party", name)
        assert code == 0, err  # before: lab's keygen met the clinic's key in models/identity.key
        assert f"keys/{name}.key" in out, out
    pin = re.search(r'key = "([^"]+)"', out).group(1)
    code, _, err = cli("keygen", "--config", str(config), "--party", "lab")
    assert code == 2 and len(error_lines(err)) == 1, err
    assert "keys/lab.key exists (written by an earlier keygen)" in err and f'key = "{pin}"' in err, err
    assert "remove it to make a new key" in err and "`identity` setting" in err, err
    refused("federation key")


# -- parties named, never ranks -------------------------------------------------------------------------


def test_a_hostile_row_announcement_is_refused_naming_the_active_party():
    from falsevfl_secure.federation.aligned import check_announcement
    from falsevfl_secure.secure import frames
    from falsevfl_secure.secure.errors import SecureMessageError

    frame = frames.encode(frames.Kind.DATA, [np.asarray(v, "<i8").tobytes() for v in ([0, 6], [], [], [3, 2], [])])
    with pytest.raises(SecureMessageError) as refusal:
        check_announcement(frame, 0, 6, 4, 3)
    assert "the row announcement of the active party" in str(refusal.value), refusal.value  # before: "party 0"
    with pytest.raises(SecureMessageError) as refusal:
        check_announcement(frame, 0, 6, 4, 3, "the active party 'clinic'")
    assert "the active party 'clinic'" in str(refusal.value), refusal.value


# -- settings a user can mistype: one line naming the setting, before any work (review of the CLI) ----------

TYPOS = [
    (lambda t: 'model = "quick"\n' + t.replace('[model]\npreset = "quick"\nseed = 0\n', ""), "model must be a table"),
    (lambda t: t.replace('rendezvous = "127.0.0.1:29611"', 'rendezvous = "127.0.0.1:\u00b2"'), "must be HOST:PORT"),
    # a bad-input sweep's: a scheme passed check and failed at listening as a "taken port"; a port out of range
    (lambda t: t.replace('rendezvous = "127.0.0.1:29611"', 'rendezvous = "http://127.0.0.1:29611"'), "no scheme"),
    (lambda t: t.replace('rendezvous = "127.0.0.1:29611"', 'rendezvous = "127.0.0.1:99999"'),
     "port must be in 1..65535"),
    (lambda t: t.replace("seed = 0\n", "seed = 0\n[model.pretrain]\nepochs = 99999999999999999999\n"),
     "a whole number in 0..100,000"),
    (lambda t: t.replace("seed = 0\n", 'seed = 0\nclass_weight = "balanced"\n').replace(
        'task = "classification"', 'task = "regression"'), "applies to task = \"classification\" only"),
    (lambda t: t.replace("seed = 0\n", "seed = 0\n[model.pretrain]\nepochs = 1.5\n"), "epochs=1.5"),
    (lambda t: t.replace("seed = 0\n", "seed = 0\n[model.train]\nbatch_size = 2.5\n"), "batch_size=2.5"),
    (lambda t: t.replace("seed = 0\n", "seed = 0\n[model.pretrain]\nlr = inf\n"), "lr must be a finite"),
    (lambda t: t.replace("seed = 0\n", "seed = 0\n[model.train]\nweight_decay = nan\n"), "lr must be a finite"),
    (lambda t: t.replace("seed = 0\n", "seed = 0\nh_dim = 1000000000000\n"), "h_dim=1000000000000"),
    (lambda t: t.replace("seed = 0\n", "seed = 0\nkappa = true\n"), "kappa=True"),
    (lambda t: t.replace("seed = 0\n", 'seed = 0\nmin_decoder_std = inf\n'), "min_decoder_std=inf"),
    (lambda t: t.replace("seed = 0\n", 'seed = 0\n[model.pretrain]\nepochs = "ten"\n'), "epochs='ten'"),
    (lambda t: t.replace("[[party]]", '[privacy]\nepsilon = "1"\n\n[[party]]', 1), "[privacy] epsilon = '1'"),
    (lambda t: t.replace("[[party]]", "[privacy]\nepsilon = 1.0\nnoise_multiplier = inf\n\n[[party]]", 1),
     "[privacy] noise_multiplier = inf"),
    # a privacy reviewer's: named as [model], contradicting the range, or accepted silently
    (lambda t: t.replace("[[party]]", "[privacy]\nepsilon = 8.0\nnoise_multiplier = 4\ncollusion = 2\n\n[[party]]", 1),
     "[privacy] collusion=2"),
    (lambda t: t.replace("[[party]]", "[privacy]\nepsilon = 8.0\nnoise_multiplier = 0.01\n\n[[party]]", 1),
     "[privacy] noise_multiplier = 0.01 must be in [0.05, 10000] in a federation"),
    (lambda t: t.replace("[[party]]", "[privacy]\nepsilon = 8.0\ndelta = 0.5\nnoise_multiplier = 4\n\n[[party]]", 1),
     "[privacy] delta = 0.5 must be in (0, 0.01]"),
    # a DP trial's: the library's wider range was quoted for 0, and a missing multiplier read as "= 0"
    (lambda t: t.replace("[[party]]", "[privacy]\nepsilon = 8.0\ndelta = 0\nnoise_multiplier = 4\n\n[[party]]", 1),
     "[privacy] delta = 0 must be in (0, 0.01]"),
    (lambda t: t.replace("[[party]]", "[privacy]\nepsilon = 8.0\n\n[[party]]", 1),
     "[privacy] noise_multiplier is required with epsilon"),
    (lambda t: t.replace("[[party]]", "[privacy]\nnoise_multiplier = 4\n\n[[party]]", 1),
     "[privacy] has no epsilon"),
    (lambda t: t.replace("[[party]]", "[privacy]\nepsilon = -1\nnoise_multiplier = 4\n\n[[party]]", 1),
     "[privacy] has epsilon = -1, not > 0"),  # (a bad-input sweep: the value was not echoed)
    (lambda t: t.replace('model = "lab/model"', 'model = "lab/train.csv"'), "is a file"),
    # a fuzzer's: a folder below a file passed check
    (lambda t: t.replace('model = "lab/model"', 'model = "lab/train.csv/model"'), "lab/train.csv' is a file"),
    # a trial's: no hint for a name in another case, and a key left out read "must be a non-empty string, got None"
    (lambda t: re.sub(r'active = "(\w+)"', lambda m: f'active = "{m.group(1).upper()}"', t), "(did you mean '"),
    (lambda t: re.sub(r'label_column = "\w+"\n', "", t), "[federation] has no label_column (a non-empty string"),
]


@pytest.mark.parametrize("edit, said", TYPOS, ids=[said for _, said in TYPOS])
def test_a_mistyped_setting_is_refused_in_one_line_naming_it(tmp_path_factory, edit, said):
    # Review (bad inputs from the command line): these passed `check` and then failed inside `train` with a
    # traceback (1.5 epochs, a width of 10^12, a model folder that is a file), ran with inf (lr, noise), took
    # `true` as 1, or crashed on a superscript port or `model = "quick"` with a Python traceback.
    from falsevfl_secure.errors import InputError

    folder = tmp_path_factory.mktemp("typo")
    code, _, err = cli("demo", "--dataset", "wine", "--parties", "3", "--protocol", "mpc", "--preset", "quick",
                       "--out", str(folder))
    assert code == 0, err
    config = folder / "federation.toml"
    config.write_text(edit(config.read_text()))
    with pytest.raises(InputError) as refused:
        load_federation(config)
    assert said in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_a_key_written_meanwhile_by_another_keygen_is_never_replaced(tmp_path, monkeypatch):
    # Review finding: keygen checked that the key file did not exist, then renamed over it: two keygens at once
    # could replace a key whose public half was already pinned. The new key is linked in, which fails if one is.
    from falsevfl_secure.secure.identity import IdentityError, generate, write_private_key

    path = tmp_path / "keys" / "lab.pem"
    real = identity.atomic_write

    def racing(target, data, private=False):
        real(target, data, private)
        path.write_bytes(b"the other keygen's key")  # lands between the check and the link

    monkeypatch.setattr(identity, "atomic_write", racing)
    with pytest.raises(IdentityError, match="another keygen wrote it just now"):
        write_private_key(path, generate())
    assert path.read_bytes() == b"the other keygen's key" and sorted(p.name for p in path.parent.iterdir()) == \
        ["lab.pem"]
    monkeypatch.setattr(identity, "atomic_write", real)
    write_private_key(tmp_path / "keys" / "bank.pem", generate())
    assert oct((tmp_path / "keys" / "bank.pem").stat().st_mode & 0o777) == "0o600"


def test_check_refuses_a_table_that_would_list_more_ids_than_max_ids(tmp_path):
    # A fuzzer's max_ids = 7 passed `check` where every table lists over 100 IDs; the alignment refused it later.
    code, _, err = cli("demo", "--dataset", "wine", "--parties", "3", "--protocol", "mpc", "--preset", "quick",
                       "--out", str(tmp_path))
    assert code == 0, err
    config = tmp_path / "federation.toml"
    config.write_text(config.read_text().replace("[federation]\n", "[federation]\nmax_ids = 7\n", 1))
    code, out, err = cli("check", "--config", str(config), "--party", "lab")
    assert code == 2 and "IDs in the private alignment, more than [federation] max_ids = 7" in err, out + err
    listed = int(re.search(r"would list (\d+) IDs", err).group(1))
    config.write_text(config.read_text().replace("max_ids = 7\n", f"max_ids = {listed}\n"))
    code, out, err = cli("check", "--config", str(config), "--party", "lab")
    assert code == 0, out + err  # exactly its count passes


@pytest.mark.parametrize("folder, said", [("lab/model", "both name the model folder"),
                                          ("lab/model/mine", "one inside the other")])
def test_parties_run_together_on_one_host_keep_their_models_apart(tmp_path, folder, said):
    # A fuzzer's two parties in one folder passed check, and train then said another run was using it. Only the
    # parties run (or checked) together are compared: a review found the file of one host refused where every entry
    # names its folder alike (a template copied to every host, whose other entries this host never uses).
    code, _, err = cli("demo", "--dataset", "wine", "--parties", "3", "--protocol", "mpc", "--preset", "quick",
                       "--out", str(tmp_path))
    assert code == 0, err
    config = tmp_path / "federation.toml"
    text = config.read_text()
    config.write_text(re.sub(r'model = "(?!lab)\w+/model"', f'model = "{folder}"', text, count=1))
    for argv in (["check"], ["train", "--quiet"]):
        code, _, err = cli(*argv, "--config", str(config))
        assert code == 2 and said in err and err.count("error:") == 1, err
    code, out, err = cli("check", "--config", str(config), "--party", "lab")
    assert code == 0, out + err
    config.write_text(re.sub(r'model = "\w+/model"', 'model = "model"', text))  # every entry alike: one host's file
    code, out, err = cli("check", "--config", str(config), "--party", "lab")
    assert code == 0, out + err


@pytest.mark.parametrize("edit, named", [
    (lambda t: t.replace("[model.pretrain]\nepochs = 1", "[model.pretrain]\nepochs = 4"),
     "differ in [model.pretrain] epochs (lab: 4, clinic: 1): every"),
    (lambda t: t + "\n[privacy]\nepsilon = 8.0\nnoise_multiplier = 4.0\nclip_posterior = 5.0\n",
     "differ in [privacy] (lab: clip_gradient 30.0, clip_latent_grad 0.04, clip_likelihood 32.0, ...; clinic: none): "
     "every"),  # a section one file lacks, named once
    (lambda t: t.replace('preset = "quick"', 'preset = "auto"'),  # what moved the others first
     "differ in [model] preset (lab: 'auto', clinic: 'quick'), [model] auto_schedule (lab: True, clinic: False), ")])
def test_a_handshake_names_the_settings_two_files_differ_in_with_both_values(tmp_path, edit, named):
    """The active party checks a passive party's signed hello against its own file: the refusal names each differing
    setting as the file writes it, with both values (it named only the fingerprint of every [model] setting: a
    user could not tell which of forty keys to align), the first four where a preset moves many."""
    from falsevfl_secure.errors import InputError
    from falsevfl_secure.federation.launch import file_addresses, spec_of
    from falsevfl_secure.network.handshake import Handshake, _hello
    from falsevfl_secure.transport.protocols import protocol_named

    config, mpc = demo(tmp_path), protocol_named("mpc")
    specs = {}
    for name, path in (("clinic", own_file(config, "clinic")), ("lab", own_file(config, "lab", edit))):
        fed = load_federation(path)
        specs[name] = spec_of(fed, name, "train", mpc, fed.names, file_addresses(fed, mpc))
    shake = Handshake(None, "clinic", None, specs["clinic"].agreement, specs["clinic"].cast, None)
    lab_hello = _hello("lab", identity.read_private_key(key_file(config, "lab")), specs["lab"].agreement)
    with pytest.raises(InputError) as refused:
        shake.check_hello(lab_hello)
    assert "the configurations of lab and clinic differ in " in str(refused.value), refused.value
    assert named in str(refused.value) and "'model'" not in str(refused.value), refused.value
    own = identity.read_private_key(key_file(config, "clinic"))
    shake.check_hello(_hello("clinic", own, specs["clinic"].agreement))  # one file against itself: no difference


def _handshake_of(config: Path, name: str, edit=lambda text: text):
    """Party `name`'s agreement from its own file (edited), and a handshake of the active party clinic on its own."""
    from falsevfl_secure.federation.launch import file_addresses, spec_of
    from falsevfl_secure.network.handshake import Handshake
    from falsevfl_secure.transport.protocols import protocol_named

    specs, mpc = {}, protocol_named("mpc")
    for who, path in (("clinic", own_file(config, "clinic")), (name, own_file(config, name, edit))):
        fed = load_federation(path)
        specs[who] = spec_of(fed, who, "train", mpc, fed.names, file_addresses(fed, mpc))
    return specs[name].agreement, Handshake(None, "clinic", None, specs["clinic"].agreement, specs["clinic"].cast, None)


def test_a_whole_number_and_its_decimal_are_one_setting(tmp_path):
    """Review finding: one file's lr = 1 and another's lr = 1.0 say the same; their fingerprints differed, and the
    run stopped naming only the fingerprint. A float setting given as a whole number is read as that float."""
    from falsevfl_secure.network.handshake import _hello

    config = demo(tmp_path)
    decimals = "[model.pretrain]\nlr = 1.0\nweight_decay = 0.0\n"
    config.write_text(config.read_text().replace("[model.pretrain]\n", decimals)
                      + "\n[privacy]\nepsilon = 8.0\nnoise_multiplier = 4.0\nclip_gradient = 30.0\n")
    whole = lambda t: t.replace("lr = 1.0", "lr = 1").replace("weight_decay = 0.0", "weight_decay = 0").replace(  # noqa: E731
        "clip_gradient = 30.0", "clip_gradient = 30").replace("epsilon = 8.0", "epsilon = 8")
    agreement, shake = _handshake_of(config, "lab", whole)
    assert "lr = 1\n" in own_file(config, "lab", whole).read_text()
    assert agreement.get("[model.pretrain] lr") == 1.0 and isinstance(agreement.get("[model.pretrain] lr"), float)
    assert agreement.get("model") == shake.agreement.get("model")  # one fingerprint
    shake.check_hello(_hello("lab", identity.read_private_key(key_file(config, "lab")), agreement))


def test_a_peers_own_field_names_and_long_values_cannot_forge_lines(tmp_path):
    """Review finding: a pinned party's hello may carry fields of any name: one named "[x]\\nerror: ...\\x1b[2J" was
    printed raw in the refusal every role shows (a forged line, a cleared terminal), a 20,000-character value
    whole. A field our record lacks is quoted and cut; a setting's value is cut; the refusal stays one line."""
    from falsevfl_secure.errors import InputError
    from falsevfl_secure.network.agreement import Agreement
    from falsevfl_secure.network.handshake import _hello

    config = demo(tmp_path)
    agreement, shake = _handshake_of(config, "lab")
    forged = {**agreement.fields, "[x]\nerror: your key leaked\x1b[2J": 1, "[model.train] lr": "9" * 20_000}
    lab_key = identity.read_private_key(key_file(config, "lab"))
    with pytest.raises(InputError) as refused:
        shake.check_hello(_hello("lab", lab_key, Agreement(forged)))
    said = str(refused.value)
    assert "\n" not in said and "\x1b" not in said and len(said) < 1000, said
    assert "'[x]\\nerror: your key leaked\\x1b[2J'" in said and "[model.train] lr (lab: '999" in said, said
