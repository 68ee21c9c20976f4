"""Shared fixtures of the engine tests.

`OracleDraft` replaces the draft head's proposals with the target's own greedy continuation
(optionally corrupted), so speculation paths see real, controllable acceptance. Correctness of
the engine never depends on the drafts (verification is exact); the oracle only makes acceptance
non-trivial: long accepted prefixes, stops inside accepted drafts, rejections.
"""

from __future__ import annotations

import pytest

from deepinfer_engine import LLM
from deepinfer_engine.speculation import DraftProposal, SpeculativeDecoder
from deepinfer_kernels.ops.verification import store_mtp_info


@pytest.fixture
def count_graph_runner_calls(monkeypatch):
    """count(*method names of DecodeGraphRunner) -> {name: calls so far}, counting from now on."""
    from deepinfer_engine.cuda_graphs import DecodeGraphRunner

    def count(*names: str) -> dict[str, int]:
        calls = dict.fromkeys(names, 0)
        for name in names:
            original = getattr(DecodeGraphRunner, name)

            def counted(self, *a, _original=original, _name=name, **kw):
                calls[_name] += 1
                return _original(self, *a, **kw)
            monkeypatch.setattr(DecodeGraphRunner, name, counted)
        return calls
    return count


@pytest.fixture(scope="session")
def tiny_llm() -> LLM:
    """The default (tiny) model on the CPU with small blocks and a small prefill budget, so that
    paging, chunked prefill and continuous batching are all exercised by short prompts."""
    # Fixed draft lengths: with variable-length verification, seeded sampling depends on timing.
    return LLM(device="cpu", block_size=16, max_num_batched_tokens=64, max_num_seqs=16, max_model_len=512,
               enable_mtp_varlen=False)



class OracleDraft:
    def __init__(self, sequences: list[list[int]], nextn: int, corrupt_every: int = 0):
        """sequences: full greedy token sequences (prompt + output); corrupt_every k > 0 replaces
        draft j of a proposal when (p + j) % k == 0, so some drafts are rejected mid-block."""
        self.nextn = nextn
        self.corrupt_every = corrupt_every
        # (position p of the final row, main token at p + 1) -> the next nextn tokens. A key shared by
        # two sequences only costs acceptance, never correctness.
        self.table: dict[tuple[int, int], list[int]] = {}
        for seq in sequences:
            for p in range(len(seq) - 1):
                cont = seq[p + 2: p + 2 + nextn]
                self.table[(p, seq[p + 1])] = cont + [0] * (nextn - len(cont))
        self.num_hits = 0

    def install(self, monkeypatch) -> None:
        original = SpeculativeDecoder.propose
        oracle = self

        def propose(spec, cache, final_positions, main_tokens, block_tables, block_size, seeds, is_greedy,
                    all_greedy, write_slots, state_slots=None):
            proposal = original(spec, cache, final_positions, main_tokens, block_tables, block_size, seeds,
                                is_greedy, all_greedy, write_slots, state_slots)
            tokens = proposal.token_ids.clone()
            for r in range(tokens.shape[0]):
                p, m = int(final_positions[r]), int(main_tokens[r])
                cont = oracle.table.get((p, m))
                if cont is None:
                    continue
                oracle.num_hits += 1
                for j in range(spec.nextn):
                    bad = oracle.corrupt_every and (p + j) % oracle.corrupt_every == 0
                    tokens[r, j] = (cont[j] + 1) % 8000 if bad else cont[j]
            store_mtp_info(write_slots, tokens, spec.pool, confidence=proposal.confidence)
            return DraftProposal(tokens, proposal.confidence)

        monkeypatch.setattr(SpeculativeDecoder, "propose", propose)


@pytest.fixture
def make_oracle(monkeypatch):
    """make_oracle(sequences, nextn, corrupt_every=0) -> an installed OracleDraft."""
    def make(sequences: list[list[int]], nextn: int, corrupt_every: int = 0) -> OracleDraft:
        oracle = OracleDraft(sequences, nextn, corrupt_every)
        oracle.install(monkeypatch)
        return oracle
    return make
