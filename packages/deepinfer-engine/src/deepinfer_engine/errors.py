"""Errors the engine raises to users. Each names the offending field and its limit."""


class InvalidRequestError(ValueError):
    """One request's input is invalid. Only that request fails; the engine keeps serving the rest."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class ModelDoesNotFitError(RuntimeError):
    """The model's weights plus the minimum KV cache do not fit the memory budget."""
