"""The three training phases of tools/default_model/train.py (target LM, greedy continuations,
DSpark self-distillation) and their helpers; the module docstring of that script describes them."""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from deepinfer_model.training import batched_forward
from default_model import data as dmdata
from default_model import modeling
from default_model.modeling import autocast


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


class StepPlan:
    """A training phase's step count: `requested`, cut once steps 5 .. calib_at are timed to what
    fits before the deadline (`plan_steps`; kept when calibration is off), and a stop once the
    clock passes deadline + slack_s. Shared by the target and the draft phase."""

    def __init__(self, phase: str, requested: int, calibrate: bool, deadline: float, slack_s: float, log):
        self.phase, self.requested, self.calibrate = phase, requested, calibrate
        self.deadline, self.slack_s, self.log = deadline, slack_s, log
        self.planned = requested
        self.calib_at = min(30, max(2, requested // 4))
        self._timed_from: float | None = None   # wall clock at step 5

    def keep_going(self, step: int) -> bool:
        """Called before each step: calibrates at calib_at; False (logged) once the budget is spent."""
        if step == 5:
            self._timed_from = time.time()
        if step == self.calib_at and self._timed_from is not None and self.calib_at > 5:
            per = (time.time() - self._timed_from) / (self.calib_at - 5)
            new = plan_steps(self.requested, step, per, self.deadline - time.time(), self.calibrate)
            if new != self.planned:
                self.log("plan", phase=self.phase, steps=new, requested=self.requested, s_per_step=per)
            self.planned = new
            self.log("calibrated", phase=self.phase, s_per_step=per, planned_steps=new,
                     projected_s=per * (new - step))
        if time.time() > self.deadline + self.slack_s:
            self.log("stop", phase=self.phase, reason="time budget", step=step)
            return False
        return True


def train_target(args, model, corpus, tok, device, log, deadline) -> dict:
    cfg = model.config
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(modeling.param_groups(params, args.weight_decay), lr=args.lr, betas=(0.9, 0.95),
                            eps=1e-8)
    stream = dmdata.BatchStream(corpus.train_docs, args.seq_len, args.batch, args.seed, cfg.bos_token_id,
                                cfg.eos_token_id)
    vw, vf = held_out_val_windows(corpus, tok, cfg, args.seq_len)
    plan = StepPlan("lm", args.steps, not args.no_calibrate, deadline, 15, log)
    t_phase = time.time()
    step = 0
    stopped_early = False
    model.train()
    last = {}
    while step < plan.planned:
        if not plan.keep_going(step):
            stopped_early = True
            break
        lr = modeling.lr_at(step, plan.planned, args.lr, args.warmup, args.final_lr_frac)
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
        if step % args.log_every == 0 or step == plan.planned or step == 1:
            kl = out.indexer_kl
            last = {"step": step, "loss": float(ce.detach()), "indexer_kl": None if kl is None else float(kl.detach()),
                    "lr": lr, "grad_norm": float(gnorm), "moe_max_over_mean": float(imbalance),
                    "epoch": stream.chunks_served / stream.chunks_per_epoch,
                    "tok_per_s": stream.chunks_served * args.seq_len / (time.time() - t_phase)}
            log("lm", **last)
        if step % args.val_every == 0 or step == plan.planned:
            model.eval()
            v = val_loss(model, vw, vf, device)
            model.train()
            log("val", step=step, held_out_loss=v, held_out_ppl=math.exp(v))
            last["held_out_loss"] = v
    model.eval()
    return {"steps_requested": args.steps, "steps_planned": plan.planned, "steps_done": step,
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
    plan = StepPlan("draft", args.draft_steps, not args.no_calibrate, deadline, 10, log)
    step, t_phase = 0, time.time()
    stopped_early = False
    last = {}
    model.train()
    while step < plan.planned:
        if not plan.keep_going(step):
            stopped_early = True
            break
        lr = modeling.lr_at(step, plan.planned, args.draft_lr, args.draft_warmup, 0.1)
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
        if step % args.log_every == 0 or step == plan.planned or step == 1:
            last = {"step": step, "loss": float(loss.detach()), "lr": lr, "grad_norm": float(gnorm),
                    "gen_top1_by_pos": stats[0]["top1_by_pos"], "gen_accept_len": stats[0]["accept_len"]}
            if len(stats) > 1:
                last.update(real_top1_by_pos=stats[1]["top1_by_pos"], real_rows=stats[1]["rows"])
            log("draft", **last)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return {"steps_requested": args.draft_steps, "steps_planned": plan.planned, "steps_done": step,
            "stopped_early": stopped_early, "seconds": time.time() - t_phase, "last": last}


# ------------------------------------------------------------------------------------ main
