"""The fast runtime's tricks that change how a model computes, each installed by name (:data:`attnkit.registry.TRICKS`).

``use(model, *names)`` installs the named tricks on a model (in place; its weights, results and checkpoints stay
the same, which the tests check trick by trick against the core):

* ``"dropout16"``: every ``nn.Dropout`` becomes :class:`~attnkit.fast.dropout.Dropout16` (16-bit uniforms, four
  from one 64-bit hash of a counter, made by a C kernel; same expectation, other masks than PyTorch's).
* ``"fused_loss"``: the output projection and label-smoothed loss as one autograd function that makes logits only
  where the target is real and makes the gradient block by block in the forward pass (:mod:`attnkit.fast.loss`).
* ``"fused_attention"``: in every multi-head attention that is not asked for its weights, two batched matrix
  products over short keys and PyTorch's ``scaled_dot_product_attention`` over long ones
  (:func:`attnkit.fast.attention.teacher_forced_attention`).
* ``"decoding_attention"``: two batched matrix products for a decoding step's single query per row.
* ``"onednn_linear"``: every ``nn.Linear`` a :class:`~attnkit.fast.linear.OneDNNLinear` and cross-attention's
  projections :func:`~attnkit.fast.linear.onednn_linear` (fp32 products by oneDNN, forward and backward), where
  those measure faster than PyTorch's on this machine for the model's own weight shapes
  (:func:`~attnkit.fast.linear.onednn_pays`); else nothing changes.

Two of them decide by timing whether they pay on this machine: ``"onednn_linear"`` (recorded as "onednn_linear")
and ``"fused_loss"`` (which library multiplies its blocks: "onednn_loss"). ``use(..., choices=...)`` follows the
decisions given there and writes those it makes into it: the Trainer keeps them in the run's progress, so that a
resumed run computes as its first run did, bit for bit.

Decoding tricks that need a decoder of their own (grouped beams, chunked ranking, compiled steps) are in
:mod:`attnkit.fast.decoding` and :mod:`attnkit.fast.compile`.
"""

from __future__ import annotations

from torch import nn

from attnkit import registry
from attnkit.fast.attention import make_kernel
from attnkit.fast.dropout import Dropout16
from attnkit.fast.linear import OneDNNLinear, onednn_linear, onednn_pays, relinked
from attnkit.fast.loss import choose_products, projected_smoothed_cross_entropy
from attnkit.nn.attention import MultiHeadAttention, reference_attention

TRAINING = ("dropout16", "fused_loss", "fused_attention", "decoding_attention", "onednn_linear")
"""What ``attnkit train`` and the recipes run (decoding attention serves their validation BLEU)."""


def install_dropout16(model: nn.Module, choices: dict[str, bool]) -> None:
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, name, Dropout16(child.p).train(child.training))


def install_fused_loss(model: nn.Module, choices: dict[str, bool]) -> None:
    for module in model.modules():
        if hasattr(type(module), "projected_loss"):  # the loss slot a model declares
            module.projected_loss = projected_smoothed_cross_entropy
            output = getattr(module, "output", None)  # the projection the slot is called with
            if isinstance(output, nn.Linear):
                choices["onednn_loss"] = choose_products(*output.weight.shape, onednn=choices.get("onednn_loss"))


def _attention(fused: bool | None = None, decoding: bool | None = None):
    def install(model: nn.Module, choices: dict[str, bool]) -> None:
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


def install_onednn_linear(model: nn.Module, choices: dict[str, bool]) -> None:
    layers = [(p, n, c) for p, n, c in _linear_layers(model) if type(c) is nn.Linear]
    if not layers:
        return
    if "onednn_linear" not in choices:
        shapes = {tuple(c.weight.shape): c.weight for _, _, c in layers}  # timed once a shape
        choices["onednn_linear"] = onednn_pays(list(shapes.values()))
    if choices["onednn_linear"]:
        for parent, name, child in layers:
            setattr(parent, name, relinked(OneDNNLinear, child))
        for module in model.modules():
            if isinstance(module, MultiHeadAttention):
                module.linear = onednn_linear


install_fused_attention = _attention(fused=True)
install_decoding_attention = _attention(decoding=True)
TRICKS = registry.TRICKS  # the tricks by name, each naming its install_<name> function here


def use(model: nn.Module, *names: str, choices: dict[str, bool] | None = None) -> nn.Module:
    """Install the tricks ``names`` on ``model``, in place; returns it. ``choices``: decisions the timed tricks
    follow instead of timing, and into which they write the decisions they make."""
    choices = {} if choices is None else choices
    for name in names:
        if name not in TRICKS:
            raise ValueError(f"unknown fast-runtime trick {name!r} (one of {', '.join(TRICKS)})")
        registry.resolve(TRICKS[name])(model, choices)
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
            parent.__dict__.pop("linear", None)
        if "projected_loss" in parent.__dict__:
            del parent.projected_loss
    return model
