#!/usr/bin/env bash
# The main job: examples/main_job.py on DMATH_WORKERS (default 4) MPI ranks.
# Extra arguments go to main_job.py. Runs from the caller's directory.
set -euo pipefail
# shellcheck source=SCRIPTDIR/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec mpiexec -n "${DMATH_WORKERS:-4}" python "$DMATH_ROOT/examples/main_job.py" "$@"
