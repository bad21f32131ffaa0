"""nbval setup for the notebooks: stderr streams are not compared (warnings and progress bars vary by machine).

Everything else follows nbval's strict comparison; cells whose first line is ``# NBVAL_IGNORE_OUTPUT`` are run but
not compared (timings). Images are never compared by nbval without nbdime.
"""

from __future__ import annotations

try:
    from nbval.plugin import IPyNbCell
except ImportError:  # nbval not installed: nothing to configure
    IPyNbCell = None

if IPyNbCell is not None and not getattr(IPyNbCell, "_tinylearn_stderr_patch", False):
    _orig_compare = IPyNbCell.compare_outputs

    def _compare_without_stderr(self, test, ref, skip_compare=None):
        def keep(o):
            return not (o.get("output_type") == "stream" and o.get("name") == "stderr")

        return _orig_compare(self, [o for o in test if keep(o)], [o for o in ref if keep(o)], skip_compare)

    IPyNbCell.compare_outputs = _compare_without_stderr
    IPyNbCell._tinylearn_stderr_patch = True

# A non-interactive MPLBACKEND inherited by the kernel would drop the inline figures the notebooks were committed
# with; the kernel must use its own inline backend.
import os  # noqa: E402

os.environ.pop("MPLBACKEND", None)
