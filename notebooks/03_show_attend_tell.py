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
# # 3. Show, attend and tell
#
# Xu et al. (2015) caption an image with an LSTM that, before each word, attends over the regions of a CNN's feature
# grid: the same additive attention as RNNsearch, with image regions in place of source words. We caption Flickr8k
# images, draw where each word looked (the paper's figure), look at one mistake and what the attention shows
# about it, and write the "doubly stochastic" attention penalty yourself.
#
# **Which model:** the recipe's run `runs/flickr8k_sat` (`make flickr8k`, 45 minutes, COCO BLEU-4 21.7 on dev) if it
# exists (at either budget); otherwise a small Show-Attend-Tell trained here on cached grids (full budget: 1,000
# training images, 3 minutes; small budget: 40 images, a few steps, which learns only the most frequent words). The
# notebook prints which.
#
# **Needs:** `flickr8k/` (images and captions) in attnkit's data directory (`ATTNKIT_DATA`, else `../shared/data`;
# `attnkit data fetch flickr8k`), the EfficientNet-Lite0 weights that attnkit installs, matplotlib. The CNN grids are
# extracted once into `runs/features/` (the recipe's cache). Nothing is downloaded.
#
# **Runtime on the 2-core machine:** full budget without the recipe's run: extracting 1,000 grids once (the cache
# keeps them for the next run) and 3 training minutes, the total measured by `make notebooks`; with the recipe's
# run, only loading and captioning. Small budget (`ATTNKIT_NOTEBOOK_BUDGET=small`) 16 to 25 seconds, measured on a
# busy machine with the 40 images' grids extracted (7 seconds more the first time).
#
# The code it exercises: `src/attnkit/models/captioner.py` (`ShowAttendTell`), `src/attnkit/nn/vision.py`,
# `src/attnkit/viz/attention.py` (`plot_caption_attention`); docs/lectures.md section 12.

# %%
# %matplotlib inline
import os
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import attnkit
from attnkit.config import load_config
from attnkit.data import load_image, read_flickr8k
from attnkit.tokens import BOS, EOS, PAD
from attnkit.viz import plot_caption_attention

BUDGET = os.environ.get("ATTNKIT_NOTEBOOK_BUDGET", "full")
assert BUDGET in ("small", "full"), f"ATTNKIT_NOTEBOOK_BUDGET={BUDGET!r}: expected small or full"
full = BUDGET == "full"
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "configs").is_dir())  # the repository
RUNS = ROOT / "runs" / "notebooks"
print(f"budget: {BUDGET}, torch threads: {torch.get_num_threads()}")

# %% [markdown]
# ## The model
#
# At each word t the decoder's state h_{t-1} scores every region a_i of the 7 x 7 (or 10 x 10) grid with
# e_ti = f_att(a_i, h_{t-1}) (additive), alpha_t = softmax(e_t), and reads the context z_t = beta_t sum_i alpha_ti a_i,
# where the gate beta_t lets it look at the image less for words like "a" and "of". A "doubly stochastic" penalty
# pushes every region to be attended about once over the caption.

# %%
recipe = ROOT / "runs" / "flickr8k_sat"
if (recipe / "checkpoints").is_dir():  # at either budget: it costs only loading
    run_dir, which = recipe, "the recipe's run (make flickr8k)"
else:
    from attnkit.train import Trainer

    overrides = ["model.hidden_size=256", "model.attention_size=256", "model.dropout=0.3", "data.image_size=224",
                 f"data.feature_cache={ROOT / 'runs' / 'features'}", "train.progress=false", "train.eval_every=1000000",
                 "train.save_every=0", "train.eval_bleu=false", "train.average_last=0"]
    overrides += (["data.max_train_pairs=1000", "data.max_valid_pairs=100", "data.min_word_count=3",
                   "train.max_minutes=3"] if full else
                  ["data.max_train_pairs=40", "data.max_valid_pairs=4", "data.min_word_count=3", "train.max_steps=8",
                   "train.fit_schedule=false", "train.warmup_steps=2", "model.hidden_size=64",
                   "model.attention_size=64"])
    run_dir = RUNS / "03_show_attend_tell"
    shutil.rmtree(run_dir, ignore_errors=True)
    result = Trainer(load_config(ROOT / "configs" / "flickr8k_sat.toml", overrides), run_dir).train()
    which = (f"a small Show-Attend-Tell trained here: {result['step']} steps in {result['train_minutes']:.1f} min on "
             f"{'1,000' if full else '40'} images, validation loss {result['valid_loss']:.2f}")
captioner = attnkit.load(run_dir)
print(f"captioning with {which}")

# %% [markdown]
# ## Captions and where each word looked
#
# Dev images (never trained on), captioned by beam search; then the first one with every word's attention over the
# image: white is where the word looked.

# %%
dev = read_flickr8k(split="dev")
n_images = 12 if full else 3
images, references = dev.images[:n_images], dev.captions[:n_images]
captions = captioner.caption(images, beam=3, details=True)
for path, c, refs in zip(images, captions, references):
    print(f"{path.name}: {c.text[0]!r}\n    reference: {refs[0]!r}")

rows, columns = captioner.kind.grid(captioner)


def show(i: int):
    hyp = captions[i].hypotheses[0]
    words = captioner.tokenizers.id_to_piece(hyp.tokens) + ["<end>"]
    return plot_caption_attention(load_image(images[i]), words, hyp.attention, (rows, columns))


show(0)

# %% [markdown]
# ## A mistake, and what the attention shows
#
# A word is called a mistake here when none of the image's five reference captions uses it (articles, prepositions
# and the like excepted). The first such word among the captions above, with its attention map: does the model look
# at the object it names wrongly (it saw something there, and misnamed it), or somewhere else (the word came from
# the language model, not from the image)?

# %%
FUNCTION_WORDS = {"a", "an", "the", "of", "in", "on", "at", "to", "with", "and", "is", "are", "its", "his", "her",
                  "their", "into", "for", "while", "from", "by", "<unk>"}
mistake = None
for i, refs in enumerate(references):
    said = set(" ".join(refs).lower().replace(".", " ").replace(",", " ").split())
    words = captioner.tokenizers.id_to_piece(captions[i].hypotheses[0].tokens)
    wrong = [t for t, w in enumerate(words) if w not in said and w not in FUNCTION_WORDS]
    if wrong:
        mistake = (i, wrong[0], words)
        break
if mistake is None:
    print("no caption above uses a word its references do not: no mistake to show in these images")
else:
    i, t, words = mistake
    alpha = captions[i].hypotheses[0].attention[t]  # [rows * columns]
    top = alpha.topk(min(3, alpha.numel())).values.sum().item()
    print(f"{images[i].name}: {' '.join(words)!r}\n  '{words[t]}' is in none of the references, e.g. "
          f"{references[i][0]!r}\n  its attention: the 3 most attended of {alpha.numel()} regions hold {top:.0%} of it")
    fig, (left, right) = plt.subplots(1, 2, figsize=(7, 3.5))
    pixels = load_image(images[i]).permute(1, 2, 0).numpy()
    left.imshow(pixels)
    left.set_title("the image")
    right.imshow(pixels)
    upsampled = torch.nn.functional.interpolate(alpha.view(1, 1, rows, columns), size=pixels.shape[:2],
                                                mode="bicubic", align_corners=False)[0, 0].clamp(min=0)
    right.imshow((upsampled / upsampled.max()).numpy(), cmap="gray", alpha=0.6)
    right.set_title(f"where '{words[t]}' looked")
    for ax in (left, right):
        ax.axis("off")
    plt.show()

# %% [markdown]
# Read the map: attention concentrated on an object means the word is the model's name for what it saw there (a
# dog called a cat, a child called a man: the features were there, the naming went wrong); attention spread over
# the background, or on a region with nothing of the kind, means the word came from the caption so far rather than
# from the image ("a man in a red shirt" is a likely phrase). Attention is where the model looked, not a proof of
# why it wrote the word; the recipe's model, trained 45 minutes, makes fewer and more interesting mistakes than the
# small one.


# %% [markdown]
# ## Where the whole caption looked, and the doubly stochastic penalty
#
# Summing alpha_ti over the words t gives each region's total attention over the caption. Xu et al. add
# lambda sum_i (1 - sum_t alpha_ti)^2 to the loss (their eq. 14): every region should get about one word's worth of
# attention over the caption, so the model cannot describe one region all along and ignore the rest.
#
# ### Exercise: the attention penalty
#
# Write `my_penalty(alphas, targets, lam)`: alphas [B, T, L] (each word's attention over the L regions), targets
# [B, T] (the words, PAD = 0 after a caption's end: a padded position's attention does not count) -> the scalar
# lambda sum_b sum_i (1 - sum_t alpha_bti)^2.

# %%
def my_penalty(alphas: torch.Tensor, targets: torch.Tensor, lam: float) -> torch.Tensor:
    # BEGIN SOLUTION
    real = targets.ne(PAD).unsqueeze(-1)  # [B, T, 1]
    coverage = (alphas * real).sum(1)  # [B, L]: each region's attention over the caption
    return lam * ((1.0 - coverage) ** 2).sum()
    # END SOLUTION


# %%
def check_penalty(fn) -> str:
    """``fn`` against the captioner's own attention_penalty, on its attention over a dev caption and on a padded
    batch of random attention."""
    module = captioner.module
    lam = module.cfg.attention_penalty
    ids = captions[0].hypotheses[0].tokens
    with torch.no_grad():  # the model's attention while reading its own caption of the first image
        grid = captioner.image_grids([images[0]])
        alphas = module(grid, torch.tensor([[BOS] + ids]), need_weights=True).attention.cross[0][:, 0]
    own = (alphas, torch.tensor([ids + [EOS]]))
    g = torch.Generator().manual_seed(0)
    padded = torch.randint(4, 50, (3, 6), generator=g)
    padded[0, 4:], padded[1, 2:] = PAD, PAD
    cases = {"its attention over its own caption": own,
             "a padded batch of random attention": (torch.randn(3, 6, 49, generator=g).softmax(-1), padded)}
    for name, (a, targets) in cases.items():
        want, got = module.attention_penalty(a, targets), fn(a.clone(), targets.clone(), lam)
        if torch.as_tensor(got).numel() != 1:
            return f"{name}: a tensor of shape {tuple(torch.as_tensor(got).shape)}; the penalty is one number"
        if abs(float(got) - float(want)) > 1e-4 * max(1.0, abs(float(want))):
            hint = " (are padded positions left out?)" if name.startswith("a padded") else ""
            return f"{name}: {float(got):.5f}, attnkit's attention_penalty {float(want):.5f}{hint}"
    return "matches ShowAttendTell.attention_penalty on " + " and on ".join(cases)


print(check_penalty(my_penalty))

# %%
with torch.no_grad():
    hyp = captions[0].hypotheses[0]
    coverage = hyp.attention[:-1].sum(0)  # the words' attention summed (the end token left out)
fig, ax = plt.subplots(figsize=(3.5, 3.5))
pixels = load_image(images[0]).permute(1, 2, 0).numpy()
ax.imshow(pixels)
ax.imshow(torch.nn.functional.interpolate(coverage.view(1, 1, rows, columns), size=pixels.shape[:2],
                                          mode="bicubic", align_corners=False)[0, 0].clamp(min=0).numpy(),
          cmap="gray", alpha=0.6)
ax.set_title(f"sum over the caption's words\n(1 is one word's worth; max {coverage.max():.2f})", fontsize=9)
ax.axis("off")
plt.show()
