"""Model families, each following the contract of :mod:`attnkit.models.contract`. ``build_model`` turns a
family's config and vocabulary sizes into a module."""

from __future__ import annotations

from attnkit import registry
from attnkit.config import LMConfig, ModelConfig, ShowAttendTellConfig, TransformerCaptionerConfig
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

# the families that generate, each following the model contract (the registry lists every family)
FAMILIES = {m.family: m for m in (Transformer, ConvTransformer, RNNEncDec, RNNSearch, ShowAttendTell,
                                  TransformerCaptioner, TransformerLM)}


def build_language_model(cfg: LMConfig, _: int, vocab_size: int) -> TransformerLM:
    """A language model reads no source: its source size is ignored."""
    return TransformerLM(cfg, vocab_size)


def build_show_attend_tell(cfg: ShowAttendTellConfig, _: int, vocab_size: int) -> ShowAttendTell:
    """Show, Attend and Tell attends over any number of grid cells: the count is not part of the model."""
    return ShowAttendTell(cfg, vocab_size)


def build_transformer_captioner(cfg: TransformerCaptionerConfig, n_cells: int, vocab_size: int) -> TransformerCaptioner:
    """Each of the ``n_cells`` grid cells has a learned position."""
    return TransformerCaptioner(cfg, vocab_size, n_cells=n_cells)


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> GenerativeModel:
    """The generative model of ``cfg.family`` (:mod:`attnkit.registry`). ``src_vocab_size``: the source
    vocabulary; for captioners the number of grid cells; a language model has no source (it ignores it)."""
    return registry.resolve(registry.family(cfg.family).build)(cfg, src_vocab_size, tgt_vocab_size)


__all__ = ["BOS", "EOS", "FAMILIES", "PAD", "UNK", "AttentionMaps", "BertEncoder", "ConvEncoder", "ConvTransformer",
           "DecodingState", "EncoderDecoder", "GatedConv", "GenerativeModel", "GPTClassifier", "ModelOutput",
           "RNNEncDec", "RNNSearch", "SequenceClassifier", "ShowAttendTell", "Transformer", "TransformerCaptioner",
           "TransformerLM", "beam_rows", "build_classifier", "build_model", "load_bert", "load_pretrained_classifier"]
