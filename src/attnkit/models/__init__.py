"""Model families, each following the contract of :mod:`attnkit.models.contract`. ``build_model`` turns a
family's config and vocabulary sizes into a module."""

from __future__ import annotations

from attnkit.config import ModelConfig
from attnkit.models.bert import BertEncoder, load_bert
from attnkit.models.captioner import ShowAttendTell, TransformerCaptioner
from attnkit.models.classifier import SequenceClassifier, load_pretrained_classifier
from attnkit.models.contract import AttentionMaps, DecodingState, GenerativeModel, ModelOutput, beam_rows
from attnkit.models.conv import ConvEncoder, ConvTransformer, GatedConv
from attnkit.models.lm import TransformerLM
from attnkit.models.rnn import RNNEncDec, RNNSearch
from attnkit.models.transformer import EncoderDecoder, Transformer
from attnkit.tokens import BOS, EOS, PAD, UNK

FAMILIES = {m.family: m for m in (Transformer, ConvTransformer, RNNEncDec, RNNSearch, ShowAttendTell,
                                  TransformerCaptioner, TransformerLM)}


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> GenerativeModel:
    """``src_vocab_size``: the source vocabulary; for captioners the number of grid cells; a language model has
    no source (it ignores it)."""
    family = FAMILIES[cfg.family]
    if family is TransformerLM or family is ShowAttendTell:
        return family(cfg, tgt_vocab_size)
    if family is TransformerCaptioner:
        return family(cfg, tgt_vocab_size, n_cells=src_vocab_size)
    return family(cfg, src_vocab_size, tgt_vocab_size)


__all__ = ["BOS", "EOS", "FAMILIES", "PAD", "UNK", "AttentionMaps", "BertEncoder", "ConvEncoder", "ConvTransformer",
           "DecodingState", "EncoderDecoder", "GatedConv", "GenerativeModel", "ModelOutput", "RNNEncDec", "RNNSearch",
           "SequenceClassifier", "ShowAttendTell", "Transformer", "TransformerCaptioner",
           "TransformerLM", "beam_rows", "build_model", "load_bert", "load_pretrained_classifier"]
