"""Speculative decoding (Leviathan et al. 2023, Chen et al. 2023): a cheap draft proposes k tokens, the target
scores all of them in ONE forward pass, and a rejection rule keeps the output distributed exactly as the target's.

Per round, with ``last`` the newest accepted token (not yet fed to either model):
    draft:   x_1..x_k ~ q(. | ctx, last, x_<i)                       (k single-token draft forwards)
    target:  one forward over [last, x_1..x_k] -> p_1..p_{k+1}        (p_i scores x_i; p_{k+1} is the bonus)
    accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), left to right; at the first rejection draw
    the replacement from norm(max(0, p_i - q_i)) and stop; if all k are accepted draw a bonus token from p_{k+1}.
Each round emits 1..k+1 tokens for one target call. Why exact: P(emit x) = q(x) min(1, p(x)/q(x)) +
P(reject) * max(0, p(x) - q(x)) / sum(max(0, p - q)) = min(q, p)(x) + max(0, p - q)(x) = p(x).
Greedy (temperature 0): accept x_i iff it is the target's argmax, so the tokens equal ``generate(target)``.
Rejected positions are rolled back with ``truncate`` (a dense KV cache just moves its write position back).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .checks import check_vocab, int_arg, prob_vector, real_arg, seed_arg, token_list
from .sampling import filter_probs, sample_from
from .session import max_len, open_session


def accept_draft(p_x: float, q_x: float, u: float) -> bool:
    """The acceptance rule: keep draft token x when u < min(1, p(x) / q(x)) (u ~ U[0, 1))."""
    for name, v in (("p_x", p_x), ("q_x", q_x)):
        if not 0.0 <= real_arg(v, name) <= 1.0:  # also rejects NaN
            raise ValueError(f"{name}: must be a probability in [0, 1], got {v!r}")
    if not 0.0 <= real_arg(u, "u") < 1.0:
        raise ValueError(f"u: must be a uniform draw in [0, 1), got {u!r}")
    if q_x <= 0:
        return False  # the draft cannot have proposed it; treat as rejected
    return u < min(1.0, p_x / q_x)


def residual_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)); falls back to p when p <= q everywhere (then a rejection has probability 0)."""
    p, q = prob_vector(p, "p"), prob_vector(q, "q")
    if p.shape != q.shape:
        raise ValueError(f"p, q: expected distributions over the same vocabulary, got shapes {p.shape}, {q.shape}")
    r = np.maximum(0.0, p - q)
    s = r.sum()
    return r / s if s > 0 else p / p.sum()


def speculative_generate(
    target: Any,
    draft: Any,
    prompt_ids: Any,
    max_new_tokens: int,
    k: int = 4,
    temperature: float = 0.0,
    seed: int = 0,
) -> tuple[list[int], dict[str, Any]]:
    """(tokens, stats): ``max_new_tokens`` tokens after the prompt, distributed as the target's samples.

    ``target``/``draft``: TinyGPT or any model with ``session(kv_cache)`` (see tinylearn.inference.session); same
    vocabulary. Sampling uses softmax(logits / temperature) for both p and q (top-k/top-p would have to filter
    both the same way; not offered here). stats: rounds, target_calls, draft_calls, proposed, accepted,
    acceptance_rate (accepted / proposed), rejected (rounds that ended in a rejection), alpha (accepted /
    (accepted + rejected): the per-token acceptance probability of the i.i.d. model -- drafts after a rejection are
    never judged, so accepted / proposed underestimates it), round_log ([(drafts proposed, tokens emitted)] per
    round), tokens_per_target_call (generate(target) needs 1 target
    call per token)."""
    if int_arg(k, "k") < 1:
        raise ValueError(f"k: number of draft tokens must be an int >= 1, got {k!r}")
    temp = real_arg(temperature, "temperature")
    if not np.isfinite(temp) or temp < 0:
        raise ValueError(f"temperature: must be a finite number >= 0, got {temperature!r}")
    max_new_tokens = int_arg(max_new_tokens, "max_new_tokens", minimum=0)
    seed = seed_arg(seed)
    prompt = token_list(prompt_ids, "prompt_ids")
    for name, m in (("target", target), ("draft", draft)):
        n = max_len(m)
        if n is not None and len(prompt) + max_new_tokens - 1 > n:
            raise ValueError(f"max_new_tokens: prompt {len(prompt)} + {max_new_tokens} exceed {name} max_seq_len={n}")
    rng = np.random.default_rng(seed)
    greedy = temperature == 0

    def dist(logits: np.ndarray) -> np.ndarray:
        return filter_probs(logits, temperature) if not greedy else logits

    st = open_session(target, True)
    sd = open_session(draft, True)
    vt, vd = getattr(st, "vocab_size", None), getattr(sd, "vocab_size", None)
    if vt is not None and vd is not None and vt != vd:
        raise ValueError(f"draft: vocab_size {vd} differs from the target's {vt}")
    check_vocab(prompt, st, "prompt_ids")
    if len(prompt) > 1:
        st.extend(prompt[:-1])
        sd.extend(prompt[:-1])
    last = prompt[-1]
    out: list[int] = []
    stats: dict[str, Any] = dict(rounds=0, target_calls=0, draft_calls=0, proposed=0, accepted=0, rejected=0, k=int(k))
    stats["round_log"] = []  # (drafts proposed, tokens emitted) per round; the last round may propose fewer than k
    while len(out) < max_new_tokens:
        kk = min(int(k), max_new_tokens - len(out) - 1)
        base_t, base_d = st.length, sd.length
        drafts: list[int] = []
        qs: list[np.ndarray] = []
        if kk > 0:
            ql = sd.extend([last])[-1]
            stats["draft_calls"] += 1
            for i in range(kk):
                q = dist(ql)
                x = int(np.argmax(q)) if greedy else sample_from(q, rng)
                drafts.append(x)
                qs.append(q)
                if i < kk - 1:
                    ql = sd.extend([x])[-1]
                    stats["draft_calls"] += 1
        pl = st.extend([last, *drafts])  # [kk + 1, V]
        stats["target_calls"] += 1
        n_acc = 0
        new = None
        for i, x in enumerate(drafts):
            p = dist(pl[i])
            if greedy:
                ok = int(np.argmax(p)) == x
            else:
                ok = accept_draft(float(p[x]), float(qs[i][x]), float(rng.random()))
            if not ok:
                new = int(np.argmax(p)) if greedy else sample_from(residual_distribution(p, qs[i]), rng)
                break
            n_acc += 1
        if new is None:  # all accepted (or kk == 0): bonus token from the target's last distribution
            pk = dist(pl[kk])
            new = int(np.argmax(pk)) if greedy else sample_from(pk, rng)
        out += drafts[:n_acc] + [new]
        stats["rounds"] += 1
        stats["proposed"] += kk
        stats["accepted"] += n_acc
        stats["rejected"] += int(n_acc < kk)
        stats["round_log"].append((kk, n_acc + 1))
        st.truncate(base_t + 1 + n_acc)
        keep_d = base_d + 1 + n_acc
        if kk > 0 and sd.length > keep_d:
            sd.truncate(keep_d)
        elif kk > 0 and sd.length < keep_d:  # all k accepted: the draft has not seen x_k yet
            sd.extend(drafts[sd.length - keep_d :])
            stats["draft_calls"] += 1
        last = new  # (kk == 0 only in the final round: the draft never needs to catch up)
    stats["acceptance_rate"] = stats["accepted"] / stats["proposed"] if stats["proposed"] else float("nan")
    judged = stats["accepted"] + stats["rejected"]
    stats["alpha"] = stats["accepted"] / judged if judged else float("nan")
    stats["tokens_per_target_call"] = len(out) / stats["target_calls"] if stats["target_calls"] else float("nan")
    return out, stats
