#!/usr/bin/env python3
"""nbval over the notebooks, two at a time where they may share the cores (``make test-notebooks``).

The notebooks the topic table marks ``notebook_exclusive`` (an assert reads a measurement of several processes, of
the cores' capacity or of latency tails: notebook 06's collective times, 13's TPOT p99, 18's real jobs) run first,
one at a time, with the cores to themselves. The others run ``--jobs`` at a time on pytest-xdist workers
(``--dist loadfile``: each notebook's cells stay in order on one kernel). A notebook that fails beside another is
run again alone: it passes only if it passes there, and the report names it and its first failure, so a notebook
whose claims do not survive a busy neighbour (the learner's busy laptop) is visible rather than hidden. A notebook
that fails alone (its timing asserts met load from outside this machine's own jobs: a shared host) gets one more
run alone, under the same rule: it passes only if that run passes, and a NOTE names it and its first failure.
``--jobs 1`` runs every notebook one at a time.

    python tools/nbval_run.py                      # every notebook
    python tools/nbval_run.py --jobs 1             # one at a time
    python tools/nbval_run.py 05_fused_kernels     # some of them
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
NBVAL = ["--nbval-sanitize-with", "notebooks/sanitize.cfg", "-q", "-p", "no:cacheprovider", "-rf"]
FAILED = re.compile(r"^FAILED (notebooks/[^:]+\.ipynb)::(.*)$")


def _pytest(paths: list[str], extra: list[str]) -> tuple[int, dict[str, str]]:
    """Run nbval on ``paths``, echoing its output: (exit code, notebook path -> its first failure line)."""
    cmd = [sys.executable, "-m", "pytest", "--nbval", *paths, *NBVAL, *extra]
    failed: dict[str, str] = {}
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        assert p.stdout is not None
        for line in p.stdout:
            sys.stdout.write(line)
            m = FAILED.match(line.rstrip())
            if m:
                failed.setdefault(m.group(1), re.sub(r"\x1b\[[0-9;]*m", "", m.group(2))[:200])
    sys.stdout.flush()
    return p.returncode, failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", help="notebook names (default: every notebooks/*.ipynb)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("NB_JOBS", "2")),
                    help="notebooks at once where they may share the cores (default NB_JOBS or 2)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    sys.path.insert(0, str(ROOT))
    from tinylearn.topics import notebook_plan

    names = args.notebooks or sorted(p.name for p in NB_DIR.glob("*.ipynb"))
    names = [n if n.endswith(".ipynb") else n + ".ipynb" for n in names]
    missing = [n for n in names if not (NB_DIR / n).is_file()]
    if missing:
        ap.error(f"notebooks: no such notebook(s) {missing} in {NB_DIR}")
    paths = [f"notebooks/{n}" for n in names]
    exclusive, shared = ([f"notebooks/{n}" for n in part] for part in notebook_plan(names, args.jobs))
    t0, bad = time.time(), []

    def run(paths: list[str], extra: list[str], failed_how: str, passed_how: str) -> None:
        """nbval over ``paths``; each notebook that fails is run once more alone and passes only if that run does
        (``bad`` collects the rest), a NOTE naming it and its first failure otherwise."""
        code, failed = _pytest(paths, extra)
        if code and not failed:
            bad.append(f"(pytest exit {code}, no failed cell reported)")
        for nb, first in failed.items():
            print(f"nbval: {nb} failed {failed_how} ({first}); running it alone once more")
            if _pytest([nb], [])[0]:
                bad.append(nb)
            else:
                print(f"nbval: NOTE {nb} passed alone but failed {passed_how}: {first}")

    if exclusive:  # a failure alone: a timing assert met load from outside this machine's own jobs
        print(f"nbval: {len(exclusive)} notebook(s) one at a time: {', '.join(Path(p).stem for p in exclusive)}")
        run(exclusive, [], "alone", "its first run alone")
    if shared:
        print(f"nbval: {len(shared)} notebooks, {args.jobs} at a time")
        run(shared, ["-n", str(args.jobs), "--dist", "loadfile"], "beside another notebook", "while sharing the cores")
    status = "FAILED: " + ", ".join(bad) if bad else "all passed"
    print(f"nbval: {len(paths)} notebooks in {time.time() - t0:.0f} s, {status}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
