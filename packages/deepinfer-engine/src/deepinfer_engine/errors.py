"""Errors the engine raises to users. Each names the offending field and its limit.

`RequestError` is what one request can raise: `InvalidRequestError` (its input, found before it
is queued) or `RequestFailedError` (something raised while it was being added or run). Either
way only that request fails; `LLM.generate` turns it into the request's output
(`finish_reason == "error"`, `error` = the message) and the engine keeps serving the rest.
"""


class RequestError(Exception):
    """One request failed; the engine keeps serving the others."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidRequestError(RequestError, ValueError):
    """One request's input is invalid. Only that request fails; the engine keeps serving the rest."""


class RequestFailedError(RequestError, RuntimeError):
    """A request raised while it was being queued or run (not a property of its input that the
    checks know of). Its state is removed; `field` is "request"."""

    def __init__(self, message: str):
        super().__init__("request", message)


class ModelDoesNotFitError(RuntimeError):
    """The model's weights plus the minimum KV cache do not fit the memory budget."""
