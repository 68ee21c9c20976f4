"""Issue 9: prompt logprobs = the exact dense forward's log-softmax at every prompt position."""

import torch

from deepinfer_engine import LLM, SamplingParams


def test_prompt_logprobs_match_the_exact_forward():
    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=128, max_num_seqs=8, max_model_len=256,
              num_speculative_tokens=0)
    prompts = [[5, 6, 7, 900, 33, 1200, 8, 9, 10, 11], [42], [100, 200]]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(
        temperature=0, max_tokens=2, prompt_logprobs=3), use_tqdm=False)
    model = llm.engine.model
    for prompt, out in zip(prompts, outs):
        assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
        assert len(out.prompt_top_logprobs) == len(prompt) and out.prompt_top_logprobs[0] is None
        if len(prompt) < 2:
            continue
        ids = torch.tensor(prompt)
        lp = torch.log_softmax(model.reference_forward(ids, mode="exact", kv_quant=True).logits.float(), -1)
        want = lp[:-1].gather(1, ids[1:, None]).squeeze(1).tolist()
        assert out.prompt_logprobs[1:] == want
        for t in range(1, len(prompt)):
            top = out.prompt_top_logprobs[t]
            assert len(top) == 3 and list(top.values()) == sorted(top.values(), reverse=True)
            assert all(-9999.0 <= v <= 0.0 for v in top.values())
            assert max(top.values()) >= out.prompt_logprobs[t] - 1e-6
    # independent of the batch: the same request alone gives the same values
    alone = llm.generate(prompt_token_ids=[prompts[0]], sampling_params=SamplingParams(
        temperature=0, max_tokens=2, prompt_logprobs=0), use_tqdm=False)[0]
    assert alone.prompt_logprobs == outs[0].prompt_logprobs and alone.prompt_top_logprobs is None
