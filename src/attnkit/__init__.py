"""attnkit: attention-based sequence models, faithful to the papers and fast on a CPU.

``attnkit.load(path)`` returns a trained model ready to translate, generate, caption, score and show its
attention (:mod:`attnkit.api`). Importing attnkit itself imports nothing heavy (not even torch); on an AMD CPU with
AVX-512, when torch is not imported yet, it has MKL choose its kernels by the CPU's instructions (:mod:`attnkit.mkl`).
"""

import os

from attnkit import mkl as _mkl

__version__ = "0.2.0"

try:
    _mkl.use_feature_kernels()
except _mkl.MklChoiceError:  # refused in one line by the command line and by load(), not by an import
    pass


def load(path, precision: str = "fp32", compile: bool | None = None, shortlist=False):
    """A trained model from a run or checkpoint directory, decoding at ``precision``, compiled or not (by default
    where :func:`attnkit.fast.compiles_by_default`), translating with a vocabulary shortlist or not:
    :func:`attnkit.api.load`."""
    from attnkit.api import load as load_model

    _mkl.choice(os.environ)  # a misspelt ATTNKIT_MKL is refused here, as on the command line
    return load_model(path, precision, compile, shortlist)


__all__ = ["__version__", "load"]
