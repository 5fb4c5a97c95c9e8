"""attnkit: attention-based sequence models, faithful to the papers and fast on a CPU."""

__version__ = "0.1.0"
