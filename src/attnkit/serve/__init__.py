"""``attnkit serve``: trained models over HTTP (FastAPI on uvicorn) with cross-request batching, streaming, and
the attention explorer at ``/``. The endpoints and their JSON: :mod:`attnkit.serve.app`'s docstring.

    from attnkit.serve import create_app, Settings
    app = create_app({"en-de": attnkit.load("runs/multi30k_en_de")}, Settings(max_wait_ms=5))

Importing this package imports FastAPI; ``import attnkit`` does not.
"""

from attnkit.serve.app import create_app
from attnkit.serve.server import model_names, serve
from attnkit.serve.settings import ServedModel, Settings

__all__ = ["ServedModel", "Settings", "create_app", "model_names", "serve"]
