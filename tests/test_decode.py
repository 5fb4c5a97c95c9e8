"""Decoding: the cached step against the full forward pass; greedy, beam search, sampling, filtering."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import attnkit.fast
from attnkit.decode import beam_search, filter_logits, generate, greedy, max_lengths, sample, translate
from attnkit.decode.search import Hypothesis
from attnkit.fast import FastDecoder, compile_step, ranking
from attnkit.fast.decoding import GroupedDecoderState
from attnkit.models import BOS, EOS, PAD, GenerativeModel
from conftest import make_model, random_src, toy_trained_model

VOCAB = 23
LENGTHS = [6, 3, 5, 1]


class EosBiased(GenerativeModel):
    """A model wrapper that makes EOS more likely, so hypotheses end at different lengths. A model of the contract
    (its family, capabilities and config are the wrapped model's), so that a :class:`FastDecoder` can decode it."""

    def __init__(self, model, bias: float):
        super().__init__()
        self.model, self.bias = model, bias
        self.capabilities, self.cfg = model.capabilities, model.cfg  # its family: its config's

    def encode(self, src):
        return self.model.encode(src)

    def init_state(self, memory):
        return self.model.init_state(memory)

    def step(self, tokens, state, need_weights=False):
        log_probs, state, attn = self.model.step(tokens, state, need_weights)
        log_probs = log_probs.clone()
        log_probs[:, EOS] += self.bias
        return torch.log_softmax(log_probs, -1), state, attn

    @torch.no_grad()
    def teacher_forced(self, src, tgt_in):
        log_probs = torch.log_softmax(self.model(src, tgt_in).logits, -1)
        log_probs[..., EOS] += self.bias
        return torch.log_softmax(log_probs, -1)


@pytest.fixture(scope="module")
def model():
    return toy_trained_model(vocab=VOCAB, steps=60)


@pytest.fixture(scope="module")
def biased(model):
    return EosBiased(model, 1.0)


@pytest.fixture(scope="module")
def src():
    return random_src(LENGTHS, vocab=VOCAB, seed=7)


def _init(model, src):
    return model.init_state(model.encode(src))


def _max_lens(src, a=1.0, b=4):
    return max_lengths(src.ne(PAD).sum(1), a, b)


def _unpadded(src, i):
    n = int(src[i].ne(PAD).sum())
    return src[i:i + 1, :n]


def _ranked(m, chunk, monkeypatch):
    """``m`` itself (chunk None: the core search's argmax and top-k), or a :class:`FastDecoder` of it that ranks with
    the chunked kernels of ``attnkit.fast.ranking`` in chunks of ``chunk`` at any size, its steps the model's own
    (``grouped=False``): only the ranking differs."""
    if chunk is None:
        return m
    monkeypatch.setattr(ranking, "CHUNK", chunk)
    monkeypatch.setattr(ranking, "SMALL", 0)
    return FastDecoder(m, grouped=False)


# --- the incremental step


@torch.no_grad()
def test_cached_steps_equal_full_forward(model, src):
    tgt_in = torch.cat([torch.full((src.size(0), 1), BOS), random_src([7] * src.size(0), VOCAB, seed=8)], 1)
    full = F.log_softmax(model(src, tgt_in).logits, -1)
    state = _init(model, src)
    for t in range(tgt_in.size(1)):
        log_probs, state, attn = model.step(tgt_in[:, t], state, need_weights=True)
        assert state.offset == t + 1
        assert (log_probs - full[:, t]).abs().max() <= 1e-5, t
        # cross-attention averaged over heads and layers: a distribution over real source tokens only
        assert torch.allclose(attn.sum(-1), torch.ones(src.size(0)), atol=1e-5)
        assert torch.all(attn[src.eq(PAD)] == 0)
    assert state.caches[0].keys.shape[2] == tgt_in.size(1)


@torch.no_grad()
@pytest.mark.parametrize("variant", [{"norm_first": True}, {"positional": "learned"},
                                     {"share_embeddings": False, "activation": "gelu"}])
def test_cached_steps_equal_full_forward_variants(src, variant):
    """Pre-LN, learned positions and untied embeddings keep the cache exact too."""
    m = make_model(VOCAB, **variant).eval()
    tgt_in = torch.cat([torch.full((src.size(0), 1), BOS), random_src([5] * src.size(0), VOCAB, seed=9)], 1)
    full = F.log_softmax(m(src, tgt_in).logits, -1)
    state = _init(m, src)
    for t in range(tgt_in.size(1)):
        log_probs, state, _ = m.step(tgt_in[:, t], state)
        assert (log_probs - full[:, t]).abs().max() <= 1e-5, t


@torch.no_grad()
def test_state_select_reorders_rows(model, src):
    state = _init(model, src)
    tokens = torch.full((src.size(0),), BOS)
    _, state, _ = model.step(tokens, state)
    order = torch.tensor([2, 0, 0, 3])
    picked, _, _ = model.step(torch.tensor([5, 6, 6, 7]), state.select(order))
    # row r of the selected state continues sentence order[r] exactly
    for r, i in enumerate(order.tolist()):
        tok = torch.tensor([[5, 6, 6, 7][r]])
        alone, _, _ = model.step(tok, state.select(torch.tensor([i])))
        assert (alone[0] - picked[r]).abs().max() <= 1e-5


@torch.no_grad()
def test_select_same_source_keeps_source_side(model, src):
    """Reordering beams within their sentence: the source side is kept as it is, and the next step is the same."""
    k = 3
    state = _init(model, src).select(torch.arange(src.size(0)).repeat_interleave(k))
    tokens = torch.arange(src.size(0) * k) % 7 + 4
    _, state, _ = model.step(tokens, state)
    g = torch.Generator().manual_seed(0)
    order = (torch.randint(0, k, (src.size(0), k), generator=g) + torch.arange(src.size(0))[:, None] * k).view(-1)
    kept = state.select(order, same_source=True)
    assert kept.memory is state.memory and kept.memory_kv is state.memory_kv
    a, _, _ = model.step(tokens, kept)
    b, _, _ = model.step(tokens, state.select(order))
    assert torch.equal(a, b)


@torch.no_grad()
@pytest.mark.parametrize("tricks", [(), ("fused_attention", "decoding_attention")])
@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_beams_step_as_repeated_rows(model, src, need_weights, tricks):
    """The fast decoder's beams grouped by source (memory and cross-attention keys/values once per sentence, cache
    reorderings left to the next step) step as the core's beams made by repeating every row: through reorders
    within sentences and a sentence leaving the batch; with the core's attention kernels or the fast ones."""
    k, n = 3, src.size(0)
    fast = FastDecoder(attnkit.fast.use(copy.deepcopy(model), *tricks))
    grouped = _init(fast, src).repeat_beams(k)
    repeated = _init(model, src).repeat_beams(k)
    assert isinstance(grouped, GroupedDecoderState) and grouped.beams == k and grouped.rows == n * k
    assert grouped.memory_kv[0].keys.size(0) == n and repeated.memory_kv[0].keys.size(0) == n * k
    g = torch.Generator().manual_seed(1)
    live = n
    for t in range(4):
        tokens = torch.randint(4, VOCAB, (live * k,), generator=g)
        a, grouped, wa = fast.step(tokens, grouped, need_weights)
        b, repeated, wb = model.step(tokens, repeated, need_weights)
        assert (a - b).abs().max() <= 1e-5, t
        if need_weights:
            assert (wa - wb).abs().max() <= 1e-6
        rows = torch.randint(0, k, (live, k), generator=g) + torch.arange(live)[:, None] * k
        if t == 1:  # the second sentence leaves
            rows, live = rows[torch.arange(live) != 1], live - 1
            grouped, repeated = grouped.select(rows.flatten()), repeated.select(rows.flatten())
        else:
            grouped = grouped.select(rows.flatten(), same_source=True)
            repeated = repeated.select(rows.flatten(), same_source=True)
            assert grouped.caches[0].order is not None  # gathered by the next step, as it appends
        assert grouped.rows == repeated.rows == live * k
    assert grouped.memory.states.size(0) == live


# --- greedy and beam search


def _reference_greedy(model, src, max_len):
    """Greedy with full teacher-forced forward passes, no cache: argmax, forced EOS at the length limit."""
    out = [BOS]
    with torch.no_grad():
        for t in range(max_len):
            log_probs = model.teacher_forced(src, torch.tensor([out])) if hasattr(model, "teacher_forced") \
                else torch.log_softmax(model(src, torch.tensor([out])).logits, -1)
            token = EOS if t + 1 >= max_len else int(log_probs[0, -1].argmax())
            if token == EOS:
                return out[1:]
            out.append(token)
    return out[1:]


@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("chunk", [None, 128, 2])
def test_greedy_equals_reference(model, biased, src, use_bias, chunk, monkeypatch):
    """The core search's argmax over the vocabulary, and the fast decoder's chunked one
    (``attnkit.fast.ranking``): directly (chunks of 128 over 23 tokens), and through chunk maxima (chunks of 2)."""
    m = biased if use_bias else model
    decoder = _ranked(m, chunk, monkeypatch)
    lens = _max_lens(src)
    hyps = greedy(decoder, _init(decoder, src), lens)
    assert len(hyps) == src.size(0)
    for i, h in enumerate(hyps):
        assert h.tokens == _reference_greedy(m, _unpadded(src, i), int(lens[i]))
        assert len(h.tokens) < int(lens[i])
    if use_bias:  # the bias makes some hypotheses stop before the limit
        assert any(len(h.tokens) < int(lens[i]) - 1 for i, h in enumerate(hyps))


@pytest.mark.parametrize("use_bias", [False, True])
def test_greedy_batched_equals_unbatched(model, biased, src, use_bias):
    m = biased if use_bias else model
    lens = _max_lens(src)
    batched = greedy(m, _init(m, src), lens)
    for i, h in enumerate(batched):
        alone = greedy(m, _init(m, _unpadded(src, i)), lens[i:i + 1])[0]
        assert h.tokens == alone.tokens
        assert math.isclose(h.score, alone.score, abs_tol=1e-4)


def test_greedy_score_is_sum_of_log_probs(biased, src):
    lens = _max_lens(src)
    for i, h in enumerate(greedy(biased, _init(biased, src), lens)):
        s = _unpadded(src, i)
        lp = biased.teacher_forced(s, torch.tensor([[BOS] + h.tokens]))[0]
        expected = sum(float(lp[t, tok]) for t, tok in enumerate(h.tokens + [EOS]))
        assert math.isclose(h.score, expected, abs_tol=1e-4)


@pytest.mark.parametrize("use_bias", [False, True])
def test_beam_size_one_equals_greedy(model, biased, src, use_bias):
    m = biased if use_bias else model
    lens = _max_lens(src)
    beams = beam_search(m, _init(m, src), lens, beam_size=1)
    greedy_hyps = greedy(m, _init(m, src), lens)
    assert [b[0].tokens for b in beams] == [g.tokens for g in greedy_hyps]


def test_beam_search_n_best_sorted_and_scored(biased, src):
    k, lp = 4, 1.0
    lens = _max_lens(src, 1.5, 3)
    results = beam_search(biased, _init(biased, src), lens, beam_size=k, len_penalty=lp, n_best=k)
    assert len(results) == src.size(0)
    for i, hyps in enumerate(results):
        assert len(hyps) == k
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == k  # distinct hypotheses
        s = _unpadded(src, i)
        for h in hyps:  # the score is the length-normalised sum of the model's log-probabilities
            assert len(h.tokens) < int(lens[i])
            lprobs = biased.teacher_forced(s, torch.tensor([[BOS] + h.tokens]))[0]
            total = sum(float(lprobs[t, tok]) for t, tok in enumerate(h.tokens + [EOS]))
            assert math.isclose(h.score, total / (len(h.tokens) + 1) ** lp, abs_tol=1e-4)
    # n_best=1 keeps only the best
    best = beam_search(biased, _init(biased, src), lens, beam_size=k, len_penalty=lp, n_best=1)
    assert [b[0].tokens for b in best] == [r[0].tokens for r in results]
    assert all(len(b) == 1 for b in best)


@torch.no_grad()
def _reference_beam_search(model, state, max_lens, k, len_penalty, need_weights=False):
    """Beam search as first written, one candidate at a time in Python: the oracle for the batched ranking."""
    n = max_lens.size(0)
    state = state.select(torch.arange(n).repeat_interleave(k))
    live, limits = list(range(n)), max_lens.tolist()
    scores = torch.full((n, k), float("-inf"))
    scores[:, 0] = 0.0
    history, attn_history = [[] for _ in range(n * k)], [None] * (n * k)
    tokens = torch.full((n * k,), BOS, dtype=torch.long)
    finished = [[] for _ in range(n)]
    for t in range(max(limits)):
        log_probs, state, attn = model.step(tokens, state, need_weights)
        m, v = len(live), log_probs.size(-1)
        log_probs = log_probs.view(m, k, v).clone()
        for j, s in enumerate(live):
            if t + 1 >= limits[s]:
                eos = log_probs[j, :, EOS].clone()
                log_probs[j] = float("-inf")
                log_probs[j, :, EOS] = eos
        top_scores, top_idx = (scores[:, :, None] + log_probs).view(m, k * v).topk(2 * k, dim=1)
        next_rows, next_scores, next_live = [], [], []
        for j, s in enumerate(live):
            chosen = []
            for score, idx in zip(top_scores[j].tolist(), top_idx[j].tolist()):
                if score == float("-inf"):
                    break
                row, token = j * k + idx // v, idx % v
                a = None
                if attn is not None:
                    a = attn[row][None]
                    if attn_history[row] is not None:
                        a = torch.cat([attn_history[row], a])
                if token == EOS:
                    if len(finished[s]) < k:
                        finished[s].append(Hypothesis(history[row], score / (t + 1) ** len_penalty, a))
                else:
                    chosen.append((row, score, token, a))
                if len(chosen) == k:
                    break
            if len(finished[s]) >= k or not chosen:
                continue
            chosen += [(chosen[0][0], float("-inf"), chosen[0][2], chosen[0][3])] * (k - len(chosen))
            next_live.append(s)
            for row, score, token, a in chosen:
                next_rows.append((row, token, a))
                next_scores.append(score)
        live = next_live
        if not live:
            break
        rows = torch.tensor([r for r, _, _ in next_rows])
        state = state.select(rows)
        tokens = torch.tensor([tok for _, tok, _ in next_rows])
        history = [history[r] + [tok] for r, tok, _ in next_rows]
        attn_history = [a for _, _, a in next_rows]
        scores = torch.tensor(next_scores).view(len(live), k)
    return [sorted(f, key=lambda h: -h.score) for f in finished]


@pytest.mark.parametrize("use_bias,k,len_penalty,a,b", [(False, 4, 1.0, 1.0, 4), (True, 3, 0.6, 1.5, 2),
                                                        (True, 5, 1.2, 0.5, 1), (True, 1, 1.0, 1.0, 4),
                                                        (True, 13, 1.0, 1.0, 4)])
@pytest.mark.parametrize("chunk", [None, 128, 2])
def test_beam_search_equals_reference(model, biased, src, use_bias, k, len_penalty, a, b, chunk, monkeypatch):
    """The batched tensor ranking finds the same hypotheses, scores and attention as the plain Python oracle,
    sentences stopping early or at the length limit (a short limit forces EOS): the core search's top-k, and the
    fast decoder's chunked one (``attnkit.fast.ranking``), with chunks of 2 through chunk maxima of the 23-token
    vocabulary, with 128 directly; a beam of 13 asks for more than the 23 first-step candidates."""
    m = biased if use_bias else model
    decoder = _ranked(m, chunk, monkeypatch)
    lens = _max_lens(src, a, b)
    got = beam_search(decoder, _init(decoder, src), lens, beam_size=k, len_penalty=len_penalty, n_best=k,
                      need_weights=True)
    want = _reference_beam_search(m, _init(m, src), lens, k, len_penalty, need_weights=True)
    for g, w in zip(got, want):
        assert [h.tokens for h in g] == [h.tokens for h in w]
        for x, y in zip(g, w):
            assert math.isclose(x.score, y.score, rel_tol=1e-6, abs_tol=1e-6)
            assert torch.equal(x.attention, y.attention)


@pytest.mark.parametrize("use_bias", [False, True])
def test_beam_search_batched_equals_unbatched(model, biased, src, use_bias):
    m = biased if use_bias else model
    k = 3
    lens = _max_lens(src)
    batched = beam_search(m, _init(m, src), lens, beam_size=k, n_best=k)
    for i, hyps in enumerate(batched):
        alone = beam_search(m, _init(m, _unpadded(src, i)), lens[i:i + 1], beam_size=k, n_best=k)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        for a, b in zip(hyps, alone):
            assert math.isclose(a.score, b.score, abs_tol=1e-4)


def test_beam_search_attention(biased, src):
    lens = _max_lens(src)
    res = beam_search(biased, _init(biased, src), lens, beam_size=3, n_best=2, need_weights=True)
    plain = beam_search(biased, _init(biased, src), lens, beam_size=3, n_best=2)
    for i, (hyps, hyps_plain) in enumerate(zip(res, plain)):
        assert [h.tokens for h in hyps] == [h.tokens for h in hyps_plain]
        for h in hyps:
            assert h.attention.shape == (len(h.tokens) + 1, src.size(1))
            assert torch.allclose(h.attention.sum(-1), torch.ones(len(h.tokens) + 1), atol=1e-5)
            assert torch.all(h.attention[:, src[i].eq(PAD)] == 0)


# --- sampling and filtering


def test_filter_logits_top_k():
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.9, -0.2]])
    out = filter_logits(logits, top_k=3)
    kept = torch.isfinite(out[0]).nonzero().flatten().tolist()
    assert kept == [1, 3, 4]
    assert torch.equal(out[0, kept], logits[0, kept])
    assert torch.all(out[0, [0, 2, 5]] == float("-inf"))
    assert torch.equal(filter_logits(logits, top_k=0), logits)
    assert torch.equal(filter_logits(logits, top_k=10), logits)


@pytest.mark.parametrize("top_p,expected", [(0.3, [0]), (0.5, [0]), (0.6, [0, 2]), (0.7, [0, 2]),
                                            (0.8, [0, 2, 3]), (0.9, [0, 2, 3, 1]), (0.99, [0, 2, 3, 1, 4])])
def test_filter_logits_top_p(top_p, expected):
    probs = torch.tensor([[0.5, 0.1, 0.25, 0.12, 0.03]])
    out = filter_logits(probs.log(), top_p=top_p)
    kept = torch.isfinite(out[0]).nonzero().flatten().tolist()
    assert sorted(kept) == sorted(expected)
    # the smallest set of most likely tokens whose mass reaches p
    assert float(probs[0, kept].sum()) >= top_p
    order = probs[0].argsort(descending=True).tolist()
    assert kept == sorted(order[: len(kept)])
    assert float(probs[0, order[: len(kept) - 1]].sum()) < top_p


@pytest.mark.parametrize("top_p", [5e-324, 1e-30])
def test_a_tiny_top_p_keeps_the_most_likely_token(top_p):
    """A top_p below float32's resolution (0 once cast) still keeps the most likely token: sampling stays defined."""
    logits = torch.tensor([[0.3, 2.0, -1.0], [1.0, 1.0, 0.5]])
    out = filter_logits(logits, top_p=top_p)
    assert torch.isfinite(out).sum(-1).tolist() == [1, 1]
    assert torch.isfinite(out[0, 1]) and bool(torch.isfinite(out[1, :2]).any())
    torch.multinomial(torch.softmax(out, -1), 1)  # a distribution to sample from


def test_filter_logits_rows_independent():
    logits = torch.tensor([[3.0, 0.0, 1.0], [0.0, 1.0, 3.0]])
    out = filter_logits(logits, top_k=1)
    assert torch.isfinite(out).tolist() == [[True, False, False], [False, False, True]]


def test_sample_temperature_zero_equals_greedy(biased, src):
    lens = _max_lens(src)
    greedy_hyps = greedy(biased, _init(biased, src), lens)
    for temp0 in sample(biased, _init(biased, src), lens, temperature=0.0, top_k=5, top_p=0.5), \
            sample(biased, _init(biased, src), lens, temperature=1.0, top_k=1):
        assert [h.tokens for h in temp0] == [g.tokens for g in greedy_hyps]
    for i, h in enumerate(greedy_hyps):
        assert h.tokens == _reference_greedy(biased, _unpadded(src, i), int(lens[i]))


def test_sample_is_reproducible_and_random(model, src):
    lens = _max_lens(src, 2.0, 6)

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return [h.tokens for h in sample(model, _init(model, src), lens, temperature=1.5, generator=g)]

    assert run(1) == run(1)
    assert any(run(s) != run(1) for s in (2, 3, 4))
    for tokens, n in zip(run(5), lens.tolist()):
        assert len(tokens) < n


def test_max_lengths():
    assert max_lengths(torch.tensor([0, 3, 10]), 1.2, 10).tolist() == [10, 13, 22]
    assert max_lengths(torch.tensor([5]), 0.0, 0).tolist() == [1]


# --- translate() on a real (tiny) checkpoint


def test_translate_keeps_order_and_batching_does_not_matter(trained_checkpoint):
    from attnkit.train import load_checkpoint

    model, _, toks, _ = load_checkpoint(trained_checkpoint)
    sentences = ["4 March 1997", "the 1st of May, 2001", "12/10/1960", "Jan 3 2030", "Tuesday, June 4th 1985"]
    together = translate(model, toks, sentences, beam_size=2, max_len_b=5, batch_tokens=4000)
    one_by_one = [translate(model, toks, [s], beam_size=2, max_len_b=5)[0] for s in sentences]
    small_batches = translate(model, toks, sentences, beam_size=2, max_len_b=5, batch_tokens=12)
    assert [t.source for t in together] == sentences
    for a, b, c in zip(together, one_by_one, small_batches):
        assert a.text == b.text == c.text
        assert a.hypotheses[0].tokens == b.hypotheses[0].tokens
        assert a.text[0] == toks.tgt.decode(a.hypotheses[0].tokens)


def test_generate_records_no_autograd_graph(model, src):
    grad_modes = []
    encode = model.encode
    model.encode = lambda *args, **kwargs: (grad_modes.append(torch.is_grad_enabled()), encode(*args, **kwargs))[1]
    try:
        for beam in (1, 3):
            generate(model, src, _max_lens(src), beam_size=beam)
    finally:
        del model.encode
    assert grad_modes == [False, False]  # the encoder too: its activations are never kept for a backward


# --- torch.compile (attnkit.fast.compile_step)


@pytest.mark.internals
@torch.no_grad()
def test_a_compiled_decoder_stores_linear_weights_column_major(model):
    """Every linear layer's weight of the compiled decoder's copy stored column-major (x @ W^T multiplies by a
    contiguous matrix), with the model's values."""
    compiled = compile_step(model)
    layers = dict(compiled.decoder.model.named_modules())
    linears = [(a, layers[name]) for name, a in model.named_modules()
               if isinstance(a, torch.nn.Linear) and isinstance(layers.get(name), torch.nn.Linear)]
    assert len(linears) > len(model.decoder) and all(b.weight.stride(0) == 1 for _, b in linears)
    assert all(torch.equal(a.weight, b.weight) for a, b in linears)
    assert all(a.weight.stride(0) != 1 for a, _ in linears)  # the model's own are left row-major
    assert torch.equal(compiled.decoder.model.output.weight.t(), model.output.weight)  # kept as [d_in, d_out]


def test_a_tiny_temperature_samples_the_most_likely_token():
    """p_i ∝ exp(z_i / T): as T -> 0 sampling becomes greedy, never a NaN distribution (z / T alone overflows)."""
    from attnkit.decode import with_temperature

    log_probs = torch.log_softmax(torch.tensor([[0.3, 2.0, -1.0, 1.9]]), -1)
    for t in (1e-6, 1e-30, 1e-45, 5e-324):
        probs = torch.softmax(with_temperature(log_probs, t), -1)
        assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0]])), t
        assert int(torch.multinomial(probs, 1)) == 1
    torch.testing.assert_close(torch.softmax(with_temperature(log_probs, 0.7), -1),
                               torch.softmax(log_probs / 0.7, -1))


# --- a compiled step must earn its place (attnkit.fast.compile.CheckedStep)


def _steps(compiled_delay: float = 0.0, eager_delay: float = 0.0, wrong: bool = False, fails: bool = False):
    """Fake search steps counting their calls: eager adds 1 to the tokens; compiled the same (or 2: ``wrong``), or
    raises as a failed lowering does."""
    import time

    calls = {"compiled": 0, "eager": 0}

    def eager(tokens, state):
        calls["eager"] += 1
        time.sleep(eager_delay)
        return tokens + 1, torch.zeros(2), state

    def compiled(tokens, state):
        calls["compiled"] += 1
        if fails:
            raise RuntimeError("LoweringException: no lowering for this op\nits long second line")
        time.sleep(compiled_delay)
        return tokens + (2 if wrong else 1), torch.zeros(2), state

    return calls, eager, compiled


@pytest.mark.parametrize("case,why", [({"compiled_delay": 0.03}, "took"),
                                      ({"wrong": True}, "gave other outputs"),
                                      ({"fails": True}, "failed (RuntimeError: LoweringException")])
def test_a_compiled_step_slower_wrong_or_failing_gives_way_to_the_eager_one(case, why, capsys):
    from attnkit.fast.compile import CheckedStep

    calls, eager, compiled = _steps(**case)
    step = CheckedStep("greedy_step", compiled, eager, warmup=2, trials=4)
    tokens = torch.tensor([4, 5])
    outputs = [step(tokens, None)[0] for _ in range(20)]
    # the warm-up's answers are the compiled step's; from the first comparison on, every answer is the eager one's
    assert all(torch.equal(o, tokens + 1) for o in outputs[2:])
    assert step.chosen is eager and why in step.reason
    before = calls["compiled"]
    step(tokens, None)
    assert calls["compiled"] == before  # the compiled step is not called again
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("attnkit: warning: the compiled greedy_step") and why in err


def test_a_compiled_step_faster_and_equal_is_kept():
    from attnkit.fast.compile import CheckedStep

    calls, eager, compiled = _steps(eager_delay=0.03)
    step = CheckedStep("beam_step", compiled, eager, warmup=2, trials=4)
    for _ in range(20):
        step(torch.tensor([1]), None)
    assert step.chosen is compiled and step.reason is None
    assert calls["eager"] == 4 and calls["compiled"] == 24  # eager only during the trials, which time a second call


def test_an_int8_models_compiled_steps_are_held_to_int8s_tolerance_not_to_float_rounding(model):
    """At int8 an activation a rounding away from a quantization step lands on the next level, so compiled and
    eager steps differ by int8's own error: scores 1% apart are kept for an int8 model and refused for fp32's,
    and other choices are refused for both."""
    from attnkit.fast.compile import CheckedStep
    from attnkit.fast.precision import INT8_TOLERANCE, NEEDS, at_precision, check_precision, cpu_flags

    if not any(f in cpu_flags() for f in NEEDS["int8"]):
        pytest.skip(f"this CPU has none of {NEEDS['int8']}")
    check_precision("int8")
    int8, fp32 = compile_step(at_precision(model, "int8")), compile_step(model)  # compiling waits for a first call
    assert {s.tolerance for s in int8.search_steps().values()} == {INT8_TOLERANCE}
    assert {s.tolerance for s in fp32.search_steps().values()} == {1e-3}

    def eager(tokens, state):
        return tokens + 1, torch.full((2,), -4.0), state

    def close(tokens, state):  # 1% off: inside int8's tolerance, far outside float rounding
        return tokens + 1, torch.full((2,), -4.04), state

    def other_choice(tokens, state):
        return tokens + 2, torch.full((2,), -4.0), state

    for compiled, tolerance, kept in ((close, INT8_TOLERANCE, True), (close, 1e-3, False),
                                      (other_choice, INT8_TOLERANCE, False)):
        step = CheckedStep("beam_step", compiled, eager, warmup=1, trials=3, tolerance=tolerance)
        for _ in range(6):
            step(torch.tensor([1]), None)
        assert (step.reason is None or "other outputs" not in step.reason) == kept, (compiled, tolerance, step.reason)


def test_compiled_decoders_check_their_search_steps_unless_told_not_to(model):
    from attnkit.fast.compile import CheckedStep

    checked, unchecked = compile_step(model), compile_step(model, check=False)  # compiling waits for a first call
    assert all(isinstance(s, CheckedStep) for s in checked.search_steps().values())
    assert not any(isinstance(s, CheckedStep) for s in unchecked.search_steps().values())


@torch.no_grad()
@pytest.mark.parametrize("one_sentence_pays", [True, False])
def test_the_encoders_package_is_checked_apart_for_one_sentence_and_for_a_batch(model, src, capfd, one_sentence_pays):
    """The encoder's package of a batch slower than eager encoding (made slower by a sleep): the batch's first calls
    drop it for batches only, with one warning line. One sentence's package is checked against encoding it as a
    batch is encoded (``otherwise``), and kept where it is faster, though each round begins with a batch (a server
    warmed up with one); where it is slower, one more warning line says so and one sentence is encoded as a batch
    from then on. Every call returns eager encoding's state."""
    import time

    from attnkit.fast.compile import close_in_norm

    # how much slower the slow side is: far beyond what another process's load makes a tiny encoder's time vary by
    SLOWER = 0.05

    class Encoder:  # in place of the AheadOfTimeEncoder: its eager state, after the sleeps that decide the checks
        def __init__(self, inner):
            self.inner, self.packaged, self.as_batch = inner, 0, 0

        def kind(self, batch):
            return self.inner.kind(batch)

        def __call__(self, batch):
            self.packaged += 1
            time.sleep(SLOWER if batch.size(0) > 1 or not one_sentence_pays else 0.0)
            return self.inner.eager(batch)

        def otherwise(self, batch):
            self.as_batch += 1
            time.sleep(SLOWER if one_sentence_pays else 0.0)
            return self.inner.eager(batch)

        def eager(self, batch):
            return self.inner.eager(batch)

    decoder = compile_step(model)  # nothing compiles: the package is replaced before a call
    decoder._aot_encoder = encoder = Encoder(decoder._aot_encoder)
    expected = {n: FastDecoder(model).init_state(FastDecoder(model).encode(src[:n])) for n in (1, len(src))}
    capfd.readouterr()
    for _ in range(12):
        for n in (len(src), 1):
            state = decoder.init_state(decoder.encode(src[:n]))
            for a, b in zip(state.tensors(), expected[n].tensors(), strict=True):
                torch.testing.assert_close(a, b)
    warnings = [line for line in capfd.readouterr().err.splitlines() if "attnkit: warning" in line]
    assert len(warnings) == 1 + (not one_sentence_pays) and "the compiled encoder of a batch took" in warnings[0]
    if not one_sentence_pays:
        assert "the compiled encoder of one sentence took" in warnings[1]
        assert "where encoding as a batch took" in warnings[1]
        assert warnings[1].endswith("encoding as a batch runs instead")
    checks = decoder.checks()
    assert sorted(checks) == ["beam_step", "encoder of a batch", "encoder of one sentence", "greedy_step"]
    one, batch = checks["encoder of one sentence"], checks["encoder of a batch"]
    assert (one.chosen is one.compiled) == one_sentence_pays and batch.chosen is batch.eager
    assert one.compare is batch.compare is close_in_norm
    packaged, as_batch = encoder.packaged, encoder.as_batch
    decoder.encode(src[:1]), decoder.encode(src)
    # one sentence only: by its package where that pays, else as a batch is encoded
    assert (encoder.packaged, encoder.as_batch) == (packaged + one_sentence_pays, as_batch + (not one_sentence_pays))


def test_an_encoders_outputs_agree_in_norm_so_one_element_rounded_apart_does_not_refuse_it():
    """An encoder's keys and values rounded to bf16 everywhere, and one element several roundings off, agree with
    the fp32 ones in relative norm (the element-wise bound of a step's scores refuses them); one sentence's keys
    lost, every key 5% off, another padding mask or an infinity in another place do not agree."""
    from attnkit.fast.compile import close_in_norm, same_outputs

    torch.manual_seed(0)
    tolerance = 4 * torch.finfo(torch.bfloat16).eps
    keys, mask = torch.randn(64, 4, 20, 32), torch.zeros(64, 20, dtype=torch.bool)
    keys[3, 1, 7, 5] = 1.0
    one_off = keys.bfloat16().float()
    one_off[3, 1, 7, 5] += 0.2
    assert close_in_norm([one_off, mask], [keys, mask], tolerance)
    assert not same_outputs([one_off, mask], [keys, mask], tolerance)
    sentence_lost = keys.clone()
    sentence_lost[3] = 0.0
    infinite = keys.clone()
    infinite[0, 0, 0, 0] = float("-inf")
    assert close_in_norm([infinite, mask], [infinite.clone(), mask], tolerance)
    for ours in ([sentence_lost, mask], [keys * 1.05, mask], [keys, mask.logical_not()], [infinite, mask]):
        assert not close_in_norm(ours, [keys, mask], tolerance)
    assert not close_in_norm([keys], [keys, mask], tolerance)


def test_a_beam_steps_candidates_that_go_on_may_rank_either_way_but_those_that_end_may_not():
    """Two beam steps agree when they differ only in the order of near-equal candidates that neither end a
    hypothesis nor become a beam (the search never reads their rows), and disagree when an ending candidate's row
    or score differs."""
    from attnkit.decode.search import BeamStep
    from attnkit.fast.compile import same_outputs

    ending = torch.tensor([[True, False, False, False]])

    def step(candidate_rows, candidate_scores):
        return BeamStep(None, torch.tensor([7, 9]), torch.tensor([[-1.0, -1.5]]), torch.tensor([[7], [9]]),
                        torch.tensor([0, 1]), ending, torch.tensor([candidate_scores]), torch.tensor([candidate_rows]),
                        torch.tensor([False]), None)

    eager = step([0, 0, 1, 1], [-0.5, -1.0, -1.5, -2.0])
    swapped_going = step([0, 0, 1, 0], [-0.5, -1.0, -1.5, -2.01])  # the last two rank the other way round
    other_ending_row = step([1, 0, 1, 1], [-0.5, -1.0, -1.5, -2.0])
    other_ending_score = step([0, 0, 1, 1], [-0.7, -1.0, -1.5, -2.0])
    assert same_outputs(swapped_going, eager, 1e-3)
    assert not same_outputs(other_ending_row, eager, 1e-3)
    assert not same_outputs(other_ending_score, eager, 1e-3)
    assert not same_outputs(step([0, 0, 1, 1], [-0.5, -1.0, -1.5, -2.0])._replace(rows=torch.tensor([1, 0])),
                            eager, 1e-3)
