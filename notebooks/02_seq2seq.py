# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 2. Sequence to sequence: the thought vector and RNNsearch
#
# An RNN encoder-decoder (Cho et al. 2014) reads the whole source into one vector, the "thought vector", and writes
# the output from that vector alone. RNNsearch (Bahdanau et al. 2014) keeps every encoder state (the annotations)
# and lets the decoder look back at them at every step with an additive score: attention. We train both on the same
# task for the same number of steps, plot exact-match accuracy against the input's length (the lectures'
# BLEU-versus-length figure, in miniature), draw RNNsearch's alignment matrix, and you write the additive score
# and a beam search step yourself.
#
# The task is attnkit's built-in dates (`"Tuesday, March 4th 1997"` -> `"1997-03-04"`), generated from a seed:
# a translation task whose right alignment is obvious.
#
# **Needs:** nothing but attnkit and matplotlib (the data is generated). Nothing is downloaded.
#
# **Runtime on the 2-core machine:** full budget: each model trains 1,200 steps, stopped at 3 minutes if it has not
# finished by then, so at most about 7 minutes; the total is measured by `make notebooks`;
# small budget (`ATTNKIT_NOTEBOOK_BUDGET=small`: tiny models, a few dozen steps, which learn almost nothing) about
# 17 to 25 seconds.
#
# The code it exercises: `src/attnkit/models/rnn.py` (`RNNEncDec`, `RNNSearch`), `src/attnkit/nn/attention.py`
# (`AdditiveScore`), `src/attnkit/decode/align.py`; docs/lectures.md sections 2 and 11.

# %%
# %matplotlib inline
import os
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import attnkit
import attnkit.check
from attnkit.config import config_from_dict
from attnkit.data import generate_dates
from attnkit.nn.attention import AdditiveScore
from attnkit.tokens import EOS
from attnkit.train import Trainer
from attnkit.viz import plot_attention

BUDGET = os.environ.get("ATTNKIT_NOTEBOOK_BUDGET", "full")
assert BUDGET in ("small", "full"), f"ATTNKIT_NOTEBOOK_BUDGET={BUDGET!r}: expected small or full"
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "configs").is_dir())  # the repository
RUNS = ROOT / "runs" / "notebooks"
print(f"budget: {BUDGET}, torch threads: {torch.get_num_threads()}")

# %% [markdown]
# ## Two models, one budget
#
# Both read characters (a SentencePiece character vocabulary), have GRUs of the same width and train the same number
# of steps on the same batches. The encoder-decoder's decoder sees c = tanh(V h_N), the encoder's last state, at every
# step; RNNsearch's decoder computes, before writing output i,
#
# e_ij = v^T tanh(W s_{i-1} + U h_j),  alpha_ij = softmax_j(e_ij),  c_i = sum_j alpha_ij h_j
#
# over the annotations h_j of a bidirectional GRU.

# %%
full = BUDGET == "full"
SIZES = dict(embedding_size=64, hidden_size=128) if full else dict(embedding_size=32, hidden_size=48)
TRAIN = dict(max_tokens=1024, lr=3e-3, warmup_steps=100 if full else 10, schedule="cosine", min_lr=1e-4,
             max_steps=1200 if full else 40, max_minutes=3.0 if full else 0.0,
             eval_every=10**6, save_every=0, eval_bleu=False, label_smoothing=0.0, log_every=50, keep_last=1,
             progress=False, clip_norm=1.0)


def train(family: str) -> Path:
    table = {"name": f"dates_{family}", "model": {"family": family, "dropout": 0.0, **SIZES},
             "data": {"format": "dates", "n_synthetic": 30000 if full else 2000, "spm_model_type": "char",
                      "vocab_size": 80, "max_valid_pairs": 1000 if full else 50},
             "train": TRAIN}
    run_dir = RUNS / f"02_{family}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time the notebook runs
    result = Trainer(config_from_dict(table, family), run_dir).train()
    print(f"{family}: {result['step']} steps in {result['train_minutes']:.1f} min, validation loss "
          f"{result['valid_loss']:.3f}")
    return run_dir


models = {name: attnkit.load(train(family)) for name, family in (("RNNencdec", "rnn_encdec"),
                                                                  ("RNNsearch", "rnnsearch"))}

# %% [markdown]
# ## Accuracy against input length
#
# The held-out dates (a seed the training set never used), translated greedily, grouped by the length of the
# written date in characters. A date is right only if every character of the ISO date is.

# %%
test = generate_dates(1000 if full else 120, seed=2)
BUCKETS = [(0, 10), (10, 15), (15, 20), (20, 25), (25, 30), (30, 60)]
curves = {}
for name, model in models.items():
    outputs = model.translate(test.src, beam=1)
    right = [out == ref for out, ref in zip(outputs, test.tgt)]
    curves[name] = []
    for lo, hi in BUCKETS:
        hits = [r for src, r in zip(test.src, right) if lo <= len(src) < hi]
        if hits:
            curves[name].append((f"{lo}-{hi - 1}", sum(hits) / len(hits), len(hits)))
    print(f"{name}: exact match {sum(right) / len(right):.1%} on {len(right)} dates; e.g. "
          f"{test.src[0]!r} -> {outputs[0]!r}")

fig, ax = plt.subplots(figsize=(6, 3.5))
for name, rows in curves.items():
    ax.plot([r[0] for r in rows], [100 * r[1] for r in rows], marker="o", label=name)
ax.set_xlabel("length of the written date (characters)")
ax.set_ylabel("exact match (%)")
ax.set_ylim(-3, 103)
ax.legend()
plt.show()
print("dates per bucket:", {label: n for label, _, n in curves["RNNsearch"]})

# %% [markdown]
# What to look for: the encoder-decoder must squeeze "Wednesday, the 21st of September 1977" and "21.9.1977" into
# the same fixed vector, so its accuracy should fall as the written date grows; RNNsearch reads the day, the month
# and the year off the annotations when it writes them, so length should cost it little. How clearly a few minutes of
# training show it depends on how far the two got: at the small budget neither gets anywhere. (On real sentences the
# same picture is `make by-length`, BLEU against source length on Tatoeba.)
#
# ## RNNsearch's alignment
#
# Row i of alpha is where RNNsearch looked while writing output character i (Bahdanau et al., figure 3). The year
# digits look at the year, the month digits at the month's name or number, the day digits at the day.

# %%
alignment = models["RNNsearch"].align("Tuesday, March 4th 1997", beam=1)
print(f"{alignment.description}: {alignment.translation!r}")
plot_attention(alignment.weights, alignment.source, alignment.target, title=alignment.translation)

# %% [markdown]
# ### Exercise: the additive score
#
# Write Bahdanau's score e_ij = v^T tanh(W s_i + U h_j + b) for a batch: queries s [B, T, d_q] (decoder states),
# keys h [B, S, d_k] (annotations), W [d_a, d_q], U [d_a, d_k], b [d_a], v [d_a] -> scores [B, T, S].
# Compute U h_j once per key, not once per (i, j) pair: that is what makes it affordable.

# %%
def my_additive_score(s, h, W, U, b, v):
    # BEGIN SOLUTION
    ws = s @ W.T  # [B, T, d_a]
    uh = h @ U.T + b  # [B, S, d_a], once per key
    return torch.tanh(ws[:, :, None, :] + uh[:, None, :, :]) @ v  # [B, T, S]
    # END SOLUTION


# %%
def check_additive(fn, score: AdditiveScore, cases) -> str:
    """``fn`` against attnkit's AdditiveScore (with ``score``'s weights) on each (s, h) of ``cases``."""
    W, U, b, v = score.query_proj.weight, score.key_proj.weight, score.key_proj.bias, score.v.weight[0]
    for name, (s, h) in cases.items():
        with torch.no_grad():
            want, got = score(s, h), fn(s, h, W, U, b, v)
        if tuple(got.shape) != tuple(want.shape):
            return f"{name}: scores of shape {tuple(got.shape)}, expected {tuple(want.shape)} [B, T, S]"
        gap = (got - want).abs()
        if gap.max() > 1e-4:
            where = tuple(int(i) for i in (gap == gap.max()).nonzero()[0])
            return f"{name}: differs from AdditiveScore by {gap.max():.2e} at [batch, query, key] = {where}"
    return f"matches attnkit's AdditiveScore on {', '.join(cases)}"


g = torch.Generator().manual_seed(0)
rnnsearch = models["RNNsearch"]
trained = rnnsearch.module.score  # the trained model's own score function
d_q, d_k = trained.query_proj.in_features, trained.key_proj.in_features
ids = torch.tensor([rnnsearch.tokenizers.src.encode(["4.3.1997"])[0] + [EOS]])
with torch.no_grad():
    state = rnnsearch.module.init_state(rnnsearch.module.encode(ids))
cases = {"random inputs": (torch.randn(3, 4, d_q, generator=g), torch.randn(3, 7, d_k, generator=g)),
         "one key": (torch.randn(2, 3, d_q, generator=g), torch.randn(2, 1, d_k, generator=g)),
         "the trained model's s_0 and annotations of '4.3.1997'": (state.h[-1][:, None], state.memory.states)}
print(check_additive(my_additive_score, trained, cases))


# %% [markdown]
# ## Greedy decoding and beam search
#
# Greedy decoding writes the most likely character at each step and never looks back. Beam search keeps the k best
# partial outputs (beams): at each step every beam is extended by every token, each extension scored by the beam's
# log-probability plus the token's, and the k best extensions over all beams survive.
#
# ### Exercise: one beam search step
#
# Write `my_beam_step(scores, log_probs, k)`: scores [B, K] (each sentence's K beams' log-probabilities so far),
# log_probs [B, K, V] (the next token's log-probabilities after each beam) -> (new scores [B, k], the beam each
# survivor extends [B, k], its token [B, k]), best first. `attnkit.check.beam_search_step` runs it on random beams,
# the first step (one beam), dead beams (score -inf), k = 1 and a long vocabulary, and names the usual mistakes.

# %%
def my_beam_step(scores, log_probs, k):
    # BEGIN SOLUTION
    b, beams, v = log_probs.shape
    totals = (scores[:, :, None] + log_probs).reshape(b, beams * v)  # every one-token extension of every beam
    best, flat = totals.topk(k, dim=1)  # [B, k], best first
    return best, flat // v, flat % v
    # END SOLUTION


# %%
print(attnkit.check.beam_search_step(my_beam_step))

# %% [markdown]
# The same search, attnkit's, on the trained RNNsearch: a wider beam changes a few outputs (here, exact match on the
# held-out dates).

# %%
for beam in (1, 3):
    outputs = models["RNNsearch"].translate(test.src[:200], beam=beam)
    right = sum(out == ref for out, ref in zip(outputs, test.tgt[:200]))
    print(f"beam {beam}: exact match {right / len(outputs):.1%} on {len(outputs)} dates")
