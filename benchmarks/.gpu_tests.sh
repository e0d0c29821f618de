ls /tmp/site/cudnn >/dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 DMATH_DEVICE=gpu DNN_DATA_DIR=$PWD/.data
python3 -c "from mpi4py import MPI; print('thread level', MPI.Query_thread(), 'multiple', MPI.THREAD_MULTIPLE)" 2>&1 | tail -1
for p in 1 2 4; do
  timeout 250 mpiexec --oversubscribe -n $p python3 -m pytest -q -p no:cacheprovider tests/dist > $OUT/tests_gpu_p$p.log 2>&1
  echo "p=$p rc=$?"; grep -E "passed|failed" $OUT/tests_gpu_p$p.log | tail -2; grep -E "^FAILED" $OUT/tests_gpu_p$p.log | head -5
done
