#!/usr/bin/env bash
# GPU checks on a machine with cupy, mpi4py and Open MPI already installed (no network):
# the main job, the distributed tests and the benchmarks at 1 GPU and at all GPUs.
# Usage: bash tools/gpu_check.sh [OUTDIR]   (results as JSON and logs under OUTDIR)
set -u
out=${1:-benchmarks/out/gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} DMATH_DEVICE=gpu PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
ngpu=$(python3 -c 'import cupy; print(cupy.cuda.runtime.getDeviceCount())')
run() { timeout "${TIMEOUT:-300}" mpiexec --oversubscribe -n "$1" python3 "${@:2}"; }
status=0
for p in 1 "$ngpu"; do
  echo "== main job on $p GPU(s) =="
  run "$p" examples/main_job.py --device gpu 2>&1 | tee "$out/main_job_$p.log" || status=1
  if [ -d tests/dist ] && [ -z "${SKIP_TESTS:-}" ]; then
    echo "== tests/dist on $p GPU(s) =="
    run "$p" -m pytest -q -p no:cacheprovider tests/dist 2>&1 | tail -n 40 | tee "$out/tests_$p.log" || status=1
  fi
done
for p in ${BENCH_GPUS:-2 $ngpu}; do
  echo "== remap benchmark on $p GPUs =="
  run "$p" benchmarks/remap_bench.py --device gpu --sizes ${SIZES:-8192 16384} --out "$out/remap_p$p.json" || status=1
done
echo "== dispatch benchmark on $ngpu GPUs =="
run "$ngpu" benchmarks/dispatch_bench.py --device gpu --out "$out/dispatch_p$ngpu.json" || status=1
exit $status
