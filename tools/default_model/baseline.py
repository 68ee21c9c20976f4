"""Decode-PPL baseline of the shipped default model, per platform (`ppl_baseline_<cpu|cuda>.json`
beside the checkpoint): fixed prompts, greedy decoding through the engine (`LLM`), exactly
`MAX_TOKENS` tokens each (EOS ignored), decode PPL = exp(-mean logprob of the generated tokens).

The regression test (tests/test_default_model_ppl.py) re-runs this on the CPU and compares the
aggregate decode PPL with `ppl_baseline_cpu.json` within `REL_TOLERANCE`: float differences across
CPUs / torch builds move logprobs by ~1e-6, but can flip a near-tied greedy token and change the rest
of that prompt's continuation; 8 prompts x 24 tokens keep such a flip within a few percent.
"""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path

PROMPTS = [
    "def fibonacci(n):",
    "import os\n\n\ndef list_python_files(root):",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):",
    "def read_lines(path):\n    with open(path) as f:",
    "    def __repr__(self):",
    "for i in range(10):",
    "if __name__ == \"__main__\":",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
]
MAX_TOKENS = 24
REL_TOLERANCE = 0.05       # |ppl / baseline - 1|
MIN_IDENTICAL_PROMPTS = 6  # of 8: prompts whose greedy tokens equal the baseline's


def decode_ppl(model_dir, device: str) -> dict:
    import torch

    from deepinfer_engine import LLM, SamplingParams
    t0 = time.time()
    llm = LLM(model=str(model_dir), device=device, max_num_seqs=len(PROMPTS), max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    per, total, count = [], 0.0, 0
    for prompt, o in zip(PROMPTS, outs, strict=True):
        lps = [float(x) for x in (o.token_logprobs or [])]
        total += sum(lps)
        count += len(lps)
        per.append({"prompt": prompt, "token_ids": o.token_ids, "text": o.text,
                    "decode_ppl": math.exp(-sum(lps) / max(1, len(lps)))})
    return {"device": device, "model_dir": str(model_dir), "max_tokens": MAX_TOKENS,
            "decode_ppl": math.exp(-total / max(1, count)), "tokens": count, "prompts": per,
            "rel_tolerance": REL_TOLERANCE, "min_identical_prompts": MIN_IDENTICAL_PROMPTS,
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "seconds": round(time.time() - t0, 2)}


def write_baseline(model_dir, device: str, out_dir=None) -> Path:
    res = decode_ppl(model_dir, device)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    path = Path(out_dir or model_dir) / f"ppl_baseline_{kind}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    return path


def compare(current: dict, baseline: dict) -> tuple[bool, str]:
    rel = current["decode_ppl"] / baseline["decode_ppl"] - 1
    same = sum(a["token_ids"] == b["token_ids"] for a, b in zip(current["prompts"], baseline["prompts"], strict=True))
    ok = abs(rel) <= baseline.get("rel_tolerance", REL_TOLERANCE) and \
        same >= baseline.get("min_identical_prompts", MIN_IDENTICAL_PROMPTS)
    msg = (f"decode PPL {current['decode_ppl']:.4f} vs baseline {baseline['decode_ppl']:.4f} "
           f"({rel:+.2%}, tolerance {baseline.get('rel_tolerance', REL_TOLERANCE):.0%}); "
           f"{same}/{len(baseline['prompts'])} prompts with identical greedy tokens")
    return ok, msg
