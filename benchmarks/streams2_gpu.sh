#!/usr/bin/env bash
# GPU checks of the DMATH_GRAPH_STREAMS fixes of branch streams2 (side-stream waits of background sums on
# every reading stream; cuDNN workspaces and gone graphs' pools that no longer free memory in use):
#   bash benchmarks/streams2_gpu.sh [OUTDIR]     (about 3 minutes; 2+ GPUs)
# 1. tests/dist/dnn/test_dnn_graph_streams.py (Inception-like, then GoogLeNet in the same process: the
#    GoogLeNet case used to inherit side-stream cuDNN workspaces from the first case's freed graph pool)
#    at 1 and 2 GPUs;
# 2. tests/dist/dnn/test_dnn_buckets.py with every plan on 4 streams at 1 and 2 GPUs (a background
#    all-reduce read by updates on several streams);
# 3. benchmarks/streams_noise.py on 1 GPU: GoogLeNet's run-to-run noise on one stream and on four, after
#    3 steps (the first captured step) and 8 (the test's), OUTDIR/streams_noise_P1.json.
set -u -o pipefail
out=${1:-benchmarks/out/streams2}
mkdir -p "$out"
py=${PYTHON:-python3}
if [ -d .whl ] && ! "$py" -c 'import cudnn' 2>/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 DMATH_DEVICE=${DMATH_DEVICE:-gpu}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
mpiexec=${MPIEXEC:-mpiexec}
flags=()
if "$mpiexec" --version 2>&1 | grep -qiE 'open mpi|openrte'; then flags=(--oversubscribe); fi
run() { timeout "${TIMEOUT:-300}" "$mpiexec" ${flags[@]+"${flags[@]}"} -n "$1" "$py" "${@:2}"; }
status=0
for p in 1 2; do
  echo "== test_dnn_graph_streams.py on $p GPU(s) =="
  run "$p" -m pytest -q -p no:cacheprovider tests/dist/dnn/test_dnn_graph_streams.py 2>&1 \
    | tee "$out/graph_streams_$p.log" | tail -3 || status=1
  echo "== test_dnn_buckets.py with DMATH_GRAPH_STREAMS=4 on $p GPU(s) =="
  DMATH_GRAPH_STREAMS=4 run "$p" -m pytest -q -p no:cacheprovider tests/dist/dnn/test_dnn_buckets.py 2>&1 \
    | tee "$out/buckets_streams4_$p.log" | tail -3 || status=1
done
echo "== streams_noise on 1 GPU =="
run 1 benchmarks/streams_noise.py "$out" --steps 3 8 --streams 1 1 4 4 2>&1 | tee "$out/noise_1.log" \
  | grep -E "step\(s\)|Error|error" || status=1
exit $status
