"""An input kind's upload endpoint, declared once: its path, the fields of its multipart form, the capability a model
needs to answer it and the schema of its answer.

The server registers one handler for every registered kind that declares an upload (:mod:`attnkit.serve.app`), and
the OpenAPI writer one form schema (:mod:`attnkit.serve.openapi`), both from this declaration; the kind itself turns
the checked form into the worker's payload (:meth:`attnkit.kinds.InputKind.read_form`) and a batch of payloads into
answers (:meth:`attnkit.kinds.InputKind.answer_uploads`). What the handler does for every upload, from the fields
alone: a file field is required and not empty, at most ``max_bytes`` (a :class:`~attnkit.serve.Settings` limit); an
integer is in ``low``..``high``; a boolean is true or false; a required text field is there; a field no declaration
names is refused; requests to one model whose ``key`` fields agree share a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnkit.errors import RequestError

TYPES = ("file", "text", "int", "bool")
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class Field:
    """One field of an upload's form. ``type``: "file" (its bytes), "text", "int" or "bool"; ``default``: the value of
    an absent (or empty) field that is not ``required``. ``low``, ``high``: an integer's range, ``high`` an integer or
    the name of the server's setting that bounds it ("max_beam"). ``max_bytes``: a file's size limit, the name of the
    server's setting ("max_image_bytes"); ``media``: its content type ("image/*"). ``key``: requests share a batch only
    where this field agrees. ``description``: for the OpenAPI document, formatted with the server's settings as ``s``
    ("at most {s.max_image_bytes} bytes"); ``schema``: more JSON Schema keys of its value (``minLength``, ...)."""

    name: str
    type: str
    required: bool = False
    default: object = None
    low: int | None = None
    high: int | str | None = None
    max_bytes: str = ""
    media: str = ""
    key: bool = False
    description: str = ""
    schema: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.type not in TYPES:
            raise ValueError(f"upload field {self.name!r}: type {self.type!r} is not one of {', '.join(TYPES)}")

    def bound(self, settings) -> int | None:
        """An integer's upper bound on a server with ``settings``."""
        return getattr(settings, self.high) if isinstance(self.high, str) else self.high

    def limit(self, settings) -> int:
        """A file's size limit in bytes on a server with ``settings``."""
        return getattr(settings, self.max_bytes)

    def read(self, value, settings):
        """The value of a text, integer or boolean field as the form gave it (a string, a file, or None when absent)
        -> of the field's type, its default when absent or empty; :class:`RequestError` 422 naming the field."""
        if self.type == "text":
            if isinstance(value, str):
                return value
            if self.required:
                raise RequestError(422, f"{self.name}: required (a text field of the form)")
            return self.default
        if value is None or value == "":
            return self.default
        if self.type == "bool":
            if str(value).lower() in TRUE:
                return True
            if str(value).lower() in FALSE:
                return False
            raise RequestError(422, f"{self.name}: expected true or false, got {str(value)[:40]!r}")
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise RequestError(422, f"{self.name}: expected an integer, got {str(value)[:40]!r}") from None
        low, high = self.low, self.bound(settings)
        if not low <= number <= high:
            raise RequestError(422, f"{self.name}: must be in {low}..{high}, got {number}")
        return number

    def json_schema(self, settings) -> dict:
        """The field's schema in the OpenAPI document of a server with ``settings``."""
        out = {"file": {"type": "string", "format": "binary"}, "text": {"type": "string"}, "bool": {"type": "boolean"},
               "int": {"type": "integer", "minimum": self.low, "maximum": self.bound(settings)}}[self.type]
        if self.default is not None:
            out["default"] = self.default
        if self.description:
            out["description"] = self.description.format(s=settings)
        return {**out, **self.schema}


STREAM = Field("stream", "bool", default=False,
               description="true: the answer as server-sent events (text/event-stream), a step event per decoding "
                           "step with the partial output and the step's attention, then done: the answer")


@dataclass(frozen=True)
class Upload:
    """An upload endpoint: ``path`` ("/v1/caption"), the ``capability`` a model needs to answer it, its form's
    ``fields`` (beside them every form may name a served ``model``), ``answer`` the name of its 200 answer's schema
    and ``answer_schema`` that schema, ``model`` how a model that answers it is called in the document ("a
    captioner"). ``batched``: requests to one model share batches; ``streams``: a form may ask ``stream`` (true: the
    answer comes as server-sent events, one per decoding step, then the answer)."""

    path: str
    capability: str
    fields: tuple[Field, ...]
    answer: str
    answer_schema: dict
    model: str
    batched: bool = True
    streams: bool = False

    @property
    def form_fields(self) -> tuple[Field, ...]:
        """The fields a form may have beside ``model``: the declared ones, and ``stream`` where it streams."""
        return (*self.fields, STREAM) if self.streams else self.fields

    @property
    def files(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.type == "file")

    @property
    def summary(self) -> str:
        """The operation's name in the document: the path's last word."""
        return self.path.rsplit("/", 1)[1].capitalize()

    def max_bytes(self, settings) -> int:
        """The most bytes one uploaded file of this form may have."""
        return max(f.limit(settings) for f in self.files)

    def body_bytes(self, settings) -> int:
        """The most bytes a whole form may have: its files, and room for its other fields and boundaries."""
        return sum(f.limit(settings) for f in self.files) + 65536


__all__ = ["STREAM", "TYPES", "Field", "Upload"]
