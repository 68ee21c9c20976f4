"""Engram compressed vocabulary: token id -> class of its normalised spelling.

Built on the CPU from a `tokenizers.Tokenizer`, one token at a time:
1. special tokens (added tokens marked special) keep a class of their own;
2. otherwise the token is decoded alone; a piece that is not valid UTF-8 on its own (the decoder
   yields U+FFFD for a partial byte sequence) keeps its raw vocabulary spelling, so distinct byte
   pieces never collapse;
3. the spelling is normalised with `normalizers.Sequence([NFKC, NFD, StripAccents, Lowercase,
   Replace([ \\t\\r\\n]+ -> " ")])` and tokens with equal normalised spellings share a class.
Classes are numbered by first occurrence in token-id order (deterministic).
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, normalizers


def engram_normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence([
        normalizers.NFKC(),
        normalizers.NFD(),
        normalizers.StripAccents(),
        normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
    ])


def token_class_key(tokenizer: Tokenizer, token_id: int, special_ids: set[int],
                    norm: normalizers.Normalizer) -> tuple[str, str]:
    raw = tokenizer.id_to_token(token_id)
    if token_id in special_ids:
        return ("special", raw)
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    if "\ufffd" in text and "\ufffd" not in (raw or ""):
        return ("raw", raw)
    return ("text", norm.normalize_str(text))


def build_compressed_vocab(tokenizer: Tokenizer) -> tuple[list[int], int]:
    """-> (map: token id -> compressed id, of length vocab size; number of classes)."""
    norm = engram_normalizer()
    special_ids = {tid for tid, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}
    classes: dict[tuple[str, str], int] = {}
    mapping = []
    for tid in range(tokenizer.get_vocab_size(with_added_tokens=True)):
        key = token_class_key(tokenizer, tid, special_ids, norm)
        mapping.append(classes.setdefault(key, len(classes)))
    return mapping, len(classes)


def padded_vocab_map(tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    """The map for a model of `vocab_size` rows: ids past the tokenizer get classes of their own."""
    mapping, n = build_compressed_vocab(tokenizer)
    if len(mapping) > vocab_size:
        raise ValueError(f"tokenizer has {len(mapping)} tokens, the model's vocab_size is {vocab_size}")
    return mapping + list(range(n, n + vocab_size - len(mapping)))
