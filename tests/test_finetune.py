"""Fine-tuning a pretrained BERT on a task with the trainer: a run's checkpoint, its labels and tokenizer, its
scores; the task's loss, validation and metric; class weights, the linear schedule, early stopping, exact resume;
and a real fine-tune of the shipped MiniLM on a slice of SST-2 that must beat the majority class."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from sklearn.utils.class_weight import compute_class_weight

import attnkit
from attnkit.checkpoint import load_checkpoint, read_labels
from attnkit.config import TrainConfig, load_config
from attnkit.decode import classify_logits
from attnkit.errors import AttnkitError
from attnkit.evaluate import classification_scores, regression_scores
from attnkit.train import Trainer
from attnkit.train.schedule import learning_rate
from conftest import train_classifier, write_glue_slice


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_classifier_run_is_a_checkpoint_with_its_labels(classifier_run):
    model, cfg, tokenizer, path = load_checkpoint(classifier_run)
    assert model.family == "bert_classifier" and model.problem == "classification"
    assert read_labels(path) == ("classification", ["0", "1"]) and model.labels == ("0", "1")
    assert cfg.model.d_model == 32 and cfg.model.n_layers == 2  # the pretrained model's sizes, recorded
    meta = json.loads((path / "meta.json").read_text())
    assert {"labels.json", "vocab.txt", "tokenizer_config.json"} <= set(meta["files"])
    assert {"valid_accuracy", "valid_f1", "valid_matthews", "valid_loss"} <= set(meta["scores"])
    assert tokenizer.max_len == cfg.data.truncate
    assert any("examples_per_s" in r for r in _records(classifier_run))
    assert attnkit.load(classifier_run).family == "bert_classifier"


def test_validation_scores_are_scikit_learns_on_the_checkpoints_own_predictions(classifier_run, data_dir):
    model, cfg, tokenizer, path = load_checkpoint(classifier_run)
    dev = [line.split("\t") for line in Path(cfg.data.valid_file).read_text().splitlines()[1:]]
    logits = classify_logits(model, tokenizer, [row[0] for row in dev])
    predicted, gold = logits.argmax(-1).tolist(), [int(row[2]) for row in dev]
    scores = json.loads((path / "meta.json").read_text())["scores"]
    assert scores["valid_accuracy"] == pytest.approx(100 * accuracy_score(gold, predicted), abs=1e-9)
    assert scores["valid_f1"] == pytest.approx(100 * f1_score(gold, predicted), abs=1e-9)
    assert scores["valid_matthews"] == pytest.approx(100 * matthews_corrcoef(gold, predicted), abs=1e-9)
    ce = torch.nn.functional.cross_entropy(logits, torch.tensor(gold))
    assert scores["valid_loss"] == pytest.approx(float(ce), rel=1e-5)


def test_a_regressor_reads_pairs_and_is_scored_by_correlation(regressor_run):
    model, cfg, tokenizer, path = load_checkpoint(regressor_run)
    assert model.problem == "regression" and model.n_labels == 1 and read_labels(path) == ("regression", ["score"])
    rows = [line.split("\t") for line in Path(cfg.data.valid_file).read_text().splitlines()[1:]]
    predictions = classify_logits(model, tokenizer, [r[0] for r in rows], [r[1] for r in rows])[:, 0].numpy()
    gold = np.array([float(r[2]) for r in rows])
    scores = json.loads((path / "meta.json").read_text())["scores"]
    # validation padded its batches otherwise: the predictions agree to float32 rounding, not bit for bit
    assert scores["valid_pearson"] == pytest.approx(100 * pearsonr(predictions, gold).statistic, abs=1e-3)
    assert scores["valid_spearman"] == pytest.approx(100 * spearmanr(predictions, gold).statistic, abs=1e-3)
    assert scores["valid_loss"] == pytest.approx(float(np.mean((predictions - gold) ** 2)), rel=1e-4)
    # the second sentence changes the answer: the pair is read, not only the first sentence
    a = classify_logits(model, tokenizer, [rows[0][0]], [rows[0][1]])
    b = classify_logits(model, tokenizer, [rows[0][0]], [rows[1][1]])
    assert not torch.equal(a, b)


def test_metrics_are_the_libraries():
    assert classification_scores([0, 1, 1, 0], [0, 1, 0, 0], 2) == pytest.approx(
        {"accuracy": 75.0, "f1": 100 * f1_score([0, 1, 0, 0], [0, 1, 1, 0]),
         "matthews": 100 * matthews_corrcoef([0, 1, 0, 0], [0, 1, 1, 0])})
    assert regression_scores([1.0, 3.0, 2.0], [1.0, 2.0, 3.0])["spearman"] == pytest.approx(50.0)  # 1 - 6*2/(3*8)
    assert regression_scores([1.0, 1.0], [1.0, 2.0]) == {"pearson": 0.0, "spearman": 0.0}


def test_the_linear_schedule_warms_up_then_falls_to_min_lr_at_the_last_step():
    t = TrainConfig(lr=1e-3, schedule="linear", warmup_steps=10, max_steps=1000, min_lr=0.0)
    assert learning_rate(5, t, 1, total_steps=110) == pytest.approx(5e-4)
    assert learning_rate(10, t, 1, total_steps=110) == pytest.approx(1e-3)
    assert learning_rate(60, t, 1, total_steps=110) == pytest.approx(5e-4)
    assert learning_rate(110, t, 1, total_steps=110) == pytest.approx(0.0)
    assert learning_rate(60, t, 1) == pytest.approx(1e-3 * (1 - 50 / 990))  # no total given: max_steps


def _slice(tmp_path, data_dir, task="sst2", n_train=200, n_dev=60):
    return write_glue_slice(data_dir, tmp_path / "data", task, n_train, n_dev)


def test_balanced_class_weights_are_scikit_learns(tmp_path, tiny_bert_directory, data_dir):
    train, dev = _slice(tmp_path, data_dir)
    run = train_classifier(tmp_path / "run", tiny_bert_directory, train, dev, steps=2,
                           overrides=("train.class_weights=balanced",))
    labels = [line.split("\t")[2] for line in train.read_text().splitlines()[1:]]
    expected = compute_class_weight("balanced", classes=np.array(["0", "1"]), y=np.array(labels))
    cfg = load_config(run / "config.toml")
    trainer = Trainer(cfg, tmp_path / "again")
    assert trainer.model.class_weights.tolist() == pytest.approx(expected.tolist())
    counts = Counter(labels)
    assert expected[0] * counts["0"] == pytest.approx(expected[1] * counts["1"])  # each class weighs the same


def test_max_train_and_valid_pairs_keep_the_first_rows_of_a_glue_task_and_its_label_set(tmp_path, tiny_bert_directory,
                                                                                        data_dir):
    from attnkit.data import read_glue

    cfg = load_config(None, ["model.family=bert_classifier", f"model.pretrained={json.dumps(str(tiny_bert_directory))}",
                             "data.format=sst2", "data.max_train_pairs=50", "data.max_valid_pairs=30"])
    task = Trainer(cfg, tmp_path / "run", data_dir=str(data_dir)).task
    train, dev = read_glue("sst2", "train", data_dir), read_glue("sst2", "dev", data_dir)
    assert task.splits["train"].texts == train.texts[:50] and task.splits["train"].labels == train.labels[:50]
    assert task.splits["valid"].texts == dev.texts[:30] and task.targets["valid"].tolist() == [
        int(label) for label in dev.labels[:30]]
    assert task.labels == ["0", "1"] and len(task.lengths("train")[0]) == 50
    model = task.build_model().eval()
    assert task.predict(model, "valid", torch.device("cpu"), 4096).shape == (30, 2)  # validation reads 30 rows


def test_max_epochs_ends_the_schedule_and_the_run(tmp_path, tiny_bert_directory, data_dir):
    train, dev = _slice(tmp_path, data_dir, n_train=100)
    run = train_classifier(tmp_path / "run", tiny_bert_directory, train, dev, steps=1000,
                           overrides=("train.max_epochs=2", "train.eval_every=0", "train.log_every=1"))
    records = _records(run)
    steps = [r for r in records if "lr" in r]
    assert steps[-1]["step"] == 2 * 7 and steps[-1]["lr"] == pytest.approx(0.0)  # 100 examples in batches of 16
    assert [r["epoch"] for r in records if "valid_loss" in r] == [1, 2]  # after each epoch: epochs done


def test_early_stopping_ends_a_run_that_stops_improving(tmp_path, tiny_bert_directory, data_dir):
    train, dev = _slice(tmp_path, data_dir, n_train=64)
    # a learning rate of 1e-12 leaves the predictions as they were: every validation after the first is no better
    run = train_classifier(tmp_path / "run", tiny_bert_directory, train, dev, steps=100,
                           overrides=("train.lr=1e-12", "train.eval_every=4", "train.patience=2"))
    records = _records(run)
    assert [r["step"] for r in records if "valid_loss" in r] == [4, 8, 12]
    assert records[-1]["early_stop"] is True
    meta = json.loads((run / "checkpoints" / "best" / "meta.json").read_text())
    assert meta["progress"]["step"] == 4


def test_a_resumed_fine_tune_is_bit_identical_to_an_uninterrupted_one(tmp_path, tiny_bert_directory, data_dir):
    train, dev = _slice(tmp_path, data_dir)
    whole = train_classifier(tmp_path / "whole", tiny_bert_directory, train, dev, steps=16,
                             overrides=("train.eval_every=8", "train.keep_last=3", "model.dropout=0.3"))
    # a run that stopped at step 8 (its checkpoint) goes on in a directory of its own
    cfg = load_config(whole / "config.toml")
    trainer = Trainer(cfg, tmp_path / "resumed")
    trainer.resume(whole / "checkpoints" / "step-8")
    trainer.train()
    for name in ("model.safetensors", "trainer.safetensors"):
        a = load_file(str(whole / "checkpoints" / "step-16" / name))
        b = load_file(str(tmp_path / "resumed" / "checkpoints" / "step-16" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


@pytest.mark.parametrize("overrides, needle", [
    (("data.format=multi30k",), "model.family = 'bert_classifier' goes with data.format"),
    (("data.valid_file=\"\"",), "needs data.train_file and data.valid_file"),
    (("model.pooling=max",), "model.pooling = 'max' is not one of cls, mean"),
    (("train.best_metric=bleu",), "train.best_metric = 'bleu': this task's validation reports accuracy"),
    (("train.best_metric=rouge",), "train.best_metric = 'rouge': this task's validation reports accuracy, f1, "
                                   "matthews, loss"),
    (("data.regression=true", "train.best_metric=accuracy"),
     "train.best_metric = 'accuracy': this task's validation reports pearson, spearman, loss"),
    (("data.truncate=4096",), "data.truncate = 4096 is longer than the 128 positions"),
    (("data.regression=true", "train.class_weights=balanced"), "class_weights = 'balanced' is for classification"),
    (("data.label_column=stars",), "stars"),
])
def test_a_bad_fine_tuning_config_is_one_line(overrides, needle, tmp_path, tiny_bert_directory, data_dir):
    train, dev = _slice(tmp_path, data_dir, n_train=40, n_dev=20)
    with pytest.raises(AttnkitError) as e:
        train_classifier(tmp_path / "run", tiny_bert_directory, train, dev, steps=2, overrides=overrides)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_fine_tuning_minilm_on_a_slice_of_sst2_beats_the_majority_class(tmp_path, minilm_directory, data_dir):
    train, dev = write_glue_slice(data_dir, tmp_path / "data", "sst2", n_train=640, n_dev=200)
    run = train_classifier(tmp_path / "run", minilm_directory, train, dev, steps=40,
                           overrides=("train.lr=5e-5", "model.pooling=mean", "train.warmup_steps=4"))
    gold = [line.split("\t")[2] for line in dev.read_text().splitlines()[1:]]
    majority = 100 * Counter(gold).most_common(1)[0][1] / len(gold)
    best = json.loads((run / "checkpoints" / "best" / "meta.json").read_text())["scores"]["valid_accuracy"]
    assert best > majority + 15, (best, majority)
