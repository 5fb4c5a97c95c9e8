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
# # 1. Attention as pooling
#
# Attention is a weighted average: a **query** is compared with every **key**, a softmax turns the comparisons
# (the scores) into weights that sum to 1, and the output is the weighted sum of the **values**:
#
# $$e_j = f_{att}(q, k_j), \qquad a = \mathrm{softmax}(e), \qquad \mathrm{out} = \sum_j a_j v_j .$$
#
# We start where the idea comes from, Nadaraya–Watson kernel regression (1964), which is attention pooling with a
# Gaussian kernel, then try the learned score functions of the sequence models (dot, scaled dot, general, additive)
# on the same vectors, measure why the Transformer divides by $\sqrt{d}$, and finish with the masked softmax that
# lets a batch hold sentences of different lengths. At each formula you write it first; `attnkit.check` says
# whether you got it right, and if not, what is wrong and where.
#
# **Needs:** nothing but attnkit and matplotlib (`pip install "attnkit[notebooks]"`); no data, nothing downloaded.
#
# **Runtime on the 2-core machine:** full budget about 25 seconds; small budget
# (`ATTNKIT_NOTEBOOK_BUDGET=small`: fewer samples for the measurement) about 20 seconds, both with other jobs on the
# machine (a quiet one is faster).
#
# The code it exercises: `src/attnkit/nn/attention.py` (`attend`, `dot_score`, `scaled_dot_score`,
# `GeneralScore`, `AdditiveScore`, `masked_softmax`), `src/attnkit/check.py`; docs/lectures.md sections 1 to 3.

# %%
import math
import os

import matplotlib.pyplot as plt
import torch

import attnkit.check
from attnkit.nn import AdditiveScore, GeneralScore, attend, dot_score, masked_softmax, scaled_dot_score

BUDGET = os.environ.get("ATTNKIT_NOTEBOOK_BUDGET", "full")
assert BUDGET in ("small", "full"), f"ATTNKIT_NOTEBOOK_BUDGET={BUDGET!r}: expected small or full"
torch.manual_seed(0)

# %% [markdown]
# ## Nadaraya–Watson: a query, keys, values
#
# Fifty noisy samples $(x_i, y_i)$ of a function. To predict $y$ at a new $x$, average the $y_i$. The plainest
# average gives every sample the same weight, whatever $x$ is asked about. Nadaraya and Watson weight each sample
# by how close $x_i$ is to $x$, with a kernel $K$:
#
# $$\hat y(x) = \sum_i \frac{K(x - x_i)}{\sum_j K(x - x_j)}\, y_i, \qquad K(u) = e^{-u^2/2}.$$
#
# Read it as attention: $x$ is the query, the $x_i$ are the keys, the $y_i$ the values, and the weights are a
# softmax of the score $e_i = -(x - x_i)^2 / 2$, since $e^{e_i} / \sum_j e^{e_j}$ is exactly the normalised kernel.

# %%
def f(x):
    return 2 * torch.sin(x) + x ** 0.8


n_train = 50
x_train, _ = torch.sort(torch.rand(n_train) * 5)
y_train = f(x_train) + torch.normal(0.0, 0.5, (n_train,))
x_test = torch.arange(0, 5, 0.1)
y_truth = f(x_test)

# %% [markdown]
# **Your turn.** Write Gaussian-kernel attention pooling: `queries` [n_q], `keys` and `values` [n_k], and a kernel
# `width` $w$ (the score is $-(x - x_i)^2 / (2 w^2)$). Return the predictions [n_q] and the weights [n_q, n_k].

# %%
def my_gaussian_pooling(queries, keys, values, width=1.0):
    # BEGIN SOLUTION
    scores = -((queries[:, None] - keys[None, :]) ** 2) / (2 * width ** 2)  # [n_q, n_k]
    weights = torch.softmax(scores, dim=-1)
    return weights @ values, weights
    # END SOLUTION


# %% [markdown]
# The check: attnkit's `attend` is the general formula with any score function $f_{att}$; with the Gaussian score
# it is Nadaraya–Watson. Your pooling should give the same predictions.

# %%
def gaussian_score(width):
    """f_att(q, k) = -(q - k)^2 / (2 w^2) for scalar queries and keys: queries [B, T, 1], keys [B, S, 1]."""
    return lambda q, k: -((q - k.transpose(-1, -2)) ** 2) / (2 * width ** 2)


def check_pooling(fn, width=1.0):
    expected, expected_weights = attend(x_test[None, :, None], x_train[None, :, None], y_train[None, :, None],
                                        score=gaussian_score(width))
    try:
        got, weights = fn(x_test, x_train, y_train, width)
    except NotImplementedError as e:
        return f"{fn.__name__} raised NotImplementedError: {e}."
    gap = (got - expected[0, :, 0]).abs().max().item()
    gap_weights = (weights - expected_weights[0]).abs().max().item()
    if max(gap, gap_weights) < 1e-5:
        return f"{fn.__name__} matches attnkit.nn.attend with the Gaussian score (width {width})."
    return (f"{fn.__name__} differs from attnkit.nn.attend with the Gaussian score: predictions by up to {gap:.3g}, "
            f"weights by up to {gap_weights:.3g}.")


print(check_pooling(my_gaussian_pooling))
print(check_pooling(my_gaussian_pooling, width=0.3))

# %% [markdown]
# A kernel width is a choice. Make it a parameter and learn it: with the score $-((x - x_i)\,/\,w)^2 / 2$, fit $w$
# by gradient descent on the training samples, each one predicted from the *others* (the mask hides a sample's
# own key; with its own key allowed the best width is 0, which just copies $y_i$).

# %%
log_width = torch.zeros((), requires_grad=True)  # w = exp(log_width) stays positive
others = ~torch.eye(n_train, dtype=torch.bool)[None]  # [1, n, n]: True where attention is allowed
for _ in range(200):
    prediction, _ = attend(x_train[None, :, None], x_train[None, :, None], y_train[None, :, None], mask=others,
                           score=gaussian_score(log_width.exp()))
    loss = ((prediction[0, :, 0] - y_train) ** 2).mean()
    (gradient,) = torch.autograd.grad(loss, log_width)
    with torch.no_grad():
        log_width -= 0.5 * gradient  # plain gradient descent
learned = log_width.exp().item()
print(f"learned kernel width {learned:.3f} (leave-one-out mean squared error {loss.item():.3f})")

# %%
with torch.no_grad():
    y_average = torch.full_like(x_test, y_train.mean().item())
    y_fixed, weights_fixed = attend(x_test[None, :, None], x_train[None, :, None], y_train[None, :, None],
                                    score=gaussian_score(1.0))
    y_learned, weights_learned = attend(x_test[None, :, None], x_train[None, :, None], y_train[None, :, None],
                                        score=gaussian_score(learned))

fig, axes = plt.subplots(1, 3, figsize=(15, 4))
axes[0].plot(x_test, y_truth, "k-", label="truth")
axes[0].plot(x_train, y_train, "o", alpha=0.5, label="samples (keys, values)")
axes[0].plot(x_test, y_average, "--", label="average pooling")
axes[0].plot(x_test, y_fixed[0, :, 0], label="Gaussian kernel, width 1")
axes[0].plot(x_test, y_learned[0, :, 0], label=f"learned width {learned:.2f}")
axes[0].set_xlabel("x")
axes[0].legend(fontsize=8)
for ax, w, title in ((axes[1], weights_fixed, "width 1"), (axes[2], weights_learned, f"width {learned:.2f}")):
    image = ax.imshow(w[0], cmap="Reds", aspect="auto", extent=(x_train[0], x_train[-1], x_test[-1], x_test[0]))
    ax.set_xlabel("keys: training x (sorted)")
    ax.set_ylabel("queries: test x")
    ax.set_title(f"attention weights, {title}")
    fig.colorbar(image, ax=ax)
plt.show()

# %% [markdown]
# Each row of a heatmap is one query's weights: they sit on the keys near the query, and a narrower kernel puts
# them on fewer keys, which follows the samples (and their noise) more closely.
#
# ## Learned scores: dot, scaled dot, general, additive
#
# In a sequence model queries and keys are vectors (a decoder state, an encoder state), and the score function is
# part of the model:
#
# | score | $f_{att}(q, k)$ | from |
# |---|---|---|
# | dot | $q^\top k$ | Luong et al. 2015 |
# | scaled dot | $q^\top k / \sqrt{d}$ | Vaswani et al. 2017 |
# | general | $q^\top W k$ | Luong et al. 2015 |
# | additive | $v^\top \tanh(W_q q + W_k k)$ | Bahdanau et al. 2014 |
#
# The four on the same query and eight keys of size 16, each through attnkit's own function or module:

# %%
d, n_keys = 16, 8
q = torch.randn(1, 1, d)
keys = torch.randn(1, n_keys, d)
general, additive = GeneralScore(d, d), AdditiveScore(d, d, d_hidden=32)
with torch.no_grad():
    scores_by_kind = {"dot": dot_score(q, keys), "scaled dot": scaled_dot_score(q, keys),
                      "general": general(q, keys), "additive": additive(q, keys)}

fig, axes = plt.subplots(1, 4, figsize=(15, 3), sharey=True)
for ax, (kind, e) in zip(axes, scores_by_kind.items()):
    ax.bar(range(n_keys), torch.softmax(e[0, 0], -1))
    ax.set_title(f"{kind}: scores from {e.min():.1f} to {e.max():.1f}", fontsize=10)
    ax.set_xlabel("key")
axes[0].set_ylabel("softmax weight")
plt.show()

# %% [markdown]
# The unscaled dot product's scores spread widest, so its softmax puts almost all the weight on one key; the
# general and additive scores start from random weights here, so their weights mean nothing yet (training makes
# them). Now write three of them yourself. Shapes: queries [B, T, d], keys [B, S, d], scores [B, T, S].

# %%
def my_scaled_dot_score(queries, keys):
    # BEGIN SOLUTION
    return queries @ keys.transpose(-1, -2) / math.sqrt(keys.size(-1))
    # END SOLUTION


# %%
print(attnkit.check.scores(my_scaled_dot_score, "scaled_dot"))

# %% [markdown]
# General: $q^\top W k$ with `W` [d_q, d_k], so queries and keys may differ in size.

# %%
def my_general_score(queries, keys, W):
    # BEGIN SOLUTION
    return queries @ W @ keys.transpose(-1, -2)
    # END SOLUTION


# %%
print(attnkit.check.scores(my_general_score, "general"))

# %% [markdown]
# Additive: $v^\top \tanh(W_q q + W_k k)$ with `W_q` [h, d_q], `W_k` [h, d_k] and `v` [h] (no bias). Every query
# meets every key: broadcast the projected queries [B, T, 1, h] against the projected keys [B, 1, S, h].

# %%
def my_additive_score(queries, keys, W_q, W_k, v):
    # BEGIN SOLUTION
    hidden = torch.tanh((queries @ W_q.T)[:, :, None, :] + (keys @ W_k.T)[:, None, :, :])  # [B, T, S, h]
    return hidden @ v
    # END SOLUTION


# %%
print(attnkit.check.scores(my_additive_score, "additive"))

# %% [markdown]
# ## Why divide by $\sqrt{d}$
#
# If the components of $q$ and $k$ are independent with mean 0 and variance 1, then $q^\top k = \sum_{i=1}^d q_i
# k_i$ has mean 0 and variance $d$: the scores spread as $\sqrt{d}$. A softmax of widely spread scores puts nearly
# all the weight on the largest one (it *saturates*), and its gradient, $\partial a / \partial e = \mathrm{diag}(a) -
# a a^\top$, goes to zero there, so the layers below stop learning. Dividing by $\sqrt{d}$ brings the variance back
# to 1 at every $d$. Measured on random vectors, 64 keys per query:

# %%
dims = [4, 16, 64, 256, 1024]
trials = 100 if BUDGET == "small" else 500
spread, top_weight, gradient = {"": []}, {"unscaled": [], "scaled": []}, {"unscaled": [], "scaled": []}
for d in dims:
    q, k = torch.randn(trials, 1, d), torch.randn(trials, 64, d)
    e = dot_score(q, k)[:, 0]  # [trials, 64]
    spread[""].append(e.std().item())
    for name, scores in (("unscaled", e), ("scaled", e / math.sqrt(d))):
        a = torch.softmax(scores, -1)
        top_weight[name].append(a.max(-1).values.mean().item())
        jacobian = torch.diag_embed(a) - a[:, :, None] * a[:, None, :]  # d a / d e, [trials, 64, 64]
        gradient[name].append(jacobian.flatten(1).norm(dim=1).mean().item())

fig, axes = plt.subplots(1, 3, figsize=(15, 4))
axes[0].loglog(dims, spread[""], "o-", label="measured std of q.k")
axes[0].loglog(dims, [math.sqrt(d) for d in dims], "k--", label="sqrt(d)")
axes[0].set_title("dot products spread as sqrt(d)")
for name in ("unscaled", "scaled"):
    axes[1].semilogx(dims, top_weight[name], "o-", label=name)
    axes[2].loglog(dims, gradient[name], "o-", label=name)
axes[1].set_title("mean largest softmax weight (64 keys)")
axes[2].set_title("size of the softmax's gradient ||da/de||")
for ax in axes:
    ax.set_xlabel("d")
    ax.legend()
plt.show()
for d, s, t, g in zip(dims, spread[""], top_weight["unscaled"], gradient["unscaled"]):
    print(f"d = {d:5d}: std of q.k {s:6.2f}; unscaled: largest weight {t:.3f}, gradient {g:.4f}")

# %% [markdown]
# Unscaled, the largest weight climbs towards 1 as $d$ grows and, once the softmax saturates, the gradient
# collapses; scaled, both stay where they were at $d = 4$.
#
# ## Scaled dot-product attention, with a mask
#
# Put the pieces together: $\mathrm{Attention}(Q, K, V) = \mathrm{softmax}(Q K^\top / \sqrt{d_k})\, V$, with a
# boolean `mask` [B, T, S] that is True where a query may see a key (or None: every key). The check also calls it
# on a row where every key is masked: attnkit gives such a query zero weights and a zero output, never NaN.
# Return the output [B, T, d_v] (or the output and the weights).

# %%
def my_attention(queries, keys, values, mask=None):
    # BEGIN SOLUTION
    scores = queries @ keys.transpose(-1, -2) / math.sqrt(keys.size(-1))  # [B, T, S]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row of -inf: NaN, made 0
    return weights @ values, weights
    # END SOLUTION


# %%
print(attnkit.check.attention(my_attention))

# %% [markdown]
# What the check catches, on purpose: here are three versions with a mistake each, and what it says about them.

# %%
def attention_without_scaling(queries, keys, values, mask=None):
    scores = queries @ keys.transpose(-1, -2)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ values


def attention_mask_after_softmax(queries, keys, values, mask=None):
    weights = torch.softmax(queries @ keys.transpose(-1, -2) / math.sqrt(keys.size(-1)), dim=-1)
    return (weights if mask is None else weights * mask) @ values


def attention_over_the_queries(queries, keys, values, mask=None):
    scores = queries @ keys.transpose(-1, -2) / math.sqrt(keys.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=1).nan_to_num(0.0) @ values


for wrong in (attention_without_scaling, attention_mask_after_softmax, attention_over_the_queries):
    print(attnkit.check.attention(wrong), end="\n\n")

# %% [markdown]
# ## The masked softmax
#
# A batch holds sentences of different lengths, padded to the longest; a query must give the padding no weight.
# Setting the masked scores to $-\infty$ before the softmax does it: $e^{-\infty} = 0$, and the allowed weights
# still sum to 1. A row with *nothing* allowed is $0/0$: NaN, which would spread through every later layer. attnkit
# gives that row zeros. Write it: `scores` and `mask` [B, T, S], True = allowed.

# %%
def my_masked_softmax(scores, mask):
    # BEGIN SOLUTION
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return weights.nan_to_num(0.0)
    # END SOLUTION


# %%
print(attnkit.check.masked_softmax(my_masked_softmax))

# %% [markdown]
# Four queries over six keys, whose sentences are 6, 4, 2 and 0 keys long (the last one: padding only):

# %%
lengths = torch.tensor([6, 4, 2, 0])
mask = torch.arange(6)[None, :] < lengths[:, None]  # [4, 6]
scores = torch.randn(4, 6)
fig, axes = plt.subplots(1, 3, figsize=(14, 3))
panels = (("softmax, no mask", torch.softmax(scores, -1)),
          ("-inf, then softmax (NaN row)", torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)),
          ("attnkit.nn.masked_softmax", masked_softmax(scores, mask)))
for ax, (title, w) in zip(axes, panels):
    ax.imshow(w.nan_to_num(-1.0), cmap="Blues", vmin=-0.05, vmax=1)
    for (i, j), value in zip(torch.cartesian_prod(torch.arange(4), torch.arange(6)).tolist(), w.flatten().tolist()):
        ax.text(j, i, "NaN" if math.isnan(value) else f"{value:.2f}", ha="center", va="center", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("key")
    ax.set_yticks(range(4), [f"length {n}" for n in lengths.tolist()])
plt.show()

# %% [markdown]
# ## What next
#
# The same `attend` runs inside every model of attnkit: RNNsearch's additive attention over the encoder states
# (notebook 2), Show, Attend and Tell's over the regions of an image (notebook 3), and the Transformer's
# multi-head self-attention (notebook 4). docs/lectures.md maps each concept to the file that implements it.
