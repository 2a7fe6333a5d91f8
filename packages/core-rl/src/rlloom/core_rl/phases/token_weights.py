"""What the old-log-prob pass feeds before the update: per-token policy-gradient weights (truncated importance
sampling against the rollout engine's log-probs, Yao et al. 2025; high-entropy token selection, Wang et al. 2025)
and the diagnostics logged beside them (entropy, KL to the reference, engine/trainer mismatch).

`OLD_LOGPROB_READERS` lists every setting that reads the old log-probs (or their entropy) before the update, so
the trainer knows when the update's own detached log-probs may stand in for a separate forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlloom.core_rl.algorithms import (
    high_entropy_token_mask,
    kl_penalty,
    masked_mean,
    mismatch_metrics,
    off_policy_weights,
    tis_weights,
)
from rlloom.core_rl.algorithms.mismatch import OFF_POLICY_MODES
from rlloom.core_rl.config.schema import AlgorithmConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch

OLD_LOGPROB_READERS: dict[str, Callable[[AlgorithmConfig], bool]] = {
    "algorithm.kl.use_in_reward": lambda algo: algo.kl.use_in_reward,
    "algorithm.tis": lambda algo: algo.tis is not None,
    "algorithm.off_policy_correction": lambda algo: algo.corrects_off_policy,
    "algorithm.entropy.adaptive": lambda algo: algo.entropy.adaptive is not None,
    "algorithm.top_entropy_quantile": lambda algo: algo.top_entropy_quantile < 1.0,
}
"""Settings that read the old log-probs or their entropy before the update (in the advantages, the token
weights or the entropy controller)."""


def old_logprobs_read_before_update(algo: AlgorithmConfig) -> list[str]:
    """The settings of `algo` that need the old log-probs before the update (empty: the update may supply them)."""
    return [key for key, reads in OLD_LOGPROB_READERS.items() if reads(algo)]


def policy_diagnostics(batch: TrajectoryBatch, entropy: torch.Tensor | None, algo: AlgorithmConfig) -> dict[str, float]:
    """Entropy, KL to the reference, and the rollout/trainer mismatch metrics; changes nothing in `batch`."""
    mask = batch.loss_mask
    out: dict[str, float] = {}
    if entropy is not None:
        out["actor/entropy"] = float(masked_mean(entropy, mask))
    if "ref_logprobs" in batch:
        kl = kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], algo.kl.loss_type)
        out["actor/kl_mean"] = float(masked_mean(kl, mask))
    if "rollout_logprobs" in batch:
        tis = algo.tis
        cap, mode = (tis.cap, tis.mode) if tis is not None else (None, "token_truncate")
        correction = algo.off_policy_correction
        if correction is not None and algo.corrects_off_policy:
            cap, mode = correction.cap, OFF_POLICY_MODES[correction.method]
        mismatch = mismatch_metrics(batch["old_logprobs"], batch["rollout_logprobs"], mask, cap=cap, mode=mode)
        out.update({f"mismatch/{k}": float(v) for k, v in mismatch.items()})
    return out


def set_token_weights(batch: TrajectoryBatch, entropy: torch.Tensor | None, algo: AlgorithmConfig) -> dict[str, float]:
    """Write `batch["is_weights"]`, the per-token policy-gradient weights, when TIS or high-entropy selection is
    on; returns the selection's metric. The selected tokens keep their weight (1, or the TIS weight); the others'
    becomes 0, so they still count in the loss's token normaliser, as in TRL."""
    mask = batch.loss_mask
    out: dict[str, float] = {}
    if algo.tis is not None and "rollout_logprobs" in batch:
        batch["is_weights"] = tis_weights(
            batch["old_logprobs"], batch["rollout_logprobs"], mask, cap=algo.tis.cap, mode=algo.tis.mode
        )
    correction = algo.off_policy_correction
    if correction is not None and algo.corrects_off_policy and "rollout_logprobs" in batch:
        batch["is_weights"] = off_policy_weights(
            batch["old_logprobs"], batch["rollout_logprobs"], mask, method=correction.method, cap=correction.cap
        )
    if algo.top_entropy_quantile < 1.0:
        if entropy is None:
            raise RuntimeError("algorithm.top_entropy_quantile needs the old-log-prob pass's entropy")
        keep = high_entropy_token_mask(entropy, mask, top_fraction=algo.top_entropy_quantile)
        base = batch["is_weights"] if "is_weights" in batch else mask.float()
        batch["is_weights"] = base * keep.float()
        out["actor/high_entropy_token_frac"] = float(masked_mean(keep.float(), mask))
    return out
