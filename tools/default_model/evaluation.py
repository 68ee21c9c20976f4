"""Evaluation of the default model (run by tools/default_model/eval_model.py and at the end of training).

1. Held-out PPL: teacher-forced over every held-out file (`<|bos|> text <|eos|>`), strided windows
   of `ctx` tokens overlapping by `overlap` (every token but <|bos|> scored once); tokens, bytes,
   nats/token, PPL and bits/byte.
2. Function completion: 100 held-out functions chosen deterministically (below); prompt = up to
   `context_chars` of the preceding source lines + the `def` line without its newline; greedy
   completion with the engine (`LLM(model=dir)`, temperature 0); the program `header + completion`
   is cut at the first blank line, or before the first line indented at or left of the `def` (the
   function has ended), or, when the completion ran into max_tokens, before its unfinished last
   line; then `textwrap.dedent` (methods are indented) and `ast.parse`.
   Function choice: every `def` / `async def` of the held-out files with a one-line header ending in
   `:`, no docstring, body on the next line and >= 2 body lines, sorted by (file, line); 100 evenly
   spaced (index floor(i * N / 100)).
3. DSpark acceptance (nextn greedy drafts vs the target's greedy continuation): the target's greedy
   continuation of each function prompt (exact function, `gen_tokens` tokens); at every position p
   from the prompt's last token on (while p + 1 + nextn is inside the continuation) the draft block
   runs on the target features of positions <= p with main token = the continuation's token p + 1;
   drafts chain through the Markov head on their own tokens (`DSparkDraft.heads`, what the engine
   runs); acceptance length = 1 + number of leading drafts equal to the continuation. Reported per
   position (mean over all p) and as a speculative-decoding walk (p advances by the acceptance
   length, as an engine would).
4. Confidence calibration: pairs (confidence of draft j, draft j accepted) over the drafts whose
   predecessors were all accepted (the conditional probability the engine's cumprod expects): Brier
   score, the Brier score of the constant base rate, ECE, 10-bin reliability table.
5. Engine path cross-check: speculative decoding through the paged engine path (`model.forward`,
   `dspark_write_main_keys`, `dspark_draft`; FP8 KV, bounded replay) on a few prompts, on the CPU.
"""

from __future__ import annotations

import ast
import math
import textwrap
import time

import numpy as np
import torch

from deepinfer_model.training import batched_draft, batched_forward
from default_model.data import held_out_token_chunks
from default_model.modeling import autocast, greedy_generate, teacher_forced_nll

# ------------------------------------------------------------------------------------ 1. PPL

@torch.no_grad()
def held_out_ppl(model, texts: list[str], tokenizer, device, ctx: int = 512, overlap: int = 128,
                 batch: int = 32) -> dict:
    cfg = model.config
    windows, first = held_out_token_chunks(texts, tokenizer, cfg.bos_token_id, cfg.eos_token_id, ctx, overlap)
    nll, n = teacher_forced_nll(model, windows, first, device, batch)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    return {"files": len(texts), "tokens": n, "bytes": n_bytes, "nats_per_token": nll / n,
            "ppl": math.exp(nll / n), "bits_per_byte": nll / math.log(2) / n_bytes, "context": ctx,
            "overlap": overlap}


# ------------------------------------------------------------------------- 2. function prompts

def _docstring_free_lines(tree: ast.AST, lines: list[str]) -> list[str]:
    """The source lines with every docstring (module, class, function) removed; a docstring that is
    its body's only statement becomes `pass`. Docstrings sharing a line with other code stay."""
    out = list(lines)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        first = node.body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            continue
        s, e = first.lineno - 1, first.end_lineno
        head = lines[s].encode("utf-8")[: first.col_offset].decode("utf-8", "ignore")
        tail = lines[e - 1].encode("utf-8")[first.end_col_offset:].decode("utf-8", "ignore")
        if head.strip() or tail.strip():
            continue
        for i in range(s, e):
            out[i] = ""
        if len(node.body) == 1 and not isinstance(node, ast.Module):
            out[s] = head + "pass\n"
    return out


def function_prompts(held_out: list[dict], n: int = 100, context_chars: int = 1200) -> list[dict]:
    cands = []
    for f in held_out:
        text = f["text"]
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines(keepends=True)
        context_lines = _docstring_free_lines(tree, lines)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if ast.get_docstring(node) is not None or node.body[0].lineno != node.lineno + 1:
                continue
            if node.end_lineno - node.lineno < 2:
                continue
            header = lines[node.lineno - 1].rstrip("\r\n")
            if not header.rstrip().endswith(":"):
                continue
            ctx = ""
            for line in reversed(context_lines[: node.lineno - 1]):
                if len(ctx) + len(line) > context_chars:
                    break
                ctx = line + ctx
            body = "".join(lines[node.lineno: node.end_lineno])
            cands.append({"path": f["path"], "line": node.lineno, "header": header, "context": ctx,
                          "reference_body": body})
    cands.sort(key=lambda c: (c["path"], c["line"]))
    if len(cands) <= n:
        return cands
    return [cands[(i * len(cands)) // n] for i in range(n)]


def cut_completion(header: str, completion: str, hit_max_tokens: bool) -> str:
    """header + completion cut by the rules in the module docstring (the program that is parsed)."""
    lines = (header + completion).split("\n")
    indent = len(header) - len(header.lstrip())
    kept = [lines[0]]
    ended = False
    for line in lines[1:]:
        if line.strip() == "" or len(line) - len(line.lstrip()) <= indent:
            ended = True
            break
        kept.append(line)
    if not ended and hit_max_tokens and len(kept) > 1:
        kept = kept[:-1]          # the unfinished last line
    return "\n".join(kept) + "\n"


def cut_completion_code_blank(header: str, completion: str, hit_max_tokens: bool) -> str:
    """Secondary rule (reported beside the main one): like cut_completion, but blank lines inside
    string literals (a docstring's paragraph break) do not cut."""
    import io
    import tokenize
    text = header + completion
    lines = text.split("\n")
    inside = set()                       # 1-based line numbers strictly inside a multi-line string
    try:
        for t in tokenize.generate_tokens(io.StringIO(textwrap.dedent(text)).readline):
            if t.type == tokenize.STRING and t.end[0] > t.start[0]:
                inside.update(range(t.start[0] + 1, t.end[0] + 1))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    indent = len(header) - len(header.lstrip())
    kept = [lines[0]]
    ended = False
    for no, line in enumerate(lines[1:], start=2):
        if no in inside:
            kept.append(line)
            continue
        if line.strip() == "" or len(line) - len(line.lstrip()) <= indent:
            ended = True
            break
        kept.append(line)
    if not ended and hit_max_tokens and len(kept) > 1:
        kept = kept[:-1]
    return "\n".join(kept) + "\n"


def parses(program: str) -> bool:
    try:
        ast.parse(textwrap.dedent(program))
        return True
    except (SyntaxError, ValueError):
        return False


def engine_completions(model_dir, prompts: list[str], device: str | None, max_tokens: int) -> dict:
    from deepinfer_engine import LLM, SamplingParams
    t0 = time.time()
    llm = LLM(model=str(model_dir), device=device, max_num_seqs=128, max_model_len=1024)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return {"texts": [o.text or "" for o in outs], "token_ids": [o.token_ids for o in outs],
            "prompt_token_ids": [o.prompt_token_ids for o in outs],
            "finish": [o.finish_reason for o in outs], "device": str(llm.engine.device),
            "seconds": time.time() - t0}


def completion_eval(funcs: list[dict], gen: dict) -> dict:
    rows, ok, ok_str, ok_ref = [], 0, 0, 0
    for f, text, fin in zip(funcs, gen["texts"], gen["finish"], strict=True):
        hit = fin == "length"
        program = cut_completion(f["header"], text, hit_max_tokens=hit)
        good = parses(program)
        ok += good
        ok_str += parses(cut_completion_code_blank(f["header"], text, hit_max_tokens=hit))
        ok_ref += parses(cut_completion(f["header"], "\n" + f["reference_body"], hit_max_tokens=False))
        rows.append({"path": f["path"], "line": f["line"], "header": f["header"], "completion": text,
                     "program": program, "parses": good, "finish_reason": fin})
    n = max(1, len(rows))
    return {"n": len(rows), "parse_ok": ok, "parse_rate": ok / n, "device": gen["device"],
            "parse_rate_blank_lines_in_strings_kept": ok_str / n,
            "reference_bodies_parse_rate": ok_ref / n,
            "seconds": gen["seconds"], "samples": rows}


# ---------------------------------------------------------------------- 3./4. DSpark acceptance

@torch.no_grad()
def dspark_acceptance(model, prompt_ids: list[list[int]], gen_tokens: int, device, batch: int = 32) -> dict:
    ds = model.model.dspark
    n = ds.nextn
    conts = greedy_generate(model, prompt_ids, gen_tokens, device, batch=batch)
    per_pos, walk, conf_all, acc_all = [], [], [], []
    for s in range(0, len(prompt_ids), batch):
        ps, cs = prompt_ids[s: s + batch], conts[s: s + batch]
        seqs = [p + c for p, c in zip(ps, cs, strict=True)]
        width = max(len(q) for q in seqs)
        toks = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, q in enumerate(seqs):
            toks[i, : len(q)] = torch.tensor(q)
        toks = toks.to(device)
        lo = [len(p) - 1 for p in ps]                                             # first anchor
        hi = [len(q) - 2 - n for q in seqs]                                       # last anchor with n labels
        k = max(max(h - l + 1 for l, h in zip(lo, hi, strict=True)), 1)
        anchors = torch.zeros(len(seqs), k, dtype=torch.long)
        valid = torch.zeros(len(seqs), k, dtype=torch.bool)
        for i, (l, h) in enumerate(zip(lo, hi, strict=True)):
            cnt = max(0, h - l + 1)
            anchors[i, :cnt] = torch.arange(l, l + cnt)
            anchors[i, cnt:] = l
            valid[i, :cnt] = True
        anchors = anchors.to(device)
        with autocast(device):
            feats = batched_forward(model, toks, logits=None, return_dspark_features=True).dspark_features
            prev = torch.zeros(len(seqs), k, n, dtype=torch.long, device=device)   # heads() uses own tokens
            db = batched_draft(model, feats, toks, anchors, prev)
            own = ds.heads(db.block_out.reshape(-1, n, db.block_out.shape[-1]), model.lm_head.weight,
                           db.main_tokens.reshape(-1))
        j = torch.arange(n, device=device)
        labels = toks.gather(1, (anchors.unsqueeze(-1) + 2 + j).reshape(len(seqs), -1)).reshape(len(seqs), k, n)
        acc = own.token_ids.reshape(len(seqs), k, n) == labels
        conf = own.confidence.reshape(len(seqs), k, n).float()
        alen = 1 + torch.cumprod(acc.long(), -1).sum(-1)                          # [B, K]
        before = torch.cumprod(torch.cat([torch.ones_like(acc[..., :1]), acc[..., :-1]], -1).long(), -1) > 0
        for i in range(len(seqs)):
            cnt = int(valid[i].sum())
            if cnt == 0:
                continue
            a = alen[i, :cnt].cpu()
            per_pos.append(a)
            q = 0
            while q < cnt:
                walk.append(int(a[q]))
                q += int(a[q])
            m = before[i, :cnt].cpu()
            conf_all.append(conf[i, :cnt].cpu()[m])
            acc_all.append(acc[i, :cnt].cpu()[m])
    pp = torch.cat(per_pos).float() if per_pos else torch.zeros(0)
    by_pos = []
    if per_pos:
        allacc = pp.unsqueeze(-1) > (1 + torch.arange(n)).float()                # draft j accepted (prefix)
        by_pos = allacc.float().mean(0).tolist()
    hist = torch.bincount(pp.long(), minlength=n + 2)[1:].tolist() if per_pos else []
    return {"nextn": n, "prompts": len(prompt_ids), "gen_tokens": gen_tokens, "positions": int(pp.numel()),
            "mean_acceptance_length": float(pp.mean()) if pp.numel() else None,
            "walk_steps": len(walk), "walk_mean_acceptance_length": float(np.mean(walk)) if walk else None,
            "accepted_prefix_rate_by_draft": by_pos, "acceptance_length_histogram": hist,
            "calibration": calibration(torch.cat(conf_all) if conf_all else torch.zeros(0),
                                       torch.cat(acc_all) if acc_all else torch.zeros(0, dtype=torch.bool)),
            "continuations": conts}


def calibration(conf: torch.Tensor, acc: torch.Tensor, bins: int = 10) -> dict:
    if conf.numel() == 0:
        return {"pairs": 0}
    c, a = conf.double(), acc.double()
    base = float(a.mean())
    table, ece = [], 0.0
    idx = (c * bins).long().clamp(max=bins - 1)
    for b in range(bins):
        m = idx == b
        cnt = int(m.sum())
        row = {"bin": f"[{b / bins:.1f}, {(b + 1) / bins:.1f}{']' if b == bins - 1 else ')'}", "count": cnt}
        if cnt:
            row.update(mean_confidence=float(c[m].mean()), accept_rate=float(a[m].mean()))
            ece += cnt / c.numel() * abs(row["mean_confidence"] - row["accept_rate"])
        table.append(row)
    return {"pairs": int(c.numel()), "brier": float(((c - a) ** 2).mean()),
            "brier_base_rate": base * (1 - base), "base_accept_rate": base, "mean_confidence": float(c.mean()),
            "ece": ece, "reliability": table}


# --------------------------------------------------------------------- 5. engine-path speculation

@torch.no_grad()
def engine_path_speculation(model_cpu, prompt_ids: list[list[int]], max_new: int, block_size: int = 16) -> dict:
    """Greedy speculative decoding through the paged engine path (CPU): prefill with features, then
    per step draft nextn tokens, verify [main] + drafts in one decode step, accept the prefix that
    matches the target's argmax. -> acceptance lengths and the generated tokens."""
    from deepinfer_model.testing import Driver, Seq
    n = model_cpu.config.nextn
    seqs = [Seq(list(p), len(p)) for p in prompt_ids]
    need = sum(-(-(len(p) + max_new + 2 * n + 2) // block_size) for p in prompt_ids)
    drv = Driver(model_cpu, num_blocks=need + 4, block_size=block_size)
    meta, out = drv.prefill(seqs, [len(p) for p in prompt_ids], features=True)
    model_cpu.dspark_write_main_keys(meta, out, drv.cache)
    mains = [int(x) for x in out.logits.argmax(-1)]
    produced = [[] for _ in seqs]
    lengths: list[int] = []
    active = list(range(len(seqs)))
    while active:
        sub = [seqs[i] for i in active]
        dm = drv.draft_meta(sub, [mains[i] for i in active])
        drafts = model_cpu.dspark_draft(dm, drv.cache).token_ids.tolist()
        for i in active:
            seqs[i].tokens.append(mains[i])
            produced[i].append(mains[i])
        meta, out = drv.decode(sub, drafts, features=True)
        model_cpu.dspark_write_main_keys(meta, out, drv.cache)
        g = out.logits.argmax(-1).view(len(active), n + 1).tolist()
        still = []
        for r, i in enumerate(active):
            a = 0
            while a < n and drafts[r][a] == g[r][a]:
                a += 1
            seqs[i].tokens += drafts[r][:a]
            produced[i] += drafts[r][:a]
            mains[i] = g[r][a]
            lengths.append(a + 1)
            if len(produced[i]) < max_new:
                still.append(i)
        active = still
    return {"prompts": len(prompt_ids), "max_new": max_new, "steps": len(lengths),
            "mean_acceptance_length": float(np.mean(lengths)) if lengths else None,
            "generated": [p[:max_new] for p in produced]}


def prefix_agreement(a: list[list[int]], b: list[list[int]], upto: int) -> dict:
    """How far two sets of greedy continuations agree (first `upto` tokens)."""
    same, pref = 0, []
    for x, y in zip(a, b, strict=True):
        x, y = x[:upto], y[:upto]
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        pref.append(k)
        same += (k >= min(len(x), len(y)))
    return {"compared_tokens": upto, "identical": same, "of": len(pref),
            "mean_common_prefix": float(np.mean(pref)) if pref else None}
