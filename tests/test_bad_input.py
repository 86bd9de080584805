"""Bad input at the public entry points gives a clear error of a documented type, never a raw
traceback from inside torch, numpy, scikit-learn, CrypTen or TenSEAL. The CLI is fuzzed."""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure import simulate
from falsevfl_secure.data import DataError, parse_mechanism
from falsevfl_secure.errors import FalseVflError, InputError
from falsevfl_secure.methods import make_config
from falsevfl_secure.transport import PROTOCOLS as _REGISTRY

SECURE = [name for name, p in _REGISTRY.items() if p.hides_contributions]

BAD_OPTIONS = [
    ["--seed", "-1"], ["--seed", str(2**40)], ["--parties", "1"], ["--parties", "0"], ["--parties", "3"],
    ["--parties", "100"], ["--train-mechanism", "mcar:1.5"], ["--train-mechanism", "mnar:-0.1"],
    ["--train-mechanism", "dirichlet:0"], ["--train-mechanism", "mar3"], ["--pretrain-epochs", "-1"],
    ["--train-epochs", "-5"], ["--threads", "0"], ["--protocol", "mpc", "--runtime", "local"],
    ["--dataset", "mnist"], ["--preset", "huge"], ["--variant", "III"], ["--device", "tpu"],
    ["--parties", "two"], ["--protocol", "tls"],
    ["--epsilon", "1", "--noise-multiplier", "0.5"], ["--epsilon", "8", "--method", "vanilla"],
    ["--epsilon", "8", "--collusion", "3"], ["--epsilon", "-1"], ["--epsilon", "8", "--clip", "1", "0", "1"],
]


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = simulate.main([*argv, "--quiet", "--out", "/tmp/falsevfl-bad-input"])
        except SystemExit as exit_:  # argparse's refusal: one error line, exit 2 (a fuzzer found its usage before)
            code = exit_.code
    return code, err.getvalue()


@pytest.mark.parametrize("argv", BAD_OPTIONS, ids=[" ".join(a) for a in BAD_OPTIONS])
def test_bad_cli_arguments_give_one_clear_error(argv, refused):
    code, err = run_cli(argv)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    refused("cli option")


@pytest.mark.parametrize("argv", [["bogus"], [], ["check"], ["train", "--config", "f.toml", "--protocol", "rsa"],
                                  ["propose-clips", "--config", "f.toml", "--party", "a", "--records", "1e300"],
                                  ["check", "--config", "f.toml", "--bogus"]])
def test_a_federation_command_line_argparse_refuses_is_one_error_line(argv, refused):
    from falsevfl_secure.federation.__main__ import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and len(err.getvalue().splitlines()) == 1, err.getvalue()
    assert err.getvalue().startswith("error: ") and "--help)" in err.getvalue(), err.getvalue()
    refused("cli option")


def _invalid_mechanism(text: str) -> bool:
    try:
        parse_mechanism(text)
    except DataError:
        return True
    return False


@settings(max_examples=60, deadline=None)
@given(option=st.sampled_from(["--train-mechanism", "--dataset", "--parties", "--seed", "--pretrain-epochs"]),
       text=st.text(st.characters(codec="ascii", exclude_characters="\x00"), max_size=12))
def test_fuzzed_cli_values_are_refused_cleanly(option, text, refused):
    if option == "--train-mechanism" and not _invalid_mechanism(text):
        return
    if option == "--dataset" and text in ("digits", "isolet", "hapt", "fashion-mnist", "fashion_mnist", "fmnist"):
        return
    if option in ("--parties", "--seed", "--pretrain-epochs") and text.strip().lstrip("+").isdigit():
        return  # a valid number would start a real run
    code, err = run_cli([option, text])
    assert code == 2, err
    assert "Traceback" not in err
    refused("cli value (fuzzed)")


@pytest.mark.parametrize("overrides", [dict(kappa=0), dict(h_dim=-1), dict(variant="X"), dict(seed=-3),
                                       dict(active_party=9), dict(task="ranking"), dict(predict_samples=0),
                                       dict(stack_parties="sometimes")])
def test_config_validation(overrides, refused):
    with pytest.raises(InputError):
        make_config("digits", "quick", **overrides)
    refused("config")


@pytest.mark.parametrize("field", ["epochs", "batch_size", "steps_per_epoch"])
def test_a_schedule_count_given_as_true_is_refused(field, refused):
    """TOML's `true` is a Python bool, which is an int: a count must be a whole number, not a flag."""
    from dataclasses import replace

    cfg = make_config("digits", "quick")
    with pytest.raises(InputError, match=field):
        replace(cfg, pretrain=replace(cfg.pretrain, **{field: True})).pretrain.check("pretrain")
    refused("config")


def test_documented_types_are_value_errors():
    assert issubclass(DataError, FalseVflError) and issubclass(InputError, FalseVflError)
    assert issubclass(FalseVflError, ValueError)


@pytest.mark.parametrize("protocol", SECURE)
def test_secure_protocols_refuse_two_parties_unless_the_disclosure_is_acknowledged(protocol, refused):
    """At K = 2 the sum minus the active party's own contribution is the other party's: refused by default."""
    code, err = run_cli(["--protocol", protocol, "--parties", "2"])
    assert code == 2 and "hides nothing" in err and "--allow-two-party-disclosure" in err
    refused("cli option")
    from falsevfl_secure.transport.protocols import PROTOCOLS

    PROTOCOLS[protocol].check_parties(2, acknowledged=True)  # the flag lets it run
    PROTOCOLS["plain"].check_parties(2)  # plain claims nothing
    assert "hide nothing from the active party" in " ".join(_help().split())  # the help states the disclosure


def _help() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        simulate.parse_args(["--help"])
    return out.getvalue()


def test_unusable_output_and_checkpoint_folders_are_refused_before_any_work(tmp_path, refused):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for argv, message in ((["--out", str(blocker)], "is a file"),
                          (["--checkpoint-dir", str(blocker)], "is a file"),
                          (["--out", str(blocker / "sub")], "cannot be written")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = simulate.main([*argv, "--quiet", "--pretrain-epochs", "0", "--train-epochs", "0"])
        assert code == 2 and message in err.getvalue() and "Traceback" not in err.getvalue(), err.getvalue()
        refused("cli option")


def test_resume_refuses_another_configuration_naming_it_and_says_when_there_is_nothing(tmp_path, refused):
    def cli(*argv: str) -> tuple[int, str]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = simulate.main([*argv, "--quiet", "--preset", "quick", "--out", str(tmp_path / "run")])
        return code, err.getvalue()

    code, err = cli("--resume")
    assert code == 2 and "nothing to resume" in err
    refused("cli option")
    assert cli("--pretrain-epochs", "1", "--train-epochs", "1")[0] == 0
    for argv, setting in ((["--seed", "3"], "seed: 0 -> 3"), (["--variant", "II"], "variant: 'I' -> 'II'"),
                          (["--parties", "2"], "parties: 4 -> 2")):
        code, err = cli("--resume", "--pretrain-epochs", "1", "--train-epochs", "1", *argv)
        assert code == 2 and "another configuration" in err and setting in err and "Traceback" not in err, err
        refused("cli option")


def test_a_fifo_device_or_folder_where_a_file_is_read_is_one_error_not_a_wait(tmp_path, refused):
    # A fuzzer's FIFO as the federation file (and as score's predictions) hung the command: opening a FIFO to read
    # waits for a writer. Each is now refused at once, in a real process (a wait would end at the timeout).
    import os
    import subprocess
    import sys

    from falsevfl_secure import fsio

    fifo = tmp_path / "federation.toml"
    os.mkfifo(fifo)
    for place in (fifo, tmp_path, "/dev/null"):
        with pytest.raises(OSError, match="not a regular file"):
            fsio.read_regular(place)
    (tmp_path / "truth.csv").write_text("id,label\na,1\n")
    for argv in (["check", "--config", str(fifo)],
                 ["score", "--predictions", str(fifo), "--truth", str(tmp_path / "truth.csv")]):
        done = subprocess.run([sys.executable, "-m", "falsevfl_secure.federation", *argv], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith("error: ") and "not a regular file" in done.stderr, done.stderr
        refused("config")
