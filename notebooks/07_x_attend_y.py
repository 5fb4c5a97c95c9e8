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
# # 7. X, attend and Y: listen, attend and spell; ask, attend and answer
#
# Attention is not about text. Whatever the encoder reads (frames of sound, cells of an image grid), the decoder
# asks a query of its encodings and gets back a weighted sum. Two members of the family:
#
# * **Listen, attend and spell** (Chan et al. 2016): pyramidal BiLSTMs listen to log-mel frames, shrinking time 8x;
#   an LSTM speller attends over what they heard and spells characters. On spoken digit strings made of the Free
#   Spoken Digit Dataset's recordings, the attention should move along the sound, one digit after the other.
# * **Show, ask, attend and answer** (Kazemi & Elqursh 2017): a CNN reads the image into a grid, an LSTM reads the
#   question, and the question's state is the query of the attention over the grid. Same image, two questions: two
#   maps.
#
# You write the glimpse (the attention over the grid) yourself.
#
# **Needs:** `fsdd/recordings/` in attnkit's data directory (`ATTNKIT_DATA`, else `../shared/data`;
# `attnkit data fetch fsdd`), the `easy-vqa` package (`pip install 'attnkit[vqa]'`; the package holds its images),
# matplotlib. Nothing is downloaded.
#
# **Runtime on the 2-core machine:** full budget: 4 training minutes for LAS and 2.5 for VQA, or none where the
# recipes' runs exist; with data preparation and validation, the total is measured by `make notebooks`. Small budget
# (`ATTNKIT_NOTEBOOK_BUDGET=small`: tiny models, a few steps, which learn nothing yet: the maps are then flat or
# arbitrary) 18 to 31 seconds, measured on a busy machine.
#
# The code it exercises: `src/attnkit/models/las.py`, `src/attnkit/models/vqa.py` (`glimpse_weights`, `glimpses`),
# docs/speech.md, docs/vqa.md.

# %%
# %matplotlib inline
import os
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import attnkit
from attnkit.config import load_config
from attnkit.data.images import load_image
from attnkit.data.speech import read_fsdd_digits
from attnkit.data.vqa import read_easy_vqa
from attnkit.models.vqa import glimpse_weights, glimpses
from attnkit.train import Trainer
from attnkit.viz import plot_speech_attention

BUDGET = os.environ.get("ATTNKIT_NOTEBOOK_BUDGET", "full")
assert BUDGET in ("small", "full"), f"ATTNKIT_NOTEBOOK_BUDGET={BUDGET!r}: expected small or full"
full = BUDGET == "full"
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "configs").is_dir())  # the repository
RUNS = ROOT / "runs" / "notebooks"
print(f"budget: {BUDGET}, torch threads: {torch.get_num_threads()}")


def recipe_or_train(recipe: str, config: str, name: str, overrides: list[str]) -> Path:
    """The recipe's run ``runs/recipe`` where it exists (make fsdd-digits, make easy-vqa), else a fresh run of
    ``configs/config`` with ``overrides``, in runs/notebooks/name."""
    if (ROOT / "runs" / recipe / "checkpoints").is_dir():
        print(f"using the recipe's run runs/{recipe}")
        return ROOT / "runs" / recipe
    run_dir = RUNS / name
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config(ROOT / "configs" / config, overrides + ["train.progress=false", "train.eval_every=1000000",
                                                             "train.save_every=0"])
    result = Trainer(cfg, run_dir).train()
    scores = {k: round(v, 3) for k, v in result.items() if k.startswith("valid_")}
    print(f"trained here, {name}: {result['step']} steps in {result['train_minutes']:.1f} min, {scores}")
    return run_dir


# %% [markdown]
# ## Listen, attend and spell
#
# The recipe (`configs/fsdd_digits_las.toml`, `make fsdd-digits`) trains 20 minutes on strings of 1 to 10 digits; the
# notebook uses its run `runs/fsdd_digits_las` if it exists, else trains a half-width LAS here for 4 minutes on
# strings of at most 3 digits. LAS is slow to start listening: until its attention finds the alignment it spells
# the most frequent strings whatever it hears, so a short run may still be at that stage. The speller's energy is
# the paper's `<phi(s_i), psi(h_u)>`, a dot product of two small MLPs' outputs.

# %%
las_overrides = (["train.max_minutes=4", "data.n_synthetic=1500", "data.max_digits=3", "data.max_valid_pairs=100",
                  "model.listener_size=64", "model.speller_size=128", "train.max_tokens=4000", "train.warmup_steps=30",
                  "train.lr=3e-3"] if full else
                 ["train.max_steps=6", "train.fit_schedule=false", "train.warmup_steps=2", "data.n_synthetic=24",
                  "data.max_digits=2", "data.max_valid_pairs=8", "model.listener_size=16", "model.speller_size=32",
                  "train.max_tokens=4000"])
las = attnkit.load(recipe_or_train("fsdd_digits_las", "fsdd_digits_las.toml", "07_las", las_overrides))

test = read_fsdd_digits(las.config.data, "test")
utterance, truth = test.audio[0], test.transcripts[0]
transcript = las.transcribe(utterance, beam=1, details=True)
hyp = transcript.hypotheses[0]
print(f"heard {transcript.text[0]!r}, said {truth!r}")
plot_speech_attention(las.kind.features(las, utterance).numpy(), las.tokenizers.id_to_piece(hyp.tokens) + ["<end>"],
                      hyp.attention.numpy(), las.module.time_reduction)

# %% [markdown]
# Each row is one output character's attention over the listener's frames (80 ms each), on the spectrogram's time
# axis. A trained speller's rows form a staircase: each digit's row lights up where that digit is spoken, the
# spaces between them at the pauses. (At the small budget the model has not learned to listen yet: the rows are
# smeared over the utterance.)
#
# ## Show, ask, attend and answer
#
# easy-VQA: 64-pixel images of one coloured shape, questions about its colour, its shape, or yes/no. The recipe
# (`make easy-vqa`) trains 14 minutes to 99% test accuracy; the notebook uses its run `runs/easy_vqa` if it exists,
# else trains the same model here for 2.5 minutes.

# %%
vqa_overrides = (["train.max_minutes=2.5"] if full else
                 ["train.max_steps=6", "train.fit_schedule=false", "train.warmup_steps=2", "data.max_train_pairs=1500",
                  "data.max_valid_pairs=32", "model.cnn_channels=[8, 16, 16]", "model.hidden_size=32",
                  "model.attention_size=32", "model.classifier_size=32", "train.batch_size=32"])
vqa = attnkit.load(recipe_or_train("easy_vqa", "easy_vqa.toml", "07_vqa", vqa_overrides))

questions = read_easy_vqa("test")
image = questions.images[0]
asked = [q for i, q in enumerate(questions.questions) if questions.images[i] == image][:2]
if len(asked) < 2:  # every test image has several questions; this is only a guard
    asked = ["what color is the shape?", "what is the shape?"]
answers = vqa.answer([image, image], asked)

pixels = load_image(image, 224).permute(1, 2, 0).numpy()
n_glimpses = answers[0].glimpses.size(0)
fig, axes = plt.subplots(len(asked), 1 + n_glimpses, figsize=(2.6 * (1 + n_glimpses), 2.8 * len(asked)))
for row, (question, a) in zip(axes, zip(asked, answers)):
    row[0].imshow(pixels)
    row[0].set_title(f"{question}\n-> {a.answer} ({a.probability:.2f})", fontsize=8)
    for c, ax in enumerate(row[1:]):
        grid = a.glimpses[c][None, None]  # [1, 1, rows, columns]
        upsampled = F.interpolate(grid, size=pixels.shape[:2], mode="bicubic", align_corners=False)[0, 0]
        ax.imshow(pixels)
        ax.imshow(upsampled.clamp(min=0).numpy(), cmap="gray", alpha=0.6)
        ax.set_title(f"glimpse {c + 1}", fontsize=8)
for ax in axes.flat:
    ax.axis("off")
plt.show()

# %% [markdown]
# The image is the same in both rows; only the question (the query) differs, so the maps differ. A trained model
# puts its glimpses on the shape for a question about the shape, and often somewhere else entirely, or on its
# edge, for a question the colour of any of its pixels answers. (`python bench/vqa_figure.py --run runs/easy_vqa`
# draws the same figure from the recipe's model.)
#
# ### Exercise: the glimpse
#
# Write `my_glimpse(F, phi)`: attention logits F [B, K, L] (K glimpses over L grid cells) and cell features
# phi [B, L, C] -> (alpha [B, K, L], x [B, K, C]) with alpha_{c,l} = softmax over the cells of F_{c,l} and
# x_c = sum_l alpha_{c,l} phi_l.

# %%
def my_glimpse(F: torch.Tensor, phi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # BEGIN SOLUTION
    alpha = torch.softmax(F, dim=-1)  # over the cells, not over the glimpses
    return alpha, alpha @ phi
    # END SOLUTION


# %%
def check_glimpse(fn) -> str:
    """``fn`` against attnkit's glimpse_weights and glimpses, on random grids, one cell, one glimpse."""
    g = torch.Generator().manual_seed(0)
    for name, (b, k, cells, c) in {"random grids": (3, 2, 64, 16), "one cell": (2, 2, 1, 8),
                                   "one glimpse, a batch of one": (1, 1, 9, 4)}.items():
        logits, phi = torch.randn(b, k, cells, generator=g) * 3, torch.randn(b, cells, c, generator=g)
        alpha, x = fn(logits.clone(), phi.clone())
        want_alpha = glimpse_weights(logits)
        want_x = glimpses(want_alpha, phi)
        for what, got, want in (("alpha", alpha, want_alpha), ("x", x, want_x)):
            if tuple(got.shape) != tuple(want.shape):
                return f"{name}: {what} of shape {tuple(got.shape)}, expected {tuple(want.shape)}"
            gap = (got - want).abs()
            if gap.max() > 1e-5:
                where = tuple(int(i) for i in (gap == gap.max()).nonzero()[0])
                hint = " (does each glimpse's softmax run over the cells, the last axis?)" if what == "alpha" else ""
                return f"{name}: {what} differs by {gap.max():.2e} at {where}{hint}"
    return "matches attnkit.models.vqa's glimpse_weights and glimpses on random grids, one cell, one glimpse"


print(check_glimpse(my_glimpse))

# %% [markdown]
# The same three lines are every attention in this course: scores, a softmax over what may be looked at, a
# weighted sum. Only the keys change: source words (RNNsearch), image regions (show, attend and tell), frames of
# sound (LAS), grid cells chosen by a question (here).
