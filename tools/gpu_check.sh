#!/usr/bin/env bash
# GPU checks on a machine with cupy and mpi4py already installed (no network needed):
# the environment report, the distributed tests, the main job and the benchmarks.
#   bash tools/gpu_check.sh [OUTDIR]        results (JSON) and logs under OUTDIR
# Works with any mpiexec on PATH (MPIEXEC overrides): Open MPI's gets --oversubscribe (and, as
# root, OMPI_ALLOW_RUN_AS_ROOT*), MPICH's Hydra (the mpich wheel's) needs neither.
# STAGES picks what runs (default: all but bytest, in this order):
#   info    python -m dmath.machine (MPI library, GPUs, NCCL, cuDNN) into OUTDIR/info.txt
#   tests   tests/dist at each of TEST_GPUS (default "1 <all>")
#   bytest  tests/dist one file per job at each of TEST_GPUS (a worker failure breaks its job:
#           this shows every failing file, not only the first)
#   bench   the pytest-benchmark benchmarks (GEMM, remap, dispatch; DTensor peer) at 1 and all
#           GPUs, --benchmark-json OUTDIR/bench_p<P>.json
#   main    the README's main job (CNN training) on all GPUs
#   gemm    GEMM strong scaling at each of GEMM_GPUS (default "1 2 <all>"), SIZES, DTYPES
#   chain   the 100-operation chain (eager, replay, DTensor) on all GPUs, CHAIN_RUNS times
#   remap   remap throughput against NCCL at 2 and all GPUs
#   mlp     the MagmaDNN MNIST MLP test against PyTorch eager on 1 GPU (and DDP on all), and on the CPU
#   cnn     CNN training (LeNet, CIFAR net, AlexNet) against PyTorch eager on 1 GPU and DDP on all
#   startup the time from fit to the end of the first step on 1 GPU, tuning cache cold and warm, against
#           PyTorch eager's first step (STARTUP_ARGS, default AlexNet b256 float32)
#   transfer from_numpy / to_numpy throughput on 1 GPU and on all
#   pipeline the input pipeline alone (augmented 3x224x224 batches) against the copy bandwidth
# The MNIST 5k wheel must already be in DNN_DATA_DIR (default: .data when it exists; the machine has
# no network). Wheels in .whl (the cuDNN frontend) are installed into /tmp/site when not importable.
set -u
source tools/gpu_env.sh "${1:-benchmarks/out/gpu}"
if [ -z "${DNN_DATA_DIR:-}" ] && [ -d .data ]; then export DNN_DATA_DIR=$PWD/.data; fi
stages=${STAGES:-info tests bench main gemm chain remap mlp cnn startup transfer pipeline}
has() { case " $stages " in *" $1 "*) return 0 ;; esac; return 1; }
status=0
if has info; then
  echo "== environment =="
  run "$ngpu" -m dmath.machine | tee "$out/info.txt" || status=1
fi
if has tests; then
  for p in ${TEST_GPUS:-1 $ngpu}; do
    echo "== tests/dist on $p GPU(s) =="
    # the whole log is kept: after a worker failure every later test fails too, so the
    # first failure (with the worker's traceback) is the one to read
    DMATH_DEVICE=gpu run "$p" -m pytest -q -p no:cacheprovider tests/dist ${PYTEST_ARGS:-} \
      > "$out/tests_$p.log" 2>&1 || status=1
    tail -n 5 "$out/tests_$p.log"
  done
fi
if has bytest; then
  for p in ${TEST_GPUS:-1 $ngpu}; do
    for f in tests/dist/*/test_*.py; do
      log="$out/gpu${p}_$(basename "$f" .py).log"
      DMATH_DEVICE=gpu TIMEOUT=${TIMEOUT:-150} run "$p" -m pytest -q -p no:cacheprovider --maxfail=1 "$f" \
        > "$log" 2>&1 || status=1
      echo "$p GPU $(basename "$f" .py): $(grep -aE '[0-9]+ (passed|failed)' "$log" | tail -n 1)"
    done
  done
fi
if has bench; then
  for p in 1 "$ngpu"; do
    echo "== pytest-benchmark benchmarks on $p GPU(s) =="
    DMATH_DEVICE=gpu TIMEOUT=${TIMEOUT:-900} run "$p" -m pytest -q -p no:cacheprovider benchmarks \
      --bench-scale gpu --bench-peers --benchmark-json "$out/bench_p$p.json" > "$out/bench_p$p.log" 2>&1 || status=1
    tail -n 25 "$out/bench_p$p.log"
  done
fi
if has main; then
  echo "== main job on $ngpu GPUs =="
  run "$ngpu" examples/main_job.py --device gpu 2>&1 | tail -n 20 | tee "$out/main_job_$ngpu.log" || status=1
fi
if has gemm; then
  for p in ${GEMM_GPUS:-1 2 $ngpu}; do
    echo "== GEMM strong scaling on $p GPU(s) =="
    run "$p" benchmarks/gemm_bench.py --device gpu --sizes ${SIZES:-16384 32768} \
      --dtypes ${DTYPES:-float64 float32 float16} --reps "${REPS:-3}" --out "$out/gemm_p$p.json" || status=1
  done
fi
if has chain; then
  echo "== op chain on $ngpu GPUs =="
  # CHAIN_RUNS jobs (default 1), each against DTensor in the same job: the host's noise moves one run
  for r in $(seq "${CHAIN_RUNS:-1}"); do
    run "$ngpu" benchmarks/chain_bench.py --device gpu --out "$out/chain_p${ngpu}_r$r.json" || status=1
  done
  run "$ngpu" benchmarks/dispatch_bench.py --device gpu --out "$out/dispatch_p$ngpu.json" || status=1
fi
if has remap; then
  for p in 2 "$ngpu"; do
    echo "== remap benchmark on $p GPUs =="
    run "$p" benchmarks/remap_bench.py --device gpu --sizes ${REMAP_SIZES:-8192 16384} \
      --out "$out/remap_p$p.json" || status=1
  done
fi
if has mlp; then
  echo "== MNIST MLP (MagmaDNN Table 1) on 1 GPU, on all GPUs and on the CPU =="
  run 1 benchmarks/mnist_mlp.py --device gpu --out "$out/mlp_gpu.json" || status=1
  if [ "$ngpu" -gt 1 ]; then run "$ngpu" benchmarks/mnist_mlp.py --device gpu --out "$out/mlp_gpu_p$ngpu.json" || status=1; fi
  [ -n "${SKIP_CPU_MLP:-}" ] || run 1 benchmarks/mnist_mlp.py --device cpu --out "$out/mlp_cpu.json" || status=1
fi
if has cnn; then
  for p in ${CNN_GPUS:-1 $ngpu}; do
    echo "== CNN training on $p GPU(s) =="
    run "$p" benchmarks/cnn_bench.py --device gpu ${CNN_ARGS:---nets lenet cifar alexnet} --out "$out/cnn_p$p.json" || status=1
  done
fi
if has startup; then
  echo "== start-up on 1 GPU =="
  # each case is a fresh process of its own (no mpiexec: one worker), its tuning cache under $out
  "$py" benchmarks/startup_bench.py "$out" --device gpu ${STARTUP_ARGS:-} || status=1
fi
if has transfer; then
  for p in 1 "$ngpu"; do
    echo "== host <-> worker transfers on $p GPU(s) =="
    run "$p" benchmarks/transfer_bench.py --device gpu --out "$out/transfer_p$p.json" || status=1
  done
fi
if has pipeline; then
  echo "== input pipeline on 1 GPU =="
  run 1 benchmarks/pipeline_bench.py --device gpu --out "$out/pipeline.json" || status=1
fi
exit $status
