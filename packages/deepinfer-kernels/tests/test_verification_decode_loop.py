"""Multi-step speculative decoding with a toy model, through every op of the sampler path.

Each step: read drafts from the MTP pool -> target probs per row -> verify_and_sample ->
append accepted drafts (stop at VERIFIED_END) + main token -> draft a new block from the main
token with the DRAFT stream -> store it in the pool. The toy "model" is a fixed bigram table, so
the target distribution of a row depends only on its input token and position.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.sampling import random_sampling
from deepinfer_kernels.ops.verification import (
    VERIFIED_END,
    MtpInfoPool,
    mtp_info_read_rows,
    read_mtp_info,
    store_mtp_info,
    verify_and_sample,
)

VOCAB, NUM_SEQS, STEPS_TOKENS = 40, 64, 24
_g = torch.Generator().manual_seed(1234)
W_TARGET = torch.randn(VOCAB, VOCAB, generator=_g) * 2.0
W_DRAFT = W_TARGET + torch.randn(VOCAB, VOCAB, generator=_g) * 0.7  # a decent but imperfect drafter


def target_probs(tokens: torch.Tensor, positions: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    logits = W_TARGET[tokens] + torch.sin(positions.double().unsqueeze(1) * 0.37 + torch.arange(VOCAB)).float()
    probs = torch.softmax(logits, 1)
    one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(1, keepdim=True), 1.0)
    return torch.where(greedy.unsqueeze(1), one_hot, probs)


def draft_probs(tokens: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    logits = W_DRAFT[tokens]
    probs = torch.softmax(logits, 1)
    one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(1, keepdim=True), 1.0)
    return torch.where(greedy.unsqueeze(1), one_hot, probs)


def generate(seq_ids: list[int], nextn: int, greedy_all: bool, batches: list[list[int]],
             stats: dict | None = None) -> dict[int, list[int]]:
    """Decode every sequence to STEPS_TOKENS tokens, running the given batches in turn each step."""
    seeds = {i: (i * 7919 + 13) for i in seq_ids}
    greedy_of = {i: greedy_all or i % 4 == 0 for i in seq_ids}
    out = {i: [i % VOCAB] for i in seq_ids}            # the "prompt": one token
    has_block = dict.fromkeys(seq_ids, False)
    pool = MtpInfoPool.allocate(NUM_SEQS, max(nextn, 1), prob_width=VOCAB)
    while any(len(out[i]) < STEPS_TOKENS for i in seq_ids):
        for batch in batches:
            batch = [i for i in batch if len(out[i]) < STEPS_TOKENS]
            if not batch:
                continue
            slots = torch.tensor([i + 1 for i in batch], dtype=torch.int32)
            seqlens = torch.tensor([1 + (nextn if has_block[i] else 0) for i in batch], dtype=torch.int32)
            ftp = (torch.cumsum(seqlens, 0) - seqlens).to(torch.int32)
            total_q = int(seqlens.sum())
            read_rows = mtp_info_read_rows(slots, ftp, seqlens, total_q, max(nextn, 1))
            drafts, q = read_mtp_info(read_rows, pool)
            # Row inputs: the last committed token, then the drafts (= what each previous row checks).
            inputs, positions = [], []
            for b, i in enumerate(batch):
                n0 = len(out[i]) - 1
                s = int(seqlens[b])
                inputs += [out[i][-1]] + drafts[int(ftp[b]):int(ftp[b]) + s - 1].tolist()
                positions += list(range(n0, n0 + s))
            inputs_t, pos_t = torch.tensor(inputs), torch.tensor(positions)
            greedy = torch.tensor([greedy_of[i] for i in batch])
            row_greedy = torch.repeat_interleave(greedy, seqlens.long())
            res = verify_and_sample(target_probs(inputs_t, pos_t, row_greedy), drafts, q,
                                    torch.tensor([seeds[i] for i in batch], dtype=torch.int64), pos_t,
                                    ftp, seqlens, greedy)
            mains = res.token_ids.tolist()
            if stats is not None:
                stats["accepted"] = stats.get("accepted", 0) + int(res.num_accepted.sum())
                stats["verified"] = stats.get("verified", 0) + int(res.num_verified.sum())
            for b, i in enumerate(batch):
                first = int(ftp[b])
                for t in res.verified_token_ids[first:first + int(seqlens[b])].tolist():
                    if t == VERIFIED_END:  # terminator, not a filter
                        break
                    out[i].append(t)
                out[i].append(mains[b])
            if nextn == 0:
                continue
            # Draft the next block from each main token: draft j is the token at position len + j.
            prev = res.token_ids.long()
            block_ids, block_q = [], []
            for j in range(nextn):
                qj = draft_probs(prev, greedy)
                pos_j = torch.tensor([len(out[i]) + j for i in batch])
                dj = random_sampling(qj, torch.tensor([seeds[i] for i in batch], dtype=torch.int64), pos_j, True)
                block_ids.append(dj)
                block_q.append(qj)
                prev = dj
            store_mtp_info(slots, torch.stack(block_ids, 1), pool, draft_probs=torch.stack(block_q, 1))
            for i in batch:
                has_block[i] = True
    return {i: out[i][:STEPS_TOKENS] for i in seq_ids}


def chunks(order: list[int], size: int) -> list[list[int]]:
    return [order[k:k + size] for k in range(0, len(order), size)]


def plain_greedy(i: int) -> list[int]:
    toks = [i % VOCAB]
    while len(toks) < STEPS_TOKENS:
        p = target_probs(torch.tensor([toks[-1]]), torch.tensor([len(toks) - 1]), torch.tensor([True]))
        toks.append(int(p.argmax()))
    return toks


def test_greedy_speculation_is_token_identical_to_no_speculation():
    seqs = list(range(16))
    expected = {i: plain_greedy(i) for i in seqs}
    for nextn in (0, 1, 3, 5):
        assert generate(seqs, nextn, True, [seqs]) == expected, nextn


def test_seeded_sampling_identical_across_batch_sizes_and_orders():
    seqs = list(range(NUM_SEQS))
    reference = generate(seqs, 3, False, [seqs])
    perm = torch.randperm(NUM_SEQS, generator=torch.Generator().manual_seed(0)).tolist()
    for size in (7, 64):
        assert generate(seqs, 3, False, chunks(perm, size)) == reference, size
    alone = perm[:12]  # batch size 1: each sequence run by itself (a subset keeps the test quick)
    assert generate(alone, 3, False, chunks(alone, 1)) == {i: reference[i] for i in alone}


def test_drafts_are_accepted_in_the_loop():
    """The invariance above is not vacuous: drafts are verified and a good share accepted."""
    seqs = list(range(16))
    for greedy in (True, False):
        stats: dict = {}
        generate(seqs, 3, greedy, [seqs], stats)
        assert stats["verified"] > 100
        assert 0.2 < stats["accepted"] / stats["verified"] <= 1.0, stats
