"""The core: the lectures' vocabulary (attention, positions, Transformer blocks, the reference loss, the image
encoder), readable top to bottom. Speed tricks live in :mod:`attnkit.fast`."""

from attnkit.nn.adaptive import AdaptiveInput
from attnkit.nn.attention import (
    AdditiveScore,
    DotScore,
    GeneralScore,
    KVCache,
    MultiHeadAttention,
    Score,
    attend,
    attention_mask,
    causal_mask,
    dot_score,
    make_score,
    masked_softmax,
    reference_attention,
    scaled_dot_score,
)
from attnkit.nn.blocks import DecoderLayer, EncoderLayer, FeedForward
from attnkit.nn.loss import label_smoothed_nll, projected_label_smoothed_nll
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
    "attention_mask",
    "causal_mask",
    "dot_score",
    "grid_shape",
    "imagenet_class_names",
    "label_smoothed_nll",
    "load_pretrained",
    "make_positional",
    "make_score",
    "masked_softmax",
    "normalize",
    "pretrained_weights_path",
    "projected_label_smoothed_nll",
    "reference_attention",
    "scaled_dot_score",
    "sinusoidal_table",
]
