"""Model families. ``build_model`` turns a ModelConfig and vocabulary sizes into a module."""

from __future__ import annotations

from attnkit.config import ModelConfig
from attnkit.models.bert import BertEncoder, load_bert
from attnkit.models.captioner import ShowAttendTell, TransformerCaptioner
from attnkit.models.conv import ConvEncoder, ConvTransformer, GatedConv
from attnkit.models.lm import TransformerLM
from attnkit.models.rnn import RNNEncDec, RNNSearch
from attnkit.models.transformer import BOS, EOS, PAD, UNK, Transformer


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
    """Captioners take no source vocabulary: ``src_vocab_size`` is then the number of grid cells;
    a language model has none either (it ignores ``src_vocab_size``)."""
    if cfg.family == "transformer":
        return Transformer(cfg, src_vocab_size, tgt_vocab_size)
    if cfg.family == "show_attend_tell":
        return ShowAttendTell(cfg, tgt_vocab_size)
    if cfg.family == "transformer_captioner":
        return TransformerCaptioner(cfg, tgt_vocab_size, n_cells=src_vocab_size)
    if cfg.family == "transformer_lm":
        return TransformerLM(cfg, tgt_vocab_size)
    if cfg.family == "rnn_encdec":
        return RNNEncDec(cfg, src_vocab_size, tgt_vocab_size)
    if cfg.family == "rnnsearch":
        return RNNSearch(cfg, src_vocab_size, tgt_vocab_size)
    if cfg.family == "conv_transformer":
        return ConvTransformer(cfg, src_vocab_size, tgt_vocab_size)
    raise ValueError(f"unknown model family {cfg.family!r}")


__all__ = ["BOS", "EOS", "PAD", "UNK", "BertEncoder", "ConvEncoder", "ConvTransformer", "GatedConv", "RNNEncDec",
           "RNNSearch", "ShowAttendTell", "Transformer", "TransformerCaptioner", "TransformerLM", "build_model",
           "load_bert"]
