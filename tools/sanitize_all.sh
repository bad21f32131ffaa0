#!/usr/bin/env bash
# Sanitizer job: build tinylearn._C with -fsanitize=address,undefined -D_GLIBCXX_ASSERTIONS into a separate build
# dir (the project's .venv build is untouched), overlay it on a copy of the Python package and run the unit tests
# of the C++-backed topics against it. Usage: tools/sanitize_all.sh [pytest args]   (default: the C++ topic tests)
# Env: SAN_BUILD (default /tmp/tinylearn-san), JOBS (default nproc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py="$root/.venv/bin/python"
out="${SAN_BUILD:-/tmp/tinylearn-san}"
jobs="${JOBS:-$(nproc)}"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -D_GLIBCXX_ASSERTIONS"
mkdir -p "$out/build" "$out/site"
cmake -S "$root" -B "$out/build" -DCMAKE_BUILD_TYPE=Debug -DTINYLEARN_NATIVE=OFF \
  -DPython_EXECUTABLE="$py" -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" \
  -DCMAKE_CXX_FLAGS="$flags -O1" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
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
  tests=(tests/test_conv.py tests/test_kernels.py tests/test_kernels_cpu.py tests/test_sparse.py tests/test_memory.py
    tests/test_quant.py tests/test_gemm.py tests/test_optim.py tests/test_bad_input.py -q -x -p no:cacheprovider)
fi
cd "$root"
# the check below makes sure the overlay (not the .venv editable build) is what the tests import
PYTHONSAFEPATH=1 PYTHONPATH="$out/site" LD_PRELOAD="$libasan $libubsan" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 OMP_NUM_THREADS=2 \
  "$py" -P -c "import tinylearn._C as C, sys; assert sys.argv[1] in C.__file__, C.__file__; print('sanitized _C:', C.__file__)" "$out/site"
PYTHONSAFEPATH=1 PYTHONPATH="$out/site" LD_PRELOAD="$libasan $libubsan" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 OMP_NUM_THREADS=2 \
  "$py" -P -m pytest "${tests[@]}"
