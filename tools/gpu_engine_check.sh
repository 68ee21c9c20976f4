#!/usr/bin/env bash
# Device runner for the engine: GPU tests and the end-to-end benchmarks of docs/benchmarks.md,
# each mode sized to fit one device call (<= 600 s on a warm H200; compile_decode off).
#
#   OUT=/some/dir tools/gpu_engine_check.sh MODE
#
#   tests      pytest -m "gpu and not slow": batch invariance (CUDA), model graph test, CUDA PPL
#              baseline, engine graphs/ZOS/speculation tests (~7 min: run it alone)
#   quick      the engine's core GPU checks in four parallel pytest processes (~2 min): graphs + ZOS
#              vs the CPU reference, greedy speculation at nextn 5 (fixed, varlen), batch invariance,
#              the CUDA PPL baseline, the plane-view store / attention kernel tests, the RMSNorm and
#              MoE-routing kernels
#   dspark     default model, batch 1 over 16 prompts, nextn 0 vs 5, the speculative part plain and
#              through torch.compile (issue 7's 2.5x; a cold inductor cache compiles for ~2-3 min)
#   batch64    default model, 64 sequences: nextn 5 varlen vs fixed, grammar masks and batch
#              invariance beside plain decode; then the same at nextn 0 (issues 7 and 9)
#   flashslice `flash-slice` (full flash width, 4 layers, 91 GB of random bf16 weights made on the GPU)
#              decode at batch 1 over 400 steps: weight bytes per step / step time vs copy bandwidth
#   mini       `mini` vs HF transformers: decode batch 1 / 64 (ZOS on and off), prefill 64 x 512 in
#              chunks of 8K / 16K / 32K rows
#   ops        packages/deepinfer-engine/diag/profile_ops.py on `mini` decode (batch 1 and 64) and prefill:
#              device time per TileLang op and per other kernel
#   sharedkeys the shared-key sparse MLA: its kernel GPU tests (pairs and quads) and the `mini` prefill
#              test (every call against the per-row kernels) in parallel with warm-ups, then `mini`
#              prefill 64 x 512 with quads, pairs and per-row kernels alternately, the HF peer first
#   serving    tools/load_bench.py on the default model: 256 requests at 16 and 64 requests/s and at
#              saturation, the same workload through LLM.generate first (server / offline throughput,
#              TTFT / ITL p50 / p99, the server's per-token overhead), JSON rows and the latency plot;
#              then saturation again with --api-workers 1 (the default on CUDA is 4 HTTP processes)
#   kvmem      the window rings and the SWA tier on CUDA (their GPU tests, the rings bit for bit against
#              the paged layout), then tools/chat_replay.py with each layout and its step traces
#   revision   the working tree against an older revision (REVISION=rev.tgz, from `git archive -o rev.tgz REV
#              packages tools`; files it leaves out, e.g. the default checkpoint or the corpus, come
#              from the working tree): both precompiled, the default model's greedy outputs compared,
#              then the default model's nextn-5 decode and `mini` decode at batch 1 / 64, the trees
#              alternating twice (bench.jsonl / bench_revision.jsonl); packages/deepinfer-engine/diag/revision_ab.py
#
# PRECOMPILE=1 runs tools/tilelang_precompile.py first (a fresh machine: the GPU tests then load each
# kernel from the disk cache instead of compiling it inside their timeouts).
#
# Uses the installed packages (pip install -e the four of them first). The server (serving) needs
# wheels the device image lacks; made here, where pip has an index, and carried in .whl/:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#       fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 opentelemetry-api==1.45.3 httptools==0.9.0
# (uvloop is in the image). Structured output needs
# xgrammar >= 0.2.9 (0.2.8 builds speculative-step masks ~4x slower): when the device bundle is
# older, carry the wheel in .whl/ (see /work/.library/device/README.md) and this script installs it.
# PACK_LOGS=1 puts the mode's *.log files into $OUT/<mode>-logs.tgz (a device call returns at most
# 8 files). Writes under $OUT:
# <mode>.log, bench.jsonl (one JSON row per measurement, with the copy / matmul ceilings of the
# run) and summary.txt (rc and seconds of every stage).
set -uo pipefail

MODE=${1:?usage: $0 tests|quick|dspark|batch64|flashslice|mini|ops|sharedkeys|serving|kvmem|revision}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 DEEPINFER_COMPILE_DECODE=0
SUMMARY="$OUT/summary.txt"
DEADLINE=${DEADLINE:-570}
# shellcheck source=tools/_stage.sh
source "$ROOT/tools/_stage.sh"

if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
BENCH=("$PY" tools/benchmark.py --device cuda --result-jsonl "$OUT/bench.jsonl")
CODE=(--model default --code-prompts --prompt-len 256 --max-model-len 1536 --no-prefill --warmup-steps 20 --steps 30)
if [ -n "${PRECOMPILE:-}" ] && [ "$MODE" != revision ]; then
  stage precompile 240 "$PY" tools/tilelang_precompile.py > "$OUT/precompile.log" 2>&1
fi

case "$MODE" in
  tests)
    stage tests 560 "$PY" -m pytest -p no:cacheprovider -m "gpu and not slow" --benchmark-skip -v -rf \
      -o faulthandler_timeout=150 packages/deepinfer-engine/tests/test_batch_invariance.py packages/deepinfer-model/tests \
      tests packages/deepinfer-engine/tests/test_gpu_engine.py > "$OUT/tests.log" 2>&1 ;;
  quick)
    T=("$PY" -m pytest -p no:cacheprovider --benchmark-skip -v -rf -o faulthandler_timeout=170)
    E=packages/deepinfer-engine/tests
    K=packages/deepinfer-kernels/tests
    stage quick_reference 200 "${T[@]}" -m "gpu and not slow" $E/test_gpu_engine.py -k "match_cpu_reference or kernel_variants" \
      > "$OUT/quick_reference.log" 2>&1 &
    stage quick_kernels 200 "${T[@]}" -m gpu tests/test_default_model_ppl.py $K/test_tilelang_kv_store.py \
      $K/test_tilelang_sparse_mla.py -k "plane or cuda_baseline or bit_for_bit" > "$OUT/quick_kernels.log" 2>&1 &
    stage quick_invariance 200 "${T[@]}" -m "gpu and not slow" $E/test_batch_invariance.py \
      > "$OUT/quick_invariance.log" 2>&1 &
    stage quick_speculation 200 "${T[@]}" -m "gpu and not slow" $E/test_gpu_engine.py \
      -k "greedy_speculation and 5" > "$OUT/quick_speculation.log" 2>&1 &
    stage quick_new_kernels 200 "${T[@]}" -m gpu $K/test_tilelang_norm.py $K/test_tilelang_moe_route.py $K/test_tilelang_activation.py \
      packages/deepinfer-model/tests/test_norm_cuda.py $K/test_attention_indices.py $K/test_rope_inplace.py $K/test_paged_slots.py $K/test_write_rows.py \
      $K/test_tilelang_moe.py::test_routed_experts_combine_adds_shared_and_residual_bit_for_bit \
      > "$OUT/quick_new_kernels.log" 2>&1 &
    wait ;;
  dspark)
    stage dspark 500 "${BENCH[@]}" "${CODE[@]}" --decode-batch-sizes 1 --nextn-list 0,5 --rounds 16 \
      --compile-spec-compare > "$OUT/dspark.log" 2>&1 ;;
  batch64)
    stage batch64_nextn5 300 "${BENCH[@]}" "${CODE[@]}" --decode-batch-sizes 64 --nextn-list 5 --varlen --varlen-compare \
      --grammar-compare --invariant-compare --host-timers > "$OUT/batch64_nextn5.log" 2>&1
    stage batch64_nextn0 200 "${BENCH[@]}" "${CODE[@]}" --decode-batch-sizes 64 --nextn-list 0 --grammar-compare \
      --invariant-compare > "$OUT/batch64_nextn0.log" 2>&1 ;;
  flashslice)
    stage flashslice 560 "${BENCH[@]}" --model preset:flash-slice --decode-batch-sizes 1 --max-num-seqs 1 \
      --no-prefill --prompt-len 512 --max-model-len 1024 --warmup-steps 20 --steps 400 > "$OUT/flashslice.log" 2>&1 ;;
  ops)
    stage ops_b1 200 "$PY" packages/deepinfer-engine/diag/profile_ops.py --model preset:mini --batch 1 > "$OUT/ops_b1.log" 2>&1
    stage ops_b64 150 "$PY" packages/deepinfer-engine/diag/profile_ops.py --model preset:mini --batch 64 > "$OUT/ops_b64.log" 2>&1
    stage ops_prefill 150 "$PY" packages/deepinfer-engine/diag/profile_ops.py --model preset:mini --phase prefill --batch 64 --prompt-len 512 \
      > "$OUT/ops_prefill.log" 2>&1 ;;
  mini)
    stage mini 560 "${BENCH[@]}" --model preset:mini --decode-batch-sizes 1,64 --prompt-len 512 --prefill-batch 64 \
      --prefill-chunk-sizes 8192,16384,32768 --peer --zos-compare --warmup-steps 30 --steps 40 > "$OUT/mini.log" 2>&1 ;;
  sharedkeys)
    T=("$PY" -m pytest -p no:cacheprovider --benchmark-skip -v -rf -m gpu -o faulthandler_timeout=150)
    PF=("$PY" tools/benchmark.py --device cuda --model preset:mini --prompt-len 512 --decode-batch-sizes "" \
        --prefill-batch 64 --prefill-chunk-sizes 32768 --prefill-pipelined)
    stage shared_kernels 200 "${T[@]}" packages/deepinfer-kernels/tests/test_tilelang_sparse_mla.py -k shared \
      > "$OUT/shared_kernels.log" 2>&1 &
    stage shared_model 200 "${T[@]}" packages/deepinfer-model/tests/test_prefill_shared_keys.py > "$OUT/shared_model.log" 2>&1 &
    stage warm_quads 200 env DEEPINFER_SPARSE_MLA_GROUP_ROWS=4 "${PF[@]}" > "$OUT/warm_quads.log" 2>&1 &
    stage warm_pairs 200 env DEEPINFER_SPARSE_MLA_GROUP_ROWS=2 "${PF[@]}" > "$OUT/warm_pairs.log" 2>&1 &
    wait
    # quads / pairs / off alternately (groups of 4 rows, of 2, per-row kernels), the peer in the first run
    stage prefill_quads1 120 env DEEPINFER_SPARSE_MLA_GROUP_ROWS=4 "${PF[@]}" --peer --result-jsonl "$OUT/bench.jsonl" \
      > "$OUT/prefill_quads1.log" 2>&1
    for run in pairs1 off1 quads2 pairs2 off2; do
      case $run in quads*) env=(DEEPINFER_SPARSE_MLA_GROUP_ROWS=4) ;; pairs*) env=(DEEPINFER_SPARSE_MLA_GROUP_ROWS=2) ;;
                   *) env=(DEEPINFER_SPARSE_MLA_SHARED_KEYS=0) ;; esac
      stage "prefill_$run" 90 env "${env[@]}" "${PF[@]}" --result-jsonl "$OUT/bench.jsonl" > "$OUT/prefill_$run.log" 2>&1
    done ;;
  serving)
    stage load_bench 400 "$PY" tools/load_bench.py --device cuda --num-requests 256 --rates 16,64,inf \
      --compare-offline --json-out "$OUT/load_bench.jsonl" --plot "$OUT/load_bench.png" \
      --server-log "$OUT/server.log" > "$OUT/load_bench.log" 2>&1
    # the same saturation through one API process (the app in the engine's process): what the workers buy
    stage load_bench_1worker 140 "$PY" tools/load_bench.py --device cuda --num-requests 256 --rates inf \
      --server-args "--api-workers 1" --json-out "$OUT/load_bench_1worker.jsonl" \
      --server-log "$OUT/server_1worker.log" > "$OUT/load_bench_1worker.log" 2>&1 ;;
  kvmem)
    stage rings_gpu 240 "$PY" -m pytest -p no:cacheprovider --benchmark-skip -v -rf -m gpu -o faulthandler_timeout=200 \
      packages/deepinfer-engine/tests/test_gpu_engine.py packages/deepinfer-engine/tests/test_swa_tier.py -k "window_rings or on_cuda" \
      > "$OUT/rings_gpu.log" 2>&1
    for layout in ring paged; do
      stage "chat_$layout" 150 "$PY" tools/chat_replay.py --window-kv $layout --trace-steps \
        --json-out "$OUT/chat_$layout.jsonl" > "$OUT/chat_$layout.log" 2>&1
    done ;;
  revision)
    REV_TGZ=$(realpath "${REVISION:?REVISION=path/to/rev.tgz, made by git archive REV packages tools}")
    RT=/tmp/revision-tree RS=/tmp/revision-site
    AB=("$PY" packages/deepinfer-engine/diag/revision_ab.py)
    REV=("${AB[@]}" run --site "$RS" --)
    rm -rf "$RT" "$RS" && mkdir -p "$RT" && tar -xf "$REV_TGZ" -C "$RT"
    cp -rn packages/deepinfer-model/src/deepinfer_model/default/. "$RT/packages/deepinfer-model/src/deepinfer_model/default/"
    cp -rn tools/data/. "$RT/tools/data/"
    (stage revision_install 200 env -C "$RT" "$PY" -m pip install -q --no-build-isolation --no-deps --target "$RS" \
       packages/deepinfer-kernels packages/deepinfer-model packages/deepinfer-sched packages/deepinfer-engine && \
     stage revision_precompile 200 env PYTHONPATH="$RS${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$RT/tools/tilelang_precompile.py" \
       --jobs 8) > "$OUT/revision_build.log" 2>&1 &
    stage precompile 300 "$PY" tools/tilelang_precompile.py --jobs 8 > "$OUT/precompile.log" 2>&1
    wait
    stage greedy_tree 150 "${AB[@]}" greedy /tmp/greedy_tree.json > "$OUT/greedy_tree.log" 2>&1
    stage greedy_revision 150 "${REV[@]}" packages/deepinfer-engine/diag/revision_ab.py greedy /tmp/greedy_revision.json \
      > "$OUT/greedy_revision.log" 2>&1
    "${AB[@]}" compare /tmp/greedy_tree.json /tmp/greedy_revision.json | tee -a "$SUMMARY"
    MINI=(--model preset:mini --prompt-len 512 --no-prefill --decode-batch-sizes 1,64 --warmup-steps 30 --steps 60)
    for run in 1 2; do
      for what in default mini; do
        if [ $what = default ]; then args=("${CODE[@]}" --decode-batch-sizes 1,64 --nextn-list 5); else args=("${MINI[@]}"); fi
        stage "${what}_tree$run" 100 "${BENCH[@]}" "${args[@]}" > "$OUT/${what}_tree$run.log" 2>&1
        stage "${what}_revision$run" 100 "${REV[@]}" "$RT/tools/benchmark.py" --device cuda \
          --result-jsonl "$OUT/bench_revision.jsonl" "${args[@]}" > "$OUT/${what}_revision$run.log" 2>&1
      done
    done ;;
  *) echo "usage: $0 tests|quick|dspark|batch64|flashslice|mini|ops|sharedkeys|serving|kvmem|revision" >&2; exit 2 ;;
esac
if [ -n "${PACK_LOGS:-}" ]; then   # at most 8 files come back from a device call: the logs as one archive
  (cd "$OUT" && compgen -G "*.log" > /dev/null && tar -czf "$MODE-logs.tgz" -- *.log && rm -f -- *.log)
fi
cat "$SUMMARY"
