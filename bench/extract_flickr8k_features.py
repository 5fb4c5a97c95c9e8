"""Extract and cache the EfficientNet-Lite0 grids of all 8,091 Flickr8k images, and print the time it took.

    python bench/extract_flickr8k_features.py --cache-dir runs/features [--grid head] [--image-size 224] [--threads 2]
    python bench/extract_flickr8k_features.py --config configs/flickr8k_sat.toml   # its grid and image size

Grids already in the cache (same weights, grid, image size and preprocessing) are not recomputed, so a second run
only checks the cache; an interrupted run resumes from its finished shards.
"""

from __future__ import annotations

# MKL's kernels chosen by the CPU's instructions, asked for before torch loads (attnkit.mkl), as the attnkit command
# line asks for them
if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import sys
import time
from pathlib import Path

import torch

from attnkit.config import load_config
from attnkit.data import extract_features, flickr8k_images
from attnkit.errors import AttnkitError
from attnkit.nn import load_pretrained
from attnkit.nn.vision import GRIDS, IMAGE_SIZE


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--cache-dir", default="runs/features")
    ap.add_argument("--config", help="a captioning config: take data.image_grid and data.image_size from it")
    ap.add_argument("--grid", default="head", choices=GRIDS)
    ap.add_argument("--image-size", type=int, default=IMAGE_SIZE)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        grid, image_size = args.grid, args.image_size
        if args.config:
            data = load_config(args.config).data
            grid, image_size = data.image_grid, data.image_size
        paths = flickr8k_images(args.data_dir)
        encoder = load_pretrained(grid)
        start = time.monotonic()
        cache = extract_features(encoder, paths, args.cache_dir, batch_size=args.batch_size, image_size=image_size)
        seconds = time.monotonic() - start
    except AttnkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = sum(p.stat().st_size for p in Path(cache.directory).glob("*.safetensors"))
    print(f"{len(cache)} grids {list(cache.shape)} float16 in {cache.directory} ({size / 2**20:.0f} MiB)")
    print(f"{seconds:.1f} s for {len(paths)} images ({len(paths) / seconds:.1f} images/s, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
