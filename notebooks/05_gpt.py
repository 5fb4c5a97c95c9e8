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
# # 5. GPT: a character model, sampling, causal attention
#
# A decoder-only Transformer reads text one character at a time and predicts the next one. We train attnkit's
# `transformer_lm` on Tiny Shakespeare for a few minutes, then sample from it with a temperature, top-k and top-p
# (nucleus) filtering, each setting's samples side by side, and look at the causal attention of one generated line.
# You write the sampling step's filter yourself and the notebook checks it against attnkit's.
#
# **Needs:** `tinyshakespeare/input.txt` in attnkit's data directory (`ATTNKIT_DATA`, else `../shared/data`;
# `attnkit data fetch tinyshakespeare` puts it there); attnkit and matplotlib. Nothing is downloaded here.
#
# **Runtime on the 2-core machine:** full budget about 4 minutes (3 training minutes, then validation and
# sampling: 3.6 minutes measured at one thread on a busy machine); small budget (`ATTNKIT_NOTEBOOK_BUDGET=small`, a
# tiny model trained for 150 steps) 15 to 25 seconds (the more on a busy
# machine).
#
# The code it exercises: `src/attnkit/models/lm.py` (`TransformerLM`), `src/attnkit/decode/search.py`
# (`filter_logits`, `with_temperature`, `sample`); docs/lectures.md section 14.

# %%
# %matplotlib inline
import os
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import attnkit
from attnkit.config import load_config
from attnkit.decode.search import filter_logits, with_temperature
from attnkit.tokens import BOS
from attnkit.train import Trainer, read_metrics

BUDGET = os.environ.get("ATTNKIT_NOTEBOOK_BUDGET", "full")
assert BUDGET in ("small", "full"), f"ATTNKIT_NOTEBOOK_BUDGET={BUDGET!r}: expected small or full"
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "configs").is_dir())  # the repository
RUNS = ROOT / "runs" / "notebooks"
print(f"budget: {BUDGET}, torch threads: {torch.get_num_threads()}")

# %% [markdown]
# ## Train a character GPT
#
# The recipe `configs/tinyshakespeare_char.toml` is a 4-layer, 256-wide pre-LN Transformer with learned positions
# and a 128-character context; its full run trains 30 minutes on two cores. Here the same model at half the width
# (128, which learns more per CPU second at this length) trains 3 minutes, its cosine schedule fitted to them:
# enough for the play's layout (names in capitals, a colon, short lines) and common words. At the small budget a
# 2-layer, 64-wide model trains 150 steps: it learns little more than which characters are frequent, but every
# cell below runs.

# %%
if BUDGET == "full":
    overrides = ["model.d_model=128", "model.d_ff=512", "model.dropout=0.0", "train.lr=2e-3",
                 "train.max_minutes=3", "train.eval_every=1000000", "train.save_every=0", "train.log_every=50"]
else:
    overrides = ["model.d_model=64", "model.n_layers=2", "model.d_ff=256", "model.dropout=0.0",
                 "train.max_steps=150", "train.fit_schedule=false", "train.warmup_steps=20", "train.lr=3e-3",
                 "train.max_tokens=1024", "train.eval_every=1000000", "train.save_every=0", "train.log_every=10",
                 "data.max_valid_pairs=8"]
cfg = load_config(ROOT / "configs" / "tinyshakespeare_char.toml", overrides + ["train.progress=false"])
run_dir = RUNS / "05_gpt"
shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time the notebook runs
result = Trainer(cfg, run_dir).train()
print(f"{result['step']} steps in {result['train_minutes']:.1f} min, validation loss {result['valid_loss']:.3f} "
      f"nats/char ({result['valid_bpc']:.2f} bits/char)")

# %%
curve = [(r["step"], r["train_nll"]) for r in read_metrics(run_dir) if "train_nll" in r]
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(*zip(*curve))
ax.axhline(result["valid_loss"], color="gray", ls="--", label="validation, at the end")
ax.set_xlabel("step")
ax.set_ylabel("training loss (nats/char)")
ax.legend()
plt.show()

# %% [markdown]
# ## Sampling: temperature, top-k, top-p
#
# At each step the model gives logits z over the characters. Sampling draws the next character from
# softmax(z / T): a temperature T below 1 sharpens the distribution (safer, more repetitive text), above 1
# flattens it (more surprising, more misspelt). Top-k keeps only the k most likely characters; top-p keeps the
# smallest set of most likely characters whose probability reaches p (Holtzman et al. 2020). Both then renormalise.
#
# First the distributions themselves: the next character after a prompt under each setting.

# %%
lm = attnkit.load(run_dir)
prompt = "ROMEO:\nWhat light through yonder window b"
ids = lm.tokenizers.encode([prompt])[0]
with torch.no_grad():
    logits = lm.module(None, torch.tensor([[BOS] + ids])).logits[0, -1:]  # [1, V], after BOS and the prompt
pieces = lm.tokenizers.id_to_piece(list(range(logits.size(-1))))
SETTINGS = {"T=0.5": dict(temperature=0.5), "T=1": dict(temperature=1.0), "T=1.5": dict(temperature=1.5),
            "top-k 5": dict(temperature=1.0, top_k=5), "top-p 0.9": dict(temperature=1.0, top_p=0.9)}


def next_char_probs(logits, temperature=1.0, top_k=0, top_p=1.0):
    """What the sampler draws from: the temperature first, then the filters (as attnkit.decode.search.sample)."""
    scaled = with_temperature(logits.log_softmax(-1), temperature)
    return filter_logits(scaled, top_k, top_p).softmax(-1)[0]


order = next_char_probs(logits).argsort(descending=True)[:15]
shown = ["⏎" if pieces[i] == "\n" else "␣" if pieces[i] == " " else pieces[i] for i in order.tolist()]
fig, axes = plt.subplots(1, len(SETTINGS), figsize=(3 * len(SETTINGS), 3), sharey=True)
for ax, (name, setting) in zip(axes, SETTINGS.items()):
    p = next_char_probs(logits, **setting)
    ax.bar(range(len(order)), p[order].numpy())
    ax.set_xticks(range(len(order)), shown)
    ax.set_title(f"{name}: {int((p > 0).sum())} chars possible", fontsize=9)
axes[0].set_ylabel(f"p(next | ...{prompt[-12:]!r})")
plt.show()

# %% [markdown]
# Now the samples, the same seed for every setting, side by side.

# %%
n_new = 240 if BUDGET == "full" else 80
samples = {name: lm.generate("ROMEO:", max_new_tokens=n_new, seed=1, **setting) for name, setting in SETTINGS.items()}
fig, axes = plt.subplots(1, len(samples), figsize=(3.6 * len(samples), 5))
for ax, (name, text) in zip(axes, samples.items()):
    ax.axis("off")
    ax.set_title(name)
    ax.text(0, 1, text, va="top", family="monospace", fontsize=7, wrap=True, transform=ax.transAxes)
plt.show()
for name, text in samples.items():
    print(f"--- {name}\n{text}\n")

# %% [markdown]
# ### Exercise: the sampling filter
#
# Write `my_filter(logits, top_k, top_p)`: logits [N, V] -> the same logits with every character outside the top-k
# and outside the top-p nucleus set to `-inf` (`top_k = 0` and `top_p = 1.0` mean no filter). The nucleus is the
# smallest set of most likely characters whose probability reaches `top_p`; the most likely character always
# survives, even for `top_p = 0`.

# %%
def my_filter(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    # BEGIN SOLUTION
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # [N, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # probability of the strictly more likely characters
        drop = mass_before >= top_p
        drop[:, 0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return logits
    # END SOLUTION


# %%
def check_filter(fn) -> str:
    """Compare ``fn`` with attnkit's filter_logits on random logits and the edge cases; one sentence back."""
    g = torch.Generator().manual_seed(0)
    cases = [(k, p) for k in (0, 1, 5, 100) for p in (1.0, 0.9, 0.5, 0.0)]
    for rows, vocab in ((1, 1), (1, 65), (4, 65), (3, 1000)):
        x = torch.randn(rows, vocab, generator=g) * 3
        for k, p in cases:
            want, got = filter_logits(x, k, p), fn(x.clone(), k, p)
            if got.shape != want.shape:
                return f"wrong shape for logits {tuple(x.shape)}: {tuple(got.shape)}, expected {tuple(want.shape)}"
            kept, should = torch.isfinite(got), torch.isfinite(want)
            if not torch.equal(kept, should):
                row, col = (kept != should).nonzero()[0].tolist()
                verb = "keeps" if kept[row, col] else "drops"
                return (f"top_k={k}, top_p={p}, logits {tuple(x.shape)}: row {row} {verb} token {col} "
                        f"({int(kept[row].sum())} kept, expected {int(should[row].sum())})")
            if not torch.equal(got[kept], x[kept]):
                return f"top_k={k}, top_p={p}: the surviving logits were changed (they must stay as they are)"
    return "matches attnkit.decode.search.filter_logits on every case (random logits, one token, top_p=0, k > V)"


print(check_filter(my_filter))

# %% [markdown]
# ## The causal attention of one generated line
#
# A GPT's self-attention is causal: character t attends to characters 1..t only, so the weights above the
# diagonal are exactly zero. Here is every head of the last layer on the first line the model wrote after the
# prompt (row: the character being predicted from; column: what it looks at; `<s>` is the start token).

# %%
generated = samples["T=0.5"]
line = next((s for s in generated.split("\n")[1:] if len(s.strip()) > 3), generated.split("\n")[0])[:40]
att = lm.attention(line)
layer = att.decoder[-1]  # [heads, T, T]
labels = [{" ": "␣", "\n": "⏎"}.get(c, c) for c in att.target]
above = torch.triu(layer, diagonal=1).abs().max().item()
print(f"line: {line!r}; largest weight above the diagonal, every head: {above:.1e}")
fig, axes = plt.subplots(1, layer.size(0), figsize=(3.3 * layer.size(0), 3.6))
for h, ax in enumerate(axes):
    ax.imshow(layer[h].numpy(), cmap="gray_r", vmin=0, vmax=1)
    ax.set_xticks(range(len(labels)), labels, fontsize=6)
    ax.set_yticks(range(len(labels)), labels, fontsize=6)
    ax.set_title(f"last layer, head {h}")
plt.show()

# %% [markdown]
# Read the heads: in a trained model one head typically looks at the previous character or two (spelling), another
# back to the last space or line start (where the word began), another spreads over the line. At the small budget
# the model is barely trained and the maps are mostly diffuse.
#
# Where to go next: `make tinyshakespeare` trains the 30-minute recipe (validation loss about 1.5 nats/char);
# `attnkit serve lm=runs/tinyshakespeare_char` and the explorer's *Language model* view show the same distributions
# step by step.
