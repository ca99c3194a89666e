#!/usr/bin/env bash
# Run verl's own CPU unit tests for DataProto and core_algos against this checkout of hybridrl.
# Usage: compat/verl_tests.sh [--show-failures] [--keep DIR] [--verl-version X.Y.Z]
# PYTHON selects the interpreter (one where hybridrl's dependencies and pytest are installed).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${PYTHON:-python}" "$here/run_verl_tests.py" "$@"
