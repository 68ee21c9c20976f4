"""Tokenizer wrapper over HF `tokenizers`: encode/decode plus the special ids the engine needs."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


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
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)
