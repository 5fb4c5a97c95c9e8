"""attnkit: attention-based sequence models, faithful to the papers and fast on a CPU.

``attnkit.load(path)`` returns a trained model ready to translate, generate, caption, score and show its
attention (:mod:`attnkit.api`). Importing attnkit itself imports nothing heavy (not even torch).
"""

__version__ = "0.2.0"


def load(path, precision: str = "fp32", compile: bool | None = None):
    """A trained model from a run or checkpoint directory, decoding at ``precision``, compiled or not (by default
    where :func:`attnkit.fast.compiles_by_default`): :func:`attnkit.api.load`."""
    from attnkit.api import load as load_model

    return load_model(path, precision, compile)


__all__ = ["__version__", "load"]
