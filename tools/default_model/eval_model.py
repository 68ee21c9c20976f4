"""Evaluate a default-model checkpoint (held-out PPL, function-completion parse rate through the engine,
DSpark acceptance and confidence calibration, engine-path speculation check) and write eval.json +
eval.md; also rewrites the decode-PPL baselines and, with `--card`, the model card. The definitions
are in tools/default_model/evaluation.py.

    python tools/default_model/eval_model.py --model packages/deepinfer-model/src/deepinfer_model/default \\
        --out /tmp/eval --device cpu

The training script calls `evaluate_dir` at its end (same code, same numbers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tools/: the default_model package

from default_model import baseline as dmbaseline  # noqa: E402
from default_model import card as dmcard  # noqa: E402
from default_model import data as dmdata  # noqa: E402
from default_model import evaluation as ev  # noqa: E402

DEFAULTS = dict(eval_funcs=100, eval_max_tokens=128, eval_gen_tokens=96, eval_spec_prompts=8, eval_ppl_ctx=512)


def _print_log(kind, **kv):
    print(f"{kind}: " + " ".join(f"{k}={v}" for k, v in kv.items()), flush=True)


def evaluate_dir(model_dir: Path, log_dir: Path, device: str, args=None, corpus=None, run: dict | None = None,
                 log=_print_log, write_card: bool = True, write_baselines: bool = True,
                 deadline: float | None = None, on_save=None) -> dict:
    """Every part is recorded separately (an error in one is logged in result["errors"] and the rest
    still runs). Past `deadline` (time.time()), the optional parts (CUDA baseline, engine-path
    speculation check) are skipped and listed in result["skipped"]."""
    from deepinfer_model import load_checkpoint
    opts = {k: getattr(args, k, v) if args is not None else v for k, v in DEFAULTS.items()}
    dev = torch.device(device)
    corpus = corpus or dmdata.load_corpus()
    t0 = time.time()
    result: dict = {"model_dir": str(model_dir), "device": device, "options": opts, "errors": {}, "skipped": []}

    def late(name) -> bool:
        if deadline is not None and time.time() > deadline:
            result["skipped"].append(name)
            log("eval_skip", part=name, reason="eval deadline")
            return True
        return False
    log_dir.mkdir(parents=True, exist_ok=True)

    def save():
        (log_dir / "eval.json").write_text(json.dumps(result, indent=1) + "\n")
        (log_dir / "eval.md").write_text(dmcard.eval_markdown(result))
        if write_card:   # rewritten after every part: a run cut short still leaves a card
            (model_dir / "README.md").write_text(dmcard.model_card(run or {}, result))
        if on_save is not None:
            on_save()

    def step(name, fn):
        t = time.time()
        try:
            result[name] = fn()
            log("eval", part=name, seconds=round(time.time() - t, 1), **_headline(name, result[name]))
        except Exception:
            result["errors"][name] = traceback.format_exc()
            log("eval_error", part=name, error=result["errors"][name].splitlines()[-1])
        save()

    model = load_checkpoint(model_dir, device=dev, dtype=torch.float32)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    texts = [h["text"] for h in corpus.held_out]
    if write_baselines:   # first: the CPU regression test needs it
        step("ppl_baseline_cpu", lambda: _baseline(model_dir, "cpu"))
    step("held_out_ppl", lambda: ev.held_out_ppl(model, texts, tok, dev, ctx=opts["eval_ppl_ctx"],
                                                 overlap=opts["eval_ppl_ctx"] // 4))
    funcs = ev.function_prompts(corpus.held_out, n=opts["eval_funcs"])
    prompts = [f["context"] + f["header"] for f in funcs]
    prompt_ids = [tok.encode(p, add_special_tokens=False).ids for p in prompts]   # what the engine encodes
    acc_holder: dict = {}

    def acceptance():
        res = ev.dspark_acceptance(model, prompt_ids, opts["eval_gen_tokens"], dev)
        acc_holder["continuations"] = res.pop("continuations")
        return res

    step("dspark_acceptance", acceptance)
    gen_holder: dict = {}

    def completions():
        try:
            gen = ev.engine_completions(model_dir, prompts, device, opts["eval_max_tokens"])
        except Exception:
            if dev.type == "cpu":
                raise
            result["errors"]["engine_" + device] = traceback.format_exc()
            log("eval_error", part="engine on " + device, error="falling back to the CPU engine")
            gen = ev.engine_completions(model_dir, prompts, "cpu", opts["eval_max_tokens"])
        gen_holder.update(gen)
        return ev.completion_eval(funcs, gen)

    step("function_completion", completions)
    if gen_holder and acc_holder:
        def agreement():
            if gen_holder["prompt_token_ids"] != prompt_ids:
                raise RuntimeError("the engine encoded the prompts differently")
            return ev.prefix_agreement(gen_holder["token_ids"], acc_holder["continuations"],
                                       min(32, opts["eval_gen_tokens"], opts["eval_max_tokens"]))
        step("engine_vs_exact_greedy", agreement)
    if write_baselines and dev.type == "cuda" and not late("ppl_baseline_cuda"):
        step("ppl_baseline_cuda", lambda: _baseline(model_dir, "cuda"))
    if opts["eval_spec_prompts"] > 0 and not late("engine_path_speculation_cpu"):
        def spec():
            torch.manual_seed(0)
            cpu_model = load_checkpoint(model_dir, device="cpu")
            res = ev.engine_path_speculation(cpu_model, prompt_ids[: opts["eval_spec_prompts"]], 48)
            res.pop("generated")
            return res
        step("engine_path_speculation_cpu", spec)
    result["seconds"] = time.time() - t0
    save()
    return result


def _baseline(model_dir: Path, device: str) -> dict:
    path = dmbaseline.write_baseline(model_dir, device)
    res = json.loads(path.read_text())
    return {"file": path.name, "decode_ppl": res["decode_ppl"], "tokens": res["tokens"], "seconds": res["seconds"]}


def _headline(name: str, res) -> dict:
    if not isinstance(res, dict):
        return {}
    keys = {"held_out_ppl": ("ppl", "bits_per_byte", "tokens"), "function_completion": ("parse_rate", "n", "device"),
            "dspark_acceptance": ("mean_acceptance_length", "walk_mean_acceptance_length", "positions"),
            "engine_vs_exact_greedy": ("identical", "of", "mean_common_prefix"),
            "engine_path_speculation_cpu": ("mean_acceptance_length", "steps")}.get(name, ("decode_ppl",))
    out = {k: res.get(k) for k in keys if k in res}
    if name == "dspark_acceptance" and "calibration" in res:
        out["brier"] = res["calibration"].get("brier")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="where eval.json / eval.md go")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--card", action="store_true", help="rewrite README.md beside the checkpoint (needs --run)")
    ap.add_argument("--run", type=Path, default=None, help="run.json of the training run (for the card)")
    ap.add_argument("--baselines", action="store_true", help="rewrite ppl_baseline_*.json beside the checkpoint")
    for key, value in DEFAULTS.items():
        ap.add_argument("--" + key.replace("_", "-"), type=int, default=value)
    args = ap.parse_args()
    run = json.loads(args.run.read_text()) if args.run else None
    res = evaluate_dir(args.model, args.out, args.device, args=args, run=run, write_card=args.card,
                       write_baselines=args.baselines)
    print(json.dumps({k: _headline(k, v) for k, v in res.items() if isinstance(v, dict)}, indent=1))
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
