"""Language models: causality, the cached step, sampling against uncached recomputation, perplexity,
the character tokenizer and WikiText words, a short real run on Tiny Shakespeare, ``attnkit generate``."""

from __future__ import annotations

import collections
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_model

from attnkit import fast
from attnkit.cli import main
from attnkit.config import PRESETS, ExperimentConfig, config_from_dict
from attnkit.data import CharTokenizer, WordVocab, block_batch, shifted_blocks, stream_blocks
from attnkit.decode import beam_search, complete, filter_logits, greedy, sample
from attnkit.errors import AttnkitError
from attnkit.evaluate import bits_per_character, language_model_scores, sliding_window_scores
from attnkit.evaluate.perplexity import (
    cache_mixture_log_probs,
    continuous_cache_probs,
    sliding_window_states,
    sliding_windows,
)
from attnkit.models import BOS, EOS, PAD, UNK, TransformerLM, build_model
from attnkit.models.lm import LMConfig
from attnkit.train.checkpoint import load_weights
from attnkit.train.tasks import LanguageModelTask

VOCAB = 24


def lm_config(**overrides) -> LMConfig:
    base = PRESETS["lm_tiny"] | dict(d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, max_positions=64)
    return LMConfig(**(base | overrides))


def make_lm(seed: int = 0, **overrides) -> TransformerLM:
    torch.manual_seed(seed)
    return build_model(lm_config(**overrides), 0, VOCAB).eval()


def markov_stream(n: int, seed: int = 0) -> torch.Tensor:
    """Ids in [4, VOCAB) from a sparse random Markov chain: predictable, yet not deterministic."""
    g = torch.Generator().manual_seed(seed)
    nxt = torch.randint(4, VOCAB, (VOCAB, 3), generator=g)
    ids, cur = [], 4
    for _ in range(n):
        cur = int(nxt[cur, torch.randint(0, 3, (1,), generator=g)])
        ids.append(cur)
    return torch.tensor(ids)


@pytest.fixture(scope="module")
def toy_lm() -> TransformerLM:
    """A tiny LM trained briefly on a Markov stream: peaked distributions, and EOS (never a target) unlikely."""
    model = make_lm(seed=1)
    model.train()
    blocks = stream_blocks(markov_stream(16 * 24), 24)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):
        b = block_batch(blocks, list(range(blocks.size(0))))
        loss = F.cross_entropy(model(b.src, b.tgt_in).logits.flatten(0, 1), b.tgt_out.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


# --- the model


ADAPTIVE = {"share_embeddings": False, "adaptive_softmax": (8, 16)}  # head: 8 words + 2 clusters of 8
ADAPTIVE_TIED = ADAPTIVE | {"share_embeddings": True}  # adaptive input sharing the softmax's weights


@pytest.mark.parametrize("overrides", [{}, {"norm_first": False, "positional": "sinusoidal", "activation": "relu"},
                                       ADAPTIVE, ADAPTIVE_TIED])
@torch.no_grad()
def test_logits_never_see_the_future(overrides):
    model = make_lm(**overrides)
    x = torch.randint(4, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    base = model(None, x).logits
    for t in range(11):
        changed = x.clone()
        changed[:, t + 1:] = torch.randint(4, VOCAB, (2, 11 - t), generator=torch.Generator().manual_seed(t + 1))
        out = model(None, changed).logits
        assert (out[:, : t + 1] - base[:, : t + 1]).abs().max() <= 1e-6
        assert (out[:, t + 1:] - base[:, t + 1:]).abs().max() > 1e-3  # the later positions do read them


@pytest.mark.parametrize("overrides", [{}, {"norm_first": False, "positional": "sinusoidal"},
                                       {"share_embeddings": False}, ADAPTIVE, ADAPTIVE_TIED])
@torch.no_grad()
def test_cached_steps_equal_teacher_forcing(overrides):
    model = make_lm(seed=2, **overrides)
    x = torch.cat([torch.full((3, 1), BOS), torch.randint(4, VOCAB, (3, 15))], 1)
    full = F.log_softmax(model(None, x).logits, -1)
    state = model.init_state(model.encode(x))
    for t in range(x.size(1)):
        log_probs, state, attn = model.step(x[:, t], state, need_weights=True)
        assert (log_probs - full[:, t]).abs().max() <= 1e-5
        assert attn.shape == (3, t + 1) and torch.allclose(attn.sum(-1), torch.ones(3), atol=1e-5)
        state = state.select(torch.arange(3))  # reordering by identity changes nothing


def test_adaptive_softmax_is_a_distribution_and_its_training_loss_is_its_likelihood():
    model = make_lm(seed=3, **ADAPTIVE)
    x = torch.cat([torch.full((2, 1), BOS), torch.randint(4, VOCAB, (2, 9))], 1)
    y = torch.arange(4, VOCAB).view(2, 10)  # targets in the head (< 8) and in both tail clusters
    y[1, 7:] = PAD  # padding is never scored
    log_probs = model(None, x).logits
    assert torch.allclose(log_probs.logsumexp(-1), torch.zeros(2, 10), atol=1e-5)
    direct = -log_probs.gather(-1, y[..., None]).squeeze(-1)[y.ne(PAD)].sum()
    out = model(None, x, targets=y, label_smoothing=0.1)  # no smoothing on the adaptive softmax's path
    assert torch.allclose(out.loss, direct, atol=1e-4) and torch.allclose(out.nll, direct, atol=1e-4)
    untied = make_lm(seed=3, share_embeddings=False)
    full = F.cross_entropy(untied(None, x).logits.flatten(0, 1), y.flatten(), ignore_index=PAD, reduction="sum")
    smoothed = F.cross_entropy(untied(None, x).logits.flatten(0, 1), y.flatten(), ignore_index=PAD,
                               reduction="sum", label_smoothing=0.1)
    for tricks in ((), ("fused_loss",)):  # the core's projection + loss, then the fast runtime's fused one
        fast.use(untied, *tricks)
        assert ("projected_loss" in vars(untied)) == bool(tricks)  # the fused loss is (not) installed
        assert torch.allclose(untied(None, x, targets=y).loss, full, atol=1e-4), tricks
        out = untied(None, x, targets=y, label_smoothing=0.1)
        assert torch.allclose(out.loss, smoothed, atol=1e-4) and torch.allclose(out.nll, full, atol=1e-4), tricks


def test_adaptive_input_is_the_adaptive_softmax_read_backwards(tmp_path):
    model = make_lm(seed=4, **ADAPTIVE_TIED)
    lookup, softmax = model.embed.tokens, model.output
    assert lookup.head is softmax.head.weight
    assert all(e is t[1].weight and p is t[0].weight
               for e, p, t in zip(lookup.embeddings, lookup.projections, softmax.tail))
    untied = make_lm(seed=4, **ADAPTIVE)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == sum(p.numel() for p in untied.parameters()) - untied.embed.tokens.weight.numel()
    ids = torch.tensor([[PAD, 5, 7], [8, 15, 16], [23, 12, 3]])  # pad, head words, both tail clusters
    rows = lookup(ids)
    tail1, tail2 = softmax.tail
    expected = {5: softmax.head.weight[5], 7: softmax.head.weight[7], 3: softmax.head.weight[3],
                8: tail1[1].weight[0] @ tail1[0].weight, 15: tail1[1].weight[7] @ tail1[0].weight,
                12: tail1[1].weight[4] @ tail1[0].weight,
                16: tail2[1].weight[0] @ tail2[0].weight, 23: tail2[1].weight[7] @ tail2[0].weight}
    for (i, j), token in zip([(i, j) for i in range(3) for j in range(3)], ids.flatten().tolist()):
        want = torch.zeros(32) if token == PAD else expected[token]
        assert torch.allclose(rows[i, j], want, atol=1e-6), token
    rows.sum().backward()  # the input path alone trains the shared weights, but never the padding row
    assert softmax.head.weight.grad[PAD].abs().max() == 0 and softmax.head.weight.grad[5].abs().max() > 0
    assert tail2[1].weight.grad[7].abs().max() > 0 and tail2[0].weight.grad.abs().max() > 0
    # a checkpoint stores each shared tensor once and loads back tied, with the same outputs
    save_model(model, str(tmp_path / "model.safetensors"))
    loaded = make_lm(seed=9, **ADAPTIVE_TIED)
    load_weights(loaded, tmp_path / "model.safetensors")
    assert loaded.embed.tokens.head is loaded.output.head.weight
    x = torch.cat([torch.full((3, 1), BOS), ids[:, 1:]], 1)
    assert torch.equal(loaded(None, x).logits, model(None, x).logits)


def test_adaptive_softmax_configs_are_checked():
    table = {"model": {"family": "transformer_lm", "preset": "lm_tiny", "adaptive_softmax": [2000, 10000]},
             "data": {"format": "wikitext2"}, "train": {"label_smoothing": 0.0}}
    assert config_from_dict(table).model.share_embeddings  # tied: adaptive input and softmax
    table["model"]["share_embeddings"] = False
    assert config_from_dict(table).model.adaptive_softmax == (2000, 10000)
    with pytest.raises(AttnkitError, match="increasing"):
        config_from_dict(table | {"model": table["model"] | {"adaptive_softmax": [10000, 2000]}})
    with pytest.raises(AttnkitError, match="last cutoff"):
        build_model(lm_config(**ADAPTIVE | {"adaptive_softmax": (8, 24)}), 0, VOCAB)


def test_embeddings_tied_and_presets_sized_like_gpt2():
    model = make_lm()
    assert model.output.weight is model.embed.tokens.weight
    with torch.device("meta"):  # shapes only: no memory, no time
        gpt2 = build_model(LMConfig(preset="gpt2_small", **PRESETS["gpt2_small"]), 0, 50257)
    assert sum(p.numel() for p in gpt2.parameters()) == 124_439_808  # GPT-2 small, counted the same way
    assert len(gpt2.layers) == 12 and gpt2.cfg.d_model == 768 and gpt2.cfg.norm_first


def test_config_pairs_language_models_with_text_streams():
    cfg = config_from_dict({"model": {"preset": "lm_small", "family": "transformer_lm"},
                            "data": {"format": "wikitext2", "block_size": 128}})
    assert type(cfg.model) is LMConfig and cfg.model.n_layers == 4 and cfg.model.norm_first
    assert cfg.data.block_size == 128
    with pytest.raises(AttnkitError, match="transformer_lm"):
        config_from_dict({"model": {"family": "transformer_lm"}, "data": {"format": "multi30k"}})
    with pytest.raises(AttnkitError, match="transformer_lm"):
        config_from_dict({"data": {"format": "tinyshakespeare"}})


# --- sampling through the cache against recomputing every prefix


@torch.no_grad()
def uncached(model, prefix: list[int], n_steps: int, temperature: float, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0) -> list[int]:
    """The definition of sampling: run the whole sequence through ``forward`` at every step."""
    g = torch.Generator().manual_seed(seed)
    seq, out = [BOS], []
    for t in range(n_steps - 1):  # sample's last step only ends the sequence
        log_probs = F.log_softmax(model(None, torch.tensor([seq])).logits[:, -1].float(), -1)
        if t < len(prefix):
            token = prefix[t]
        elif temperature == 0:
            token = int(log_probs.argmax(-1))
        else:
            logits = filter_logits(log_probs / temperature, top_k, top_p)
            token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g))
        if token == EOS:
            break
        out.append(token)
        seq.append(token)
    return out


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 5, 1.0), (1.2, 0, 0.9)])
def test_cached_generation_equals_uncached(toy_lm, temperature, top_k, top_p):
    prefix = [5, 9, 7]
    state = toy_lm.init_state(toy_lm.encode(torch.zeros(1, 0, dtype=torch.long)))
    hyp = sample(toy_lm, state, torch.tensor([30]), temperature, top_k, top_p, torch.Generator().manual_seed(4),
                 prefix=torch.tensor([prefix]))[0]
    assert hyp.tokens == uncached(toy_lm, prefix, 30, temperature, top_k, top_p, seed=4)
    assert hyp.tokens[:3] == prefix and len(hyp.tokens) > 20  # the model rarely picks EOS: a real test


def test_temperature_zero_is_greedy(toy_lm):
    def state():
        return toy_lm.init_state(toy_lm.encode(torch.zeros(2, 0, dtype=torch.long)))

    lens = torch.tensor([25, 25])
    g = [h.tokens for h in greedy(toy_lm, state(), lens)]
    assert [h.tokens for h in sample(toy_lm, state(), lens, temperature=0.0)] == g
    assert [h.tokens for h in sample(toy_lm, state(), lens, temperature=1.0, top_k=1)] == g  # only the argmax left
    assert g[0] == uncached(toy_lm, [], 25, 0.0)
    beams = beam_search(toy_lm, state(), lens, beam_size=1)  # the state reorders by beam like any other
    assert [b[0].tokens for b in beams] == g
    assert len(beam_search(toy_lm, state(), lens, beam_size=3, n_best=3)[0]) == 3


def test_same_seed_same_sample_and_streaming_shows_the_final_text(toy_lm, tmp_path):
    tok = CharTokenizer.build("".join(chr(ord("a") + i) for i in range(VOCAB - 4)), tmp_path / "chars.json")
    pieces = []
    a = complete(toy_lm, tok, "bfd", max_new_tokens=15, temperature=1.0, seed=3, on_text=pieces.append)
    b = complete(toy_lm, tok, "bfd", max_new_tokens=15, temperature=1.0, seed=3)
    assert a.text == b.text and a.text.startswith("bfd") and "".join(pieces) == a.text
    assert pieces[:3] == ["b", "f", "d"] and len(a.hypothesis.tokens) <= 3 + 15
    with pytest.raises(AttnkitError, match="positions"):
        complete(toy_lm, tok, "b" * 63, max_new_tokens=5)  # BOS, 63 prompt tokens and a new one: 65 > 64


@torch.no_grad()
def test_generation_past_the_positions_slides_its_window(toy_lm, tmp_path):
    """64 learned positions: the first window holds BOS + 63 tokens, then the cache restarts from BOS and
    the last 32 tokens, as a training block starts mid-text."""
    tok = CharTokenizer.build("".join(chr(ord("a") + i) for i in range(VOCAB - 4)), tmp_path / "chars.json")
    pieces = []
    c = complete(toy_lm, tok, "bfd", max_new_tokens=150, temperature=0.0, on_text=pieces.append)
    ids = c.hypothesis.tokens
    assert len(ids) == 3 + 150 and "".join(pieces) == c.text and len(c.hypothesis.log_probs) == 150 + 3 + 1
    assert ids[:63] == uncached(toy_lm, ids[:3], 64, 0.0)  # the first window is plain greedy decoding
    # the second window reads BOS + ids[31:63] and makes ids[63:94]; the third starts from ids[62:94]
    for start, t in ((31, 63), (31, 64), (31, 93), (62, 94), (62, 100)):
        assert int(toy_lm(None, torch.tensor([[BOS] + ids[start:t]])).logits[0, -1].argmax()) == ids[t]


# --- perplexity


@torch.no_grad()
def test_perplexity_matches_a_direct_computation():
    model = make_lm(seed=5)
    stream = markov_stream(50, seed=2)
    blocks = stream_blocks(stream, 16)  # 4 blocks, the last holds 2 tokens and PAD
    assert blocks.shape == (4, 16) and int(blocks.ne(PAD).sum()) == 50
    scores = language_model_scores(model, blocks, batch_blocks=3, characters=True)
    # directly: every token of the stream, given BOS and the earlier tokens of its block, one step at a time
    nll = 0.0
    for start in range(0, 50, 16):
        state = model.init_state(model.encode(torch.zeros(1, 0)))
        previous = BOS
        for token in stream[start:start + 16].tolist():
            log_probs, state, _ = model.step(torch.tensor([previous]), state)
            nll -= float(log_probs[0, token])
            previous = token
    assert scores["tokens"] == 50
    assert scores["loss"] == pytest.approx(nll / 50, rel=1e-5)
    assert scores["ppl"] == pytest.approx(math.exp(nll / 50), rel=1e-5)
    assert scores["bpc"] == pytest.approx(nll / 50 / math.log(2), rel=1e-5)


@torch.no_grad()
def test_bits_per_character_is_the_loss_in_bits():
    """bpc = loss / ln 2: a character model that spreads each prediction evenly over its 24 symbols spends
    log2(24) bits on each character, and a trained one its mean NLL in nats over ln 2."""
    model = make_lm(seed=7, share_embeddings=False)
    model.output.weight.zero_()  # every logit 0: the uniform distribution
    blocks = stream_blocks(markov_stream(40, seed=4), 16)
    scores = language_model_scores(model, blocks, batch_blocks=2, characters=True)
    assert scores["loss"] == pytest.approx(math.log(VOCAB), rel=1e-6)
    assert scores["bpc"] == pytest.approx(math.log2(VOCAB), rel=1e-6)
    assert bits_per_character(math.log(2)) == pytest.approx(1.0)
    trained = language_model_scores(make_lm(seed=5), blocks, batch_blocks=2, characters=True)
    assert trained["bpc"] == bits_per_character(trained["loss"]) == pytest.approx(trained["loss"] / math.log(2))
    assert "bpc" not in language_model_scores(model, blocks, batch_blocks=2)  # tokens that are not characters


@torch.no_grad()
def test_sliding_window_scores_every_token_once_with_its_window_before_it():
    assert sliding_windows(20, 8, 4) == [(0, 8, 0), (4, 12, 8), (8, 16, 12), (12, 20, 16)]
    assert sliding_windows(10, 8, 8) == [(0, 8, 0), (8, 10, 8)]  # stride = window: the disjoint blocks
    model = make_lm(seed=6)
    stream = markov_stream(50, seed=3)
    scores = sliding_window_scores(model, stream, window=16, stride=6, batch_windows=3, characters=True)
    nll = 0.0  # directly: each token from BOS and the tokens of its window before it, one forward pass each
    for begin, end, scored in sliding_windows(50, 16, 6):
        for i in range(scored, end):
            log_probs = F.log_softmax(model(None, torch.tensor([[BOS] + stream[begin:i].tolist()])).logits[0, -1],
                                      -1)
            nll -= float(log_probs[stream[i]])
    assert scores["tokens"] == 50 and scores["loss"] == pytest.approx(nll / 50, rel=1e-5)
    assert scores["bpc"] == pytest.approx(nll / 50 / math.log(2), rel=1e-5)
    blocks = language_model_scores(model, stream_blocks(stream, 16), batch_blocks=2)
    assert sliding_window_scores(model, stream, 16, 16)["loss"] == pytest.approx(blocks["loss"], rel=1e-6)


@pytest.mark.parametrize("overrides", [{}, ADAPTIVE])
@torch.no_grad()
def test_sliding_window_states_give_the_sliding_window_scores(overrides):
    model = make_lm(seed=7, **overrides)
    stream = markov_stream(70, seed=4)
    states, log_probs = sliding_window_states(model, stream, window=16, stride=6, batch_windows=4)
    assert states.shape == (70, 32) and log_probs.shape == (70,)
    expected = sliding_window_scores(model, stream, window=16, stride=6, batch_windows=4)["loss"]
    assert float(-log_probs.mean()) == pytest.approx(expected, rel=1e-5)


def test_continuous_cache_is_grave_et_al_eq_2_and_a_distribution():
    g = torch.Generator().manual_seed(0)
    states, stream = torch.randn(40, 8, generator=g), torch.randint(0, 6, (40,), generator=g)
    theta, size = 0.7, 9
    got = continuous_cache_probs(states, stream, theta, size, chunk=7)  # chunks that cut the cache
    for t in range(40):  # directly: a softmax over the cached states, summed where the cached word is x_t
        keys = range(max(0, t - size), t)
        if not keys:
            assert got[t] == 0
            continue
        weights = torch.softmax(torch.stack([theta * states[t] @ states[i] for i in keys]), 0)
        expected = sum(float(w) for w, i in zip(weights, keys) if stream[i] == stream[t])
        assert float(got[t]) == pytest.approx(expected, abs=1e-6)
    for t in (1, 5, 30):  # over every word the cache could predict at t, its probabilities sum to one
        total = 0.0
        for word in range(6):
            other = stream.clone()
            other[t] = word
            total += float(continuous_cache_probs(states, other, theta, size)[t])
        assert total == pytest.approx(1.0, abs=1e-6)


@torch.no_grad()
def test_the_cache_mixture_keeps_the_model_at_lambda_zero_and_recalls_a_repeated_text():
    model = make_lm(seed=8)
    g = torch.Generator().manual_seed(1)
    text = torch.randint(4, VOCAB, (40,), generator=g)
    stream = torch.cat([text, text])  # the second copy: every window of it has been seen, with its next word
    states, log_probs = sliding_window_states(model, stream, window=16, stride=8)
    cache = continuous_cache_probs(states, stream, theta=1.0, cache_size=60)
    torch.testing.assert_close(cache_mixture_log_probs(log_probs, cache, 0.0), log_probs)
    mixed = cache_mixture_log_probs(log_probs, cache, 0.5)
    assert mixed[0] == log_probs[0]  # nothing cached yet
    second = slice(56, 80)  # windows whose whole context repeats the first copy's
    assert float(cache[second].mean()) > 0.9
    assert float(-mixed[second].mean()) < math.log(2) + 0.2 < float(-log_probs[second].mean())


def test_block_batch_shifts_each_block_behind_bos():
    blocks = stream_blocks(torch.arange(4, 14), 4)  # 10 ids -> 3 blocks
    b = block_batch(blocks, [2, 0])
    assert b.tgt_out.tolist() == [[12, 13, PAD, PAD], [4, 5, 6, 7]]
    assert b.tgt_in.tolist() == [[BOS, 12, 13, PAD], [BOS, 4, 5, 6]]
    assert b.src.shape == (2, 0) and b.n_tokens == 6


def test_shifted_blocks_are_windows_of_the_stream():
    stream = torch.arange(4, 14)  # 10 ids
    assert shifted_blocks(stream, [0, 1, 2], 4, 0).tolist() == stream_blocks(stream, 4).tolist()
    assert shifted_blocks(stream, [2, 0], 4, 3).tolist() == [[PAD] * 4, [7, 8, 9, 10]]
    assert shifted_blocks(stream, [1], 4, 3).tolist() == [[11, 12, 13, PAD]]


def test_training_batches_move_their_windows_and_validation_stays_put(tmp_path):
    cfg = config_from_dict({"model": {"preset": "lm_tiny", "family": "transformer_lm"},
                            "data": {"format": "tinyshakespeare", "block_size": 8}})
    g = torch.Generator().manual_seed(0)
    text = "".join(chr(97 + int(i)) for i in torch.randint(0, 26, (400,), generator=g))
    task = LanguageModelTask(cfg, tmp_path, texts={"train": [text], "valid": [text[:80]]})
    windows = task.streams["train"].unfold(0, 8, 1)  # [393, 8]: every window of the stream

    def start(row):  # where in the stream this row begins (random text: the window is unique)
        return int((windows == row).all(1).nonzero()[0])

    offsets = set()
    for indices in ([0, 1], [1, 0], [3, 5, 7], [2], [4, 6]):
        b = task.batch("train", indices)
        assert b.indices == indices and b.tgt_in[:, 0].eq(BOS).all()
        starts = [start(row) for row in b.tgt_out]  # every row is a window of the training stream...
        assert [s - i * 8 for s, i in zip(starts, indices)] == [starts[0] - indices[0] * 8] * len(indices)
        offsets.add(starts[0] - indices[0] * 8)  # ...all cut at one offset per batch
    assert len(offsets) > 1 and all(0 <= o < 8 for o in offsets)
    assert torch.equal(task.batch("train", [3, 5, 7]).tgt_out, task.batch("train", [3, 5, 7]).tgt_out)
    assert torch.equal(task.batch("valid", [1]).tgt_out, task.blocks["valid"][[1]])


# --- tokenizers


def test_char_tokenizer_round_trip(tmp_path):
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
    tok = CharTokenizer.build(text, tmp_path / "chars.json")
    assert tok.vocab_size == 4 + len(set(text))
    ids = tok.encode([text, "speak"])
    assert min(min(i) for i in ids) > EOS and tok.decode(ids[0]) == text
    again = CharTokenizer(tmp_path / "chars.json")  # as a checkpoint reloads it
    assert again.encode([text]) == [ids[0]] and again.decode(ids[1]) == "speak"
    assert tok.encode(["Zq"]) == [[UNK, UNK]] and tok.pieces("aZ") == ["a", "<unk>"]
    assert tok.decode([BOS, *tok.encode(["hear"])[0], EOS, PAD]) == "hear"
    assert tok.id_to_piece(tok.encode(["\n "])[0]) == ["\n", " "]
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(AttnkitError, match="bad.json"):
        CharTokenizer(tmp_path / "bad.json")


def test_word_vocab_keeps_a_pretokenized_corpus_as_it_is(tmp_path):
    lines = [" = Valkyria Chronicles III = <eos>", " The game 's <unk> , Sega . <eos>", " <eos>"]
    vocab = WordVocab.build(lines, tmp_path / "vocab.txt", min_count=1, pretokenized=True)
    assert vocab.itos.count("<unk>") == 1  # the corpus's own <unk> is UNK
    ids = vocab.encode(lines)
    assert ids[1][3] == UNK and vocab.id_to_piece(ids[1][:3]) == ["The", "game", "'s"]
    assert vocab.id_to_piece(ids[2]) == ["<eos>"] and vocab.encode(["the Game"]) == [[UNK, UNK]]
    assert vocab.decode(ids[0]) == "= Valkyria Chronicles III = <eos>"
    captions = WordVocab.build(["A dog, a Dog."], tmp_path / "captions.txt", min_count=1)  # unchanged: lowercased
    assert captions.itos[4:] == ["a", "dog"]


# --- a real run: Tiny Shakespeare through the common Trainer, then attnkit generate


@pytest.fixture(scope="module")
def shakespeare_run(tmp_path_factory, data_dir):
    from attnkit.train import Trainer

    cfg = ExperimentConfig(name="shakespeare_tiny")
    cfg.model = lm_config(d_model=64, n_heads=4, d_ff=256)
    cfg.data = dataclasses.replace(cfg.data, format="tinyshakespeare", block_size=64, max_train_pairs=1500,
                                   max_valid_pairs=100)
    cfg.train = dataclasses.replace(cfg.train, seed=1, max_tokens=2048, max_steps=150, lr=3e-3, schedule="constant",
                                    warmup_steps=0, label_smoothing=0.0, eval_every=0, save_every=0, progress=False,
                                    threads=1)
    run = tmp_path_factory.mktemp("shakespeare")
    trainer = Trainer(cfg, run, data_dir=str(data_dir))
    return trainer, trainer.train(), run


def test_short_shakespeare_run_beats_the_unigram_entropy(shakespeare_run):
    trainer, result, _ = shakespeare_run
    train = trainer.task.blocks["train"]
    counts = collections.Counter(train[train.ne(PAD)].tolist())
    n = sum(counts.values())
    unigram = -sum(c / n * math.log(c / n) for c in counts.values())  # nats per character of the slice
    assert 3.0 < unigram < 3.6
    assert result["valid_loss"] < unigram - 0.5, (result, unigram)
    assert result["valid_bpc"] == pytest.approx(result["valid_loss"] / math.log(2), rel=1e-4)


def test_generate_streams_a_continuation(shakespeare_run, capsys):
    _, _, run = shakespeare_run
    args = ["generate", "--checkpoint", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "40", "--seed", "7",
            "--top-k", "10"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert first.startswith("ROMEO:") and len(first) <= len("ROMEO:") + 40 + 1 and first.endswith("\n")
    assert main(args) == 0
    assert capsys.readouterr().out == first  # a seed fixes the sample
    assert main([*args[:7], "--temperature", "0"]) == 0  # greedy
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(run), "--max-new-tokens", "100", "--seed", "1"]) == 0
    assert len(capsys.readouterr().out) == 100 + 1  # past the 64 positions: the window slides
    assert main(["generate", "--checkpoint", str(run), "--prompt", "A" * 70]) == 2
    assert "positions" in capsys.readouterr().err


def test_generate_refuses_a_translation_checkpoint(trained_checkpoint, capsys):
    assert main(["generate", "--checkpoint", str(trained_checkpoint), "--prompt", "x"]) == 2
    assert f"{trained_checkpoint}: a transformer model cannot generate" in capsys.readouterr().err


# --- transfer: a shared SentencePiece model, then fine-tuning from another run's weights


def _spm_lm_config(run_name: str, spm_model: str, **train) -> ExperimentConfig:
    cfg = ExperimentConfig(name=run_name)
    cfg.model = lm_config(d_model=32, n_heads=2, d_ff=64)
    cfg.data = dataclasses.replace(cfg.data, format="wikitext2", block_size=32, lm_tokenizer="spm",
                                   spm_model=spm_model)
    cfg.train = dataclasses.replace(cfg.train, seed=1, max_tokens=256, max_steps=3, lr=1e-3, schedule="constant",
                                    warmup_steps=0, label_smoothing=0.0, eval_every=0, save_every=0, progress=False,
                                    threads=1, **train)
    return cfg


def test_spm_language_model_ends_lines_with_eos(tmp_path):
    from attnkit.data import EOS, train_tokenizer

    lines = ["the cat sat on the mat <eos>", " <eos>", "a dog ran <eos>"] * 30
    spm_path = train_tokenizer([line.removesuffix("<eos>") for line in lines], tmp_path / "shared.model", 40).path
    cfg = _spm_lm_config("spm", str(spm_path))
    task = LanguageModelTask(cfg, tmp_path / "run", texts={"train": lines, "valid": lines[:3]})
    assert (tmp_path / "run" / "spm.model").read_bytes() == spm_path.read_bytes()  # a copy: the run stands alone
    stream = task.streams["train"].tolist()
    assert stream.count(EOS) == len(lines)  # one EOS per line, the written <eos> dropped
    first = stream[: stream.index(EOS)]
    assert task.tokenizer.decode(first) == "the cat sat on the mat"

    shakespeare = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, format="tinyshakespeare"))
    assert LanguageModelTask.lines(shakespeare, ["First:\nSpeak.\n"]) == ["First:", "Speak.", ""]


def test_init_from_starts_from_the_pretrained_weights_and_checks_the_tokenizer(tmp_path):
    from attnkit.data import train_tokenizer
    from attnkit.train import Trainer, load_checkpoint

    lines = [f"word{i % 7} and word{i % 5} <eos>" for i in range(200)]
    texts = {"train": lines, "valid": lines[:20]}
    shared = train_tokenizer([line.removesuffix("<eos>") for line in lines], tmp_path / "shared.model", 30).path
    pre_cfg = _spm_lm_config("pre", str(shared))
    pre = Trainer(pre_cfg, tmp_path / "pre", task=LanguageModelTask(pre_cfg, tmp_path / "pre", texts=texts))
    pre.train()
    pretrained, _, _, _ = load_checkpoint(tmp_path / "pre" / "checkpoints" / "last")

    cfg = _spm_lm_config("fine", str(shared), init_from=str(tmp_path / "pre"))
    fine = Trainer(cfg, tmp_path / "fine", task=LanguageModelTask(cfg, tmp_path / "fine", texts=texts))
    for (name, a), b in zip(fine.model.state_dict().items(), pretrained.state_dict().values()):
        assert torch.equal(a, b), name
    torch.manual_seed(0)
    scratch = Trainer(_spm_lm_config("scratch", str(shared)), tmp_path / "scratch",
                      task=LanguageModelTask(_spm_lm_config("scratch", str(shared)), tmp_path / "scratch", texts=texts))
    assert not torch.equal(scratch.model.embed.tokens.weight, fine.model.embed.tokens.weight)

    other = train_tokenizer([f"other words {i}" for i in range(100)], tmp_path / "other.model", 30).path
    bad = _spm_lm_config("bad", str(other), init_from=str(tmp_path / "pre"))
    with pytest.raises(AttnkitError, match="init_from.*spm.model"):
        Trainer(bad, tmp_path / "bad", task=LanguageModelTask(bad, tmp_path / "bad", texts=texts))
