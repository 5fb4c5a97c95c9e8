"""attnkit: attention-based sequence models, faithful to the papers and fast on a CPU.

``attnkit.load(path)`` returns a trained model ready to translate, generate, caption, score and show its
attention (:mod:`attnkit.api`); ``attnkit.register_family`` adds a model family from outside the package
(:mod:`attnkit.registry`, docs/extending.md). Importing attnkit imports nothing heavy (not even torch) and changes
nothing in the process: the command line and :func:`load` ask for what they want (MKL's kernels by the CPU's
instructions, :mod:`attnkit.mkl`).
"""

import os

from attnkit import mkl as _mkl
from attnkit.registry import DataFormat, Family, load_plugins, register_family, register_format, register_kind

__version__ = "0.2.0"


def load(path, precision: str = "fp32", compile: bool | None = None, shortlist=False):
    """A trained model from a run or checkpoint directory, decoding at ``precision``, compiled or not (by default
    where :func:`attnkit.fast.compiles_by_default`), translating with a vocabulary shortlist or not:
    :func:`attnkit.api.load`. Called before torch is imported, it first has MKL choose its kernels by the CPU's
    instructions (:func:`attnkit.mkl.use_feature_kernels`)."""
    _mkl.choice(os.environ)  # a misspelt ATTNKIT_MKL is refused here, as on the command line
    _mkl.use_feature_kernels()
    from attnkit.api import load as load_model

    load_plugins()  # a family of a plug-in that ATTNKIT_PLUGINS names
    return load_model(path, precision, compile, shortlist)


__all__ = ["DataFormat", "Family", "__version__", "load", "load_plugins", "register_family", "register_format",
           "register_kind"]
