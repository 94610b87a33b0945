"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status.

``APIError`` is what the handlers raise; ``error_response`` renders one. Request-validation
errors (pydantic) become 400s naming the first bad field as ``param``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from starlette.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """An error answered to the client with ``status`` and an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})


class FieldError(APIError):
    """A request field with a bad value (HTTP 400 naming the field)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(400, message, param=param, code="invalid_value")


def error_response(err: APIError) -> JSONResponse:
    body = {
        "error": {
            "message": err.message,
            "type": _TYPES.get(err.status, "invalid_request_error"),
            "param": err.param,
            "code": err.code,
        }
    }
    return JSONResponse(body, status_code=err.status, headers=err.headers)


def param_of(loc: Sequence[Any]) -> str | None:
    """A pydantic error location as the field path: ("body", "speculative", "n_max") ->
    "speculative.n_max"; list indexes are written [i]."""
    parts = [p for p in loc if p != "body"]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p in ("str", "list[int]", "list[str]", "list[TextPart]") or "[" in str(p):
            continue  # the union branch pydantic tried, not a field
        else:
            out += ("." if out else "") + str(p)
    return out or None


def validation_error(errors: Sequence[Mapping[str, Any]]) -> APIError:
    """The first pydantic error as a 400 naming its field."""
    if not errors:
        return APIError(400, "invalid request body", code="invalid_request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return APIError(400, "the request body is not valid JSON", code="invalid_json")
    param = param_of(first.get("loc", ()))
    if param is None:  # the body as a whole
        return APIError(400, "the request body must be a JSON object", code="invalid_json")
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "missing":
        return APIError(400, f"{param} is required", param=param, code="missing_field")
    return APIError(400, f"{param}: {msg}" if param else msg, param=param, code="invalid_value")
