"""An independent, deliberately naive numpy implementation of the algorithms, for the tests to compare against.

Plain Python loops over samples, groups and tokens, written from the papers' formulas (not from the torch code):
GAE is computed by first deleting masked tokens from each row and running the textbook recursion on what is left.
Everything is float64.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np


def _groups(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    return members


def grpo(scores: Sequence[float], group_ids: Sequence[Hashable], norm_by_std: bool = True, eps: float = 1e-6):
    out = np.zeros(len(scores))
    for idx in _groups(group_ids).values():
        if len(idx) == 1:
            continue
        vals = [scores[i] for i in idx]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for i in idx:
            out[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return out


def rloo(scores: Sequence[float], group_ids: Sequence[Hashable]):
    out = np.zeros(len(scores))
    for idx in _groups(group_ids).values():
        if len(idx) == 1:
            continue
        for i in idx:
            others = [scores[j] for j in idx if j != i]
            out[i] = scores[i] - sum(others) / len(others)
    return out


def _textbook_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    n = len(rewards)
    adv = [0.0] * n
    last = 0.0
    for t in range(n - 1, -1, -1):
        next_v = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_v - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv


def gae(rewards, values, mask, gamma: float, lam: float):
    """GAE per row on the sub-sequence of valid tokens, scattered back; 0 on masked tokens."""
    rewards, values, mask = np.asarray(rewards, float), np.asarray(values, float), np.asarray(mask)
    adv = np.zeros_like(values)
    ret = np.zeros_like(values)
    for b in range(values.shape[0]):
        keep = [t for t in range(values.shape[1]) if mask[b, t]]
        a = _textbook_gae([rewards[b, t] for t in keep], [values[b, t] for t in keep], gamma, lam)
        for k, t in enumerate(keep):
            adv[b, t] = a[k]
            ret[b, t] = a[k] + values[b, t]
    return adv, ret


def discounted_returns(rewards, mask, gamma: float):
    rewards, mask = np.asarray(rewards, float), np.asarray(mask)
    out = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        keep = [t for t in range(rewards.shape[1]) if mask[b, t]]
        for k, t in enumerate(keep):
            out[b, t] = sum(gamma ** (j - k) * rewards[b, keep[j]] for j in range(k, len(keep)))
    return out


def whiten(values, mask, eps: float = 1e-8):
    values, mask = np.asarray(values, float), np.asarray(mask)
    picked = values[mask.astype(bool)]
    mean = picked.mean()
    var = picked.var(ddof=1)
    out = (values - mean) / math.sqrt(var + eps)
    return np.where(mask.astype(bool), out, 0.0)


def reinforce_pp(rewards, mask, gamma: float):
    g = discounted_returns(rewards, mask, gamma)
    return whiten(g, mask), g


def reinforce_pp_baseline(scores, group_ids, mask):
    mask = np.asarray(mask)
    centred = np.zeros(len(scores))
    for idx in _groups(group_ids).values():
        mean = sum(scores[i] for i in idx) / len(idx)
        for i in idx:
            centred[i] = scores[i] - mean
    tiled = np.repeat(centred[:, None], mask.shape[1], axis=1)
    return whiten(tiled, mask)


def aggregate(loss, mask, mode: str, norm_length: float | None = None) -> float:
    loss, mask = np.asarray(loss, float), np.asarray(mask)
    rows = [b for b in range(loss.shape[0]) if mask[b].sum() > 0]
    if mode in ("token-mean", "bnpo"):  # one micro-batch: TRL's bnpo is its token mean
        total = sum(loss[b, t] for b in range(loss.shape[0]) for t in range(loss.shape[1]) if mask[b, t])
        return total / max(1, int(mask.sum()))
    per_seq = []
    for b in rows:
        toks = [loss[b, t] for t in range(loss.shape[1]) if mask[b, t]]
        if mode == "seq-mean-token-sum":
            per_seq.append(sum(toks))
        elif mode == "seq-mean-token-mean":
            per_seq.append(sum(toks) / len(toks))
        elif mode == "seq-mean-token-sum-norm":
            per_seq.append(sum(toks) / (norm_length if norm_length is not None else loss.shape[1]))
        else:
            raise ValueError(mode)
    return sum(per_seq) / max(1, len(per_seq))


def ppo_token_loss(logp: float, old: float, adv: float, *, clip_low: float, clip_high: float, dual_clip=None) -> float:
    ratio = math.exp(logp - old)
    surrogate = min(ratio * adv, min(max(ratio, 1 - clip_low), 1 + clip_high) * adv)
    loss = -surrogate
    if dual_clip is not None and adv < 0:
        loss = min(loss, -dual_clip * adv)
    return loss


def ppo_loss(logp, old, adv, mask, *, clip_low, clip_high, dual_clip=None, mode="token-mean", weights=None):
    logp, old, adv = (np.asarray(x, float) for x in (logp, old, adv))
    per_token = np.zeros_like(logp)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            w = 1.0 if weights is None else float(weights[b][t])
            per_token[b, t] = w * ppo_token_loss(
                logp[b, t], old[b, t], adv[b, t], clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
            )
    return aggregate(per_token, mask, mode)


def gspo_loss(logp, old, adv, mask, *, clip_low, clip_high) -> float:
    """Sequence-level GSPO objective (eq. 5–7 of the paper), negated, with seq-mean-token-mean weighting."""
    logp, old, adv, mask = (np.asarray(x, float) for x in (logp, old, adv, mask))
    losses = []
    for b in range(logp.shape[0]):
        keep = [t for t in range(logp.shape[1]) if mask[b, t]]
        if not keep:
            continue
        s = math.exp(sum(logp[b, t] - old[b, t] for t in keep) / len(keep))
        tok = [-min(s * adv[b, t], min(max(s, 1 - clip_low), 1 + clip_high) * adv[b, t]) for t in keep]
        losses.append(sum(tok) / len(tok))
    return sum(losses) / len(losses)


def gpg_loss(logp, adv, mask, *, mode="token-mean", weights=None) -> float:
    """GPG (Chu et al. 2025): the REINFORCE loss −A·log π on every token, weighted, then aggregated."""
    logp, adv = np.asarray(logp, float), np.asarray(adv, float)
    per_token = np.zeros_like(logp)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            w = 1.0 if weights is None else float(weights[b][t])
            per_token[b, t] = -w * adv[b, t] * logp[b, t]
    return aggregate(per_token, mask, mode)


def sapo_token_loss(logp: float, old: float, adv: float, *, tau_pos: float, tau_neg: float) -> float:
    """SAPO (arXiv 2511.20347): −A·(4/τ)·sigmoid(τ(r − 1)), r = exp(logp − old), τ = tau_pos iff A > 0."""
    tau = tau_pos if adv > 0 else tau_neg
    r = math.exp(logp - old)
    return -adv * (4.0 / tau) / (1.0 + math.exp(-tau * (r - 1.0)))


def sapo_loss(logp, old, adv, mask, *, tau_pos, tau_neg, mode="seq-mean-token-mean", weights=None) -> float:
    logp, old, adv = (np.asarray(x, float) for x in (logp, old, adv))
    per_token = np.zeros_like(logp)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            w = 1.0 if weights is None else float(weights[b][t])
            per_token[b, t] = w * sapo_token_loss(logp[b, t], old[b, t], adv[b, t], tau_pos=tau_pos, tau_neg=tau_neg)
    return aggregate(per_token, mask, mode)


def value_loss(values, old_values, returns, mask, *, clip, mode="token-mean") -> float:
    values, old_values, returns = (np.asarray(x, float) for x in (values, old_values, returns))
    per = np.zeros_like(values)
    for b in range(values.shape[0]):
        for t in range(values.shape[1]):
            err = (values[b, t] - returns[b, t]) ** 2
            if clip is not None:
                vc = old_values[b, t] + min(max(values[b, t] - old_values[b, t], -clip), clip)
                err = max(err, (vc - returns[b, t]) ** 2)
            per[b, t] = err
    return 0.5 * aggregate(per, mask, mode)


def kl(logp: float, ref: float, kind: str) -> float:
    d = logp - ref
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return math.exp(-d) + d - 1
    if kind == "abs":
        return abs(d)
    raise ValueError(kind)


def log_softmax_row(logits: Sequence[float]) -> list[float]:
    m = max(logits)
    z = math.log(sum(math.exp(x - m) for x in logits)) + m
    return [x - z for x in logits]


def entropy_row(logits: Sequence[float]) -> float:
    lp = log_softmax_row(logits)
    return -sum(math.exp(p) * p for p in lp)


def adaptive_kl(value: float, target: float, horizon: int, kls: Sequence[float], n_steps: int) -> float:
    for current in kls:
        err = current / target - 1
        err = -0.2 if err < -0.2 else (0.2 if err > 0.2 else err)
        value = value * (1 + err * n_steps / horizon)
    return value


def opo(scores: Sequence[float], group_ids: Sequence[Hashable], lengths: Sequence[float]):
    out = np.zeros(len(scores))
    for idx in _groups(group_ids).values():
        if len(idx) == 1:
            continue
        total = sum(lengths[i] for i in idx)
        if total > 0:
            baseline = sum(lengths[i] * scores[i] for i in idx) / total
        else:
            baseline = sum(scores[i] for i in idx) / len(idx)
        for i in idx:
            out[i] = scores[i] - baseline
    return out


def gmpo_loss(logp, old, adv, mask, *, clip_low: float, clip_high: float) -> float:
    """GMPO (Zhao et al. 2025, eq. 3), negated: per sequence −Ā·(Π_t ρ̃_t)^(1/|y|), ρ̃ clipped in log space."""
    logp, old, adv, mask = (np.asarray(x, float) for x in (logp, old, adv, mask))
    losses = []
    for b in range(logp.shape[0]):
        keep = [t for t in range(logp.shape[1]) if mask[b, t]]
        if not keep:
            continue
        log_terms = []
        for t in keep:
            d = logp[b, t] - old[b, t]
            clipped = min(max(d, -clip_low), clip_high)
            # pessimistic: the smaller surrogate for A > 0 (smaller log-ratio), the larger one for A < 0
            log_terms.append(min(d, clipped) if adv[b, t] > 0 else (max(d, clipped) if adv[b, t] < 0 else 0.0))
        mean_adv = sum(adv[b, t] for t in keep) / len(keep)
        losses.append(-mean_adv * math.exp(sum(log_terms) / len(keep)))
    return sum(losses) / len(losses)


def grpo_passk(scores: Sequence[float], group_ids: Sequence[Hashable], norm_by_std: bool = True, eps: float = 1e-6):
    out = np.zeros(len(scores))
    for idx in _groups(group_ids).values():
        if len(idx) == 1:
            continue
        ordered = sorted(idx, key=lambda i: (-scores[i], i))  # best first; ties: earliest in the batch
        best, runner_up = ordered[0], ordered[1]
        gap = scores[best] - scores[runner_up]
        if norm_by_std:
            vals = [scores[i] for i in idx]
            mean = sum(vals) / len(vals)
            gap /= math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) + eps
        out[best] = gap
    return out


def gpg(scores: Sequence[float], group_ids: Sequence[Hashable], f_norm: float = 1.0):
    """veRL's GPG: alpha = B / (number of non-zero scores, at least 1), times the gap to the group mean."""
    nonzero = sum(1 for s in scores if s != 0)
    alpha = len(scores) / max(nonzero, 1)
    out = np.zeros(len(scores))
    for idx in _groups(group_ids).values():
        if len(idx) == 1:
            continue
        mean = sum(scores[i] for i in idx) / len(idx)
        for i in idx:
            out[i] = alpha * (scores[i] - mean) / f_norm
    return out
