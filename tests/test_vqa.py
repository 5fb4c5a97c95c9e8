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
from attnkit.data import token_batches  # noqa: E402
from attnkit.data.vqa import VQAExamples, image_batch, load_pixels, questions_by_image, read_easy_vqa  # noqa: E402
from attnkit.models.vqa import (  # noqa: E402
    ShowAskAttendAnswer,
    ShowAskAttendAnswerConfig,
    glimpses,
    joint_hidden,
    tile_question,
)
from conftest import made_once  # noqa: E402

TRAIN_QUESTIONS, VALID_QUESTIONS, TEST_QUESTIONS = 6000, 400, 800
TRAIN_STEPS = 800  # each of the two models, at most 128 questions (about 13 images) a step: about 20 s on one core


def _tiny_config(attention: str, run: Path):
    return load_config(None, [
        "model.family=show_ask_attend_answer", f"model.attention={attention}", "model.cnn_channels=[8, 16, 32]",
        "model.embedding_size=16", "model.hidden_size=32", "model.attention_size=32", "model.classifier_size=64",
        "model.dropout=0.0", "data.format=easy_vqa", "data.image_size=32", "train.batch_size=16",
        "train.max_tokens=128", "train.lr=3e-3", "train.optimizer=adamw", "train.schedule=constant",
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
def runs(easy_vqa) -> dict[str, Path]:
    """The attention model and the question-only baseline, each trained for TRAIN_STEPS on the same slice: once a
    test run (the tests only read them), whichever worker asks first."""
    def train(directory: Path) -> None:
        for attention in ("glimpses", "none"):
            _train(directory, attention, easy_vqa)

    directory = made_once("easy_vqa_runs", train)
    return {attention: directory / attention for attention in ("glimpses", "none")}


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


def test_the_attention_s_first_layer_is_w1_over_the_tiled_question():
    """joint_hidden from W_1's two column blocks = relu(W_1 [phi_l ; s] + b_1) over the tiled question."""
    g = torch.Generator().manual_seed(0)
    phi, s, layer = torch.randn(2, 5, 4, generator=g), torch.randn(2, 6, generator=g), torch.nn.Linear(10, 3)
    w_phi, w_s = layer.weight[:, :4], layer.weight[:, 4:]
    hidden = joint_hidden(phi @ w_phi.T, s @ w_s.T + layer.bias)
    assert torch.allclose(hidden, torch.relu(layer(tile_question(s, phi))), atol=1e-6)


def test_an_image_batch_holds_each_of_its_images_questions_once():
    """questions_by_image and image_batch against a direct scan: image by image, each image's questions in order,
    each question's image_index pointing at its own image."""
    image_of = torch.randint(0, 7, (50,), generator=torch.Generator().manual_seed(0))
    asks = questions_by_image(image_of, 8)  # image 7: no question
    assert asks == [[n for n in range(50) if image_of[n] == m] for m in range(8)]
    images = [5, 2, 7, 0]
    questions, image_index = image_batch(asks, images)
    assert questions == [n for m in images for n in range(50) if image_of[n] == m]
    assert [images[k] for k in image_index.tolist()] == [int(image_of[n]) for n in questions]
    questions, image_index = image_batch(asks, [7])
    assert questions == [] and image_index.shape == (0,)


def test_training_batches_are_whole_images_and_cover_every_question_once(easy_vqa, tmp_path):
    """The answering task's batches: every question of the split exactly once per epoch, each with its own image's
    pixels (read again from its file), its own answer and its own words; at most batch_size images and max_tokens
    questions a batch."""
    from attnkit.train.vqa import AnswerTask

    cfg = _tiny_config("glimpses", tmp_path)
    train, valid = _slice(easy_vqa["train"], 0, 1000), _slice(easy_vqa["valid"], 0, 40)
    task = AnswerTask(cfg, tmp_path, splits=(train, valid))
    seen = []
    for images in token_batches(*task.lengths("train"), 32, seed=1, max_examples=4):
        b = task.batch("train", images)
        assert len(b.images) == len(images) <= 4 and len(b.indices) <= 32 and b.image_index.max() < len(images)
        assert b.questions.size(1) == max(len(task.questions["train"][n]) for n in b.indices)
        for row, n in enumerate(b.indices):
            own = load_pixels([train.images[n]], cfg.data.image_size)[0][0]
            assert torch.equal(b.images[b.image_index[row]], own)
            assert task.vocab.answers[b.targets[row]] == train.answers[n]
            words = task.questions["train"][n]
            assert b.questions[row, :len(words)].tolist() == words and not b.questions[row, len(words):].any()
        seen += b.indices
    assert sorted(seen) == list(range(len(train)))


@pytest.mark.parametrize("attention", ["glimpses", "pooled"])
def test_one_cnn_pass_per_image_answers_as_one_image_per_question(attention):
    """Questions sharing images through image_index get the logits and glimpses each gets alone with its own
    image (padded to the batch's longest question, in a batch whose images come in another order)."""
    torch.manual_seed(0)
    cfg = ShowAskAttendAnswerConfig(attention=attention, cnn_channels=(4, 8), embedding_size=8, hidden_size=8,
                                    attention_size=8, classifier_size=8)
    model = ShowAskAttendAnswer(cfg, 20, ["a", "b", "c"]).eval()
    images = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8)
    questions = [[4, 5, 6], [7, 8], [9, 10, 11, 12, 13], [14]]
    image_index = torch.tensor([2, 0, 2, 1])
    together = model(images, torch.tensor([q + [0] * (5 - len(q)) for q in questions]), need_weights=True,
                     image_index=image_index)
    for b, q in enumerate(questions):
        alone = model(images[image_index[b]][None], torch.tensor([q]), need_weights=True)
        assert torch.allclose(together.logits[b], alone.logits[0], atol=1e-5)
        assert torch.allclose(together.attention.cross[0][b], alone.attention.cross[0][0], atol=1e-6)


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
