"""Flickr8k (Hodosh et al. 2013) for captioning, and a disk cache of the image encoder's grids.

The data directory holds (see shared/data/README.md)::

    flickr8k/images_224/*.jpg                 all 8,091 images, RGB, already 224x224
    flickr8k/Flickr8k.token.txt               image.jpg#k<TAB>caption, five per image (k = 0..4)
    flickr8k/Flickr_8k.{train,dev}Images.txt  the official splits, one image file name a line

The captions of the official test split are not included, so only train and dev can be read with captions.

The encoder is frozen, so ``extract_features`` runs it once per image and keeps the grids on disk;
training a captioner then reads grids, not JPEGs. See ``extract_features`` for the cache format.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor
from tqdm import tqdm

from attnkit.data.corpus import read_lines, resolve_data_dir
from attnkit.errors import AttnkitError
from attnkit.nn.vision import IMAGE_SIZE, PIXEL_MEAN, PIXEL_STD, normalize

FLICKR8K = "flickr8k"
IMAGE_DIR = "images_224"
TOKEN_FILE = "Flickr8k.token.txt"
SPLIT_FILES = {"train": "Flickr_8k.trainImages.txt", "dev": "Flickr_8k.devImages.txt"}

_TOKEN_KEY = re.compile(r"^(?P<image>[^#\t]+\.jpg)#(?P<k>\d+)$")


@dataclass
class Captions:
    images: list[Path]  # one path per image
    captions: list[list[str]]  # the captions of images[i], in file order (#0, #1, ...)
    origin: str = ""


def flickr8k_dir(data_dir: str | Path | None = None) -> Path:
    root = resolve_data_dir(str(data_dir) if data_dir else None) / FLICKR8K
    if not root.is_dir():
        raise AttnkitError(f"{root}: Flickr8k directory not found")
    return root


def read_flickr8k_tokens(path: str | Path) -> dict[str, list[str]]:
    """``Flickr8k.token.txt`` as image file name -> its captions; a malformed line is reported as file:line."""
    captions: dict[str, list[str]] = {}
    for i, line in enumerate(read_lines(path), 1):
        key, tab, caption = line.partition("\t")
        match = _TOKEN_KEY.match(key)
        if not tab or not match:
            raise AttnkitError(f"{path}:{i}: expected 'image.jpg#k<TAB>caption', found {line[:60]!r}")
        if not caption.strip():
            raise AttnkitError(f"{path}:{i}: empty caption")
        captions.setdefault(match["image"], []).append(caption.strip())
    return captions


def read_image_list(path: str | Path) -> list[str]:
    """A split file: one image file name a line (blank lines ignored)."""
    names = []
    for i, line in enumerate(read_lines(path), 1):
        name = line.strip()
        if name and not name.endswith(".jpg"):
            raise AttnkitError(f"{path}:{i}: expected an image file name ending in .jpg, found {name[:60]!r}")
        if name:
            names.append(name)
    return names


def read_flickr8k(data_dir: str | Path | None = None, split: str = "train") -> Captions:
    """The images of an official split ("train" 6000, "dev" 1000) with their captions; every image must exist."""
    if split not in SPLIT_FILES:
        raise AttnkitError(f"unknown Flickr8k split {split!r}: choose one of {', '.join(SPLIT_FILES)}")
    root = flickr8k_dir(data_dir)
    tokens = read_flickr8k_tokens(root / TOKEN_FILE)
    split_path = root / SPLIT_FILES[split]
    images, captions = [], []
    for i, name in enumerate(read_image_list(split_path), 1):
        if name not in tokens:
            raise AttnkitError(f"{split_path}:{i}: {name} has no captions in {root / TOKEN_FILE}")
        image = root / IMAGE_DIR / name
        if not image.is_file():
            raise AttnkitError(f"{image}: image not found (listed in {split_path}:{i})")
        images.append(image)
        captions.append(tokens[name])
    return Captions(images, captions, str(split_path))


def flickr8k_images(data_dir: str | Path | None = None) -> list[Path]:
    """Every image file of Flickr8k (8,091, including the test split's), sorted by name."""
    image_dir = flickr8k_dir(data_dir) / IMAGE_DIR
    paths = sorted(image_dir.glob("*.jpg"))
    if not paths:
        raise AttnkitError(f"{image_dir}: no .jpg images found")
    return paths


def load_image(path: str | Path, size: int = IMAGE_SIZE) -> Tensor:
    """An image file -> RGB pixels uint8 [3, size, size]; resized (bicubic, aspect not kept) only if needed.

    Flickr8k's images_224 are already 224x224, so they reach the encoder untouched.
    """
    path = Path(path)
    if not path.is_file():
        raise AttnkitError(f"{path}: image not found")
    try:
        with Image.open(path) as image:
            image = image.convert("RGB")  # also forces decoding, so a truncated file fails here
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise AttnkitError(f"{path}: cannot read image ({e})") from None
    if image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BICUBIC)
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


# --- the feature cache

CACHE_VERSION = 1
# float16: half of fp32 on disk (a head grid is 125 KB, all Flickr8k ~1 GB). The head's grids are ReLU6 outputs in
# [0, 6] (float16 error <= 0.002); a stage's linear-bottleneck output reaches about +-40 (error <= 0.02): float16
# keeps about 3 significant digits, finer than anything a captioner learns from.
CACHE_DTYPE = torch.float16


def preprocessing(image_size: int = IMAGE_SIZE) -> str:
    """What happens to an image file before the encoder sees it, in words (part of the cache's fingerprint)."""
    return (f"load_image(size={image_size}, RGB, bicubic resize only if needed) -> "
            f"(pixel - {PIXEL_MEAN}) / {PIXEL_STD}")


def encoder_fingerprint(encoder: torch.nn.Module, image_size: int = IMAGE_SIZE) -> str:
    """sha256 of everything a cached grid depends on: the encoder's class, weights and buffers, its grid choice,
    the preprocessing (the image size with it) and the stored dtype. The classifier is left out: no grid passes
    through it."""
    h = hashlib.sha256()
    h.update(f"v{CACHE_VERSION}|{type(encoder).__name__}|grid={getattr(encoder, 'grid', '')}|"
             f"{preprocessing(image_size)}|{CACHE_DTYPE}".encode())
    for name, tensor in sorted(encoder.state_dict().items()):
        if name.startswith("classifier."):
            continue
        t = tensor.detach().cpu().contiguous()
        h.update(f"|{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class FeatureCache:
    """One cache directory: image file name -> grid [C, h, w] (stored as CACHE_DTYPE), read from its shards."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        meta_path = self.directory / "meta.json"
        try:
            self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise AttnkitError(f"{meta_path}: cannot read feature cache metadata ({e})") from None
        self.fingerprint = self.meta["fingerprint"]
        self._shard_of: dict[str, Path] = {}
        for shard in sorted(self.directory.glob("shard-*.safetensors")):
            try:
                with safe_open(str(shard), framework="pt") as f:
                    if (f.metadata() or {}).get("fingerprint") != self.fingerprint:
                        raise AttnkitError(f"{shard}: belongs to another encoder than {meta_path} says")
                    self._shard_of.update(dict.fromkeys(f.keys(), shard))
            except SafetensorError as e:
                raise AttnkitError(f"{shard}: unreadable feature shard ({e}); delete it to recompute") from None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.meta["shape"])

    def __len__(self) -> int:
        return len(self._shard_of)

    def __contains__(self, name: str) -> bool:
        return name in self._shard_of

    def names(self) -> list[str]:
        return sorted(self._shard_of)

    def __getitem__(self, name: str) -> Tensor:
        return self.load([name])[0]

    def load(self, names: list[str]) -> Tensor:
        """The grids of these image file names, stacked [N, C, h, w]; each shard is opened once."""
        missing = [n for n in names if n not in self._shard_of]
        if missing:
            raise AttnkitError(f"{self.directory}: no cached grid for {missing[0]} ({len(missing)} missing)")
        out = torch.empty((len(names), *self.shape), dtype=CACHE_DTYPE)
        by_shard: dict[Path, list[int]] = {}
        for i, name in enumerate(names):
            by_shard.setdefault(self._shard_of[name], []).append(i)
        for shard, rows in by_shard.items():
            with safe_open(str(shard), framework="pt") as f:
                for i in rows:
                    out[i] = f.get_tensor(names[i])
        return out


def extract_features(encoder, image_paths, cache_dir: str | Path, batch_size: int = 32, progress: bool = True,
                     shard_size: int = 512, image_size: int = IMAGE_SIZE) -> FeatureCache:
    """Run ``encoder.forward_features`` once per image not yet cached, each resized to ``image_size``; return the
    cache holding every image.

    Layout: ``cache_dir/<encoder>-<grid>-<fingerprint[:16]>/`` with ``meta.json`` (full fingerprint, grid shape,
    dtype, preprocessing) and ``shard-*.safetensors`` files, each mapping up to ``shard_size`` image file names to
    their grids [C, h, w] in float16. A changed encoder (weights, grid, preprocessing, image size) has another
    fingerprint, so it gets a new directory and old grids are never mixed in. Each shard is written to a temporary
    name and renamed into place, so an interrupted run keeps its finished shards and resumes from them.
    """
    paths = [Path(p) for p in image_paths]
    if not paths:
        raise AttnkitError("extract_features: no images given")
    by_name: dict[str, Path] = {}
    for p in paths:
        if by_name.setdefault(p.name, p) != p:
            raise AttnkitError(f"{p} and {by_name[p.name]}: two images named {p.name}; the cache is keyed by name")
    fingerprint = encoder_fingerprint(encoder, image_size)
    grid = getattr(encoder, "grid", "features")
    directory = Path(cache_dir) / f"{type(encoder).__name__.lower()}-{grid}-{fingerprint[:16]}"
    directory.mkdir(parents=True, exist_ok=True)
    has_meta = (directory / "meta.json").exists()
    cached = FeatureCache(directory) if has_meta else {}
    todo = [p for name, p in by_name.items() if name not in cached]
    if not todo:
        return cached
    for p in todo:  # fail now, not after an hour of extraction
        if not p.is_file():
            raise AttnkitError(f"{p}: image not found")

    # the fingerprint above is of the encoder as given; a fused copy computes the same function faster
    fast = encoder.for_inference() if hasattr(encoder, "for_inference") else encoder
    channels_last = fast is not encoder
    was_training = encoder.training
    encoder.eval()  # BatchNorm must use its running statistics
    device = next(encoder.parameters()).device
    pending: dict[str, Tensor] = {}
    try:
        with torch.inference_mode(), tqdm(total=len(todo), unit="img", disable=not progress, file=sys.stderr,
                                          desc="image grids") as bar:
            for start in range(0, len(todo), batch_size):
                chunk = todo[start:start + batch_size]
                pixels = normalize(torch.stack([load_image(p, image_size) for p in chunk]).to(device))
                if channels_last:
                    pixels = pixels.contiguous(memory_format=torch.channels_last)
                grids = fast.forward_features(pixels).contiguous().to("cpu", CACHE_DTYPE)
                if not has_meta:  # a new directory: its metadata first, from the first grids' shape
                    meta = {"fingerprint": fingerprint, "encoder": type(encoder).__name__, "grid": grid,
                            "shape": list(grids.shape[1:]), "dtype": str(CACHE_DTYPE).removeprefix("torch."),
                            "preprocessing": preprocessing(image_size), "version": CACHE_VERSION}
                    _atomic_write_bytes(directory / "meta.json", (json.dumps(meta, indent=1) + "\n").encode())
                    has_meta = True
                # clone: safetensors refuses tensors that share one storage
                pending.update((p.name, g.clone()) for p, g in zip(chunk, grids))
                bar.update(len(chunk))
                if len(pending) >= shard_size:
                    _write_shard(directory, pending, fingerprint)
                    pending = {}
            if pending:
                _write_shard(directory, pending, fingerprint)
    finally:
        encoder.train(was_training)
    return FeatureCache(directory)


def _write_shard(directory: Path, grids: dict[str, Tensor], fingerprint: str) -> None:
    # named by its contents, so two runs writing the same images write the same file
    digest = hashlib.sha1("\n".join(sorted(grids)).encode()).hexdigest()[:16]
    path = directory / f"shard-{digest}.safetensors"
    tmp = directory / f".{path.name}.{os.getpid()}.tmp"
    save_file(grids, str(tmp), metadata={"fingerprint": fingerprint})
    tmp.chmod(0o644)  # safetensors creates it private; a cache is for anyone who may read the directory
    os.replace(tmp, path)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
