"""Model families, each following the contract of :mod:`attnkit.models.contract`. ``build_model`` turns a
family's config and vocabulary sizes into a module."""

from __future__ import annotations

from attnkit import registry
from attnkit.config import ModelConfig
from attnkit.models.bert import BertEncoder, load_bert
from attnkit.models.captioner import ShowAttendTell, TransformerCaptioner
from attnkit.models.classifier import SequenceClassifier, build_classifier, load_pretrained_classifier
from attnkit.models.contract import AttentionMaps, DecodingState, GenerativeModel, ModelOutput, beam_rows
from attnkit.models.conv import ConvEncoder, ConvTransformer, GatedConv
from attnkit.models.gpt_classifier import GPTClassifier
from attnkit.models.lm import TransformerLM
from attnkit.models.rnn import RNNEncDec, RNNSearch
from attnkit.models.transformer import EncoderDecoder, Transformer
from attnkit.tokens import BOS, EOS, PAD, UNK


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> GenerativeModel:
    """The generative model of ``cfg.family`` (:mod:`attnkit.registry`). ``src_vocab_size``: the source
    vocabulary; for captioners the number of grid cells; a language model has no source (it ignores it)."""
    return registry.resolve(registry.family(cfg.family).build)(cfg, src_vocab_size, tgt_vocab_size)


__all__ = ["BOS", "EOS", "PAD", "UNK", "AttentionMaps", "BertEncoder", "ConvEncoder", "ConvTransformer",
           "DecodingState", "EncoderDecoder", "GatedConv", "GenerativeModel", "GPTClassifier", "ModelOutput",
           "RNNEncDec", "RNNSearch", "SequenceClassifier", "ShowAttendTell", "Transformer", "TransformerCaptioner",
           "TransformerLM", "beam_rows", "build_classifier", "build_model", "load_bert", "load_pretrained_classifier"]
