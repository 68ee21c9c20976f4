"""Pack the default model's corpus into `tools/data/` so that training is bit-for-bit reproducible on
any machine, whatever Python (and so whatever standard library) it runs.

    python tools/default_model/pack_stdlib_corpus.py            # from a Python 3.11.7 interpreter (the tokenizer's corpus)

Writes, for the running interpreter's stdlib (split by tools/default_model/stdlib_corpus.py, files with identical
contents kept once, first by path):
- `stdlib-<ver>-train.u16.zlib`: every train file tokenized with the shipped tokenizer (no special
  tokens), concatenated, little-endian uint16, zlib-compressed (zlib: present in every Python build);
- `stdlib-<ver>-heldout.json.zlib`: the held-out files as text (evaluation tokenizes them itself);
- `stdlib-<ver>-manifest.json`: Python version, tokenizer sha256, per file (path, module, sha256,
  bytes, tokens), the sha256 of each data file. `tools/default_model/data.py` checks all of it and
  fails loudly on any mismatch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zlib
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))   # tools/: the default_model package
from default_model.stdlib_corpus import corpus_files, split, stdlib_root  # noqa: E402

DEFAULT_TOKENIZER = HERE.parents[1] / "packages/deepinfer-model/src/deepinfer_model/default/tokenizer.json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=HERE.parent / "data")
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    args = ap.parse_args()
    ver = sys.version.split()[0]
    tok = Tokenizer.from_file(str(args.tokenizer))
    root = stdlib_root()
    train, held = split(corpus_files())
    seen: dict[str, str] = {}
    manifest = {"python": ver, "stdlib_root": str(root),
                "tokenizer_sha256": sha256(args.tokenizer.read_bytes()),
                "vocab_size": tok.get_vocab_size(), "train": [], "held_out": [], "duplicates_dropped": []}
    arrays, held_files = [], []
    for side, files in (("train", train), ("held_out", held)):
        for f in files:
            text = f.read()
            digest = sha256(text.encode("utf-8"))
            rel = str(f.path.relative_to(root))
            if digest in seen:
                manifest["duplicates_dropped"].append({"path": rel, "same_as": seen[digest]})
                continue
            seen[digest] = rel
            ids = tok.encode(text, add_special_tokens=False).ids
            entry = {"path": rel, "module": f.module, "sha256": digest,
                     "n_bytes": len(text.encode("utf-8")), "n_tokens": len(ids)}
            manifest[side].append(entry)
            if side == "train":
                arrays.append(np.asarray(ids, dtype="<u2"))
            else:
                held_files.append({"path": rel, "module": f.module, "text": text})
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"stdlib-{ver}"
    tokens = np.concatenate(arrays).astype("<u2").tobytes()
    held_json = json.dumps({"files": held_files}, sort_keys=True).encode()
    payloads = {"train_tokens": (f"{stem}-train.u16.zlib", tokens),
                "held_out_text": (f"{stem}-heldout.json.zlib", held_json)}
    manifest["data_files"] = {}
    blobs = {}
    for key, (name, payload) in payloads.items():
        blob = zlib.compress(payload, 9)
        (args.out / name).write_bytes(blob)
        blobs[key] = (name, blob)
        # the payload hash identifies the data; the compressed bytes may differ across zlib versions
        manifest["data_files"][key] = {"name": name, "payload_sha256": sha256(payload), "bytes": len(blob)}
    manifest["train_tokens_total"] = len(tokens) // 2
    (args.out / f"{stem}-manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"python {ver}: train {len(manifest['train'])} files, {len(tokens) // 2} tokens; "
          f"held-out {len(manifest['held_out'])} files; dropped {len(manifest['duplicates_dropped'])} duplicates")
    for name, blob in blobs.values():
        print(f"  {name}: {len(blob) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
