"""The fast runtime: every speed trick in one room, opt-in by name, each tested equal to the core (:mod:`attnkit.nn`).

* :func:`use` installs tricks on a model by name (:mod:`attnkit.fast.runtime`): 16-bit dropout, the fused output
  projection + loss, fused and single-query attention kernels.
* :class:`FastDecoder` decodes any model of the contract with beam-grouped cross-attention, cache reordering left
  to the next step and chunked ranking (:mod:`attnkit.fast.decoding`).
* :func:`compile_step` compiles a decoder's search steps and encoder ahead of time with ``torch.export`` and
  AOTInductor (:mod:`attnkit.fast.compile`, :mod:`attnkit.fast.aot`); :func:`compiles_by_default` says which
  models, for which jobs, the command line, the server and :func:`attnkit.load` compile unless told.
* :func:`keep_freed_memory` keeps freed memory for reuse, and :func:`bound_kernel_caches` bounds the compiled
  kernels a training process keeps (:mod:`attnkit.fast.memory`).
* :func:`classifier` copies a classifier with the fused attention kernel, at fp32, bf16 or int8.
* bf16 and int8 decoding and classifying, where the CPU has the instructions for them
  (:mod:`attnkit.fast.precision`).
* A vocabulary shortlist: decoding steps that score only a batch's candidate target tokens
  (:mod:`attnkit.fast.shortlist`, ``decoder.restrict_vocabulary``).

The kernels and module tricks (attention, dropout, loss, ranking, memory, runtime) sit beside the core and import
only it; the decoders (decoding, shortlist, compile, aot) sit beside :mod:`attnkit.decode` and import the models and the
search, never training. Importing this package does not import the compilers; :func:`compile_step` does when called.
"""

from __future__ import annotations

import os

from attnkit.fast.decoding import FastDecoder
from attnkit.fast.memory import bound_kernel_caches, keep_freed_memory
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


# A job of this many sentences repays a compiled start: with the packages in the cache a compiled start took 2.4 s
# more than an eager one, and compiled decoding saved 0.9 ms a sentence greedily and 1.6 ms at beam 5 (the Multi30k
# model, batches of 64, AVX-512 Xeon: docs/performance.md, the first-translation and decode-precision tables), so
# the break-even lies between 1,500 and 2,800 sentences; a cold cache (the first run) takes a minute more
COMPILE_PAYS_AT = 2000


def compiles_by_default(model, sentences: int | None = None) -> bool:
    """Whether ``model`` decodes compiled unless told otherwise (``--compile``, ``--no-compile``, ``attnkit.load(...,
    compile=...)``), for a job of ``sentences`` sentences (None: a server, which decodes for as long as it runs).

    Compiled are translation models whose search steps compile ahead of time (the grouped decoder state of the
    Transformer families), for a server or a job of at least :data:`COMPILE_PAYS_AT` sentences: compiled decoding is
    several times faster a sentence, but its start costs seconds more than eager decoding's even with the packages
    in the cache (about a minute when they must be compiled), which a few sentences never repay. Each compiled step
    is checked against the eager one on the first batches and dropped where slower or different.
    ``ATTNKIT_COMPILE=0`` makes eager decoding every model's default."""
    from attnkit.errors import AttnkitError

    switch = os.environ.get("ATTNKIT_COMPILE", "1")
    if switch not in ("0", "1"):
        raise AttnkitError(f"ATTNKIT_COMPILE={switch!r}: expected 0 (decode eagerly unless --compile) or 1")
    if switch == "0" or "translate" not in model.capabilities or not FastDecoder(model).grouped:
        return False
    return sentences is None or sentences >= COMPILE_PAYS_AT


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


__all__ = ["COMPILE_PAYS_AT", "TRAINING", "TRICKS", "FastDecoder", "bound_kernel_caches", "classifier", "compile_step",
           "compiles_by_default", "decoder", "keep_freed_memory", "reference", "use"]
