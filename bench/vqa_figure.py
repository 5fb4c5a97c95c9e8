"""The README's VQA figure: one easy-VQA test image, two questions about it, and where the model looked for each
(its first glimpse over the image), from `make easy-vqa`'s attention model.

    python bench/vqa_figure.py --run runs/easy_vqa --out docs/figures/vqa_two_questions.png
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

import attnkit
from attnkit.data import load_image
from attnkit.data.vqa import read_easy_vqa


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/easy_vqa")
    ap.add_argument("--out", default="docs/figures/vqa_two_questions.png")
    ap.add_argument("--image", type=int, default=0, help="the test image's index in the package's test split")
    ap.add_argument("--questions", nargs=2, default=["what color is the shape?", "is there a circle in the image?"])
    args = ap.parse_args()

    model = attnkit.load(args.run)
    test = read_easy_vqa("test")
    image = sorted(set(test.images), key=lambda p: int(p.stem))[args.image]
    answers = model.answer([image, image], list(args.questions))
    pixels = load_image(image, 192).permute(1, 2, 0).numpy()
    fig = Figure(figsize=(7.5, 2.8))
    axes = fig.subplots(1, 3)
    for ax in axes:
        ax.axis("off")
    axes[0].imshow(pixels)
    axes[0].set_title(f"easy-VQA test image {image.stem}", fontsize=9)
    for ax, question, a in zip(axes[1:], args.questions, answers):
        glimpse = a.glimpses[0][None, None]  # [1, 1, rows, columns]
        heat = F.interpolate(glimpse, size=pixels.shape[:2], mode="bicubic", align_corners=False)[0, 0]
        heat = heat.clamp(min=0) / max(float(heat.max()), 1e-9)
        ax.imshow(pixels)
        ax.imshow(np.asarray(heat), cmap="magma", alpha=0.6, vmin=0, vmax=1)
        ax.set_title(f"{question}\n-> {a.answer} ({a.probability:.2f})", fontsize=9)
    fig.subplots_adjust(top=0.8, bottom=0.02, left=0.01, right=0.99, wspace=0.05)
    fig.savefig(args.out, dpi=100)
    print(args.out, [(q, a.answer) for q, a in zip(args.questions, answers)], file=sys.stderr)
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
