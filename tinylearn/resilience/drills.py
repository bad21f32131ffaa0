"""Kill-and-resume drills on real processes: a rank SIGKILLs itself mid-step, torchrun restarts the group, training
resumes from the newest committed checkpoint and ends bitwise where a run that never failed ends.

Entry point (every rank runs it)::

    torchrun --standalone --nnodes=1:2 --nproc-per-node=2 --max-restarts=3 --rdzv-conf=last_call_timeout=1 \\
        -m tinylearn.resilience.drills --ckpt DIR --out FILE --steps 6 --kill-rank 1 --kill-step 3 \\
        --mode ddp,zero1,zero2,zero3 --interval 2

Every mode listed trains its own copy of a tiny MLP in lock-step (same global batch per step, from
``elastic.global_batch``) inside one ``tl.resilience.run`` with one combined checkpoint, so one kill covers them all:
``ddp`` = replicated Adam + ring all-reduce of gradients, ``zeroK`` = ``ZeroOptimizer`` stage K. On the first
attempt (no marker file ``FILE.killed.rankR``) rank R writes the marker with the wall time and SIGKILLs itself at
step K after the first mode's backward -- mid-step, after the last checkpoint. The peer's next collective fails,
torchrun's agent stops the group and starts a new one (``TORCHELASTIC_RESTART_COUNT`` = 1), ``run`` loads the
checkpoint, resharded to the new world size, and replays the lost steps. ``--kill-rank -1`` kills every rank (a
whole-job failure: rerun with a different ``--nproc-per-node`` to shrink or grow). Rank 0 writes the final
parameters (``FILE``, npz) and ``FILE.json``: the RunReport, the restart count and the recovery time
(first step done after the restart - the killed rank's timestamp).

**A lost node under torchrun's own agent** (``torchrun_two_agents``): two agents, one worker each, in one elastic
job (``--nnodes=1:2 --rdzv-backend=c10d``, agent A hosting the rendezvous store); with ``--lose-node-step K`` agent
B's worker SIGKILLs its agent and itself at step K. A's worker fails its next collective, A's agent restarts it
and re-rendezvouses without B (min one node), and the run resumes at world size 1 from the last checkpoint.

``live_vs_restart`` [Q134]: shrink a running ZeRO-1 job 2 -> 1 rank with ``parallel.reshard.reshard_zero`` (no
restart: state moves over point-to-point messages) vs save + restart + load from a checkpoint, timed on processes of
``tl.dist.launch``; both continue bitwise alike.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..dist.launch import launch
from ..parallel.workers import ddp_average, tiny_mlp
from ..parallel.zero import ZeroOptimizer
from .atomic import atomic_write
from .elastic import ensure_group, global_batch, local_rows, run
from .manifest import step_dir
from .zero_state import DDPState, MultiState, ZeroState, load_zero_state, zero_shards

MODES = ("ddp", "zero1", "zero2", "zero3")
NODE_LOST_ENV = "TINYLEARN_DRILL_NODE_LOST"
DIMS = (8, 16, 16, 4)
ROWS = 8
LR = 1e-2


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tinylearn.resilience.drills", description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", required=True, help="checkpoint root directory")
    ap.add_argument("--out", required=True, help="final parameters (npz); FILE.json gets the report")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--kill-rank", type=int, default=None, help="rank that SIGKILLs itself (-1: every rank)")
    ap.add_argument("--kill-step", type=int, default=None)
    ap.add_argument(
        "--lose-node-step",
        type=int,
        default=None,
        help=f"at this step a worker whose environment has {NODE_LOST_ENV}=1 SIGKILLs its torchrun agent, then itself",
    )
    ap.add_argument("--mode", default="ddp", help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--interval", default="2", help="checkpoint every I steps, or 'auto' (Young/Daly)")
    ap.add_argument("--mtbf-s", type=float, default=None)
    ap.add_argument("--timeout-s", type=float, default=30.0, help="process-group timeout")
    args = ap.parse_args(argv)
    modes = args.mode.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"--mode: expected a comma-separated subset of {MODES}, got {args.mode!r}")
    args.modes = modes
    if args.steps < 1:
        raise ValueError(f"--steps: expected an int >= 1, got {args.steps}")
    if (args.kill_rank is None) != (args.kill_step is None):
        raise ValueError("--kill-rank and --kill-step: give both or neither")
    args.interval = "auto" if args.interval == "auto" else int(args.interval)
    return args


class _Trainer:
    """The models of every mode and one training step over all of them (the kill happens inside)."""

    def __init__(self, modes: list[str], world: int, rank: int, kill: tuple[int, int] | None, out: str) -> None:
        self.modes, self.world, self.rank, self.kill, self.out = modes, world, rank, kill, out
        self.lose_node: int | None = None
        self.models: dict[str, nn.Module] = {}
        self.opts: dict[str, Any] = {}
        states = []
        for m in modes:
            model = tiny_mlp(0, DIMS)
            self.models[m] = model
            if m == "ddp":
                self.opts[m] = torch.optim.Adam(model.parameters(), lr=LR)
                states.append(DDPState(model, self.opts[m], prefix="ddp."))
            else:
                self.opts[m] = ZeroOptimizer(model, torch.optim.Adam, stage=int(m[-1]), lr=LR)
                states.append(ZeroState(self.opts[m], prefix=f"{m}."))
        self.state = MultiState(*states)

    def marker(self, rank: int) -> Path:
        return Path(f"{self.out}.killed.rank{rank}")

    def _maybe_lose_node(self, step: int) -> None:
        if self.lose_node != step or os.environ.get(NODE_LOST_ENV) != "1":
            return
        m = Path(f"{self.out}.killed.node")
        if m.exists():
            return
        atomic_write(m, json.dumps({"t_kill": time.time(), "step": step, "rank": self.rank}).encode())
        print(
            f"[drill] rank {self.rank}: node lost at step {step} (agent {os.getppid()} and worker SIGKILLed)",
            flush=True,
        )
        os.kill(os.getppid(), signal.SIGKILL)  # the torchrun agent of this node: it cannot restart anything
        os.kill(os.getpid(), signal.SIGKILL)

    def _maybe_die(self, step: int) -> None:
        self._maybe_lose_node(step)
        if self.kill is None or step != self.kill[1] or self.kill[0] not in (-1, self.rank):
            return
        m = self.marker(self.rank)
        if m.exists():
            return  # the restarted attempt: run on
        atomic_write(m, json.dumps({"t_kill": time.time(), "step": step, "rank": self.rank}).encode())
        print(f"[drill] rank {self.rank}: SIGKILL at step {step} (mid-step)", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def __call__(self, step: int, _state: Any) -> float:
        x, y = global_batch(step, ROWS, DIMS[0], DIMS[-1])
        rows = local_rows(ROWS, self.world, self.rank)
        total = 0.0
        for j, m in enumerate(self.modes):
            model, opt = self.models[m], self.opts[m]
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x[rows]), y[rows])
            loss.backward()
            if j == 0:
                self._maybe_die(step)
            if m == "ddp" and self.world > 1:
                ddp_average(list(model.parameters()))
            opt.step()
            total += float(loss.detach())
        return total

    def final_params(self) -> dict[str, np.ndarray]:
        out = {}
        for m in self.modes:
            opt = self.opts[m]
            ctx = opt.gather_parameters() if m == "zero3" else _Null()
            with ctx:
                for i, p in enumerate(self.models[m].parameters()):
                    out[f"{m}.{i}"] = p.detach().clone().numpy()
        return out


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def _proc_start_wall() -> float | None:
    """Wall time this process was created (Linux /proc; None elsewhere): splits a recovery into process start +
    imports vs group init + load + first step."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """One rank of the drill (torchrun or ``tl.dist.launch``); returns rank 0's summary (others: their report)."""
    main_wall = time.time()
    args = _parse(argv)
    torch.set_num_threads(1)  # the same arithmetic under torchrun, launch and one process
    world, rank = ensure_group(args.timeout_s)
    group_wall = time.time()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    kill = None if args.kill_rank is None else (args.kill_rank, args.kill_step)
    tr = _Trainer(args.modes, world, rank, kill, args.out)
    tr.lose_node = args.lose_node_step
    built_wall = time.time()
    print(f"[drill] rank {rank}/{world} attempt {restart}: modes {args.modes}", flush=True)
    rep = run(tr, tr.state, ckpt_dir=args.ckpt, steps=args.steps, interval=args.interval, mtbf_s=args.mtbf_s)
    print(
        f"[drill] rank {rank}: resumed_from={rep.resumed_from} steps_run={rep.steps_run} "
        f"checkpoints={rep.checkpoints} recovery_s={rep.recovery_s}",
        flush=True,
    )
    params = tr.final_params()
    summary = {k: v for k, v in vars(rep).items()}
    summary["restart_count"] = restart
    summary["proc_start_wall"], summary["main_wall"] = _proc_start_wall(), main_wall
    summary["group_wall"], summary["built_wall"] = group_wall, built_wall
    kills = [json.loads(p.read_text()) for p in sorted(Path(args.out).parent.glob(Path(args.out).name + ".killed.*"))]
    if kills and rep.resumed_from is not None and rep.first_step_wall is not None:
        summary["t_kill"] = min(k["t_kill"] for k in kills)
        summary["kill_to_first_step_s"] = rep.first_step_wall - summary["t_kill"]
    if rank == 0:
        buf = io.BytesIO()
        np.savez(buf, **params)
        atomic_write(args.out, buf.getvalue())
        atomic_write(args.out + ".json", json.dumps(summary, indent=1).encode())
    return summary


def drill_job(argv: list[str]) -> dict[str, Any]:
    """``main`` as a rank function for ``tl.dist.launch`` (the uninterrupted reference runs)."""
    return main(argv)


def drill_argv(
    ckpt: str | Path,
    out: str | Path,
    steps: int,
    modes: str = "ddp",
    interval: int | str = 2,
    kill: tuple[int, int] | None = None,
) -> list[str]:
    """The command-line arguments of one drill."""
    argv = ["--ckpt", str(ckpt), "--out", str(out), "--steps", str(steps), "--mode", modes, "--interval", str(interval)]
    if kill is not None:
        argv += ["--kill-rank", str(kill[0]), "--kill-step", str(kill[1])]
    return argv


def torchrun(
    argv: list[str], nproc: int = 2, max_restarts: int = 3, timeout_s: float = 60.0
) -> subprocess.CompletedProcess:
    """Run the drill under ``torchrun --standalone --nnodes=1:2`` (``last_call_timeout=1``: an elastic rendezvous
    otherwise waits 30 s for a second node that never comes). Output: stdout + stderr combined, as text."""
    exe = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(exe) if exe.exists() else "torchrun",
        "--standalone",
        "--nnodes=1:2",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "--rdzv-conf=last_call_timeout=1",
        "--monitor-interval=0.1",
        "-m",
        "tinylearn.resilience.drills",
        *argv,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, env=env, stdin=subprocess.DEVNULL, errors="replace"
    )


def free_port() -> int:
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return int(sk.getsockname()[1])


def torchrun_two_agents(argv: list[str], port: int, max_restarts: int = 3, timeout_s: float = 120.0) -> dict[str, Any]:
    """Two torchrun agents (two "nodes" on this machine) in one elastic job: ``--nnodes=1:2 --nproc-per-node=1
    --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT``; agent A hosts the rendezvous store, agent B's worker gets
    ``TINYLEARN_DRILL_NODE_LOST=1`` (with ``--lose-node-step K`` in ``argv`` it kills agent B and itself at step K).
    A's agent must then re-rendezvous alone (min 1 node; keep-alive 1 s x 2 so the dead node is dropped fast) and
    its worker resume at world size 1. Both agents are bounded by ``timeout_s``; returns {rc_a, rc_b, out_a,
    out_b, elapsed_s}."""
    exe = Path(sys.executable).with_name("torchrun")
    conf = "last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=2,join_timeout=60"

    def cmd(host: bool) -> list[str]:
        return [
            str(exe) if exe.exists() else "torchrun",
            "--nnodes=1:2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{int(port)}",
            f"--rdzv-conf=is_host={int(host)},{conf}",
            "--rdzv-id=tinylearn-drill",
            f"--max-restarts={max_restarts}",
            "--monitor-interval=0.1",
            "-m",
            "tinylearn.resilience.drills",
            *argv,
        ]

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop(NODE_LOST_ENV, None)
    t0 = time.monotonic()
    kw: dict[str, Any] = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    a = subprocess.Popen(cmd(True), env=env, errors="replace", start_new_session=True, **kw)
    time.sleep(0.2)  # A binds the store first; B, a client, retries its connection until it is up
    b = subprocess.Popen(cmd(False), env={**env, NODE_LOST_ENV: "1"}, errors="replace", start_new_session=True, **kw)
    outs: dict[str, Any] = {}
    for name, p in (("a", a), ("b", b)):
        try:
            out, _ = p.communicate(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the agent's session: its workers too
            out, _ = p.communicate()
            out += f"\n[drill] agent {name} killed after the {timeout_s} s bound"
        outs[f"rc_{name}"], outs[f"out_{name}"] = p.returncode, out
    for p in (a, b):  # a worker an agent left behind (B's agent died by SIGKILL): end its session
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    outs["elapsed_s"] = time.monotonic() - t0
    return outs


def load_params(out: str | Path) -> dict[str, np.ndarray]:
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def bitwise_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


# ------------------------------------------------------------------------------------------------- Q134
def _zero_model_opt(group: Any = None) -> tuple[nn.Module, ZeroOptimizer]:
    model = tiny_mlp(0, DIMS)
    return model, ZeroOptimizer(model, torch.optim.Adam, stage=1, group=group, lr=LR)


def _zero_train(model: nn.Module, opt: ZeroOptimizer, steps: range, world: int, rank: int) -> None:
    for step in steps:
        x, y = global_batch(step, ROWS, DIMS[0], DIMS[-1])
        rows = local_rows(ROWS, world, rank)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()


def _state_bytes(opt: ZeroOptimizer, model: nn.Module) -> bytes:
    sd = opt.state_dict()
    parts = [p.detach().numpy().tobytes() for p in model.parameters()]
    for i in sorted(sd["state"]):
        for k in sorted(sd["state"][i]):
            v = sd["state"][i][k]
            parts.append(v.numpy().tobytes() if isinstance(v, torch.Tensor) else repr(v).encode())
    return b"".join(parts)


def q134_live_job(ckpt: str, steps: int) -> dict[str, Any]:
    """2 ranks: train ``steps`` steps, checkpoint (timed), then shrink to rank 0 live with ``reshard_zero``
    (timed) and take one more step on 1 rank."""
    from ..parallel.reshard import reshard_zero
    from .sharded import save_sharded

    torch.set_num_threads(1)
    rank = dist.get_rank()
    model, opt = _zero_model_opt()
    _zero_train(model, opt, range(steps), 2, rank)
    dist.barrier()
    t0 = time.perf_counter()
    save_sharded(zero_shards(opt), step_dir(ckpt, steps - 1), step=steps - 1)
    save_s = time.perf_counter() - t0
    g1 = dist.new_group([0])
    dist.barrier()
    t0 = time.perf_counter()
    new, stats = reshard_zero(
        opt, lambda g: ZeroOptimizer(model, torch.optim.Adam, stage=1, group=g, lr=LR), [0, 1], [0], g1
    )
    live_s = time.perf_counter() - t0
    out: dict[str, Any] = {"save_s": save_s, "live_s": live_s, "moved_bytes": stats["sent_bytes"]}
    if new is not None:
        _zero_train(model, new, range(steps, steps + 1), 1, 0)
        out["state"] = _state_bytes(new, model)
    return out


def q134_restart_job(ckpt: str, steps: int) -> dict[str, Any]:
    """1 rank (a restarted job): load the checkpoint resharded 2 -> 1 (timed) and take one more step."""
    torch.set_num_threads(1)
    model, opt = _zero_model_opt()
    t0 = time.perf_counter()
    load_zero_state(opt, step_dir(ckpt, steps - 1))
    load_s = time.perf_counter() - t0
    _zero_train(model, opt, range(steps, steps + 1), 1, 0)
    return {"load_s": load_s, "state": _state_bytes(opt, model)}


def live_vs_restart(ckpt_dir: str | Path, steps: int = 3, timeout_s: float = 60.0) -> dict[str, Any]:
    """[Q134] Shrink a ZeRO-1 job 2 -> 1 live (``reshard_zero``) vs checkpoint + restart + load, on processes of
    ``tl.dist.launch``. Returns seconds: ``live_s`` (the reshard call), ``save_s``, ``load_s``, ``restart_s`` (wall
    of starting the 1-rank job that loads and steps, process start included) and ``restart_total_s`` = save +
    restart; ``bitwise_equal``: both paths end in the same parameters and optimizer state."""
    ckpt = str(ckpt_dir)
    live = launch(q134_live_job, 2, ckpt, steps, timeout_s=timeout_s)
    t0 = time.perf_counter()
    rest = launch(q134_restart_job, 1, ckpt, steps, timeout_s=timeout_s)[0]
    restart_s = time.perf_counter() - t0
    return {
        "live_s": max(r["live_s"] for r in live),
        "save_s": max(r["save_s"] for r in live),
        "load_s": rest["load_s"],
        "restart_s": restart_s,
        "restart_total_s": max(r["save_s"] for r in live) + restart_s,
        "moved_bytes": sum(r["moved_bytes"] for r in live),
        "bitwise_equal": live[0]["state"] == rest["state"],
    }


# ------------------------------------------------------------------------------------------------- bench
def bench_recovery(
    workdir: str | Path,
    steps: int = 5,
    kill_step: int = 3,
    modes: str = "ddp",
    repeats: int = 1,
    timeout_s: float = 60.0,
) -> list[Any]:
    """``tinylearn bench resilience``: ``repeats`` torchrun kill-and-resume drills (2 ranks, rank 1 killed at
    ``kill_step``); Rows of milliseconds (median, min over repeats): recovery (kill -> first step after the
    restart) and its parts (detection + agent restart, imports, group init, building the models and optimizers,
    load + first step), and the measured checkpoint cost C."""
    from ..bench.table import Row

    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats: expected an int >= 1, got {repeats!r}")
    samples: dict[str, list[float]] = {}
    for k in range(repeats):
        wd = Path(workdir) / f"rep{k}"
        argv = drill_argv(wd / "ckpt", wd / "out.npz", steps, modes, 2, (1, kill_step))
        res = torchrun(argv, timeout_s=timeout_s)
        if res.returncode != 0:
            raise RuntimeError(f"bench_recovery: torchrun exited with {res.returncode}:\n{res.stdout[-3000:]}")
        rep = json.loads(Path(f"{wd / 'out.npz'}.json").read_text())
        parts = {"recovery: kill -> first step after restart": rep["kill_to_first_step_s"]}
        if rep.get("proc_start_wall") is not None:
            parts["of which: detect + agent restart"] = rep["proc_start_wall"] - rep["t_kill"]
            parts["of which: interpreter + imports"] = rep["main_wall"] - rep["proc_start_wall"]
        parts["of which: group init"] = rep["group_wall"] - rep["main_wall"]
        parts["of which: build models + optimizers"] = rep["built_wall"] - rep["group_wall"]
        parts["of which: load + first step (inside run)"] = rep["recovery_s"]
        parts["checkpoint cost C"] = rep["checkpoint_s"]
        for name, v in parts.items():
            samples.setdefault(name, []).append(1e3 * v)
    case = f"kill rank 1 at step {kill_step}, 2 ranks, {modes}"
    return [Row(case, name, float(np.median(v)), min_ms=min(v)) for name, v in samples.items()]


if __name__ == "__main__":
    main(sys.argv[1:])
