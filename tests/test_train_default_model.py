"""CPU smoke run of the default model's whole pipeline: tools/default_model/train.py --smoke trains a
few steps of every phase on a tiny corpus subset, writes the HF checkpoint + card + baselines +
eval, and the engine loads and generates from it (`LLM(model=dir)`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "default"
    # bf16 autocast on the CPU: the dtype paths of the CUDA run, without a GPU
    env = dict(os.environ, DEEPINFER_TRAIN_THREADS="1", PYTHONHASHSEED="0", DEEPINFER_TRAIN_AUTOCAST_CPU="1")
    proc = subprocess.run([sys.executable, str(ROOT / "tools/default_model/train.py"), "--out", str(out), "--smoke",
                           "--bundle", str(out.with_name("bundle.tar"))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, out.with_name("default-logs")


@pytest.mark.slow
def test_smoke_training_writes_a_loadable_checkpoint(smoke_run):
    out, logs = smoke_run
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors.index.json",
            "model-00001-of-00001.safetensors", "README.md", "ppl_baseline_cpu.json"} <= files
    assert sum(p.stat().st_size for p in out.iterdir()) <= 12 * 2**20
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2 and gen["bos_token_id"] == 1
    cfg = json.loads((out / "config.json").read_text())["text_config"]
    assert cfg["dspark_noise_token_id"] == 6 and cfg["nextn"] == 5 and cfg["tie_word_embeddings"]

    records = [json.loads(line) for line in (logs / "train_log.jsonl").read_text().splitlines()]
    lm = [r["loss"] for r in records if r["kind"] == "lm"]
    val = [r["held_out_loss"] for r in records if r["kind"] == "val"]
    assert lm[-1] < lm[0] - 0.3 and val[-1] < val[0], (lm, val)
    draft = [r["loss"] for r in records if r["kind"] == "draft"]
    assert draft[-1] < draft[0]
    run = json.loads((logs / "run.json").read_text())
    assert run["phase1_lm"]["steps_done"] == run["args"]["steps"] and "--no-calibrate" in run["reproduce"]

    ev = json.loads((logs / "eval.json").read_text())
    assert not ev["errors"], ev["errors"]
    assert ev["held_out_ppl"]["tokens"] > 0 and ev["function_completion"]["n"] == 4
    assert ev["dspark_acceptance"]["mean_acceptance_length"] >= 1.0
    assert ev["engine_path_speculation_cpu"]["steps"] > 0
    assert "Held-out perplexity" in (out / "README.md").read_text()
    import tarfile
    with tarfile.open(out.with_name("bundle.tar")) as tar:
        names = set(tar.getnames())
    assert {"default/model-00001-of-00001.safetensors", "default/README.md", "default-logs/eval.json",
            "default-logs/run.json"} <= names


@pytest.mark.slow
def test_engine_generates_from_the_smoke_checkpoint(smoke_run):
    import torch

    from deepinfer_engine import LLM, SamplingParams
    out, _ = smoke_run
    torch.set_num_threads(1)
    llm = LLM(model=str(out), device="cpu")
    res = llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                       use_tqdm=False)[0]
    assert res.finish_reason == "length" and len(res.token_ids) == 8 and isinstance(res.text, str)
    assert llm.engine.model_source == str(out)
