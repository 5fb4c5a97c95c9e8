"""Tokenizers, corpus readers with validation, and length-bucketed batching."""

from attnkit.data.batching import Batch, collate, pad, token_batches
from attnkit.data.corpus import (
    Parallel, read_lines, read_multi30k, read_parallel, read_tatoeba, resolve_data_dir, write_lines,
)
from attnkit.data.dates import generate_dates
from attnkit.data.prepare import Encoded, Tokenizers, build_tokenizers, encode_pairs, load_split, load_tokenizers
from attnkit.data.tokenizer import BOS, EOS, PAD, UNK, Tokenizer, train_tokenizer

__all__ = [
    "Batch", "collate", "pad", "token_batches", "Parallel", "read_lines", "read_multi30k", "read_parallel",
    "read_tatoeba", "resolve_data_dir", "write_lines", "generate_dates", "Encoded", "Tokenizers",
    "build_tokenizers", "encode_pairs", "load_split", "load_tokenizers", "BOS", "EOS", "PAD", "UNK", "Tokenizer",
    "train_tokenizer",
]
