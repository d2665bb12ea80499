"""The step-level critic: a transformer with a scalar head that predicts P(correct | prefix).

The backbone is the base model of a causal LM checkpoint (``AutoModel``: the policy's
transformer without its LM head, by default a copy of ``model.path``); the head is one linear
layer on the hidden state of the last token (prompts are left-padded, so that is the last
position). It is trained with binary cross-entropy against the Monte-Carlo success rates
(soft targets); the lowest reachable loss is the mean entropy of the targets, logged beside it.

Saved as ``<dir>/backbone/`` (``save_pretrained``), ``<dir>/value_head.safetensors`` (a
:mod:`dapo_cli.statefiles` file: never unpickled) and the tokenizer in ``<dir>/backbone/``;
a run of an older dapo has ``value_head.pt``, read with torch's weights-only reader only.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from dapo_cli.algo.direct_advantage import (
    bernoulli_entropy,
    calibration_bins,
    soft_bce_loss,
)
from dapo_cli.errors import UserError
from dapo_cli.statefiles import StateFileError, read_legacy, read_state, write_state

HEAD_FILE = "value_head.safetensors"
LEGACY_HEAD_FILE = "value_head.pt"
BACKBONE_DIR = "backbone"


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence the load report of a causal-LM checkpoint read as a bare backbone (its unused LM head)."""
    from transformers.utils import logging as hf_logging

    from dapo_cli.models.tiny import quiet_hf_progress

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with quiet_hf_progress():
            yield
    finally:
        hf_logging.set_verbosity(level)


class ValueModel(torch.nn.Module):
    """``backbone`` (a transformers base model) + ``head`` (hidden → 1): logits of success ``[B]``."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        last = out.last_hidden_state[:, -1, :]  # left padding: the last position is the last real token
        return self.head(last.to(self.head.weight.dtype)).squeeze(-1)

    def set_prior(self, mean_target: float) -> None:
        """Start at the constant prediction ``mean_target`` (the head's bias), so training starts at the
        best constant critic instead of 0.5."""
        p = min(max(mean_target, 1e-3), 1 - 1e-3)
        with torch.no_grad():
            self.head.bias.fill_(math.log(p / (1 - p)))


def build_critic(path: str | Path, *, device: torch.device, dtype: torch.dtype) -> tuple[ValueModel, Any]:
    """A fresh critic on the backbone of the causal LM at ``path`` (its tokenizer too)."""
    from transformers import AutoModel

    from dapo_cli.models.loading import load_tokenizer

    with quiet_transformers():
        backbone = AutoModel.from_pretrained(str(path), dtype=dtype)
    tokenizer = load_tokenizer(path)
    model = ValueModel(backbone, int(backbone.config.hidden_size)).to(device)
    return model, tokenizer


def save_critic(model: ValueModel, tokenizer: Any, directory: Path) -> None:
    with quiet_transformers():
        model.backbone.save_pretrained(directory / BACKBONE_DIR)
        tokenizer.save_pretrained(directory / BACKBONE_DIR)
    write_state(directory / HEAD_FILE, model.head.state_dict())


def load_critic(directory: Path, *, device: torch.device, dtype: torch.dtype) -> tuple[ValueModel, Any]:
    model, tokenizer = build_critic(directory / BACKBONE_DIR, device=device, dtype=dtype)
    fix = "rerun its critic phase (--from-phase critic)"
    try:
        head = (read_state(directory / HEAD_FILE, device=device) if (directory / HEAD_FILE).exists()
                else read_legacy(directory / LEGACY_HEAD_FILE, fix=fix, device=device))
    except StateFileError as exc:
        raise UserError(f"cannot read the critic in {directory}: {exc}; {fix}") from None
    model.head.load_state_dict(head)
    return model, tokenizer


def encode(tokenizer: Any, texts: Sequence[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(list(texts), padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt")
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


@torch.no_grad()
def predict(model: ValueModel, tokenizer: Any, texts: Sequence[str], *, batch_size: int) -> list[float]:
    """Predicted success probabilities of ``texts`` (prompt + prefix), in batches."""
    device = model.head.weight.device
    was = model.training
    model.eval()
    out: list[float] = []
    try:
        for i in range(0, len(texts), max(1, batch_size)):
            ids, mask = encode(tokenizer, texts[i : i + batch_size], device)
            out.extend(torch.sigmoid(model(ids, mask).float()).cpu().tolist())
    finally:
        model.train(was)
    return out


def holdout_problem(key: str, share: float) -> bool:
    """Whether problem ``key`` is held out of critic training (a stable hash of the key)."""
    if share <= 0:
        return False
    bucket = int.from_bytes(hashlib.sha256(f"critic-holdout:{key}".encode()).digest()[:8], "big") % 10_000
    return bucket < share * 10_000


def train_critic(
    model: ValueModel,
    tokenizer: Any,
    texts: Sequence[str],
    targets: Sequence[float],
    *,
    lr: float,
    epochs: int,
    batch_size: int,
    micro_batch_size: int,
    weight_decay: float,
    grad_clip: float,
    seed: int,
) -> dict[str, float]:
    """AdamW on BCE against soft targets; each optimizer step sees ``batch_size`` prefixes
    (micro-batched; the micro-batch losses are weighted to add up to the batch mean)."""
    device = model.head.weight.device
    y_all = torch.tensor(list(targets), dtype=torch.float32)
    model.set_prior(float(y_all.mean()) if len(y_all) else 0.5)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    losses: list[float] = []
    norms: list[float] = []
    first_epoch = last_epoch = float("nan")
    tokens = 0
    for epoch in range(epochs):
        order = torch.randperm(len(texts), generator=gen).tolist()
        epoch_loss, seen = 0.0, 0
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            step_loss = 0.0
            for m in range(0, len(batch), micro_batch_size):
                micro = batch[m : m + micro_batch_size]
                ids, mask = encode(tokenizer, [texts[i] for i in micro], device)
                logits = model(ids, mask).float()
                tokens += int(mask.sum())
                loss = soft_bce_loss(logits, y_all[micro].to(device)) * (len(micro) / len(batch))
                loss.backward()
                step_loss += float(loss.detach())
            max_norm = grad_clip if grad_clip > 0 else math.inf
            norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            if math.isfinite(norm):
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(step_loss)
            norms.append(norm)
            epoch_loss += step_loss * len(batch)
            seen += len(batch)
        mean_loss = epoch_loss / max(seen, 1)
        if epoch == 0:
            first_epoch = mean_loss
        last_epoch = mean_loss
    model.eval()
    return {
        "train_bce_first_epoch": first_epoch,
        "train_bce_last_epoch": last_epoch,
        "optimizer_steps": float(len(losses)),
        "tokens": float(tokens),
        "grad_norm_mean": sum(norms) / len(norms) if norms else float("nan"),
    }


def fit_metrics(predicted: Sequence[float], targets: Sequence[float], prefix: str, num_bins: int = 10) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """BCE, its floor (target entropy), MAE, ECE and the calibration table of one split."""
    if not predicted:
        return {}, []
    p = torch.tensor(list(predicted), dtype=torch.float64).clamp(1e-6, 1 - 1e-6)
    y = torch.tensor(list(targets), dtype=torch.float64)
    bce = float(soft_bce_loss(torch.logit(p), y))
    floor = float(bernoulli_entropy(y).mean())
    bins = calibration_bins(p, y, num_bins)
    constant = torch.full_like(y, float(y.mean())).clamp(1e-6, 1 - 1e-6)
    metrics = {
        f"{prefix}bce": bce,
        f"{prefix}bce_floor": floor,
        f"{prefix}bce_constant": float(soft_bce_loss(torch.logit(constant), y)),
        f"{prefix}mae": float((p - y).abs().mean()),
        f"{prefix}ece": float(bins["ece"]),
        f"{prefix}corr": pearson(p, y),
        f"{prefix}examples": float(len(y)),
    }
    table = [
        {
            "split": prefix.rstrip("_") or "all",
            "bin_low": round(float(lo), 3), "bin_high": round(float(hi), 3), "count": int(c),
            "mean_predicted": None if math.isnan(mp) else float(mp), "mean_mc_success": None if math.isnan(mt) else float(mt),
        }
        for lo, hi, c, mp, mt in zip(
            bins["low"].tolist(), bins["high"].tolist(), bins["count"].tolist(),
            bins["mean_predicted"].tolist(), bins["mean_target"].tolist(),
        )
    ]
    return metrics, table


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Correlation of two [N] tensors (0.0 when either is constant)."""
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    denom = float(a.norm() * b.norm())
    return float((a * b).sum()) / denom if denom > 0 else 0.0


def plot_calibration(tables: dict[str, list[dict[str, Any]]], path: Path, title: str) -> None:
    """Reliability diagram (mean predicted vs mean Monte-Carlo success per bin, one line per split,
    marker area ∝ count) above a histogram of the predictions, as a PNG."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, (ax, hist) = plt.subplots(2, 1, figsize=(5.5, 6.5), gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect calibration")
    width = 1.0 / max(len(next(iter(tables.values()), [])), 1)
    for n, (split, rows) in enumerate(tables.items()):
        pts = [(r["mean_predicted"], r["mean_mc_success"], r["count"]) for r in rows if r["count"]]
        if pts:
            xs, ys, cs = zip(*pts)
            total = sum(cs)
            ax.plot(xs, ys, marker="o", label=f"{split} ({total} prefixes)")
            ax.scatter(xs, ys, s=[20 + 400 * c / total for c in cs], alpha=0.3)
        lows = [r["bin_low"] for r in rows]
        hist.bar([lo + width * (0.25 + 0.5 * n) for lo in lows], [r["count"] for r in rows], width=width * 0.5, label=split)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("Monte-Carlo success rate (mean per bin)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    hist.set_xlabel("critic's predicted success probability")
    hist.set_ylabel("prefixes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def critic_phase(
    mc_rows: Sequence[dict[str, Any]],
    *,
    backbone_path: str | Path,
    out_dir: Path,
    device: torch.device,
    dtype: torch.dtype,
    lr: float,
    epochs: int,
    batch_size: int,
    micro_batch_size: int,
    holdout: float,
    weight_decay: float,
    grad_clip: float,
    seed: int,
    finished_states: bool = False,
    title: str = "critic calibration",
) -> tuple[list[dict[str, Any]], dict[str, float], list[dict[str, Any]]]:
    """Train a fresh critic on the states' soft targets (problems in the hold-out share excluded),
    save it and its calibration plot into ``out_dir``; returns (prediction rows, metrics, calibration table).

    ``finished_states``: also learn the value (the reward) of finished solutions; needed only when the
    critic scores candidate steps that finish a solution (``terminal_value: critic``), otherwise they are
    scored exactly and would only spend the critic's capacity on checking final answers.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    mc_rows = [r for r in mc_rows if finished_states or not r["terminal"]]
    texts = [r["prompt"] + r["prefix"] for r in mc_rows]
    targets = [float(r["value"]) for r in mc_rows]
    held = [holdout_problem(r["problem"], holdout) for r in mc_rows]
    train_idx = [i for i, h in enumerate(held) if not h]
    torch.manual_seed(seed)
    model, tokenizer = build_critic(backbone_path, device=device, dtype=dtype)
    metrics = train_critic(
        model, tokenizer, [texts[i] for i in train_idx], [targets[i] for i in train_idx], lr=lr, epochs=epochs,
        batch_size=batch_size, micro_batch_size=micro_batch_size, weight_decay=weight_decay, grad_clip=grad_clip, seed=seed,
    ) if train_idx else {"optimizer_steps": 0.0, "tokens": 0.0}
    predicted = predict(model, tokenizer, texts, batch_size=micro_batch_size)
    save_critic(model, tokenizer, out_dir)
    rows = [
        {"state": int(r["state"]), "problem": r["problem"], "depth": int(r["depth"]), "terminal": bool(r["terminal"]),
         "split": "holdout" if h else "train", "target": t, "predicted": p}
        for r, h, t, p in zip(mc_rows, held, targets, predicted)
    ]
    tables: dict[str, list[dict[str, Any]]] = {}
    for split in ("train", "holdout"):
        part = [r for r in rows if r["split"] == split]
        m, table = fit_metrics([r["predicted"] for r in part], [r["target"] for r in part], f"{split}_")
        metrics.update(m)
        if table:
            tables[split] = table
    open_part = [r for r in rows if r["split"] == "holdout" and not r["terminal"]]
    if open_part:  # the prefixes that matter for advantages (finished solutions are scored exactly)
        m, _ = fit_metrics([r["predicted"] for r in open_part], [r["target"] for r in open_part], "holdout_open_")
        metrics.update(m)
    plot_calibration(tables, out_dir / "calibration.png", title)
    metrics.update({"samples": float(len(train_idx) * epochs), "parameters": float(sum(p.numel() for p in model.parameters()))})
    del model
    return rows, metrics, [row for table in tables.values() for row in table]
