# shellcheck shell=bash
# Sourced (bash) by tools/*.sh: creates .venv in the repository root if
# missing, (re)installs the project into it when pyproject.toml changed, and
# puts .venv/bin (python, mpiexec from the mpich wheel) first on PATH.
# Returns non-zero on failure; callers run under `set -e`. No `set -e` here so
# that sourcing it from an interactive shell cannot close that shell.

DMATH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || return 1
export DMATH_ROOT
_dmath_venv=$DMATH_ROOT/.venv
_dmath_spec='.[mpi,test,docs]'   # docs: tools/test.sh builds the documentation

if [ ! -x "$_dmath_venv/bin/python" ]; then
    _dmath_py=${PYTHON:-python3}
    if ! command -v "$_dmath_py" >/dev/null 2>&1; then
        echo "env.sh: '$_dmath_py' not found; install Python >= 3.10 or set PYTHON=/path/to/python3" >&2
        return 1
    fi
    if ! "$_dmath_py" -m venv "$_dmath_venv"; then
        # Debian/Ubuntu ship venv without ensurepip; a failed run leaves a
        # half-made .venv behind that would be mistaken for a good one.
        rm -rf "$_dmath_venv"
        echo "env.sh: '$_dmath_py -m venv' failed; install the venv module (Debian/Ubuntu: apt-get install python3-venv)" >&2
        return 1
    fi
fi

# Reinstall only when pyproject.toml, the extras or the set of top-level
# packages changed. Source edits need no reinstall (editable install), but the
# editable finder maps only the packages present at install time: without the
# reinstall a dnn/ created later would not import outside the repository root.
_dmath_pkgs=
for _dmath_p in dmath dnn; do
    if [ -d "$DMATH_ROOT/$_dmath_p" ]; then _dmath_pkgs="$_dmath_pkgs $_dmath_p"; fi
done
# PyTorch, the oracle of some tests (the `oracle` extra, test-only), is installed only when
# that downloads no CUDA build of several GB: tools/oracle.py says when. DMATH_ORACLE=auto
# (default), 1 (always) or 0 (never); DMATH_TORCH_INDEX: an index with the CPU build.
_dmath_oracle=${DMATH_ORACLE:-auto}
_dmath_stamp="$_dmath_spec$_dmath_pkgs oracle=$_dmath_oracle${DMATH_TORCH_INDEX:+@$DMATH_TORCH_INDEX} $(cksum < "$DMATH_ROOT/pyproject.toml")" || return 1
if [ "$(cat "$_dmath_venv/.dmath-install-stamp" 2>/dev/null)" != "$_dmath_stamp" ]; then
    echo "env.sh: installing $_dmath_spec into .venv ..." >&2
    (cd "$DMATH_ROOT" && PIP_DISABLE_PIP_VERSION_CHECK=1 \
        "$_dmath_venv/bin/python" -m pip install -q -e "$_dmath_spec") || {
        echo "env.sh: pip install -e '$_dmath_spec' failed" >&2
        return 1
    }
    "$_dmath_venv/bin/python" "$DMATH_ROOT/tools/oracle.py" "$_dmath_oracle" || {
        echo "env.sh: installing the oracle extra failed" >&2
        return 1
    }
    printf '%s\n' "$_dmath_stamp" > "$_dmath_venv/.dmath-install-stamp" || return 1
fi
unset _dmath_py _dmath_spec _dmath_stamp _dmath_pkgs _dmath_p _dmath_oracle

export VIRTUAL_ENV=$_dmath_venv
export PATH="$_dmath_venv/bin:$PATH"
unset _dmath_venv

# Several MPI ranks share few cores: one BLAS/OpenMP thread per rank.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
export DMATH_DEVICE=${DMATH_DEVICE:-cpu}
# Hydra (MPICH's mpiexec) starts ranks with the fork launcher: no ssh, which
# containers often lack or cannot use. Single host only; unset for clusters.
export HYDRA_LAUNCHER=${HYDRA_LAUNCHER:-fork}
# Ranks write to pipes owned by mpiexec; unbuffered output keeps what a rank
# printed before a hang or a timeout kill.
export PYTHONUNBUFFERED=${PYTHONUNBUFFERED:-1}
