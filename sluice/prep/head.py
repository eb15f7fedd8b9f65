"""The classification head trained on a variant family's embeddings."""

from __future__ import annotations

import numpy as np


def train_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3,
                   iterations: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """Binary logistic regression by Newton's method; returns a two-class softmax head
    ``(W [dim, 2], b [2])`` (class 1 logit = w·x + c, class 0 logit = 0)."""
    n, d = x.shape
    xb = np.hstack([x.astype(np.float64), np.ones((n, 1))])
    w = np.zeros(d + 1)
    reg = l2 * n * np.eye(d + 1)
    reg[d, d] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(xb @ w)))
        grad = xb.T @ (p - y) + reg @ w
        hess = (xb * (p * (1 - p))[:, None]).T @ xb + reg
        step = np.linalg.solve(hess + 1e-9 * np.eye(d + 1), grad)
        w -= step
        if float(np.abs(step).max()) < 1e-7:
            break
    weight = np.zeros((d, 2), dtype=np.float32)
    weight[:, 1] = w[:d]
    bias = np.array([0.0, w[d]], dtype=np.float32)
    return weight, bias
