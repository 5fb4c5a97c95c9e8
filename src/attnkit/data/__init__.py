"""Tokenizers, corpus readers with validation, length-bucketed batching, Flickr8k images and their grids,
language-model text streams, and what the command line reads from its user (:mod:`attnkit.data.inputs`)."""

from attnkit.data.batching import Batch, collate, pad, token_batches
from attnkit.data.corpus import (
    Parallel,
    read_lines,
    read_multi30k,
    read_parallel,
    read_tatoeba,
    resolve_data_dir,
    write_lines,
)
from attnkit.data.dates import generate_dates
from attnkit.data.images import (
    Captions,
    FeatureCache,
    encoder_fingerprint,
    extract_features,
    flickr8k_images,
    load_image,
    read_flickr8k,
    read_flickr8k_tokens,
)
from attnkit.data.inputs import ClassifierInput, StreamLines, image_list, read_input
from attnkit.data.labelled import Labelled, check_labels, label_set, read_glue, read_labelled
from attnkit.data.prepare import Encoded, Tokenizers, build_tokenizers, encode_pairs, load_split, load_tokenizers
from attnkit.data.text import (
    CharTokenizer,
    block_batch,
    read_tinyshakespeare,
    read_wikitext2,
    shifted_blocks,
    stream_blocks,
)
from attnkit.data.tokenizer import BOS, EOS, PAD, UNK, Tokenizer, train_tokenizer
from attnkit.data.vocab import WordVocab, words
from attnkit.data.wordpiece import SentenceBatch, WordPiece

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "UNK",
    "Batch",
    "Captions",
    "CharTokenizer",
    "ClassifierInput",
    "Encoded",
    "FeatureCache",
    "Labelled",
    "Parallel",
    "StreamLines",
    "Tokenizer",
    "Tokenizers",
    "block_batch",
    "build_tokenizers",
    "check_labels",
    "collate",
    "encode_pairs",
    "encoder_fingerprint",
    "extract_features",
    "flickr8k_images",
    "generate_dates",
    "image_list",
    "label_set",
    "load_image",
    "load_split",
    "load_tokenizers",
    "pad",
    "read_flickr8k",
    "read_flickr8k_tokens",
    "read_glue",
    "read_input",
    "read_labelled",
    "read_lines",
    "read_multi30k",
    "read_parallel",
    "read_tatoeba",
    "read_tinyshakespeare",
    "read_wikitext2",
    "resolve_data_dir",
    "shifted_blocks",
    "stream_blocks",
    "token_batches",
    "train_tokenizer", "SentenceBatch", "WordPiece", "WordVocab", "words",
    "write_lines",
]
