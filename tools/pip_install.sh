#!/usr/bin/env bash
# `pip install` into a venv, through uv when uv can be had (make setup, make lint's bootstrap).
#
# Why: on the 2-core CI box pip spends ~200 s resolving and unpacking the dependency set (torch, jupyterlab, ...);
# uv installs the same pinned versions in ~30 s. uv does not read pip's configuration, so the settings this pip
# would use — find-links, index URLs, constraint files (pip.conf files and PIP_* variables alike), the CA
# certificate — are read from `pip config list` and passed on. Versions stay exactly those of constraints.txt
# (every package is pinned there), so the environment is the same as with pip. If uv cannot be installed or fails,
# pip runs instead (TINYLEARN_NO_UV=1 forces pip).
#
# Usage: tools/pip_install.sh VENV_PYTHON [pip install arguments ...]
set -euo pipefail
py=$1
shift
uv="$(dirname "$py")/uv"
pins="$(cd "$(dirname "$0")/.." && pwd)/constraints.txt"  # uv's own version is pinned there too
if [ "${TINYLEARN_NO_UV:-0}" != 1 ] && { [ -x "$uv" ] || "$py" -m pip install -q -c "$pins" uv >/dev/null 2>&1; } \
  && [ -x "$uv" ]; then
  args=()
  while IFS= read -r line; do
    key=${line%%=*}
    val=${line#*=}
    val=${val#\'}
    val=${val%\'}
    case "$key" in
    *.find-links) for v in $val; do args+=(--find-links "$v"); done ;;
    *.extra-index-url) for v in $val; do args+=(--extra-index-url "$v"); done ;;
    *.index-url) args+=(--index-url "$val") ;;
    *.constraint) for v in $val; do args+=(--constraint "$v"); done ;;
    *.cert) export SSL_CERT_FILE="$val" ;;
    esac
  done < <("$py" -m pip config list 2>/dev/null || true)
  # several indexes (PyPI, local mirrors, find-links) may carry the same pinned version: pick the best match, as
  # pip does, instead of uv's default "first index that has the name"
  if "$uv" pip install --python "$py" --index-strategy unsafe-best-match "${args[@]}" "$@"; then
    exit 0
  fi
  echo "tools/pip_install.sh: uv failed; installing with pip instead" >&2
fi
exec "$py" -m pip install "$@"
