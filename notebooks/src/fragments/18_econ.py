# %%
import math

import matplotlib.pyplot as plt
import numpy as np

from tinylearn.bench import measure
from tinylearn.gemm import matmul
from tinylearn.sched import fairness, market, pareto, shapley, tenant_rl
from tinylearn.sched.device_model import A100, DeviceSpec
from tinylearn.sched.jobs import Job
from tinylearn.sched.policies import FIFO
from tinylearn.sched.sim import Simulator

# %% [markdown]
# ## 1. Who pays for the shared cluster? Shapley values, exact and sampled [Q227]
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
# ## 2. Bidding for power: a second-price auction under a power budget [Q172]
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
# ## 3. Serving strategies as a game: Nash equilibrium and the price of anarchy [Q171]
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
# ## 4. An online Pareto front of configurations [Q229]
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
# ## 5. Time, peak memory and energy: weighted sum vs epsilon-constraint vs the front [Q127]
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
# ## 6. A weighted-Tchebycheff priority queue over power, temperature and throughput [Q194]
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
# ## 7. Choosing a kernel by time and joules [Q282]
#
# **Answer.** Rank candidate implementations by a composite objective time^alpha x joules^(1-alpha): alpha = 1 is
# "fastest", alpha = 0 "fewest joules", alpha = 1/2 ranks like the energy-delay product. FLOPs/W and bytes/J are the
# same information per unit of work. The times below are MEASURED on this VM (tinylearn's C++ GEMM rungs, one
# thread); the joules are a MODEL: one core drawing 2 W static + 13 W x (f/f_max)^3 dynamic, with a DVFS ladder
# scaling a compute-bound kernel's time by f_max/f. At a fixed clock energy is proportional to time here, so the
# fastest rung always wins; the trade-off appears along the clock: slower clocks save dynamic energy until static
# power dominates, and the choice moves with alpha.

# %%
ec_a = np.random.default_rng(0).standard_normal((192, 192)).astype(np.float32)
ec_times = {}
for v in ("ikj", "packed", "simd"):
    ec_times[v] = measure(lambda v=v: matmul(ec_a, ec_a, backend="cpp", version=v), warmup=1, repeat=7).min
ec_core = DeviceSpec("vm-core-model", peak_tflops=1e-3, mem_bw_gbs=1.0, mem_gb=1.0, tdp_w=15.0, idle_w=2.0,
                     f_max_mhz=3000.0, f_min_mhz=1000.0, f_steps=9, source="MODEL: nominal one-core power")  # fmt: skip
ec_kc = {}
for v, t in ec_times.items():
    for f in ec_core.freqs():
        tt = t * ec_core.f_max_mhz / f
        ec_kc[f"{v}@{f:.0f}MHz"] = (tt, ec_core.power_w(f, 1.0) * tt)
ec_alphas = [0.0, 0.25, 0.5, 0.75, 1.0]
ec_pick = {a: pareto.choose_kernel(ec_kc, a) for a in ec_alphas}
print("measured (best of 7):", {k: f"{v * 1e3:.3f} ms" for k, v in ec_times.items()})
for a in ec_alphas:
    t, j = ec_kc[ec_pick[a]]
    print(f"alpha={a:4.2f}: {ec_pick[a]:>16}  time {t * 1e3:.3f} ms  MODEL energy {j * 1e3:.2f} mJ")
ec_fast = min(ec_times, key=ec_times.get)
assert ec_pick[1.0] == f"{ec_fast}@3000MHz"
assert ec_pick[0.0] != ec_pick[1.0] and ec_pick[0.0].startswith(ec_fast)
assert ec_kc[ec_pick[0.0]][1] < ec_kc[ec_pick[1.0]][1] and ec_kc[ec_pick[0.0]][0] > ec_kc[ec_pick[1.0]][0]

# %% [markdown]
# ## 8. Learning which tenant launches next: tabular Q-learning [Q138]
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
# ## Recap
#
# * [Q227] Split a shared cost by Shapley values: marginal cost averaged over join orders; exact needs 2^n
#   coalitions, permutation sampling is unbiased, exactly efficient, with a 1.96-se (CLT) or Hoeffding error bound.
# * [Q172] Sell power headroom as k slots in a (k+1)-th price auction: truthful bidding is dominant, slots go to the
#   highest values; proportional share, weighted max-min (one resource) and weighted DRF (watts + SMs) are the
#   weighted-fair alternatives (nobody shut out, but not truthful).
# * [Q171] Competing serving strategies form a game: find pure Nash equilibria by best-response enumeration, check
#   best-response dynamics converge, and measure the price of anarchy against the social optimum.
# * [Q229] Online Pareto front: reject dominated arrivals, prune what a new point dominates; track hypervolume.
# * [Q127] Weighted sums miss non-convex parts of the front; epsilon-constraints (budgets) and the front itself do not.
# * [Q194] Weighted Tchebycheff scores max_i w_i |f_i - z_i*| reach every Pareto trade-off; the first pop is
#   Pareto-optimal.
# * [Q282] Kernel choice by time^alpha x joules^(1-alpha): alpha = 1/2 is the energy-delay product; the choice moves
#   from the fastest to a lower clock as alpha falls.
# * [Q138] Tabular Q-learning over (queues, power, temperature) buckets learns to serve the heavy-weight tenant first
#   and beats round-robin and shortest-queue-first on the same arrivals (MODEL); the power penalty is unavoidable
#   here (the hot tenant's kernels must run), a tighter cap or deferrable work would let it shape power too.
#
# ## Exercises
#
# 1. Make the Shapley game's value the simulator's energy (`energy_j`) or mean JCT instead of the held GPU-time,
#    and compare the tenants' shares; which tenant's share changes most, and why?
# 2. Add a "batch cap" rule to the shared-device game (no tenant above b8) and re-compute the price of anarchy.
