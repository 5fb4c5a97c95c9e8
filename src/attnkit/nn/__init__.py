"""The lectures' vocabulary: attention, positions, Transformer blocks."""

from attnkit.nn.attention import (
    AdditiveScore, GeneralScore, KVCache, MultiHeadAttention, attend, causal_mask, dot_score, make_score,
    masked_softmax, scaled_dot_score,
)
from attnkit.nn.blocks import DecoderLayer, EncoderLayer, FeedForward
from attnkit.nn.positional import (
    LearnedPositionalEmbedding, SinusoidalPositionalEncoding, TokenEmbedding, make_positional, sinusoidal_table,
)

__all__ = [
    "AdditiveScore", "GeneralScore", "KVCache", "MultiHeadAttention", "attend", "causal_mask", "dot_score",
    "make_score", "masked_softmax", "scaled_dot_score", "DecoderLayer", "EncoderLayer", "FeedForward",
    "LearnedPositionalEmbedding", "SinusoidalPositionalEncoding", "TokenEmbedding", "make_positional",
    "sinusoidal_table",
]
