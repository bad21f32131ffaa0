"""tinylearn's exception classes: each subclasses the built-in torch raises (so ``except RuntimeError`` /
``except IndexError`` in a ported torch script catches it) and ValueError (tinylearn's bad-argument convention)."""

from __future__ import annotations


class ShapeError(RuntimeError, ValueError):
    """A shape mismatch: both RuntimeError (what torch code catches) and ValueError (tinylearn's convention)."""


class DimError(IndexError, ValueError):
    """A dim (or an index) out of range: IndexError (what torch raises) and ValueError (tinylearn's convention)."""


class OutOfMemoryError(RuntimeError, MemoryError):
    """An allocation too big for this machine: RuntimeError (torch's CPU allocator raises one, "you tried to allocate N
    bytes") and MemoryError (what numpy code catches)."""


def dim_error(name: str, d: object, nd: int) -> DimError:
    """The one message for a dim out of range: names the argument, its value and the valid range (as torch)."""
    n = max(nd, 1)
    return DimError(f"{name}: dimension {d} out of range for a tensor with {nd} dims (expected in [{-n}, {n - 1}])")


class broadcasting:  # noqa: N801  (used as a statement: ``with broadcasting("op", a, b):``)
    """Re-raises numpy's broadcast ValueError inside the block as a ShapeError naming the op and the shapes."""

    __slots__ = ("op", "xs")

    def __init__(self, op: str, *xs: object) -> None:
        self.op, self.xs = op, xs

    def __enter__(self) -> broadcasting:
        return self

    def __exit__(self, et: type | None, e: BaseException | None, tb: object) -> bool:
        if et is not None and issubclass(et, ValueError) and not issubclass(et, ShapeError) and "broadcast" in str(e):
            import numpy as np

            shapes = " and ".join(str(np.shape(x)) for x in self.xs)
            raise ShapeError(f"{self.op}: shapes {shapes} cannot be broadcast together") from None
        return False
