"""A prompt in, its continuation out: a language model samples through its key/value cache, streaming text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnkit.decode.search import Hypothesis, sample
from attnkit.errors import AttnkitError
from attnkit.tokens import EOS


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

    A model with learned positions reads at most ``max_positions`` tokens (BOS included). Past that the
    text goes on in a sliding window, as nanoGPT crops its context: the cache restarts from BOS and the
    last half-window of text (as each training block starts from BOS mid-text), then sampling continues.

    ``on_text`` receives the text as it grows, piece by piece: first the prompt as the model read it
    (unknown characters shown as such), then each new token. A tokenizer whose decoding of a sequence
    starts with the decoding of its prefixes (characters, words) streams exactly the final text.
    """
    model.eval()
    ids = tokenizer.encode([prompt])[0]
    cfg = getattr(model, "cfg", None)
    window = cfg.max_positions if cfg is not None and cfg.positional == "learned" else None
    if window is not None and len(ids) + 2 > window:
        raise AttnkitError(f"the prompt's {len(ids)} tokens do not fit the model's {window} positions "
                           "(BOS, the prompt and one new token): shorten the prompt")
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    text_ids: list[int] = []  # the prompt, then every new token, as streamed
    shown = ""
    fed = 0  # tokens of the current window's forced context already seen by the stream callback

    def stream(tokens):
        nonlocal shown, fed
        if fed:  # the forced context of a restarted window: already shown
            fed -= 1
            return
        if int(tokens[0]) == EOS:
            return
        text_ids.append(int(tokens[0]))
        if on_text is not None:
            text = tokenizer.decode(text_ids)
            if len(text) > len(shown):
                on_text(text[len(shown):])
            shown = text

    context, new, log_probs = ids, 0, []
    already_scored = 0  # the first window scores the prompt; later ones re-read context scored before
    while True:
        steps = len(context) + (max_new_tokens - new) + 1  # the last step only ends the sequence (EOS)
        if window is not None:
            steps = min(steps, window)
        state = model.init_state(model.encode(torch.zeros(1, 0, dtype=torch.long)))
        hyp = sample(model, state, torch.tensor([steps]), temperature, top_k, top_p, generator,
                     prefix=torch.tensor([context], dtype=torch.long).view(1, -1), on_token=stream)[0]
        # scores: the prompt's once (first window), then each window's new tokens and its closing EOS
        log_probs += hyp.log_probs[already_scored:]
        new += len(hyp.tokens) - len(context)
        ended = len(hyp.tokens) < steps - 1  # EOS before the window's end: the model chose to stop
        if ended or new >= max_new_tokens:
            break
        log_probs.pop()  # the forced EOS that closed a full window is no part of the text
        context = text_ids[-(window // 2):]
        fed = already_scored = len(context)
    hyp = Hypothesis(list(text_ids), float(sum(log_probs)), None, log_probs)
    return Completion(prompt, hyp, tokenizer.decode(hyp.tokens))
