"""The lectures' vocabulary: attention, positions, Transformer blocks, the image encoder."""

from attnkit.nn.adaptive import AdaptiveInput
from attnkit.nn.attention import (
    AdditiveScore,
    DotScore,
    GeneralScore,
    KVCache,
    MultiHeadAttention,
    Score,
    attend,
    causal_mask,
    dot_score,
    make_score,
    masked_softmax,
    scaled_dot_score,
)
from attnkit.nn.blocks import DecoderLayer, EncoderLayer, FeedForward
from attnkit.nn.dropout import Dropout, dropout
from attnkit.nn.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    make_positional,
    sinusoidal_table,
)
from attnkit.nn.vision import (
    IMAGE_SIZE,
    EfficientNetLite0,
    grid_shape,
    imagenet_class_names,
    load_pretrained,
    normalize,
    pretrained_weights_path,
)

__all__ = [
    "AdaptiveInput",
    "IMAGE_SIZE",
    "AdditiveScore", "DotScore", "Score",
    "DecoderLayer",
    "Dropout",
    "EfficientNetLite0",
    "EncoderLayer",
    "FeedForward",
    "GeneralScore",
    "KVCache",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "SinusoidalPositionalEncoding",
    "TokenEmbedding",
    "attend",
    "causal_mask",
    "dot_score",
    "dropout",
    "grid_shape",
    "imagenet_class_names",
    "load_pretrained",
    "make_positional",
    "make_score",
    "masked_softmax",
    "normalize",
    "pretrained_weights_path",
    "scaled_dot_score",
    "sinusoidal_table",
]
