"""``tinylearn.sched``: multi-tenant job scheduling, fairness and power capping (topic 18, work in progress).

Real jobs on this machine (``cluster.py``: processes that yield at step boundaries), one policy interface
(``policies.py``) shared with a discrete-event simulator of a GPU cluster (``sim.py``) that is validated against
the real runs before it is used at scale, fairness and cost-sharing (``fairness.py``, ``shapley.py``, ``market.py``,
``pareto.py``), power/thermal models and controllers (``device_model.py``, ``power.py``, ``thermal.py``,
``predict.py``) -- every simulated or modelled number labelled MODEL.
"""

from __future__ import annotations
