"""``tinylearn.compiler``: a small deep-learning compiler (topic 12), torch.compile's pipeline in miniature.

    trace (trace.py)        run the function once, record every Function.apply as a graph node (graph.py)
    passes (passes/)        shape inference, simplification, constant folding, CSE, DCE, pattern rewrites
    fusion (fusion.py)      point-wise chains and row reductions -> FusedKernel (kernel_ir.py; lowering.py)
    codegen                 FusedKernel -> C++ / Triton / CUDA source (codegen_*.py), or numpy (kernel_ir.evaluate)
    runtime (runtime.py)    extern calls + kernels in dependency order; autograd through the graph (autograd.py)
    compile (api.py)        guards, cache, recompiles, graph breaks -> eager, mark_dynamic, show_code

Public: ``compile``, ``trace``, ``show_code``, ``mark_dynamic``, ``Graph``, ``Node``, ``GraphBreak``.
"""

from .api import CompiledFunction, compile, mark_dynamic, show_code
from .graph import Graph, Node
from .trace import GraphBreak, trace

__all__ = ["compile", "trace", "show_code", "mark_dynamic", "Graph", "Node", "GraphBreak", "CompiledFunction"]
