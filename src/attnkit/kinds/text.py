"""A source sentence, read as subwords of the source vocabulary (translation): the encoder attends over its word
pieces and EOS."""

from __future__ import annotations

import torch

from attnkit import registry
from attnkit.errors import AttnkitError, RequestError
from attnkit.kinds import InputKind, schema
from attnkit.tokens import EOS

DEFAULT_EXAMPLE = "A dog is running through the grass."


def learned_positions(model) -> int | None:
    """How many positions a model with learned position embeddings has (None: sinusoids, or no positions)."""
    cfg = getattr(model.module, "cfg", None)
    if cfg is not None and getattr(cfg, "positional", None) == "learned":
        return cfg.max_positions
    return None


class TextKind(InputKind):
    name = "text"
    field = "source"
    source_vocabulary = True
    title = "source sentence"

    def ids(self, model, values) -> list[list[int]]:
        return model.tokenizers.src.encode(list(values))

    def check(self, model, values) -> None:
        """Bounded work: a source longer than ``decode.max_source_tokens`` subwords is refused, not decoded."""
        limit = model.config.decode.max_source_tokens
        for i, ids in enumerate(self.ids(model, values)):
            if len(ids) > limit:
                raise AttnkitError(f"source {i}: {len(ids)} tokens, more than decode.max_source_tokens = {limit}")

    def encode(self, model, value):
        """[1, S]: the sentence's subword ids and EOS."""
        return torch.tensor([self.ids(model, [value])[0] + [EOS]], dtype=torch.long)

    def length(self, model, value) -> int:
        return len(self.ids(model, [value])[0]) + 1

    def positions(self, model, value) -> list[str]:
        return model.tokenizers.src.pieces(value) + ["</s>"]

    def own_output(self, model, value) -> str:
        from attnkit.decode import translate

        d = model.config.decode
        out = translate(model.own_decoder, model.tokenizers, [value], beam_size=d.beam_size,
                        len_penalty=d.len_penalty, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
        return out[0].text[0]

    def positions_needed(self, cfg) -> tuple[int, str]:
        return cfg.data.max_len + 1, f"data.max_len = {cfg.data.max_len} subwords and an end token"

    def example(self, model) -> str | None:
        return registry.data_format(model.config.data.format).example or DEFAULT_EXAMPLE

    # --- requests

    def token_limit(self, model, settings) -> int:
        """Tokens a source sentence may have (EOS not counted): the server's limit, the model's learned positions
        (one is EOS's) and the checkpoint's ``decode.max_source_tokens``, whichever is least."""
        limit = min(settings.max_source_tokens, model.config.decode.max_source_tokens)
        positions = learned_positions(model)
        return limit if positions is None else min(limit, positions - 1)

    def count_tokens(self, model, sentences: list[str], settings, field: str = "sentences") -> list[int]:
        """Each sentence's source tokens (EOS included); 413 past the server's (or the model's) limit."""
        if len(sentences) > settings.max_sentences:
            raise RequestError(413, f"{field}: {len(sentences)} sentences, more than this server's limit of "
                                    f"{settings.max_sentences} per request")
        limit = self.token_limit(model, settings)
        counts = [len(ids) + 1 for ids in self.ids(model, sentences)]
        for i, n in enumerate(counts):
            if n - 1 > limit:
                where = field if field == "source" else f"{field}[{i}]"
                raise RequestError(413, f"{where}: {n - 1} tokens, more than this server's limit of {limit}")
        return counts

    def read_request(self, model, body, settings, name: str):
        if getattr(body, "image", None) is not None:
            raise RequestError(422, f"image: {name} is a {model.family} model: send source, not an image")
        value = super().read_request(model, body, settings, name)
        self.count_tokens(model, [value], settings, field="source")
        return value

    def attention_schema(self, model, settings) -> tuple[dict, list[str]]:
        return {"source": schema.text("the source sentence", self.token_limit(model, settings)),
                "image": schema.NULL,
                "target": schema.nullable(schema.text("a translation (null: the model's own)", None))}, ["source"]

    def check_score(self, model, sources, targets, settings, name: str) -> None:
        if sources is None:
            raise RequestError(422, "sources: required (one per target)")
        if len(sources) != len(targets):
            raise RequestError(422, f"targets: {len(targets)} targets for {len(sources)} sources")
        self.count_tokens(model, sources, settings, field="sources")

    def score_schema(self, model, settings):
        return ({"sources": schema.array(schema.text("a source sentence", self.token_limit(model, settings)),
                                         minItems=1, maxItems=settings.max_sentences),
                 "targets": schema.array(schema.STRING, minItems=1, maxItems=settings.max_sentences)},
                ["sources", "targets"], {"x-rules": ["as many sources as targets (else 422)"]})


TEXT = TextKind()
