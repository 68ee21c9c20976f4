"""Train the embedded default model (preset `default`: a V4.1-architecture Python-code model with a
DSpark draft head) on the packed stdlib corpus, write it in HF layout, evaluate it, write its card.

    # the real run (one H200): fixed 2500 + 2500 steps, expected ~4-5 min of training and ~1 min of
    # evaluation; --time-budget-s caps training (step counts are lowered once, after calibration, if
    # they would not fit), --eval-budget-s caps the optional evaluation parts
    python tools/train_default_model.py --out $OUT/default --device cuda --time-budget-s 360
    # on a device machine that returns few files: write elsewhere, bring back one tar
    python3 tools/train_default_model.py --out /tmp/dm/default --device cuda --bundle $OUT/default_model.tar
    # CPU smoke run (a few steps on a tiny subset; what tests/test_train_default_model.py runs):
    python tools/train_default_model.py --out /tmp/default --smoke

Output: `--out` holds exactly what ships in deepinfer_model/default/ (config.json, safetensors,
generation_config.json, tokenizer.json, README.md = model card, ppl_baseline_{cpu,cuda}.json);
`--log-dir` (default `<out>-logs`) holds train_log.jsonl, run.json (every setting, the steps done
and the command that reproduces them), eval.json and eval.md.

Phases (all seeded; data order from tools/default_model/data.py):
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
import math  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from default_model import card, modeling  # noqa: E402
from default_model import data as dmdata  # noqa: E402
from default_model.modeling import autocast  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from deepinfer_model import V41ForCausalLM, get_preset, param_counts, save_checkpoint  # noqa: E402
from deepinfer_model.engram_vocab import padded_vocab_map  # noqa: E402
from deepinfer_model.training import batched_forward  # noqa: E402


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


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(array)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def bf16_round_(params) -> None:
    with torch.no_grad():
        for p in params:
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


# ------------------------------------------------------------------------------------ phase 1

def held_out_val_windows(corpus, tok, cfg, ctx, max_windows=64):
    texts = [h["text"] for h in corpus.held_out]
    ws, firsts = dmdata.held_out_token_chunks(texts, tok, cfg.bos_token_id, cfg.eos_token_id, ctx, ctx // 4)
    return ws[:max_windows], firsts[:max_windows]


def val_loss(model, windows, firsts, device, batch=32) -> float:
    nll, n = modeling.teacher_forced_nll(model, windows, firsts, device, batch)
    return nll / max(1, n)


def plan_steps(requested, done, per_step_s, remaining_s, calibrate):
    if not calibrate or per_step_s <= 0:
        return requested
    fit = done + int(0.95 * remaining_s / per_step_s)
    return max(done + 1, min(requested, fit))


def train_target(args, model, corpus, tok, device, log, deadline) -> dict:
    cfg = model.config
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(modeling.param_groups(params, args.weight_decay), lr=args.lr, betas=(0.9, 0.95),
                            eps=1e-8)
    stream = dmdata.BatchStream(corpus.train_docs, args.seq_len, args.batch, args.seed, cfg.bos_token_id,
                                cfg.eos_token_id)
    vw, vf = held_out_val_windows(corpus, tok, cfg, args.seq_len)
    planned = args.steps
    calib_at = min(30, max(2, args.steps // 4))
    t_phase = time.time()
    t_calib = None
    step = 0
    stopped_early = False
    model.train()
    last = {}
    while step < planned:
        if step == 5:
            t_calib = time.time()
        if step == calib_at and t_calib is not None:
            per = (time.time() - t_calib) / (calib_at - 5)
            new = plan_steps(args.steps, step, per, deadline - time.time(), not args.no_calibrate)
            if new != planned:
                log("plan", phase="lm", steps=new, requested=args.steps, s_per_step=per)
            planned = new
            log("calibrated", phase="lm", s_per_step=per, planned_steps=planned,
                projected_s=per * (planned - step))
        if time.time() > deadline + 15:
            stopped_early = True
            log("stop", phase="lm", reason="time budget", step=step)
            break
        lr = modeling.lr_at(step, planned, args.lr, args.warmup, args.final_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        chunk = to_device(stream.next_batch(), device)
        inp, tgt = chunk[:, :-1], chunk[:, 1:]
        with autocast(device):
            out = batched_forward(model, inp, dropout=args.dropout, indexer_loss=args.indexer_loss_weight > 0,
                                  count_experts=True)
            ce = F.cross_entropy(out.logits.reshape(-1, cfg.vocab_size), tgt.reshape(-1))
            loss = ce + (args.indexer_loss_weight * out.indexer_kl if out.indexer_kl is not None else 0.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(list(params.values()), args.grad_clip)
        opt.step()
        imbalance = modeling.update_router_bias(model, out.expert_counts, args.router_bias_rate)
        step += 1
        if step % args.log_every == 0 or step == planned or step == 1:
            kl = out.indexer_kl
            last = {"step": step, "loss": float(ce.detach()), "indexer_kl": None if kl is None else float(kl.detach()),
                    "lr": lr, "grad_norm": float(gnorm), "moe_max_over_mean": float(imbalance),
                    "epoch": stream.chunks_served / stream.chunks_per_epoch,
                    "tok_per_s": stream.chunks_served * args.seq_len / (time.time() - t_phase)}
            log("lm", **last)
        if step % args.val_every == 0 or step == planned:
            model.eval()
            v = val_loss(model, vw, vf, device)
            model.train()
            log("val", step=step, held_out_loss=v, held_out_ppl=math.exp(v))
            last["held_out_loss"] = v
    model.eval()
    return {"steps_requested": args.steps, "steps_planned": planned, "steps_done": step,
            "stopped_early": stopped_early, "seconds": time.time() - t_phase,
            "tokens": stream.chunks_served * args.seq_len, "epochs": stream.chunks_served / stream.chunks_per_epoch,
            "last": last}


# ------------------------------------------------------------------------------------ phase 2

@torch.no_grad()
def generate_draft_data(args, model, corpus, device, log, deadline) -> tuple[list[dict], dict]:
    cfg = model.config
    lens = [int(x) for x in args.gen_prompt_lens.split(",")]
    groups, made, t0 = [], 0, time.time()
    stream = dmdata.BatchStream(corpus.train_docs, max(lens), args.gen_batch, args.seed + 1, cfg.bos_token_id,
                                cfg.eos_token_id)
    gi = 0
    while made < args.gen_seqs:
        if groups and time.time() > deadline:
            log("stop", phase="gen", reason="time budget", seqs=made)
            break
        p_len = lens[gi % len(lens)]
        n = min(args.gen_batch, args.gen_seqs - made)
        prompts = stream.next_batch()[:n, :p_len].tolist()
        conts = modeling.greedy_generate(model, prompts, args.gen_tokens, device, batch=args.gen_batch)
        toks = torch.tensor([p + c for p, c in zip(prompts, conts, strict=True)], dtype=torch.long, device=device)
        feats = []
        for s in range(0, len(toks), 128):
            with autocast(device):
                f = batched_forward(model, toks[s: s + 128], logits=None, return_dspark_features=True)
            feats.append(f.dspark_features.to(torch.bfloat16 if modeling.uses_bf16(device) else torch.float32))
        groups.append({"tokens": toks, "features": torch.cat(feats), "prompt_len": p_len})
        made += n
        gi += 1
        log("gen", group=gi, seqs=made, prompt_len=p_len, s=time.time() - t0)
    return groups, {"seqs": made, "groups": len(groups), "seconds": time.time() - t0, "prompt_lens": lens,
                    "gen_tokens": args.gen_tokens}


# ------------------------------------------------------------------------------------ phase 3

def train_draft(args, model, corpus, groups, device, log, deadline) -> dict:
    cfg = model.config
    ds = model.model.dspark
    for p in model.parameters():
        p.requires_grad_(False)
    params = {f"model.dspark.{n}": p for n, p in ds.named_parameters()}
    for p in params.values():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(modeling.param_groups(params, args.draft_weight_decay), lr=args.draft_lr,
                            betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(args.seed + 3)
    real = dmdata.BatchStream(corpus.train_docs, args.draft_real_len, max(1, args.draft_real_batch),
                              args.seed + 2, cfg.bos_token_id, cfg.eos_token_id)
    n, k = cfg.nextn, args.draft_anchors
    planned, step, t_phase, t_calib = args.draft_steps, 0, time.time(), None
    calib_at = min(30, max(2, args.draft_steps // 4))
    stopped_early = False
    last = {}
    model.train()
    while step < planned:
        if step == 5:
            t_calib = time.time()
        if step == calib_at and t_calib is not None:
            per = (time.time() - t_calib) / (calib_at - 5)
            new = plan_steps(args.draft_steps, step, per, deadline - time.time(), not args.no_calibrate)
            if new != planned:
                log("plan", phase="draft", steps=new, requested=args.draft_steps, s_per_step=per)
            planned = new
            log("calibrated", phase="draft", s_per_step=per, planned_steps=planned)
        if time.time() > deadline + 10:
            stopped_early = True
            log("stop", phase="draft", reason="time budget", step=step)
            break
        lr = modeling.lr_at(step, planned, args.draft_lr, args.draft_warmup, 0.1)
        for gr in opt.param_groups:
            gr["lr"] = lr
        terms = []
        # (a) the target's own greedy continuations
        grp = groups[step % len(groups)]
        rows = torch.randint(0, len(grp["tokens"]), (min(args.draft_batch, len(grp["tokens"])),), generator=g)
        toks, feats = grp["tokens"][rows.to(device)], grp["features"][rows.to(device)]
        lo, hi = grp["prompt_len"] - 1, toks.shape[1] - 3
        anchors = torch.randint(lo, hi + 1, (len(rows), k), generator=g).to(device)
        labels, prev, valid = modeling.draft_targets(toks, anchors, None, n)
        terms.append((toks, feats, anchors, labels, prev, valid))
        # (b) real text, rows kept while it follows the target's greedy path
        if args.draft_real_batch > 0:
            chunk = to_device(real.next_batch(), device)[:, :-1]
            with torch.no_grad(), autocast(device):
                out = batched_forward(model, chunk, return_dspark_features=True)
            greedy = out.logits.argmax(-1)
            anchors_b = torch.randint(0, chunk.shape[1] - 2, (len(chunk), k), generator=g).to(device)
            lb, pb, vb = modeling.draft_targets(chunk, anchors_b, greedy, n)
            terms.append((chunk, out.dspark_features.detach(), anchors_b, lb, pb, vb))
        ce_sum, bce_sum, n_ce, stats = 0.0, 0.0, 0, []
        for toks_i, feats_i, anc, lab, prv, val in terms:
            with autocast(device):
                ce, bce, st = modeling.draft_loss(model, feats_i, toks_i, anc, lab, prv, val)
            w = int(val.sum())
            ce_sum = ce_sum + ce * w
            bce_sum = bce_sum + bce * w
            n_ce += w
            stats.append(st)
        loss = (ce_sum + bce_sum) / max(1, n_ce)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(list(params.values()), args.grad_clip)
        opt.step()
        step += 1
        if step % args.log_every == 0 or step == planned or step == 1:
            last = {"step": step, "loss": float(loss.detach()), "lr": lr, "grad_norm": float(gnorm),
                    "gen_top1_by_pos": stats[0]["top1_by_pos"], "gen_accept_len": stats[0]["accept_len"]}
            if len(stats) > 1:
                last.update(real_top1_by_pos=stats[1]["top1_by_pos"], real_rows=stats[1]["rows"])
            log("draft", **last)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return {"steps_requested": args.draft_steps, "steps_planned": planned, "steps_done": step,
            "stopped_early": stopped_early, "seconds": time.time() - t_phase, "last": last}


# ------------------------------------------------------------------------------------ main

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
    run["reproduce"] = f"python tools/train_default_model.py --out OUT --device {device.type} " + \
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
        from eval_default_model import evaluate_dir
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
