#!/usr/bin/env bash
# (Re)build tinylearn._C into the project venv, incrementally (build/ is kept), serialised with a lock so that
# several shells can call it at once. Usage: tools/build.sh   (from anywhere)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py="${PYTHON:-$root/.venv/bin/python}"
mkdir -p "$root/build"
exec 9>"$root/build/.lock"
flock 9
cd "$root"
"$py" -m pip install --no-build-isolation --no-deps -e . -q "$@"
"$py" -c "import tinylearn._C as C; print('tinylearn._C built:', ', '.join(C.submodules))"
