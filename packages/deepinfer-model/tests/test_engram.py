"""Acceptance 3 (Engram): normalisation classes on a real `tokenizers` BPE, hashing, and the
engine path's paged Engram-id plane against the reference."""

import copy

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from deepinfer_model.byte_level import bytes_to_unicode
from deepinfer_model.engram_vocab import build_compressed_vocab, padded_vocab_map
from deepinfer_model.modules.engram import PAD_ID, dense_windows, ngram_buckets
from deepinfer_model.testing import Driver, Seq, tiny_model

WORDS = ["Apple", "apple", "APPLE", "café", "cafe", "naïve", "naive", "über", "uber", "ﬁne", "fine", "world"]
CORPUS = [" ".join(WORDS)] * 60 + ["hello\t\tworld\n  x"] * 5
SPECIALS = ["<s>", "</s>", "<noise>"]


B2U = bytes_to_unicode()


@pytest.fixture(scope="module")
def bpe():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def cls_of(tok, mapping, text):
    tid = tok.token_to_id("".join(B2U[b] for b in text.encode()))
    assert tid is not None, f"{text!r} is not a token of the test BPE"
    return mapping[tid]


def test_normalisation_classes(bpe):
    mapping, n = build_compressed_vocab(bpe)
    assert len(mapping) == bpe.get_vocab_size() and n < len(mapping)
    # case and accents collapse (NFD + StripAccents + Lowercase), NFKC folds the ligature
    assert cls_of(bpe, mapping, " Apple") == cls_of(bpe, mapping, " apple") == cls_of(bpe, mapping, " APPLE")
    assert cls_of(bpe, mapping, " café") == cls_of(bpe, mapping, " cafe")
    assert cls_of(bpe, mapping, " naïve") == cls_of(bpe, mapping, " naive")
    assert cls_of(bpe, mapping, " über") == cls_of(bpe, mapping, " uber")
    assert cls_of(bpe, mapping, " ﬁne") == cls_of(bpe, mapping, " fine")
    # whitespace runs collapse to one space
    assert cls_of(bpe, mapping, "\t") == cls_of(bpe, mapping, " ") == cls_of(bpe, mapping, "\n")
    # distinct words stay distinct
    assert cls_of(bpe, mapping, " apple") != cls_of(bpe, mapping, " cafe")
    assert cls_of(bpe, mapping, " apple") != cls_of(bpe, mapping, "apple" if bpe.token_to_id("apple") else " world")
    # special tokens keep their own classes
    special = [bpe.token_to_id(s) for s in SPECIALS]
    assert all(mapping.count(mapping[i]) == 1 for i in special)
    # bytes that are not valid UTF-8 alone keep their raw spelling: all distinct
    lone = [bpe.token_to_id(B2U[b]) for b in range(128, 256)]
    assert all("\ufffd" in bpe.decode([i]) for i in lone)
    assert len({mapping[i] for i in lone}) == 128


def test_padded_map_and_deterministic(bpe):
    m1 = padded_vocab_map(bpe, 512)
    assert m1 == padded_vocab_map(bpe, 512) and len(m1) == 512
    assert len(set(m1[bpe.get_vocab_size():])) == 512 - bpe.get_vocab_size()


def test_ngram_hash_windows():
    cids = torch.tensor([5, 6, 7, 5, 6, 7])
    w = dense_windows(cids, 3)
    assert w[0].tolist() == [PAD_ID, PAD_ID, 5] and w[3].tolist() == [6, 7, 5]
    b = ngram_buckets(w, 1000)
    assert b.shape == (6, 2) and bool(((b >= 0) & (b < 1000)).all())
    assert b[4, 0] == b[1, 0] and b[5].tolist() == b[2].tolist()   # same n-gram, same bucket
    assert b[1, 0] != b[2, 0]


def test_engine_engram_plane_matches_reference_with_compressed_vocab():
    model = copy.deepcopy(tiny_model())
    model.set_engram_vocab_map(torch.arange(8192) % 97)     # heavy collisions: the map matters
    g = torch.Generator().manual_seed(3)
    seqs = [Seq(torch.randint(4, 8192, (n,), generator=g).tolist(), n) for n in (30, 12)]
    drv = Driver(model, num_blocks=16, block_size=8)
    drv.prefill(seqs, [13, 12])
    _, out = drv.prefill(seqs[:1], [17])
    for s in seqs:
        s.tokens.append(4)
    _, out2 = drv.decode(seqs, [[9], []])
    for i, s in enumerate(seqs):
        ref = model.reference_forward(torch.tensor(s.tokens + ([9] if i == 0 else [])), mode="bounded_replay",
                                      prompt_len=s.prompt_len, kv_quant=True)
        row = [0, 1, 2][i * 2] if i == 0 else 2
        lg = out2.logits[row]
        assert (lg - ref.logits[s.prompt_len - ref.logit_start]).abs().max() < 5e-2
    assert int(drv.cache.engram_ids.max()) < 97
