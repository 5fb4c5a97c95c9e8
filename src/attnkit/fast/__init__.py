"""The fast runtime: every speed trick in one room, opt-in by name, each tested equal to the core (:mod:`attnkit.nn`).

* :func:`use` installs tricks on a model by name (:mod:`attnkit.fast.runtime`): 16-bit dropout, the fused output
  projection + loss, fused and single-query attention kernels.
* :class:`FastDecoder` decodes any model of the contract with beam-grouped cross-attention, cache reordering left
  to the next step and chunked ranking (:mod:`attnkit.fast.decoding`).
* :func:`compile_step` compiles a decoder with ``torch.compile``, and its search steps ahead of time with
  AOTInductor (:mod:`attnkit.fast.compile`, :mod:`attnkit.fast.aot`); :func:`compiles_by_default` says which
  models the command line and :func:`attnkit.load` compile unless told not to.
* :func:`keep_freed_memory` keeps freed memory for reuse (:mod:`attnkit.fast.memory`).
* :func:`classifier` copies a classifier with the fused attention kernel, at fp32, bf16 or int8.
* bf16 and int8 decoding and classifying, where the CPU has the instructions for them
  (:mod:`attnkit.fast.precision`).

The kernels and module tricks (attention, dropout, loss, ranking, memory, runtime) sit beside the core and import
only it; the decoders (decoding, compile, aot) sit beside :mod:`attnkit.decode` and import the models and the
search, never training. Importing this package does not import the compilers; :func:`compile_step` does when called.
"""

from __future__ import annotations

import os

from attnkit.fast.decoding import FastDecoder
from attnkit.fast.memory import keep_freed_memory
from attnkit.fast.runtime import TRAINING, TRICKS, reference, use


def compile_step(model, **options):
    """:func:`attnkit.fast.compile.compile_step` (imported when first called)."""
    from attnkit.fast.compile import compile_step as compile

    return compile(model, **options)


def decoder(model, compile: bool = False, precision: str = "fp32", **options):
    """The fastest decoder of ``model`` this runtime offers: its decoding kernels installed, then a
    :class:`FastDecoder`, or with ``compile`` a compiled one (``options``: :func:`compile_step`'s). ``precision``
    "bf16" or "int8" decodes a copy of the model at that precision (:mod:`attnkit.fast.precision`), where this
    machine has the instructions for it; compiled, each search step is then checked against the eager step at the
    same precision."""
    if precision != "fp32":
        from attnkit.fast.precision import at_precision

        model = at_precision(model, precision)
    if compile:
        return compile_step(model, **options)
    # in eval, Dropout16 returns its input at once, where nn.Dropout goes through F.dropout's checks: a decoding step
    # runs some twenty of them
    use(model, "dropout16", "fused_attention", "decoding_attention")
    return FastDecoder(model)


def compiles_by_default(model) -> bool:
    """Whether ``model`` decodes compiled unless told otherwise (``--no-compile``, ``attnkit.load(...,
    compile=False)``): a translation model whose search steps compile ahead of time (the grouped decoder state of the
    Transformer families). Those packages are kept, so only a model's first run on a machine compiles, and each
    compiled step is checked against the eager one on the first batches and dropped where slower or different
    (docs/performance.md has the measurements). ``ATTNKIT_COMPILE=0`` makes eager decoding every model's default."""
    from attnkit.errors import AttnkitError

    switch = os.environ.get("ATTNKIT_COMPILE", "1")
    if switch not in ("0", "1"):
        raise AttnkitError(f"ATTNKIT_COMPILE={switch!r}: expected 0 (decode eagerly unless --compile) or 1")
    return switch == "1" and "translate" in model.capabilities and FastDecoder(model).grouped


def classifier(model, precision: str = "fp32"):
    """The fastest copy of a classifier this runtime offers, for classifying: the fused attention kernel and
    16-bit dropout's eval shortcut installed, at ``precision`` ("bf16" or "int8" where this machine has the
    instructions for it, :mod:`attnkit.fast.precision`). ``model`` itself is left as it is: its attention maps, for
    explanations, stay the core's."""
    import copy

    from attnkit.fast.precision import at_precision

    fast = at_precision(model, precision)
    if fast is model:
        fast = copy.deepcopy(model)
    return use(fast, "dropout16", "fused_attention").eval()


__all__ = ["TRAINING", "TRICKS", "FastDecoder", "classifier", "compile_step", "compiles_by_default", "decoder",
           "keep_freed_memory", "reference", "use"]
