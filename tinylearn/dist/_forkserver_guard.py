"""Imported only inside the multiprocessing forkserver that ``launch`` starts (via its preload list).

Invariant: the forkserver never outlives the process that launched it. A daemon thread polls the parent pid;
when the launcher dies (even by SIGKILL) the server exits, and its rank children, which set PR_SET_PDEATHSIG,
are killed with it. Do not import this module anywhere else.
"""

from __future__ import annotations

import os
import threading
import time

_PARENT = os.getppid()


def _watch() -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != _PARENT:
            os._exit(0)


if os.environ.get("TINYLEARN_FORKSERVER_GUARD") == "1":
    threading.Thread(target=_watch, daemon=True, name="tl-forkserver-guard").start()
