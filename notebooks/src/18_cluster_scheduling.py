# %% [markdown]
# # 18 · Cluster scheduling: multi-tenant jobs, fairness and power capping
#
# A cluster scheduler decides, at every arrival, step boundary and completion, which waiting jobs start, where they
# run and which running ones are preempted; a power manager decides how fast each device may run under a budget.
# This notebook builds both in `tinylearn.sched` and holds them to measurements where this machine allows:
#
# * **real jobs first**: `Cluster(devices=...)` runs jobs as worker processes pinned to this VM's 2 cores, which
#   yield at step boundaries (suspend / resume, checkpoint-based preemption); FIFO, SJF, SRPT, EASY backfill,
#   weighted urgency and weighted DRF fair-share are compared on measured JCT, waits, utilisation and Jain's index,
#   §1–3;
# * **a simulator calibrated on them**: the discrete-event `Simulator` runs the same policy objects, is calibrated
#   from the real runs' step times and must reproduce their mean JCT within 15 % before it is used at 64 and 512
#   GPUs; heterogeneous placement and composite costs on device models, §4–8;
# * **power and heat**: a PID power cap, a cluster cap shared among jobs, an average-and-peak controller, batch size
#   under a budget, DVFS, online power models, spike and temperature prediction, heat-aware migration, §9–17;
# * **economics of sharing**: Shapley cost shares, a second-price auction for power, a serving game, Pareto fronts,
#   Tchebycheff priorities, energy-aware kernel choice and a learned tenant policy, §18–25.
#
# **What is measured and what is a MODEL.** Sections 1–4 run real processes: their times are wall-clock on this
# 2-core VM, shared with other work, so each claim is asserted with a margin. This VM has no GPU and exposes no
# power, frequency, temperature or cgroup controls: every watt, clock, degree and GPU-cluster number below comes from
# device models whose parameters are written down with their public sources (`tinylearn.sched.device_model`), and is
# labelled **MODEL** wherever it is shown. Neither torch nor tinygrad has a cluster scheduler or a power manager
# (they are frameworks, not schedulers): the comparisons are between policies, and Slurm, Kubernetes (+ Volcano /
# Kueue), Gavel, Tiresias / Themis and the data-centre power cappers are named where their ideas are used.
#
# **Interview questions**: [Q155] weighted tail latency with SLA weights · [Q256] a weighted fair scheduler for
# tenants · [Q71] [Q115] [Q263] heterogeneous placement · [Q140] a composite placement cost · [Q234] latency-bounded
# energy · [Q126] a PID power cap · [Q186] average and peak limits · [Q254] batch size under a power budget ·
# [Q154] a clock waveform from intensity and temperature · [Q243] multi-objective DVFS · [Q246] [Q131] online power
# models · [Q165] power-spike prediction · [Q182] thermal prediction and migration · [Q227] Shapley cost sharing ·
# [Q172] second-price bidding for power · [Q171] serving strategies as a game · [Q229] an online Pareto front ·
# [Q127] time, memory and energy trade-offs · [Q194] a Tchebycheff priority queue · [Q282] kernel choice by time and
# joules · [Q138] learning which tenant runs next.


# %%
import tinylearn  # noqa: F401 -- first: its short OpenMP spin-wait is set before torch loads libgomp (notebook 00)

# isort: split
import math
import time
from dataclasses import replace

import matplotlib.pyplot as plt
import numpy as np
import torch

from tinylearn._threads import limited_threads
from tinylearn.bench import measure, tinygrad_status
from tinylearn.bench.comparators import import_tinygrad, tinygrad_jit
from tinylearn.gemm import matmul
from tinylearn.inference.config import GPTConfig
from tinylearn.sched import fairness, market, pareto, shapley, tenant_rl
from tinylearn.sched import hetero as sm_he
from tinylearn.sched import hetero_cost as sm_hc
from tinylearn.sched import predict as th_pr
from tinylearn.sched import thermal as th_th
from tinylearn.sched.bench import paired_gain, real_jobs
from tinylearn.sched.calibrate import calibrate, validate
from tinylearn.sched.cluster import Cluster
from tinylearn.sched.device_model import A100, DeviceSpec
from tinylearn.sched.jobs import Job
from tinylearn.sched.metrics import ClusterReport, segments
from tinylearn.sched.plant import FirstOrderPlant, Plant, Workload, predict
from tinylearn.sched.policies import FIFO, SJF, SRPT, Backfill, Policy, WeightedFair, WeightedUrgency
from tinylearn.sched.power import (
    PID,
    BatchSizeController,
    DualThresholdController,
    PowerCapAllocator,
    best_batch,
    fit_power_model,
    response_metrics,
    step_response,
)
from tinylearn.sched.power_dvfs import MultiObjectiveDVFS, arrhenius_af, frequency_waveform, run_schedule
from tinylearn.sched.sim import Simulator, single_machine
from tinylearn.sched.traces import LARGE_GPU_PROBS, arrival_rate, synthetic_trace
from tinylearn.tune.ar_predict import ARPredictor, LSTMPredictor

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
# digits-CNN training steps, sizes known to the scheduler as steps x 1-6 ms estimates) run under each policy; all
# numbers below are wall-clock on real processes. Neither torch nor tinygrad has a cluster scheduler: this is
# tinylearn's own code (Slurm, Kubernetes and YARN are the production ones).


# %%
# NBVAL_IGNORE_OUTPUT
def cl_jobs() -> list[tuple[Job, float]]:
    """(job, arrival s): a long 1-core job, a 2-core gang job, a CNN training job and two short jobs
    (``tinylearn.sched.bench.real_jobs``: the same set is the real-jobs table of ``tinylearn bench sched``)."""
    return [(j, at) for at, j in real_jobs()]


cl_reports, cl_tries = {}, {}
for cl_name, cl_pol in [("FIFO", FIFO), ("SJF", SJF), ("SRPT", SRPT), ("Backfill", Backfill)]:
    # a real, timed run of ~1 s: one retry when something else took the cores meanwhile, seen as a run the calibrated
    # simulator of section 2 misses by more than 15 % (its own error is a few %; the count is printed)
    for cl_try in range(1, 3):  # noqa: B007 -- kept in cl_tries
        cl_c = Cluster(devices={"cpu": 2, "mem_gb": 4.0}, policy=cl_pol(), preempt="suspend")
        for cl_j, cl_at in cl_jobs():
            cl_c.submit(cl_j, at_s=cl_at)
        cl_reports[cl_name] = cl_c.run(timeout_s=60)
        assert all(js.state == "done" for js in cl_reports[cl_name].jobs), [
            (cl_name, js.name, js.state, js.error) for js in cl_reports[cl_name].jobs if js.state != "done"
        ]
        if abs(validate(cl_reports[cl_name].jobs, cl_pol(), {"cpu": 2, "mem_gb": 4.0})["mean_rel_err"]) <= 0.15:
            break
    cl_tries[cl_name] = cl_try
print("runs per policy (one retry allowed):", cl_tries)

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
# ## 4. A simulator is only worth its validation: calibrate on real runs, then reproduce them
#
# **Answer.** The discrete-event simulator (`tinylearn.sched.sim.Simulator`) runs the *same* policy objects as the real
# cluster: a heap of events (arrivals, step boundaries, completions), `policy.select(waiting, running, free, now)` after
# every event, gang starts, preemption at step boundaries. Before it says anything about a 512-GPU cluster it must
# reproduce what happened on this machine. We run six real matmul jobs (worker processes on the VM's 2 cores) twice,
# under FIFO and under SJF. For each run, `calibrate` fits from its measured `step_times` only the step time of a job
# running alone, the slowdown when two jobs share the VM (interference), the extra time of a cold worker's first steps,
# and the startup per workload (process spawn + imports -- a CNN worker loads more than a matmul one -- plus the
# scheduler loop's dispatch delay), and `validate`
# re-simulates the run -- arrivals in the real submission order, policy decisions, waits, gang starts -- and compares
# JCTs. Goal: simulated mean JCT within 15% of the measured one. We also apply the FIFO run's calibration to the SJF
# run (out of sample): printed, not asserted, because this VM is shared (a CI job, other sessions) and its speed drifts
# between runs by more than the simulator's own error. The runs are real and timed, so one retry of the pair is
# allowed (stated in the output). The same check then runs, without new runs, on section 1's four runs (a 2-core gang,
# a CNN job, SRPT's preemption): the details above matter there -- with one startup for all workloads and ties
# broken by name, the FIFO run was off by 40%; without the warm-up steps, SRPT's by 15% (the CNN's first step takes
# ~5x a later one, and SRPT orders by the mean step measured so far, so the real scheduler pushed the CNN job back
# while a simulator replaying warm steps ran it early). Two fixes came out of this validation: the cluster now
# records when it heard of each step and each pause (so preempted jobs count too), and its event loop no longer
# waits for a finished worker's interpreter to exit (that wait, tens of ms, delayed the next job's start).


# %%
# NBVAL_IGNORE_OUTPUT
sm_cap = {"cpu": 2, "mem_gb": 4.0}
sm_pol = {"fifo": FIFO, "sjf": SJF}


def sm_jobs():
    # ~0.5 s per job: a worker's spawn (0.15-0.25 s, longer next to a busy neighbour) is a small share of its JCT
    spec = [("a", 0.0, 20), ("b", 0.0, 10), ("c", 0.4, 6), ("d", 0.8, 16), ("e", 1.2, 4), ("f", 1.6, 8)]
    return [(t, Job(n, steps, {"cpu": 1}, workload="matmul", size=192)) for n, t, steps in spec]


def sm_real_run(policy):
    c = Cluster(devices=sm_cap, policy=policy)
    for t, j in sm_jobs():
        c.submit(j, at_s=t)
    return c.run(timeout_s=60)


sm_t0 = time.perf_counter()
sm_try = 0
for sm_try in range(2):  # noqa: B007 -- printed below
    sm_real = {n: sm_real_run(p()) for n, p in sm_pol.items()}
    sm_cal = {n: calibrate(r) for n, r in sm_real.items()}
    sm_val = {n: validate(r.jobs, sm_pol[n](), sm_cap, calib=sm_cal[n]) for n, r in sm_real.items()}
    if all(abs(v["mean_rel_err"]) <= 0.15 for v in sm_val.values()):
        break
sm_cross = validate(sm_real["sjf"].jobs, SJF(), sm_cap, calib=sm_cal["fifo"])
print(f"real runs: {time.perf_counter() - sm_t0:.1f} s wall, attempt {sm_try + 1} of at most 2")
for sm_name, sm_v in sm_val.items():
    sm_c = sm_cal[sm_name]
    sm_steps = [f"{k}: {v * 1e3:.1f} ms" for k, v in sm_c["step_s"].items()]
    print(f"{sm_name.upper()} run calibrated: alone step {sm_steps}, "
          f"interference x{sm_c['interference']:.2f}, startup {sm_c['startup_s'] * 1e3:.0f} ms "
          f"(spawn {sm_c['spawn_s'] * 1e3:.0f} + dispatch {sm_c['dispatch_s'] * 1e3:.0f}) "
          f"({sm_c['n_alone']} alone / {sm_c['n_shared']} shared steps)")  # fmt: skip
    print("   job   measured JCT   simulated JCT   rel. error")
    for sm_j, sm_row in sm_v["per_job"].items():
        print(f"   {sm_j:4s}  {sm_row['real']:9.3f} s   {sm_row['sim']:10.3f} s   {sm_row['rel_err']:+8.1%}")
    print(f"   mean  {sm_v['mean_jct_real']:9.3f} s   {sm_v['mean_jct_sim']:10.3f} s   {sm_v['mean_rel_err']:+8.1%}")
    assert all(js.state == "done" for js in sm_real[sm_name].jobs)
    assert abs(sm_v["mean_rel_err"]) <= 0.15, (sm_name, sm_v["mean_rel_err"])
print(
    f"out of sample (FIFO's calibration on the SJF run): mean JCT {sm_cross['mean_jct_real']:.3f} s measured, "
    f"{sm_cross['mean_jct_sim']:.3f} s simulated ({sm_cross['mean_rel_err']:+.1%})"
)

# %%
# NBVAL_IGNORE_OUTPUT
# section 1's runs (no new runs): each calibrated on itself and re-simulated under its own policy
sm_s1 = {n: validate(r.jobs, {"FIFO": FIFO, "SJF": SJF, "SRPT": SRPT, "Backfill": Backfill}[n](), sm_cap)
         for n, r in cl_reports.items()}  # fmt: skip
for sm_name, sm_v in sm_s1.items():
    print(f"section 1, {sm_name:8s}: mean JCT {sm_v['mean_jct_real']:.3f} s measured, {sm_v['mean_jct_sim']:.3f} s "
          f"simulated ({sm_v['mean_rel_err']:+.1%}); worst job {sm_v['max_abs_job_err']:.0%}")  # fmt: skip
    assert abs(sm_v["mean_rel_err"]) <= 0.15, (sm_name, sm_v["mean_rel_err"])


# %%
# NBVAL_IGNORE_OUTPUT
sm_fig, sm_ax = plt.subplots(figsize=(4.2, 3.6))
for sm_name, sm_v in sm_val.items():
    sm_xy = np.array([(r["real"], r["sim"]) for r in sm_v["per_job"].values()])
    sm_ax.scatter(sm_xy[:, 0], sm_xy[:, 1], label=f"{sm_name.upper()} (in-sample)")
sm_xy = np.array([(r["real"], r["sim"]) for r in sm_cross["per_job"].values()])
sm_ax.scatter(sm_xy[:, 0], sm_xy[:, 1], marker="x", label="SJF, FIFO's calibration")
sm_lim = [
    0,
    1.3 * max(r[k] for v in [*sm_val.values(), sm_cross] for r in v["per_job"].values() for k in ("real", "sim")),
]
sm_ax.plot(sm_lim, sm_lim, "k--", lw=0.8)
sm_ax.fill_between(sm_lim, [0.85 * x for x in sm_lim], [1.15 * x for x in sm_lim], color="0.9")
sm_ax.set(xlabel="measured JCT (s)", ylabel="simulated JCT (s)", title="Simulator vs real runs (band: +-15%)")
sm_ax.legend(fontsize=7)
plt.tight_layout()
plt.show()


# %% [markdown]
# The per-job errors are larger than the error of the mean (a job that starts a few tens of milliseconds earlier or
# later on the real machine shifts its own JCT, and partly its neighbour's the other way); the mean is what the
# benchmark goal is about. The simulator knows nothing of the measured JCTs: only step times, the interference
# factor and the startup cost. A textbook check of the same engine: on one unit-speed machine SRPT is optimal for
# mean flow time (Schrage 1968), and the simulator's step-boundary SRPT matches the exact continuous one when the
# step divides every job.


# %%
sm_arr = [(0.0, 3.0), (1.0, 1.0), (2.0, 5.0), (2.5, 0.5)]
sm_one = {p: single_machine(sm_arr, p) for p in ("fifo", "sjf", "srpt")}
sm_flow = {p: float(np.mean([c - a for c, (a, _) in zip(v, sm_arr, strict=True)])) for p, v in sm_one.items()}
print("completion times", sm_one, "mean flow", sm_flow)
sm_q = [(t, Job(f"j{i}", int(w / 0.5), {"cpu": 1}, est_step_s=0.5)) for i, (t, w) in enumerate(sm_arr)]
sm_srpt_sim = Simulator({"cpu": 1}, SRPT()).simulate(sm_q)
assert np.allclose([js.finish_t for js in sm_srpt_sim.jobs], sm_one["srpt"])
assert sm_flow["srpt"] < sm_flow["sjf"] < sm_flow["fifo"]


# %% [markdown]
# ## 5. At scale (MODEL): 64- and 512-GPU synthetic traces, FIFO vs SJF, SRPT and backfilling
#
# **Answer.** With the engine validated, the same policies run on synthetic GPU-cluster traces
# (`tinylearn.sched.traces.synthetic_trace`, every distribution stated in its docstring): Poisson arrivals at the rate
# that makes the offered load 1.5 (a burst: the queue grows while jobs arrive, then drains, so the utilisation over the
# whole makespan is far lower), log-normal durations (median 10 min, sigma 1.5: most jobs short, a heavy tail, as the
# Philly and Helios trace studies report), 1-32 GPUs per job with single-GPU jobs the most common (on 512 GPUs the
# stated large-cluster mix, gangs up to 128), 10 preemptible steps per job, A100 power model for energy. Everything in
# this section is a MODEL. FIFO suffers head-of-line blocking: a 16-GPU job at the head idles GPUs that small jobs could
# use. EASY backfilling (Slurm's) lets later jobs jump ahead when they do not delay the head's reservation; SRPT
# (preemptive, greedy over the whole cluster -- so it also backfills) runs the least remaining work first. Claim checked
# with a confidence interval over 5 seeds on 64 GPUs: the mean of the paired differences FIFO - policy, minus two
# standard errors, is above zero. No cluster scheduler exists in torch or tinygrad (they are frameworks, not
# schedulers); Slurm, Kubernetes (+ Volcano/Kueue) and research systems (Tiresias, Gavel) are where these policies live.


# %%
# NBVAL_IGNORE_OUTPUT
sm_policies = {"FIFO": FIFO, "SJF": SJF, "SRPT": SRPT, "Backfill": Backfill, "Backfill+SJF": lambda: Backfill(SJF())}
sm_seeds = range(5)
sm_res = {sm_name: [] for sm_name in sm_policies}
sm_t0 = time.perf_counter()
for sm_seed in sm_seeds:
    sm_trace = synthetic_trace(300, 64, 1.5, sm_seed, steps=10)
    for sm_name, sm_mk in sm_policies.items():
        sm_res[sm_name].append(Simulator({"gpu": 64}, sm_mk()).simulate(sm_trace))
sm_big_trace = synthetic_trace(800, 512, 1.5, 0, steps=10, gpu_probs=LARGE_GPU_PROBS)
sm_big = {sm_name: Simulator({"gpu": 512}, sm_mk()).simulate(sm_big_trace) for sm_name, sm_mk in sm_policies.items()}
print(f"simulated {len(sm_seeds) * len(sm_policies) + len(sm_policies)} runs in {time.perf_counter() - sm_t0:.1f} s; "
      f"64-GPU arrival rate {arrival_rate(64, 1.5) * 3600:.1f} jobs/h")  # fmt: skip
print("MODEL  cluster  policy          mean JCT (s)  p99 JCT (s)  makespan (h)  util   Jain   energy (MWh)")
for sm_label, sm_tab in [("64 GPU", {n: sm_r[0] for n, sm_r in sm_res.items()}), ("512 GPU", sm_big)]:
    for sm_name, sm_r in sm_tab.items():
        print(f"       {sm_label:8s} {sm_name:14s} {sm_r.mean_jct_s:11.0f} {sm_r.p99_jct_s:12.0f} "
              f"{sm_r.makespan_s / 3600:12.1f} {sm_r.utilisation:6.3f} {sm_r.jain:6.3f} "
              f"{sm_r.energy_j / 3.6e9:10.3f}")  # fmt: skip
sm_fifo = np.array([sm_r.mean_jct_s for sm_r in sm_res["FIFO"]])
sm_ci = {}
for sm_name in ("SRPT", "Backfill", "Backfill+SJF"):
    sm_dm, sm_se = paired_gain(sm_fifo, [sm_r.mean_jct_s for sm_r in sm_res[sm_name]])  # FIFO - policy, per seed
    sm_ci[sm_name] = (sm_dm, sm_se)
    print(f"64 GPU, {len(sm_fifo)} seeds: FIFO - {sm_name:12s} mean JCT = {sm_dm:7.0f} s +- {2 * sm_se:5.0f} (2 SE)"
          f"  ({sm_dm / sm_fifo.mean():.0%} of FIFO's)")  # fmt: skip
    assert sm_dm - 2 * sm_se > 0, sm_name
for sm_r in [*sm_big.values(), *(x for v in sm_res.values() for x in v)]:
    assert all(js.state == "done" for js in sm_r.jobs) and 0 < sm_r.utilisation <= 1
sm_p99 = {n: np.mean([sm_r.p99_jct_s for sm_r in sm_res[n]]) for n in sm_policies}
sm_energy = [sm_r.energy_j for v in sm_res.values() for sm_r in v[:1]]
print(f"64 GPU mean p99 JCT over seeds: {', '.join(f'{n} {v:.0f} s' for n, v in sm_p99.items())}")
assert sm_p99["SRPT"] == max(sm_p99.values()) and sm_p99["Backfill"] < sm_p99["FIFO"]
assert max(sm_energy) < 1.05 * min(sm_energy)
sm_jain = {n: np.mean([sm_r.jain for sm_r in sm_res[n]]) for n in sm_policies}
print(f"64 GPU mean Jain (1/slowdown) over seeds: {', '.join(f'{n} {v:.3f}' for n, v in sm_jain.items())}")
assert sm_jain["FIFO"] == min(sm_jain.values())


# %% [markdown]
# Reading the MODEL table: the mean JCT is where the policies differ (short jobs stop waiting behind long ones);
# SRPT buys its mean with the tail -- its p99 JCT (mean over seeds) is the worst of all five policies, because
# big long jobs are preempted again and again -- while backfilling keeps FIFO's order for the head and so its tail.
# Energy hardly moves (within 5%): the same work is done either way, only the idle power over a slightly different
# makespan changes; saving energy needs the power controls of sections 9-14, not a different queue order.
# Jain's index (as in the real cluster's report) is over the jobs' rates service / JCT = 1 / slowdown: FIFO makes a
# 5-minute job wait as long as a 5-hour one, so its slowdowns are the most unequal; ordering by size equalises them.


# %%
sm_fig, sm_ax = plt.subplots(1, 2, figsize=(11, 3.4))
sm_names = list(sm_policies)
sm_ax[0].bar(sm_names, [np.mean([r.mean_jct_s for r in sm_res[n]]) / 60 for n in sm_names],
             yerr=[np.std([r.mean_jct_s for r in sm_res[n]], ddof=1) / 60 for n in sm_names], capsize=3)  # fmt: skip
sm_ax[0].set(ylabel="mean JCT (min)", title="MODEL: 64 GPUs, load 1.5, 5 seeds")
sm_ax[1].bar(sm_names, [sm_big[n].p99_jct_s / 3600 for n in sm_names], color="tab:orange")
sm_ax[1].set(ylabel="p99 JCT (h)", title="MODEL: 512 GPUs, load 1.5, seed 0")
for sm_a in sm_ax:
    sm_a.tick_params(axis="x", rotation=20)
plt.tight_layout()
plt.show()


# %% [markdown]
# ## 6. Heterogeneous graph placement: HEFT on CPU + GPU + NPU models [Q71] [Q115] [Q263]
#
# **Answer.** A heterogeneous scheduler has four parts, all in `tinylearn.sched.hetero`: (1) a *performance model*
# per device and op kind (roofline peak x a per-kind efficiency, plus a fixed launch/sync overhead: GPUs are best at
# big GEMMs, the NPU at attention/conv, the CPU at control flow and tiny ops where accelerators pay 40-80 us of
# synchronisation), and link costs (PCIe: latency + bytes / 25 GB/s); (2) *graph analysis*: the op DAG with FLOPs
# and bytes -- here built from a real TinyGPT configuration's layer shapes (`GPTConfig`: QKV/proj/MLP GEMMs,
# attention, norms, residuals, LM head, sampling) -- its topological order and HEFT's upward ranks; (3)
# *placement*: HEFT puts the op with the highest rank on the device that gives it the earliest finish time
# including input transfers; (4) *dynamic load balancing*: re-run placement with each device's measured backlog as
# its ready time. The devices are MODELs with stated parameters, so the times are MODEL times. The baselines:
# everything on the GPU, and greedy-by-op (each op on its fastest device, transfers ignored -- the classic mistake).
# On one request the graph is a chain and HEFT keeps it on the GPU (moving activations costs more than the NPU's
# faster attention saves) -- the exact DP partition (`dp_partition`: DP over the topological order whose state is
# the device of every live tensor) confirms that this is the optimum; with 4 concurrent requests HEFT spreads them
# over GPU and NPU.


# %%
# stable-output: MODEL times from the device models' stated parameters (Python float arithmetic, no timing, no RNG)
sm_cfg = GPTConfig(vocab_size=32000, d_model=1024, n_heads=16, n_layers=4, max_seq_len=1024)
sm_pf = sm_he.default_platform()
sm_rows = {}
for sm_streams in (1, 4):
    sm_g = sm_he.gpt_graph(sm_cfg, batch=4, seq=512, streams=sm_streams)
    sm_h = sm_he.heft(sm_g, sm_pf)
    sm_rows[sm_streams] = {
        "HEFT": sm_h,
        "all-GPU": sm_he.all_on(sm_g, sm_pf, "gpu"),
        "all-NPU": sm_he.all_on(sm_g, sm_pf, "npu"),
        "greedy-by-op": sm_he.greedy(sm_g, sm_pf),
    }
    print(f"MODEL  {sm_streams} request(s), {len(sm_g)} ops")
    for sm_name, sm_s in sm_rows[sm_streams].items():
        sm_use = {d: sum(v == d for v in sm_s.placement.values()) for d in ("cpu", "gpu", "npu")}
        print(f"   {sm_name:13s} makespan {sm_s.makespan_s * 1e3:7.3f} ms  energy {sm_s.energy_j:6.3f} J  "
              f"transfers {sm_s.comm_s * 1e3:6.3f} ms  ops per device {sm_use}")  # fmt: skip
sm_g1 = sm_he.gpt_graph(sm_cfg, batch=4, seq=512)
sm_dp_place, sm_dp_cost = sm_he.dp_partition(sm_g1, sm_pf)
print(f"1 request: exact DP partition {sm_dp_cost * 1e3:.3f} ms, HEFT {sm_rows[1]['HEFT'].makespan_s * 1e3:.3f} ms")
assert math.isclose(sm_rows[1]["HEFT"].makespan_s, sm_dp_cost, rel_tol=1e-9)
sm_h4, sm_g4 = sm_rows[4]["HEFT"], sm_rows[4]["all-GPU"]
assert sm_rows[1]["HEFT"].makespan_s <= sm_rows[1]["all-GPU"].makespan_s * (1 + 1e-9)
assert sm_h4.makespan_s < 0.8 * sm_g4.makespan_s
assert all(sm_h4.makespan_s < sm_s.makespan_s for n, sm_s in sm_rows[4].items() if n != "HEFT")
assert sm_rows[4]["greedy-by-op"].comm_s > 10 * sm_h4.comm_s
# dynamic load balancing: the GPU reports a backlog (12 queued requests x 0.5 ms measured service)
sm_backlog = sm_he.backlog_s({"cpu": 0, "gpu": 12, "npu": 0}, {"gpu": 0.5e-3})
sm_g4_ops = sm_he.gpt_graph(sm_cfg, batch=4, seq=512, streams=4)
sm_stale = sm_he.evaluate(sm_g4_ops, sm_pf, sm_h4.placement, ready_s=sm_backlog)
sm_rebal = sm_he.heft(sm_g4_ops, sm_pf, ready_s=sm_backlog)
print(f"GPU backlog {sm_backlog['gpu'] * 1e3:.1f} ms: old placement finishes at {sm_stale.makespan_s * 1e3:.2f} ms, "
      f"re-placed {sm_rebal.makespan_s * 1e3:.2f} ms; NPU ops {sum(v == 'npu' for v in sm_h4.placement.values())} -> "
      f"{sum(v == 'npu' for v in sm_rebal.placement.values())}")  # fmt: skip
assert sm_rebal.makespan_s < sm_stale.makespan_s


# %%
sm_fig, sm_ax = plt.subplots(figsize=(11, 2.8))
sm_col = {"gemm": "tab:blue", "attention": "tab:red", "elementwise": "tab:green", "control": "k", "conv": "tab:purple"}
sm_kind = {o.name: o.kind for o in sm_g4_ops}
sm_lane = {"cpu": 0, "gpu": 1, "npu": 2}
for sm_dev, sm_op, sm_t0, sm_t1 in sm_h4.gantt():
    sm_ax.barh(
        sm_lane[sm_dev],
        (sm_t1 - sm_t0) * 1e3,
        left=sm_t0 * 1e3,
        color=sm_col[sm_kind[sm_op]],
        edgecolor="white",
        lw=0.3,
    )
sm_ax.set(yticks=[0, 1, 2], yticklabels=["CPU", "GPU", "NPU"], xlabel="ms",
          title="MODEL: HEFT placement, 4 TinyGPT requests (blue GEMM, red attention, green elementwise)")  # fmt: skip
plt.tight_layout()
plt.show()


# %% [markdown]
# ## 7. A composite cost (T_c, T_m, T_comm, E, Risk) minimised by simulated annealing [Q140]
#
# **Answer.** Time every candidate placement with the same model, then score it with five terms: T_c the makespan
# (what the user waits), T_m the summed memory time (HBM/DRAM pressure), T_comm the summed transfer time (link
# occupancy), E the energy (time x the device model's power), Risk = 1 - exp(-sum_d lambda_d busy_d) the chance that
# a device used fails during the run. Normalise each by a reference placement (HEFT's) so the weights are unitless
# priorities, J = sum_k w_k m_k / m_k(HEFT). HEFT minimises latency only; with weight on energy, simulated annealing
# (moves of one op or a run of consecutive ops, Metropolis acceptance, geometric cooling, best-so-far kept) starting
# from a *random* placement finds placements with a lower J than HEFT's: it gives up a little latency for energy.


# %%
# NBVAL_IGNORE_OUTPUT
sm_g2 = sm_he.gpt_graph(sm_cfg, batch=4, seq=512, streams=2)
sm_ref = sm_hc.cost_terms(sm_g2, sm_pf, sm_he.heft(sm_g2, sm_pf))
sm_w = {"T_c": 0.3, "T_m": 0.1, "T_comm": 0.1, "E": 0.4, "Risk": 0.1}
sm_t0 = time.perf_counter()
sm_sa = sm_hc.anneal(sm_g2, sm_pf, sm_w, sm_ref, iters=1000, seed=0)
print(f"annealing: {len(sm_sa.trace)} iterations, {sm_sa.accepted} accepted, {time.perf_counter() - sm_t0:.2f} s")
print("MODEL  term      HEFT         annealed")
for sm_k in sm_hc.TERMS:
    print(f"       {sm_k:6s} {sm_ref[sm_k]:11.4g} {sm_sa.terms[sm_k]:11.4g}")
print(f"       J      {sm_hc.composite(sm_ref, sm_ref, sm_w):11.4f} {sm_sa.cost:11.4f}")
assert sm_sa.cost < sm_hc.composite(sm_ref, sm_ref, sm_w)
assert sm_sa.terms["E"] < sm_ref["E"] and sm_sa.terms["T_c"] >= sm_ref["T_c"]
assert sm_sa.trace[0] > sm_sa.trace[-1]


# %% [markdown]
# ## 8. Latency-bounded energy minimisation over a multi-path model [Q234]
#
# **Answer.** (1) Model: the network is a sequence of blocks; block i can run by one of several paths p (its
# parallel experts split over GPU and NPU, or all on one device, at one of the DVFS clocks), each with latency
# l_ip and energy e_ip (from the device models: MODEL). Choose x_ip in {0,1}, sum_p x_ip = 1, to minimise
# sum e_ip x_ip subject to sum l_ip x_ip <= L_max: the multiple-choice knapsack problem (NP-hard in general).
# (2) Exact algorithm: dynamic programming over Pareto-optimal (latency, energy) partial solutions -- a partial
# choice worse in both coordinates than another can never finish better, so it is dropped (pseudo-polynomial when
# latencies are integers on a grid; here the fronts stay small). (3) Greedy: start from the fastest path everywhere
# and repeatedly take the swap with the most energy saved per latency added that still fits. Checked against brute
# force on the 4-block model below and on random small instances, where greedy is sometimes suboptimal.


# %%
# stable-output: MODEL arithmetic (device latency/energy tables, a seeded RNG), no timing or BLAS
sm_layers = []
for sm_i in range(sm_cfg.n_layers):
    sm_ops = [o for o in sm_he.gpt_graph(sm_cfg, 4, 512) if o.name.startswith(f"L{sm_i}.")]
    sm_layers += [sm_ops[:5], sm_ops[5:]]  # attention half, MLP half: different best devices
sm_blocks = [sm_hc.block_options(b, sm_pf, n_freqs=4, split=("gpu", "npu")) for b in sm_layers[:4]]
sm_fast = sum(min(o.latency_s for o in b) for b in sm_blocks)
print(f"MODEL: {len(sm_blocks)} blocks x {len(sm_blocks[0])} paths; fastest total {sm_fast * 1e3:.3f} ms")
print(" L_max/fastest   DP energy (J)   greedy (J)   brute force (J)   DP paths")
for sm_mult in (1.0, 1.25, 1.5, 2.0, 3.0):
    sm_dp = sm_hc.min_energy_dp(sm_blocks, sm_fast * sm_mult)
    sm_gr = sm_hc.min_energy_greedy(sm_blocks, sm_fast * sm_mult)
    sm_bf = sm_hc.min_energy_brute(sm_blocks, sm_fast * sm_mult)
    print(f"  {sm_mult:5.2f}        {sm_dp[2]:10.4f}    {sm_gr[2]:10.4f}     {sm_bf[2]:10.4f}     "
          f"{[sm_blocks[k][sm_i].name for k, sm_i in enumerate(sm_dp[0])]}")  # fmt: skip
    assert (
        math.isclose(sm_dp[2], sm_bf[2], rel_tol=1e-9)
        and sm_dp[1] <= sm_fast * sm_mult + 1e-12
        and sm_gr[2] >= sm_dp[2] - 1e-12
    )
sm_rng = np.random.default_rng(0)
sm_gap = []
for _ in range(200):
    sm_blocks = [[sm_hc.PathOption(f"p{j}", *sm_rng.uniform(0.1, 1.0, 2)) for j in range(4)] for _ in range(5)]
    sm_lmax = float(sm_rng.uniform(1.0, 3.5))
    sm_dp, sm_gr, sm_bf = (
        f(sm_blocks, sm_lmax) for f in (sm_hc.min_energy_dp, sm_hc.min_energy_greedy, sm_hc.min_energy_brute)
    )
    if sm_bf is None:
        assert sm_dp is None
        continue
    assert math.isclose(sm_dp[2], sm_bf[2], rel_tol=1e-9)
    sm_gap.append(sm_gr[2] / sm_dp[2] - 1 if sm_gr is not None else math.inf)
sm_gap = np.array(sm_gap)
print(
    f"random instances: DP = brute force on all {len(sm_gap)} feasible; greedy suboptimal on "
    f"{(sm_gap > 1e-9).mean():.0%} of them (worst {sm_gap[np.isfinite(sm_gap)].max():.0%} more energy)"
)
assert (sm_gap > 1e-9).any()


# %% [markdown]
# ## 9. A PID power-cap loop: step responses, a disturbance, anti-windup [Q126]
#
# **Answer.** A power cap is a feedback loop: measure the power, compare with the cap, move the knob (clock). A PID
# does it with u = kp e + ki ∫e dt − kd dy/dt (derivative on the *measurement*, so a setpoint change does not kick
# the output); the integral removes the steady-state error a model error or a disturbance would leave; anti-windup
# (the integral is frozen while the output is saturated and the error pushes further, and kept inside the output
# range) stops the overshoot that an integral grown during saturation causes when the loop leaves it. Judge a tuning
# by its step response: settling time (into a ±2 % band), overshoot, steady-state error.
#
# **This VM has no power, frequency or thermal controls (no RAPL, cpufreq or GPU), so nothing in this part is
# measured: every watt, clock and degree below is a MODEL** (`tinylearn.sched.plant.Plant`, built on the A100
# device model of `device_model.py`, whose constants and sources are written down there). Neither torch nor
# tinygrad has power controllers or cluster schedulers; this is tinylearn's own code. First the textbook plant
# y' = (u − y)/τ with the actuator limited to 1.3× the setpoint, with and without anti-windup:


# %%
pw_res = {}
for pw_aw in (True, False):
    pw_pid = PID(2.0, 3.0, 0.0, 1.0, 0.0, 1.3, anti_windup=pw_aw)
    pw_res[pw_aw] = step_response(pw_pid, FirstOrderPlant(1.0, 1.0), 400, 0.02)
for pw_aw, pw_r in pw_res.items():
    print(f"anti-windup {pw_aw!s:5}: settling {pw_r['settling_time_s']:.2f} s, overshoot {pw_r['overshoot']:.1%}, "
          f"steady-state error {pw_r['steady_state_error']:.2e}")  # fmt: skip
assert pw_res[True]["overshoot"] < 0.05 < 0.10 < pw_res[False]["overshoot"]
assert pw_res[True]["settling_time_s"] < pw_res[False]["settling_time_s"]
assert max(r["steady_state_error"] for r in pw_res.values()) < 0.01


# %% [markdown]
# Now the loop on the MODEL plant: two A100s (a compute-bound and a mixed job, batch 256), the PID sets both clocks
# from the measured total power (a sensor with a 0.1 s lag). Gains are scaled by the plant's sensitivity
# g = dP/df at f_max (3 (TDP − idle)/f_max per device, from P ∝ f³). At t = 10 s the cap drops 500 → 420 W; at
# t = 20 s another 40 W load appears on the same feed (a disturbance the loop must absorb). A fine 200-step DVFS
# ladder lets the loop settle into the 2 % band; on the default 15-step ladder (61 MHz ≈ 45 W a step) the clock
# dithers between two steps and only the *average* sits on the cap (what RAPL's running-average limit enforces).


# %%
pw_g = 2 * 3 * (A100.tdp_w - A100.idle_w) / A100.f_max_mhz
pw_mix2 = [Workload("gemm", 300.0), Workload("conv", 80.0)]
pw_n, pw_dt = 600, 0.05
pw_sp = np.where(np.arange(pw_n) < 200, 500.0, 420.0)
pw_dist = np.where(np.arange(pw_n) >= 400, 40.0, 0.0)
pw_runs = {}
for pw_name, pw_spec in (("200-step ladder", replace(A100, f_steps=200)), ("15-step ladder", A100)):
    pw_pid = PID(0.3 / pw_g, 6.0 / pw_g, 0.0, 500.0, A100.f_min_mhz, A100.f_max_mhz, initial=A100.f_max_mhz)
    pw_plant = Plant(pw_spec, pw_mix2, batch=256, sensor_tau_s=0.1)
    pw_runs[pw_name] = step_response(pw_pid, pw_plant, pw_n, pw_dt, setpoints=pw_sp, disturbance=pw_dist)
pw_f = pw_runs["200-step ladder"]
pw_m_sp = response_metrics(pw_f["t"][:400], pw_f["y"][:400], 420.0, start=200)
pw_m_d = response_metrics(pw_f["t"], pw_f["y"], 420.0, start=400, y_start=460.0)
print(f"MODEL, cap 500 -> 420 W: settling {pw_m_sp['settling_time_s']:.2f} s, overshoot {pw_m_sp['overshoot']:.1%}, "
      f"ss error {pw_m_sp['steady_state_error']:.1e}")  # fmt: skip
print(f"MODEL, +40 W disturbance: back in the 2 % band after {pw_m_d['settling_time_s']:.2f} s, "
      f"ss error {pw_m_d['steady_state_error']:.1e}")  # fmt: skip
pw_c = pw_runs["15-step ladder"]
print(f"MODEL, 15-step ladder: mean {pw_c['y'][300:400].mean():.1f} W, std {pw_c['y'][300:400].std():.1f} W (dither)")
assert pw_m_sp["settling_time_s"] < 3.0 and pw_m_sp["overshoot"] < 0.05 and pw_m_sp["steady_state_error"] < 0.01
assert pw_m_d["settling_time_s"] < 3.0 and pw_m_d["steady_state_error"] < 0.01
assert abs(pw_c["y"][300:400].mean() - 420.0) < 5.0 and pw_c["y"][300:400].std() > 2.0

pw_fig, pw_ax = plt.subplots(1, 3, figsize=(13, 3.2))
for pw_aw, pw_r in pw_res.items():
    pw_ax[0].plot(pw_r["t"], pw_r["y"], label=f"anti-windup {pw_aw}")
pw_ax[0].axhline(1.0, color="k", ls=":")
pw_ax[0].set(title="MODEL first-order plant, saturated actuator", xlabel="s", ylabel="y")
for pw_name, pw_r in pw_runs.items():
    pw_ax[1].plot(pw_r["t"], pw_r["y"], label=pw_name, lw=1)
    pw_ax[2].plot(pw_r["t"], pw_r["u"], label=pw_name, lw=1)
pw_ax[1].plot(pw_f["t"], pw_sp, "k:", label="cap (setpoint)")
pw_ax[1].set(title="MODEL 2xA100: measured power (W)", xlabel="s")
pw_ax[2].set(title="MODEL: PID output, clock (MHz)", xlabel="s")
for pw_a in pw_ax:
    pw_a.legend(fontsize=7)
plt.tight_layout()
plt.show()


# %% [markdown]
# ## 10. Sharing a cluster power cap among jobs [Q126]
#
# **Answer.** Model each job's power as P = α f + β u + idle and its throughput from the roofline, then solve
# max Σ w_j throughput_j(f_j, s_j) s.t. Σ P_j ≤ Cap over each job's clock f_j and SM share s_j. The throughput-vs-watts
# curve of each job is (nearly) concave, so the greedy rule "give the next watts to the job with the highest
# marginal throughput per watt" (water-filling on each job's upper concave hull) solves the relaxation; a fill pass
# spends what is left. It beats uniform capping (every job at the same clock) because memory-bound jobs lose almost
# nothing at a low clock (below the roofline knee) while compute-bound jobs lose in proportion: the watts belong to
# the compute-bound ones. Feedback closes the loop: a PID on the measured total trims the budget the allocator sees
# (Dynamo-style: cap at once when above, uncap slowly), because the model is never exact. With the question's linear
# P = α f + β u the fit errs by tens of watts here (dynamic power is ∝ u f³), so we also fit the same two
# coefficients on the switching activity u (f/f_max)³; both fits are shifted up to bound every sample, so an
# open-loop allocation never exceeds the cap. Throughput is normalised per job (1 = the job at f_max, full SMs).
# MODEL: four A100 jobs with arithmetic intensities 300, 80, 20 and 3 FLOPs/byte.


# %%
pw_mix = [Workload("gemm", 300.0), Workload("conv", 80.0), Workload("attn", 20.0), Workload("embed", 3.0)]
pw_p4 = Plant(A100, pw_mix, batch=64)
for pw_form in ("linear", "activity"):
    pw_fits = [fit_power_model(pw_p4, i, form=pw_form)["max_residual_w"] for i in range(4)]
    print(f"MODEL fit '{pw_form}': largest residual per job (W) {np.round(pw_fits, 1)}")
print(f"{'cap W':>6} | {'greedy thr':>10} {'true W':>7} | {'uniform thr':>11} {'true W':>7} | greedy MHz / SM share")
pw_alloc = {}
for pw_cap in (400.0, 450.0, 500.0):
    pw_a = PowerCapAllocator(pw_cap)
    pw_gr, pw_un = pw_a.allocate(pw_p4), pw_a.uniform(pw_p4)
    pw_alloc[pw_cap] = (pw_gr, pw_un)
    pw_set = ", ".join(f"{r['job']} {r['clock_mhz']:.0f}/{r['sm_share']:.2f}" for r in pw_gr["rows"])
    print(f"{pw_cap:6.0f} | {pw_gr['throughput']:10.3f} {pw_gr['true_power_w']:7.1f} | {pw_un['throughput']:11.3f} "
          f"{pw_un['true_power_w']:7.1f} | {pw_set}")  # fmt: skip
    assert pw_gr["true_power_w"] <= pw_cap and pw_un["true_power_w"] <= pw_cap
    assert pw_gr["throughput"] > pw_un["throughput"]
assert pw_alloc[400.0][0]["throughput"] > 1.03 * pw_alloc[400.0][1]["throughput"]
print("(MODEL table: normalised throughput summed over 4 jobs, max 4.0; the uniform baseline uses the exact model)")

pw_closed = {}
for pw_form in ("activity", "linear"):
    pw_pl = Plant(A100, pw_mix, batch=64, noise_w=5.0, sensor_tau_s=0.05)
    pw_closed[pw_form] = PowerCapAllocator(450.0).run(pw_pl, 300, 0.05, model=pw_form)
    pw_r = pw_closed[pw_form]
    print(f"closed loop, '{pw_form}' model, cap 450 W (MODEL): mean measured {pw_r['measured'][-100:].mean():.1f} W, "
          f"max true {pw_r['true'].max():.1f} W, steps above cap {int((pw_r['true'] > 450).sum())}/300")  # fmt: skip
assert pw_closed["activity"]["true"].max() <= 450.0
assert 0.9 * 450 <= pw_closed["activity"]["measured"][-100:].mean() <= 450.0


# %% [markdown]
# The greedy allocation spends the watts on the compute-bound `gemm` and runs `conv`, `attn` and `embed` (all below
# the ridge at batch 64) at the lowest clocks, the last two on fractional SM shares (they lose nothing there), so at
# every cap it delivers more normalised throughput than uniform capping. In closed loop the exact-form ("activity")
# model keeps the true power under the cap; with the crude linear model the feedback loop does recover its
# conservatism (the budget rises above the cap), but the discrete allocations it jumps between overrun the cap for
# some steps (counted above) -- the price of a bad model, which a larger margin or a better model removes.
#
# ## 11. Average and peak limits together: a dual-threshold controller [Q186]
#
# **Answer.** Two loops on two time scales and two knobs. The *peak* limit is about the next few milliseconds (a
# breaker, a PSU): a fast PID on the instantaneous power acts on the clock, with a feed-forward ceiling (the highest
# ladder clock whose power, scaled from the measurement by P ∝ f³, fits the cap) so a quantised clock does not dither
# across it. The *average* limit is about energy over a window (RAPL's running average, a datacenter's thermal
# budget): a slow PID on the window average acts on duty (the share of time steps are issued; a smaller batch acts
# alike), plus a RAPL-like allowance -- the largest duty that keeps the next window average under the cap.
# Coupling rule: the peak loop runs first and has priority; while it holds the clock below f_max the average loop may
# lower duty but not raise it (its integrator is frozen), so the loops never fight; if the peak loop hits f_min,
# duty is cut at once. MODEL: 2×A100, bursts of full load 1.5 s every 4 s, 25 % load in between.


# %%
pw_dt3 = 0.05
pw_t3 = np.arange(1200) * pw_dt3
pw_load3 = np.where((pw_t3 % 4.0) < 1.5, 1.0, 0.25)
pw_mk3 = lambda: Plant(A100, pw_mix2, batch=256, noise_w=3.0, sensor_tau_s=0.02, seed=1)
pw_dual = DualThresholdController(350.0, 560.0, 5.0)
pw_free, pw_cap3 = pw_dual.run(pw_mk3(), pw_load3, pw_dt3, control=False), pw_dual.run(pw_mk3(), pw_load3, pw_dt3)
pw_bursts = int(np.sum(np.diff(pw_load3) > 0)) + 1
for pw_name, pw_r in (("uncapped", pw_free), ("dual PID", pw_cap3)):
    pw_over = int((pw_r["power"] > 560).sum())
    print(f"{pw_name:9s} (MODEL): peak {pw_r['power'].max():6.1f} W, steps above 560 W {pw_over:4d}, max 5 s average "
          f"{pw_r['average'][200:].max():6.1f} W, mean {pw_r['power'].mean():6.1f} W, "
          f"throughput {pw_r['throughput'].mean():7.0f} samples/s")  # fmt: skip
pw_keep = pw_cap3["throughput"].mean() / pw_free["throughput"].mean()
print(f"throughput kept under both caps: {pw_keep:.0%} (MODEL)")
assert pw_free["power"].max() > 600 and 420 < pw_free["average"][200:].max() < 445
assert 375 < pw_free["power"].mean() < 395
assert pw_cap3["average"][200:].max() <= 350 * 1.02
assert int((pw_cap3["power"] > 560).sum()) <= pw_bursts  # at most the onset step of each burst
assert 0.55 < pw_keep < 0.7 and pw_cap3["power"].mean() < 300

pw_fig, pw_ax = plt.subplots(3, 1, figsize=(11, 6), sharex=True)
pw_ax[0].plot(pw_t3, pw_free["power"], color="0.7", lw=0.8, label="uncapped power")
pw_ax[0].plot(pw_t3, pw_cap3["power"], lw=0.8, label="power, dual PID")
pw_ax[0].plot(pw_t3, pw_cap3["average"], lw=1.5, label="5 s running average")
pw_ax[0].axhline(560, color="r", ls="--", label="peak cap")
pw_ax[0].axhline(350, color="g", ls="--", label="average cap")
pw_ax[0].set(ylabel="W", title="MODEL 2xA100, bursty load: dual-threshold control")
pw_ax[0].legend(fontsize=6, ncol=3, loc="upper right")
pw_ax[1].plot(pw_t3, pw_cap3["clock"])
pw_ax[1].set(ylabel="clock MHz (fast loop)")
pw_ax[2].plot(pw_t3, pw_cap3["duty"])
pw_ax[2].set(ylabel="duty (slow loop)", xlabel="s")
plt.tight_layout()
plt.show()


# %% [markdown]
# Both limits hold: at most the first step of a burst exceeds the peak cap (the controller sees a burst one step
# late), and the worst 5 s average stays within 2 % of its cap. The price is large: only about 60 % of the uncapped
# throughput is kept, and the mean power ends well under 300 W, because an average cap must hold in the *worst*
# window (uncapped, the 5 s average swings up to 433 W around a 386 W mean) and duty is a linear knob (watts and
# throughput fall together), whereas the clock trades throughput ∝ f for dynamic power ∝ f³.
#
# ## 12. Batch size under a power budget [Q254]
#
# **Answer.** Three parts. *Monitoring*: each step reports batch, samples/s and watts. *Prediction*: fit step time
# t(b) = t0 + t1·b (fixed overhead + per-sample work, so throughput b/t(b) saturates) and power P(b) = p0 + p1·busy(b)
# with busy = t1·b/t(b) (the share of the step the device computes) by least squares on a few probe batches.
# *Decision*: the batch with the highest predicted throughput whose predicted power plus a monitored bias (EWMA of
# measured − predicted) fits the budget minus a 2 % margin, with a Schmitt trigger (a new batch must fit with 1 % more
# to spare, the current one stays while it fits within 1 %) so noise and batch-dependent model error do not make it
# flip-flop; a budget change triggers a new decision at once. MODEL: one A100 running a GPT-like job (AI = 60),
# batches 1..1024, 2 W sensor noise; compared with the oracle that knows the MODEL exactly: the controller never
# exceeds the budget and lands between the oracle at a 4 % tighter budget and the oracle at the full budget (the
# margins are the price of noise and model error).


# %%
pw_budgets = np.arange(130.0, 251.0, 15.0)
pw_rows4 = []
for pw_b in pw_budgets:
    pw_pl = Plant(A100, [Workload("gpt", 60.0)], batch=32, noise_w=2.0, seed=2)
    pw_ctl = BatchSizeController(float(pw_b))
    pw_r = pw_ctl.run(pw_pl, 60, 0.1)
    pw_or, pw_or_thr = best_batch(pw_pl, 0, float(pw_b), pw_ctl.candidates)
    pw_tight = best_batch(pw_pl, 0, float(pw_b) * (1 - 2 * pw_ctl.margin), pw_ctl.candidates)[1]
    pw_rows4.append((pw_b, int(np.median(pw_r["batch"][-20:])), pw_r["throughput"][-20:].mean(),
                     pw_r["power"][3:].max(), pw_or, pw_or_thr, pw_tight))  # fmt: skip
for pw_row in pw_rows4:
    print(f"budget {pw_row[0]:5.0f} W: batch {pw_row[1]:5d}, {pw_row[2]:7.0f} samples/s, max power {pw_row[3]:6.1f} W"
          f" | oracle batch {pw_row[4]:5d}, {pw_row[5]:7.0f} samples/s (MODEL)")  # fmt: skip
    assert pw_row[6] * 0.999 <= pw_row[2] <= pw_row[5] * 1.001 and pw_row[3] <= pw_row[0]
pw_cut = BatchSizeController(240.0).run(Plant(A100, [Workload("gpt", 60.0)], batch=32, noise_w=2.0, seed=2), 80, 0.1,
                                        budget_change=(40, 180.0))  # fmt: skip
assert pw_cut["batch"][30:40].min() > pw_cut["batch"][45:].max() and pw_cut["power"][41:].max() <= 180.0
assert int(np.sum(np.diff(pw_cut["batch"][41:]) != 0)) <= 1  # settles, no flip-flop

pw_fig, pw_ax = plt.subplots(1, 2, figsize=(11, 3.2))
pw_ax[0].plot([r[0] for r in pw_rows4], [r[2] for r in pw_rows4], "o-")
for pw_row in pw_rows4:
    pw_ax[0].annotate(str(pw_row[1]), (pw_row[0], pw_row[2]), fontsize=7)
pw_ax[0].set(title="MODEL: throughput at the chosen batch vs budget", xlabel="budget W", ylabel="samples/s")
pw_ax[1].plot(pw_cut["t"], pw_cut["power"], label="power W")
pw_ax[1].plot(pw_cut["t"], pw_cut["budget"], "k:", label="budget")
pw_ax2 = pw_ax[1].twinx()
pw_ax2.step(pw_cut["t"], pw_cut["batch"], color="C1", where="post")
pw_ax2.set(yscale="log", ylabel="batch (orange)")
pw_ax[1].set(title="MODEL: budget cut 240 -> 180 W at t = 4 s", xlabel="s")
pw_ax[1].legend(fontsize=7)
plt.tight_layout()
plt.show()


# %% [markdown]
# ## 13. A clock waveform from arithmetic intensity and the temperature trend [Q154]
#
# **Answer.** Two signals pick the waveform. *Arithmetic intensity*: below the roofline ridge R = peak/bandwidth a
# kernel is memory-bound and every clock above f_knee = f_max·AI/R is wasted (time is set by bytes/bandwidth), so
# the plateau is the lowest ladder clock within 2 % of the f_max time -- power, and so energy, falls steeply
# (dynamic power ∝ f³) at no time cost.
# *Temperature trend* (least-squares slope of the last samples): a rising trend shifts the planning start ahead
# (the sensor lags the die), and the plan, stepped on the first-order thermal model, ramps up at a slew limit
# (an ASSUMPTION: regulators and di/dt limit the clock's rise), holds the plateau, and ramps down one ladder step at
# a time before the predicted temperature crosses throttle − 4 K -- instead of the hardware throttle's abrupt drops.
# Compared with a fixed f_max on the same work (MODEL, run with throttling on).


# %%
pw_hot = replace(A100, ambient_c=52.0)  # a hot aisle: at f_max the steady state (89 C) is above the 87 C throttle
pw_cases = {"memory-bound AI=8, 61 C, +1 K/s": (8.0, [60.0, 60.5, 61.0], A100),
            "compute-bound AI=300, hot aisle, 63 C, +1 K/s": (300.0, [60.0, 61.0, 62.0, 63.0], pw_hot)}  # fmt: skip
pw_wave = {}
for pw_name, (pw_ai, pw_temps, pw_spec) in pw_cases.items():
    pw_w = Workload("kernel", pw_ai, max_batch=4096)
    pw_wf = frequency_waveform(pw_ai, pw_temps, pw_spec, workload=pw_w, f_start=1000.0, steps=225)
    pw_work = predict(pw_spec, pw_w, pw_spec.f_max_mhz, 256)["throughput"] * 90  # 90 s of work at f_max
    pw_a = run_schedule(pw_spec, pw_w, pw_wf["clocks"], pw_work, 0.5, temp0_c=pw_temps[-1])
    pw_b = run_schedule(pw_spec, pw_w, [pw_spec.f_max_mhz], pw_work, 0.5, temp0_c=pw_temps[-1])
    pw_wave[pw_name] = (pw_wf, pw_a, pw_b)
    print(f"{pw_name}: plateau {pw_wf['plateau_mhz']:.0f} MHz (ridge AI {pw_wf['ridge_ai']:.0f})")
    for pw_lbl, pw_x in (("waveform", pw_a), ("fixed f_max", pw_b)):
        print(f"   {pw_lbl:11s} time {pw_x['time_s']:5.1f} s, energy {pw_x['energy_j'] / 1e3:5.1f} kJ, "
              f"peak {pw_x['peak_temp_c']:5.1f} C, throttled steps {pw_x['throttled_steps']} (MODEL)")  # fmt: skip
pw_mb, pw_cb = pw_wave["memory-bound AI=8, 61 C, +1 K/s"], pw_wave["compute-bound AI=300, hot aisle, 63 C, +1 K/s"]
assert pw_mb[1]["time_s"] <= 1.03 * pw_mb[2]["time_s"] and pw_mb[1]["energy_j"] < 0.5 * pw_mb[2]["energy_j"]
assert pw_cb[2]["throttled_steps"] > 0 == pw_cb[1]["throttled_steps"] and pw_cb[1]["energy_j"] < pw_cb[2]["energy_j"]
assert 1.0 < pw_cb[1]["time_s"] / pw_cb[2]["time_s"] < 1.1
assert {"up", "plateau", "down"} <= set(pw_cb[0]["phase"])
assert pw_cb[1]["peak_temp_c"] < pw_cb[2]["peak_temp_c"] - 3.0 and {"up", "down"} <= set(pw_cb[0]["phase"])

pw_fig, pw_ax = plt.subplots(1, 2, figsize=(11, 3.2))
for pw_name, (pw_wf, _, _) in pw_wave.items():
    pw_tt = np.arange(1, len(pw_wf["clocks"]) + 1) * 0.5
    pw_ax[0].plot(pw_tt, pw_wf["clocks"], label=pw_name)
    pw_ax[1].plot(pw_tt, pw_wf["predicted_temp"], label=pw_name)
pw_ax[1].axhline(pw_hot.throttle_c - 4.0, color="r", ls="--", label="throttle - 4 K")
pw_ax[0].set(title="MODEL clock waveform (ramp-up, plateau, ramp-down)", xlabel="s", ylabel="MHz")
pw_ax[1].set(title="MODEL predicted temperature", xlabel="s", ylabel="C")
for pw_a in pw_ax:
    pw_a.legend(fontsize=7)
plt.tight_layout()
plt.show()


# %% [markdown]
# Memory-bound: the plateau sits at the lowest clock, under half the energy in the same time. Compute-bound in a
# hot aisle: f_max reaches the throttle point and the hardware drops the clock in steps; the waveform ramps down
# early and never throttles, running cooler and on less energy at the cost of a run a few percent longer (the plan
# is conservative: once it descends it does not rise again).
#
# ## 14. A multi-objective DVFS controller: energy, performance, reliability [Q243]
#
# **Answer.** Inputs: temperature, measured power, load (demand as a share of what the device does per second at
# f_max). Each control period, for every ladder clock f predict power (the MODEL at the utilisation the load needs
# at f, plus a bias learned from the measured power), the share of the demand served, the per-step slowdown and the
# temperature after a 10 s horizon (first-order thermal model); pick the clock minimising
# J = w_e P/TDP + w_p (unserved + slowdown/2) + w_r (AF(T) − 1)/(AF(T_throttle) − 1), excluding clocks predicted to
# reach the throttle point. Reliability uses the Arrhenius acceleration factor AF(T) = exp(Ea/k (1/T_ref − 1/T)):
# the failure rate relative to T_ref = 60 °C, so MTBF(T) = MTBF(T_ref)/AF. **Ea = 0.7 eV is an ASSUMPTION** (a common
# value for silicon wear-out; JEDEC JEP122 lists 0.3–1.1 eV by mechanism). MODEL: one A100 at 40 °C ambient, a
# compute-bound training job (AI = 400) under a slowly varying load.


# %%
pw_tt6 = np.arange(400)
pw_load6 = np.clip(0.55 + 0.35 * np.sin(pw_tt6 / 60), 0, 1)
pw_warm = replace(A100, ambient_c=40.0)
pw_mk6 = lambda: Plant(pw_warm, [Workload("train", 400.0)], batch=256, noise_w=3.0, temp0_c=50.0)
pw_mo = {"fixed f_max": MultiObjectiveDVFS({"perf": 1.0}).run(pw_mk6(), pw_load6, 1.0, fixed_mhz=A100.f_max_mhz)}
pw_policies = {"perf only": {"perf": 1.0}, "balanced 1:2:1": {"energy": 1.0, "perf": 2.0, "reliability": 1.0},
               "eco 2:1:2": {"energy": 2.0, "perf": 1.0, "reliability": 2.0}}  # fmt: skip
for pw_name, pw_wts in pw_policies.items():
    pw_mo[pw_name] = MultiObjectiveDVFS(pw_wts).run(pw_mk6(), pw_load6, 1.0)
print(f"{'policy (MODEL)':15s} {'energy kJ':>9} {'served':>7} {'peak C':>7} {'mean AF':>8} {'rel. MTBF':>9}")
for pw_name, pw_r in pw_mo.items():
    print(f"{pw_name:15s} {pw_r['energy_j'] / 1e3:9.1f} {pw_r['served_share']:7.2%} {pw_r['peak_temp_c']:7.1f} "
          f"{pw_r['mean_af']:8.3f} {pw_mo['fixed f_max']['mean_af'] / pw_r['mean_af']:9.2f}x")  # fmt: skip
pw_bal, pw_fix = pw_mo["balanced 1:2:1"], pw_mo["fixed f_max"]
assert pw_mo["perf only"]["served_share"] > 0.999 and pw_bal["served_share"] > 0.99
assert np.all(pw_mo["perf only"]["clock"] == A100.f_max_mhz)
assert pw_bal["energy_j"] < 0.9 * pw_fix["energy_j"] and pw_fix["mean_af"] / pw_bal["mean_af"] > 1.3
assert pw_mo["eco 2:1:2"]["energy_j"] < 0.55 * pw_fix["energy_j"]
assert pw_mo["eco 2:1:2"]["energy_j"] < pw_bal["energy_j"] and arrhenius_af(60.0) == 1.0
assert pw_bal["peak_temp_c"] < pw_fix["peak_temp_c"] - 3.0 and pw_mo["eco 2:1:2"]["served_share"] < 0.95

pw_fig, pw_ax = plt.subplots(3, 1, figsize=(11, 6), sharex=True)
for pw_name, pw_r in pw_mo.items():
    pw_ax[0].plot(pw_r["t"], pw_r["clock"], lw=1, label=pw_name)
    pw_ax[1].plot(pw_r["t"], pw_r["temp"], lw=1, label=pw_name)
pw_ax[2].plot(pw_tt6, pw_load6, color="k")
pw_ax[0].set(title="MODEL multi-objective DVFS on a load trace", ylabel="clock MHz")
pw_ax[1].set(ylabel="temperature C")
pw_ax[2].set(ylabel="load (share of f_max work)", xlabel="s")
pw_ax[0].legend(fontsize=7, ncol=4)
plt.tight_layout()
plt.show()


# %% [markdown]
# Performance alone keeps f_max (on a compute-bound job a lower clock always lengthens each step: the latency term).
# The balanced weights give up a fraction of a percent of the work for ~16 % less energy, a peak several kelvin
# lower and a ~1.4× longer Arrhenius MTBF; weighting energy and reliability more (eco) halves the energy but leaves
# >5 % of the demand unserved -- the weights are the operator's price of a joule against a lost sample and a failure.


# %% [markdown]
# ## 15. Online per-kernel power model with error backfill [Q246] [Q131]
#
# **Answer.** Describe each kernel by the counters a GPU exposes per launch (instruction-class mix and activity:
# FMA/tensor, vector ALU, reductions/special functions; memory activity; arithmetic intensity; active SMs; vector
# width), treat power as linear in those rates (static power + sum over units of access rate × energy per access,
# the Isci–Martonosi / Hong–Kim counter model), and learn the coefficients *online* with recursive least squares:
# every measurement first scores the prediction (its error is logged), then is folded in (the error is backfilled
# into the coefficients). A forgetting factor λ < 1 (memory ≈ 1/(1−λ) samples) lets the model follow drift (a hotter,
# leakier chip, a new memory clock) that a batch refit on all history averages away. For DVFS [Q131], the predicted
# power at f_max gives the highest clock whose predicted power fits the cap.
#
# Here the **features are real**: tinylearn's own ops (matmul, GELU, softmax, layer_norm, add, sum forward and
# backward, conv2d; float32 and float64; 1 and 2 threads) run under `tinylearn.profiler.profile` on this CPU, and
# `kernel_features` reads FLOPs, bytes, self time, dtype and thread cap from each event. The **power is a MODEL**:
# this VM has no power sensor, so the "measurement" is the device-model A100 power at the utilisation the features
# imply, plus 3 W Gaussian noise; at sample 300 the MODEL's coefficients change (drift).


# %%
# NBVAL_IGNORE_OUTPUT
th_events = th_pr.profile_kernels(sizes=(32, 64, 128), repeat=2)
th_samples = th_pr.kernel_features(th_events)
th_classes = {c: sum(s.cls == c for s in th_samples) for c in ("gemm", "vector", "reduce")}
print(f"{len(th_events)} profiled events -> {len(th_samples)} kernel samples, classes {th_classes}")
th_run = th_pr.online_stream(th_samples, n=600, drift_at=300, seed=0)
th_noise_mae = 3.0 * np.sqrt(2 / np.pi)  # mean |N(0, 3 W)|: the floor any predictor can reach
for th_m in th_run.abs_errors:
    print(f"{th_m:16s} MAE (W, MODEL target): samples 200-300 {th_run.mae(th_m, 200, 300):6.2f}, "
          f"300-350 {th_run.mae(th_m, 300, 350):6.2f}, 500-600 {th_run.mae(th_m, 500, 600):6.2f}")  # fmt: skip
assert min(th_classes.values()) > 0
assert th_run.mae("RLS", 200, 300) < 2 * th_noise_mae and th_run.mae("RLS", 500, 600) < 2 * th_noise_mae
assert th_run.mae("batch LS", 500, 600) > 2 * th_run.mae("RLS", 500, 600)
assert th_run.mae("per-kernel mean", 100, 300) > 2 * th_run.mae("RLS", 100, 300)

th_fig, th_ax = plt.subplots(figsize=(8, 3.2))
for th_m, th_e in th_run.abs_errors.items():
    th_ax.plot(np.convolve(th_e, np.ones(25) / 25, mode="valid"), label=th_m)
th_ax.axvline(th_run.drift_at, color="k", ls=":", label="MODEL drift")
th_ax.axhline(th_noise_mae, color="grey", ls="--", label="noise floor")
th_ax.set(xlabel="kernel sample", ylabel="|error| W (25-sample mean)", yscale="log",
          title="MODEL power target, real profiled features: online learning curve")  # fmt: skip
th_ax.legend(fontsize=8)
plt.show()


# %% [markdown]
# The per-kernel-name mean cannot separate a 32×32 float64 single-thread matmul from a 128×128 float32 two-thread
# one; RLS (λ = 0.98) is within 2× the noise floor after 50 samples, its error jumps at the drift and is back within
# 2× the floor in the last 100 samples, while the batch fit stays biased (it weighs the old regime as much as the
# new). The DVFS choice from the RLS prediction [Q131]:


# %%
assert th_run.mae("RLS", 50, 100) < 2 * th_noise_mae
assert th_run.mae("RLS", 300, 350) > 4 * th_noise_mae  # the drift is visible
assert th_run.mae("RLS", 500, 600) < 2 * th_noise_mae


# %%
# NBVAL_IGNORE_OUTPUT
# (the samples come from profiling real tinylearn ops: which kernel is the hottest can change between runs)
th_rls = th_pr.RLSPowerModel(len(th_pr.FEATURES), 0.98)
th_plant = th_pr.PowerPlant()
th_rng = np.random.default_rng(1)
for th_s in th_samples:
    th_rls.update(th_s.x, th_plant.power(th_s.x, th_rng), th_s.name)
th_cap = 250.0
th_big = max(th_samples, key=lambda s: th_plant.util(s.x))
th_pred = th_rls.predict(th_big.x)
th_f = th_pr.dvfs_clock(th_pred, A100, th_cap)
th_true_at_f = A100.power_w(th_f, th_plant.util(th_big.x))
print(f"hottest kernel {th_big.name}: predicted {th_pred:.0f} W at {A100.f_max_mhz:.0f} MHz (MODEL), "
      f"cap {th_cap:.0f} W -> {th_f:.0f} MHz, MODEL power there {th_true_at_f:.0f} W")  # fmt: skip
assert th_f < A100.f_max_mhz and th_true_at_f <= th_cap + 10.0  # within the 3 W noise of the model's target


# %% [markdown]
# ## 16. Predicting power spikes and pre-throttling [Q165]
#
# **Answer.** Spikes that come from the pipeline's structure (the attention+GEMM phase of every layer/micro-batch)
# are periodic, so a sliding-window autoregressive model (or a small LSTM) over the last steps' power predicts the
# next step's power; when the prediction exceeds the cap, the clock is lowered *before* that step (pre-throttling).
# A reactive controller sees the spike only after it happened: it misses the spike and then throttles the next,
# harmless step. MODEL plant: an A100 whose step utilisation has a spike every 8th step, cap 320 W; power and step
# time from the device model (P ∝ f³ above idle, compute time ∝ 1/f). Predictors: `tinylearn.tune.ar_predict`'s
# ARX (order 9) and LSTM (hidden 8, window 10), fitted on the first 96 steps.


# %%
# NBVAL_IGNORE_OUTPUT
th_u = th_pr.spike_utilisation(240, period=8, spike_at=5, seed=0)
th_start, th_capw = 96, 320.0
th_hist = [A100.power_w(A100.f_max_mhz, float(v)) for v in th_u[:th_start]]
th_ar = ARPredictor(order=9, exog=()).fit(th_hist)
th_lstm = LSTMPredictor(exog=(), window=10, hidden=8, epochs=150).fit(th_hist)
th_runs = [
    th_pr.throttle_run(th_u, A100, th_capw, None, "no control", th_start),
    th_pr.throttle_run(th_u, A100, th_capw, lambda h: float(h[-1]), "reactive (last value)", th_start),
    th_pr.throttle_run(th_u, A100, th_capw, lambda h: th_ar.predict_next(h, None, None), "pre-throttle AR", th_start),
    th_pr.throttle_run(th_u, A100, th_capw, lambda h: th_lstm.predict_next(h, np.zeros((len(h), 0)), None),
                       "pre-throttle LSTM", th_start),
]  # fmt: skip
th_base = th_runs[0].step_s.sum()
print(f"{'controller (MODEL)':24s} {'steps > cap':>11s} {'peak W':>7s} {'time lost':>10s}")
for th_r in th_runs:
    print(f"{th_r.name:24s} {th_r.over_cap_steps:11d} {th_r.peak_w:7.0f} {100 * th_r.time_lost_s / th_base:9.2f}%")
th_n_spikes = int(((np.arange(th_start, 240) % 8) == 5).sum())
assert th_runs[0].over_cap_steps == th_runs[1].over_cap_steps == th_n_spikes
assert th_runs[2].over_cap_steps == 0 and th_runs[2].peak_w <= th_capw < th_runs[1].peak_w
assert th_runs[3].over_cap_steps <= th_n_spikes // 4
assert 0 < th_runs[1].time_lost_s < th_runs[2].time_lost_s

th_fig, th_ax = plt.subplots(figsize=(8, 3.2))
for th_r in th_runs[:3]:
    th_ax.plot(np.arange(th_start, th_start + 40), th_r.power_w[:40], label=th_r.name, lw=1.2)
th_ax.axhline(th_capw, color="k", ls=":", label="cap")
th_ax.set(xlabel="step", ylabel="W", title="MODEL A100 pipeline power: reactive vs predictive throttling")
th_ax.legend(fontsize=8)
plt.show()


# %% [markdown]
# The AR predictor keeps every step under the cap (the LSTM at least 3 of 4 spikes; here all); the reactive
# controller lets every spike through and still pays time for throttling the step after it. In this MODEL run
# pre-throttling costs more time than reactive (the spike step is the long compute-bound one): that is the price of
# the cap actually holding. torch and tinygrad have no power or cluster
# controllers: on real GPUs this loop sits in the driver/firmware (NVIDIA power capping, `nvidia-smi -pl`) or in a
# cluster agent reading NVML.


# %% [markdown]
# ## 17. Predicting temperature and migrating hot jobs [Q182]
#
# **Answer.** Fit a line to each device's last ~10 s of temperature and extrapolate it over a horizon (here 20 s);
# if a device is predicted to cross its throttle temperature, move its hottest job to the coolest device that has a
# free slot and would stay below the threshold with that job (steady state of the RC model), pause the job for the
# transfer (5 s here) and freeze it for a minute so it cannot ping-pong. MODEL node: six A100s identical except
# for cooling (thermal resistance 0.18 … 0.07 K/W, time constant 30 s), eight jobs (utilisation 0.3–0.5, two slots
# per device) packed onto the first four devices — the two worst-cooled ones run hot.


# %%
th_specs = th_th.uneven_node()
th_utils = [0.5, 0.5, 0.5, 0.45, 0.45, 0.35, 0.3, 0.3]
th_jobs = [th_th.ThermalJob(f"j{i}", u) for i, u in enumerate(th_utils)]
th_place = {f"j{i}": i // 2 for i in range(8)}
th_none = th_th.simulate_node(th_specs, th_jobs, th_place, "none", duration_s=300)
th_mig = th_th.simulate_node(th_specs, th_jobs, th_place, "migrate", duration_s=300)
for th_r in (th_none, th_mig):
    print(
        f"{th_r.policy:8s} throttled {th_r.throttled_s:5.0f} device-s, work {th_r.work:6.1f} device-s at f_max, "
        f"max temp {th_r.temps.max():.1f} C, migrations {[(m.t, m.job, m.src, m.dst) for m in th_r.migrations]}"
    )
assert th_none.throttled_s > 100 and th_mig.throttled_s < 0.25 * th_none.throttled_s
assert th_mig.work > th_none.work and th_mig.loads.max() <= 2

th_fig, th_axs = plt.subplots(1, 2, figsize=(10, 3.2), sharey=True)
for th_ax, th_r in zip(th_axs, (th_none, th_mig)):
    for th_k in range(len(th_specs)):
        th_ax.plot(th_r.t, th_r.temps[:, th_k], label=th_specs[th_k].name.split("#")[1])
    th_ax.axhline(A100.throttle_c, color="k", ls=":")
    th_ax.set(xlabel="s", title=f"MODEL temperatures, {th_r.policy}")
th_axs[0].set_ylabel("C")
th_axs[1].legend(fontsize=7)
plt.show()


# %% [markdown]
# ## 18. Who pays for the shared cluster? Shapley values, exact and sampled [Q227]
#
# **Answer.** Treat the tenants as players of a cooperative game whose value v(S) is what the cluster costs when
# only the tenants in S use it; a tenant's Shapley value is its marginal cost averaged over every order in which
# tenants could join, the only split that is efficient (the shares add up to the bill), symmetric and gives a
# tenant that costs nothing zero. Exact evaluation needs all 2^n coalitions; for many tenants sample random join
# orders: each order gives one marginal per tenant, the estimate is unbiased, stays exactly efficient, and its error
# is bounded by 1.96 standard errors (CLT) or, without asymptotics, by Hoeffding's R sqrt(ln(2n/delta) / 2m).
# The shares can then weight fair scheduling (a tenant that drives the cost up gets a smaller weight or pays more).
# Here v(S) = the GPU-minutes a 4-GPU cluster is held (4 x makespan) to run S's jobs, from the discrete-event
# simulator (`tinylearn.sched.sim`, FIFO; a MODEL), compared with the usual split proportional to GPU-seconds used:
# the usage split ignores who keeps the cluster busy late and who fills gaps others leave. Neither
# torch nor tinygrad has a cluster scheduler or cost-sharing; this is tinylearn's own code.


# %%
ec_rng = np.random.default_rng(0)
ec_tenants = ["vision", "llm", "ads", "search", "research"]
ec_jobs = {}
for ec_t in ec_tenants:
    ec_n = 2 if ec_t != "llm" else 1
    ec_jobs[ec_t] = [
        (
            float(ec_rng.uniform(0, 120)),
            Job(
                f"{ec_t}{i}",
                steps=int(ec_rng.integers(20, 60)),
                demand={"gpu": float(4 if ec_t == "llm" else ec_rng.integers(1, 3))},
                tenant=ec_t,
                est_step_s=float(ec_rng.uniform(0.5, 2.0)),
            ),
        )
        for i in range(ec_n)
    ]


def ec_cost(coalition: frozenset) -> float:
    """MODEL cost: GPU-minutes the 4-GPU cluster is held (4 x makespan) to run only the coalition's jobs."""
    items = [it for t in ec_tenants if t in coalition for it in ec_jobs[t]]
    if not items:
        return 0.0
    return 4 * Simulator({"gpu": 4}, FIFO()).simulate(items).makespan_s / 60


ec_exact = shapley.shapley_exact(ec_tenants, ec_cost)
ec_total = ec_cost(frozenset(ec_tenants))
ec_gpu_s = {t: sum(j.steps * j.est_step_s * j.demand["gpu"] for _, j in ec_jobs[t]) for t in ec_tenants}
ec_prop = {t: ec_total * ec_gpu_s[t] / sum(ec_gpu_s.values()) for t in ec_tenants}
ec_width = shapley.marginal_range(ec_tenants, ec_cost)
ec_ms = [5, 10, 20, 50, 100, 200, 400]
ec_est = {m: shapley.shapley_mc(ec_tenants, ec_cost, samples=m, seed=1) for m in ec_ms}
print(f"MODEL cluster held {ec_total:.1f} GPU-min; marginal range R = {ec_width:.1f} GPU-min")
print(f"{'tenant':>9} {'Shapley':>8} {'by GPU-s':>9} {'MC m=400':>9} {'+-1.96se':>9}")
for t in ec_tenants:
    print(f"{t:>9} {ec_exact[t]:8.2f} {ec_prop[t]:9.2f} {ec_est[400][0][t]:9.2f} {1.96 * ec_est[400][1][t]:9.2f}")
assert abs(sum(ec_exact.values()) - ec_total) < 1e-6  # efficiency, exact
for m, (phi, _) in ec_est.items():
    assert abs(sum(phi.values()) - ec_total) < 1e-6  # efficiency holds for every sample count
    hb = shapley.hoeffding_halfwidth(ec_width, m, delta=0.05, players=len(ec_tenants))
    assert all(abs(phi[t] - ec_exact[t]) <= hb for t in ec_tenants)
# the Shapley split differs from the usage split: idle time the cluster is held is charged to who causes it
assert max(abs(ec_exact[t] - ec_prop[t]) for t in ec_tenants) > 0.05 * ec_total


# %%
ec_fig, ec_ax = plt.subplots(figsize=(7, 3.5))
for t in ec_tenants[:3]:
    mu = np.array([ec_est[m][0][t] for m in ec_ms])
    band = np.array([1.96 * ec_est[m][1][t] for m in ec_ms])
    (ln,) = ec_ax.plot(ec_ms, mu, marker="o", label=t)
    ec_ax.fill_between(ec_ms, mu - band, mu + band, color=ln.get_color(), alpha=0.2)
    ec_ax.axhline(ec_exact[t], color=ln.get_color(), ls="--", lw=1)
ec_ax.set_xscale("log")
ec_ax.set(xlabel="sampled join orders m", ylabel="Shapley share (GPU-min)",
          title="MODEL cluster-time game: sampled Shapley +- 1.96 se (dashed: exact)")  # fmt: skip
ec_ax.legend()
plt.show()


# %% [markdown]
# ## 19. Bidding for power: a second-price auction under a power budget [Q172]
#
# **Answer.** Turn the power budget's headroom into k identical slots (the extra watts of running one tenant's
# device at boost clock instead of base clock) and run a (k+1)-th price auction: the k highest bids win, each pays
# the highest losing bid. The price a winner pays does not depend on its own bid, so bidding the true value of the
# speed-up is optimal whatever the others do -- the sweep below checks it -- and the slots go to the tenants who
# value them most, which maximises total value within the budget. Proportional share (budget x bid / sum of bids)
# is the weighted-fair alternative: nobody is shut out, but tenants gain by shading their bids. Watts are MODEL
# (`device_model.A100`).


# %%
ec_base_f = A100.freqs()[7]
ec_slot_w = A100.power_w(A100.f_max_mhz, 1.0) - A100.power_w(ec_base_f, 1.0)
ec_nodes = 6
ec_budget = ec_nodes * A100.power_w(ec_base_f, 1.0) + 2.5 * ec_slot_w  # room for 2 boosted devices
ec_values = {"chat": 9.0, "train": 6.5, "etl": 2.0, "eval": 4.0, "batch": 1.0, "dev": 0.5}
ec_auc = market.power_slot_auction(ec_values, ec_budget, ec_slot_w, base_w=ec_nodes * A100.power_w(ec_base_f, 1.0))
print(f"MODEL: base clock {ec_base_f:.0f} MHz, boost slot {ec_slot_w:.0f} W, budget {ec_budget:.0f} W")
print("winners", ec_auc.winners, "price", ec_auc.price)
assert ec_auc.winners == ["chat", "train"] and ec_auc.price == 4.0
ec_others = {k: v for k, v in ec_values.items() if k != "eval"}
ec_bids = np.linspace(0, 10, 101)
ec_util = [market.auction_utility(ec_values["eval"], float(b), ec_others, units=2, me="eval") for b in ec_bids]
ec_util_train = [market.auction_utility(6.5, float(b), {k: v for k, v in ec_values.items() if k != "train"}, 2,
                                        "train") for b in ec_bids]  # fmt: skip
assert max(ec_util_train) <= market.auction_utility(6.5, 6.5, {k: v for k, v in ec_values.items() if k != "train"},
                                                     2, "train") + 1e-12  # fmt: skip
assert max(ec_util) <= market.auction_utility(4.0, 4.0, ec_others, 2, "eval") + 1e-12
print("proportional share of the headroom (W):",
      {k: round(v) for k, v in market.proportional_share(ec_values, 2.5 * ec_slot_w).items()})  # fmt: skip
ec_fig, ec_ax = plt.subplots(figsize=(6, 3))
ec_ax.plot(ec_bids, ec_util_train, label="train (value 6.5)")
ec_ax.plot(ec_bids, ec_util, label="eval (value 4.0)")
ec_ax.axvline(6.5, ls=":", color="C0")
ec_ax.set(xlabel="bid", ylabel="utility", title="Vickrey auction: no bid beats the true value")
ec_ax.legend()
plt.show()


# %% [markdown]
# The weighted-fair side of the same question: split the headroom by weighted max-min (water-filling: nobody gets
# more watts than it can use, the rest is shared in proportion to the weights, here the bids), and when tenants want
# two resources at once (watts AND SMs), by weighted Dominant Resource Fairness (Ghodsi et al., NSDI 2011), whose
# textbook example <9 CPU, 18 GB>, A <1, 4>, B <3, 1> must give A 3 tasks and B 2.


# %%
ec_use_w = {"chat": 150.0, "train": 450.0, "etl": 60.0, "eval": 200.0, "batch": 300.0, "dev": 40.0}  # W each can use
ec_wmm = fairness.weighted_max_min(2.5 * ec_slot_w, ec_use_w, ec_values)
ec_drf_cap = {"watts": 2.5 * ec_slot_w, "sm": 108}  # A100: 108 SMs
ec_drf_dem = {"chat": {"watts": 20.0, "sm": 12}, "train": {"watts": 60.0, "sm": 8}, "eval": {"watts": 25.0, "sm": 6}}
ec_drf = fairness.drf_allocate(ec_drf_cap, ec_drf_dem, weights={k: ec_values[k] for k in ec_drf_dem})
ec_drf_eq = fairness.drf_allocate(ec_drf_cap, ec_drf_dem)
print("weighted max-min watts (MODEL):", {k: round(v) for k, v in ec_wmm.items()})
print("DRF over (watts, SMs), units: weighted by bids", ec_drf, "unweighted", ec_drf_eq)
assert abs(sum(ec_wmm.values()) - 2.5 * ec_slot_w) < 1e-6 and all(ec_wmm[k] <= ec_use_w[k] + 1e-9 for k in ec_use_w)
assert ec_wmm["chat"] == ec_use_w["chat"]  # the top bidder is satisfied in full
assert ec_drf["chat"] > ec_drf_eq["chat"] and ec_drf["eval"] < ec_drf_eq["eval"]  # weights move units to high bids
assert fairness.drf_allocate({"cpu": 9, "mem": 18}, {"A": {"cpu": 1, "mem": 4}, "B": {"cpu": 3, "mem": 1}}) == {
    "A": 3,
    "B": 2,
}


# %% [markdown]
# ## 20. Serving strategies as a game: Nash equilibrium and the price of anarchy [Q171]
#
# **Answer.** Each tenant picks a strategy (batch policy, int8 or fp16, ...) and its payoff depends on everyone's
# choice through the shared device, so the outcome is a Nash equilibrium of the game, not the social optimum.
# Enumerate each profile's best responses to find the pure equilibria, let tenants best-respond in turn to see
# whether selfish tuning settles (it does in congestion/potential games), and compare the worst equilibrium's total
# payoff with the best profile's: the price of anarchy. In this MODEL (device time shared in proportion to batch
# work, latency growing with the total batch in flight) every tenant gains share by growing its batch while
# everyone's latency worsens -- the tragedy of the commons; an operator fixes it with a per-tenant batch cap or a
# latency price, which removes the profitable deviation.


# %%
ec_strats = {"b1": (1, False), "b8": (8, False), "b32": (32, False), "b8-int8": (8, True), "b32-int8": (32, True)}
ec_pay, ec_names = market.shared_device_game(ec_strats, n_players=3)
ec_eqs = market.pure_nash(ec_pay)
ec_final, ec_path, ec_conv = market.best_response_dynamics(ec_pay, (0, 0, 0))
ec_poa, ec_opt, _ = market.price_of_anarchy(ec_pay)
ec_w = ec_pay.sum(axis=-1)
print("pure equilibria:", [[ec_names[s] for s in e] for e in ec_eqs])
print("best-response path:", [[ec_names[s] for s in p] for p in ec_path], "converged" if ec_conv else "cycled")
ec_worst = min(ec_w[e] for e in ec_eqs)
print(f"social optimum {[ec_names[s] for s in ec_opt]} welfare {ec_w[ec_opt]:.0f}; "
      f"worst equilibrium welfare {ec_worst:.0f}; price of anarchy {ec_poa:.2f} (MODEL)")  # fmt: skip
assert ec_conv and ec_final in ec_eqs
assert ec_poa > 1.1 and ec_opt not in ec_eqs


# %% [markdown]
# ## 21. An online Pareto front of configurations [Q229]
#
# **Answer.** Keep only non-dominated configurations: a new (energy, latency, risk) point is rejected if some kept
# point is at least as good everywhere, and otherwise inserted while every kept point it dominates is pruned. The
# front is then always exactly the non-dominated subset of all points seen, at O(front) work per insert; its
# hypervolume (exact sweep in 2-D, Monte Carlo in 3-D) tracks how much it improves. Configurations below are a
# MODEL stream: an A100 clock, a batch size and a checkpoint interval give energy per sample, latency and the
# expected work lost to a failure.


# %%
ec_cfg_rng = np.random.default_rng(3)
ec_front = pareto.ParetoFront(3)
ec_seen, ec_sizes = [], []
for _ in range(1500):
    f = float(ec_cfg_rng.choice(A100.freqs()))
    b = int(ec_cfg_rng.choice([1, 2, 4, 8, 16, 32, 64]))
    ckpt = float(ec_cfg_rng.uniform(5, 120))  # minutes between checkpoints
    step = A100.step_time_s(2e12 * b, 4e9 + 1e8 * b, f)
    energy = A100.power_w(f, min(1.0, 0.3 + 0.1 * math.log2(b))) * step / b  # J per sample
    latency = step * 1e3  # ms per batch
    risk = ckpt / 2 + 60.0 * 30.0 / ckpt / 60.0  # MODEL: expected lost minutes + checkpoint overhead minutes per hour
    p = (energy, latency, risk)
    ec_seen.append(p)
    ec_front.insert(p, payload=(f, b, round(ckpt)))
    ec_sizes.append(len(ec_front))
ec_brute = {tuple(ec_seen[i]) for i in pareto.pareto_filter(ec_seen)}
assert set(ec_front.points()) == ec_brute
ec_hv, ec_hv_se = ec_front.hypervolume_mc(np.max(ec_seen, axis=0), samples=20000, seed=0)
print(f"{len(ec_seen)} configs -> front of {len(ec_front)} (pruned {ec_front.pruned} on the way); "
      f"MODEL hypervolume {ec_hv:.3g} +- {1.96 * ec_hv_se:.2g}")  # fmt: skip
assert len(ec_front) < len(ec_seen) / 5


# %% [markdown]
# ## 22. Time, peak memory and energy: weighted sum vs epsilon-constraint vs the front [Q127]
#
# **Answer.** Three strategies: a weighted sum of normalised objectives (one number, easy, but it can only ever
# select points on the convex hull of the front), an epsilon-constraint (minimise time subject to memory and energy
# budgets: it reaches any front point, and budgets are what operators actually have), and the Pareto front itself
# (offer the menu, pick later). The MODEL candidates: a 24-layer training step with activation checkpointing every
# k layers (recompute costs time, stored activations cost memory) at a ladder of clocks (energy = power x time).


# %%
ec_cands, ec_labels = [], []
for k in (1, 2, 3, 4, 6, 8, 12, 24):
    for f in A100.freqs()[::2]:
        t = 1.0 * (1 + (0.0 if k == 1 else 0.33)) * (1 + 0.02 * k) * A100.f_max_mhz / f  # recompute + clock
        mem = 8.0 + 24 * 1.5 / k + 1.5 * k  # GB: checkpoints + one segment's activations
        ec_cands.append((t, mem, A100.power_w(f, 0.9) * t / 1e3))
        ec_labels.append((k, round(f)))
ec_front_idx = pareto.pareto_choice(ec_cands)
ec_sup = pareto.supported_by_weighted_sum(ec_cands, n_weights=400)
ec_unsup = [i for i in ec_front_idx if i not in ec_sup]
ec_eps = pareto.epsilon_constraint(ec_cands, primary=0, bounds={1: 24.0, 2: 0.3})
print(f"{len(ec_cands)} candidates, {len(ec_front_idx)} on the front, {len(ec_unsup)} picked by NO weighted sum")
print("epsilon-constraint (mem <= 24 GB, energy <= 0.3 kJ):", ec_labels[ec_eps], np.round(ec_cands[ec_eps], 3))
assert ec_unsup and ec_eps in ec_front_idx
ec_fig, ec_ax = plt.subplots(figsize=(6, 3.5))
ec_arr = np.array(ec_cands)
ec_ax.scatter(ec_arr[:, 0], ec_arr[:, 1], c="lightgray", s=12, label="candidates")
ec_ax.scatter(ec_arr[ec_front_idx, 0], ec_arr[ec_front_idx, 1], s=18, label="Pareto front (3 objectives)")
ec_ax.scatter(ec_arr[ec_unsup, 0], ec_arr[ec_unsup, 1], marker="x", c="r", s=40, label="no weighted sum picks")
ec_ax.set(xlabel="step time (s)", ylabel="peak memory (GB)", title="MODEL schedules: time vs memory (energy hidden)")
ec_ax.legend(fontsize=8)
plt.show()


# %% [markdown]
# ## 23. A weighted-Tchebycheff priority queue over power, temperature and throughput [Q194]
#
# **Answer.** Score each queued job by max_i w_i |f_i - z_i*| / scale_i over (power W, temperature C,
# -throughput in TFLOP/s), z* the ideal point, and run the lowest score first. Unlike a weighted sum, the max can
# select every Pareto-optimal trade-off (including ones in non-convex dents) by choosing weights, and the job it pops
# first is always (weakly) Pareto-optimal among the queued ones. Weights encode the operator's priorities: raising the
# temperature weight sends the hottest job (boost-clock GEMM) to the back, raising the throughput weight brings the
# high-FLOP jobs to the front. Objectives are MODEL (`device_model.A100`: power, steady
# temperature, roofline step rate).


# %%
ec_jobs_q = {}
for name, flops, nbytes, f, u in [("gemm-boost", 4e12, 2e9, 1410, 1.0), ("gemm-eco", 4e12, 2e9, 915, 1.0),
                                  ("decode", 1e11, 8e9, 1410, 0.4), ("etl", 1e10, 2e9, 555, 0.3),
                                  ("train", 8e12, 6e9, 1290, 0.95)]:  # fmt: skip
    ec_jobs_q[name] = pareto.job_objectives(A100, flops, nbytes, f, u)
ec_ideal = tuple(min(o[i] for o in ec_jobs_q.values()) for i in range(3))
ec_orders = {}
for ec_wts in [(1.0, 1.0, 1.0), (0.3, 3.0, 1.0), (0.3, 0.3, 3.0)]:
    q = pareto.TchebycheffQueue(ec_wts, ec_ideal, scale=(100.0, 10.0, 100.0))
    for name, obj in ec_jobs_q.items():
        q.push(name, obj)
    order = [q.pop()[0] for _ in range(len(ec_jobs_q))]
    ec_orders[ec_wts] = order
    print("weights (W, C, -TFLOP/s)", ec_wts, "->", order)
    first = ec_jobs_q[order[0]]
    assert not any(pareto.dominates(o, first) for o in ec_jobs_q.values())  # the first pop is Pareto-optimal
assert len({tuple(o) for o in ec_orders.values()}) == 3  # each weighting gives a different order
assert ec_orders[(0.3, 3.0, 1.0)].index("gemm-boost") == 4 and ec_orders[(0.3, 0.3, 3.0)][0] == "train"


# %% [markdown]
# ## 24. Choosing a kernel by time and joules [Q282]
#
# **Answer.** Rank candidate implementations by a composite objective time^alpha x joules^(1-alpha): alpha = 1 is
# "fastest", alpha = 0 "fewest joules", alpha = 1/2 ranks like the energy-delay product. FLOPs/W and bytes/J are the
# same information per unit of work. The times below are MEASURED on this VM, one thread each, in one process:
# tinylearn's C++ GEMM rungs beside torch's `mm` and tinygrad's matmul (TinyJit, CPU device) as further candidates;
# the joules are a MODEL: one core drawing 2 W static + 13 W x (f/f_max)^3 dynamic, with a DVFS ladder scaling a
# compute-bound kernel's time by f_max/f. At a fixed clock energy is proportional to time here, so the fastest
# candidate always wins; the trade-off appears along the clock: slower clocks save dynamic energy until static power
# dominates, and the choice moves with alpha.


# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
ec_a = np.random.default_rng(0).standard_normal((192, 192)).astype(np.float32)
ec_times = {}
with limited_threads(1, torch=True):
    for v in ("ikj", "packed", "simd"):
        ec_times[v] = measure(lambda v=v: matmul(ec_a, ec_a, backend="cpp", version=v), warmup=1, repeat=7).min
    ec_ta = torch.from_numpy(ec_a)
    ec_times["torch"] = measure(lambda: torch.mm(ec_ta, ec_ta), warmup=1, repeat=7).min
    if tinygrad_status()[0]:
        ec_tg = import_tinygrad()
        ec_tga = ec_tg.Tensor(ec_a).realize()
        ec_tgmm = tinygrad_jit(lambda x: x @ x)
        ec_times["tinygrad"] = measure(lambda: ec_tgmm(ec_tga), warmup=2, repeat=7).min
    else:
        print("tinygrad:", tinygrad_status()[1])
ec_core = DeviceSpec("vm-core-model", peak_tflops=1e-3, mem_bw_gbs=1.0, mem_gb=1.0, tdp_w=15.0, idle_w=2.0,
                     f_max_mhz=3000.0, f_min_mhz=1000.0, f_steps=9, source="MODEL: nominal one-core power")  # fmt: skip
ec_kc = {}
for v, t in ec_times.items():
    for f in ec_core.freqs():
        tt = t * ec_core.f_max_mhz / f
        ec_kc[f"{v}@{f:.0f}MHz"] = (tt, ec_core.power_w(f, 1.0) * tt)
ec_alphas = [0.0, 0.25, 0.5, 0.75, 1.0]
ec_pick = {a: pareto.choose_kernel(ec_kc, a) for a in ec_alphas}
print("measured (best of 7, one thread):", {k: f"{v * 1e3:.3f} ms" for k, v in ec_times.items()})
print("time / torch mm:", ", ".join(f"{k} {v / ec_times['torch']:.2f}x" for k, v in ec_times.items()))
for a in ec_alphas:
    t, j = ec_kc[ec_pick[a]]
    print(f"alpha={a:4.2f}: {ec_pick[a]:>16}  time {t * 1e3:.3f} ms  MODEL energy {j * 1e3:.2f} mJ")
ec_fast = min(ec_times, key=ec_times.get)
assert ec_pick[1.0] == f"{ec_fast}@3000MHz"
assert ec_pick[0.0] != ec_pick[1.0] and ec_pick[0.0].startswith(ec_fast)
assert ec_kc[ec_pick[0.0]][1] < ec_kc[ec_pick[1.0]][1] and ec_kc[ec_pick[0.0]][0] > ec_kc[ec_pick[1.0]][0]


# %% [markdown]
# ## 25. Learning which tenant launches next: tabular Q-learning [Q138]
#
# **Answer.** State = (each tenant's queue length bucketed, power above the cap?, temperature bucket), action =
# the tenant whose kernel launches next, reward = -(weighted queue length, i.e. weighted latency by Little's law)
# - a penalty per 10 W above the power cap - a penalty per degree above a soft limit. Tabular Q-learning with
# epsilon-greedy exploration learns it from reward alone; it must beat the obvious heuristics on the same arrival
# sequences. MODEL environment: Poisson kernel arrivals, A100 power and RC thermal model; three tenants (a
# latency-critical chat service with weight 4, a power-hungry training job, batch inference). The gain comes from
# serving the weight-4 tenant first: the share of ticks above the cap is the same for every policy, because the
# training kernels have to run sometime. Production GPUs time-slice, use MPS or MIG; none learns online -- the
# learned table here is the design exercise.


# %%
ec_env = tenant_rl.KernelLaunchEnv()
ec_pol, ec_curve = tenant_rl.q_learning(ec_env, episodes=250, seed=0)
ec_res = {
    "Q-learning": tenant_rl.evaluate(ec_env, ec_pol, episodes=20),
    "round-robin": tenant_rl.evaluate(ec_env, tenant_rl.RoundRobin(), episodes=20),
    "shortest-queue-first": tenant_rl.evaluate(ec_env, tenant_rl.ShortestQueueFirst(), episodes=20),
}
for k, r in ec_res.items():
    print(f"{k:>21}: reward/tick {r['reward']:7.3f}  weighted queue {r['weighted_queue']:6.2f}  "
          f"ticks over cap {r['over_cap']:.1%}  peak {r['peak_c']:.1f} C (MODEL)")  # fmt: skip
assert ec_res["Q-learning"]["reward"] > ec_res["round-robin"]["reward"] + 0.08 * abs(ec_res["round-robin"]["reward"])
assert ec_res["Q-learning"]["reward"] > ec_res["shortest-queue-first"]["reward"]
assert ec_res["Q-learning"]["weighted_queue"] < 0.9 * ec_res["round-robin"]["weighted_queue"]
ec_fig, ec_ax = plt.subplots(figsize=(6, 3))
ec_ax.plot(np.convolve(ec_curve, np.ones(10) / 10, mode="valid"), label="Q-learning (10-episode mean)")
ec_ax.axhline(ec_res["round-robin"]["reward"], color="C1", ls="--", label="round-robin")
ec_ax.axhline(ec_res["shortest-queue-first"]["reward"], color="C2", ls=":", label="shortest-queue-first")
ec_ax.set(xlabel="episode", ylabel="mean reward per tick", title="MODEL GPU: learning the next tenant to launch")
ec_ax.legend(fontsize=8)
plt.show()


# %% [markdown]
# ## Recap: interview answers
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
# - A cluster simulator is a heap of events driving the *same* policy code as the real scheduler; calibrate its step
#   times, interference and startup on real runs and check JCT within a stated error (here 15%) on a run it was not
#   fitted on, before trusting it at scale.
# - On heavy-tailed traces FIFO's head-of-line blocking dominates mean JCT; backfilling and SRPT cut it (asserted with
#   paired differences over seeds) at the price of a worse tail for big jobs (SRPT) -- MODEL numbers.
# - [Q71] [Q263] Heterogeneous scheduling = per-device, per-op-kind performance model + op DAG analysis (topological
#   order, upward ranks) + HEFT-style earliest-finish-time placement including transfer costs + re-placement from
#   measured queue backlogs (dynamic load balancing).
# - [Q115] GEMMs to the GPU, attention/conv to the NPU, control/small ops to the CPU -- but only when the transfer is
#   cheaper than the speed-up: on one request HEFT keeps the chain on one device (the exact DP partition agrees);
#   with parallel requests it spreads.
# - [Q140] Composite cost J = sum_k w_k m_k / m_k(ref) over (T_c, T_m, T_comm, E, Risk), minimised by simulated
#   annealing (segment moves, Metropolis, geometric cooling); it trades HEFT's latency for energy when told to.
# - [Q234] Latency-bounded energy minimisation over paths is a multiple-choice knapsack: exact Pareto DP, greedy
#   ratio heuristic as the fast approximation, brute force to check small instances.
#
# - [Q126] A power cap is a PID loop on measured power acting on clocks (derivative on measurement, anti-windup by
#   clamping); across jobs, fit P = α f + β u + idle per job (bounded above by its residual), give watts greedily by
#   marginal throughput per watt (water-filling) -- memory-bound jobs get low clocks and few SMs, compute-bound jobs
#   the watts -- which beats uniform capping; a PID on the measured total trims the budget (cap fast, uncap slowly).
# - [Q186] Dual threshold = fast peak loop on the clock (with a cubic-law ceiling) + slow running-average loop on
#   duty/batch (with a RAPL-like allowance); the peak loop has priority and freezes the average loop's increases.
#   Duty is a costly knob for the average (linear), the clock a cheap one (P ∝ f³).
# - [Q254] Monitor (batch, samples/s, W) → fit t(b) = t0 + t1 b and P(b) = p0 + p1 busy(b) → largest predicted
#   throughput within budget minus a measured bias, with hysteresis; re-decide on a budget change.
# - [Q154] Memory-bound (AI below the ridge): plateau at the roofline knee, same time, less energy; compute-bound and
#   heating: ramp up at the slew limit, plateau, ramp down before the throttle point using the temperature trend.
# - [Q243] Minimise w_e energy + w_p lost work/slowdown + w_r Arrhenius failure-rate factor over the ladder with a
#   thermal-model look-ahead; Ea is an assumption; trade a few % of work for energy and MTBF.
# - Everything in this part is a MODEL: this VM has no power, frequency or thermal controls.
#
# - [Q246] Instruction-level energy model: features = per-class activity (FMA/vector/reduction), memory activity,
#   intensity, active units, vector width; target = measured power; RLS with forgetting learns online and backfills
#   each error into the coefficients, tracking drift that a batch fit averages away (MODEL target here: no sensor).
# - [Q131] Per-kernel DVFS: predict the kernel's power at f_max, choose the highest clock whose predicted power
#   (dynamic part ∝ f³) fits the cap.
# - [Q165] Periodic spikes are predictable: a sliding-window AR (or small LSTM) forecast of the next step's power
#   lowers the clock before the spike; reactive throttling misses it and throttles the wrong step.
# - [Q182] Linear temperature extrapolation + "move the hottest job from a device predicted to throttle to the
#   coolest device with room that stays below threshold", with a migration pause and a cooldown against
#   ping-pong, removes the throttling caused by uneven cooling (MODEL node).
#
# - [Q227] Split a shared cost by Shapley values: marginal cost averaged over join orders; exact needs 2^n
#   coalitions, permutation sampling is unbiased, exactly efficient, with a 1.96-se (CLT) or Hoeffding error bound.
# - [Q172] Sell power headroom as k slots in a (k+1)-th price auction: truthful bidding is dominant, slots go to the
#   highest values; proportional share, weighted max-min (one resource) and weighted DRF (watts + SMs) are the
#   weighted-fair alternatives (nobody shut out, but not truthful).
# - [Q171] Competing serving strategies form a game: find pure Nash equilibria by best-response enumeration, check
#   best-response dynamics converge, and measure the price of anarchy against the social optimum.
# - [Q229] Online Pareto front: reject dominated arrivals, prune what a new point dominates; track hypervolume.
# - [Q127] Weighted sums miss non-convex parts of the front; epsilon-constraints (budgets) and the front itself do not.
# - [Q194] Weighted Tchebycheff scores max_i w_i |f_i - z_i*| reach every Pareto trade-off; the first pop is
#   Pareto-optimal.
# - [Q282] Kernel choice by time^alpha x joules^(1-alpha): alpha = 1/2 is the energy-delay product; the choice moves
#   from the fastest to a lower clock as alpha falls.
# - [Q138] Tabular Q-learning over (queues, power, temperature) buckets learns to serve the heavy-weight tenant first
#   and beats round-robin and shortest-queue-first on the same arrivals (MODEL); the power penalty is unavoidable
#   here (the hot tenant's kernels must run), a tighter cap or deferrable work would let it shape power too.


# %% [markdown]
# ## Exercises
#
# Graded, in `exercises/18_cluster_scheduling/` (check with `tinylearn check 18`): preemptive SRPT on one machine
# (`srpt_completion_times`), Dominant Resource Fairness by progressive filling (`drf`) and a PID controller with
# anti-windup (`PIDController`), each tested against its definition and against tinylearn's implementation.
#
# Open-ended:
#
# - Add `LAS` (least attained service, Tiresias' policy for unknown job sizes) to `tinylearn.sched.policies` and
#   compare it with SRPT when the size estimates are wrong by 4x.
# - Make `WeightedFair` decay old service with a half-life (Slurm's `PriorityDecayHalfLife`) and show how fast the
#   shares react when a third tenant arrives.
#
# - Give `synthetic_trace` users' runtime estimates that are 2-5x too long (as in real clusters) and check how much
#   of SRPT's and backfilling's advantage over FIFO survives.
# - Add insertion-based HEFT (an op may fill an idle gap on a device) to `hetero.heft` and measure the makespan change
#   on 8 concurrent requests.
#
# - Add a rack-level (CapMaestro-style) hierarchy to `PowerCapAllocator`: two racks with their own caps under a
#   cluster cap, priorities per job; does greedy per rack plus a budget split by marginal throughput per watt match
#   the flat greedy?
# - Let the average loop of `DualThresholdController` lower the peak loop's setpoint (the clock) before it touches
#   duty: how much of the throughput lost in section 11 comes back with both limits still held?
# - Make `BatchSizeController` choose (batch, clock) jointly: fit the roofline knee from probes at two clocks and
#   compare its throughput at 150 W with batch-only control.
#
# - Give `heat_aware_migration` a cost model: migrate only when the predicted throttled work over the horizon
#   exceeds the pause (lost work) of the move, and compare on a node where throttling is marginal.
# - Replace the linear temperature extrapolation with the RC model fitted online (estimate R and C by least squares
#   from the power and temperature history) and measure how many unnecessary migrations disappear.
#
# - Make the Shapley game's value the simulator's energy (`energy_j`) or mean JCT instead of the held GPU-time,
#   and compare the tenants' shares; which tenant's share changes most, and why?
# - Add a "batch cap" rule to the shared-device game (no tenant above b8) and re-compute the price of anarchy.
