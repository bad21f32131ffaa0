"""numba's CUDA simulator in one place, for the numba.cuda lesson modules (``gemm.numba_sim``, ``kernels.numba_sim``).

The simulator (NUMBA_ENABLE_CUDASIM=1) must be chosen before numba is first imported:

    select()                              at a module's import: turn it on when numba is not imported yet, the
                                          variable is unset and no GPU is present; True when it is on
    check_usable(module, simulated)       RuntimeError when neither the simulator nor a GPU can launch a kernel
    run_in_subprocess(module, func, funcs, *args)
                                          ``module.func(*args)`` in a fresh interpreter with the simulator on
                                          (arrays and ints in, one array out): what the tests and notebooks use
                                          when numba may already be imported without it
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ENV = "NUMBA_ENABLE_CUDASIM"


def select() -> bool:
    """Turn the simulator on when numba is not imported yet, ``NUMBA_ENABLE_CUDASIM`` is unset and there is no GPU;
    returns whether the simulator is on."""
    if "numba" not in sys.modules and os.environ.get(ENV) is None:
        from .backends import cuda_available

        if not cuda_available():
            os.environ[ENV] = "1"
    return os.environ.get(ENV) == "1"


def check_usable(module: str, simulated: bool) -> None:
    """RuntimeError naming ``module`` when kernels cannot run: not simulated and no GPU."""
    from numba import cuda

    if not (simulated or cuda.is_available()):
        raise RuntimeError(
            f"{module}: numba was imported before {ENV}=1 was set and there is no GPU; "
            f"call {module}.run_in_subprocess(...) or set the variable before importing numba"
        )


def run_in_subprocess(
    module: str, func: str, funcs: tuple[str, ...], *args: np.ndarray | int, timeout_s: float = 300
) -> np.ndarray:
    """``module.func(*args)`` in a fresh interpreter with the simulator on; ``func`` must be one of ``funcs``.

    Arguments travel through an .npz file (0-d ones come back as ints), the result as one .npy array. RuntimeError
    with the end of the child's stderr when it fails."""
    if func not in funcs:
        raise ValueError(f"func: unknown simulator function {func!r}; known: {', '.join(funcs)}")
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in.npz", Path(tmp) / "out.npy"
        np.savez(inp, *[np.asarray(x) for x in args])
        code = (
            "import importlib, os, numpy as np\n"
            f"os.environ[{ENV!r}] = '1'\n"
            f"m = importlib.import_module({module!r})\n"
            f"d = np.load({str(inp)!r})\n"
            "args = [d[k] if d[k].ndim else int(d[k]) for k in d.files]\n"
            f"np.save({str(out)!r}, np.asarray(m.{func}(*args)))\n"
        )
        env = dict(os.environ, **{ENV: "1"})
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"numba simulator subprocess failed:\n{proc.stderr[-2000:]}")
        return np.load(out)
