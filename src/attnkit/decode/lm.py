"""A prompt in, its continuation out: a language model samples through its key/value cache, streaming text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from attnkit.decode.search import Hypothesis, SearchStep, sample
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


class WatchedDecoder(nn.Module):
    """A language model's decoder whose steps compute their attention and keep it (``attention``, [N, t + 1]) for
    whoever watches the steps, but hand the search none: a language model's rows grow a position each step, which
    the search's per-hypothesis attention (one width for all steps) does not hold."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder, self.attention = decoder, None

    def encode(self, source):
        return self.decoder.encode(source)

    def init_state(self, memory):
        return self.decoder.init_state(memory)

    def step(self, tokens, state, need_weights: bool = False, **options):
        """The decoder's step with its attention kept; ``options`` go to it (the fast runtime's search steps ask
        for ``logits=True``)."""
        out, state, self.attention = self.decoder.step(tokens, state, True, **options)
        return out, state, None

    def search_steps(self) -> dict:
        """The decoder's own search steps (its ranking), over this step."""
        return {name: partial(fn.func, self.step, *fn.args[1:], **fn.keywords)
                for name, fn in self.decoder.search_steps().items() if isinstance(fn, partial)}


def fits_one_window(model, prompt_tokens: int, max_new_tokens: int) -> bool:
    """Whether BOS, the prompt, ``max_new_tokens`` and EOS fit the model's learned positions (no limit without)."""
    cfg = getattr(model, "cfg", None)
    window = cfg.max_positions if cfg is not None and cfg.positional == "learned" else None
    return window is None or prompt_tokens + max_new_tokens + 1 <= window


@torch.no_grad()
def complete_stepwise(model, tokenizer, prompt: str, max_new_tokens: int, temperature: float = 1.0, top_k: int = 0,
                      top_p: float = 1.0, seed: int | None = None, need_weights: bool = False,
                      on_step: Callable[[SearchStep, Tensor | None], None] | None = None) -> Completion:
    """:func:`complete` in one window (:func:`fits_one_window`), every step watched: ``on_step(step, attention)``
    sees each step of the search (:class:`~attnkit.decode.search.SearchStep`: the step's tokens, the text so far,
    its log-probabilities), and with ``need_weights`` the step's causal attention over the text so far [t + 1]
    (else None). The same tokens as :func:`complete` for the same seed."""
    model.eval()
    ids = tokenizer.encode([prompt])[0]
    if not fits_one_window(model, len(ids), max_new_tokens):
        raise AttnkitError(f"the prompt's {len(ids)} tokens and {max_new_tokens} new ones do not fit the model's "
                           "positions in one window")
    decoder = WatchedDecoder(model) if need_weights else model
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    watch = None if on_step is None else (
        lambda step: on_step(step, decoder.attention[0] if need_weights and decoder.attention is not None else None))
    state = decoder.init_state(decoder.encode(torch.zeros(1, 0, dtype=torch.long)))
    hyp = sample(decoder, state, torch.tensor([len(ids) + max_new_tokens + 1]), temperature, top_k, top_p, generator,
                 prefix=torch.tensor([ids], dtype=torch.long).view(1, -1), on_step=watch)[0]
    return Completion(prompt, hyp, tokenizer.decode(hyp.tokens))
