#!/usr/bin/env bash
# The GPU checks of DMATH_GRAPH_STREAMS (dmath/runtime/streams.py), for the lead's GPU machine:
#   bash benchmarks/streams_gpu.sh [OUTDIR]     (about 4 minutes with warm tuning caches; 2+ GPUs)
# 1. the tests (training with and without streams give the same losses and weights; chains of
#    dmath operations on streams replay with NumPy's values) at 1 and 2 GPUs, and the recorded-plan
#    and gradient-bucket tests (background all-reduces in a captured step) with DMATH_GRAPH_STREAMS=4;
# 2. GoogLeNet and Inception v3 at batch 256, float32 and float16, one stream against four, in one
#    job on 1 GPU (benchmarks/streams_bench.py: OUTDIR/streams_P1.json), and GoogLeNet on 2 GPUs;
# 3. GoogLeNet's run-to-run noise (benchmarks/streams_noise.py): whether one stream is bitwise
#    reproducible, so that the stream test's tolerance measures the streams and not cuDNN's noise.
set -u -o pipefail
source tools/gpu_env.sh "${1:-benchmarks/out/streams}"
export DMATH_DEVICE=${DMATH_DEVICE:-gpu}
status=0
for p in 1 2; do
  echo "== streams tests on $p GPU(s) =="
  run "$p" -m pytest -q -p no:cacheprovider tests/dist/dnn/test_dnn_graph_streams.py \
    tests/dist/dmath/test_graph_streams_dist.py tests/dist/dmath/test_plans_dist.py 2>&1 | tee "$out/tests_$p.log" \
    | tail -5 || status=1
done
for p in 1 2; do
  echo "== the recorded-plan and gradient-bucket tests with every plan on 4 streams, $p GPU(s) =="
  DMATH_GRAPH_STREAMS=4 run "$p" -m pytest -q -p no:cacheprovider tests/dist/dmath/test_plans_dist.py \
    tests/dist/dnn/test_dnn_buckets.py 2>&1 | tee "$out/tests_streams4_$p.log" | tail -5 || status=1
done
echo "== GoogLeNet's run-to-run noise on 1 GPU (one stream against itself and against four) =="
run 1 benchmarks/streams_noise.py "$out" --steps 3 8 --streams 1 1 4 4 2>&1 | tee "$out/noise_1.log" \
  | grep -E "step\(s\)|Error|error" || status=1
echo "== streams_bench on 1 GPU =="
run 1 benchmarks/streams_bench.py "$out" --nets googlenet inception_v3 --batches 256 --dtypes float32 float16 \
  --streams 1 4 2>&1 | tee "$out/bench_1.log" | grep -E "stream\(s\)|Error|error" || status=1
echo "== streams_bench on 2 GPUs (GoogLeNet) =="
run 2 benchmarks/streams_bench.py "$out" --nets googlenet --batches 256 --dtypes float32 --streams 1 4 2>&1 \
  | tee "$out/bench_2.log" | grep -E "stream\(s\)|Error|error" || status=1
exit $status
