"""attnkit serve: trained models over HTTP (FastAPI), with the attention explorer at /."""

from __future__ import annotations

import os

from attnkit.cli.common import add_compile_arg, add_precision_arg, at_least, finite_nonnegative, positive_float


def add_serve(sub) -> None:
    p = sub.add_parser("serve", help="serve trained models over HTTP (FastAPI), with the attention explorer at /")
    p.add_argument("models", nargs="+", metavar="RUN_OR_CHECKPOINT",
                   help="run or checkpoint directories, each optionally NAME=PATH (the first is the default model)")
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1; anything but "
                                                       "loopback needs an API key)")
    p.add_argument("--port", type=at_least(1, 65535), default=8000)
    p.add_argument("--api-key", default=None, help="required of clients on /v1/* and /metrics (default: "
                                                   "$ATTNKIT_API_KEY; none on loopback)")
    p.add_argument("--max-wait-ms", type=finite_nonnegative, default=5.0,
                   help="how long a request may wait for others to share its batch (default 5)")
    p.add_argument("--max-batch-tokens", type=at_least(1), default=4000,
                   help="source tokens per batch (default 4000)")
    p.add_argument("--queue-size", type=at_least(1), default=256,
                   help="requests admitted at once, waiting or decoding; more are answered 429 (default 256)")
    p.add_argument("--timeout", type=positive_float, default=30.0,
                   help="seconds a request may take; then 504 (default 30)")
    p.add_argument("--max-source-tokens", type=at_least(1), default=256,
                   help="tokens per source sentence; longer ones are answered 413 (default 256)")
    p.add_argument("--body-timeout", type=positive_float, default=10.0,
                   help="seconds a request's body may take to arrive; then 408 (default 10)")
    add_compile_arg(p)
    add_precision_arg(p)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    from attnkit.serve import Settings, serve

    settings = Settings(host=args.host, port=args.port, api_key=args.api_key or os.environ.get("ATTNKIT_API_KEY")
                        or None, max_wait_ms=args.max_wait_ms, max_batch_tokens=args.max_batch_tokens,
                        queue_size=args.queue_size, timeout=args.timeout, max_source_tokens=args.max_source_tokens,
                        body_timeout=args.body_timeout, precision=args.precision, compile=args.compile)
    return serve(args.models, settings)
