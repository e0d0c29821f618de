# Sourced by the GPU scripts (tools/gpu_check.sh, benchmarks/*_gpu.sh) with their output folder as
# $1, from the repository root. Sets: out (made), py (PYTHON, default python3), ngpu, mpiexec
# (MPIEXEC, default mpiexec), openmpi (1 for Open MPI's launcher), mpiflags (Open MPI gets
# --oversubscribe; MPIFLAGS appended, e.g. "--cpu-set 8-15 --bind-to core") and
# run P ARGS... (TIMEOUT seconds, default 300, of `mpiexec -n P $py ARGS`). The wheels in .whl (the
# cuDNN frontend, ...) go into /tmp/site when the cuDNN frontend is not importable (the lent
# machines have no network).
out=$1
mkdir -p "$out"
py=${PYTHON:-python3}
if [ -d .whl ] && ! "$py" -c 'import cudnn' 2>/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
ngpu=$("$py" -c 'import cupy; print(cupy.cuda.runtime.getDeviceCount())' 2>/dev/null || echo 0)
mpiexec=${MPIEXEC:-mpiexec}
openmpi=0
mpiflags=()
if "$mpiexec" --version 2>&1 | grep -qiE 'open mpi|openrte'; then openmpi=1; mpiflags=(--oversubscribe); fi
read -r -a _gpu_env_extra <<< "${MPIFLAGS:-}"
mpiflags+=(${_gpu_env_extra[@]+"${_gpu_env_extra[@]}"})
run() { timeout "${TIMEOUT:-300}" "$mpiexec" ${mpiflags[@]+"${mpiflags[@]}"} -n "$1" "$py" "${@:2}"; }
