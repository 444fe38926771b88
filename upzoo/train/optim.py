"""Optimisers and learning-rate schedules built from a recipe's ``train`` section."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["build_optimizer", "build_scheduler"]


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: Any) -> torch.optim.Optimizer:
    """SGD (Nesterov momentum when momentum > 0), AdamW or Adam from a :class:`~upzoo.recipe.TrainConfig`."""
    params = [p for p in params if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.momentum > 0
        )
    betas = tuple(cfg.betas)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Any, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_steps``, then ``poly`` (power 0.9), ``cosine`` or ``constant``."""
    warmup = max(0, cfg.warmup_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if cfg.schedule == "poly":
            return (1 - progress) ** 0.9
        if cfg.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
