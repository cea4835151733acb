"""Nuclear-norm baselines: the batched torch solver against cvxpy, closed forms and invariances."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfmatcomp as tm
from tfmatcomp.analyses.baselines import (
    PAPER_LAMBDA_TABLE, batch_losses, compare_with_model, complete_nuclear_norm, lambda_table,
    nuclear_norm, solve_nuclear_norm_cvxpy, solve_nuclear_norm_torch,
)


def _rel(a, b):
    return (a - b).flatten(1).norm(dim=1) / b.flatten(1).norm(dim=1)


@pytest.fixture(scope="module")
def batch7():
    task = tm.MatrixCompletionTask(n_rows=7, rank=2, p_mask=0.3)
    return task.sample(40, generator=torch.Generator().manual_seed(123))


@pytest.fixture(scope="module")
def constrained(batch7):
    b = batch7
    return (solve_nuclear_norm_torch(b.values, b.observed, 7, 7),
            solve_nuclear_norm_cvxpy(b.values, b.observed, 7, 7, solver="CLARABEL"))


def test_torch_agrees_with_cvxpy_constrained(batch7, constrained):
    sol_t, sol_c = constrained
    assert sol_t.status == ("optimal",) * 40 and bool(sol_c.converged.all())
    assert sol_t.matrices.dtype == torch.float64
    rel = _rel(sol_t.matrices, sol_c.matrices)
    assert rel.mean() < 1e-3
    lt, lc = sol_t.losses(batch7), sol_c.losses(batch7)
    assert f"{lt['L_mask']:.3g}" == f"{lc['L_mask']:.3g}"
    assert abs(lt["L_mask"] - lc["L_mask"]) < 1e-4 * lc["L_mask"]
    # feasible exactly, and at least as good an objective as the interior-point solver
    obs = batch7.observed
    assert torch.equal(sol_t.predictions[obs], batch7.values[obs].double())
    assert (sol_t.nuclear_norms() - sol_c.nuclear_norms()).max() < 1e-5


def test_agreement_tolerance_discriminates(batch7, constrained):
    """A solver of a nearby but wrong problem (or a lazy completion) fails the acceptance bound."""
    _, sol_c = constrained
    b = batch7
    wrong = solve_nuclear_norm_torch(b.values, b.observed, 7, 7, lam=5e-4)
    assert _rel(wrong.matrices, sol_c.matrices).mean() > 3e-3
    zero_filled = torch.where(b.observed, b.values, 0).double().reshape(-1, 7, 7)
    assert _rel(zero_filled, sol_c.matrices).mean() > 0.1
    loose = solve_nuclear_norm_torch(b.values, b.observed, 7, 7, tol=0.3, max_iter=3)
    assert _rel(loose.matrices, sol_c.matrices).mean() > 1e-3


def test_torch_agrees_with_cvxpy_regularized(batch7):
    b = batch7[:16]
    for lam in (5e-4, 5e-3):
        sol_t = solve_nuclear_norm_torch(b.values, b.observed, 7, 7, lam=lam)
        sol_c = solve_nuclear_norm_cvxpy(b.values, b.observed, 7, 7, lam=lam)
        assert bool(sol_t.converged.all()) and bool(sol_c.converged.all())
        assert _rel(sol_t.matrices, sol_c.matrices).mean() < 1e-3
        lt, lc = sol_t.losses(b), sol_c.losses(b)
        assert abs(lt["L_mask"] - lc["L_mask"]) < 1e-3 * lc["L_mask"]
        assert abs(lt["L_obs"] - lc["L_obs"]) < 1e-2 * lc["L_obs"]


def test_fresh_cvxpy_problem_matches_compiled_one(batch7):
    b = batch7[:3]
    a = solve_nuclear_norm_cvxpy(b.values, b.observed, 7, 7, lam=1e-3)
    c = solve_nuclear_norm_cvxpy(b.values, b.observed, 7, 7, lam=1e-3, reuse=False)
    assert _rel(a.matrices, c.matrices).max() < 1e-4


def test_regularized_fully_observed_is_singular_value_thresholding():
    """With every entry observed, Eq. 2 is solved by SVT at lam * |Omega| / 2 (closed form)."""
    g = torch.Generator().manual_seed(0)
    A = torch.randn(6, 5, 4, generator=g, dtype=torch.float64)
    observed = torch.ones(6, 20, dtype=torch.bool)
    lam = 0.05                                  # threshold 0.5: some singular values vanish
    U, S, Vh = torch.linalg.svd(A, full_matrices=False)
    expected = (U * (S - lam * 20 / 2).clamp_min(0)[:, None, :]) @ Vh
    assert ((S - 0.5) < 0).any()
    sol = solve_nuclear_norm_torch(A.reshape(6, 20), observed, 5, 4, lam=lam)
    assert torch.allclose(sol.matrices, expected, atol=1e-6)


def test_trivial_masks():
    g = torch.Generator().manual_seed(1)
    v = torch.randn(3, 9, generator=g)
    full = solve_nuclear_norm_torch(v, torch.ones(3, 9, dtype=torch.bool), 3, 3)
    assert torch.equal(full.predictions, v.double()) and bool(full.converged.all())
    none = solve_nuclear_norm_torch(v, torch.zeros(3, 9, dtype=torch.bool), 3, 3)
    assert none.predictions.abs().max() < 1e-8 and bool(none.converged.all())


def test_rectangular_matches_cvxpy():
    task = tm.MatrixCompletionTask(n_rows=5, n_cols=3, rank=1, p_mask=0.3)
    b = task.sample(6, generator=torch.Generator().manual_seed(2))
    sol_t = complete_nuclear_norm(b)
    sol_c = complete_nuclear_norm(b, method="cvxpy")
    assert sol_t.matrices.shape == (6, 5, 3)
    assert _rel(sol_t.matrices, sol_c.matrices).mean() < 1e-3


def _path_state(X, free, mu, lam=None, w=None, a=None):
    """A one-chunk path state for ``X [B, N, N]`` with free entries ``free [B, N*N]``, data weights
    ``w [B, N*N]`` and targets ``a [B, N, N]`` (Eq. 2; None: Eq. 1)."""
    from tfmatcomp.analyses.baselines.solver import _PathState, _svd

    B, N = X.shape[0], X.shape[-1]
    m = int(free.sum(1).max())
    order = torch.argsort((~free).to(torch.int8), dim=1, stable=True)[:, :m]
    vm = torch.gather(free, 1, order).to(X.dtype)
    U, S, V = _svd(X)
    wv = torch.zeros(B, m, dtype=X.dtype) if w is None else torch.gather(w, 1, order) * vm
    av = torch.zeros(B, m, dtype=X.dtype) if a is None else torch.gather(a.reshape(B, -1), 1, order)
    ones = torch.ones(B, dtype=torch.bool)
    return _PathState(10**6, X=X, U=U, S=S, V=V, mu=mu, mu_min=mu,
                      lam=torch.full((B,), lam or 1.0, dtype=X.dtype), last_full=ones, final=~ones,
                      index=torch.arange(B), n_free=free.sum(1), row=order // N, col=order % N,
                      flat=order, vm=vm, wv=wv, av=av)


def _smoothed_gradient(X, mu):
    """Gradient of ``sum_i h_mu(s_i)``: ``U h'(S) V^T``."""
    U, S, Vh = torch.linalg.svd(X)
    r = torch.sqrt(S * S + mu[:, None] ** 2)
    return (U * (S / (mu[:, None] + r))[:, None, :]) @ Vh


@pytest.mark.parametrize("rank_deficient,regularized", [(False, False), (True, False), (False, True)])
def test_newton_directions_match_finite_differences(rank_deficient, regularized):
    """``H^{-1} g`` and ``H^{-1} dg/dmu`` from the SVD-factor Hessian equal the ones from a
    central-difference Hessian of the exact gradient (Hessian at ``mu_h``, gradient at ``mu``;
    with ``lam`` and the data term for Eq. 2)."""
    from tfmatcomp.analyses.baselines.solver import _newton_directions

    g = torch.Generator().manual_seed(7)
    B, N = 3, 5
    X = torch.randn(B, N, N, generator=g, dtype=torch.float64)
    if rank_deficient:   # repeated zero singular values: the divided differences' limits
        X = X[:, :, :1] @ X[:, :1, :]
    if regularized:      # every entry free; data term w (x - a)^2 on the observed ones
        lam = 0.3
        free = torch.ones(B, N * N, dtype=torch.bool)
        w = 0.05 * (torch.rand(B, N * N, generator=g) < 0.6).to(torch.float64)
        A = torch.randn(B, N, N, generator=g, dtype=torch.float64)
    else:
        lam, w, A = None, None, None
        free = torch.rand(B, N * N, generator=g) < 0.5
    mu = torch.tensor([0.3, 0.05, 0.1], dtype=torch.float64)
    mu_h = torch.tensor([0.2, 0.05, 0.02], dtype=torch.float64)
    stt = _path_state(X, free, mu, lam=lam, w=w, a=A)
    sol, grad, grad_mu, _ = _newton_directions(stt, mu_h)
    eps, scale = 1e-6, lam or 1.0
    for b in range(B):
        pos = stt.flat[b, : int(stt.n_free[b])]
        m = pos.numel()
        wv = stt.wv[b, :m]

        def gfree(Y, mu_, b=b, pos=pos, wv=wv):
            data = 0 if A is None else 2 * wv * (Y.reshape(-1)[pos] - A[b].reshape(-1)[pos])
            return scale * _smoothed_gradient(Y[None], mu_[b : b + 1])[0].reshape(-1)[pos] + data

        H = torch.zeros(m, m, dtype=torch.float64)
        for k in range(m):
            E = torch.zeros(N * N, dtype=torch.float64)
            E[pos[k]] = eps
            E = E.reshape(N, N)
            H[:, k] = (gfree(X[b] + E, mu_h) - gfree(X[b] - E, mu_h)) / (2 * eps)
        g_exact = gfree(X[b], mu)
        g_mu = (gfree(X[b], mu + eps) - gfree(X[b], mu - eps)) / (2 * eps)
        assert torch.allclose(grad[b, :m], g_exact, atol=1e-12)
        assert torch.allclose(grad_mu[b, :m], g_mu, rtol=1e-5, atol=1e-8)
        expected = torch.linalg.solve(H, torch.stack((g_exact, g_mu), 1))
        assert torch.allclose(sol[b, :m], expected, rtol=1e-5, atol=1e-6 * expected.abs().max())


def test_chunking_does_not_change_the_solution(batch7):
    """Chunks only group the Newton systems: one matrix per chunk, the default and one chunk for
    the whole batch give the same iterates."""
    b = batch7
    ref = solve_nuclear_norm_torch(b.values, b.observed, 7, 7)
    for chunk in (1, 10**6):
        other = solve_nuclear_norm_torch(b.values, b.observed, 7, 7, chunk_entries=chunk)
        assert other.n_iter == ref.n_iter
        assert torch.allclose(other.matrices, ref.matrices, atol=1e-10)


def test_svd_helper_factorizes():
    from tfmatcomp.analyses.baselines.solver import _svd

    X = torch.randn(4, 6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    U, S, V = _svd(X)
    assert U.is_contiguous() and V.is_contiguous()
    assert torch.allclose((U * S[:, None, :]) @ V.mT, X, atol=1e-12)
    eye = torch.eye(6, dtype=torch.float64)
    assert torch.allclose(U.mT @ U, eye.expand(4, 6, 6), atol=1e-12)
    assert torch.allclose(V.mT @ V, eye.expand(4, 6, 6), atol=1e-12)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), scale=st.floats(0.1, 5.0), regularized=st.booleans())
def test_equivariance(seed, scale, regularized):
    """The optimum commutes with transposition, row / column permutations and sign flips, and
    scales with the data (lam scaled along for Eq. 2)."""
    g = torch.Generator().manual_seed(seed)
    n_rows, n_cols = 4, 5
    X = torch.randn(2, n_rows, 1, generator=g, dtype=torch.float64) @ torch.randn(
        2, 1, n_cols, generator=g, dtype=torch.float64)
    M = torch.rand(2, n_rows, n_cols, generator=g) > 0.35
    lam = 0.02 if regularized else None

    def solve(x, m, lam=lam):
        r, c = x.shape[1:]
        return solve_nuclear_norm_torch(x.reshape(2, -1), m.reshape(2, -1), r, c, lam).matrices

    base = solve(X, M)
    assert torch.allclose(solve(X.mT, M.mT), base.mT, atol=1e-6)
    pr, pc = torch.randperm(n_rows, generator=g), torch.randperm(n_cols, generator=g)
    assert torch.allclose(solve(X[:, pr][:, :, pc], M[:, pr][:, :, pc]), base[:, pr][:, :, pc], atol=1e-6)
    assert torch.allclose(solve(-X, M), -base, atol=1e-6)
    scaled = solve(scale * X, M, None if lam is None else lam * scale)
    assert torch.allclose(scaled, scale * base, atol=1e-6 * max(scale, 1))


def test_cvxpy_failures_are_reported_per_matrix(batch7):
    b = batch7[:3]
    sol = solve_nuclear_norm_cvxpy(b.values, b.observed, 7, 7, solver="SCS", max_iters=2)
    assert not bool(sol.converged.any())
    assert all(s != "optimal" for s in sol.status) and len(sol.failures) == 3
    assert torch.isnan(sol.matrices).all()
    out = sol.losses(b)
    assert out["n_failed"] == 3 and math.isnan(out["L_mask"])
    assert torch.isnan(sol.nuclear_norms()).all()


def test_max_iter_reported():
    b = tm.MatrixCompletionTask(n_rows=5, rank=1).sample(4, generator=torch.Generator().manual_seed(0))
    sol = solve_nuclear_norm_torch(b.values, b.observed, 5, 5, max_iter=2)
    assert set(sol.status) == {"max_iter"} and not bool(sol.converged.any())
    assert sol.losses(b)["n_failed"] == 4


def test_bad_arguments():
    v = torch.zeros(2, 9)
    o = torch.ones(2, 9, dtype=torch.bool)
    with pytest.raises(ValueError, match="values"):
        solve_nuclear_norm_torch(v, o, 3, 4)
    with pytest.raises(ValueError, match="observed"):
        solve_nuclear_norm_torch(v, o.float(), 3, 3)
    with pytest.raises(ValueError, match="lam"):
        solve_nuclear_norm_torch(v, o, 3, 3, lam=-1.0)
    with pytest.raises(ValueError, match="chunk_entries"):
        solve_nuclear_norm_torch(v, o, 3, 3, chunk_entries=0)
    with pytest.raises(ValueError, match="solver"):
        solve_nuclear_norm_cvxpy(v, o, 3, 3, solver="NOT_A_SOLVER")
    with pytest.raises(ValueError, match="method"):
        complete_nuclear_norm(tm.MatrixCompletionTask(3, rank=1).sample(1), method="magic")


def test_nuclear_norm_and_losses():
    m = torch.diag(torch.tensor([3.0, -2.0, 0.5]))[None]
    assert torch.allclose(nuclear_norm(m), torch.tensor([5.5]))
    b = tm.MatrixCompletionTask(n_rows=3, rank=1).sample(4, generator=torch.Generator().manual_seed(0))
    pred = b.values + 0.1
    keep = torch.tensor([True, False, True, True])
    out = batch_losses(pred, b, keep)
    assert out["n_failed"] == 1
    assert out["L"] == pytest.approx(tm.losses(pred[keep], b[keep])["L"].item(), rel=1e-6)


def test_compare_with_model(tiny_model, task4):
    df = compare_with_model(tiny_model, [0.2, 0.5], task=task4, n_samples=6, seed=3)
    assert df.shape[0] == 4 and list(df["method"]) == ["model", "nuclear_norm"] * 2
    nn = df[df.method == "nuclear_norm"]
    assert (nn["L_obs"] < 1e-10).all() and (nn["n_failed"] == 0).all()
    # the model row is model(batch.tokens) on the batch drawn first from the seeded generator
    gen = torch.Generator().manual_seed(3)
    batch = tm.MatrixCompletionTask(n_rows=4, rank=1, p_mask=0.2).sample(6, generator=gen)
    with torch.no_grad():
        expected = tm.losses(tiny_model(batch.tokens), batch)["L_mask"].item()
    assert df.iloc[0]["L_mask"] == pytest.approx(expected, rel=1e-6)
    assert df.iloc[1]["nuclear_norm"] < df.iloc[1]["true_nuclear_norm"] + 1e-9


def test_lambda_table(tiny_model, task4):
    lams = [5e-4, 5e-3, 5e-2]
    df = lambda_table(lams, task=task4, n_samples=12, model=tiny_model, include_constrained=True)
    nn = df[df.method == "nuclear_norm"]
    assert list(nn["lam"].iloc[:3]) == lams and math.isnan(nn["lam"].iloc[3])
    # the data misfit grows with lambda (a property of the regularized optimum); lam -> 0 gives Eq. 1
    assert np.all(np.diff(nn["L_obs"].iloc[:3].to_numpy()) > 0)
    assert nn["L_obs"].iloc[3] < 1e-12
    assert df.iloc[0]["paper_L_mask"] == PAPER_LAMBDA_TABLE[5e-4][1]
    assert math.isnan(df.iloc[2]["paper_L_mask"]) and df.iloc[-1]["method"] == "model"
