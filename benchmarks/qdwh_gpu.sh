#!/usr/bin/env bash
# The distributed eigh/svd (dmath.linalg method='qdwh') on GPUs: its tests at 1 GPU and at every
# GPU, then eigh (n = 8192, 16384) and svd (n = 4096, 8192) in float64 on every GPU against
# one-GPU cuSOLVER (CuPy) in the same job. About 3 to 4 minutes on 4 GPUs.
#   bash benchmarks/qdwh_gpu.sh [OUTDIR]     logs and linalg_gpu_<date>.json (+ .png) under OUTDIR
# SWEEP=1 adds eigh n = 16384 at leaf sizes 2560, 5120 and 10240 (the default leaf's choice on
# GPUs, dmath.linalg.dc_plan.default_leaf; about 2 minutes more).
set -u
source tools/gpu_env.sh "${1:-benchmarks/out/qdwh}"
if [ "$openmpi" = 1 ]; then mpiflags+=(--bind-to none); fi     # the ranks' threads on every core
DMATH_DEVICE=gpu timeout 300 "$py" -m pytest -q -p no:cacheprovider tests/dist/dmath/test_linalg_qdwh.py \
  > "$out/tests_p1.log" 2>&1; echo "tests at 1 GPU: rc=$? ($(tail -1 "$out/tests_p1.log"))"
DMATH_DEVICE=gpu timeout 300 "$mpiexec" "${mpiflags[@]}" -n "$ngpu" "$py" -m pytest -q -p no:cacheprovider \
  tests/dist/dmath/test_linalg_qdwh.py > "$out/tests_p$ngpu.log" 2>&1
echo "tests at $ngpu GPUs: rc=$? ($(tail -1 "$out/tests_p$ngpu.log"))"
timeout 420 "$py" benchmarks/linalg_bench.py "$out" --device gpu --workers "$ngpu" --ops eigh svd \
  --small-n 8192 16384 --svd-n 4096 8192 --methods qdwh --reps 1 --mpiexec "$mpiexec ${mpiflags[*]}" \
  2>&1 | tee "$out/bench.log" | grep -v '^{'
if [ "${SWEEP:-0}" = 1 ]; then
  timeout 400 "$py" benchmarks/linalg_bench.py "$out" --device gpu --workers "$ngpu" --ops eigh \
    --small-n 16384 --methods qdwh --leaf 2560 5120 10240 --reps 1 --peer none --mpiexec "$mpiexec ${mpiflags[*]}" \
    2>&1 | tee "$out/sweep.log" | grep -v '^{'
fi
