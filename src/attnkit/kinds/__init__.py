"""Input kinds: what a model family reads, and everything the faces (the Python API, the command line, the
server, its OpenAPI document and the explorer) need to know about it.

A family names its input kind in its registry entry (:mod:`attnkit.registry`); the faces ask
``model.kind`` instead of comparing names, so a new kind of input (speech, an image with a question) is one
module here and one :func:`attnkit.registry.register_kind` call. A kind owns

* reading one input: a Python value (a sentence, an image file), an HTTP JSON body's field (:attr:`field`)
  and its limits (:meth:`read_request`);
* what the model computes on: :meth:`encode` -> the source tensor of one input;
* its positions on an attention map (:meth:`positions`: word pieces, grid cells) and their count
  (:meth:`length`);
* the model's own output for an input (:meth:`own_output`), from which its attention is drawn;
* an example for the explorer and ``/v1/models`` (:meth:`example`), and what ``/v1/models`` says of it
  (:meth:`describe`);
* its OpenAPI schema fragments (:meth:`attention_schema`, :meth:`score_schema`);
* its upload endpoint, where its inputs are uploaded files (:attr:`upload`, an :class:`attnkit.kinds.upload.Upload`):
  the form's fields, how a checked form becomes the worker's payload (:meth:`read_form`), a payload's share of a
  batch's budget (:meth:`upload_tokens`) and the answers to a batch of payloads (:meth:`answer_uploads`).

The methods take the loaded model (:class:`attnkit.api.Model`); server limits come as the server's settings
(anything with ``max_source_tokens``, ``max_sentences``, ``max_image_bytes``, ``max_image_pixels``). A request's
fault is an :class:`attnkit.errors.RequestError` carrying its HTTP status.
"""

from __future__ import annotations

from contextlib import contextmanager

from attnkit.errors import AttnkitError, RequestError
from attnkit.kinds.upload import Field, Upload


class InputKind:
    """The base of every input kind: a model that reads nothing from outside its target (a language model's
    prompt) needs nothing more than these defaults."""

    name: str = ""
    field: str = "source"  # the JSON field of /v1/attention carrying one input
    has_source: bool = True  # False: the model reads its target alone (no encoder, no source positions)
    source_vocabulary: bool = False  # its source is tokens of a source vocabulary (shared embeddings need joint)
    title: str = "source"  # how one input is called in messages
    # `attnkit evaluate --data` for a model of this kind, "module:function" (f(args) -> exit status; the command's
    # own module, named here and imported on use, as the registry names code); "": a labelled file of sentences
    evaluates: str = ""
    json_inputs: bool = True  # its inputs travel in JSON bodies (/v1/attention, /v1/score); False: uploads only
    json_scores: bool = True  # /v1/score takes its inputs (an image's are not sent there)
    upload: Upload | None = None  # its upload endpoint, where its inputs are files (None: JSON bodies only)

    # --- Python values

    def check(self, model, values) -> None:
        """A one-line :class:`AttnkitError` for an input past the model's own limits."""

    def encode(self, model, value):
        """The source tensor the model computes on, for one input: [1, S] token ids, [1, L, D] grid cells."""
        raise AttnkitError(f"a {model.family} model reads no {self.title}")

    def length(self, model, value) -> int:
        """How many positions ``value`` has on the attention's source axis, without encoding it."""
        return len(self.positions(model, value))

    def positions(self, model, value) -> list[str]:
        """The labels of the source axis of an attention map (word pieces and EOS, grid cells, ...)."""
        return []

    def own_output(self, model, value) -> str:
        """The text the model's own (eager, fp32) decoder outputs for ``value``."""
        raise AttnkitError(f"a {model.family} model has no output of its own for a {self.title}")

    def positions_needed(self, cfg) -> tuple[int, str]:
        """Training: how many learned target/source positions the data needs, and why (0: none known)."""
        return 0, ""

    # --- the explorer and /v1/models

    def example(self, model) -> str | None:
        """A first input for the explorer (None: the user brings one, an image)."""
        return None

    def describe(self, model) -> dict:
        """What ``/v1/models`` says of this kind's inputs beyond the family's: e.g. an image grid's shape."""
        return {"grid": None}

    def decode_settings(self, model) -> dict:
        """What ``/v1/models`` adds to a model's decoding settings for this kind (e.g. a caption's longest length)."""
        return {}

    def describe_schema(self) -> tuple[dict, dict]:
        """The JSON Schema properties of what :meth:`describe` and :meth:`decode_settings` add to a model's entry of
        ``/v1/models`` (``grid`` is every model's): (entry properties, decode properties)."""
        return {}, {}

    # --- requests

    def token_limit(self, model, settings) -> int | None:
        """Tokens one input may have on a server (None: not a text)."""
        return None

    def count_tokens(self, model, values: list, settings, field: str) -> list[int]:
        """Each input's tokens (a batch's budget); :class:`RequestError` 413 naming ``field`` (``field[i]``) for
        one past :meth:`token_limit`."""
        raise RequestError(422, f"{field}: a {model.family} model reads {self.title}s, not texts")

    def read_request(self, model, body, settings, name: str):
        """One input from a JSON body (``/v1/attention``): the value :meth:`encode` takes. Raises
        :class:`RequestError` (422, 413) naming the field."""
        value = getattr(body, self.field, None)
        if value is None:
            raise RequestError(422, f"{self.field}: required")
        return value

    @contextmanager
    def opened(self, value):
        """What :meth:`encode` takes, made of what :meth:`read_request` returned (e.g. uploaded bytes as a file)."""
        yield value

    def attention_schema(self, model, settings) -> tuple[dict, list[str]]:
        """The properties (and required names) of ``/v1/attention``'s body for a model of this kind."""
        raise NotImplementedError

    def check_score(self, model, sources, targets, settings, name: str) -> None:
        """``/v1/score``'s sources (and targets) for a model of this kind; :class:`RequestError` if they are
        wrong."""
        raise RequestError(422, f"sources: {name} reads {self.title}s, which are not scored over JSON")

    def score_schema(self, model, settings) -> tuple[dict, list[str], dict] | None:
        """``/v1/score``'s body properties, required names and extra schema keys; None: not scored over JSON."""
        return None

    # --- uploads (kinds with an :attr:`upload` endpoint)

    def read_form(self, model, form: dict, settings) -> dict:
        """The worker's payload of one upload: ``form`` {field name: value} holds every declared field of
        :attr:`upload`, each already of its type and within its declared limits (a file's bytes, not empty). The
        payload's ``"input"`` is the value :meth:`length` takes. Raises :class:`RequestError` (422, 413) naming the
        field for what only the kind can check (not an image, not audio, ...)."""
        raise RequestError(422, f"{self.title}: not uploaded to this server")

    def upload_tokens(self, model, payload: dict) -> int:
        """A payload's share of a batch's budget (``max_batch_tokens``): its source positions."""
        return self.length(model, payload["input"])

    def answer_uploads(self, model, name: str, payloads: list[dict], on_step=None) -> list[dict]:
        """The answers (JSON) of a batch of payloads sent to the served model ``name``, in order, through the Python
        API. ``on_step(step, batch)``: where the upload :attr:`~attnkit.kinds.upload.Upload.streams`, each decoding
        step, as :meth:`attnkit.api.Model.translate` gives it (``batch``: the payloads' indices)."""
        raise NotImplementedError


__all__ = ["Field", "InputKind", "RequestError", "Upload"]
