# %%
import matplotlib.pyplot as plt

from tinylearn.sched.cluster import Cluster
from tinylearn.sched.jobs import Job
from tinylearn.sched.metrics import ClusterReport, segments
from tinylearn.sched.policies import FIFO, SJF, SRPT, Backfill, Policy, WeightedFair, WeightedUrgency

# %% [markdown]
# ## 1. Real jobs on two cores: FIFO, SJF, SRPT and backfill
#
# **Answer.** A scheduler is an event loop: at every arrival, step boundary and completion it asks a policy which
# waiting jobs to start and (if preemptive) which running ones to stop, then starts whole jobs on concrete cores (gang
# semantics: a 2-core job gets both cores or waits). `tinylearn.sched.Cluster` does this with real worker processes
# pinned to this VM's 2 cores (`sched_setaffinity`, one BLAS thread per core) that report every step on a pipe and
# obey "pause"/"resume" (suspend: the paused job keeps its memory, releases its cores) or "stop" (write a checkpoint,
# exit; a restart resumes bit for bit). Ordering by job size is the lever for mean JCT: shortest job first (SJF) is
# optimal for mean completion time among non-preemptive orders on one machine when sizes are known, SRPT (preempt for
# less remaining work) among all; FIFO makes short jobs wait behind long ones, and a 2-core job at the head of a FIFO
# queue idles a core while it waits. EASY backfilling (Slurm's default) keeps FIFO's order for the head job but lets
# later jobs jump ahead when they fit now and end before the head's reservation. The same five jobs (matmul chains and
# digits-CNN training steps, sizes known to the scheduler as steps x 5-10 ms estimates) run under each policy; all
# numbers below are wall-clock on real processes. Neither torch nor tinygrad has a cluster scheduler: this is
# tinylearn's own code (Slurm, Kubernetes and YARN are the production ones).


# %%
# NBVAL_IGNORE_OUTPUT
def cl_jobs() -> list[tuple[Job, float]]:
    """(job, arrival s): a long 1-core job, a 2-core gang job, two short jobs and a CNN training job."""
    return [
        (Job("long", 60, est_step_s=0.01, size=128), 0.0),
        (Job("gang2", 12, demand={"cpu": 2.0}, est_step_s=0.005, size=96), 0.0),
        (Job("cnn", 20, workload="cnn", est_step_s=0.005, size=32), 0.0),
        (Job("short1", 6, est_step_s=0.005, size=96), 0.0),
        (Job("short2", 6, est_step_s=0.005, size=96), 0.1),
    ]


cl_reports = {}
for cl_name, cl_pol in [("FIFO", FIFO()), ("SJF", SJF()), ("SRPT", SRPT()), ("Backfill", Backfill())]:
    cl_c = Cluster(devices={"cpu": 2, "mem_gb": 4.0}, policy=cl_pol, preempt="suspend")
    for cl_j, cl_at in cl_jobs():
        cl_c.submit(cl_j, at_s=cl_at)
    cl_reports[cl_name] = cl_c.run(timeout_s=30)
    assert all(js.state == "done" for js in cl_reports[cl_name].jobs)

print(f"{'policy':>9} {'mean JCT':>9} {'p99 JCT':>8} {'mean wait':>9} {'makespan':>9} {'util':>5} {'Jain':>5}  order")
for cl_name, cl_r in cl_reports.items():
    print(
        f"{cl_name:>9} {cl_r.mean_jct_s:9.2f} {cl_r.p99_jct_s:8.2f} {cl_r.mean_wait_s:9.2f} {cl_r.makespan_s:9.2f} "
        f"{cl_r.utilisation:5.2f} {cl_r.jain:5.2f}  {' '.join(cl_r.completion_order())}"
    )
cl_fifo, cl_sjf, cl_srpt, cl_bf = (cl_reports[k] for k in ("FIFO", "SJF", "SRPT", "Backfill"))
# order claims: under SJF / SRPT / backfill the short jobs finish before the long one; under FIFO after it
cl_pos = {k: r.completion_order() for k, r in cl_reports.items()}
assert cl_pos["FIFO"].index("short1") > cl_pos["FIFO"].index("long")
for cl_name in ("SJF", "SRPT"):
    assert cl_pos[cl_name].index("short1") < cl_pos[cl_name].index("long"), cl_name
# backfill: a job submitted after the blocked 2-core head starts before it (FIFO never does that)
cl_start = {k: {js.name: js.start_t for js in r.jobs} for k, r in cl_reports.items()}
assert min(cl_start["Backfill"][n] for n in ("cnn", "short1", "short2")) < cl_start["Backfill"]["gang2"]
assert all(cl_start["FIFO"][n] >= cl_start["FIFO"]["gang2"] for n in ("cnn", "short1", "short2"))
# ... which is what lowers the mean JCT
assert cl_sjf.mean_jct_s < cl_fifo.mean_jct_s and cl_srpt.mean_jct_s < cl_fifo.mean_jct_s
assert cl_bf.mean_wait_s < cl_fifo.mean_wait_s

# %%
# NBVAL_IGNORE_OUTPUT
cl_fig, cl_axes = plt.subplots(1, 2, figsize=(11, 2.8), sharey=True)
cl_colors = {j.name: f"C{i}" for i, (j, _) in enumerate(cl_jobs())}
for cl_ax, cl_name in zip(cl_axes, ("FIFO", "SRPT"), strict=True):
    for cl_job, cl_t0, cl_t1, cl_cores in segments(cl_reports[cl_name].events):
        for cl_core in cl_cores:
            cl_ax.barh(cl_core, cl_t1 - cl_t0, left=cl_t0, color=cl_colors[cl_job], edgecolor="k", height=0.7)
            cl_ax.text(cl_t0 + 0.01, cl_core, cl_job, va="center", fontsize=7)
    cl_ax.set_title(f"{cl_name}: measured run segments (cores x time)")
    cl_ax.set_xlabel("s since run start")
cl_axes[0].set_yticks([0, 1], ["core 0", "core 1"])
plt.tight_layout()
plt.show()
cl_srpt_kinds = [k for _, k, n, _ in cl_srpt.events]
print("SRPT preemptions:", sum(js.preemptions for js in cl_srpt.jobs), "| pauses/resumes:",
      cl_srpt_kinds.count("paused"), cl_srpt_kinds.count("resume"))  # fmt: skip
assert cl_srpt_kinds.count("paused") == cl_srpt_kinds.count("resume")  # every suspended job came back

# %% [markdown]
# ## 2. Weighted tail latency with SLA weights: an urgency min-heap [Q155]
#
# **Answer.** When inference jobs of different models share the accelerators and each carries an SLA weight w and
# a deadline, order the queue by weighted urgency u = w / (deadline - now): a min-heap (`heapq`) keyed on -u pops
# the job whose SLA costs most per second of slack; a job already past its deadline goes first (by weight), one
# without a deadline last. Recompute u at every event (it grows as the slack shrinks; this is the weighted form of
# least-slack-first), and bound what a single job can hold (steps: the pop happens at step boundaries). FIFO
# lets heavy, urgent requests queue behind cheap batch work, so the weighted tail (p99 of w x JCT) is set by a VIP
# that waited; `WeightedUrgency` starts the VIPs first. Below, four low-weight batch jobs are submitted before two
# weight-10 jobs with a tight deadline, on the 2 real cores (the jobs sleep through their steps: each holds its core
# slot for a known time, so the comparison is about order, not about CPU contention).


# %%
# NBVAL_IGNORE_OUTPUT
def cl_sla_run(policy: Policy) -> ClusterReport:
    c = Cluster(devices={"cpu": 2, "mem_gb": 4.0}, policy=policy)
    for i in range(4):
        c.submit(Job(f"batch{i}", 6, workload="sleep", est_step_s=0.04, weight=1.0, deadline_s=5.0))
    for i in range(2):
        c.submit(Job(f"vip{i}", 2, workload="sleep", est_step_s=0.04, weight=10.0, deadline_s=0.6))
    return c.run(timeout_s=30)


cl_sla = {"FIFO": cl_sla_run(FIFO()), "WeightedUrgency": cl_sla_run(WeightedUrgency())}
for cl_name, cl_r in cl_sla.items():
    cl_vip = [js.jct() for js in cl_r.jobs if js.name.startswith("vip")]
    print(
        f"{cl_name:>16}: weighted p99 (w x JCT) {cl_r.weighted_p99_jct_s:5.2f} s | p99 JCT {cl_r.p99_jct_s:4.2f} s | "
        f"VIP JCT max {max(cl_vip):4.2f} s | deadline misses {cl_r.deadline_misses}"
    )
assert all(js.state == "done" for r in cl_sla.values() for js in r.jobs)
# the heavy jobs start first under the urgency heap, last under FIFO ...
assert set(cl_sla["WeightedUrgency"].completion_order()[:2]) == {"vip0", "vip1"}
assert set(cl_sla["FIFO"].completion_order()[-2:]) == {"vip0", "vip1"}
# ... so the weighted tail is lower (the gap is several VIP waits: asserted with a 2x margin)
assert cl_sla["WeightedUrgency"].weighted_p99_jct_s < 0.5 * cl_sla["FIFO"].weighted_p99_jct_s

# %% [markdown]
# ## 3. A weighted fair scheduler for tenants: shares, quotas, preemption [Q256]
#
# **Answer.** Give each tenant a weight and serve, at every free slot, the tenant with the smallest dominant share
# of the service it received so far divided by its weight (Dominant Resource Fairness, Ghodsi et al. 2011, with
# weights; history-based like Slurm's fair-share factor, because with indivisible 1-core jobs on 2 cores an
# instantaneous split can only be 1:1). Isolation comes from quotas (a cap on what a tenant holds at once, as
# Kubernetes ResourceQuota or YARN queue maximums) and priority from the weights; preemption makes shares
# responsive: when a waiting tenant would be better off in the weighted max-min (leximin) sense, the youngest job of
# the most over-share tenant is suspended at its step boundary (never in a cycle: each eviction strictly improves the
# sorted weighted shares). Measured below: two tenants with weights 2:1 and equal jobs (A submits twice as many); the
# service each gets while both wait (core-seconds from the measured run segments) is compared with FIFO (which
# serves in submission order: 1:1 here); the tolerance (35%) is the granularity of ~15 short jobs in that window.


# %%
# NBVAL_IGNORE_OUTPUT
def cl_fair_run(policy: Policy) -> tuple[ClusterReport, dict[str, float]]:
    c = Cluster(devices={"cpu": 2, "mem_gb": 4.0}, policy=policy)
    for i in range(12):  # A brings twice B's jobs: with 2:1 service both stay backlogged almost to the end
        for t, w in (("A", 2.0), ("B", 1.0)) if i < 6 else (("A", 2.0),):
            c.submit(Job(f"{t}{i}", 2, workload="sleep", est_step_s=0.03, tenant=t, weight=w))
    r = c.run(timeout_s=30)
    # both tenants are backlogged until the first of them has started its last job
    horizon = min(max(js.start_t for js in r.jobs if js.job.tenant == t) for t in ("A", "B"))
    served = {"A": 0.0, "B": 0.0}
    for name, t0, t1, cores in segments(r.events):
        served[name[0]] += max(0.0, min(t1, horizon) - t0) * len(cores)
    return r, served


cl_fair = {"FIFO": cl_fair_run(FIFO()), "WeightedFair": cl_fair_run(WeightedFair())}
for cl_name, (_cl_r, cl_served) in cl_fair.items():
    print(f"{cl_name:>12}: core-s while both backlogged A {cl_served['A']:.2f}, B {cl_served['B']:.2f} "
          f"-> ratio {cl_served['A'] / cl_served['B']:.2f} (weights 2:1)")  # fmt: skip
cl_ratio = cl_fair["WeightedFair"][1]["A"] / cl_fair["WeightedFair"][1]["B"]
cl_fifo_ratio = cl_fair["FIFO"][1]["A"] / cl_fair["FIFO"][1]["B"]
# within 35% of 2:1: ~15 jobs of ~0.2 s fall in the window and each worker's start-up time varies on a shared VM
assert 2.0 * 0.65 <= cl_ratio <= 2.0 * 1.35, cl_ratio
assert abs(cl_ratio - 2.0) < abs(cl_fifo_ratio - 2.0) and 0.6 < cl_fifo_ratio < 1.6  # FIFO: about 1:1

# %%
# NBVAL_IGNORE_OUTPUT
# quota: tenant A may hold 1 core at most (isolation: B's share is protected even when B is idle now)
cl_cq = Cluster(devices={"cpu": 2, "mem_gb": 4.0}, policy=WeightedFair(quota={"A": {"cpu": 1}}))
for i in range(2):
    cl_cq.submit(Job(f"A{i}", 5, workload="sleep", est_step_s=0.04, tenant="A", weight=2.0))
cl_rq = cl_cq.run(timeout_s=30)
cl_segs = segments(cl_rq.events)
cl_overlap = [(a, b) for a in cl_segs for b in cl_segs if a[0] < b[0] and a[1] < b[2] and b[1] < a[2]]
print(f"quota A<=1 core: A's two jobs overlap in time: {bool(cl_overlap)}; utilisation {cl_rq.utilisation:.2f}")
assert not cl_overlap and all(js.state == "done" for js in cl_rq.jobs)
# preemption: A holds both cores, B arrives; A's youngest job is suspended at a step boundary, B runs, A resumes
cl_cp = Cluster(devices={"cpu": 2, "mem_gb": 4.0}, policy=WeightedFair(preemptive=True), preempt="suspend")
for i in range(2):
    cl_cp.submit(Job(f"A{i}", 10, workload="sleep", est_step_s=0.04, tenant="A", weight=2.0))
cl_cp.submit(Job("B0", 3, workload="sleep", est_step_s=0.04, tenant="B", weight=1.0), at_s=0.3)
cl_rp = cl_cp.run(timeout_s=30)
for cl_e in cl_rp.events:
    if cl_e[1] in ("preempt", "paused", "resume", "start", "done"):
        print(f"  {cl_e[0]:5.2f} s {cl_e[1]:>8} {cl_e[2]} {cl_e[3]}")
cl_byp = cl_rp.by_name()
assert all(js.state == "done" for js in cl_rp.jobs)
assert sum(js.preemptions for js in cl_rp.jobs if js.job.tenant == "A") == 1 and cl_byp["B0"].preemptions == 0
assert cl_byp["B0"].start_t < min(cl_byp["A0"].finish_t, cl_byp["A1"].finish_t)  # B did not wait for A to finish

# %% [markdown]
# ## Recap
#
# - [Q155] Weighted tail latency: schedule by weighted urgency w / (deadline - now) from a min-heap on its negative,
#   recomputed at every event; overdue first, no-deadline last. On real processes it put the weight-10 jobs first and
#   cut the p99 of w x JCT by more than 2x against FIFO on the same jobs.
# - [Q256] Multi-tenant fairness: weights -> weighted DRF on the service received (history, like Slurm fair-share);
#   quotas cap what a tenant holds (isolation); priority via weights / aging; preemption suspends the youngest job of
#   the most over-share tenant at a step boundary when that strictly improves weighted max-min. Measured: 2:1 weights
#   gave about 2:1 core-seconds while both tenants were backlogged, FIFO about 1:1.
# - Order is the lever for JCT: SJF minimises mean JCT without preemption, SRPT with it; EASY backfill keeps FIFO's
#   promise to the head job (its reservation never moves) and fills the holes with jobs that end before it.
# - Preemption comes in two kinds: suspend (pause at a step boundary, keep memory, resume on any cores) and
#   checkpoint (write step + RNG + model state atomically, exit, restart bit for bit: tested for matmul and the CNN).
#
# ## Exercises
#
# 1. Add `LAS` (least attained service, Tiresias' policy for unknown job sizes) to `tinylearn.sched.policies` and
#    compare it with SRPT when the size estimates are wrong by 4x.
# 2. Make `WeightedFair` decay old service with a half-life (Slurm's `PriorityDecayHalfLife`) and show how fast the
#    shares react when a third tenant arrives.
