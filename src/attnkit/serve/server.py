"""Starting a server: models named from their paths, loopback unless there is an API key, uvicorn."""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from pathlib import Path

from attnkit.errors import AttnkitError
from attnkit.serve.settings import Settings


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def model_names(specs: list[str]) -> list[tuple[str, str]]:
    """``[NAME=]PATH`` arguments -> (name, path): a run directory's name, or for a checkpoint inside a run
    (RUN/checkpoints/STEP) the run's, else the directory's; repeated names get -2, -3, ..."""
    out, seen = [], {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or "/" in name or not name:
            name, path = "", spec
        if not name:
            p = Path(path).resolve() if Path(path).exists() else Path(path)
            name = p.parent.parent.name if p.parent.name == "checkpoints" else p.name
            name = name or "model"
        base, n = name, 2
        while name in seen:
            name, n = f"{base}-{n}", n + 1
        seen[name] = path
        out.append((name, path))
    return out


def check_binding(settings: Settings) -> None:
    if not is_loopback(settings.host) and not settings.api_key:
        raise AttnkitError(f"--host {settings.host}: serving beyond this machine needs an API key "
                           "(--api-key KEY or ATTNKIT_API_KEY)")


def _classifier(path: str) -> bool:
    """Whether ``path`` holds a fine-tuned classifier, which decodes nothing and computes in fp32 whatever
    ``--precision`` the server's other models decode in."""
    from attnkit import registry
    from attnkit.checkpoint import read_config, resolve_checkpoint

    return registry.family(read_config(resolve_checkpoint(path)).model.family).decodes is False


def serve(specs: list[str], settings: Settings, log_level: str = "info") -> int:
    """Load the models of ``specs`` (``[NAME=]RUN_OR_CHECKPOINT``) and serve them until interrupted."""
    import uvicorn

    import attnkit
    from attnkit.fast import compiles_by_default
    from attnkit.serve.app import create_app

    check_binding(settings)
    models = {}
    for name, path in model_names(specs):
        classifier = _classifier(path)
        precision = "fp32" if classifier else settings.precision
        model = attnkit.load(path, precision=precision, compile=False)
        compiled = model.compiles and (compiles_by_default(model.module) if settings.compile is None
                                         else settings.compile)
        if compiled:
            # in the background: requests are answered eagerly meanwhile, the compiled steps take over when ready
            beams = (1, model.config.decode.beam_size) if "translate" in model.capabilities else ()
            model.compile(beams=beams, background=True)
        models[name] = model
        doing = "computing" if classifier else "decoding"
        if compiled:
            doing = (f"compiling for beam sizes {', '.join(map(str, sorted(set(beams))))} in the background "
                     "(eager until then, other beam sizes eager), decoding" if beams else
                     "compiling in the background, decoding")
        print(f"attnkit serve: {name}: {model.family} from {model.path} "
              f"({', '.join(sorted(model.capabilities))}; {doing} in {precision})", file=sys.stderr)
    app = create_app(models, settings)
    interval = float(os.environ.get("ATTNKIT_SWITCH_INTERVAL", "0.005"))
    sys.setswitchinterval(interval)
    logging.getLogger("attnkit.serve").setLevel(logging.INFO)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    print(f"attnkit serve: http://{host}:{settings.port}/ (the explorer; the API: /docs)", file=sys.stderr,
          flush=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level, access_log=False,
                timeout_graceful_shutdown=5)
    return 0
