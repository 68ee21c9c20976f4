import pytest
from deepinfer_engine import LLM


@pytest.fixture(scope="session")
def tiny_llm() -> LLM:
    """The default (tiny) model on the CPU with small blocks and a small prefill budget, so that
    paging, chunked prefill and continuous batching are all exercised by short prompts."""
    return LLM(device="cpu", block_size=16, max_num_batched_tokens=64, max_num_seqs=16, max_model_len=512)
