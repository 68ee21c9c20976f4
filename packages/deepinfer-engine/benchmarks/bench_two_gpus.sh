#!/usr/bin/env bash
# Issue 49's GPU runs, ready for a machine with >= 2 GPUs (run from the repository root):
#   bash packages/deepinfer-engine/benchmarks/bench_two_gpus.sh [out_dir]
# 1. EP collectives at 2 (and 4 when present) ranks: all-to-all vs all-gather + reduce-scatter at
#    decode sizes, the all-to-all bandwidth docs/parallel.md's model assumes;
# 2. the gpu-marked 2-GPU tests (DP2+EP2 equals one GPU, greedy);
# 3. `mini` decode at batch 64 per rank: one GPU vs DP2+EP2 in the same call (tokens/s per GPU),
#    with a torch profile of the DP2 ranks' steps for the communication share.
set -euo pipefail
OUT=${1:-${OUT:-/tmp/bench_two_gpus}}
mkdir -p "$OUT"
PY=${PY:-python}
NGPU=$($PY -c "import torch; print(torch.cuda.device_count())")
[ "$NGPU" -ge 2 ] || { echo "needs >= 2 GPUs, found $NGPU"; exit 1; }
for N in 2 4; do
  [ "$NGPU" -ge "$N" ] || continue
  $PY -m torch.distributed.run --nproc-per-node "$N" packages/deepinfer-engine/benchmarks/bench_ep_collectives.py \
      --hidden 3072 | tee "$OUT/collectives_ep$N.jsonl"
done
$PY -m pytest packages/deepinfer-engine/tests/test_data_parallel_gpu.py -q -x -m gpu | tee "$OUT/tests.txt"
$PY packages/deepinfer-engine/benchmarks/bench_dp_decode.py --model preset:mini --batch 64 --dp 2 \
    --profile "$OUT/profile_dp2" | tee "$OUT/decode_mini_b64.jsonl"
