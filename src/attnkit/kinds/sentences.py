"""A sentence, or a pair of sentences, to classify: BERT's (or GPT-1's) encoder reads their word pieces together,
and its self-attention over them is what the explorer draws."""

from __future__ import annotations

from attnkit.kinds import InputKind

# a first input, by whether the model reads pairs: (sentence, second sentence)
EXAMPLES = {False: ("A gripping, beautifully acted film.", None),
            True: ("A man is playing a guitar.", "A man plays the guitar.")}


class SentencesKind(InputKind):
    name = "sentences"
    field = "sentences"
    title = "sentence"

    def example(self, model) -> str | None:
        return EXAMPLES[model.takes_pairs][0]

    def example_pair(self, model) -> str | None:
        return EXAMPLES[model.takes_pairs][1]

    def positions(self, model, value) -> list[str]:
        return list(model.tokenizers.id_to_piece(model.tokenizers.example(value)[0]))


SENTENCES = SentencesKind()
