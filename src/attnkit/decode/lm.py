"""A prompt in, its continuation out: a language model samples through its key/value cache, streaming text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnkit.data.tokenizer import EOS
from attnkit.decode.search import Hypothesis, sample
from attnkit.errors import AttnkitError


@dataclass
class Completion:
    prompt: str
    hypothesis: Hypothesis  # tokens: the prompt's, then the new ones
    text: str  # the decoded prompt and continuation


@torch.no_grad()
def complete(model, tokenizer, prompt: str, max_new_tokens: int = 200, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, seed: int | None = None,
             on_text: Callable[[str], None] | None = None) -> Completion:
    """Feed BOS and the prompt's tokens, then sample ``max_new_tokens`` more (``temperature == 0``: greedy).

    ``on_text`` receives the text as it grows, piece by piece: first the prompt as the model read it
    (unknown characters shown as such), then each new token. A tokenizer whose decoding of a sequence
    starts with the decoding of its prefixes (characters, words) streams exactly the final text.
    """
    model.eval()
    ids = tokenizer.encode([prompt])[0]
    n_steps = len(ids) + max_new_tokens + 1  # the last step only ends the sequence (EOS)
    cfg = getattr(model, "cfg", None)
    if cfg is not None and cfg.positional == "learned" and n_steps > cfg.max_positions:
        raise AttnkitError(f"the prompt's {len(ids)} tokens and {max_new_tokens} new ones exceed the model's "
                           f"{cfg.max_positions} positions: shorten the prompt or lower --max-new-tokens")
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    out: list[int] = []
    shown = ""

    def stream(tokens):
        nonlocal shown
        if int(tokens[0]) == EOS:
            return
        out.append(int(tokens[0]))
        text = tokenizer.decode(out)
        if len(text) > len(shown):
            on_text(text[len(shown):])
        shown = text

    state = model.init_state(model.encode(torch.zeros(1, 0, dtype=torch.long)))
    hyp = sample(model, state, torch.tensor([n_steps]), temperature, top_k, top_p, generator,
                 prefix=torch.tensor([ids], dtype=torch.long).view(1, -1),
                 on_token=None if on_text is None else stream)[0]
    return Completion(prompt, hyp, tokenizer.decode(hyp.tokens))
