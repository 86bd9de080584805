"""What every federation run reports: the tabular metrics, the active party's own reference and the lift
over it, the warnings, the schedule sized by the table, and stage 2's choice of its best epoch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

from falsevfl_secure.config import AUTO_BATCH, AUTO_EPOCHS, Config, Stage, StageConfig, sized_schedule
from falsevfl_secure.methods import make_config
from falsevfl_secure.metrics import classification_metrics, expected_calibration_error
from falsevfl_secure.reference import fit_reference, lift_lines, lift_report


def test_ece_of_a_hand_computed_example():
    p = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
    y = np.array([0, 1, 1, 1])
    # bins of width 1/15: 0.9 -> bin 13 (acc 1), 0.8 -> bin 12 (acc 0), 0.7 -> bin 10 (acc 1), 0.6 -> bin 9 (acc 1)
    expected = 0.25 * (abs(1 - 0.9) + abs(0 - 0.8) + abs(1 - 0.7) + abs(1 - 0.6))
    assert expected_calibration_error(p, y) == pytest.approx(expected)


# a drawn prediction may name a class no drawn truth has: scikit-learn says so, and the metrics must still agree
@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
@settings(max_examples=30, deadline=None)
@given(n=st.integers(4, 60), classes=st.integers(2, 5), seed=st.integers(0, 2**31))
def test_classification_metrics_agree_with_scikit_learn(n, classes, seed):
    rng = np.random.default_rng(seed)  # test data only
    p = rng.dirichlet(np.ones(classes), size=n)
    y = np.concatenate([np.arange(classes), rng.integers(0, classes, n - classes)]) if n >= classes else \
        rng.integers(0, classes, n)
    got = classification_metrics(p, y)
    assert got["log_loss"] == pytest.approx(skm.log_loss(y, p, labels=np.arange(classes)), rel=1e-6)
    assert got["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(y, p.argmax(1)))
    if np.unique(y).size == classes:
        auc = skm.roc_auc_score(y, p[:, 1]) if classes == 2 else skm.roc_auc_score(y, p, multi_class="ovr")
        assert got["roc_auc"] == pytest.approx(auc)


def _placed(n: int, seed: int):
    from falsevfl_secure.federation.aligned import Placed

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return Placed(x, np.ones((n, 3), dtype=bool), np.ones(n, dtype=bool)), x


def test_the_reference_learns_from_the_active_partys_own_columns_and_the_lift_compares_on_the_same_records():
    placed, x = _placed(600, 0)
    y = (x[:, 0] + 0.3 * np.random.default_rng(1).normal(size=600) > 0).astype(np.int64)
    train, rows = np.arange(400), np.arange(400, 600)
    refs = fit_reference(placed, y, train, rows, "classification", 2, 0)
    assert skm.roc_auc_score(y[rows], refs["linear"]["predictions"][:, 1]) > 0.9
    coin = np.full((200, 2), 0.5)
    report = lift_report("classification", coin, refs, y[rows])
    assert report["metric"] == "roc_auc" and report["lift"] < -0.3 and report["records"] == 200
    lines = lift_lines(report)
    assert lines[0].startswith("lift: federation roc_auc 0.5000")
    assert sum(line.startswith("warning: ") for line in lines) == 2  # no lift, and one class for every record
    assert 'Try preset = "auto"' in lines[1] and 'method = "plugvfl"' in lines[1]
    assert 'numeric_encoding = "quantile"' in lines[1]
    tried = make_config("digits", "auto", class_weight="balanced", numeric_encoding="quantile").to_dict()
    said = lift_lines(report, tried)[1]  # what a run did is not suggested
    assert "preset" not in said and "discriminator_inputs" not in said and "class_weight" not in said, said
    assert "numeric_encoding" not in said, said
    crowded_only = make_config("digits", "auto").to_dict()  # "auto" scores the crowded columns only: quantile is new
    assert 'numeric_encoding = "quantile" (every numeric column' in lift_lines(report, crowded_only)[1]
    assert "Check with `federation check`" in said and 'method = "plugvfl"' in said
    regression = {**make_config("digits", "quick").to_dict(), "task": "regression"}  # no classes to weigh
    assert "class_weight" not in lift_lines(report, regression)[1] and "preset" in lift_lines(report, regression)[1]
    # a privacy reviewer's trial: under a budget it advised more steps (920 releases a row) and a refused baseline
    from falsevfl_secure.config import PrivacyConfig

    budget = make_config("digits", "auto", privacy=PrivacyConfig(epsilon=8.0, noise_multiplier=4.0)).to_dict()
    said = lift_lines(report, budget)[1]
    assert "auto_schedule" not in said and "plugvfl" not in said and "fewer releases per row" in said, said
    better = lift_report("classification", np.stack([1 - y[rows], y[rows]], 1).astype(float), refs, y[rows])
    assert better["lift"] >= 0 and not any(line.startswith("warning") for line in lift_lines(better))


def test_regression_lift_is_in_the_targets_unit():
    placed, x = _placed(300, 2)
    y = (2 * x[:, 1]).astype(np.float32)
    refs = fit_reference(placed, y, np.arange(200), np.arange(200, 300), "regression", 1, 0)
    report = lift_report("regression", y[200:] + 0.5, refs, y[200:], inverse=lambda v: 10 * v)
    assert report["metric"] == "rmse" and report["federation"]["rmse"] == pytest.approx(5.0, rel=1e-5)


@settings(max_examples=50, deadline=None)
@given(rows=st.integers(1, 2_000_000), labeled=st.integers(1, 2_000_000))
def test_the_sized_schedule_stays_within_its_bounds_and_grows_batches_with_the_table(rows, labeled):
    cfg = sized_schedule(make_config("digits", "auto"), rows, labeled)
    for stage, settings_ in ((Stage.PRETRAIN, cfg.pretrain), (Stage.TRAIN, cfg.train)):
        assert AUTO_BATCH[stage][0] <= settings_.batch_size <= AUTO_BATCH[stage][1]
        assert AUTO_EPOCHS[stage][0] <= settings_.epochs <= AUTO_EPOCHS[stage][1]
    bigger = sized_schedule(make_config("digits", "auto"), rows * 4, labeled)
    assert bigger.pretrain.batch_size >= cfg.pretrain.batch_size
    assert make_config("digits", "auto").options["discriminator_inputs"] == "latent+mean+own"
    assert sized_schedule(make_config("digits", "paper"), rows, labeled) == make_config("digits", "paper")


def test_stage_two_keeps_its_best_epoch_on_the_validation_records():
    from falsevfl_secure.data.synthetic import synthetic_split
    from falsevfl_secure.methods import build_node
    from falsevfl_secure.node import host_split
    from falsevfl_secure.randomness import RoleSecret
    from falsevfl_secure.train import fit, predict_split
    from falsevfl_secure.transport.in_process import LocalTransport

    torch.set_num_threads(1)
    cfg = Config(dataset="synthetic", parties=3, h_dim=8, z_dim=4, party_hidden=16, global_hidden=16,
                 discriminator_hidden=16, kappa=2, predict_samples=4, pretrain=StageConfig(2e-3, 32, 2),
                 train=StageConfig(5e-2, 16, 6))
    split = synthetic_split(n=120, parties=3, width=4, p_missing=0.2, seed=3)
    data = host_split(split.view([0, 1, 2], True), torch.device("cpu"), 3)
    held_out = host_split(synthetic_split(n=40, parties=3, width=4, p_missing=0.2, seed=4).view([0, 1, 2], True),
                          torch.device("cpu"), 3)
    secrets = {k: RoleSecret.for_tests(5, k) for k in range(3)}
    node = build_node(cfg, {k: 4 for k in range(3)}, 3, LocalTransport(3, 2), torch.device("cpu"), secrets)
    result = fit(node, data, progress=False, validation=held_out)
    chosen = result.selection
    assert len(chosen["per_epoch"]) == 6 and chosen["best"] == min(chosen["per_epoch"])
    assert chosen["per_epoch"][chosen["best_epoch"] - 1] == chosen["best"]  # epochs counted from 1
    p = predict_split(node, held_out).get().numpy()  # the restored discriminator scores what was recorded
    loss = -np.mean(np.log(np.clip(p[np.arange(40), held_out.y.get().numpy()], 1e-12, None)))
    assert loss == pytest.approx(chosen["best"], rel=1e-4)


def test_the_active_partys_own_trees_score_each_training_row_out_of_fold_and_refit_the_same_at_predict(tmp_path):
    from falsevfl_secure.reference import own_scores, refit_scores, save_own_rows

    placed, x = _placed(300, 3)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    labeled = np.arange(0, 300, 2)
    fits = []
    scores = own_scores(placed, y, labeled, "classification", 2, 0, each=lambda: fits.append(1))
    assert len(fits) == 1 + 5  # the full fit and 5 folds: the party's progress after each (RECV_TIMEOUT_S)
    assert scores.shape == (300, 1) and scores.dtype == np.float32
    assert skm.roc_auc_score(y[labeled], scores[labeled, 0]) > 0.8  # informative, though out of fold
    flipped = y.copy()
    flipped[labeled[0]] = 1 - flipped[labeled[0]]  # a row's own label never reaches its own score
    assert own_scores(placed, flipped, labeled, "classification", 2, 0)[labeled[0]] == scores[labeled[0]]
    save_own_rows(tmp_path, placed, y, labeled)
    again = refit_scores(tmp_path, placed, "classification", 2, 0)
    unlabeled = np.setdiff1d(np.arange(300), labeled)
    np.testing.assert_allclose(again[unlabeled], scores[unlabeled], rtol=1e-5)


def test_the_own_linear_models_score_joins_the_trees_out_of_fold_and_refits_the_same_at_predict(tmp_path):
    """own_reference_models = "hgb+linear": the trees' column as before, then the logistic regression's logit,
    which for an unlabeled row is that of scikit-learn's pipeline fitted on every labeled row (independent
    fit), for a labeled row one fitted without it."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from falsevfl_secure.model.trees import BAG
    from falsevfl_secure.reference import FOLDS, own_scores, refit_scores, save_own_rows
    from falsevfl_secure.train import solo_work_units

    placed, x = _placed(300, 4)
    y = (x[:, 0] - 0.5 * x[:, 2] + 0.3 * np.random.default_rng(2).normal(size=300) > 0).astype(np.int64)
    labeled, unlabeled = np.arange(0, 300, 2), np.arange(1, 300, 2)
    fits = []
    scores = own_scores(placed, y, labeled, "classification", 2, 0, each=lambda: fits.append(1),
                        kinds=("hgb", "linear"))
    cfg = make_config("digits", "quick", discriminator_inputs="latent+own", own_reference=True,
                      own_reference_models="hgb+linear")
    assert len(fits) == 2 * (1 + FOLDS) == solo_work_units(cfg) - cfg.train.epochs - BAG  # each fit shows progress
    assert scores.shape == (300, 2) and scores.dtype == np.float32
    np.testing.assert_array_equal(scores[:, :1], own_scores(placed, y, labeled, "classification", 2, 0))
    full = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(x[labeled], y[labeled])
    np.testing.assert_allclose(scores[unlabeled, 1], full.decision_function(x[unlabeled]), rtol=1e-4, atol=1e-4)
    first, rest = labeled[:30], labeled[30:]  # 150 labeled rows, the first fold of five in row order
    fold = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(x[rest], y[rest])
    np.testing.assert_allclose(scores[first, 1], fold.decision_function(x[first]), rtol=1e-4, atol=1e-4)
    assert skm.roc_auc_score(y[labeled], scores[labeled, 1]) > 0.85  # informative, though out of fold
    flipped = y.copy()
    flipped[labeled[0]] = 1 - flipped[labeled[0]]  # a row's own label never reaches its own score
    again = own_scores(placed, flipped, labeled, "classification", 2, 0, kinds=("hgb", "linear"))
    # ... while the models of the other folds read it (the last row is in another fold: folds are in row order)
    assert again[labeled[0], 1] == scores[labeled[0], 1] and again[labeled[-1], 1] != scores[labeled[-1], 1]
    save_own_rows(tmp_path, placed, y, labeled)
    np.testing.assert_allclose(refit_scores(tmp_path, placed, "classification", 2, 0, ("hgb", "linear"))[unlabeled],
                               scores[unlabeled], rtol=1e-5)


def test_the_own_linear_model_needs_own_reference():
    from falsevfl_secure.errors import InputError

    with pytest.raises(InputError, match='own_reference_models = "hgb\\+linear" needs own_reference = true'):
        make_config("digits", "quick", own_reference_models="hgb+linear")


@pytest.mark.parametrize(("device", "error"), [("cpu", None), ("auto", None), ("tpu", "choose auto, cpu or cuda"),
                                               ("cuda", None if torch.cuda.is_available() else "no CUDA device")])
def test_each_party_chooses_its_own_device_in_its_file(tmp_path, device, error):
    from falsevfl_secure.errors import InputError
    from falsevfl_secure.federation.config import load_federation
    from falsevfl_secure.federation.tables_demo import Spec, write_federation

    path = write_federation(tmp_path, Spec(model=f'device = "{device}"\n')).path
    if error is None:
        fed = load_federation(path)
        assert fed.model.device == device and "device" not in fed.model.training_settings()
    else:
        with pytest.raises(InputError, match=error):
            load_federation(path)


def test_numpy_values_are_written_as_json_numbers(tmp_path):
    import json

    from falsevfl_secure.fsio import write_json

    write_json(tmp_path / "r.json", {"passed": np.bool_(True), "n": np.int64(3), "x": np.float32(0.5),
                                     "a": np.arange(2)})
    assert json.loads((tmp_path / "r.json").read_text()) == {"passed": True, "n": 3, "x": 0.5, "a": [0, 1]}
    with pytest.raises(TypeError):
        write_json(tmp_path / "bad.json", {"s": {1, 2}})


def test_numbers_written_with_decimal_commas_are_refused_not_read_as_categories(tmp_path):
    from falsevfl_secure.data.errors import DataError
    from falsevfl_secure.data.tables import ReadOptions, read_party_table

    path = tmp_path / "t.csv"
    path.write_text('id,income,region\na,"1,5",north\nb,"2,25",south\n')
    with pytest.raises(DataError, match="decimal comma") as error:
        read_party_table(path, "bank", "id")
    assert "income" in str(error.value) and "line 2" in str(error.value)
    table = read_party_table(path, "bank", "id", options=ReadOptions(categorical=("income",)))
    assert table.categorical == ("income", "region")  # listed: its values are categories, as the user says


@pytest.mark.parametrize("kill_at", [3, 5])  # mid stage 2; after its last epoch (only the trees were left)
def test_a_resumed_stage_two_chooses_among_every_epoch_as_an_uninterrupted_run(tmp_path, kill_at):
    """Review finding: the stage-2 choice was not in any checkpoint, so a resumed run chose among the epochs
    after the resume only, or (resumed after the last epoch) kept the last one. The active party's checkpoint
    keeps it now: the resumed run chooses the same epoch and ends with the same discriminator."""
    from falsevfl_secure.data.synthetic import synthetic_split
    from falsevfl_secure.methods import build_node
    from falsevfl_secure.node import host_split
    from falsevfl_secure.randomness import RoleSecret
    from falsevfl_secure.train import fit
    from falsevfl_secure.transport.in_process import LocalTransport

    torch.set_num_threads(1)
    cfg = Config(dataset="synthetic", parties=3, h_dim=8, z_dim=4, party_hidden=16, global_hidden=16,
                 discriminator_hidden=16, kappa=2, predict_samples=4, pretrain=StageConfig(2e-3, 32, 2),
                 train=StageConfig(5e-2, 16, 6))
    data = host_split(synthetic_split(n=120, parties=3, width=4, p_missing=0.2, seed=3).view([0, 1, 2], True),
                      torch.device("cpu"), 3)
    held_out = host_split(synthetic_split(n=40, parties=3, width=4, p_missing=0.2, seed=4).view([0, 1, 2], True),
                          torch.device("cpu"), 3)

    def node():
        secrets = {k: RoleSecret.for_tests(5, k) for k in range(3)}
        return build_node(cfg, {k: 4 for k in range(3)}, 3, LocalTransport(3, 2), torch.device("cpu"), secrets)

    class Interrupt(Exception):
        pass

    def killer(stage, epoch, optimizers):
        if (stage, epoch) == (Stage.TRAIN, kill_at):
            raise Interrupt

    whole = node()
    reference = fit(whole, data, tmp_path / "a", progress=False, validation=held_out).selection
    with pytest.raises(Interrupt):
        fit(node(), data, tmp_path / "b", progress=False, validation=held_out, after_epoch=killer)
    resumed_node = node()
    resumed = fit(resumed_node, data, tmp_path / "b", resume=True, progress=False, validation=held_out).selection
    assert resumed == reference and len(resumed["per_epoch"]) == 6
    for a, b in zip(whole.active.get().model.discriminator.parameters(),
                    resumed_node.active.get().model.discriminator.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_stage_two_that_kept_its_last_epoch_says_more_epochs_may_help():
    # A trial's large table kept epoch 18 of 18 (log loss 0.3464 -> 0.3262, still falling) and nothing said so.
    from falsevfl_secure.federation.quality import selection_lines

    falling = {"metric": "log_loss", "per_epoch": [0.35, 0.34, 0.33], "best_epoch": 3}
    assert selection_lines(falling) == ["note: stage 2 kept its last epoch (3 of 3): its validation log loss was "
                                        "still improving; more stage-2 epochs may help: [model.train] epochs = 6"]
    # a trial: under the auto schedule, which sizes the epochs itself, [model.train] epochs alone changes nothing
    from falsevfl_secure.config import Config, sized_schedule

    sized = sized_schedule(Config(auto_schedule=True), 35_000, 4_000).to_dict()
    (line,) = selection_lines(falling, sized)
    assert line.endswith(f"may help: auto_schedule = false in [model], [model.pretrain] epochs = "
                         f"{sized['pretrain']['epochs']} and batch_size = {sized['pretrain']['batch_size']}, "
                         f"[model.train] epochs = 6 and batch_size = {sized['train']['batch_size']}"), line
    assert selection_lines({**falling, "best_epoch": 2}) == []  # an earlier epoch was best: enough epochs
    assert selection_lines({**falling, "per_epoch": [0.3], "best_epoch": 1}) == []  # one epoch: nothing to tell
    assert selection_lines(None) == [] and selection_lines({}) == []


def test_a_class_never_predicted_is_named_and_a_balanced_weighting_below_the_majority_is_noted():
    """Multi-class trial (7 classes): the rarest got 1 prediction in 3,860, Climb a recall of 8 %, and nothing said
    so; with class_weight = "balanced" the accuracy fell below the most common class's share, and nothing said so.
    A class of at least 5 validation records that no record is predicted as is named (with its records); a class of
    4 is not; under "balanced" the accuracy's fall is noted."""
    placed, _ = _placed(90, 3)
    y = np.repeat([0, 1, 2, 3], [50, 25, 10, 4])[np.random.default_rng(4).permutation(89)]
    refs = fit_reference(placed, np.concatenate([y, [0]]), np.arange(60), np.arange(89), "classification", 4, 0)
    probabilities = np.full((89, 4), 0.1)
    probabilities[np.arange(89), np.where(y == 2, 0, y)] = 0.7  # class 2 (10 records) always read as class 0
    probabilities[np.flatnonzero(y == 3), 0] = 0.8  # class 3 (4 records) never predicted either: too few to name
    report = {**lift_report("classification", probabilities, refs, y), "classes": ["Approach", "Climb", "Taxi", "En"]}
    assert report["federation"]["support"] == [50, 25, 10, 4] and report["federation"]["hits"] == [50, 25, 0, 0]
    warned = [line for line in lift_lines(report) if "was predicted as it" in line]
    assert warned == ["warning: no validation record of class 'Taxi' (10) was predicted as it (its validation "
                      "records in parentheses): class_weight = \"balanced\" in [model] weighs rare classes up (it "
                      "trades accuracy for balanced accuracy)"], lift_lines(report)
    balanced = make_config("digits", "auto", class_weight="balanced").to_dict()
    assert "more records of it" in next(line for line in lift_lines(report, balanced) if "Taxi" in line)
    assert not any(line.startswith("note:") for line in lift_lines(report, balanced))  # accuracy 84 % above 56 %
    skewed = probabilities.copy()
    skewed[np.flatnonzero(y == 0)[:30]] = [0.1, 0.1, 0.1, 0.7]  # 30 of the 50 most common read as the rarest
    report = {**lift_report("classification", skewed, refs, y), "classes": None}
    assert report["federation"]["accuracy"] < report["federation"]["majority"] == pytest.approx(50 / 89)
    note = [line for line in lift_lines(report, balanced) if line.startswith("note:")]
    assert note and "accuracy (50.6 %) is below the most common class's share (56.2 %)" in note[0], note
    assert not any(line.startswith("note:") for line in lift_lines(report))  # unweighted: nothing was traded


def _coded_table(n: int, seed: int):
    """A block of one categorical column of 30 categories (one-hot cells; some missing, some records not held) and
    one numeric cell; the label: the category is in a drawn half of them, or the number is large."""
    from falsevfl_secure.federation.aligned import Placed

    rng = np.random.default_rng(seed)  # test data only
    code, number = rng.integers(0, 30, n), rng.normal(size=n)
    y = (np.isin(code, rng.permutation(30)[:15]) ^ (number > 1.2)).astype(np.int64)
    x = np.hstack([np.eye(30)[code], number[:, None]]).astype(np.float32)
    observed, held = np.ones_like(x, dtype=bool), rng.random(n) > 0.1
    missing = rng.random(n) < 0.1
    x[missing, :30], observed[missing, :30] = 1 / 30, False  # a missing category: its cells filled with shares
    known = held & ~missing
    coded = np.column_stack([np.where(known, code, np.nan), np.where(held, number, np.nan)])
    return Placed(x, observed, held), y, coded


def test_the_own_trees_read_a_categorical_column_as_its_code_as_scikit_learn_does_and_refit_so_at_predict(tmp_path):
    """The own models' trees (own_reference and the lift's reference) split the category's code as a set of
    categories, as the trees after stage 2 read it: their scores are scikit-learn's on the codes built by hand,
    not on the 30 one-hot cells; `predict` refits the same from the saved rows and groups."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    from falsevfl_secure.reference import own_scores, refit_scores, save_own_rows

    placed, y, coded = _coded_table(1200, 3)
    labeled, rows = np.arange(0, 1200, 2), np.arange(1, 1200, 2)
    truth = HistGradientBoostingClassifier(random_state=0, categorical_features=[True, False])
    p = truth.fit(coded[labeled], y[labeled]).predict_proba(coded[rows])
    refs = fit_reference(placed, y, labeled, rows, "classification", 2, 0, groups=((0, 30),))
    np.testing.assert_allclose(refs["hgb"]["predictions"], p, rtol=1e-6, atol=1e-9)
    scores = own_scores(placed, y, labeled, "classification", 2, 0, groups=((0, 30),))
    np.testing.assert_allclose(scores[rows, 0], np.log(np.clip(p[:, 1], 1e-6, 1)) - np.log(np.clip(p[:, 0], 1e-6, 1)),
                               rtol=1e-4, atol=1e-4)
    save_own_rows(tmp_path, placed, y, labeled, ((0, 30),))
    np.testing.assert_allclose(refit_scores(tmp_path, placed, "classification", 2, 0)[rows], scores[rows], rtol=1e-5)


def test_own_rows_saved_before_the_codes_refit_on_the_cells_and_forged_groups_are_one_error_line(tmp_path):
    from falsevfl_secure.errors import InputError
    from falsevfl_secure.reference import SAVED, own_scores, refit_scores, save_own_rows

    placed, y, _ = _coded_table(400, 4)
    labeled = np.arange(0, 400, 2)
    save_own_rows(tmp_path, placed, y, labeled)  # no groups: every cell a number, as rows saved before them
    rows = np.arange(1, 400, 2)  # unlabeled: scored by the full fit (labeled rows out of fold)
    np.testing.assert_allclose(refit_scores(tmp_path, placed, "classification", 2, 0)[rows],
                               own_scores(placed, y, labeled, "classification", 2, 0)[rows], rtol=1e-5, atol=1e-6)
    for forged in ([[0, 40]], [[5, 3]], [[0, 10], [5, 20]], [[-1, 3]], [0, 30]):
        with np.load(tmp_path / SAVED) as saved:
            kept = dict(saved)
        np.savez(tmp_path / SAVED, **{**kept, "groups": np.asarray(forged)})
        with pytest.raises(InputError, match=f"{SAVED}: not the active party's own rows .*categorical groups"):
            refit_scores(tmp_path, placed, "classification", 2, 0)


def _bootstrap_by_hand(task, fed, ref, truth):
    """The paired bootstrap with scikit-learn's metrics on the same public resamples (independent of `metrics`)."""
    from falsevfl_secure.randomness import PublicStream, public_rng

    rng, lifts = public_rng(0, PublicStream.LIFT_BOOTSTRAP), []
    for _ in range(200):
        rows = rng.integers(0, len(truth), len(truth))
        if task == "regression":
            lifts.append(skm.root_mean_squared_error(truth[rows], ref[rows])
                         - skm.root_mean_squared_error(truth[rows], fed[rows]))
        elif np.unique(truth[rows]).size == 2:
            lifts.append(skm.roc_auc_score(truth[rows], fed[rows, 1]) - skm.roc_auc_score(truth[rows], ref[rows, 1]))
    return np.percentile(lifts, [2.5, 97.5])


@settings(max_examples=8, deadline=None)
@example(n=30, seed=0, task="regression", scale=1e-3)  # the interval's six decimals at a target in thousandths
@given(n=st.integers(30, 400), seed=st.integers(0, 2**31), task=st.sampled_from(["classification", "regression"]),
       scale=st.sampled_from([1e-3, 1.0, 1e5]))
def test_the_lifts_interval_is_the_paired_bootstrap_of_the_primary_metric(n, seed, task, scale):
    from falsevfl_secure.reference import lift_interval

    rng = np.random.default_rng(seed)  # test data only
    signal = rng.normal(size=n)
    if task == "classification":
        truth = (signal + rng.normal(size=n) > 0).astype(np.int64)
        fed, ref = (np.column_stack([1 - p, p]) for p in (1 / (1 + np.exp(-(signal + rng.normal(size=n) * w)))
                                                            for w in (0.5, 2.0)))
    else:
        truth = scale * signal
        fed, ref = (scale * (signal + rng.normal(size=n) * w) for w in (0.5, 2.0))
    got = lift_interval(task, fed, ref, truth, task == "classification")
    np.testing.assert_allclose(got, _bootstrap_by_hand(task, fed, ref, truth), rtol=1e-5, atol=1e-6)  # (6 decimals)


def test_a_lift_too_few_validation_records_can_tell_is_a_warning_and_a_clear_one_is_not():
    # A trial (attrition, 118 validation records, 16 positive): "lift ... +0.1085 on 118 validation records" and no
    # warning, where the held-out records scored the federation below the active party alone in 6 runs of 9.
    rng = np.random.default_rng(4)  # test data only
    for n, noise, warned in ((118, 1.0, True), (4000, 1.0, False)):
        signal = rng.normal(size=n)
        y = (signal + rng.normal(size=n) > 0.8).astype(np.int64)
        fed = signal + noise * rng.normal(size=n)
        ref = signal + 1.15 * noise * rng.normal(size=n)  # slightly worse: a small true lift
        refs = {"linear": {"predictions": np.column_stack([1 - _sig(ref), _sig(ref)]), "fit_s": 0.0},
                "hgb": {"predictions": np.column_stack([1 - _sig(ref), _sig(ref)]), "fit_s": 0.0}}
        report = lift_report("classification", np.column_stack([1 - _sig(fed), _sig(fed)]), refs, y)
        low, high = report["lift_interval"]
        lines = lift_lines(report)
        assert low < report["lift"] < high and ("95 % interval" in lines[0])
        assert report["lift"] > 0, report["lift"]
        assert any("too few to tell" in line for line in lines) == warned == (low <= 0), (lines, low)
        older = {k: v for k, v in report.items() if k != "lift_interval"}  # a train_result.json written before it
        assert not any("too few to tell" in line or "interval" in line for line in lift_lines(older))


def _sig(v):
    return 1 / (1 + np.exp(-v))
