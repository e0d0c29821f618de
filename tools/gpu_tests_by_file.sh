#!/usr/bin/env bash
# tests/dist on GPUs one file at a time (a worker failure breaks the runtime for the rest of
# its job, so files run in separate jobs and one failure does not hide the others).
#   bash tools/gpu_tests_by_file.sh P [OUTDIR]
set -u
p=${1:-1}
out=${2:-benchmarks/out/gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 DMATH_DEVICE=gpu
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
status=0
for f in tests/dist/test_*.py; do
  name=$(basename "$f" .py)
  log="$out/gpu${p}_$name.log"
  timeout "${TIMEOUT:-150}" mpiexec --oversubscribe -n "$p" python3 -m pytest -q -p no:cacheprovider \
    --maxfail=1 "$f" > "$log" 2>&1 || status=1
  echo "$p GPU $name: $(grep -aE '[0-9]+ (passed|failed)' "$log" | tail -n 1 | sed 's/\x1b\[[0-9;]*m//g')"
done
exit $status
