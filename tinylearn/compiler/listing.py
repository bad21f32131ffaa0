"""A readable listing of a ``FusedKernel`` (what ``show_code`` prints for the numpy backend)."""

from __future__ import annotations

from .kernel_ir import FusedKernel


def kernel_listing(k: FusedKernel) -> str:
    lines = [f"kernel {k.name}: domain {list(k.shape)}, reduce over last {k.reduce_dims}, {k.dtype}"]
    for i, b in enumerate(k.inputs):
        lines.append(f"  in{i}  {b.name}: {list(b.shape)} strides {list(b.strides)}")
    for i, b in enumerate(k.outputs):
        lines.append(f"  out{i} {b.name}: {list(b.shape)}")
    for ins in k.body:
        if ins.op == "load":
            lines.append(f"  r{ins.out} = load in{ins.attr}")
        elif ins.op == "const":
            lines.append(f"  r{ins.out} = const {ins.attr!r}")
        elif ins.op == "store":
            lines.append(f"  store out{ins.attr} <- r{ins.args[0]}")
        else:
            lines.append(f"  r{ins.out} = {ins.op} " + ", ".join(f"r{a}" for a in ins.args))
    if k.meta.get("nodes"):
        lines.append(f"  # fused graph nodes: {', '.join(k.meta['nodes'])}")
    return "\n".join(lines)
