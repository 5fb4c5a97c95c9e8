"""Occlusion measured in log-odds: against a hand-built classifier whose probabilities are known, and against the
trained classifier run one hidden piece at a time, the log-odds computed in float64 from the probabilities."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import attnkit
from attnkit.data.wordpiece import collate_sentences
from attnkit.decode.explain import explain, log_odds


class Pieces:
    """A tokenizer of whitespace-separated words from a fixed list, framed by [CLS] (id 1) and [SEP] (id 2)."""

    pad_id, specials = 0, {1, 2}

    def __init__(self, words):
        self.words = ["[PAD]", "[CLS]", "[SEP]", *words]

    def example(self, text, pair=None):
        ids = [1, *(self.words.index(w) for w in text.split()), 2]
        return ids, [0] * len(ids)

    def id_to_piece(self, ids):
        return [self.words[i] for i in ids]


class Votes(torch.nn.Module):
    """A hand-built classifier: its logits are the sum of a fixed vector per visible word (hidden pieces and padding
    add nothing), so the probability with any piece hidden is known in advance. Its attention is uniform."""

    problem, labels = "classification", ["neg", "neu", "pos"]

    def __init__(self, votes):
        super().__init__()
        self.votes = torch.tensor(votes, dtype=torch.float32)  # [vocabulary, labels]

    def forward(self, tokens, padding_mask, token_types, need_weights=False):
        logits = (self.votes[tokens] * (~padding_mask)[..., None]).sum(1)
        n = tokens.size(1)
        weights = [torch.full((tokens.size(0), 1, n, n), 1.0 / n)] if need_weights else None
        return SimpleNamespace(logits=logits, attention=SimpleNamespace(self_attention=weights))


def test_occlusion_is_the_drop_in_the_predicted_labels_log_odds():
    # "superb" carries the prediction to p(pos) = 0.9993; hiding "fine" moves that probability by less than 0.001
    tokenizer = Pieces(["superb", "fine", "dull"])
    votes = [[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 8.0], [0, 0, 1.0], [0.5, 0, 0]]
    model = Votes(votes)
    e = explain(model, tokenizer, "superb fine dull")

    def p_pos(words):  # the probabilities by hand: softmax of the visible words' summed votes
        z = [sum(votes[tokenizer.words.index(w)][k] for w in words) for k in range(3)]
        return math.exp(z[2]) / sum(math.exp(v) for v in z)

    def odds(p):
        return math.log(p / (1 - p))

    full = p_pos(["superb", "fine", "dull"])
    assert e.label == "pos" and e.value == pytest.approx(full, rel=1e-6) and full > 0.999
    expected = [0.0, odds(full) - odds(p_pos(["fine", "dull"])), odds(full) - odds(p_pos(["superb", "dull"])),
                odds(full) - odds(p_pos(["superb", "fine"])), 0.0]
    assert e.occlusion == pytest.approx(expected, abs=1e-4)
    assert full - p_pos(["superb", "dull"]) < 1e-3 < 0.5 < e.occlusion[2]  # the probability saturates, log-odds not
    assert e.occlusion[3] < 0  # "dull" argues against "pos": hiding it raises the log-odds


def test_log_odds_keeps_a_confident_probabilitys_digits():
    logits = torch.tensor([[0.0, 20.0], [3.0, -1.0]])
    assert log_odds(logits, 1).tolist() == pytest.approx([20.0, -4.0], abs=1e-5)  # two labels: a logit difference
    three = torch.tensor([1.0, 2.0, 30.0])
    p = torch.softmax(three.double(), -1)
    assert float(log_odds(three, 2)) == pytest.approx(math.log(p[2] / (p[0] + p[1])), rel=1e-6)


def test_the_trained_classifiers_occlusion_equals_each_piece_hidden_alone(classifier_run):
    model = attnkit.load(classifier_run)
    module, tokenizer = model.module, model.tokenizers
    text = "a gorgeous, witty, seductive movie that drags in its last act."
    e = explain(module, tokenizer, text)
    ids, types = tokenizer.example(text)
    b = collate_sentences([(ids, types)], tokenizer.pad_id)

    def probabilities(hidden: int | None) -> torch.Tensor:  # one input at a time, in float64 from its logits
        mask = b.padding_mask.clone()
        if hidden is not None:
            mask[0, hidden] = True
        with torch.no_grad():
            return module(b.tokens, mask, b.token_types).logits[0].double().softmax(-1)

    p = probabilities(None)
    k = int(p.argmax())
    assert e.label == module.labels[k] and e.value == pytest.approx(float(p[k]), abs=1e-6)
    for t, piece in enumerate(e.pieces):
        if ids[t] in tokenizer.specials:
            assert e.occlusion[t] == 0.0, piece
            continue
        q = probabilities(t)
        expected = math.log(p[k] / (1 - p[k])) - math.log(q[k] / (1 - q[k]))
        assert e.occlusion[t] == pytest.approx(expected, abs=1e-3), piece
