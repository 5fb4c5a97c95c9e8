"""Show, Ask, Attend and Answer on easy-VQA: the glimpses are distributions over the grid that the question moves,
padding never changes an answer, a tiny model trained for seconds on a slice of easy-VQA beats the question-only
baseline, and the faces (Model.answer, attnkit answer, attnkit evaluate --data) answer with it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("easy_vqa")

from attnkit.cli import main  # noqa: E402
from attnkit.config import load_config  # noqa: E402
from attnkit.data.vqa import VQAExamples, read_easy_vqa  # noqa: E402
from attnkit.models.vqa import glimpses, tile_question  # noqa: E402

TRAIN_QUESTIONS, VALID_QUESTIONS, TEST_QUESTIONS = 6000, 400, 800
TRAIN_STEPS = 800  # each of the two models, 32 questions a step: about ten seconds on one core


def _tiny_config(attention: str, run: Path):
    return load_config(None, [
        "model.family=show_ask_attend_answer", f"model.attention={attention}", "model.cnn_channels=[8, 16, 32]",
        "model.embedding_size=16", "model.hidden_size=32", "model.attention_size=32", "model.classifier_size=64",
        "model.dropout=0.0", "data.format=easy_vqa", "data.image_size=32", "train.batch_size=32",
        "train.max_tokens=4096", "train.lr=3e-3", "train.optimizer=adamw", "train.schedule=constant",
        "train.warmup_steps=0", "train.label_smoothing=0.0", f"train.max_steps={TRAIN_STEPS}",
        "train.eval_every=0", "train.save_every=0", "train.log_every=1000",
        "train.progress=false", "train.fast=[]", "train.threads=1", "train.seed=2"])


def _slice(data: VQAExamples, start: int, n: int) -> VQAExamples:
    cut = slice(start, start + n)
    return VQAExamples(data.images[cut], data.questions[cut], data.answers[cut], data.types[cut], data.origin)


@pytest.fixture(scope="module")
def easy_vqa():
    return {split: read_easy_vqa(split) for split in ("train", "valid", "test")}


def _train(tmp: Path, attention: str, data) -> Path:
    from attnkit.train import Trainer
    from attnkit.train.vqa import AnswerTask

    torch.set_num_threads(1)
    cfg = _tiny_config(attention, tmp / attention)
    splits = (_slice(data["train"], 0, TRAIN_QUESTIONS), _slice(data["valid"], 0, VALID_QUESTIONS))
    task = AnswerTask(cfg, tmp / attention, splits=splits)
    Trainer(cfg, tmp / attention, task=task).train()
    return tmp / attention


@pytest.fixture(scope="module")
def runs(tmp_path_factory, easy_vqa) -> dict[str, Path]:
    """The attention model and the question-only baseline, each trained for TRAIN_STEPS on the same slice."""
    tmp = tmp_path_factory.mktemp("vqa")
    return {attention: _train(tmp, attention, easy_vqa) for attention in ("glimpses", "none")}


@pytest.fixture(scope="module")
def model(runs):
    import attnkit

    return attnkit.load(runs["glimpses"])


def test_glimpse_formulas():
    """x_c = sum_l alpha_{c,l} phi_l, and [phi_l ; s] puts the same s beside every cell."""
    g = torch.Generator().manual_seed(0)
    alpha, phi, s = torch.rand(2, 3, 5, generator=g), torch.randn(2, 5, 4, generator=g), torch.randn(2, 6)
    expected = torch.stack([torch.stack([sum(alpha[b, c, cell] * phi[b, cell] for cell in range(5)) for c in range(3)])
                            for b in range(2)])
    assert torch.allclose(glimpses(alpha, phi), expected, atol=1e-6)
    tiled = tile_question(s, phi)
    assert tiled.shape == (2, 5, 10) and torch.equal(tiled[:, 3, 4:], s) and torch.equal(tiled[:, :, :4], phi)


def test_glimpses_sum_to_one_and_move_with_the_question(model, easy_vqa):
    image = easy_vqa["test"].images[0]
    a, b = model.answer([image, image], ["what color is the shape?", "is there a circle in the image?"])
    rows, columns = model.kind.grid(model)
    for answer in (a, b):
        assert answer.glimpses.shape == (model.config.model.glimpses, rows, columns)
        assert torch.allclose(answer.glimpses.flatten(1).sum(-1), torch.ones(answer.glimpses.size(0)), atol=1e-5)
        assert (answer.glimpses >= 0).all()
        assert abs(sum(answer.probabilities.values()) - 1) < 1e-4
        assert answer.probability == max(answer.probabilities.values())
    assert (a.glimpses - b.glimpses).abs().max() > 1e-3  # same image, two questions: two different maps


def test_padding_in_a_batch_never_changes_an_answer(model, easy_vqa):
    test = easy_vqa["test"]
    questions = ["what color is the shape?", "is there not a blue shape in the image?", "what shape is present?",
                 "does the image not contain a gray shape?"]
    images = test.images[:4]
    together = model.answer(images, questions)  # one batch, padded to its longest question
    for i in range(4):
        alone = model.answer(images[i], questions[i])
        assert alone.answer == together[i].answer
        for name, p in alone.probabilities.items():
            assert abs(p - together[i].probabilities[name]) < 1e-5
        assert torch.allclose(alone.glimpses, together[i].glimpses, atol=1e-5)


def test_a_tiny_model_beats_the_question_only_baseline(runs, easy_vqa):
    import attnkit

    test = _slice(easy_vqa["test"], 0, TEST_QUESTIONS)
    scores = {name: attnkit.load(run).evaluate_answers(test)[0] for name, run in runs.items()}
    assert scores["glimpses"]["accuracy"] > scores["none"]["accuracy"] + 5, scores
    # colour questions cannot be answered from the question alone; the attention model reads the image
    assert scores["glimpses"]["accuracy_color"] > scores["none"]["accuracy_color"] + 20, scores
    assert attnkit.load(runs["none"]).answer(test.images[0], "what color is the shape?").glimpses is None


def test_an_unknown_word_is_read_as_unk_and_reported(model, easy_vqa):
    answer = model.answer(easy_vqa["test"].images[0], "what colour is the blob?")
    assert answer.unknown_words == ["colour", "blob"]
    assert answer.to_json()["unknown_words"] == ["colour", "blob"]
    assert model.answer(easy_vqa["test"].images[0], "what color is the shape?").unknown_words == []


def test_answer_and_evaluate_on_the_command_line(runs, model, easy_vqa, tmp_path, capsys):
    test = easy_vqa["test"]
    image = str(test.images[0])
    assert main(["answer", "--threads", "1", "--checkpoint", str(runs["glimpses"]), image, "what color is the shape?",
                 "--show-attention", str(tmp_path / "maps")]) == 0
    out = capsys.readouterr().out.splitlines()
    expected = model.answer(image, "what color is the shape?")
    assert out == [f"{expected.answer}\t{expected.probability:.4f}"]
    assert len(list((tmp_path / "maps").glob("*.png"))) == 1
    rows = [{"image": str(p), "question": q, "answer": a} for p, q, a in
            zip(test.images[:20], test.questions[:20], test.answers[:20])]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["answer", "--threads", "1", "--checkpoint", str(runs["glimpses"]), "--input",
                 str(tmp_path / "q.jsonl"), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    answers = model.answer([r["image"] for r in rows], [r["question"] for r in rows])
    assert [line["answer"] for line in lines] == [a.answer for a in answers]
    assert main(["evaluate", "--threads", "1", "--checkpoint", str(runs["glimpses"]), "--data",
                 str(tmp_path / "q.jsonl")]) == 0
    scores = json.loads(capsys.readouterr().out)
    right = sum(a.answer == r["answer"] for a, r in zip(answers, rows))
    assert scores["n"] == 20 and abs(scores["accuracy"] - 100 * right / 20) < 1e-9
    assert {"accuracy_all"} <= set(scores)  # a file without types: one type, "all"


def test_easy_vqa_splits_are_the_package_s():
    started = time.monotonic()
    train, valid, test = (read_easy_vqa(s) for s in ("train", "valid", "test"))
    assert len(train) + len(valid) == 38575 and len(test) == 9673
    assert not {p.name for p in train.images} & {p.name for p in valid.images}
    assert set(train.types) == {"yes/no", "shape", "color"}
    assert time.monotonic() - started < 10
