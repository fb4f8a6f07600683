"""Exact quadratic programs on the probability simplex (pFedGraph's per-client graph QP).

* ``project_to_simplex`` — Euclidean projection onto {x >= 0, sum x = 1}, sort-based (Duchi et al., ICML 2008),
  exact up to floating point, batched over rows.
* ``solve_simplex_qp`` — ``min 1/2 x^T P x + q^T x`` s.t. ``x >= 0, sum x = 1`` for a symmetric positive
  semi-definite P: a primal active-set method (Nocedal & Wright, Alg. 16.3) whose subproblems are solved exactly
  in the null space of the equality constraint; zero-curvature directions (singular P) are followed to the
  boundary. Finite for positive definite P; meant for the small dense problems of a server (N <= ~50).
* ``graph_weights`` — pFedGraph's rows: ``min_x lam x^T x + (d_i - 2 lam p)^T x`` on the simplex, whose exact
  minimiser is ``project_to_simplex(p - d_i / (2 lam))``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch


def project_to_simplex(v: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of each row of ``v`` [..., n] onto the probability simplex (Duchi et al. 2008)."""
    if v.shape[-1] == 0:
        return v.clone()
    u, _ = torch.sort(v, dim=-1, descending=True)
    cssv = u.cumsum(-1) - 1
    ind = torch.arange(1, v.shape[-1] + 1, device=v.device, dtype=v.dtype)
    cond = (u - cssv / ind) > 0
    rho = cond.to(torch.int64).cumsum(-1).argmax(-1, keepdim=True)  # last index where cond holds (cond is a prefix)
    theta = cssv.gather(-1, rho) / (rho + 1).to(v.dtype)
    return (v - theta).clamp_min(0)


def _null_basis(k: int) -> np.ndarray:
    """Orthonormal basis [k, k-1] of {p : sum p = 0}."""
    q, _ = np.linalg.qr(np.ones((k, 1)), mode="complete")
    return q[:, 1:]


def _subproblem_step(p_ff: np.ndarray, g_f: np.ndarray, curv_tol: float, grad_tol: float) -> Tuple[np.ndarray, bool]:
    """Step on the free set keeping sum fixed: exact minimiser (True) or a zero-curvature descent ray (False)."""
    k = len(g_f)
    if k == 1:
        return np.zeros(1), True
    z = _null_basis(k)
    h = z.T @ p_ff @ z
    r = z.T @ g_f
    w, v = np.linalg.eigh((h + h.T) / 2)
    flat = w <= curv_tol
    rv = v.T @ r
    if flat.any() and np.abs(rv[flat]).max() > grad_tol:
        return -(z @ (v[:, flat] @ rv[flat])), False
    u = -(v[:, ~flat] @ (rv[~flat] / w[~flat]))
    return z @ u, True


def solve_simplex_qp(P: np.ndarray, q: np.ndarray, tol: float = 1e-12, max_iter: Optional[int] = None) -> np.ndarray:
    """``argmin 1/2 x^T P x + q^T x`` over the simplex for symmetric PSD ``P`` [n, n] (active-set, float64)."""
    P = np.asarray(P, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64).reshape(-1)
    n = q.shape[0]
    if P.shape != (n, n):
        raise ValueError(f"P must be [{n}, {n}], got {P.shape}")
    if not (np.isfinite(P).all() and np.isfinite(q).all()):
        raise ValueError("P and q must be finite")
    P = (P + P.T) / 2
    scale = max(1.0, np.abs(P).max(initial=0.0), np.abs(q).max(initial=0.0))
    x = np.full(n, 1.0 / n)
    active = np.zeros(n, dtype=bool)  # bounds x_i = 0 held in the working set
    for _ in range(max_iter or 100 * n + 100):
        free = np.flatnonzero(~active)
        g = P @ x + q
        step, exact = _subproblem_step(P[np.ix_(free, free)], g[free], tol * scale * n, np.sqrt(tol) * scale)
        if exact and np.abs(step).max(initial=0.0) <= 1e3 * tol:
            nu = g[free].mean()  # multiplier of sum x = 1
            mu = g - nu          # multipliers of x >= 0 (meaningful on the working set)
            if not active.any() or mu[active].min() >= -np.sqrt(tol) * scale:
                x[active] = 0.0
                x = np.clip(x, 0.0, None)
                return x / x.sum()
            active[np.flatnonzero(active)[np.argmin(mu[active])]] = False
            continue
        alpha, blocking = (1.0 if exact else np.inf), None
        neg = step < 0
        if neg.any():
            ratios = -x[free][neg] / step[neg]
            j = int(np.argmin(ratios))
            if ratios[j] < alpha:
                alpha, blocking = max(ratios[j], 0.0), free[neg][j]
        if not np.isfinite(alpha):
            raise RuntimeError("solve_simplex_qp: unbounded direction (P not PSD?)")
        x[free] += alpha * step
        if blocking is not None:
            x[blocking] = 0.0
            active[blocking] = True
    raise RuntimeError("solve_simplex_qp: active-set method did not converge")


def graph_weights(d: torch.Tensor, p: torch.Tensor, lam: float, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """pFedGraph rows ``argmin_x lam x^T x + (d_i - 2 lam p)^T x`` on the simplex of accepted clients [N, N]."""
    n = d.shape[0]
    if not lam > 0:
        raise ValueError(f"lam must be positive, got {lam}")
    valid = torch.ones(n, dtype=torch.bool) if valid is None else valid.cpu().bool()
    d, p = d.double().cpu(), p.double().cpu()
    w = torch.eye(n, dtype=torch.float64)
    idx = torch.nonzero(valid).flatten()
    if len(idx):
        target = p[idx][None, :] - d[idx][:, idx] / (2 * lam)
        w[idx.view(-1, 1), idx.view(1, -1)] = project_to_simplex(target)
    return w
