#!/usr/bin/env bash
# `make lab`: JupyterLab from the project's .venv, on 127.0.0.1 with a token, opened on notebooks/00_tour.ipynb with
# the file browser at notebooks/. As root (containers, cloud boxes) it adds --allow-root and says so.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${VENV:-$root/.venv}"
args=(lab --ip=127.0.0.1 "--ServerApp.root_dir=$root/notebooks" "--LabApp.default_url=/lab/tree/00_tour.ipynb")
if [ "$(id -u)" = 0 ]; then
  echo "lab: running as root, so adding --allow-root (JupyterLab refuses root otherwise); it listens on 127.0.0.1 only."
  args+=(--allow-root)
fi
# No display (a server, a container): don't try to open a browser; the URL with its token is printed below.
if [ -z "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] && [ "$(uname)" = Linux ]; then
  args+=(--no-browser)
fi
exec "$venv/bin/jupyter" "${args[@]}" "$@"
