"""An image, read as the CNN feature grid of :mod:`attnkit.nn.vision` (captioning): the decoder attends over its
grid cells, row-major, each with its box on the image."""

from __future__ import annotations

import base64
import binascii
import io
import os
import tempfile
from contextlib import contextmanager

import torch

from attnkit.errors import AttnkitError, RequestError
from attnkit.kinds import Field, InputKind, Upload, schema

IMAGE_FILE = Field("image", "file", required=True, max_bytes="max_image_bytes", media="image/*",
                   description="the image file (PNG, JPEG, ...); at most {s.max_image_bytes} bytes and "
                               "{s.max_image_pixels} pixels (more: 413)")
_GRID = schema.array(schema.INTEGER, minItems=2, maxItems=2)
CAPTION = Upload(
    "/v1/caption", "caption", (
        IMAGE_FILE,
        Field("beam", "int", low=1, high="max_beam", key=True, description="1 is greedy (default: the checkpoint's)"),
        Field("attention", "bool", default=True, key=True, description="each word's attention over the grid")),
    "Caption", schema.obj({"model": schema.STRING, "caption": schema.STRING, "words": schema.array(schema.STRING),
                           "score": schema.NUMBER, "grid": _GRID,
                           "attention": schema.array(schema.array(schema.NUMBER))},
                          ["model", "caption", "words", "score", "grid"]),
    "a captioner")


def check_image(data: bytes, settings, field: str = "image") -> None:
    """413 for an image whose header declares more pixels than the server decodes (a few hundred bytes of PNG can
    declare a gigapixel); 422 for bytes that are no image. Only the header is read here."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Image.DecompressionBombError:  # PIL's own bound, above ours: over 2 x Image.MAX_IMAGE_PIXELS
        raise RequestError(413, f"{field}: more pixels than this server's limit of {settings.max_image_pixels}") \
            from None
    except UnidentifiedImageError:
        raise RequestError(422, f"{field}: not an image file (expected PNG, JPEG or another format Pillow reads)") \
            from None
    except (OSError, ValueError) as e:
        raise RequestError(422, f"{field}: cannot read image ({e})") from None
    if width * height > settings.max_image_pixels:
        raise RequestError(413, f"{field}: {width} x {height} pixels, more than this server's limit of "
                                f"{settings.max_image_pixels}")


class ImageKind(InputKind):
    name = "image"
    field = "image"
    title = "image"
    json_scores = False  # a captioner's sources are images, not sent to /v1/score
    upload = CAPTION

    def grid(self, model) -> list[int]:
        """[rows, columns] of the model's image grid."""
        from attnkit.nn.vision import grid_shape

        return list(grid_shape(model.config.data.image_grid, model.config.data.image_size)[1:])

    def grids(self, model, paths: list):
        """The CNN feature grids [N, L, D] of these image files (the CNN loaded on first use, kept by the model)."""
        from attnkit.data import load_image
        from attnkit.nn.vision import load_pretrained, normalize

        if getattr(model, "_image_encoder", None) is None:
            model._image_encoder = load_pretrained(model.config.data.image_grid).eval()
        with torch.no_grad():
            pixels = normalize(torch.stack([load_image(p, model.config.data.image_size) for p in paths]))
            return model._image_encoder.forward_features(pixels).flatten(2).transpose(1, 2)

    def encode(self, model, value):
        """[1, L, D]: the image file's grid cells."""
        return self.grids(model, [value])

    def length(self, model, value) -> int:
        rows, columns = self.grid(model)
        return rows * columns

    def positions(self, model, value) -> list[str]:
        return [f"cell {i}" for i in range(self.length(model, value))]

    def own_output(self, model, value) -> str:
        from attnkit.decode import caption

        d = model.config.decode
        out = caption(model.own_decoder, model.tokenizers, self.grids(model, [value]), beam_size=d.beam_size,
                      len_penalty=d.len_penalty, max_len=d.max_caption_len)
        return out[0].text[0]

    def describe(self, model) -> dict:
        return {"grid": self.grid(model)}

    def decode_settings(self, model) -> dict:
        return {"max_caption_len": model.config.decode.max_caption_len}

    def describe_schema(self) -> tuple[dict, dict]:
        return {}, {"max_caption_len": schema.INTEGER}

    # --- requests

    def read_request(self, model, body, settings, name: str):
        """The image's bytes, from base64; 413 past the server's bytes or pixels."""
        if getattr(body, "image", None) is None:
            raise RequestError(422, f"image: required for the captioner {name} (the image file as base64)")
        if getattr(body, "source", None) is not None:
            raise RequestError(422, f"source: {name} is a captioner: send image (the file as base64), not source")
        try:
            data = base64.b64decode(body.image, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(422, "image: not valid base64") from None
        if len(data) > settings.max_image_bytes:
            raise RequestError(413, f"image: {len(data)} bytes, more than this server's limit of "
                                    f"{settings.max_image_bytes}")
        check_image(data, settings)
        return data

    @contextmanager
    def opened(self, data: bytes):
        """Uploaded image bytes as a file (the API reads images from paths), removed afterwards; an error about
        the file names the field instead."""
        fd, path = tempfile.mkstemp(prefix="attnkit-serve-", suffix=".img")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            try:
                yield path
            except AttnkitError as e:
                message = str(e)
                if message.startswith(path):
                    raise RequestError(422, "image" + message[len(path):]) from None
                raise
        finally:
            os.unlink(path)

    def attention_schema(self, model, settings) -> tuple[dict, list[str]]:
        image = {"type": "string", "format": "byte",
                 "description": f"the image file (PNG, JPEG, ...), base64; at most {settings.max_image_bytes} bytes "
                                f"and {settings.max_image_pixels} pixels (more: 413)"}
        return {"image": image, "source": schema.NULL,
                "target": schema.nullable(schema.text("a caption (null: the model's own)", None))}, ["image"]

    def check_score(self, model, sources, targets, settings, name: str) -> None:
        raise RequestError(422, f"sources: {name} is a captioner, whose sources are images: not scored over JSON")

    # --- uploads: POST /v1/caption

    def read_form(self, model, form: dict, settings) -> dict:
        check_image(form["image"], settings)
        return {"input": form["image"], "beam": form["beam"], "attention": form["attention"]}

    def answer_uploads(self, model, name: str, payloads: list[dict], on_step=None) -> list[dict]:
        """Each image captioned (:meth:`attnkit.api.Model.caption`, the batch's images together), with each word's
        attention over the grid where asked."""
        from contextlib import ExitStack

        with ExitStack() as files:
            paths = [files.enter_context(self.opened(p["input"])) for p in payloads]
            captions = model.caption(paths, beam=payloads[0]["beam"], details=True)
        words, grid = model.tokenizers.id_to_piece, self.describe(model)
        answers = []
        for p, c in zip(payloads, captions):
            h = c.hypotheses[0]
            answer = {"model": name, "caption": c.text[0], "words": list(words(h.tokens)) + ["<end>"],
                      "score": schema.finite(h.score), **grid}
            if p["attention"]:
                answer["attention"] = [] if h.attention is None else schema.rounded(h.attention)
            answers.append(answer)
        return answers


IMAGE = ImageKind()
