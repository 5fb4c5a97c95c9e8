"""Greedy, beam search and sampling over the common decoding interface."""

from attnkit.decode.search import Hypothesis, beam_search, filter_logits, greedy, max_lengths, sample
from attnkit.decode.translate import Translation, translate

__all__ = [
           "Hypothesis",
           "Translation",
           "beam_search",
           "filter_logits",
           "greedy",
           "max_lengths",
           "sample",
           "translate",
]
