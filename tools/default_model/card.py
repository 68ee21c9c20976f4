"""The model card (README.md beside the shipped checkpoint) and eval.md, written from the real numbers
of a training run (run.json) and its evaluation (eval.json)."""

from __future__ import annotations

SPECIALS = "<|pad|> 0, <|bos|> 1, <|eos|> 2, <|system|> 3, <|user|> 4, <|assistant|> 5, <|noise|> 6"


def _f(x, nd=3):
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _eval_sections(ev: dict) -> list[str]:
    out = []
    ppl = ev.get("held_out_ppl")
    if ppl:
        out += ["### Held-out perplexity (teacher-forced)", "",
                f"{ppl['files']} held-out files, {ppl['tokens']:,} scored tokens, {ppl['bytes']:,} bytes; windows of "
                f"{ppl['context']} tokens overlapping by {ppl['overlap']} (every token after <|bos|> scored once).", "",
                "| nats/token | PPL | bits/byte |", "| --- | --- | --- |",
                f"| {_f(ppl['nats_per_token'], 4)} | {_f(ppl['ppl'], 3)} | {_f(ppl['bits_per_byte'], 4)} |", ""]
    fc = ev.get("function_completion")
    if fc:
        out += ["### Function completion (held-out)", "",
                f"**{fc['parse_ok']}/{fc['n']} = {fc['parse_rate']:.0%}** of greedy completions parse with `ast.parse` "
                f"(engine on {fc['device']}, {fc['seconds']:.0f} s). Prompt: up to 1200 characters of the preceding "
                "source + the `def` line (no newline). The program is `header + completion` cut at the first blank "
                "line, or before the first line indented at or left of the `def`, or (completion hit max_tokens) "
                "before its unfinished last line; then `textwrap.dedent`.", ""]
    acc = ev.get("dspark_acceptance")
    if acc:
        cal = acc.get("calibration", {})
        out += ["### DSpark speculation (nextn = 5, greedy)", "",
                f"Against the target's greedy continuation ({acc['gen_tokens']} tokens) of the {acc['prompts']} "
                f"function prompts, {acc['positions']:,} positions:", "",
                "| mean acceptance length (every position) | speculative walk | accepted-prefix rate by draft |",
                "| --- | --- | --- |",
                f"| **{_f(acc['mean_acceptance_length'], 3)}** | {_f(acc['walk_mean_acceptance_length'], 3)} "
                f"({acc['walk_steps']} steps) | {', '.join(_f(x, 2) for x in acc['accepted_prefix_rate_by_draft'])} |",
                ""]
        if cal.get("pairs"):
            out += [f"Confidence head calibration ({cal['pairs']:,} drafts whose predecessors were accepted): "
                    f"Brier **{_f(cal['brier'], 4)}** (constant base rate {_f(cal['brier_base_rate'], 4)}), "
                    f"ECE {_f(cal['ece'], 4)}, base acceptance {_f(cal['base_accept_rate'], 3)}, "
                    f"mean confidence {_f(cal['mean_confidence'], 3)}.", "",
                    "| confidence bin | drafts | mean confidence | accepted |", "| --- | --- | --- | --- |"]
            for row in cal["reliability"]:
                out.append(f"| {row['bin']} | {row['count']} | {_f(row.get('mean_confidence'))} | "
                           f"{_f(row.get('accept_rate'))} |")
            out.append("")
    spec = ev.get("engine_path_speculation_cpu")
    if spec:
        out += [f"Engine path (paged FP8 KV, bounded replay, `dspark_draft`) speculative decoding on "
                f"{spec['prompts']} prompts x {spec['max_new']} tokens (CPU): mean acceptance length "
                f"{_f(spec['mean_acceptance_length'], 3)} over {spec['steps']} steps.", ""]
    agree = ev.get("engine_vs_exact_greedy")
    if agree:
        out += [f"Engine greedy vs the exact function's greedy (first {agree['compared_tokens']} tokens): "
                f"{agree['identical']}/{agree['of']} prompts identical, mean common prefix "
                f"{_f(agree['mean_common_prefix'], 1)} tokens (the engine runs the bounded replay and FP8 KV).", ""]
    base = [k for k in ("ppl_baseline_cpu", "ppl_baseline_cuda") if ev.get(k)]
    if base:
        out += ["Decode-PPL baselines (fixed prompts, tools/default_model/baseline.py): " +
                ", ".join(f"`{ev[k]['file']}` {_f(ev[k]['decode_ppl'], 4)}" for k in base) + ".", ""]
    if ev.get("errors"):
        out += ["Evaluation errors: " + ", ".join(sorted(ev["errors"])) + " (see eval.json).", ""]
    return out


def eval_markdown(ev: dict) -> str:
    lines = [f"# Default model evaluation ({ev.get('model_dir')}, {ev.get('device')})", ""]
    lines += _eval_sections(ev)
    fc = ev.get("function_completion")
    if fc:
        lines += ["## Sample completions", ""]
        for s in fc["samples"][:6]:
            lines += [f"`{s['path']}:{s['line']}` parses: {s['parses']}", "", "```python", s["program"].rstrip(),
                      "```", ""]
    return "\n".join(lines) + "\n"


def model_card(run: dict, ev: dict) -> str:
    a = run.get("args", {})
    c = run.get("config", {})
    corpus = run.get("corpus", {})
    params = run.get("params", {})
    lm, gen, dr = run.get("phase1_lm", {}), run.get("phase2_generation", {}), run.get("phase3_draft", {})
    env = run.get("env", {})
    ck = run.get("checkpoint", {})
    lines = [
        "# DeepInfer default model",
        "",
        "A small DeepSeek-V4.1-Flash-architecture model that writes Python, with a DSpark (DFlash) draft head, "
        "trained from scratch by `tools/default_model/train.py` on the Python standard library. "
        "`LLM()` with no model argument loads it. It completes code; it is not an assistant and "
        "knows nothing beyond the stdlib sources it saw.",
        "",
        f"- Parameters: {params.get('total', 0):,} ({params.get('backbone', 0):,} backbone incl. "
        f"{params.get('embedding', 0):,} tied embedding, {params.get('engram', 0):,} Engram tables, "
        f"{params.get('dspark', 0):,} DSpark block); bf16 safetensors, {ck.get('bytes', 0) / 2**20:.2f} MiB with "
        "config, tokenizer and generation config.",
        f"- Config: preset `{a.get('preset', 'default')}` (`deepinfer_model.presets.default()`), see config.json.",
        "",
        "## Data",
        "",
        f"The `.py` files of the CPython {corpus.get('python')} standard library, split into train and held-out sets "
        "by top-level module (`tools/default_model/stdlib_corpus.py`: a module is held out when the first 4 bytes of "
        "sha256(name) mod 100 < 5; test suites, `site-packages`, `lib2to3`, `turtledemo`, files > 400 kB and "
        "`_pydecimal` excluded), identical files kept once. The tokenized train split and the held-out text "
        "are packed in `tools/data/` (`tools/default_model/pack_stdlib_corpus.py`, verified by sha256 at load), so every "
        "machine trains on the same tokens whatever its Python.",
        "",
        f"- train: {corpus.get('train_files')} files, {corpus.get('train_bytes', 0):,} bytes, "
        f"{corpus.get('train_tokens', 0):,} tokens",
        f"- held-out: {corpus.get('held_out_files')} files, {corpus.get('held_out_bytes', 0):,} bytes, modules "
        + ", ".join(f"`{m}`" for m in corpus.get("held_out_modules", [])),
        "",
        "## Tokenizer",
        "",
        "Byte-level BPE (HF `tokenizers`), vocab 8192, trained by `tools/default_model/train_tokenizer.py` on the train split "
        f"(sha256 `{corpus.get('tokenizer_sha256', '')[:16]}...`). Special tokens: {SPECIALS}. Prompts are "
        "encoded without special tokens; training documents are `<|bos|> file <|eos|>`.",
        "",
        "## Architecture (config.json)",
        "",
        "| item | value |",
        "| --- | --- |",
        f"| layers | {c.get('num_hidden_layers')} (compress ratios {c.get('compress_ratios')}: window-only, ratio-4 "
        "source + sharer, ratio-1 n_prefill_layer = last encoder layer, then YOCO consumers incl. a ratio-2 "
        f"source + sharer; sources {c.get('kv_source_layer_ids')}) |",
        f"| hidden / heads x head_dim | {c.get('hidden_size')} / {c.get('num_attention_heads')} x "
        f"{c.get('head_dim')} (RoPE {c.get('qk_rope_head_dim')}), q_lora_rank {c.get('q_lora_rank')}, one KV head |",
        f"| attention | sliding window {c.get('sliding_window')}; indexer {c.get('index_n_heads')} heads x "
        f"{c.get('index_head_dim')}, blocks of {c.get('index_block_size')} entries, top-{c.get('index_topk')} |",
        f"| FFN | layer 0 dense SwiGLU {c.get('intermediate_size')}; MoE {c.get('n_routed_experts')} routed + "
        f"{c.get('n_shared_experts')} shared, top-{c.get('num_experts_per_tok')}, width "
        f"{c.get('moe_intermediate_size')} |",
        f"| Engram | layers {c.get('engram_layer_ids')}, n-grams 2..{c.get('engram_max_ngram_size')}, "
        f"{c.get('engram_table_size')} x {c.get('engram_dim')} per table |",
        f"| DSpark | nextn {c.get('nextn')}, noise token {c.get('dspark_noise_token_id')}, target layers "
        f"{c.get('dspark_target_layer_ids')}, Markov rank {c.get('dspark_markov_rank')}, FFN "
        f"{c.get('dspark_intermediate_size')}, confidence temperature {c.get('dspark_confidence_temperature')} |",
        f"| vocab / embeddings | {c.get('vocab_size')}, tied |",
        "",
        "## Training",
        "",
        f"Seed {a.get('seed')}, {env.get('device_name') or env.get('device')}, torch {env.get('torch')}, Python "
        f"{env.get('python')}; {run.get('train_seconds', 0):.0f} s of training. Reproduce: `{run.get('reproduce')}`.",
        "",
        f"1. **Target LM** (`deepinfer_model.training.batched_forward` = `reference_forward(mode=\"exact\")`, "
        f"batched): next-token cross-entropy on packed {a.get('seq_len')}-token chunks, batch {a.get('batch')}; "
        f"AdamW (beta 0.9/0.95, weight decay {a.get('weight_decay')} on matrices), peak lr {a.get('lr')}, "
        f"{a.get('warmup')} warm-up steps then cosine to {a.get('final_lr_frac')} x peak, gradient clip "
        f"{a.get('grad_clip')}, residual dropout {a.get('dropout')}, bf16 autocast on CUDA; lightning indexer "
        f"trained by KL to the attention mass over all visible far entries (weight {a.get('indexer_loss_weight')}), "
        f"MoE balanced by the selection bias (rate {a.get('router_bias_rate')}). Steps: {lm.get('steps_done')} "
        f"(requested {lm.get('steps_requested')}, planned {lm.get('steps_planned')}), {lm.get('tokens', 0):,} "
        f"tokens = {lm.get('epochs', 0):.1f} epochs, {lm.get('seconds', 0):.0f} s. Last logged train loss "
        f"{_f(lm.get('last', {}).get('loss'))}, held-out loss {_f(lm.get('last', {}).get('held_out_loss'))}.",
        f"2. **Greedy data**: the target (rounded to bf16 and frozen) continues {gen.get('seqs')} train-chunk prompts "
        f"(lengths {gen.get('prompt_lens')}) by {gen.get('gen_tokens')} greedy tokens ({gen.get('seconds', 0):.0f} s).",
        f"3. **DSpark block** (self-distillation, target frozen): draft j at anchor p learns the target's greedy "
        f"token p+2+j from target features at <= p, block input embed(token p+1) then <|noise|>, Markov head on "
        f"the teacher's previous token; data: {a.get('draft_batch')} generated sequences + "
        f"{a.get('draft_real_batch')} real {a.get('draft_real_len')}-token chunks (rows kept while the text "
        f"follows the target's greedy path) x {a.get('draft_anchors')} anchors per step; confidence head: BCE on "
        f"acceptance given earlier drafts accepted (inputs detached). AdamW lr {a.get('draft_lr')}, "
        f"{dr.get('steps_done')} steps (requested {dr.get('steps_requested')}), {dr.get('seconds', 0):.0f} s.",
        "",
    ]
    if run.get("errors"):
        lines += ["**Training errors** (see run.json): " + ", ".join(sorted(run["errors"])) +
                  " - the checkpoint holds what was trained up to the failure.", ""]
    lines += [
        "## Evaluation",
        "",
    ]
    lines += _eval_sections(ev)
    lines += ["Full numbers, samples and definitions: `tools/default_model/eval_model.py` and "
              "`tools/default_model/evaluation.py` (re-run: `python tools/default_model/eval_model.py --model <this dir> "
              "--out <dir>`).", ""]
    return "\n".join(lines) + "\n"
