"""The four special token ids, the same for every tokenizer and every model.

Defined once here, below every other module: tokenizers reserve them, models pad and start with them,
decoding stops at EOS.
"""

PAD, UNK, BOS, EOS = 0, 1, 2, 3

__all__ = ["PAD", "UNK", "BOS", "EOS"]
