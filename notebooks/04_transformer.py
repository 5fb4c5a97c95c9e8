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
# # 4. Self-attention and the Transformer
#
# In self-attention a sequence attends to itself: every position is a query, a key and a value at once, each a
# learned projection of the same vector. That is the whole of the Transformer's mixing between positions
# (Vaswani et al. 2017). This notebook builds it up: queries, keys and values as projections; why self-attention
# alone cannot see order (it is permutation-equivariant) and how sinusoidal positions fix that; the causal mask;
# multi-head attention; the lectures' table of what a layer costs against recurrent and convolutional layers,
# measured; then a small Transformer trained on the dates task with its heads drawn, and the key/value cache that
# makes decoding fast, timed. You write the positional encoding, the causal mask and multi-head attention;
# `attnkit.check` compares each with attnkit's own.
#
# **Needs:** nothing but attnkit and matplotlib (`pip install "attnkit[notebooks]"`); the dates are generated,
# nothing is downloaded. It writes a training run under `runs/notebooks/`.
#
# **Runtime on the 2-core machine:** full budget about 3 minutes (the Transformer trains for 2 minutes at one thread,
# `attnkit bench complexity --quick` runs about half a minute); small budget (`ATTNKIT_NOTEBOOK_BUDGET=small`: a tiny
# Transformer trained for a few seconds, which learns little, and only the steps and paths of the cost table) about
# 25 seconds. Both measured with other jobs on the machine: a quiet one is faster, and trains further in its 2 minutes.
#
# The code it exercises: `src/attnkit/nn/attention.py` (`MultiHeadAttention`, `causal_mask`, `KVCache`),
# `src/attnkit/nn/positional.py` (`sinusoidal_table`), `src/attnkit/models/transformer.py`,
# `src/attnkit/bench_complexity.py`; docs/lectures.md sections 4 to 7, 13 and 16.

# %%
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import attnkit
import attnkit.check
from attnkit import bench_complexity
from attnkit.config import config_from_dict
from attnkit.data import generate_dates
from attnkit.demo import DEMO
from attnkit.nn import MultiHeadAttention, causal_mask, sinusoidal_table
from attnkit.tokens import BOS, EOS
from attnkit.train import Trainer

BUDGET = os.environ.get("ATTNKIT_NOTEBOOK_BUDGET", "full")
assert BUDGET in ("small", "full"), f"ATTNKIT_NOTEBOOK_BUDGET={BUDGET!r}: expected small or full"
full = BUDGET == "full"
ROOT = next((p for p in (Path.cwd(), *Path.cwd().parents) if (p / "configs").is_dir()), Path.cwd())
RUNS = ROOT / "runs" / "notebooks"
torch.manual_seed(0)
print(f"budget: {BUDGET}, torch threads: {torch.get_num_threads()}")

# %% [markdown]
# ## Queries, keys and values are projections
#
# Take a sequence $X$ [n, d] (one row per token). Self-attention projects it three times,
# $Q = X W^Q$, $K = X W^K$, $V = X W^V$, and attends: $\mathrm{softmax}(Q K^\top / \sqrt{d_k})\, V$. Every token
# asks (its query) and answers (its key, its value): the weights are an n x n matrix, row i is where token i looks.

# %%
words = "the dog bites the man".split()
vocabulary = sorted(set(words))
embedding = torch.nn.Embedding(len(vocabulary), 16)
X = embedding(torch.tensor([vocabulary.index(w) for w in words])).detach()  # [5, 16]
W_q, W_k, W_v = (torch.randn(16, 16) / 4 for _ in range(3))
Q, K, V = X @ W_q, X @ W_k, X @ W_v
weights = torch.softmax(Q @ K.T / math.sqrt(16), dim=-1)
fig, ax = plt.subplots(figsize=(4, 3.5))
ax.imshow(weights, cmap="Blues")
ax.set_xticks(range(5), words)
ax.set_yticks(range(5), words)
ax.set_xlabel("key")
ax.set_ylabel("query")
ax.set_title("self-attention weights (random projections)")
plt.show()

# %% [markdown]
# ## Self-attention cannot see order
#
# Nothing in $\mathrm{softmax}(Q K^\top / \sqrt{d_k})\, V$ knows where a token is: permute the inputs and the
# outputs come out permuted the same way. *The dog bites the man* and *the man bites the dog* give "dog" and "man"
# exactly the same outputs. attnkit's `MultiHeadAttention` on both orders:

# %%
attention = MultiHeadAttention(16, n_heads=4).eval()
other = "the man bites the dog".split()
perm = torch.tensor([0, 4, 2, 3, 1])  # other[i] == words[perm[i]]
assert [words[i] for i in perm] == other


def self_attend(x):
    with torch.no_grad():
        return attention(x[None]).output[0]


y, y_other = self_attend(X), self_attend(X[perm])
print(f"without positions, largest |f(X)[perm] - f(X[perm])| = {(y[perm] - y_other).abs().max():.2e}")

# %% [markdown]
# The fix is to add to each token's vector a vector that says where it is. The paper's sinusoids:
#
# $$PE_{(pos, 2i)} = \sin(pos / 10000^{2i/d}), \qquad PE_{(pos, 2i+1)} = \cos(pos / 10000^{2i/d}).$$
#
# Each pair of columns is a clock at its own frequency, from one turn every $2\pi$ positions down to one every
# $2\pi \cdot 10000$. **Your turn:** write the table, [n_positions, d_model], sines in the even columns.

# %%
def my_positional_encoding(n_positions, d_model):
    # BEGIN SOLUTION
    position = torch.arange(n_positions, dtype=torch.float32)[:, None]  # [n, 1]
    frequency = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)  # [d/2]
    table = torch.zeros(n_positions, d_model)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d_model // 2])
    return table
    # END SOLUTION


# %%
print(attnkit.check.positional_encoding(my_positional_encoding))

# %% [markdown]
# With the positions added (attnkit's `sinusoidal_table`), the two sentences are told apart:

# %%
P = sinusoidal_table(5, 16)
y, y_other = self_attend(X + P), self_attend(X[perm] + P)
print(f"with positions, largest |f(X + P)[perm] - f(X[perm] + P)| = {(y[perm] - y_other).abs().max():.2f}")

# %% [markdown]
# The table, and the dot products of its rows: $PE_{pos} \cdot PE_{pos + k} = \sum_i \cos(k / 10000^{2i/d})$ depends
# on the offset $k$ only, not on $pos$, and it is largest at $k = 0$ and falls off with distance. A fixed linear map
# takes $PE_{pos}$ to $PE_{pos+k}$ (a rotation of each pair), which is what lets attention learn to look "k tokens
# back".

# %%
table = sinusoidal_table(100, 64)
fig, axes = plt.subplots(1, 3, figsize=(16, 4))
image = axes[0].imshow(table.T, cmap="RdBu", aspect="auto")
axes[0].set_xlabel("position")
axes[0].set_ylabel("column")
axes[0].set_title("sinusoidal_table(100, 64)")
fig.colorbar(image, ax=axes[0])
for column in (4, 5, 20, 21):
    axes[1].plot(table[:, column], label=f"column {column}")
axes[1].set_xlabel("position")
axes[1].legend(fontsize=8)
axes[1].set_title("two clocks: sin and cos of two frequencies")
products = table @ table.T
for pos in (10, 40, 70):
    axes[2].plot(range(-pos, 100 - pos), products[pos], label=f"pos {pos}")
axes[2].set_xlabel("offset k")
axes[2].set_ylabel("PE(pos) . PE(pos + k)")
axes[2].set_title("dot products depend on the offset only")
axes[2].legend(fontsize=8)
plt.show()

# %% [markdown]
# ## The causal mask
#
# A decoder predicts token i from tokens before it, and trains on all positions at once: position i must not see
# positions after i. The mask is True where query i may see key j, $j \le i$: the lower triangle. **Your turn:**
# `my_causal_mask(t)` -> [t, t] booleans. (Taking a second argument `s`, for s keys of which the queries are the
# last t, as a decoder with a cache has, earns more cases in the check.)

# %%
def my_causal_mask(t, s=None):
    # BEGIN SOLUTION
    s = t if s is None else s
    return torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None]
    # END SOLUTION


# %%
print(attnkit.check.causal_mask(my_causal_mask))

# %% [markdown]
# Under the mask, changing the last token of a sequence changes no earlier output:

# %%
x = torch.randn(1, 8, 16)
changed = x.clone()
changed[0, -1] = torch.randn(16)
with torch.no_grad():
    before, after = attention(x, causal=True).output, attention(changed, causal=True).output
    unmasked = (attention(x).output - attention(changed).output).abs().amax(-1)[0]
print("causal, change at each position:  ", " ".join(f"{v:.1e}" for v in (before - after).abs().amax(-1)[0]))
print("no mask, change at each position: ", " ".join(f"{v:.1e}" for v in unmasked))
print(causal_mask(5).int())

# %% [markdown]
# ## Multi-head attention
#
# One softmax mixes the values in one way. $h$ heads attend in $h$ subspaces at once:
#
# $$\mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\, W^O, \qquad
# \mathrm{head}_i = \mathrm{Attention}(Q W_i^Q, K W_i^K, V W_i^V).$$
#
# In code the h projections are one [D, D] matrix each for Q, K and V, whose output is cut into h slices of
# $d_{head} = D / h$ contiguous features: view [B, T, D] as [B, T, h, d_head], then move the heads before the
# positions, [B, h, T, d_head]. Each head scales by $\sqrt{d_{head}}$. **Your turn:** the weights are
# `nn.Linear` weights [D, D] (so $Q = $ `queries @ W_q.T`), no biases.

# %%
def my_multi_head(queries, keys, values, W_q, W_k, W_v, W_o, n_heads):
    # BEGIN SOLUTION
    b, t, d = queries.shape
    d_head = d // n_heads

    def split(x):  # [B, n, D] -> [B, h, n, d_head]
        return x.view(x.size(0), x.size(1), n_heads, d_head).transpose(1, 2)

    q, k, v = split(queries @ W_q.T), split(keys @ W_k.T), split(values @ W_v.T)
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d_head), dim=-1)  # [B, h, T, S]
    heads = weights @ v  # [B, h, T, d_head]
    return heads.transpose(1, 2).reshape(b, t, d) @ W_o.T  # Concat(head_1..head_h) W^O
    # END SOLUTION


# %%
print(attnkit.check.multi_head(my_multi_head))

# %% [markdown]
# ## What a layer costs: recurrent, convolutional, self-attention
#
# The lectures' table (Vaswani et al., table 1), for n positions of width d and kernel k:
#
# | layer | per layer | sequential operations | maximum path length |
# |---|---|---|---|
# | self-attention | $O(n^2 d)$ | $O(1)$ | $O(1)$ |
# | recurrent | $O(n d^2)$ | $O(n)$ | $O(n)$ |
# | convolutional | $O(k n d^2)$ | $O(1)$ | $O(\log_k n)$ dilated, $O(n/k)$ contiguous |
#
# `attnkit bench complexity` measures every column on real layers: FLOPs as n and d grow (fitted exponents),
# sequential operations as the longest chain of dependent kernels the forward pass launches, and the maximum path
# length as the fewest hops, found by autograd, from input 0 to output n - 1. At the full budget the notebook runs the
# command (`--quick`: a few small sizes); at the small one, the same functions count the sequential operations and
# path lengths only.

# %%
out = RUNS / "04_complexity" / "complexity_quick.json"
if full:
    out.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "attnkit", "bench", "complexity", "--quick", "--out", str(out)],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    print(done.stdout[done.stdout.index("layer "):done.stdout.rindex("wrote ")])  # the table, not the file names
    fig, ax = plt.subplots(figsize=(12, 5))
    ax.imshow(plt.imread(out.with_suffix(".png")))  # the command's own plot of time, FLOPs and memory against n
    ax.axis("off")
    plt.show()
else:  # the structure only: counting FLOPs costs seconds of set-up, the full budget's command counts them
    path_ns = (4, 8, 16)
    print(f"{'layer':<30}{'sequential operations':<32}maximum path length   (n = {', '.join(map(str, path_ns))})")
    for kind, name in (("self_attention", "self-attention"), ("rnn", "recurrent (GRU)"),
                       ("conv", "convolutional (centred)"), ("conv_causal", "  causal"),
                       ("conv_dilated", "  causal, dilated k^l")):
        _, sequential, longest = bench_complexity.LECTURES[kind]
        steps = [bench_complexity.sequential_steps(kind, n) if kind in bench_complexity.LAYERS else "-"
                 for n in path_ns]
        paths = [bench_complexity.path_length(kind, n) for n in path_ns]
        steps, paths = ", ".join(map(str, steps)), ", ".join(map(str, paths))
        print(f"{name:<30}{sequential or '':<10}{steps:<22}{longest:<12}{paths}")

# %% [markdown]
# Self-attention needs one step and one hop whatever n is; the GRU needs n steps and n - 1 hops; a convolution needs
# one step but n/k hops (log_k n dilated). In FLOPs self-attention grows as n^2 and the others as n, so it costs
# more than a recurrent layer once n > d, the lectures' $n^2 d$ against $n d^2$. The recorded full run (n to 1024,
# d to 512) is `bench/results/complexity.json`, with its plot beside it.
#
# ## A Transformer trained on dates
#
# attnkit's dates task: *"Tuesday, March 4th 1997"* -> *"1997-03-04"*, generated from a seed, written in many
# forms. The encoder-decoder of `attnkit demo` (pre-LN, character vocabulary), trained with attnkit's Trainer.

# %%
table = {key: dict(value) if isinstance(value, dict) else value for key, value in DEMO.items()}
table["name"] = "notebook_dates_transformer"
table["train"].update(max_minutes=2.0 if full else 0.0, max_steps=100000 if full else 40, log_every=100,
                      progress=False, warmup_steps=100 if full else 10)
if not full:  # a tiny model: it learns little, but every cell below runs
    table["model"].update(d_model=32, d_ff=64, n_heads=2, n_encoder_layers=1, n_decoder_layers=1)
    table["data"].update(n_synthetic=2000, max_valid_pairs=50)
run_dir = RUNS / "04_dates_transformer"
shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time the notebook runs
result = Trainer(config_from_dict(table, "dates"), run_dir).train()
print(f"trained {result['step']} steps in {result['train_minutes']:.1f} min")

model = attnkit.load(run_dir)
test = generate_dates(500 if full else 50, seed=2)
outputs = model.translate(test.src, beam=1)
accuracy = sum(o == t for o, t in zip(outputs, test.tgt)) / len(test.tgt)
print(f"exact match on {len(test.tgt)} held-out dates: {accuracy:.1%}")
for source, output in list(zip(test.src, outputs))[:4]:
    print(f"  {source:<40} -> {output}")

# %% [markdown]
# Every head of the decoder's cross-attention, for one date (row t: the output position, column: the source
# character). Heads specialise: some read the year, some the month, some the day.

# %%
att = model.attention("Tuesday, March 4th 1997")
layers, heads = len(att.cross), att.cross[0].size(0)
fig, axes = plt.subplots(layers, heads, figsize=(3.2 * heads, 3 * layers), squeeze=False)
for layer in range(layers):
    for head in range(heads):
        ax = axes[layer][head]
        ax.imshow(att.cross[layer][head], cmap="gray_r", aspect="auto", vmin=0)
        ax.set_xticks(range(len(att.source)), att.source, fontsize=6, rotation=90)
        ax.set_yticks(range(len(att.target)), att.target, fontsize=6)
        ax.set_title(f"layer {layer}, head {head}", fontsize=9)
fig.suptitle(f"cross-attention: {att.text!r}")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## The key/value cache
#
# Decoding writes one token at a time. Without a cache, step t runs the decoder over all t tokens so far again: t
# positions' projections, t x t attention, in every layer, so n steps cost $O(n^2)$ position-passes. With a cache
# each layer keeps the keys and values of earlier positions (`KVCache`) and step t computes the new position only,
# attending to the cached ones: $O(n)$ in all. Same outputs, less work. Below, the trained decoder writes n tokens
# (past the end of a date: only the time matters), both ways, and the two sets of log-probabilities are compared.

# %%
module = model.module
src = torch.tensor([model.tokenizers.src.encode(["Tuesday, March 4th 1997"])[0] + [EOS]])


@torch.no_grad()
def decode_with_cache(memory, n):
    state, tokens, steps = module.init_state(memory), torch.tensor([BOS]), []
    for _ in range(n):
        log_probs, state, _ = module.step(tokens, state)
        tokens = log_probs.argmax(-1)
        steps.append(log_probs)
    return torch.cat(steps)


@torch.no_grad()
def decode_without_cache(memory, n):
    prefix, steps = torch.tensor([[BOS]]), []
    for _ in range(n):
        hidden, _, _ = module.decode_all(prefix, memory)  # the whole prefix again
        log_probs = torch.log_softmax(module.output(hidden[:, -1]), -1)
        prefix = torch.cat([prefix, log_probs.argmax(-1, keepdim=True)], 1)
        steps.append(log_probs)
    return torch.cat(steps)


lengths = [16, 32, 64] if not full else [16, 32, 64, 128, 256]
with torch.no_grad():
    memory = module.encode(src)
seconds = {"with the cache": [], "without": []}
for n in lengths:
    outputs = {}
    for name, decode in (("with the cache", decode_with_cache), ("without", decode_without_cache)):
        start = time.perf_counter()
        outputs[name] = decode(memory, n)
        seconds[name].append(time.perf_counter() - start)
    cached, uncached = seconds["with the cache"][-1], seconds["without"][-1]
    gap = (outputs["with the cache"] - outputs["without"]).abs().max()
    print(f"n = {n:3d}: {1000 * cached:7.1f} ms with the cache, {1000 * uncached:7.1f} ms without "
          f"({uncached / cached:.1f}x); largest log-probability gap {gap:.1e}")

fig, ax = plt.subplots(figsize=(5, 3.5))
for name, values in seconds.items():
    ax.plot(lengths, [1000 * s for s in values], "o-", label=name)
ax.set_xlabel("tokens decoded")
ax.set_ylabel("ms")
ax.set_title("greedy decoding, one sentence")
ax.legend()
plt.show()

# %% [markdown]
# The gap between the two is float rounding: the cache changes the speed, never the result. The time without the
# cache grows faster than linearly in n; with it, linearly. attnkit's decoders keep the cache in their state
# (`DecoderState.caches`), and beam search reorders it when beams swap (`select`).
#
# ## What next
#
# Notebook 5 trains a decoder-only Transformer, a character GPT, and samples from it. docs/lectures.md maps each
# concept here to its code: sections 4 to 7 (self-attention, masks, multi-head attention, positions), 13 (the
# Transformer) and 16 (the cost table).
