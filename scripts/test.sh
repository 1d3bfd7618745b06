#!/usr/bin/env bash
# Set up (dev requirements) and run the whole test suite, slow end-to-end tests included.
# Two pytest workers (pytest-xdist), a test file per worker at a time so that module fixtures
# are built once: ~7 min instead of ~11 on a 2-core CPU, since much of a test's time is one
# thread (a subprocess's imports, a browser waiting on the server). EAGLE_LENS_TEST_WORKERS=0
# runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh requirements-dev.txt
. .venv/bin/activate
python -m pytest -q -n "${EAGLE_LENS_TEST_WORKERS:-2}" --dist loadfile "$@"
