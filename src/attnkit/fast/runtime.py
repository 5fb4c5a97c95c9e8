"""The fast runtime's registry: every speed trick that changes how a model computes, selected by name.

``use(model, *names)`` installs the named tricks on a model (in place; its weights, results and checkpoints stay
the same, which the tests check trick by trick against the core):

* ``"dropout16"``: every ``nn.Dropout`` becomes :class:`~attnkit.fast.dropout.Dropout16` (16-bit uniforms, one
  64-bit draw for four elements; same expectation, other masks than PyTorch's).
* ``"fused_loss"``: the output projection and label-smoothed loss as one autograd function that makes logits only
  where the target is real and writes the gradient into the softmax (:mod:`attnkit.fast.loss`).
* ``"fused_attention"``: in every multi-head attention that is not asked for its weights, two batched matrix
  products over short keys and PyTorch's ``scaled_dot_product_attention`` over long ones
  (:func:`attnkit.fast.attention.teacher_forced_attention`).
* ``"decoding_attention"``: two batched matrix products for a decoding step's single query per row.
* ``"onednn_linear"``: every ``nn.Linear`` a :class:`~attnkit.fast.linear.OneDNNLinear` (fp32 products by oneDNN,
  forward and backward), where those measure faster than PyTorch's on this machine for the model's own weight
  shapes (:func:`~attnkit.fast.linear.onednn_pays`); else nothing changes.

Decoding tricks that need a decoder of their own (grouped beams, chunked ranking, compiled steps) are in
:mod:`attnkit.fast.decoding` and :mod:`attnkit.fast.compile`.
"""

from __future__ import annotations

from torch import nn

from attnkit.fast.attention import make_kernel
from attnkit.fast.dropout import Dropout16
from attnkit.fast.linear import OneDNNLinear, onednn_pays, relinked
from attnkit.fast.loss import projected_smoothed_cross_entropy
from attnkit.nn.attention import MultiHeadAttention, reference_attention

TRAINING = ("dropout16", "fused_loss", "fused_attention", "decoding_attention", "onednn_linear")
"""What ``attnkit train`` and the recipes run (decoding attention serves their validation BLEU)."""


def _dropout16(model: nn.Module) -> None:
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, name, Dropout16(child.p).train(child.training))


def _fused_loss(model: nn.Module) -> None:
    for module in model.modules():
        if hasattr(type(module), "projected_loss"):  # the loss slot a model declares
            module.projected_loss = projected_smoothed_cross_entropy


def _attention(fused: bool | None = None, decoding: bool | None = None):
    def install(model: nn.Module) -> None:
        for module in model.modules():
            if isinstance(module, MultiHeadAttention):
                current = module.kernel
                was_fused = getattr(current, "fused", False)
                was_decoding = getattr(current, "decoding", False)
                module.kernel = make_kernel(fused=was_fused if fused is None else fused,
                                            decoding=was_decoding if decoding is None else decoding)

    return install


def _linear_layers(model: nn.Module):
    """(parent, name, layer) for every ``nn.Linear`` child of ``model``."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if isinstance(child, nn.Linear)]


def _onednn_linear(model: nn.Module) -> None:
    layers = [(p, n, c) for p, n, c in _linear_layers(model) if type(c) is nn.Linear]
    shapes = {tuple(c.weight.shape): c.weight for _, _, c in layers}  # timed once a shape
    if layers and onednn_pays(list(shapes.values())):
        for parent, name, child in layers:
            setattr(parent, name, relinked(OneDNNLinear, child))


TRICKS = {
    "dropout16": _dropout16,
    "fused_loss": _fused_loss,
    "fused_attention": _attention(fused=True),
    "decoding_attention": _attention(decoding=True),
    "onednn_linear": _onednn_linear,
}


def use(model: nn.Module, *names: str) -> nn.Module:
    """Install the tricks ``names`` on ``model``, in place; returns it."""
    for name in names:
        if name not in TRICKS:
            raise ValueError(f"unknown fast-runtime trick {name!r} (one of {', '.join(TRICKS)})")
        TRICKS[name](model)
    return model


def reference(model: nn.Module) -> nn.Module:
    """Undo every trick of :func:`use`: the core's dropout, loss, attention and linear layers again (in place;
    returns it)."""
    for parent, name, child in _linear_layers(model):
        if isinstance(child, OneDNNLinear):
            setattr(parent, name, relinked(nn.Linear, child))
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if isinstance(child, Dropout16):
                setattr(parent, name, nn.Dropout(child.p).train(child.training))
        if isinstance(parent, MultiHeadAttention):
            parent.kernel = reference_attention
        if "projected_loss" in parent.__dict__:
            del parent.projected_loss
    return model
