"""Train the default model's byte-level BPE tokenizer on the train split of the stdlib corpus.

    python tools/default_model/train_tokenizer.py --out packages/deepinfer-model/src/deepinfer_model/default/tokenizer.json

Deterministic for a given corpus (the BPE trainer breaks ties by byte order). The special tokens
take ids 0..6 in the order of SPECIAL_TOKENS; the DSpark noise token is `<|noise|>`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tools/: the default_model package
from default_model.stdlib_corpus import corpus_files, split  # noqa: E402

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|noise|>"]
DEFAULT_VOCAB_SIZE = 8192


def train_tokenizer(texts: list[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    args = parser.parse_args()
    train, _ = split(corpus_files())
    tokenizer = train_tokenizer([f.read() for f in train], args.vocab_size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.out))
    print(f"wrote {args.out}: vocab {tokenizer.get_vocab_size()}, trained on {len(train)} files")


if __name__ == "__main__":
    main()
