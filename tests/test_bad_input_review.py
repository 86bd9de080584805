"""Bad inputs a new user's session found (a fuzzing review of every command): each now gets one `error:` line
and a non-zero exit, and nothing of the user's is overwritten. Before, each of these ended in a traceback,
exited 0, or silently did something else (the comment of each case says what)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from federation_cli import cli

from falsevfl_secure import simulate


@pytest.fixture
def demo(tmp_path) -> Path:
    """A freshly written tables demo (three parties; nothing trained)."""
    assert cli("demo", "--dataset", "wine", "--parties", "3", "--out", str(tmp_path / "fed"))[0] == 0
    return tmp_path / "fed"


def _one_error(code: int, err: str, words: str) -> None:
    assert code != 0 and words in err and "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.startswith("error")], err


@pytest.mark.parametrize("target", ["federation.toml", "clinic/predict.csv", "keys/lab.key", "lab/model/privacy.json"])
def test_predictions_are_never_written_over_an_input_of_the_federation(demo, target, refused):
    # (it replaced the federation file or the party's own table with the predictions, exit 0)
    path = demo / target
    before = path.read_bytes() if path.exists() else None
    code, _, err = cli("predict", "--config", str(demo / "federation.toml"), "--out", str(path))
    _one_error(code, err, "that is an input of the federation")
    assert (path.read_bytes() if path.exists() else None) == before
    refused("cli")


def test_a_demo_never_replaces_a_federation_already_there(demo, refused):
    # (it replaced every identity key, the tables and federation.toml, exit 0)
    key = (demo / "keys" / "lab.key").read_bytes()
    code, _, err = cli("demo", "--dataset", "wine", "--parties", "3", "--out", str(demo))
    _one_error(code, err, "a federation is there already")
    assert (demo / "keys" / "lab.key").read_bytes() == key
    code, _, err = cli("demo", "--dataset", "wine", "--out", str(demo.parent / "other"), "--seed", "-1")
    _one_error(code, err, "--seed -1")  # (numpy's ValueError)
    refused("cli")


@pytest.mark.parametrize("argv, words", [
    (["--dataset", "digits", "--missing", "0.2"], "--missing applies to the table"),
    (["--dataset", "digits", "--mixed-ids"], "--mixed-ids applies to the table"),
    (["--dataset", "wine", "--test-pattern", "mcar:0"], "--test-pattern applies to a benchmark's split")])
def test_a_demo_refuses_a_flag_of_the_other_kind_of_demo(tmp_path, argv, words, refused):
    # (a fuzzer's --missing 0.2 on digits wrote a demo without a missing cell, exit 0)
    code, _, err = cli("demo", *argv, "--out", str(tmp_path / "fed"))
    _one_error(code, err, words)
    assert not (tmp_path / "fed").exists()
    refused("cli")


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace('name = "lab"', 'name = "../../x y"'), "name = '../../x y'"),  # (a key file outside)
    (lambda t: t.replace("[model]", '[model]\nauto_schedule = "no"'), "auto_schedule='no': true or false"),
    (lambda t: t.replace("[model]", '[model]\nselect_best = "false"'), "select_best='false': true or false"),
    (lambda t: t.replace("[[party]]", "[privacy]\nepsilon = 1.0\nnoise_multiplier = 1e300\n\n[[party]]", 1),
     "[privacy] noise_multiplier = 1e+300 must be in [0.05, 10000]"),  # (the sampler's ValueError, two tracebacks)
    (lambda t: t.replace("[[party]]", "[privacy]\nepsilon = 1.0\nnoise_multiplier = 1\nclip_gradient = 1e300\n\n"
                         "[[party]]", 1), "clip_gradient=1e+300: a number in (0, 10000]"),
], ids=["party name a path", "bool as text", "bool as false text", "multiplier past the sampler", "clip past it"])
def test_a_setting_the_file_cannot_mean_is_refused_by_check(demo, edit, words, refused):
    path = demo / "federation.toml"
    path.write_text(edit(path.read_text()))
    code, _, err = cli("check", "--config", str(path))
    _one_error(code, err, words)
    refused("federation file")


def test_a_federation_file_saved_with_a_byte_order_mark_reads(demo):
    # (a Windows editor's BOM: "not a readable TOML file (Invalid statement (at line 1, column 1))")
    path = demo / "federation.toml"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    code, out, err = cli("check", "--config", str(path))
    assert code == 0, err
    for ends in (b"\r\n", b"\r"):  # and CRLF or an old Mac's CR line ends (a review: CR alone refused for a while)
        path.write_bytes(path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", ends))
        code, out, err = cli("check", "--config", str(path))
        assert code == 0, err


def test_a_regression_whose_labels_are_all_equal_is_refused_before_training(demo, refused):
    # (it trained, and validation read R^2 nan; classification refuses a single class likewise)
    path = demo / "federation.toml"
    path.write_text(path.read_text().replace('task = "classification"', 'task = "regression"'))
    table = demo / "clinic" / "train.csv"
    lines = table.read_text().splitlines()
    column = lines[0].split(",").index("outcome")
    rows = [line.split(",") for line in lines[1:]]
    for row in rows:
        row[column] = "7" if row[column] else ""
    table.write_text("\n".join([lines[0], *(",".join(row) for row in rows)]) + "\n")
    code, _, err = cli("check", "--config", str(path))
    _one_error(code, err, "a regression needs at least two different values")
    refused("table")


def test_scoring_refuses_an_id_given_twice(tmp_path, refused):
    # (the later row silently won, and the accuracy changed)
    (tmp_path / "truth.csv").write_text("id,label\na,x\nb,y\na,y\n")
    (tmp_path / "pred.csv").write_text("id,prediction,p_x,p_y\na,x,1,0\nb,y,0,1\n")
    code, _, err = cli("score", "--predictions", str(tmp_path / "pred.csv"), "--truth", str(tmp_path / "truth.csv"))
    _one_error(code, err, "appear more than once (e.g. 'a')")
    refused("cli")


@pytest.mark.parametrize("argv, words", [
    (["--epsilon", "1e-5"], "no noise multiplier up to 10000"),  # (scipy's brentq: f(a) and f(b) ...)
    (["--epsilon", "1", "--noise-multiplier", "1e10"], "a number in [0.05, 10000]"),  # (the sampler's scale)
])
def test_a_privacy_budget_no_noise_can_meet_is_one_error(argv, words, refused):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = simulate.main(["--dataset", "digits", "--pretrain-epochs", "1", "--train-epochs", "1", *argv])
    _one_error(code, err.getvalue(), words)
    refused("cli")


@pytest.mark.parametrize("argv, words", [
    (["--multiplier", "1e-300"], "propose-clips: --multiplier 1e-300 must be in [0.05, 10000]"),
    (["--multiplier", "inf"], "propose-clips: --multiplier inf must be in [0.05, 10000]"),
    (["--records", "0"], "propose-clips: --records 0 must be at least 1"),
    (["--quantile", "2", "--records", "-5"], "--quantile 2 must be in (0, 1); --records -5 must be at least 1")])
def test_a_clip_proposal_outside_its_range_is_refused(demo, argv, words, refused):
    # (a ValueError or OverflowError traceback; --records 0 and -5 were taken)
    path = demo / "federation.toml"
    path.write_text(path.read_text().replace("[[party]]", "[privacy]\nepsilon = 1.0\nnoise_multiplier = 1\n\n"
                                             "[[party]]", 1))
    code, _, err = cli("propose-clips", "--config", str(path), "--party", "lab", *argv)
    _one_error(code, err, words)  # (it listed every option's range, whichever was wrong)
    assert ("--quantile" in err) == ("--quantile" in argv) and ("--records" in err) == ("--records" in argv), err
    assert not (demo / "lab" / "model" / "privacy.json").exists()  # refused before anything was charged
    refused("cli")


@pytest.mark.parametrize("budget", ["", "[privacy]\nepsilon = 1.0\nnoise_multiplier = 1\n\n"])
def test_privacy_of_a_party_the_file_does_not_list_is_one_error(demo, budget, refused):
    # (without a budget: "bank: no privacy budget ... nothing is noised", exit 0, for a party nobody listed)
    path = demo / "federation.toml"
    path.write_text(path.read_text().replace("[[party]]", f"{budget}[[party]]", 1))
    code, _, err = cli("privacy", "--config", str(path), "--party", "bank")
    _one_error(code, err, "unknown party 'bank'; the parties are")
    refused("cli")


def test_check_says_what_a_passive_column_named_as_the_label_would_do(demo):
    # (it said only that the column had the label's name: a label copied to a passive party inflates every score)
    import csv
    import tomllib

    fed = tomllib.loads((demo / "federation.toml").read_text())
    label, passive = fed["federation"]["label_column"], fed["party"][1]
    for table in (demo / passive["train"], demo / passive["predict"]):
        rows = list(csv.reader(table.open(encoding="utf-8-sig")))
        with table.open("w", newline="", encoding="utf-8") as out:
            csv.writer(out).writerows([[*row, label if k == 0 else str(k % 2)] for k, row in enumerate(rows)])
    code, out, err = cli("check", "--config", str(demo / "federation.toml"), "--party", passive["name"])
    assert code == 0 and f"note: column {label!r} has the label column's name; it is a feature of party " in out, err
    assert "if it is the label (or computed from it), remove it" in out, out


def test_check_refuses_two_parties_under_a_protocol_that_hides_contributions_as_training_does(tmp_path, refused):
    # (check passed it, and train then refused at once)
    assert cli("demo", "--dataset", "wine", "--parties", "2", "--out", str(tmp_path / "two"))[0] == 0
    path = tmp_path / "two" / "federation.toml"
    code, _, err = cli("check", "--config", str(path))
    _one_error(code, err, "allow_two_party_disclosure = true")
    path.write_text(path.read_text().replace("[model]", "allow_two_party_disclosure = true\n[model]", 1))
    assert cli("check", "--config", str(path))[0] == 0
    refused("federation file")


def test_a_rendezvous_this_host_cannot_listen_on_is_one_error(demo, refused):
    # (grpc's RuntimeError "Failed to bind to address" as a traceback)
    path = demo / "federation.toml"
    path.write_text(path.read_text().replace("127.0.0.1:29611", "192.0.2.1:29691"))  # TEST-NET-1: on no host
    code, _, err = cli("train", "--config", str(path), "--party", "clinic")
    _one_error(code, err, "cannot listen on 192.0.2.1:29691")
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}  # (gRPC's own log line came first)
    run = subprocess.run([sys.executable, "-m", "falsevfl_secure.federation", "train", "--config", str(path), "--party",
                          "clinic"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode != 0 and [line for line in run.stderr.splitlines() if line.strip()] == \
        [line for line in run.stderr.splitlines() if line.startswith("error")] != [], run.stderr
    refused("federation file")


def test_scoring_a_truth_file_with_its_own_column_names_points_at_the_flags(tmp_path, refused):
    # a new user's truth file kept the data's names (customer_id, churn): the refusal did not say how to name them
    (tmp_path / "truth.csv").write_text("customer_id,churn\na,x\n")
    (tmp_path / "pred.csv").write_text("id,prediction,p_x,p_y\na,x,1,0\n")
    code, _, err = cli("score", "--predictions", str(tmp_path / "pred.csv"), "--truth", str(tmp_path / "truth.csv"))
    _one_error(code, err, "found columns 'customer_id', 'churn', 1 rows (name the truth's own columns with "
                          "--id-column and --label-column, or --config)")
    refused("cli")


def test_a_reader_that_leaves_early_ends_the_command_quietly(tmp_path):
    """`federation score ... | head -1` (operations trial): the reader closing the pipe ended in
    "error: : Broken pipe" and exit 2; now the command stops as a pipeline member does (141), saying nothing."""
    import os
    import subprocess
    import sys

    (tmp_path / "truth.csv").write_text("id,label\n" + "".join(f"r{i},{i % 3}\n" for i in range(50)))
    (tmp_path / "p.csv").write_text("id,prediction,parties_observed\n" +
                                    "".join(f"r{i},{i % 2},{1 + i % 2}\n" for i in range(50)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as a user's is
    proc = subprocess.Popen([sys.executable, "-m", "falsevfl_secure.federation", "score", "--predictions",
                             str(tmp_path / "p.csv"), "--truth", str(tmp_path / "truth.csv")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err


def test_check_notes_a_column_of_one_value(demo):
    """Operations trial: a column whose every present cell holds one value (a category, or a number) was taken
    in silence ("1 categories"); it tells the model nothing, and often means a broken export."""
    for table in ("train.csv", "predict.csv"):
        path = demo / "lab" / table
        lines = path.read_text(encoding="utf-8-sig").splitlines()
        extra = [",site,version"] + [",north,2" if i % 7 else ",north," for i in range(1, len(lines))]
        path.write_text("\n".join(a + b for a, b in zip(lines, extra, strict=True)) + "\n")
    code, out, err = cli("check", "--config", str(demo / "federation.toml"))
    assert code == 0, err
    assert "note: column 'site' has one value ('north') in every row that has one" in out, out
    assert "note: column 'version' has one value (2) in every row that has one" in out, out
    assert "column 'hue' has one value" not in out


def test_a_broken_pipe_that_is_not_stdouts_is_reported(capsys):
    """Only a reader of stdout that left ends a command quietly: a pipe to a child that died is an error."""
    from falsevfl_secure.cli import guarded

    def child_died() -> int:
        raise BrokenPipeError(32, "Broken pipe")

    assert guarded(child_died) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_a_mistyped_party_name_on_the_command_line_gets_the_closest_role(demo, refused):
    # (a trial's `check --party gsi` listed the roles without naming the one meant)
    for command in ("check", "train"):
        code, _, err = cli(command, "--config", str(demo / "federation.toml"), "--party", "Labb")
        _one_error(code, err, "--party 'Labb' is not a role of this run (did you mean 'lab'?); the roles are")
    refused("cli")


def test_check_notes_a_categorical_column_wide_enough_to_cost_memory(tmp_path):
    """Regression trial: a party's 532 occupation codes (544 of its encoded cells) made it peak at 1,250 MiB against
    470-560 for the others, and `check` said only '532 categories'. A column of at least 100 categories is named
    with its share of the party's encoded cells; one of 99 and an identifier-like one are not (the latter has its own
    note)."""
    assert cli("demo", "--dataset", "digits", "--parties", "4", "--out", str(tmp_path / "fed"))[0] == 0
    for table in ("train.csv", "predict.csv"):
        path = tmp_path / "fed" / "party1" / table
        lines = path.read_text(encoding="utf-8-sig").splitlines()
        extra = [",occupation,site"] + [f",o{i % 120},s{i % 99}" for i in range(1, len(lines))]
        path.write_text("\n".join(a + b for a, b in zip(lines, extra, strict=True)) + "\n")
    code, out, err = cli("check", "--config", str(tmp_path / "fed" / "federation.toml"))
    assert code == 0, err
    width = int(re.search(r"party .party1.: .* (\d+) encoded cells;", out).group(1))
    assert f"note: column 'occupation' has 120 categories, 120 of this party's {width} encoded cells: every row " \
           "carries them through its networks, so its memory and step time grow with them" in out, out
    assert "column 'site' has 99" not in out and out.count("memory and step time") == 1, out


def test_a_party_whose_table_fails_keeps_its_own_header_above_its_key_line(demo):
    """Multi-class trial: with one party's table refused (a column of numbers and text), its key line was printed
    under the party before it, as if that party's."""
    path = demo / "lab" / "train.csv"
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    path.write_text("\n".join([lines[0] + ",struck", *(f"{line},{'2-10' if k == 8 else k % 3}"
                                                        for k, line in enumerate(lines[1:]))]) + "\n")
    code, out, err = cli("check", "--config", str(demo / "federation.toml"))
    assert code != 0 and "column 'struck': the column mixes numbers and text" in err, err
    said = out.splitlines()
    key = next(k for k, line in enumerate(said) if "holds the key pinned for lab" in line)
    assert said[key - 1] == "party 'lab': its tables could not be read (its error is below)", said
