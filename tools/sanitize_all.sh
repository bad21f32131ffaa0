#!/usr/bin/env bash
# Sanitizer job: build tinylearn._C with -fsanitize=address,undefined -D_GLIBCXX_ASSERTIONS into a separate build
# dir (the project's .venv build is untouched), overlay it on a copy of the Python package and run the unit tests
# of the C++-backed topics against it. Usage: tools/sanitize_all.sh [pytest args]   (default: the C++ topic tests,
# tinylearn.topics.sanitizer_tests())
# Env: SAN_BUILD (default <checkout>/build/sanitize: per checkout, git-ignored), JOBS (build jobs, default nproc),
# SAN_WORKERS (pytest-xdist workers, default auto; 0 runs in-process, which prints a crashing test's full report).
# SAN_THREADS (OpenMP threads per worker, default 1).
# A CMake cache in SAN_BUILD that was generated from another source tree (another checkout) is wiped first.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py="$root/.venv/bin/python"
out="${SAN_BUILD:-$root/build/sanitize}"
jobs="${JOBS:-$(nproc)}"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -D_GLIBCXX_ASSERTIONS"
cache="$out/build/CMakeCache.txt"
if [ -f "$cache" ]; then
  cached_src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")
  if [ -z "$cached_src" ] || [ "$(cd "$cached_src" 2>/dev/null && pwd -P)" != "$(cd "$root" && pwd -P)" ]; then
    echo "sanitize_all: $cache was generated from '${cached_src}', not '$root': wiping $out/build" >&2
    rm -rf "$out/build"
  fi
fi
mkdir -p "$out/build" "$out/site"
cmake -S "$root" -B "$out/build" -DCMAKE_BUILD_TYPE=Debug -DTINYLEARN_NATIVE=OFF -DTINYLEARN_SANITIZE=ON \
  -DPython_EXECUTABLE="$py" -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_CXX_FLAGS_DEBUG="" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$out/build" -j "$jobs" --target _C
# overlay: a copy of the Python package with the sanitized extension in it, first on sys.path
rm -rf "$out/site/tinylearn"
cp -a "$root/tinylearn" "$out/site/tinylearn"
find "$out/site/tinylearn" \( -name "__pycache__" -o -name "_C*.so" \) -prune -exec rm -rf {} +
cp "$out"/build/_C*.so "$out/site/tinylearn/"
# the .venv's editable install puts a finder on sys.meta_path that would win over PYTHONPATH: drop it
cat > "$out/site/sitecustomize.py" <<'PY'
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in (type(f).__module__ + type(f).__name__).lower()]
PY
libasan=$(g++ -print-file-name=libasan.so)
libubsan=$(g++ -print-file-name=libubsan.so)
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  # the C++-reaching test modules of every topic row (tinylearn.topics.sanitizer_tests: the table decides)
  mapfile -t tests < <(cd "$root" && "$py" -c "from tinylearn import topics; print(*topics.sanitizer_tests(), sep='\n')")
  # nvcc is not an ASan binary and segfaults with libasan preloaded; the .cu compile checks do not touch _C
  # standalone_sanitizer tests build their own sanitized binary (make test ran them): not again under the overlay
  tests+=(-q -x -p no:cacheprovider -n "${SAN_WORKERS:-auto}" -k "not kernel_compiles" -m "not standalone_sanitizer")
fi
cd "$root"
# sanitizer options; pytest runs with --capture=sys: its default fd capture would swallow a report written to fd 2
# by a process that then dies (a UBSan/ASan abort inside a test shows only as a silent exit otherwise)
# allocator_may_return_null=1: a request too big for memory returns NULL as glibc does (numpy and torch then raise
# MemoryError, which the bad-input and garbage tests ask for) instead of ASan aborting with allocation-size-too-big
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# the check below makes sure the overlay (not the .venv editable build) is what the tests import
PYTHONSAFEPATH=1 PYTHONPATH="$out/site" LD_PRELOAD="$libasan $libubsan" OMP_NUM_THREADS=2 \
  "$py" -P -c "import tinylearn._C as C, sys; assert sys.argv[1] in C.__file__, C.__file__; print('sanitized _C:', C.__file__)" "$out/site"
# one OpenMP thread per xdist worker by default (SAN_THREADS; the threaded paths run in the tests that pass threads=)
PYTHONSAFEPATH=1 PYTHONPATH="$out/site" LD_PRELOAD="$libasan $libubsan" OMP_NUM_THREADS="${SAN_THREADS:-1}" \
  "$py" -P -m pytest --capture=sys "${tests[@]}"
