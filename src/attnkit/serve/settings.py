"""What a server is started with: its limits (:class:`Settings`) and its models (:class:`ServedModel`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Settings:
    """The limits and batching of ``attnkit serve`` (its command-line options)."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # required on /v1/* and /metrics when set
    max_wait_ms: float = 5.0  # the longest a batch waits for more requests to share it (attnkit.serve.worker)
    max_batch_tokens: int = 4000  # source tokens per batch (and attnkit translate's --batch-tokens)
    queue_size: int = 256  # requests admitted at once (waiting or decoding); more: 429
    timeout: float = 30.0  # seconds a request may take, queueing included; then 504
    max_source_tokens: int = 256  # tokens per source sentence; more: 413
    max_sentences: int = 64  # sentences (or texts) per request; more: 413
    max_beam: int = 16
    max_new_tokens: int = 1024  # generate's max_tokens
    max_body_bytes: int = 1 << 20  # JSON bodies; more: 413
    max_image_bytes: int = 10 << 20  # /v1/caption uploads and /v1/attention's images
    max_image_pixels: int = 25_000_000  # width x height of an image as its header declares it; more: 413
    max_audio_bytes: int = 5 << 20  # /v1/transcribe uploads; more: 413
    max_audio_seconds: float = 30.0  # /v1/transcribe: longer audio (or longer than the model hears): 413
    body_timeout: float = 10.0  # seconds to receive a request's body once its headers are in; then 408
    precision: str = "fp32"  # what the models decode in (attnkit.fast.precision): fp32, bf16 or int8
    compile: bool | None = None  # compile the models' decoding at start; None: attnkit.fast.compiles_by_default


@dataclass
class ServedModel:
    """A model the server offers under ``name``: an :class:`attnkit.api.Model`."""

    name: str
    model: object
    info: dict = field(default_factory=dict)  # cached description (GET /v1/models)
