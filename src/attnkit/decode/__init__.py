"""Greedy, beam search and sampling over the common decoding interface."""

from attnkit.decode.caption import Caption, caption
from attnkit.decode.search import Hypothesis, beam_search, filter_logits, generate, greedy, max_lengths, sample
from attnkit.decode.translate import Translation, translate

__all__ = ["Caption", "caption", "Hypothesis", "beam_search", "filter_logits", "generate", "greedy", "max_lengths",
           "sample", "Translation", "translate"]
