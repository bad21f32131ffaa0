"""Drive a real JupyterLab in headless Chromium through every notebook (`make test-lab`).

For each notebook: open it in JupyterLab, Run All, wait for the kernel to go idle, then assert that
  - no cell has an error output, and the last code cell ran;
  - at least one plot is rendered as an image in the page;
  - notebooks that use tqdm render their progress bars as widgets (ipywidgets), not as text fragments;
and save a screenshot (PNG) of the first plot. With --compare, each cell's outputs are also compared with the
committed ones by nbval's rules (tools/nbcompare.py), so a run under forced numeric paths (tools/portable.py starts
this script with its environment: the server and its kernels inherit it) is that path's nbval run as well.
Notebooks run two at a time (``--jobs``, default NB_JOBS or 2: two pages, each in its own workspace, driven from
this one thread), except those the topic table marks ``notebook_exclusive``, which run alone first; a notebook that
fails beside another is run again alone and named (as tools/nbval_run.py does for nbval).
The server's log is kept and the run fails on a server-side
traceback. The server runs from the project's .venv on 127.0.0.1 with a random token and temporary settings,
workspace and runtime dirs; autosave is off, so the committed notebooks are never modified. The server (and its
kernels) are started in their own process group and stopped by pid.

Browser: Debian's chromium (`apt-get install chromium`) driven by Playwright for Python with executable_path set
to it — no browser download. Without them the run prints the exact install command and exits 0 (SKIPPED), unless
--require is given (CI).

    python tools/lab_test.py [NOTEBOOK ...] [--out DIR] [--timeout-s 600] [--require] [--compare] [--jobs 2]
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

# starts Run All without waiting for it: window.__tlRun says 'running', then 'done' (or the error) when the
# command's promise settles (all cells executed), so several pages can run at once from this one thread
_RUN_ALL_JS = """async () => {
  const app = window.jupyterapp;
  const w = app.shell.currentWidget;
  await w.context.ready;
  await w.sessionContext.ready;
  window.__tlRun = 'running';
  app.commands.execute('notebook:run-all-cells').then(
    () => { window.__tlRun = 'done'; }, (e) => { window.__tlRun = 'error: ' + e; });
  return true;
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


class NotebookRun:
    """One notebook in its own page (and JupyterLab workspace): ``start`` opens it and starts Run All, ``poll`` says
    whether it has finished, ``finish`` checks the cells and returns (problems, seconds of open / run / check)."""

    def __init__(self, browser, server: LabServer, name: str, out_dir: Path, timeout_s: float, compare: bool) -> None:
        self.browser, self.server, self.name, self.out_dir = browser, server, name, out_dir
        self.timeout_s, self.compare = timeout_s, compare
        self.problems: list[str] = []
        self.phases: dict[str, float] = {}
        self.page = None
        self.t_start = self.t_run = time.time()

    def _fail(self, e: Exception) -> None:  # a driver error is a failure of this notebook, reported with its type
        self.problems.append(f"{type(e).__name__}: {str(e)[:300]}")
        try:
            self.page.screenshot(path=str(self.out_dir / f"{Path(self.name).stem}-error.png"))
        except Exception:
            pass

    def start(self, slot: int = 0) -> None:
        self.page = self.browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            # a workspace per slot, reset: the previous notebook (its kernel shut down) is not restored beside this one
            url = self.server.url(f"lab/workspaces/tl-slot{slot}/tree/{self.name}") + "&reset"
            self.page.goto(url, wait_until="domcontentloaded", timeout=60_000)
            self.page.wait_for_function(
                "(name) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                " return !!(w && w.context && w.context.path.endsWith(name) && w.content && w.content.model); }",
                arg=self.name,
                timeout=120_000,
            )
            self.t_run = time.time()
            self.phases["open"] = self.t_run - self.t_start
            self.page.evaluate(_RUN_ALL_JS)
        except Exception as e:
            self._fail(e)

    def poll(self) -> bool:
        """True once Run All has settled and the kernel is idle (or on a problem / the time limit)."""
        if self.problems:
            return True
        try:
            state = self.page.evaluate("() => window.__tlRun")
            if state != "running" and self.page.evaluate(_KERNEL_STATE_JS) == "idle":
                if state != "done":
                    self.problems.append(f"Run All: {state}"[:300])
                return True
        except Exception as e:
            self._fail(e)
            return True
        if time.time() - self.t_run > self.timeout_s:
            self.problems.append(f"kernel still busy after {self.timeout_s} s")
            return True
        return False

    def finish(self) -> tuple[list[str], dict[str, float]]:
        t_check = time.time()
        if "open" in self.phases:
            self.phases["run"] = t_check - self.t_run
        try:
            if not self.problems:
                cells = self.page.evaluate(_COLLECT_JS)
                self.problems += check_cells(cells)
                if self.compare:
                    import nbcompare

                    reference = nbcompare.nbformat.read(NB_DIR / self.name, as_version=4)
                    self.problems += nbcompare.compare_cells(reference, cells, nbcompare.sanitize_patterns())
                n_img = self.page.evaluate(
                    "() => { const i = document.querySelectorAll('.jp-RenderedImage img');"
                    " if (i.length) i[0].scrollIntoView({block: 'center'}); return i.length; }"
                )
                if n_img == 0:
                    self.problems.append("no plot image rendered in the page")
                time.sleep(0.2)
                self.page.screenshot(path=str(self.out_dir / f"{Path(self.name).stem}.png"))
            self.page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
            self.phases["check"] = time.time() - t_check
        except Exception as e:
            self._fail(e)
        finally:
            self.page.close()
        return self.problems, self.phases


def run_notebooks(
    browser, server: LabServer, names: list[str], out_dir: Path, timeout_s: float, compare: bool, jobs: int
) -> dict[str, list[str]]:
    """Run ``names``: the topic table's exclusive notebooks one at a time first, the others ``jobs`` at a time;
    one that fails beside another is run again alone (it passes only there, and is named). Returns the failures."""
    from tinylearn.topics import notebook_plan

    alone, queue = notebook_plan(names, jobs)
    failures: dict[str, list[str]] = {}

    def report(run: NotebookRun, shared: bool) -> list[str]:
        probs, phases = run.finish()
        status = "ok" if not probs else ("SHARED-FAIL" if shared else "FAIL")
        split = ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
        print(f"{status:4s} {run.name:40s} {time.time() - run.t_start:6.1f} s  ({split})", flush=True)
        for p in probs:
            print(f"       - {p}")
        return probs

    def one(name: str) -> list[str]:
        run = NotebookRun(browser, server, name, out_dir, timeout_s, compare)
        run.start()
        while not run.poll():
            time.sleep(0.2)
        return report(run, False)

    for n in alone:
        if probs := one(n):  # a timing assert under load from outside: one more run alone, named (as nbval_run.py)
            print(f"lab test: {n} failed alone ({probs[0][:120]}); running it once more", flush=True)
            if again := one(n):
                failures[n] = again
            else:
                print(f"lab test: NOTE {n} passed on a second run alone after failing the first: {probs[0][:200]}")
    active: list[tuple[int, NotebookRun]] = []
    rerun: list[tuple[str, str]] = []
    while queue or active:
        while queue and len(active) < jobs:
            slot = min(set(range(jobs)) - {s for s, _ in active})
            run = NotebookRun(browser, server, queue.pop(0), out_dir, timeout_s, compare)
            run.start(slot)
            active.append((slot, run))
        done = [(s, r) for s, r in active if r.poll()]
        for s, r in done:
            active.remove((s, r))
            if probs := report(r, True):  # named by the cell's error when one raised
                rerun.append((r.name, next((p for p in probs if " raised " in p), probs[0])))
        if not done:
            time.sleep(0.2)
    for n, first in rerun:
        print(f"lab test: {n} failed beside another notebook ({first[:120]}); running it alone", flush=True)
        if probs := one(n):
            failures[n] = probs
        else:
            print(f"lab test: NOTE {n} passed alone but failed while sharing the cores: {first[:200]}")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", help="notebook names (default: every notebooks/*.ipynb)")
    ap.add_argument("--out", default=str(ROOT / "build" / "lab-test"), help="screenshots and server log go here")
    ap.add_argument("--timeout-s", type=float, default=600, help="per-notebook limit for Run All")
    ap.add_argument("--require", action="store_true", help="fail (instead of skipping) without chromium/playwright")
    ap.add_argument("--compare", action="store_true", help="compare outputs with the committed ones (nbval)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=int(os.environ.get("NB_JOBS", "2")),
        help="notebooks at once where they may share the cores (default NB_JOBS or 2; as nbval_run.py)",
    )
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    sys.path.insert(0, str(ROOT))

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
                failures.update(run_notebooks(browser, server, names, out_dir, args.timeout_s, args.compare, args.jobs))
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
