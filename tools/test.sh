#!/usr/bin/env bash
# The whole test suite: the documentation build (`mkdocs build --strict`), then
# `tests` at 1 worker (plain python, no mpiexec), then `tests/dist` under mpiexec
# at 2, 3 and 4 workers, then the benchmarks once each (`--benchmark-disable`) at
# 1 and 2 workers. DMATH_DOCS=0 skips the documentation build. Worker counts come from
# DMATH_TEST_WORKERS (default "1 2 3 4"; 1 is the plain run) and
# DMATH_BENCH_WORKERS (default "1 2"; empty: none). Extra arguments
# go to every pytest call. All stages run; the exit status is non-zero if any
# stage failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=SCRIPTDIR/env.sh
source tools/env.sh

cap=${DMATH_TEST_TIMEOUT:-900}  # seconds per mpiexec run, so a hang fails

# mpiexec's exit status is not reliable: when a rank leaves with os._exit()
# (with or without MPI_Finalize), hydra may return 0 although rank 0's pytest
# failed, or 9 although every rank exited 0. So every rank runs pytest through
# this stub (same as `python -m pytest`) and rank 0 writes its exit status to
# a file, which decides the stage; a non-zero mpiexec status still fails it.
export DMATH_RANK0_RC
DMATH_RANK0_RC=$(mktemp)
trap 'rm -f "$DMATH_RANK0_RC"' EXIT
pytest_rank0='import os, sys, pytest
rc = int(pytest.main(sys.argv[1:]))
if os.environ.get("PMI_RANK", "0") == "0":
    with open(os.environ["DMATH_RANK0_RC"], "w") as f:
        f.write(str(rc))
sys.exit(rc)'

summary=()
failed=0
# PyTorch is the oracle of some tests: say whether they run (tools/oracle.py decides the install)
if oracle=$(python -c 'import torch; print(torch.__version__)' 2>/dev/null); then
    summary+=("PyTorch oracle tests: run (torch $oracle)")
else
    summary+=("PyTorch oracle tests: SKIPPED (no torch in .venv; see DMATH_ORACLE in README)")
fi
# stage WHAT P PATH [pytest args]: pytest on PATH at P workers (plain python at 1, else mpiexec);
# adds a summary line; "no tests collected" fails only the plain run of the whole suite (it holds
# every test), elsewhere it is fine (e.g. -k selected none there).
stage() {
    local what=$1 p=$2 path=$3 rc=0 note= r0 result
    shift 3
    echo "== $what at $p workers =="
    if [ "$p" = 1 ]; then
        python -m pytest -q "$path" "$@" || rc=$?
    else
        : > "$DMATH_RANK0_RC"
        # No cache plugin: all ranks run pytest and would race on .pytest_cache.
        # -k: SIGKILL if mpiexec ignores the TERM.
        timeout -k 30 "$cap" mpiexec -n "$p" python -c "$pytest_rank0" \
            -q -p no:cacheprovider "$path" "$@" || rc=$?
        r0=$(cat "$DMATH_RANK0_RC")
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
            :  # timed out
        elif [ -z "$r0" ]; then
            note=" (rank 0 did not finish pytest)"
            if [ "$rc" = 0 ]; then rc=1; fi
        elif [ "$r0" != 0 ]; then
            rc=$r0
        elif [ "$rc" != 0 ]; then
            note=" (rank 0 passed; another rank failed or was killed)"
        fi
    fi
    case $rc in
        0) result=passed ;;
        5) if [ "$path" = tests ]; then result="FAILED (no tests collected)"; else
               result="no tests collected"; rc=0; fi ;;
        124 | 137) result="TIMED OUT after ${cap}s" ;;
        *) result="FAILED (exit $rc)$note" ;;
    esac
    if [ "$rc" != 0 ]; then failed=1; fi
    summary+=("$what at $p workers: $result")
}

# The documentation: the pages in docs/ and the API reference that mkdocstrings makes from the
# docstrings of the public packages (mkdocs.yml). --strict fails on a broken cross-reference, a
# page missing from the nav, or a documented name that no longer imports. (Not --quiet: it hides
# the warnings from --strict, which then passes a broken build.)
if [ "${DMATH_DOCS:-1}" != 0 ]; then
    echo "== docs: mkdocs build --strict =="
    site=$(mktemp -d)
    if python -m mkdocs build --strict --site-dir "$site"; then
        summary+=("docs (mkdocs build --strict): passed")
    else
        summary+=("docs (mkdocs build --strict): FAILED")
        failed=1
    fi
    rm -rf "$site"
fi

for p in ${DMATH_TEST_WORKERS:-1 2 3 4}; do
    if [ "$p" = 1 ]; then stage tests 1 tests "$@"; else stage tests "$p" tests/dist "$@"; fi
done
# the pytest-benchmark benchmarks, each run once at the smallest sizes: their checks are tests
for p in ${DMATH_BENCH_WORKERS-1 2}; do
    stage "benchmarks (--benchmark-disable)" "$p" benchmarks --benchmark-disable "$@"
done

echo "== summary =="
printf '%s\n' "${summary[@]}"
exit "$failed"
