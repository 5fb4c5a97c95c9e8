"""RNN encoder-decoders (RNNencdec, RNNsearch) and the convolutional encoder: the decoding interface, masking,
padding, training, checkpoints, and the alignment and BLEU-by-length commands."""

from __future__ import annotations

import collections
import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from attnkit import fast
from attnkit.cli import main
from attnkit.config import ExperimentConfig, config_from_dict, load_config
from attnkit.data import collate, generate_dates
from attnkit.decode import align, beam_search, greedy, max_lengths, translate
from attnkit.errors import AttnkitError
from attnkit.models import BOS, EOS, PAD, RNNSearch, build_model
from attnkit.models.conv import ConvTransformerConfig
from attnkit.models.rnn import RNNEncDecConfig, RNNSearchConfig
from attnkit.train import Trainer, load_checkpoint
from conftest import random_src, tiny_experiment, tiny_model_config

VOCAB = 23
LENGTHS = [6, 3, 5, 1]
VARIANTS = [
    ("rnn_encdec", {}),
    ("rnnsearch", {"attention_score": "additive"}),
    ("rnnsearch", {"attention_score": "general"}),
    ("rnnsearch", {"attention_score": "dot"}),
    ("rnnsearch", {"attention_score": "scaled_dot", "n_encoder_layers": 1, "n_decoder_layers": 1,
                   "share_embeddings": False}),
    ("conv_transformer", {}),
    ("conv_transformer", {"conv_kernel": 5, "norm_first": True}),
]
IDS = [f"{family}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for family, o in VARIANTS]


RNN_CONFIGS = {"rnn_encdec": RNNEncDecConfig, "rnnsearch": RNNSearchConfig}


def family_config(family: str, width: int, hidden: int, **overrides):
    """A tiny config of ``family`` (two layers each side, no dropout, tied embeddings): an RNN's word embeddings
    ``width`` wide and its GRUs ``hidden``; the convolutional Transformer's d_model ``width`` and d_ff ``hidden``."""
    if family in RNN_CONFIGS:
        base = {"embedding_size": width, "hidden_size": hidden, "n_encoder_layers": 2, "n_decoder_layers": 2,
                "dropout": 0.0, "share_embeddings": True}
        return RNN_CONFIGS[family](**(base | overrides))
    assert family == "conv_transformer", family
    base = dataclasses.asdict(tiny_model_config(d_model=width, d_ff=hidden))
    return ConvTransformerConfig(**(base | {"family": family} | overrides))


def _model(family: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_model(family_config(family, 16, 24, **overrides), VOCAB, VOCAB).eval()


@pytest.fixture(scope="module")
def src():
    return random_src(LENGTHS, vocab=VOCAB, seed=7)


@pytest.fixture(scope="module")
def tgt_in(src):
    return torch.cat([torch.full((src.size(0), 1), BOS), random_src([6] * src.size(0), VOCAB, seed=8)], 1)


def _unpadded(src, i):
    return src[i:i + 1, : int(src[i].ne(PAD).sum())]


# --- shapes, masking, the cached step


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=IDS)
@torch.no_grad()
def test_shapes(family, overrides, src, tgt_in):
    model = _model(family, **overrides)
    assert model(src, tgt_in).logits.shape == (src.size(0), tgt_in.size(1), VOCAB)
    memory = model.encode(src)
    width = {"rnn_encdec": 24, "rnnsearch": 2 * 24, "conv_transformer": 16}[family]
    length = 1 if family == "rnn_encdec" else src.size(1)  # the thought vector is one position
    assert memory.states.shape == (src.size(0), length, width)
    if family != "rnn_encdec":
        assert torch.equal(memory.padding_mask, src.eq(PAD))
        assert torch.all(memory.states[src.eq(PAD)] == 0)  # padding is zero in the memory
    else:  # no attention to show: the maps are empty
        assert model(src, tgt_in, need_weights=True).attention.cross == []


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=IDS)
@torch.no_grad()
def test_cached_steps_equal_teacher_forcing(family, overrides, src, tgt_in):
    model = _model(family, **overrides)
    full = F.log_softmax(model(src, tgt_in).logits, -1)
    state = model.init_state(model.encode(src))
    for t in range(tgt_in.size(1)):
        log_probs, state, attn = model.step(tgt_in[:, t], state, need_weights=True)
        assert (log_probs - full[:, t]).abs().max() <= 1e-5, t
        if family == "rnn_encdec":
            assert attn is None
        else:  # a distribution over the real source tokens only
            assert torch.allclose(attn.sum(-1), torch.ones(src.size(0)), atol=1e-5)
            assert torch.all(attn[src.eq(PAD)] == 0)


@pytest.mark.parametrize("score", ["additive", "general", "dot"])
@torch.no_grad()
def test_rnnsearch_alignments(score, src, tgt_in):
    """alpha [B, T, S]: rows sum to one, padded source positions get exactly zero, and the step reproduces them."""
    model = _model("rnnsearch", attention_score=score)
    logits, alphas = model.teacher_forced(src, tgt_in)
    assert alphas.shape == (src.size(0), tgt_in.size(1), src.size(1))
    assert torch.allclose(alphas.sum(-1), torch.ones(alphas.shape[:2]), atol=1e-6)
    assert torch.all(alphas.masked_select(src.eq(PAD)[:, None, :]) == 0)
    assert torch.all(alphas.masked_select(src.ne(PAD)[:, None, :]) > 0)
    assert torch.equal(logits, model(src, tgt_in).logits)
    out = model(src, tgt_in, need_weights=True)  # the contract's maps: one cross-attention layer of one head
    assert len(out.attention.cross) == 1 and not out.attention.encoder and not out.attention.decoder
    assert torch.equal(out.attention.cross[0], alphas[:, None]) and torch.equal(out.logits, logits)
    state = model.init_state(model.encode(src))
    for t in range(tgt_in.size(1)):
        _, state, attn = model.step(tgt_in[:, t], state, need_weights=True)
        assert torch.allclose(attn, alphas[:, t], atol=1e-6)


@torch.no_grad()
def test_rnnsearch_initial_state_comes_from_the_backward_encoder(src):
    """s_0 = tanh(W_s <-h_1): it changes with the first source word only through the backward GRU, and the
    backward half of the annotation at position 0 has read the whole (unpadded) sentence."""
    model = _model("rnnsearch", n_encoder_layers=1, n_decoder_layers=1)
    memory = model.encode(src)
    state = model.init_state(memory)
    expected = torch.tanh(model.init_h[0](memory.states[:, 0, 24:]))
    assert torch.allclose(state.h[0], expected)
    _, h_n = model.encoder(model.src_embed(_unpadded(src, 0)))  # a sentence without padding, run plainly
    assert torch.allclose(memory.states[0, 0, 24:], h_n[1, 0], atol=1e-6)  # h_n[1]: the backward direction


@torch.no_grad()
def test_rnnsearch_context_dropout_drops_annotation_units_in_training_only(src, tgt_in):
    """context_dropout acts on the annotations h_j: in training each unit is zero or scaled by 1 / (1 - p), in
    evaluation the model computes exactly what it computes without it."""
    plain, dropping = _model("rnnsearch", dropout=0.0), _model("rnnsearch", dropout=0.0, context_dropout=0.5)
    assert torch.equal(dropping(src, tgt_in).logits, plain(src, tgt_in).logits)
    annotations = plain.encode(src).states
    dropped = dropping.train().encode(src).states
    real = annotations != 0
    kept = dropped[real] != 0
    assert torch.allclose(dropped[real][kept], 2 * annotations[real][kept], atol=1e-6)
    assert 0.4 < kept.float().mean() < 0.6
    assert torch.all(dropped[~real] == 0)  # padding stays zero
    assert not torch.equal(dropping(src, tgt_in).logits, dropping(src, tgt_in).logits)  # fresh masks each pass


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=IDS)
@torch.no_grad()
def test_padding_never_changes_results(family, overrides, src, tgt_in):
    """Each sentence alone (no padding) scores exactly as it does in the padded batch, and as with extra padding."""
    model = _model(family, **overrides)
    batched = model(src, tgt_in).logits
    wider = model(torch.cat([src, torch.full((src.size(0), 3), PAD)], 1), tgt_in).logits
    assert (wider - batched).abs().max() <= 1e-5
    for i in range(src.size(0)):
        alone = model(_unpadded(src, i), tgt_in[i:i + 1]).logits
        assert (alone[0] - batched[i]).abs().max() <= 1e-5, i
        memory_alone, memory = model.encode(_unpadded(src, i)), model.encode(src)
        n = memory_alone.states.size(1)
        assert (memory_alone.states[0] - memory.states[i, :n]).abs().max() <= 1e-5


@pytest.mark.parametrize("family", ["rnn_encdec", "rnnsearch"])
@torch.no_grad()
def test_state_select_reorders_rows(family, src):
    model = _model(family)
    state = model.init_state(model.encode(src))
    _, state, _ = model.step(torch.full((src.size(0),), BOS), state)
    order, tokens = torch.tensor([2, 0, 0, 3]), torch.tensor([5, 6, 6, 7])
    picked, _, _ = model.step(tokens, state.select(order))
    for r, i in enumerate(order.tolist()):
        alone, _, _ = model.step(tokens[r:r + 1], state.select(torch.tensor([i])))
        assert (alone[0] - picked[r]).abs().max() <= 1e-5


# --- search


def _toy_trained(family: str, steps: int = 40, seed: int = 0):
    """Briefly trained to reverse and relabel its source, so that outputs vary with the input and end with EOS."""
    torch.manual_seed(seed)
    model = build_model(family_config(family, 32, 32), VOCAB, VOCAB)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        pairs = []
        for _ in range(16):
            s = torch.randint(4, VOCAB, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g).tolist()
            pairs.append((s, [(t * 3) % (VOCAB - 4) + 4 for t in reversed(s)]))
        b = collate([s for s, _ in pairs], [t for _, t in pairs], list(range(16)))
        loss = model(b.src, b.tgt_in, targets=b.tgt_out).loss
        opt.zero_grad()
        (loss / b.n_tokens).backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module", params=["rnn_encdec", "rnnsearch"])
def toy(request):
    return _toy_trained(request.param)


def test_beam_one_equals_greedy_and_batching_does_not_matter(toy, src):
    lens = max_lengths(src.ne(PAD).sum(1), 1.0, 4)
    greedy_hyps = greedy(toy, toy.init_state(toy.encode(src)), lens, need_weights=True)
    beams = beam_search(toy, toy.init_state(toy.encode(src)), lens, beam_size=1)
    assert [b[0].tokens for b in beams] == [g.tokens for g in greedy_hyps]
    assert len({tuple(g.tokens) for g in greedy_hyps}) > 1  # the outputs depend on the input
    wide = beam_search(toy, toy.init_state(toy.encode(src)), lens, beam_size=3, n_best=3)
    for i, g in enumerate(greedy_hyps):
        s = _unpadded(src, i)
        assert greedy(toy, toy.init_state(toy.encode(s)), lens[i:i + 1])[0].tokens == g.tokens
        alone = beam_search(toy, toy.init_state(toy.encode(s)), lens[i:i + 1], beam_size=3, n_best=3)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in wide[i]]
        if isinstance(toy, RNNSearch):  # alignments come out of the search: one row per output, EOS included
            assert g.attention.shape == (len(g.tokens) + 1, src.size(1))
            assert torch.all(g.attention[:, src[i].eq(PAD)] == 0)
        else:
            assert g.attention is None


# --- the trainer, checkpoints, the command line


def _experiment(family: str) -> ExperimentConfig:
    cfg = tiny_experiment(max_steps=60, lr=3e-3, warmup_steps=10, max_tokens=400)
    cfg.model = family_config(family, 32, 64, n_encoder_layers=1, n_decoder_layers=1, dropout=cfg.model.dropout,
                              **({} if family in RNN_CONFIGS else {"max_positions": cfg.model.max_positions}))
    return cfg


@pytest.fixture(scope="module", params=["rnn_encdec", "rnnsearch", "conv_transformer"])
def trained(request, tmp_path_factory):
    """60 steps on generated dates (a few seconds): the trainer, validation loss before and after, the run dir."""
    run = tmp_path_factory.mktemp(request.param)
    trainer = Trainer(_experiment(request.param), run, train_pairs=generate_dates(300, seed=0),
                      valid_pairs=generate_dates(40, seed=1))
    before = trainer.validate()["valid_loss"]
    result = trainer.train()
    return trainer, before, result["valid_loss"], run


def test_training_beats_a_unigram_baseline(trained):
    trainer, before, after, _ = trained
    data = trainer.task.data
    counts = collections.Counter(t for s in data["train"].tgt for t in s + [EOS])
    total = sum(counts.values())
    valid = [t for s in data["valid"].tgt for t in s + [EOS]]
    unigram = -sum(math.log(counts.get(t, 0.5) / total) for t in valid) / len(valid)
    assert after < before
    assert after < unigram - 0.2, (after, unigram)


@torch.no_grad()
def test_checkpoint_round_trips_to_identical_outputs(trained):
    trainer, _, _, run = trained
    model, cfg, toks, path = load_checkpoint(run)
    assert cfg == trainer.cfg and type(model) is type(trainer.model)
    trainer.model.eval()
    b = trainer.task.batch("valid", list(range(8)))
    core = model(b.src, b.tgt_in).logits  # the checkpoint loads as the core: the fast path gives the same
    torch.testing.assert_close(core, trainer.model(b.src, b.tgt_in).logits, rtol=1e-5, atol=1e-5)
    fast.use(model, *cfg.train.fast).eval()  # with the tricks the trainer ran, exactly its outputs
    assert torch.equal(model(b.src, b.tgt_in).logits, trainer.model(b.src, b.tgt_in).logits)
    sentences = generate_dates(6, seed=5).src
    ours = translate(model, toks, sentences, beam_size=2, max_len_b=5)
    theirs = translate(trainer.model, trainer.task.toks, sentences, beam_size=2, max_len_b=5)
    assert [t.text for t in ours] == [t.text for t in theirs]


def test_a_shortlist_serves_a_transformer_decoder_and_an_rnn_refuses_it(trained, tmp_path):
    """The convolutional encoder's Transformer decoder takes a shortlist (one of the whole vocabulary translates as
    none); the RNN decoders refuse one in a line, when the model is loaded."""
    import attnkit

    trainer, _, _, run = trained
    toks = load_checkpoint(run)[2]
    whole = tmp_path / "vmap.txt"
    whole.write_text("\t" + " ".join(toks.tgt.id_to_piece(range(toks.tgt.vocab_size))) + "\n", encoding="utf-8")
    if trainer.cfg.model.family != "conv_transformer":
        with pytest.raises(AttnkitError, match="has no vocabulary shortlist"):
            attnkit.load(run, compile=False, shortlist=whole)
        return
    sentences = generate_dates(6, seed=5).src
    assert attnkit.load(run, compile=False, shortlist=whole).translate(sentences, beam=2) == \
        attnkit.load(run, compile=False).translate(sentences, beam=2)


def test_align_command(trained, tmp_path, capsys):
    trainer, _, _, run = trained
    family = trainer.cfg.model.family
    png = tmp_path / "align.png"
    code = main(["align", "--checkpoint", str(run), "--src", "4 March 1997", "--beam", "2", "-o", str(png)])
    if family == "rnn_encdec":  # nothing to show: the decoder never looks at the source words
        assert code == 2 and "a rnn_encdec model has no alignment to show" in capsys.readouterr().err
        return
    assert code == 0 and png.stat().st_size > 0
    if family == "conv_transformer":  # a Transformer decoder: per layer and head
        assert main(["align", "--checkpoint", str(run), "--src", "4 March 1997", "--layer", "1", "--head", "2",
                     "-o", str(png)]) == 0
    else:  # one attention: layer 1 (head 1) is all there is
        assert main(["align", "--checkpoint", str(run), "--src", "x", "--layer", "1", "--head", "1",
                     "-o", str(png)]) == 0
        capsys.readouterr()
        assert main(["align", "--checkpoint", str(run), "--src", "x", "--layer", "2", "-o", str(png)]) == 2
        assert "a rnnsearch model has a single attention" in capsys.readouterr().err


@torch.no_grad()
def test_transformer_alignment_per_layer_and_head(trained_checkpoint, tmp_path):
    model, cfg, toks, _ = load_checkpoint(trained_checkpoint)
    sentence = "Tuesday, June 4th 1985"
    mean = align(model, toks, sentence, beam_size=1, layer=None)
    [t] = translate(model, toks, [sentence], beam_size=1, need_weights=True)
    assert mean.translation == t.text[0]
    assert torch.allclose(mean.weights, t.hypotheses[0].attention, atol=1e-5)  # the step's average, recomputed
    assert mean.weights.shape == (len(mean.target), len(mean.source))
    heads = [align(model, toks, sentence, beam_size=1, layer=layer, head=head).weights
             for layer in (1, 2) for head in (1, 2, 3, 4)]
    assert torch.allclose(torch.stack(heads).mean(0), mean.weights, atol=1e-5)
    layer2 = align(model, toks, sentence, beam_size=1, layer=2).weights
    assert torch.allclose(torch.stack(heads[4:]).mean(0), layer2, atol=1e-5)
    for w in heads:
        assert torch.allclose(w.sum(-1), torch.ones(w.size(0)), atol=1e-5)
    with pytest.raises(AttnkitError, match="layers 1..2 and heads 1..4"):
        align(model, toks, sentence, beam_size=1, layer=3)
    with pytest.raises(AttnkitError, match="--head needs --layer"):
        align(model, toks, sentence, beam_size=1, head=1)
    png = tmp_path / "a.png"
    assert main(["align", "--checkpoint", str(trained_checkpoint), "--src", sentence, "--layer", "2", "--head", "3",
                 "-o", str(png)]) == 0 and png.exists()


def test_evaluate_by_length_and_plot(trained_checkpoint, tmp_path):
    pairs = generate_dates(12, seed=9)
    (tmp_path / "src.txt").write_text("\n".join(pairs.src) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(pairs.tgt) + "\n")
    for name in ("a", "b"):
        assert main(["evaluate", "--checkpoint", str(trained_checkpoint), "--src", str(tmp_path / "src.txt"),
                     "--ref", str(tmp_path / "ref.txt"), "--by-length", "--length-edges", "3,5",
                     "--json", str(tmp_path / f"{name}.json"), "--beam", "1"]) == 0
    rows = json.loads((tmp_path / "a.json").read_text())["by_length"]
    assert [r["min_len"] for r in rows] == sorted(r["min_len"] for r in rows)
    assert sum(r["n"] for r in rows) == 12 and all(r["min_len"] in (0, 3, 5) for r in rows)
    png = tmp_path / "by_length.png"
    assert main(["plot-by-length", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--labels", "A", "B",
                 "-o", str(png)]) == 0 and png.stat().st_size > 0
    (tmp_path / "bad.json").write_text("{\"bleu\": 1}")
    assert main(["plot-by-length", str(tmp_path / "bad.json"), "-o", str(png)]) == 2
    assert main(["plot-by-length", str(tmp_path / "a.json"), "--labels", "A", "B", "-o", str(png)]) == 2


# --- configuration and data


@pytest.mark.parametrize("name", ["multi30k_en_de_rnnsearch", "multi30k_en_de_rnnencdec", "tatoeba_en_de_rnnsearch",
                                  "tatoeba_en_de_rnnencdec", "tatoeba_en_de_transformer"])
def test_configs_load(name):
    from pathlib import Path

    cfg = load_config(Path(__file__).parents[1] / "configs" / f"{name}.toml")
    assert cfg.name == name


@pytest.mark.parametrize("tatoeba,multi30k", [("tatoeba_en_de_rnnsearch", "multi30k_en_de_rnnsearch"),
                                               ("tatoeba_en_de_rnnencdec", "multi30k_en_de_rnnencdec"),
                                               ("tatoeba_en_de_transformer", "multi30k_en_de")])
def test_tatoeba_models_are_the_multi30k_ones(tatoeba, multi30k):
    from pathlib import Path

    configs = Path(__file__).parents[1] / "configs"
    assert load_config(configs / f"{tatoeba}.toml").model == load_config(configs / f"{multi30k}.toml").model


def test_config_errors():
    config_from_dict({"model": {"family": "conv_transformer", "conv_kernel": 5}})
    with pytest.raises(AttnkitError, match="conv_kernel = 4 must be a positive odd number"):
        config_from_dict({"model": {"family": "conv_transformer", "conv_kernel": 4}})
    with pytest.raises(AttnkitError, match=r"model.family = 'rnnsearch' goes with data.format = multi30k or .*"
                                           r"not 'flickr8k' \(which goes with model.family = show_attend_tell or "
                                           r"transformer_captioner\)"):
        config_from_dict({"model": {"family": "rnnsearch"}, "data": {"format": "flickr8k"}})
    with pytest.raises(AttnkitError, match=r"'show_attend_tell' goes with data.format = flickr8k, not 'multi30k'"):
        config_from_dict({"model": {"family": "show_attend_tell"}})
    with pytest.raises(AttnkitError, match="model.family = 'rnn' is not one of"):
        config_from_dict({"model": {"family": "rnn"}})


def test_tatoeba_long_test_split(data_dir):
    from attnkit.config import DataConfig
    from attnkit.data import load_split

    if not (data_dir / "tatoeba" / "deu-eng.zip").exists():
        pytest.skip("no Tatoeba deu-eng")
    cfg = DataConfig(format="tatoeba", long_test_min_words=15)
    splits = {s: load_split(cfg, s, str(data_dir)) for s in ("train", "valid", "test", "test_long")}
    assert sum(len(p.src) for p in splits.values()) == 169813
    assert len(splits["valid"].src) == 3397 and len(splits["test"].src) == 3396  # unchanged by the option
    long = splits["test_long"]
    assert len(long.src) > 500 and all(len(s.split()) >= 15 for s in long.src)
    assert not set(long.src) & set(splits["train"].src)  # held out by sentence, with all its translations
    with pytest.raises(AttnkitError, match="long_test_min_words"):
        load_split(DataConfig(format="tatoeba"), "test_long", str(data_dir))
