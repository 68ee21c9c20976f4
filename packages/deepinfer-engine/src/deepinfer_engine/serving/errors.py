"""The OpenAI error envelope: every bad request gets a 4xx naming the field (`param`) and the limit.

    {"error": {"message": "temperature: Input should be less than or equal to 2", "type":
               "invalid_request_error", "param": "temperature", "code": null}}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_UNION_MEMBER = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|function-.*|json-or-python.*|[A-Z]\w*)$")
_FIELD_PREFIX = re.compile(r"^(?:Value error, )?([A-Za-z_][A-Za-z0-9_.\[\]]*): (.*)$", re.S)


@dataclass
class APIError(Exception):
    """A request the server refuses. `status` is 4xx for the client's errors, 503 when the engine
    is down."""

    message: str
    param: str | None = None
    status: int = 400
    type: str = "invalid_request_error"
    code: str | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def from_validation_error(err) -> APIError:
    """pydantic ValidationError -> APIError naming the first bad field (dotted path)."""
    first = err.errors(include_url=False)[0]
    loc = [str(x) for x in first.get("loc", ()) if not isinstance(x, int)]
    # a union's member name ("str", "list[int]") is not a field: drop it from the path
    loc = [x for x in loc if not _UNION_MEMBER.match(x)]
    loc = [x[:-1] if x.endswith("_") else x for x in loc]   # schema_ -> schema
    message = first.get("msg", "invalid value")
    param = ".".join(loc) if loc else None
    m = _FIELD_PREFIX.match(message)
    if m is not None and (param is None or "." not in m.group(1)):
        param, message = (f"{param}.{m.group(1)}" if param and param != m.group(1) else m.group(1)), m.group(2)
    elif message.startswith("Value error, "):
        message = message[len("Value error, "):]
    if first.get("type") == "missing":
        message = "required field is missing"
    got = first.get("input")
    shown = f" (got {got!r})" if first.get("type") != "missing" and not isinstance(got, (dict, list)) else ""
    return APIError(f"{param}: {message}{shown}" if param else message, param)


def from_invalid_request(err) -> APIError:
    """deepinfer_engine.errors.InvalidRequestError (names its field) -> APIError."""
    return APIError(str(err), getattr(err, "field", None))
