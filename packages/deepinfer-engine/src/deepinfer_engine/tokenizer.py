"""Tokenizer wrapper over HF `tokenizers`: encode/decode plus the special ids the engine needs."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from deepinfer_engine.errors import InvalidRequestError


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer, eos_token_ids: list[int], bos_token_id: int | None):
        self._tok = tokenizer
        self.eos_token_ids = eos_token_ids
        self.bos_token_id = bos_token_id

    @classmethod
    def from_file(cls, path: Path, eos_token_ids: list[int], bos_token_id: int | None = None) -> TextTokenizer:
        return cls(Tokenizer.from_file(str(path)), eos_token_ids, bos_token_id)

    @property
    def backend(self) -> Tokenizer:
        """The underlying HF `tokenizers` object (e.g. to build the Engram compressed vocabulary)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; InvalidRequestError("prompt", ...) for text that is not valid Unicode
        (a lone surrogate such as '\\ud800' has no UTF-8 form) or that the tokenizer refuses."""
        if not isinstance(text, str):
            raise InvalidRequestError("prompt", f"must be a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise InvalidRequestError("prompt", f"is not valid Unicode: {text[err.start]!r} at index {err.start} "
                                      "(a lone surrogate) has no UTF-8 form") from None
        try:
            return self._tok.encode(text, add_special_tokens=False).ids
        except Exception as err:  # noqa: BLE001 - the tokenizer's own refusal, reported per request
            raise InvalidRequestError("prompt", f"could not be tokenized: {type(err).__name__}: {err}") from None

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)
