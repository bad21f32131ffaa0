"""Access to the compiled conv kernels (tinylearn._C.conv); a clear RuntimeError when they are not built."""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def cpp_module() -> ModuleType:
    try:
        from .. import _C
    except ImportError as e:
        raise RuntimeError(f"backend 'cpp': tinylearn._C is not built ({e}); run tools/build.sh") from e
    if not hasattr(_C, "conv"):
        raise RuntimeError("backend 'cpp': tinylearn._C has no 'conv' submodule; rebuild with tools/build.sh")
    return _C.conv


def cpp_available() -> bool:
    try:
        cpp_module()
    except RuntimeError:
        return False
    return True
