#!/usr/bin/env bash
# GPU checks of the fused BatchNorm tails and the in-place concatenations (branch "fuse"), one job:
#   bash benchmarks/fuse_gpu.sh [OUTDIR]      logs and zoo_bench JSON under OUTDIR
# 1. the BatchNorm kernels (residual, windows; the CUDA C of norm_cuda) and the dnn folds at 1 and 2
#    GPUs (DMATH_DEVICE=gpu); 2. ResNet-50 (the residual fold) and GoogLeNet (the concatenations)
#    at batch 256, float32 and float16, fuse=True against fuse='relu' (the folds before this branch)
#    and PyTorch eager, on one GPU, in one zoo_bench job each.
set -u
out=${1:-benchmarks/out/fuse}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
mpiexec=${MPIEXEC:-mpiexec}
mpiflags=()
if "$mpiexec" --version 2>&1 | grep -qiE 'open mpi|openrte'; then mpiflags=(--oversubscribe); fi
tests=(tests/dist/dmath/test_nn_norm.py tests/dist/dnn/test_dnn_fuse.py)
status=0
for p in 1 2; do
  DMATH_DEVICE=gpu "$mpiexec" "${mpiflags[@]}" -n "$p" "$py" -m pytest -q -p no:cacheprovider "${tests[@]}" \
    > "$out/tests_p$p.log" 2>&1 || status=1
  tail -n 3 "$out/tests_p$p.log"
done
for net in resnet50 googlenet; do
  "$mpiexec" "${mpiflags[@]}" -n 1 "$py" benchmarks/zoo_bench.py "$out" --device gpu --nets "$net" --batches 256 \
    --dtypes float32 float16 --peers eager --fuse all relu > "$out/zoo_$net.log" 2>&1 || status=1
  grep -E "img/s" "$out/zoo_$net.log"
done
exit $status
