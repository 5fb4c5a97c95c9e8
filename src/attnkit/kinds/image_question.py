"""An image with a question about it (visual question answering): the question's state is the attention's query
over the image's grid cells, so each question draws its own maps over the same image.

One input is a pair ``(image, question)``: the image a file path (or, over HTTP, uploaded bytes), the question a
string. The question's words are the training questions' (a word never seen becomes ``<unk>``, which the answer
reports, not an error); the image is read at the model's ``data.image_size`` and must be a file Pillow reads.
"""

from __future__ import annotations

from attnkit.errors import AttnkitError, RequestError
from attnkit.kinds import InputKind, schema
from attnkit.kinds.image import IMAGE, check_image

MAX_QUESTION_WORDS = 64  # a longer question is refused (easy-VQA's longest has 9 words)
EXAMPLE_QUESTION = "what color is the shape?"


class ImageQuestionKind(InputKind):
    name = "image_question"
    field = "question"
    title = "image and question"

    def grid(self, model) -> list[int]:
        """[rows, columns] of the model's image grid: the image side halved once per CNN block."""
        side = model.config.data.image_size // 2 ** len(model.config.model.cnn_channels)
        return [side, side]

    def check_question(self, question, where: str = "question") -> str:
        """The question, stripped; a one-line error for one that is empty, not a string, or too long."""
        if not isinstance(question, str) or not question.strip():
            raise AttnkitError(f"{where}: empty (expected a question about the image)")
        if len(question.split()) > MAX_QUESTION_WORDS:
            raise AttnkitError(f"{where}: {len(question.split())} words, more than {MAX_QUESTION_WORDS}")
        return question.strip()

    def check(self, model, values) -> None:
        for i, (_, question) in enumerate(values):
            self.check_question(question, f"questions[{i}]" if len(values) > 1 else "question")

    def length(self, model, value) -> int:
        rows, columns = self.grid(model)
        return rows * columns

    def positions(self, model, value) -> list[str]:
        return [f"cell {i}" for i in range(self.length(model, value))]

    def example(self, model) -> str | None:
        return EXAMPLE_QUESTION

    def describe(self, model) -> dict:
        """/v1/models: the grid, the answers, and the glimpses (one layer of K heads over the grid; the baseline
        without attention: its one uniform map; the question-only baseline: none)."""
        cfg = model.config.model
        glimpses = {"glimpses": cfg.glimpses, "pooled": 1, "none": 0}[cfg.attention]
        return {"grid": self.grid(model), "answers": list(model.tokenizers.answers), "glimpses": glimpses,
                "attention": {"cross": {"layers": 1, "heads": glimpses}} if glimpses else {}}

    # --- requests

    def check_upload(self, data: bytes, question, settings) -> str:
        """An uploaded image's bytes and its question, checked as ``/v1/answer`` reads them -> the question."""
        if not data:
            raise RequestError(422, "image: the file is empty")
        if len(data) > settings.max_image_bytes:
            raise RequestError(413, f"image: {len(data)} bytes, more than this server's limit of "
                                    f"{settings.max_image_bytes}")
        check_image(data, settings)
        if question is None or not isinstance(question, str):
            raise RequestError(422, "question: required (a text field of the form)")
        try:
            return self.check_question(question)
        except AttnkitError as e:
            raise RequestError(422, str(e)) from None

    def opened(self, value):
        """Uploaded image bytes as a file, as the image kind opens them."""
        return IMAGE.opened(value)

    def answer_schema(self, model, settings) -> dict:
        """The multipart body of ``/v1/answer``."""
        return {"type": "object", "required": ["image", "question"], "properties": {
            "image": {"type": "string", "format": "binary",
                      "description": f"the image file (PNG, JPEG, ...); at most {settings.max_image_bytes} bytes and "
                                    f"{settings.max_image_pixels} pixels (more: 413)"},
            "question": {**schema.STRING, "minLength": 1, "pattern": r"\S", "x-max-words": MAX_QUESTION_WORDS,
                         "description": f"a question about the image, at most {MAX_QUESTION_WORDS} words; a word "
                                        "the model never saw is read as <unk> (listed in unknown_words)"},
            "model": {**schema.STRING, "description": "a served model's name (empty: the default)"}}}

    def attention_schema(self, model, settings) -> tuple[dict, list[str]]:
        return {}, []


IMAGE_QUESTION = ImageQuestionKind()
