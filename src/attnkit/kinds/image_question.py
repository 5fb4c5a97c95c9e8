"""An image with a question about it (visual question answering): the question's state is the attention's query
over the image's grid cells, so each question draws its own maps over the same image.

One input is a pair ``(image, question)``: the image a file path (or, over HTTP, uploaded bytes), the question a
string. The question's words are the training questions' (a word never seen becomes ``<unk>``, which the answer
reports, not an error); the image is read at the model's ``data.image_size`` and must be a file Pillow reads.
"""

from __future__ import annotations

from attnkit.errors import AttnkitError, RequestError
from attnkit.kinds import Field, InputKind, Upload, schema
from attnkit.kinds.image import IMAGE, IMAGE_FILE, check_image

MAX_QUESTION_WORDS = 64  # a longer question is refused (easy-VQA's longest has 9 words)
EXAMPLE_QUESTION = "what color is the shape?"

_MATRIX = schema.array(schema.array(schema.NUMBER))
ANSWER = Upload(
    "/v1/answer", "answer", (
        IMAGE_FILE,
        Field("question", "text", required=True,
              schema={"minLength": 1, "pattern": r"\S", "x-max-words": MAX_QUESTION_WORDS},
              description=f"a question about the image, at most {MAX_QUESTION_WORDS} words; a word the model never "
                          "saw is read as <unk> (listed in unknown_words)")),
    "Answer", schema.obj({
        "model": schema.STRING, "question": schema.STRING, "answer": schema.STRING, "probability": schema.NUMBER,
        "probabilities": {"type": "object", "additionalProperties": schema.NUMBER,
                          "description": "answer -> probability"},
        "glimpses": schema.nullable(schema.array(
            _MATRIX, description="per glimpse: its weights over the grid's rows and columns (null: the question-only "
                                 "baseline)")),
        "unknown_words": schema.array(schema.STRING), "grid": schema.array(schema.INTEGER, minItems=2, maxItems=2)},
        ["model", "question", "answer", "probability", "probabilities", "glimpses", "unknown_words", "grid"]),
    "a VQA model")


class ImageQuestionKind(InputKind):
    name = "image_question"
    field = "question"
    title = "image and question"
    upload = ANSWER
    evaluates = "attnkit.cli.answer:evaluate_answers"  # questions about images with their answers: accuracy

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

    def describe_schema(self) -> tuple[dict, dict]:
        glimpses = {**schema.INTEGER, "description": "a VQA model's attention maps over the grid (0: none)"}
        return {"answers": schema.array(schema.STRING), "glimpses": glimpses}, {}

    # --- requests

    def read_form(self, model, form: dict, settings) -> dict:
        """``/v1/answer``'s image (checked as an image) and question (not blank, not too long)."""
        check_image(form["image"], settings)
        try:
            question = self.check_question(form["question"])
        except AttnkitError as e:
            raise RequestError(422, str(e)) from None
        return {"input": (form["image"], question)}

    def upload_tokens(self, model, payload: dict) -> int:
        """The question's words and its end: what the batch pads to."""
        return len(payload["input"][1].split()) + 1

    def opened(self, value):
        """Uploaded image bytes as a file, as the image kind opens them."""
        return IMAGE.opened(value)

    def answer_uploads(self, model, name: str, payloads: list[dict], on_step=None) -> list[dict]:
        """Every question about its image answered in one batch (:meth:`attnkit.api.Model.answer`), each answer with
        each glimpse's map over the image grid."""
        from contextlib import ExitStack

        questions = [p["input"][1] for p in payloads]
        with ExitStack() as files:
            paths = [files.enter_context(self.opened(p["input"][0])) for p in payloads]
            answers = model.answer(paths, questions)
        grid = self.grid(model)
        return [{"model": name, "question": q, **a.to_json(), "grid": grid} for q, a in zip(questions, answers)]

    def attention_schema(self, model, settings) -> tuple[dict, list[str]]:
        return {}, []


IMAGE_QUESTION = ImageQuestionKind()
