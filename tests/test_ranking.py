"""The fast runtime's chunked argmax and beam ranking (``attnkit.fast.ranking``) against torch.argmax and torch.topk,
and against the core search's own ranking (``attnkit.decode.search``)."""

from __future__ import annotations

import pytest
import torch

from attnkit.decode.search import argmax, top_extensions
from attnkit.fast import ranking
from attnkit.fast.ranking import argmax_rows, best_extensions


@pytest.fixture(autouse=True)
def chunked_even_when_small(monkeypatch):
    monkeypatch.setattr(ranking, "SMALL", 0)  # these tensors are small; the chunked paths are under test


@pytest.mark.parametrize("v,chunk", [(6000, 128), (1000, 16), (1003, 16), (23, 4), (37, 4)])
def test_argmax_rows_equals_argmax(v, chunk):
    g = torch.Generator().manual_seed(v)
    x = torch.randn(9, v, generator=g).log_softmax(-1)
    x[0, 3] = x[0, v - 1] = x[0].max() + 1  # a tie across chunks: the first index wins, as in argmax
    x[1, 5] = x[1, 6] = x[1].max() + 1  # a tie inside a chunk
    x[2] = float("-inf")
    x[2, v - 1] = 0.0  # the maximum in the short last chunk (when there is one)
    x[3] = float("-inf")  # nothing but -inf: index 0
    x[4] = 0.5  # all equal
    assert torch.equal(argmax_rows(x, chunk), x.argmax(-1))
    assert torch.equal(argmax_rows(x, chunk), argmax(x))  # the core search's choice


@pytest.mark.parametrize("v,chunk", [(6000, 128), (1000, 16), (1003, 16), (37, 4)])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_best_extensions_equal_topk(v, chunk, k):
    g = torch.Generator().manual_seed(k * v)
    m = 7
    log_probs = torch.randn(m, k, v, generator=g).log_softmax(-1)
    scores = torch.randn(m, k, generator=g) * 3
    scores[0, 1:] = float("-inf")  # a first step: one live beam
    scores[1, :] = float("-inf")  # a sentence with no live beam
    log_probs[2, :, : v - 1] = float("-inf")  # only the last token (the tail chunk) is allowed
    want = (scores[:, :, None] + log_probs).view(m, k * v).topk(2 * k, dim=1)
    values, indices = best_extensions(scores, log_probs, 2 * k, chunk)
    assert torch.equal(values, want.values)
    live = torch.isfinite(want.values)  # -inf candidates tie, and topk orders ties as it likes
    assert torch.equal(indices[live], want.indices[live])
    flat = (scores[:, :, None] + log_probs).view(m, k * v)
    assert torch.equal(flat.gather(1, indices), values)  # every index points at its value
    core_values, core_indices = top_extensions(scores, log_probs, 2 * k)  # the core search's ranking
    assert torch.equal(values, core_values) and torch.equal(indices[live], core_indices[live])


@pytest.mark.slow
@torch.no_grad()
def test_compiled_chunked_paths_equal_argmax_and_topk(monkeypatch):
    """Compiled, both functions take their chunked path at any size (Inductor fuses it), and with dynamic shapes
    (the batch shrinks as sentences end) in one graph: the results still equal argmax and topk."""
    monkeypatch.setattr(ranking, "SMALL", 1 << 17)  # as decoding has it: these tensors are below it
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)

    def search(log_probs, scores):  # log_probs [m, k, v]
        m, k, v = log_probs.shape
        return argmax_rows(log_probs.view(m * k, v)), *best_extensions(scores, log_probs, 2 * k)

    compiled = torch.compile(search, dynamic=True, fullgraph=True)
    for m in (7, 3):
        log_probs = torch.randn(m, 5, 600, generator=g).log_softmax(-1)  # 4 chunks of 128 and a tail of 88
        scores = torch.randn(m, 5, generator=g)
        best, values, indices = compiled(log_probs, scores)
        assert torch.equal(best, log_probs.view(m * 5, 600).argmax(-1))
        want = (scores[:, :, None] + log_probs).view(m, 3000).topk(10, dim=1)
        assert torch.equal(values, want.values) and torch.equal(indices, want.indices)


@pytest.mark.parametrize("shortlisted", [False, True])
def test_greedy_from_logits_chooses_and_scores_as_the_core_greedy_step(shortlisted):
    """The fast greedy step takes the argmax of the logits and computes the chosen token's log-probability alone:
    the core step's tokens (EOS where a row reaches its limit), its scores to float rounding, ids mapped through a
    shortlist."""
    from types import SimpleNamespace

    from attnkit.decode.search import greedy_step
    from attnkit.fast.decoding import greedy_step_from_logits
    from attnkit.tokens import EOS

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 1000, generator=g) * 4
    logits[1, 7] = logits[1, 900] = logits[1].max() + 1  # a tie: the first index wins
    logits[2] = -1e4
    logits[2, 999] = 50.0  # one token all but certain
    # a shortlist as attnkit.fast.shortlist makes them: sorted, the special tokens first (EOS's position its id)
    vocabulary = torch.cat([torch.arange(EOS + 1), EOS + 1 + 3 * torch.arange(999 - EOS)]) if shortlisted else None
    state = SimpleNamespace(vocabulary=vocabulary)

    def step(tokens, state_, need_weights, logits_=False):
        return (logits if logits_ else logits.log_softmax(-1)), state_, None

    limits = torch.tensor([9, 9, 9, 4, 9, 3])  # at t = 3 the last row reaches its limit and ends
    ours = greedy_step_from_logits(lambda *a, logits=False: step(*a, logits), None, state, limits, 3)
    theirs = greedy_step(lambda *a: step(*a), None, state, limits, 3)
    assert torch.equal(ours[0], theirs[0]) and int(ours[0][5]) == EOS
    assert int(ours[0][1]) == (EOS + 1 + 3 * (7 - EOS - 1) if shortlisted else 7)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-6, atol=1e-5)
    assert abs(float(ours[1][2])) < 1e-6  # log p of a certain token: 0, not the rounding of a shifted row


@pytest.mark.parametrize("t", [0, 3])
def test_beams_ranked_from_logits_are_the_core_beam_steps(t):
    """The fast beam step ranks ``(score - logsumexp(z)) + z_j`` over the logits z, never writing out the
    log-probabilities: the core step's beams, tokens, endings and rows (a sentence at its length limit may only end),
    its scores to float rounding, at the first step (one row a sentence) and a later one."""
    from attnkit.decode.search import beam_step
    from attnkit.fast.decoding import beam_step_from_logits

    class State:
        vocabulary = None

        def repeat_beams(self, k):
            return self

        def select(self, rows, same_source=False):
            return self

    g = torch.Generator().manual_seed(t)
    m, k, v = 4, 3, 1000
    rows = m if t == 0 else m * k
    logits = torch.randn(rows, v, generator=g) * 3
    scores = torch.randn(m, k, generator=g) * 2 - 5
    history = torch.randint(4, v, (m * k, t), generator=g)
    limits = torch.tensor([9, t + 1, 9, 9])  # the second sentence reaches its limit at this step

    def step(tokens, state, need_weights, logits_=False):
        return (logits if logits_ else logits.log_softmax(-1)), state, None

    ours = beam_step_from_logits(lambda *a, logits=False: step(*a, logits), None, State(), scores, history, limits, t)
    theirs = beam_step(lambda *a: step(*a), None, State(), scores, history, limits, t, best=best_extensions)
    for name in ("tokens", "history", "rows", "ending", "candidate_rows", "stuck"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    torch.testing.assert_close(ours.scores, theirs.scores, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(ours.candidate_scores, theirs.candidate_scores, rtol=1e-6, atol=1e-5)
    assert bool(ours.ending[1].any())  # the sentence at its limit ends (its beams take EOS or nothing)
