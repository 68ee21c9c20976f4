"""The default model's data: the packed stdlib corpus in tools/data (see tools/default_model/pack_stdlib_corpus.py),
verified against its manifest, and deterministic training batches.

Training stream: each epoch permutes the train files (seeded by (seed, epoch)), concatenates
`<|bos|> file <|eos|>` for each, starts at a random offset < seq_len + 1 and cuts the stream into
`seq_len + 1`-token chunks (inputs = chunk[:-1], targets = chunk[1:]) in a seeded random order.
Batches take consecutive chunks, continuing into the next epoch; the same (seed, seq_len, batch)
gives the same batches on every machine.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "packages/deepinfer-model/src/deepinfer_model/default/tokenizer.json"
MANIFEST = "stdlib-3.11.7-manifest.json"


class CorpusError(RuntimeError):
    """The packed corpus or the tokenizer does not match the manifest."""


@dataclass
class Corpus:
    manifest: dict
    train_docs: list[np.ndarray]          # uint16 token ids per train file (no special tokens)
    held_out: list[dict]                  # {"path", "module", "text"} per held-out file, manifest order
    tokenizer_path: Path
    train_index: list[int] | None = None  # manifest["train"] entries of train_docs (None = all)

    @property
    def train_tokens(self) -> int:
        return sum(len(d) for d in self.train_docs)

    def describe(self) -> dict:
        m = self.manifest
        train = m["train"] if self.train_index is None else [m["train"][i] for i in self.train_index]
        held = {h["path"] for h in self.held_out}
        held_entries = [f for f in m["held_out"] if f["path"] in held]
        return {"python": m["python"], "train_files": len(train), "train_tokens": self.train_tokens,
                "train_bytes": sum(f["n_bytes"] for f in train), "subset": self.train_index is not None,
                "held_out_files": len(held_entries), "held_out_bytes": sum(f["n_bytes"] for f in held_entries),
                "held_out_modules": sorted({f["module"] for f in held_entries}),
                "duplicates_dropped": len(m["duplicates_dropped"]), "tokenizer_sha256": m["tokenizer_sha256"],
                "data_files": {k: v["name"] for k, v in m["data_files"].items()}}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_corpus(data_dir: Path = DATA_DIR, tokenizer_path: Path = TOKENIZER, manifest_name: str = MANIFEST) -> Corpus:
    """Load and verify everything; any mismatch raises CorpusError naming the file."""
    mpath = data_dir / manifest_name
    if not mpath.is_file():
        raise CorpusError(f"{mpath}: corpus manifest missing (run tools/default_model/pack_stdlib_corpus.py under Python 3.11.7)")
    manifest = json.loads(mpath.read_text())
    tok_sha = _sha256(tokenizer_path.read_bytes())
    if tok_sha != manifest["tokenizer_sha256"]:
        raise CorpusError(f"{tokenizer_path}: sha256 {tok_sha} != {manifest['tokenizer_sha256']} the corpus was "
                          "tokenized with; re-pack the corpus (tools/default_model/pack_stdlib_corpus.py)")
    payloads = {}
    for key, info in manifest["data_files"].items():
        path = data_dir / info["name"]
        if not path.is_file():
            raise CorpusError(f"{path}: data file missing")
        payload = zlib.decompress(path.read_bytes())
        if _sha256(payload) != info["payload_sha256"]:
            raise CorpusError(f"{path}: content sha256 mismatch (expected {info['payload_sha256']})")
        payloads[key] = payload
    tokens = np.frombuffer(payloads["train_tokens"], dtype="<u2").astype(np.uint16)
    if len(tokens) != manifest["train_tokens_total"]:
        raise CorpusError(f"train tokens: {len(tokens)} != manifest {manifest['train_tokens_total']}")
    docs, off = [], 0
    for f in manifest["train"]:
        docs.append(tokens[off: off + f["n_tokens"]])
        off += f["n_tokens"]
    if off != len(tokens):
        raise CorpusError("train tokens: per-file counts do not add up to the data file")
    held = json.loads(payloads["held_out_text"])["files"]
    if [h["path"] for h in held] != [f["path"] for f in manifest["held_out"]]:
        raise CorpusError("held-out files differ from the manifest")
    for h, f in zip(held, manifest["held_out"], strict=True):
        if _sha256(h["text"].encode("utf-8")) != f["sha256"]:
            raise CorpusError(f"held-out {h['path']}: sha256 mismatch")
    return Corpus(manifest, docs, held, tokenizer_path)


def subset(corpus: Corpus, max_train_files: int | None, max_held_out_files: int | None) -> Corpus:
    """A deterministic small corpus (smoke runs): every k-th train file, the first held-out files."""
    docs, held, index = corpus.train_docs, corpus.held_out, corpus.train_index
    if max_train_files is not None and max_train_files < len(docs):
        step = len(docs) / max_train_files
        index = [int(i * step) for i in range(max_train_files)]
        docs = [docs[i] for i in index]
    if max_held_out_files is not None:
        held = held[:max_held_out_files]
    return Corpus(corpus.manifest, docs, held, corpus.tokenizer_path, index)


class BatchStream:
    """Deterministic [batch, seq_len + 1] int64 chunks over epochs of the train stream."""

    def __init__(self, docs: list[np.ndarray], seq_len: int, batch: int, seed: int, bos: int, eos: int):
        self.docs, self.seq_len, self.batch, self.seed = docs, seq_len, batch, seed
        self.bos, self.eos = bos, eos
        self.epoch = -1
        self._chunks = np.zeros((0, seq_len + 1), dtype=np.int64)
        self._next = 0
        self.chunks_served = 0

    def _epoch_chunks(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.docs))
        parts = []
        for i in order:
            parts += [np.array([self.bos], np.int64), self.docs[i].astype(np.int64), np.array([self.eos], np.int64)]
        stream = np.concatenate(parts)
        n1 = self.seq_len + 1
        off = int(rng.integers(0, n1))
        n = (len(stream) - off) // n1
        if n <= 0:
            raise ValueError(f"corpus of {len(stream)} tokens is shorter than one sequence of {n1}")
        chunks = stream[off: off + n * n1].reshape(n, n1)
        return chunks[rng.permutation(n)]

    @property
    def chunks_per_epoch(self) -> int:
        total = sum(len(d) + 2 for d in self.docs)
        return total // (self.seq_len + 1)

    def next_batch(self) -> np.ndarray:
        out = []
        need = self.batch
        while need > 0:
            if self._next >= len(self._chunks):
                self.epoch += 1
                self._chunks, self._next = self._epoch_chunks(self.epoch), 0
            take = min(need, len(self._chunks) - self._next)
            out.append(self._chunks[self._next: self._next + take])
            self._next += take
            need -= take
        self.chunks_served += self.batch
        return np.concatenate(out)


def held_out_token_chunks(texts: list[str], tokenizer, bos: int, eos: int, ctx: int,
                          overlap: int) -> tuple[list[np.ndarray], list[int]]:
    """Strided evaluation windows over each held-out file (`<|bos|> text <|eos|>`): windows of at most
    `ctx` tokens advancing by `ctx - overlap`; every token after the first is scored exactly once,
    with >= `overlap` tokens of context once past the first window. -> (windows, first scored index
    within each window)."""
    windows, first_scored = [], []
    stride = ctx - overlap
    for text in texts:
        ids = np.array([bos] + tokenizer.encode(text, add_special_tokens=False).ids + [eos], dtype=np.int64)
        start = 0
        while True:
            end = min(start + ctx, len(ids))
            windows.append(ids[start:end])
            first_scored.append(1 if start == 0 else overlap)
            if end == len(ids):
                break
            start += stride
    return windows, first_scored
