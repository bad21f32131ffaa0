#!/usr/bin/env bash
# The system tools tinylearn needs beyond pip, installed when missing (used by `make setup` and .ci/run):
#   g++            builds tinylearn._C            python3-venv   `python3 -m venv` on Debian/Ubuntu
#   clang          tinygrad's CPU device (the tinygrad columns of every benchmark)
#   openmpi-bin, libopenmpi-dev   mpirun for the MPI cross-check of the all-reduce topic (+ headers for mpi4py)
#   chromium       the headless browser `make test-lab` drives through JupyterLab (Playwright, no browser download)
# How: as root through apt-get; otherwise through passwordless `sudo -n`; otherwise it prints the exact command
# and exits 0 — everything that does not need the missing tool still works (tests skip, benchmarks say n/a).
# Usage: tools/system_deps.sh [--check]   (--check: only report what is missing, install nothing)
set -uo pipefail
py=${PYTHON3:-python3}
need=()
command -v g++ >/dev/null || need+=(g++)
command -v clang >/dev/null || need+=(clang)
command -v mpirun >/dev/null || need+=(openmpi-bin)
command -v mpicc >/dev/null || need+=(libopenmpi-dev)
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || need+=(chromium)
if command -v "$py" >/dev/null && ! "$py" -c "import ensurepip, venv" 2>/dev/null; then need+=(python3-venv); fi
[ ${#need[@]} -eq 0 ] && exit 0

install="apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${need[*]}"
why="clang: tinygrad benchmark columns; Open MPI: MPI cross-check; chromium: make test-lab; g++/python3-venv: the build"
if [ "${1:-}" = "--check" ]; then
  echo "system deps: missing ${need[*]} ($why); install with: sudo $install"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "system deps: missing ${need[*]} ($why) and no apt-get here; install them with your package manager"
  echo "  (conda: conda env create -f environment.yml provides clang and openmpi)"
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  runner=(sh -c)
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  runner=(sudo -n sh -c)
else
  echo "system deps: missing ${need[*]} ($why)."
  echo "  Not root and no passwordless sudo, so nothing was installed. Run:"
  echo "    sudo sh -c '$install'"
  echo "  Everything else works without them (tests skip with a reason, benchmarks print n/a)."
  exit 0
fi
echo "system deps: installing ${need[*]} (${runner[0]})"
if ! "${runner[@]}" "$install" >/tmp/tinylearn-apt.log 2>&1; then
  echo "system deps: apt-get failed (log: /tmp/tinylearn-apt.log); last lines:"
  tail -5 /tmp/tinylearn-apt.log
  echo "  run it yourself: sudo sh -c '$install'"
fi
exit 0
