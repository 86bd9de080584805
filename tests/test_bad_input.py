"""Bad input at the public entry points gives a clear error of a documented type, never a raw
traceback from inside torch, numpy, scikit-learn, CrypTen or TenSEAL. The CLI is fuzzed."""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure import simulate
from falsevfl_secure.config import make_config
from falsevfl_secure.data import DataError, parse_mechanism
from falsevfl_secure.errors import FalseVflError, InputError

BAD_OPTIONS = [
    ["--seed", "-1"], ["--seed", str(2**40)], ["--parties", "1"], ["--parties", "0"], ["--parties", "3"],
    ["--parties", "100"], ["--train-mechanism", "mcar:1.5"], ["--train-mechanism", "mnar:-0.1"],
    ["--train-mechanism", "dirichlet:0"], ["--train-mechanism", "mar3"], ["--pretrain-epochs", "-1"],
    ["--train-epochs", "-5"], ["--threads", "0"], ["--protocol", "mpc", "--runtime", "local"],
    ["--dataset", "mnist"], ["--preset", "huge"], ["--variant", "III"], ["--device", "tpu"],
    ["--parties", "two"], ["--protocol", "tls"],
]


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = simulate.main([*argv, "--quiet", "--out", "/tmp/falsevfl-bad-input"])
        except SystemExit as exit_:  # argparse's own refusal: usage plus one error line, exit 2
            code = exit_.code
    return code, err.getvalue()


@pytest.mark.parametrize("argv", BAD_OPTIONS, ids=[" ".join(a) for a in BAD_OPTIONS])
def test_bad_cli_arguments_give_one_clear_error(argv, refused):
    code, err = run_cli(argv)
    assert code == 2
    assert "error" in err and "Traceback" not in err
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


def test_documented_types_are_value_errors():
    assert issubclass(DataError, FalseVflError) and issubclass(InputError, FalseVflError)
    assert issubclass(FalseVflError, ValueError)
