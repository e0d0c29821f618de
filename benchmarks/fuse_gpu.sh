#!/usr/bin/env bash
# GPU checks of the fused BatchNorm tails and the in-place concatenations (branch "fuse"), one job on
# a machine with 4 GPUs (about 4 minutes; the three parts run side by side on their own GPUs):
#   bash benchmarks/fuse_gpu.sh [OUTDIR]      logs and zoo_bench JSON under OUTDIR
# GPUs 0-1: the BatchNorm kernels (residual, windows: norm_cuda's CUDA C) and the dnn folds, at 1 and
#   2 GPUs (DMATH_DEVICE=gpu);
# GPU 2: ResNet-50 (the residual fold), GPU 3: GoogLeNet (the concatenations), batch 256, float32 and
#   float16, Model(fuse=True) against fuse='relu' (the folds before this branch) and PyTorch eager,
#   each in one zoo_bench job (fuse_variants.relu.first_over_this is the gain).
set -u
source tools/gpu_env.sh "${1:-benchmarks/out/fuse}"
tests=(tests/dist/dmath/test_nn_norm.py tests/dist/dnn/test_dnn_fuse.py)
bench() {   # GPU net port
  CUDA_VISIBLE_DEVICES=$1 "$mpiexec" "${mpiflags[@]}" -n 1 "$py" benchmarks/zoo_bench.py "$out" --device gpu \
    --nets "$2" --batches 256 --dtypes float32 float16 --peers eager --fuse all relu --port "$3" \
    > "$out/zoo_$2.log" 2>&1
}
bench 2 resnet50 29561 & r=$!
bench 3 googlenet 29571 & g=$!
status=0
for p in 1 2; do
  CUDA_VISIBLE_DEVICES=0,1 DMATH_DEVICE=gpu "$mpiexec" "${mpiflags[@]}" -n "$p" "$py" -m pytest -q \
    -p no:cacheprovider "${tests[@]}" > "$out/tests_p$p.log" 2>&1 || status=1
  echo "tests at $p GPU(s): $(tail -n 1 "$out/tests_p$p.log")"
done
wait $r || status=1
wait $g || status=1
grep -hE "img/s" "$out"/zoo_resnet50.log "$out"/zoo_googlenet.log
exit $status
