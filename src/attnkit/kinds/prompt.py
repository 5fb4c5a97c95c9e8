"""Nothing from outside the target: a language model reads its prompt (its own text so far) with causal
self-attention alone, so it has no source positions; its text's limits are those of its positions."""

from __future__ import annotations

from attnkit.errors import AttnkitError, RequestError
from attnkit.kinds import InputKind, schema
from attnkit.kinds.text import learned_positions

EXAMPLE = "The"


class PromptKind(InputKind):
    name = "prompt"
    field = "source"
    has_source = False
    title = "text"

    def check(self, model, values) -> None:
        """Bounded work: a text longer than ``decode.max_source_tokens`` tokens is refused."""
        limit = model.config.decode.max_source_tokens
        for i, ids in enumerate(model.tokenizers.encode(list(values))):
            if len(ids) > limit:
                raise AttnkitError(f"source {i}: {len(ids)} tokens, more than decode.max_source_tokens = {limit}")

    def positions_needed(self, cfg) -> tuple[int, str]:
        return cfg.data.block_size, f"data.block_size = {cfg.data.block_size} tokens per example"

    def example(self, model) -> str | None:
        return EXAMPLE

    # --- requests

    def token_limit(self, model, settings) -> int:
        """Tokens a language model's text may have: its learned positions less BOS and one new token, else four
        times the server's source limit; never more than the checkpoint's ``decode.max_source_tokens``."""
        positions = learned_positions(model)
        limit = settings.max_source_tokens * 4 if positions is None else positions - 2
        return min(limit, model.config.decode.max_source_tokens)

    def count_tokens(self, model, texts: list[str], settings, field: str = "prompt") -> list[int]:
        """Each text's tokens; 413 past what fits the model's positions (with BOS and one more), naming ``field``
        (a request's one text: "prompt", "source") or ``field[i]`` (one of a list: "targets")."""
        limit = self.token_limit(model, settings)
        counts = [len(ids) for ids in model.tokenizers.encode(list(texts))]
        for i, n in enumerate(counts):
            where = field if field in ("prompt", "source") else f"{field}[{i}]"
            if n > limit:
                raise RequestError(413, f"{where}: {n} tokens, more than {limit} (the model's positions, with BOS "
                                        "and one new token)" if learned_positions(model) else
                                   f"{where}: {n} tokens, more than this server's limit of {limit}")
        return counts

    def read_request(self, model, body, settings, name: str):
        if getattr(body, "image", None) is not None:
            raise RequestError(422, f"image: {name} is a {model.family} model: send source, not an image")
        value = super().read_request(model, body, settings, name)
        self.count_tokens(model, [value if body.target is None else body.target], settings, "source")
        return value

    def attention_schema(self, model, settings) -> tuple[dict, list[str]]:
        text = schema.text("the text", self.token_limit(model, settings))
        return {"source": text, "image": schema.NULL,
                "target": schema.nullable({**text, "description": "read instead of source"})}, ["source"]

    def check_score(self, model, sources, targets, settings, name: str) -> None:
        if sources is not None:
            raise RequestError(422, f"sources: {name} is a language model: send targets (its texts) alone")
        self.count_tokens(model, list(targets), settings, "targets")

    def score_schema(self, model, settings):
        return ({"sources": schema.NULL,
                 "targets": schema.array(schema.text("a text", self.token_limit(model, settings)), minItems=1,
                                         maxItems=settings.max_sentences)}, ["targets"], {})


PROMPT = PromptKind()
