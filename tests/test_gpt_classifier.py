"""Fine-tuning a GPT (GPT-1's recipe over attnkit's TransformerLM): the framed input, the head on the extract
token's final state, the auxiliary LM loss equal to the LM's own, the grown embedding, padding, learning a toy
task, gradients into the body."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import AttnkitError
from attnkit.models import PAD, GPTClassifier, TransformerLM
from attnkit.models.classifier import classification_loss
from attnkit.models.gpt_classifier import collate_framed, frame, lm_targets, special_ids
from attnkit.models.lm import LMConfig

VOCAB = 50
START, DELIMITER, EXTRACT = VOCAB, VOCAB + 1, VOCAB + 2
SINGLES = [[5, 6, 9], [11], [4, 8, 12, 13, 14, 20, 33]]
PAIRS = [([5, 6], [9, 10, 11]), ([30], [31]), ([4, 4, 4, 4], [49])]


def lm_config(**overrides) -> LMConfig:
    base = dict(d_model=32, n_heads=2, d_ff=64, n_layers=2, dropout=0.0, max_positions=64)
    return LMConfig(**(base | overrides))


def make_lm(seed: int = 0, **overrides) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(lm_config(**overrides), VOCAB).eval()


def make_model(seed: int = 0, **kwargs) -> GPTClassifier:
    return GPTClassifier(make_lm(seed), kwargs.pop("n_labels", 3), seed=seed, **kwargs).eval()


def framed_rows() -> list[list[int]]:
    return [frame(VOCAB, a) for a in SINGLES] + [frame(VOCAB, a, b) for a, b in PAIRS]


def lm_states(lm: TransformerLM, tokens: torch.Tensor) -> torch.Tensor:
    """The final states of TransformerLM.forward itself (its final norm's output), caught by a hook."""
    caught = []
    handle = lm.norm.register_forward_hook(lambda module, args, out: caught.append(out))
    try:
        lm(None, tokens)
    finally:
        handle.remove()
    return caught[0]


def test_frame_and_collate():
    assert special_ids(VOCAB) == (START, DELIMITER, EXTRACT)
    assert frame(VOCAB, [5, 6]) == [START, 5, 6, EXTRACT]
    assert frame(VOCAB, [5, 6], [7]) == [START, 5, 6, DELIMITER, 7, EXTRACT]
    tokens, padding_mask, extract = collate_framed([[START, 5, EXTRACT], [START, 5, DELIMITER, 6, EXTRACT]])
    assert tokens.tolist() == [[START, 5, EXTRACT, PAD, PAD], [START, 5, DELIMITER, 6, EXTRACT]]
    assert padding_mask.tolist() == [[False, False, False, True, True], [False] * 5]
    assert extract.tolist() == [2, 4]
    for bad in ([VOCAB], [PAD], [-1]):
        with pytest.raises(AttnkitError, match="not a word"):
            frame(VOCAB, [5], bad)
    with pytest.raises(AttnkitError, match="no rows"):
        collate_framed([])


def test_logits_are_the_head_on_the_extract_tokens_final_state():
    model = make_model()
    rows = framed_rows()
    tokens, padding_mask, extract = collate_framed(rows)
    with torch.no_grad():
        logits = model(tokens, padding_mask).logits
        assert torch.equal(model(tokens, padding_mask, extract=extract).logits, logits)
        for i, row in enumerate(rows):  # TransformerLM's own forward on the row alone, then W_y h + b
            h = lm_states(model.lm, torch.tensor([row]))[0, -1]
            torch.testing.assert_close(logits[i], model.classifier(h), atol=1e-5, rtol=1e-5)
        # the other positions' states are never read: more padding, and any ids under the padding, change nothing
        wider = torch.cat([tokens, torch.full((len(rows), 4), PAD)], 1)
        wider_mask = torch.cat([padding_mask, torch.ones(len(rows), 4, dtype=torch.bool)], 1)
        noise = torch.randint(1, VOCAB + 3, wider.shape, generator=torch.Generator().manual_seed(1))
        scrambled = torch.where(wider_mask, noise, wider)
        torch.testing.assert_close(model(scrambled, wider_mask).logits, logits, atol=1e-5, rtol=1e-5)
        # while every real token before the extract token is read
        changed = tokens.clone()
        changed[:, 1] = torch.where(changed[:, 1] == 40, 41, 40)
        assert (model(changed, padding_mask).logits - logits).abs().amax(1).min() > 1e-4


def test_auxiliary_loss_is_the_language_models_own():
    model = make_model(lm_weight=1.0)
    rows = framed_rows()
    tokens, padding_mask, _ = collate_framed(rows)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        out = model(tokens, padding_mask, targets=y)
        aux = out.loss - classification_loss(out.logits, y)
        torch.testing.assert_close(out.nll, classification_loss(out.logits, y))
        expected = torch.zeros(())
        for ids in rows:  # the grown TransformerLM's loss on the same row, $ and <e> not predicted
            row = torch.tensor([ids])
            targets = lm_targets(row, VOCAB)
            assert targets.lt(VOCAB).all() and targets.ne(PAD).sum() == len(ids) - 2 - ids.count(DELIMITER)
            own = model.lm(None, row[:, :-1], targets=targets).loss
            expected = expected + own / targets.ne(PAD).sum()  # L1 of a row: the mean over its tokens
        torch.testing.assert_close(aux, expected, atol=1e-5, rtol=1e-5)
        model.lm_weight = 0.5
        half = model(tokens, padding_mask, targets=y).loss
        torch.testing.assert_close(half, out.loss - 0.5 * aux, atol=1e-5, rtol=1e-5)
        model.lm_weight = 0.0
        torch.testing.assert_close(model(tokens, padding_mask, targets=y).loss, out.nll)


def test_the_embedding_gains_three_rows_and_keeps_the_pretrained_ones():
    lm = make_lm()
    before = lm.embed.tokens.weight.detach().clone()
    model = GPTClassifier(lm, 2, seed=0)
    weight = model.lm.embed.tokens.weight
    assert weight.shape == (VOCAB + 3, 32) and model.lm is lm
    assert torch.equal(weight[:VOCAB], before)
    assert model.lm.output.weight is weight  # tied: the output layer grew with it
    assert 0.01 < float(weight[VOCAB:].detach().std()) < 0.03  # N(0, 0.02^2)
    assert model.lm.output_logits(torch.zeros(1, 32)).shape == (1, VOCAB + 3)
    assert torch.equal(GPTClassifier(make_lm(), 2, seed=0).lm.embed.tokens.weight[VOCAB:], weight[VOCAB:])

    untied = make_lm(share_embeddings=False)
    output = untied.output.weight.detach().clone()
    model = GPTClassifier(untied, 2, seed=0).eval()
    assert model.lm.embed.tokens.weight.shape == (VOCAB + 3, 32)
    assert torch.equal(model.lm.output.weight, output)  # the LM's own V outputs: the new ids are never predicted
    tokens, padding_mask, _ = collate_framed(framed_rows())
    assert torch.isfinite(model(tokens, padding_mask, targets=torch.zeros(6, dtype=torch.long)).loss)

    with pytest.raises(AttnkitError, match="adaptive"):
        GPTClassifier(make_lm(adaptive_softmax=(20,)), 2)


def test_padding_never_changes_results():
    model = make_model(lm_weight=0.5)
    rows = framed_rows()
    tokens, padding_mask, _ = collate_framed(rows)
    y = torch.tensor([2, 0, 1, 1, 0, 2])
    with torch.no_grad():
        batch = model(tokens, padding_mask, targets=y)
        alone = [model(*collate_framed([row])[:2], targets=y[i:i + 1]) for i, row in enumerate(rows)]
    torch.testing.assert_close(batch.logits, torch.cat([o.logits for o in alone]), atol=1e-5, rtol=0)
    torch.testing.assert_close(batch.loss, sum(o.loss for o in alone), atol=1e-5, rtol=0)
    torch.testing.assert_close(batch.nll, sum(o.nll for o in alone), atol=1e-5, rtol=0)


def toy_task(n: int, seed: int) -> tuple[list[list[int]], torch.Tensor]:
    """Random sentences of ids 4..49 without 7; label 1 when a 7 was put in."""
    g = torch.Generator().manual_seed(seed)
    rows, labels = [], []
    words = [i for i in range(4, VOCAB) if i != 7]
    for i in range(n):
        length = int(torch.randint(3, 9, (), generator=g))
        ids = [words[int(j)] for j in torch.randint(len(words), (length,), generator=g)]
        if i % 2:
            ids[int(torch.randint(length, (), generator=g))] = 7
        rows.append(frame(VOCAB, ids))
        labels.append(i % 2)
    return rows, torch.tensor(labels)


def test_learns_whether_token_7_appears():
    model = make_model(n_labels=2, labels=["absent", "present"], dropout=0.0)
    rows, y = toy_task(32, seed=0)
    tokens, padding_mask, _ = collate_framed(rows)
    assert model.encode_targets(["present", "absent", 1]).tolist() == [1, 0, 1]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def accuracy() -> float:
        model.eval()
        with torch.no_grad():
            return float((model(tokens, padding_mask).logits.argmax(1) == y).float().mean())

    start = accuracy()
    for _ in range(300):
        if accuracy() == 1.0:
            break
        model.train()
        loss = model(tokens, padding_mask, targets=y, reduction="mean").loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert start < 0.8 and accuracy() == 1.0


@pytest.mark.parametrize("lm_weight", [0.5, 0.0])
def test_gradients_reach_the_lm_body(lm_weight):
    model = make_model(lm_weight=lm_weight).train()
    tokens, padding_mask, _ = collate_framed(framed_rows())
    model(tokens, padding_mask, targets=torch.tensor([0, 1, 2, 0, 1, 2])).loss.backward()
    for name, p in model.lm.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    grad = model.lm.embed.tokens.weight.grad
    assert (grad[[START, DELIMITER, EXTRACT]].abs().sum(1) > 0).all()  # the new tokens' rows learn too
    if not lm_weight:  # PAD's row learns only as an output of the tied softmax, never as an input
        assert grad[PAD].abs().sum() == 0


def test_regression_head_config_and_errors():
    model = make_model(n_labels=1, problem="regression", lm_weight=0.0)
    tokens, padding_mask, _ = collate_framed(framed_rows())
    scores = model.encode_targets([0.5, 1, 2.5, 3, 4, 5])
    with torch.no_grad():
        out = model(tokens, padding_mask, targets=scores)
    assert out.logits.shape == (6, 1)
    torch.testing.assert_close(out.loss, ((out.logits[:, 0] - scores) ** 2).sum())

    model = make_model(n_labels=3, labels=["a", "b", "c"], lm_weight=0.25)
    config = model.head_config()
    assert config == {"vocab_size": VOCAB, "n_labels": 3, "dropout": 0.1, "problem": "classification",
                      "labels": ["a", "b", "c"], "lm_weight": 0.25}
    rebuilt = GPTClassifier.from_config(lm_config(), **config).eval()
    rebuilt.load_state_dict(model.state_dict())
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(tokens, padding_mask, targets=y).loss,
                                   model(tokens, padding_mask, targets=y).loss)

    with pytest.raises(AttnkitError, match="n_labels must be 1"):
        GPTClassifier(make_lm(), 2, problem="regression")
    with pytest.raises(AttnkitError, match="extract token"):
        model(torch.tensor([[START, 5, 6]]))
    with pytest.raises(AttnkitError, match="max_positions"):
        model(torch.tensor([[START] + [5] * 70 + [EXTRACT]]))
    with pytest.raises(AttnkitError, match="reduction"):
        model(tokens, padding_mask, reduction="none")


# --- GPT-1's recipe end to end: an attnkit language-model run fine-tuned by the trainer, then used as a classifier


@pytest.fixture(scope="module")
def spm_lm_run(tmp_path_factory, data_dir):
    """A small SentencePiece LM trained for a few steps on SST-2's training sentences: a stand-in for the
    transfer recipe's WikiText-2 model."""
    import dataclasses

    from attnkit.config import ExperimentConfig
    from attnkit.data import read_glue, train_tokenizer
    from attnkit.train import Trainer
    from attnkit.train.tasks import LanguageModelTask

    root = tmp_path_factory.mktemp("gpt_lm")
    sentences = read_glue("sst2", "train", data_dir).texts[:3000]
    spm = train_tokenizer(sentences, root / "spm.model", 400).path
    cfg = ExperimentConfig(name="lm")
    cfg.model = lm_config(dropout=0.0)
    cfg.data = dataclasses.replace(cfg.data, format="wikitext2", block_size=32, lm_tokenizer="spm", spm_model=str(spm))
    cfg.train = dataclasses.replace(cfg.train, seed=1, max_tokens=512, max_steps=40, lr=3e-3, schedule="constant",
                                    warmup_steps=0, label_smoothing=0.0, eval_every=0, save_every=0, progress=False,
                                    threads=1)
    lines = [f"{s} <eos>" for s in sentences]
    run = root / "lm"
    Trainer(cfg, run, task=LanguageModelTask(cfg, run, texts={"train": lines, "valid": lines[:200]})).train()
    return run


def gpt_overrides(pretrained, train_file, valid_file, *more: str) -> list[str]:
    import json

    return ["model.family=gpt_classifier", f"model.pretrained={json.dumps(str(pretrained))}", "model.dropout=0.0",
            "data.format=labelled", f"data.train_file={json.dumps(str(train_file))}",
            f"data.valid_file={json.dumps(str(valid_file))}", "data.text_column=sentence", "data.truncate=48",
            "train.optimizer=adamw", "train.lr=1e-3", "train.schedule=linear", "train.warmup_steps=4",
            "train.batch_size=16", "train.max_tokens=100000", "train.label_smoothing=0.0", "train.max_steps=30",
            "train.eval_every=15", "train.save_every=0", "train.progress=false", "train.fast=[]", "train.threads=1",
            *more]


def test_gpt1_fine_tunes_an_attnkit_lm_run_and_serves_it_as_a_classifier(tmp_path, spm_lm_run, data_dir, capsys):
    import attnkit
    from attnkit.checkpoint import load_checkpoint
    from attnkit.cli import main
    from attnkit.config import load_config
    from attnkit.train import Trainer
    from conftest import write_glue_slice

    train_file, valid_file = write_glue_slice(data_dir, tmp_path / "data", "sst2", n_train=300, n_dev=60)
    lm, lm_cfg, _, _ = load_checkpoint(spm_lm_run)
    vocab = lm.embed.tokens.weight.size(0)

    trainer = Trainer(load_config(None, gpt_overrides(spm_lm_run, train_file, valid_file)), tmp_path / "run")
    body = trainer.model.lm.state_dict()
    for name, weight in lm.state_dict().items():  # the body is the pretrained LM; its embedding only grows
        assert torch.equal(body[name][:vocab] if name in ("embed.tokens.weight", "output.weight") else body[name],
                           weight), name
    assert trainer.model.lm.embed.tokens.weight.size(0) == vocab + 3
    assert trainer.cfg.model.d_model == lm_cfg.model.d_model and trainer.cfg.model.n_layers == lm_cfg.model.n_layers
    scratch = Trainer(load_config(None, gpt_overrides(spm_lm_run, train_file, valid_file, "model.from_scratch=true")),
                      tmp_path / "scratch")
    assert scratch.model.lm.embed.tokens.weight.shape == trainer.model.lm.embed.tokens.weight.shape
    assert not torch.equal(scratch.model.lm.layers[0].ffn.linear1.weight, body["layers.0.ffn.linear1.weight"])
    trainer.train()

    run = tmp_path / "run"
    assert (run / "checkpoints" / "best" / "spm.model").read_bytes() == (spm_lm_run / "spm.model").read_bytes()
    model = attnkit.load(run)
    sentences = ["a gorgeous , witty , seductive movie .", "the story is a mess ."]
    out = model.classify(sentences)
    assert [sorted(c.probabilities) for c in out] == [["0", "1"]] * 2
    assert all(abs(sum(c.probabilities.values()) - 1) < 1e-5 for c in out)
    tokenizer = model.tokenizers
    ids, _ = tokenizer.example(sentences[0])
    assert ids[0] == vocab and ids[-1] == vocab + 2 and tokenizer.id_to_piece(ids)[::len(ids) - 1] == ["<s>", "<e>"]
    with torch.no_grad():  # the loaded checkpoint computes what the trained model computes
        trained = trainer.model.eval()(torch.tensor([ids])).logits.softmax(-1)[0]
    assert [out[0].probabilities[k] for k in ("0", "1")] == pytest.approx(trained.tolist(), abs=1e-5)

    from attnkit.decode.explain import explain

    e = explain(model.module, tokenizer, sentences[0])
    assert e.pieces[0] == "<s>" and e.pieces[-1] == "<e>" and e.occlusion[0] == e.occlusion[-1] == 0.0
    assert any(abs(d) > 1e-6 for d in e.occlusion[1:-1])  # a hidden piece is hidden from every later one
    assert len(e.attention) == lm_cfg.model.n_layers and e.attention[0].shape[-1] == len(ids)
    assert float(e.attention[0][0].triu(1).abs().sum()) == 0.0  # a causal model: no piece attends ahead

    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    assert main(["classify", "--checkpoint", str(run), "--input", str(tmp_path / "in.txt")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == [c.label for c in out]


@pytest.mark.parametrize("overrides, needle", [
    (["model.pretrained=\"\""], "model.pretrained: name the language model's checkpoint"),
    (["model.lm_weight=-1"], "model.lm_weight = -1"),
    (["data.truncate=500"], "data.truncate = 500 is longer than the 64 positions"),
])
def test_a_bad_gpt_fine_tuning_config_is_one_line(overrides, needle, tmp_path, spm_lm_run, data_dir):
    from attnkit.config import load_config
    from attnkit.train import Trainer
    from conftest import write_glue_slice

    train_file, valid_file = write_glue_slice(data_dir, tmp_path / "data", "sst2", n_train=40, n_dev=10)
    with pytest.raises(AttnkitError) as e:
        Trainer(load_config(None, gpt_overrides(spm_lm_run, train_file, valid_file, *overrides)), tmp_path / "run")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_gpt_classifier_refuses_a_model_that_is_not_a_language_model(tmp_path, classifier_run, data_dir):
    from attnkit.config import load_config
    from attnkit.train import Trainer
    from conftest import write_glue_slice

    train_file, valid_file = write_glue_slice(data_dir, tmp_path / "data", "sst2", n_train=40, n_dev=10)
    with pytest.raises(AttnkitError, match="holds a bert_classifier model, not a language model"):
        Trainer(load_config(None, gpt_overrides(classifier_run, train_file, valid_file)), tmp_path / "run")
