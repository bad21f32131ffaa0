"""Drive a real JupyterLab in headless Chromium through every notebook (`make test-lab`).

For each notebook: open it in JupyterLab, Run All, wait for the kernel to go idle, then assert that
  - no cell has an error output, and the last code cell ran;
  - at least one plot is rendered as an image in the page;
  - notebooks that use tqdm render their progress bars as widgets (ipywidgets), not as text fragments;
and save a screenshot (PNG) of the first plot. With --compare, each cell's outputs are also compared with the
committed ones by nbval's rules (tools/nbcompare.py), so a run under forced numeric paths (tools/portable.py starts
this script with its environment: the server and its kernels inherit it) is that path's nbval run as well.
The server's log is kept and the run fails on a server-side
traceback. The server runs from the project's .venv on 127.0.0.1 with a random token and temporary settings,
workspace and runtime dirs; autosave is off, so the committed notebooks are never modified. The server (and its
kernels) are started in their own process group and stopped by pid.

Browser: Debian's chromium (`apt-get install chromium`) driven by Playwright for Python with executable_path set
to it — no browser download. Without them the run prints the exact install command and exits 0 (SKIPPED), unless
--require is given (CI).

    python tools/lab_test.py [NOTEBOOK ...] [--out DIR] [--timeout-s 600] [--require] [--compare]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
INSTALL_HINT = "apt-get install -y chromium && .venv/bin/pip install playwright ipywidgets"

# Evaluated in the page: the notebook panel's model as plain data (needs --expose-app-in-browser).
_COLLECT_JS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const out = [];
  for (const c of w.content.model.cells) {
    out.push({type: c.type, count: c.type === 'code' ? c.executionCount : null,
              source: c.sharedModel.getSource(),
              outputs: c.type === 'code' ? c.outputs.toJSON() : []});
  }
  return out;
}"""

_RUN_ALL_JS = """async () => {
  const app = window.jupyterapp;
  const w = app.shell.currentWidget;
  await w.context.ready;
  await w.sessionContext.ready;
  return await app.commands.execute('notebook:run-all-cells');
}"""

_KERNEL_STATE_JS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  return k ? k.status : 'no-kernel';
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium() -> str | None:
    return next((p for p in CHROMIUM_CANDIDATES if os.access(p, os.X_OK)), None)


def _write_settings(settings: Path) -> None:
    """User settings for the temporary JupyterLab: autosave off, no news/update checks."""
    files = {
        "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
        # render every cell (JupyterLab 4 virtualises off-screen cells by default): plots are then in the DOM
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
    }
    for rel, data in files.items():
        p = settings / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(data))


class LabServer:
    """jupyter lab on 127.0.0.1 in its own process group, stopped by pid."""

    def __init__(self, root_dir: Path, log_path: Path, tmp: Path) -> None:
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.log_path = log_path
        env = dict(os.environ)
        env.update(
            JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
            JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
            JUPYTER_CONFIG_DIR=str(tmp / "config"),
            PYTHONUNBUFFERED="1",
        )
        _write_settings(tmp / "settings")
        cmd = [
            str(Path(sys.executable).parent / "jupyter"),
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={root_dir}",
            "--expose-app-in-browser",
            "--LabApp.news_url=",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def wait_ready(self, timeout_s: float = 90) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"jupyter lab did not answer within {timeout_s} s; see {self.log_path}")

    def stop(self) -> list[int]:
        """SIGTERM the group, then SIGKILL what is left; returns pids still alive afterwards (should be [])."""
        pgid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            time.sleep(0.5)
        self._log.close()
        alive = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if os.getpgid(int(p.name)) == pgid:
                        alive.append(int(p.name))
                except (ProcessLookupError, PermissionError):
                    pass
        return alive


def check_cells(cells: list[dict]) -> list[str]:
    """Problems in one notebook's executed cells (pure function; unit-tested)."""
    problems = []
    code = [c for c in cells if c["type"] == "code" and c["source"].strip()]
    if not code:
        return ["no code cells"]
    if code[-1]["count"] is None:
        problems.append("the last code cell did not run")
    not_run = [i for i, c in enumerate(code) if c["count"] is None]
    if not_run:
        problems.append(f"code cells not executed: {not_run[:10]}")
    for i, c in enumerate(code):
        for o in c["outputs"]:
            if o.get("output_type") == "error":
                problems.append(f"code cell {i} raised {o.get('ename')}: {o.get('evalue')}"[:300])
    if not any("image/png" in o.get("data", {}) for c in code for o in c["outputs"]):
        problems.append("no plot (image/png output)")
    uses_tqdm = any("tqdm" in c["source"] for c in code)
    has_widget = any(
        "application/vnd.jupyter.widget-view+json" in o.get("data", {}) for c in code for o in c["outputs"]
    )
    if uses_tqdm and not has_widget:
        problems.append("uses tqdm but no progress-bar widget was rendered (ipywidgets missing?)")
    return problems


def run_notebook(
    browser, server: LabServer, name: str, out_dir: Path, timeout_s: float, compare: bool = False
) -> tuple[list[str], dict[str, float]]:
    """Open, Run All, check: the problems found and the seconds of each phase (open, run, check)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems: list[str] = []
    phases: dict[str, float] = {}
    t_open = time.time()
    try:
        # &reset: a fresh workspace, so the previous notebook (its kernel shut down) is not restored beside this one
        page.goto(server.url(f"lab/tree/{name}") + "&reset", wait_until="domcontentloaded", timeout=60_000)
        page.wait_for_function(
            "(name) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            " return !!(w && w.context && w.context.path.endsWith(name) && w.content && w.content.model); }",
            arg=name,
            timeout=120_000,
        )
        t0 = time.time()
        phases["open"] = t0 - t_open
        page.evaluate(_RUN_ALL_JS)
        while page.evaluate(_KERNEL_STATE_JS) not in ("idle",):
            if time.time() - t0 > timeout_s:
                problems.append(f"kernel still busy after {timeout_s} s")
                break
            time.sleep(0.2)
        t_check = time.time()
        phases["run"] = t_check - t0
        cells = page.evaluate(_COLLECT_JS)
        problems += check_cells(cells)
        if compare:
            import nbcompare

            reference = nbcompare.nbformat.read(NB_DIR / name, as_version=4)
            problems += nbcompare.compare_cells(reference, cells, nbcompare.sanitize_patterns())
        n_img = page.evaluate(
            "() => { const i = document.querySelectorAll('.jp-RenderedImage img');"
            " if (i.length) i[0].scrollIntoView({block: 'center'}); return i.length; }"
        )
        if n_img == 0:
            problems.append("no plot image rendered in the page")
        time.sleep(0.2)
        page.screenshot(path=str(out_dir / f"{Path(name).stem}.png"))
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
        phases["check"] = time.time() - t_check
    except Exception as e:  # a driver error is a failure of this notebook, reported with its type
        problems.append(f"{type(e).__name__}: {str(e)[:300]}")
        try:
            page.screenshot(path=str(out_dir / f"{Path(name).stem}-error.png"))
        except Exception:
            pass
    finally:
        page.close()
    return problems, phases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", help="notebook names (default: every notebooks/*.ipynb)")
    ap.add_argument("--out", default=str(ROOT / "build" / "lab-test"), help="screenshots and server log go here")
    ap.add_argument("--timeout-s", type=float, default=600, help="per-notebook limit for Run All")
    ap.add_argument("--require", action="store_true", help="fail (instead of skipping) without chromium/playwright")
    ap.add_argument("--compare", action="store_true", help="compare outputs with the committed ones (nbval)")
    args = ap.parse_args(argv)

    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = [n for n, ok in (("chromium", chromium), ("playwright", sync_playwright)) if not ok]
    if missing:
        msg = f"lab test: {', '.join(missing)} not available; install with: {INSTALL_HINT}"
        print(("FAILED: " if args.require else "SKIPPED: ") + msg)
        return 1 if args.require else 0

    names = args.notebooks or sorted(p.name for p in NB_DIR.glob("*.ipynb"))
    names = [n if n.endswith(".ipynb") else n + ".ipynb" for n in names]
    for n in names:
        if not (NB_DIR / n).is_file():
            raise SystemExit(f"notebooks: no such notebook {n!r} in {NB_DIR}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    before = {n: (NB_DIR / n).read_bytes() for n in names}

    failures: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="tl-lab-") as tmp:
        server = LabServer(NB_DIR, out_dir / "jupyter-server.log", Path(tmp))
        try:
            server.wait_ready()
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
                for n in names:
                    t0 = time.time()
                    probs, phases = run_notebook(browser, server, n, out_dir, args.timeout_s, args.compare)
                    status = "ok" if not probs else "FAIL"
                    split = ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
                    print(f"{status:4s} {n:40s} {time.time() - t0:6.1f} s  ({split})", flush=True)
                    for p in probs:
                        print(f"       - {p}")
                    if probs:
                        failures[n] = probs
                browser.close()
        finally:
            alive = server.stop()
    log = (out_dir / "jupyter-server.log").read_text(errors="replace")
    if "Traceback (most recent call last)" in log:
        failures["server"] = [f"server-side traceback in {out_dir / 'jupyter-server.log'}"]
    if alive:
        failures["processes"] = [f"processes left running after shutdown: {alive}"]
    changed = [n for n in names if (NB_DIR / n).read_bytes() != before[n]]
    if changed:
        failures["files"] = [f"notebooks modified on disk by the run: {changed}"]
    print(f"lab test: screenshots and server log in {out_dir}")
    if failures:
        print(f"lab test: FAILED ({len(failures)} problem group(s): {', '.join(failures)})")
        return 1
    same = ", outputs equal to the committed ones by nbval's rules" if args.compare else ""
    print(f"lab test: {len(names)} notebooks ran in JupyterLab without errors{same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
