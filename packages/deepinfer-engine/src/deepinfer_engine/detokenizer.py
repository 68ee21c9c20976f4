"""Incremental detokenization: token ids -> text, one token at a time, exact at every cut.

`TokenTable` maps every token id to its raw bytes (ByteLevel BPE: the GPT-2 byte alphabet
inverted; special tokens and ids past the tokenizer's vocabulary -> b"", as `decode(...,
skip_special_tokens=True)` drops them). The same table feeds xgrammar's `TokenizerInfo`
(structured output) so the grammar and the text agree byte for byte.

`IncrementalDetokenizer` concatenates the bytes through an incremental UTF-8 decoder: a token that
ends inside a multi-byte character contributes nothing until the character completes (held back),
invalid bytes become U+FFFD as in the tokenizer's own lossy decode. After each token `offsets[k]`
is the length of the stable text covering tokens 0..k, which is what stop strings cut against.
The text is kept as one piece per token (appending to one string copies it whole: quadratic in
the output length, ~10 us per token at 275K characters); `length` and `text_since(start)` serve
the per-token readers (stop strings, streaming) from the pieces, `text` joins them once.
For tokenizers whose decoder is not ByteLevel, `GenericDetokenizer` re-decodes the whole output
(slower, same interface) and holds back a trailing U+FFFD (an incomplete character).
"""

from __future__ import annotations

import bisect
import codecs

from deepinfer_model.byte_level import unicode_to_bytes


class TokenTable:
    """Raw bytes of every token id of a `TextTokenizer` (vocab_size = the model's logits width)."""

    def __init__(self, token_bytes: list[bytes], special_ids: set[int], byte_level: bool):
        self.token_bytes = token_bytes
        self.special_ids = special_ids
        self.byte_level = byte_level

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: int) -> TokenTable:
        backend = tokenizer.backend
        decoder = backend.decoder
        byte_level = decoder is not None and type(decoder).__name__ == "ByteLevel"
        special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        u2b = unicode_to_bytes()
        table: list[bytes] = []
        for i in range(vocab_size):
            piece = backend.id_to_token(i) if i < backend.get_vocab_size() else None
            if piece is None or i in special:
                table.append(b"")
            elif byte_level:
                try:
                    table.append(bytes(u2b[c] for c in piece))
                except KeyError:  # an added (non-special) token spelled in plain text
                    table.append(piece.encode("utf-8"))
            else:
                table.append(backend.decode([i], skip_special_tokens=True).encode("utf-8"))
        return cls(table, special, byte_level)

    def __len__(self) -> int:
        return len(self.token_bytes)


class IncrementalDetokenizer:
    def __init__(self, table: TokenTable):
        self._table = table.token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pieces: list[str] = []    # stable text added by each token (then the finish tail)
        self._piece_ends: list[int] = []  # len(text) after each piece
        self._joined = ""               # "".join(self._pieces[:self._num_joined])
        self._num_joined = 0
        self.length = 0                 # len(text), without joining it
        self.offsets: list[int] = []    # len(text) after each token
        self.finished = False

    @property
    def text(self) -> str:
        """The stable text (complete characters only)."""
        if self._num_joined < len(self._pieces):
            self._joined += "".join(self._pieces[self._num_joined:])
            self._num_joined = len(self._pieces)
        return self._joined

    def text_since(self, start: int) -> str:
        """text[start:] from the pieces that cover it (no copy of the text before it)."""
        ends = self._piece_ends
        if ends and start >= ends[-1] - len(self._pieces[-1]):   # inside the last piece (the common case)
            return self._pieces[-1][start - ends[-1]:] if start < ends[-1] else ""
        k = bisect.bisect_right(ends, start)   # first piece ending past start
        head = ends[k - 1] if k > 0 else 0
        return "".join(self._pieces[k:])[start - head:]

    def _add(self, piece: str) -> None:
        self.length += len(piece)
        self._pieces.append(piece)
        self._piece_ends.append(self.length)

    def push(self, token_id: int) -> str:
        """Append one token; returns the newly stable text (may be "" while a character is open)."""
        b = self._table[token_id] if 0 <= token_id < len(self._table) else b""
        new = self._decoder.decode(b) if b else ""
        self._add(new)
        self.offsets.append(self.length)
        return new

    def finish(self) -> str:
        """End of output: bytes of an unfinished character become U+FFFD (the tokenizer's lossy decode)."""
        if self.finished:
            return ""
        self.finished = True
        tail = self._decoder.decode(b"", final=True)
        self._add(tail)
        if self.offsets:   # the tail belongs to the last token
            self.offsets[-1] = self.length
        return tail


class GenericDetokenizer:
    """Fallback for non-ByteLevel tokenizers: re-decodes the whole output per token (O(n^2), exact)."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self._ids: list[int] = []
        self.text = ""
        self.offsets: list[int] = []
        self.finished = False

    @property
    def length(self) -> int:
        return len(self.text)

    def text_since(self, start: int) -> str:
        return self.text[start:]

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        full = self._tok.decode(self._ids)
        stable = full.rstrip("\ufffd")
        # keep the stable text a prefix-monotone string (a tokenizer may rewrite its tail)
        if stable.startswith(self.text):
            new = stable[len(self.text):]
            self.text = stable
        else:
            new = ""
        self.offsets.append(len(self.text))
        return new

    def finish(self) -> str:
        if self.finished:
            return ""
        self.finished = True
        full = self._tok.decode(self._ids)
        tail = full[len(self.text):] if full.startswith(self.text) else ""
        self.text += tail
        if self.offsets:
            self.offsets[-1] = len(self.text)
        return tail


def make_detokenizer(tokenizer, table: TokenTable | None):
    if table is not None and table.byte_level:
        return IncrementalDetokenizer(table)
    return GenericDetokenizer(tokenizer)
