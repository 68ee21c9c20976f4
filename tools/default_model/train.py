"""Train the embedded default model (preset `default`: a V4.1-architecture Python-code model with a
DSpark draft head) on the packed stdlib corpus, write it in HF layout, evaluate it, write its card.

    # the real run (one H200): fixed 2500 + 2500 steps, expected ~4-5 min of training and ~1 min of
    # evaluation; --time-budget-s caps training (step counts are lowered once, after calibration, if
    # they would not fit), --eval-budget-s caps the optional evaluation parts
    python tools/default_model/train.py --out $OUT/default --device cuda --time-budget-s 360
    # on a device machine that returns few files: write elsewhere, bring back one tar
    python3 tools/default_model/train.py --out /tmp/dm/default --device cuda --bundle $OUT/default_model.tar
    # CPU smoke run (a few steps on a tiny subset; what tests/test_train_default_model.py runs):
    python tools/default_model/train.py --out /tmp/default --smoke

Output: `--out` holds exactly what ships in deepinfer_model/default/ (config.json, safetensors,
generation_config.json, tokenizer.json, README.md = model card, ppl_baseline_{cpu,cuda}.json);
`--log-dir` (default `<out>-logs`) holds train_log.jsonl, run.json (every setting, the steps done
and the command that reproduces them), eval.json and eval.md.

Phases (all seeded; data order from tools/default_model/data.py; code in tools/default_model/phases.py):
1. target LM: next-token cross-entropy on packed `seq_len`-token chunks, AdamW + warm-up + cosine,
   bf16 autocast on CUDA, residual dropout, the indexer's distillation loss (its only gradient),
   auxiliary-loss-free MoE balancing (router selection bias), gradient clipping;
2. the target's weights are rounded to bf16 (the shipped function) and frozen; greedy
   continuations of train-chunk prompts are generated with it;
3. DSpark block (self-distillation): the draft learns the target's own greedy tokens at p+2..p+1+nextn
   from target features at <= p, on the generated continuations and on real text (rows kept only
   while the text follows the target's greedy path); Markov head on the teacher's previous token;
   confidence head: BCE on "draft j accepted" given drafts < j accepted (inputs detached).
`--time-budget-s` bounds phases 1-3 together: each phase runs its fixed step count unless the
measured step time says it would not fit, in which case the count is lowered once, right after
calibration, and logged (run.json "reproduce" gives the flags that repeat the run exactly).
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tools/: the default_model package

from default_model import card, modeling  # noqa: E402
from default_model import data as dmdata  # noqa: E402
from default_model.phases import bf16_round_, generate_draft_data, train_draft, train_target  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from deepinfer_model import V41ForCausalLM, get_preset, param_counts, save_checkpoint  # noqa: E402
from deepinfer_model.engram_vocab import padded_vocab_map  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="checkpoint dir (what ships in deepinfer_model/default)")
    ap.add_argument("--log-dir", type=Path, default=None, help="logs + eval (default: <out>-logs)")
    ap.add_argument("--bundle", type=Path, default=None,
                    help="also pack <out> and the logs into this .tar (rewritten after the checkpoint and after "
                         "every evaluation part; for machines that return few files)")
    ap.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-budget-s", type=float, default=360.0, help="wall-time bound of phases 1-3")
    ap.add_argument("--phase-split", default="0.62,0.10,0.28", help="budget fractions: LM, generation, draft")
    ap.add_argument("--no-calibrate", action="store_true", help="run exactly --steps / --draft-steps")
    ap.add_argument("--preset", default="default")
    # phase 1: target LM
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--final-lr-frac", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--indexer-loss-weight", type=float, default=1.0)
    ap.add_argument("--router-bias-rate", type=float, default=5e-3)
    # phase 2: greedy continuations for the draft
    ap.add_argument("--gen-seqs", type=int, default=2048)
    ap.add_argument("--gen-prompt-lens", default="64,160,288,96")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--gen-batch", type=int, default=512)
    # phase 3: draft block
    ap.add_argument("--draft-steps", type=int, default=2500)
    ap.add_argument("--draft-batch", type=int, default=64, help="generated sequences per step")
    ap.add_argument("--draft-real-batch", type=int, default=32, help="real-text chunks per step (0 = none)")
    ap.add_argument("--draft-real-len", type=int, default=256)
    ap.add_argument("--draft-anchors", type=int, default=48, help="anchors per sequence")
    ap.add_argument("--draft-lr", type=float, default=2e-3)
    ap.add_argument("--draft-warmup", type=int, default=50)
    ap.add_argument("--draft-weight-decay", type=float, default=0.01)
    # evaluation
    ap.add_argument("--eval-funcs", type=int, default=100)
    ap.add_argument("--eval-max-tokens", type=int, default=128)
    ap.add_argument("--eval-gen-tokens", type=int, default=96, help="greedy tokens per prompt for acceptance")
    ap.add_argument("--eval-spec-prompts", type=int, default=8, help="engine-path speculation check (CPU)")
    ap.add_argument("--eval-ppl-ctx", type=int, default=512)
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument("--eval-budget-s", type=float, default=90.0,
                    help="after training + this, the optional evaluation parts are skipped")
    # logging / small runs
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--val-every", type=int, default=250)
    ap.add_argument("--max-train-files", type=int, default=None)
    ap.add_argument("--max-held-out-files", type=int, default=None)
    ap.add_argument("--smoke", action="store_true", help="CPU smoke: tiny data, a few steps of every phase")
    return ap


SMOKE = dict(steps=12, batch=2, seq_len=64, warmup=3, gen_seqs=4, gen_prompt_lens="24,40", gen_tokens=12,
             gen_batch=4, draft_steps=6, draft_batch=2, draft_real_batch=2, draft_real_len=48, draft_anchors=8,
             draft_warmup=2, eval_funcs=4, eval_max_tokens=16, eval_gen_tokens=12, eval_spec_prompts=2,
             eval_ppl_ctx=64, log_every=2, val_every=6, max_train_files=12, max_held_out_files=2, device="cpu",
             lr=3e-3)


class Logger:
    def __init__(self, path: Path):
        self.f = path.open("w")
        self.t0 = time.time()

    def __call__(self, kind: str, **kv):
        rec = {"kind": kind, "t": round(time.time() - self.t0, 2), **kv}
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()
        shown = " ".join(f"{k}={_fmt(v)}" for k, v in kv.items())
        print(f"[{rec['t']:7.1f}s] {kind}: {shown}", flush=True)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    return str(v)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def write_bundle(path: Path | None, out_dir: Path, log_dir: Path) -> None:
    """<out>/ and <log-dir>/ as one tar (atomic rename), e.g. default/... and default-logs/...."""
    if path is None:
        return
    import tarfile
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        for d in (out_dir, log_dir):
            for f in sorted(d.iterdir()):
                if f.is_file():
                    tar.add(f, arcname=f"{d.name}/{f.name}")
    tmp.replace(path)


def reproduce_flags(args, lm: dict, gen: dict, draft: dict) -> str:
    flags = [f"--seed {args.seed}", f"--steps {lm['steps_done']}", f"--gen-seqs {gen['seqs']}",
             f"--draft-steps {draft['steps_done']}", "--no-calibrate"]
    if args.smoke:
        flags.append("--smoke")
    return " ".join(flags)


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.smoke:
        given = {a.dest for a in ap._actions if any(s in (argv or sys.argv[1:]) for s in a.option_strings)}
        for key, value in SMOKE.items():
            if key not in given:
                setattr(args, key, value)
    t_start = time.time()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out_dir = args.out
    log_dir = args.log_dir or out_dir.with_name(out_dir.name + "-logs")
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = Logger(log_dir / "train_log.jsonl")
    seed_everything(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_num_threads(min(torch.get_num_threads(), int(os.environ.get("DEEPINFER_TRAIN_THREADS", "1"))))
    split = [float(x) for x in args.phase_split.split(",")]
    corpus = dmdata.load_corpus()
    corpus = dmdata.subset(corpus, args.max_train_files, args.max_held_out_files)
    tok = Tokenizer.from_file(str(corpus.tokenizer_path))
    cfg = get_preset(args.preset)
    counts = param_counts(cfg)
    env = {"python": platform.python_version(), "torch": torch.__version__, "device": str(device),
           "device_name": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor(),
           "argv": sys.argv}
    log("start", **env, corpus=corpus.describe()["train_tokens"], params=counts.total)
    run = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "env": env,
           "corpus": corpus.describe(), "config": cfg.to_hf_dict()["text_config"], "params": vars(counts)}

    model = V41ForCausalLM(cfg, device=device, dtype=torch.float32)
    modeling.init_for_training(model, args.seed)
    model.set_engram_vocab_map(padded_vocab_map(tok, cfg.vocab_size))
    for name, p in model.named_parameters():
        p.requires_grad_(not name.endswith("e_score_correction_bias") and ".dspark." not in name)

    budget = args.time_budget_s
    lm = train_target(args, model, corpus, tok, device, log, t_start + budget * split[0])
    run["phase1_lm"] = lm
    # the draft learns the function that ships: round the target to bf16 first
    bf16_round_([p for n, p in model.named_parameters() if ".dspark." not in n])
    gen_deadline = max(time.time() + 5, t_start + budget * (split[0] + split[1]))
    # A failure in the draft phases must not lose the trained target: record it and ship what exists.
    gen = {"seqs": 0, "groups": 0, "seconds": 0.0}
    draft = {"steps_done": 0, "steps_requested": args.draft_steps, "seconds": 0.0}
    try:
        groups, gen = generate_draft_data(args, model, corpus, device, log, gen_deadline)
        run["phase2_generation"] = gen
        draft = train_draft(args, model, corpus, groups, device, log, t_start + budget)
        del groups
    except Exception:
        run.setdefault("errors", {})["draft_phases"] = traceback.format_exc()
        log("phase_failed", phase="draft", error=run["errors"]["draft_phases"].splitlines()[-1])
        for p in model.parameters():
            p.requires_grad_(False)
        model.eval()
    run["phase2_generation"] = gen
    run["phase3_draft"] = draft
    if device.type == "cuda":
        torch.cuda.empty_cache()
    bf16_round_(model.parameters())
    run["train_seconds"] = time.time() - t_start
    run["reproduce"] = f"python tools/default_model/train.py --out OUT --device {device.type} " + \
        reproduce_flags(args, lm, gen, draft)

    for stale in out_dir.glob("model*.safetensors*"):
        stale.unlink()
    save_checkpoint(model, out_dir)
    shutil.copyfile(corpus.tokenizer_path, out_dir / "tokenizer.json")
    sizes = {p.name: p.stat().st_size for p in sorted(out_dir.iterdir()) if p.is_file()}
    run["checkpoint"] = {"dir": str(out_dir), "files": sizes, "bytes": sum(sizes.values())}
    log("saved", dir=str(out_dir), bytes=sum(sizes.values()), seconds=time.time() - t_start)
    (log_dir / "run.json").write_text(json.dumps(run, indent=1, default=str) + "\n")
    (out_dir / "README.md").write_text(card.model_card(run, {}))   # rewritten with the evaluation below
    write_bundle(args.bundle, out_dir, log_dir)

    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()   # the engine sizes its KV pool from the free device memory
    if not args.skip_eval:
        from default_model.eval_model import evaluate_dir
        try:
            evaluate_dir(out_dir, log_dir, device=str(device), args=args, corpus=corpus, run=run, log=log,
                         deadline=time.time() + args.eval_budget_s,
                         on_save=lambda: write_bundle(args.bundle, out_dir, log_dir))
        except Exception:  # the checkpoint is already written; record and go on
            log("eval_failed", error=traceback.format_exc())
    (log_dir / "run.json").write_text(json.dumps(run, indent=1, default=str) + "\n")
    log("done", seconds=time.time() - t_start)
    write_bundle(args.bundle, out_dir, log_dir)
    if args.bundle is not None:
        log("bundle", path=str(args.bundle), bytes=args.bundle.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
