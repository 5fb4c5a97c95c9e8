"""Errors as the API answers them: one line, ``{"error": "<field>: <what is wrong>"}``."""

from __future__ import annotations


class ApiError(Exception):
    """An answer other than 200: its status, its one-line message (``<field>: <what is wrong>``), headers."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _field(loc) -> str:
    """('body', 'sentences', 0, 'x') -> 'sentences[0].x'."""
    out = ""
    for part in loc:
        if isinstance(part, str) and (part in _TYPE_TAGS or "[" in part):  # a union's branch, not a field
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def validation_message(errors) -> tuple[int, str]:
    """FastAPI's (pydantic's) validation errors -> (status, one line naming the first wrong field)."""
    if not errors:
        return 422, "body: invalid request"
    e = errors[0]
    kind, loc = e.get("type", ""), tuple(e.get("loc", ()))
    where = loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc
    if kind == "json_invalid":
        detail = (e.get("ctx") or {}).get("error", "")
        at = f" at character {where[0]}" if where and isinstance(where[0], int) else ""
        return 400, f"body: invalid JSON{at}" + (f" ({detail})" if detail else "")
    if not where:
        if kind == "missing":
            return 400, "body: required (a JSON object)"
        return 400, "body: expected a JSON object"
    name = _field(where)
    if kind == "extra_forbidden":
        return 422, f"{name}: unknown field"
    if kind == "missing":
        return 422, f"{name}: required"
    message = str(e.get("msg", "invalid")).replace("\n", " ")
    message = message[:1].lower() + message[1:]
    return 422, f"{name}: {message}"
