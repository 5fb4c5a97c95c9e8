"""Greedy, beam search and sampling over the model contract (:mod:`attnkit.models.contract`); translating,
captioning, completing."""

from attnkit.decode.align import Alignment, align
from attnkit.decode.caption import Caption, caption
from attnkit.decode.lm import Completion, complete
from attnkit.decode.search import (
    Hypothesis,
    beam_search,
    filter_logits,
    generate,
    greedy,
    max_lengths,
    sample,
    with_temperature,
)
from attnkit.decode.translate import Translation, translate

__all__ = ["Alignment", "align", "Caption", "caption", "Completion", "complete", "Hypothesis", "beam_search",
           "filter_logits", "generate", "greedy", "max_lengths", "sample", "Translation", "translate",
           "with_temperature"]
