"""Greedy, beam search and sampling over the model contract (:mod:`attnkit.models.contract`); translating,
captioning, completing; classifying with a fine-tuned classifier."""

from attnkit.decode.align import Alignment, align
from attnkit.decode.caption import Caption, caption
from attnkit.decode.classify import Classification, classify, classify_logits
from attnkit.decode.explain import Explanation, attention_rollout, explain
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

__all__ = ["Alignment", "Caption", "Classification", "Completion", "Explanation", "Hypothesis", "Translation", "align",
           "attention_rollout", "beam_search", "caption", "classify", "classify_logits", "complete", "explain",
           "filter_logits", "generate", "greedy", "max_lengths", "sample", "translate", "with_temperature"]
