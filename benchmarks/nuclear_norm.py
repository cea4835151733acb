"""Batched torch nuclear-norm solver vs cvxpy one matrix at a time, on the same problems.

Draws N random 7x7 rank-2 matrices (p_mask 0.3, rounded as the task does), solves them with
``solve_nuclear_norm_torch`` (whole batch) and with ``solve_nuclear_norm_cvxpy`` (one problem per
matrix), checks that they agree, and prints times and speed-ups. Both sides are timed in the same
run, interleaved over ``--repeats`` rounds (the torch solver ``--torch-runs`` times per round);
the script reports medians, because on a shared machine single timings wander.

cvxpy baselines (each solves the same N problems one by one):
  * default solver, a fresh problem per matrix: what a user writes and what the papers' code
    does (``cp.Problem(...).solve()`` per matrix; cvxpy picks SCS for this SDP). The headline.
  * CLARABEL, a fresh problem per matrix (an interior-point solver, more accurate than SCS).
  * CLARABEL, one DPP-parametrized problem compiled once and re-solved per matrix: the fastest
    way to use cvxpy here, so the strictest comparison.

    python benchmarks/nuclear_norm.py                  # 512 problems, constrained (Eq. 1)
    python benchmarks/nuclear_norm.py --lam 1e-3       # the regularized problem (Eq. 2)
    python benchmarks/nuclear_norm.py --tol 1e-5       # the torch solver at a looser tolerance
    python benchmarks/nuclear_norm.py -n 128 --repeats 1 --threads 0   # quick; torch's threads
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import torch

import tfmatcomp as tm
from tfmatcomp.analyses.baselines import (
    batch_losses, nuclear_norm, solve_nuclear_norm_cvxpy, solve_nuclear_norm_torch,
)
from tfmatcomp.datapath import sample_batch


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def cvxpy_default_solver(values, observed, n_rows: int, n_cols: int, lam: float | None) -> str:
    """The solver cvxpy picks when ``solve()`` gets none, for this problem (built as the papers' code
    builds it)."""
    import cvxpy as cp

    from tfmatcomp.analyses.baselines.cvxpy_path import _cvxpy_fresh_problem

    A = (values[0].double() * observed[0]).reshape(n_rows, n_cols).numpy()
    M = observed[0].reshape(n_rows, n_cols).double().numpy()
    prob, _ = _cvxpy_fresh_problem(A, M, lam)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        prob.solve()
    return prob.solver_stats.solver_name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--n-problems", type=int, default=512)
    ap.add_argument("--n-rows", type=int, default=7)
    ap.add_argument("--rank", type=int, default=2)
    ap.add_argument("--p-mask", type=float, default=0.3)
    ap.add_argument("--lam", type=float, default=None, help="regularized problem with this lambda")
    ap.add_argument("--tol", type=float, default=None,
                    help="tol of the torch solver (default: the library's, 1e-6; 1e-5 is ~10%% faster and ~10x "
                         "less accurate, still closer to the exact optimum than CLARABEL's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads (default 1: cvxpy's solvers run on one core, and on a "
                         "shared CPU more threads can be much slower); 0 keeps torch's default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; medians are reported")
    ap.add_argument("--torch-runs", type=int, default=5, help="torch solves per round")
    ap.add_argument("--no-clarabel-fresh", action="store_true", help="skip CLARABEL with fresh problems")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    task = tm.MatrixCompletionTask(n_rows=args.n_rows, rank=args.rank, p_mask=args.p_mask)
    batch = sample_batch(task, args.n_problems, seed=args.seed)
    v, o, n, lam = batch.values, batch.observed, args.n_rows, args.lam
    kind = "constrained (Eq. 1)" if lam is None else f"regularized (Eq. 2), lambda={lam}"
    default = cvxpy_default_solver(v, o, n, n, lam)
    print(f"{args.n_problems} problems, {n}x{n} rank {args.rank}, p_mask {args.p_mask}, {kind}; "
          f"torch solver tol {args.tol if args.tol is not None else 'default'}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), device {args.device}; "
          f"cvxpy's default solver here: {default}; load average {os.getloadavg()[0]:.2f}")

    vt, ot = v.to(args.device), o.to(args.device)

    opts = {} if args.tol is None else {"tol": args.tol}

    def run_torch():
        out = solve_nuclear_norm_torch(vt, ot, n, n, lam, **opts)
        if vt.is_cuda:
            torch.cuda.synchronize()
        return out

    baselines = [(f"cvxpy {default}, fresh problem per matrix (default solver; the papers' code)",
                  dict(solver=default, reuse=False))]
    if not args.no_clarabel_fresh and default != "CLARABEL":
        baselines.append(("cvxpy CLARABEL, fresh problem per matrix", dict(solver="CLARABEL", reuse=False)))
    baselines.append(("cvxpy CLARABEL, compiled once (DPP), re-solved per matrix",
                      dict(solver="CLARABEL", reuse=True)))

    # warm-up: first-call overheads (LAPACK, cvxpy compilation, memory) outside the timings
    run_torch()
    for _, kw in baselines:
        solve_nuclear_norm_cvxpy(v[:2], o[:2], n, n, lam, **kw)

    t_torch: list[float] = []
    t_cvx: dict[str, list[float]] = {name: [] for name, _ in baselines}
    ratios: dict[str, list[float]] = {name: [] for name, _ in baselines}
    sols = {}
    for r in range(args.repeats):
        runs = []
        for _ in range(args.torch_runs):
            sol_t, t = _timed(run_torch)
            runs.append(t)
        t_round = statistics.median(runs)
        t_torch.extend(runs)
        for name, kw in baselines:
            sols[name], t = _timed(lambda kw=kw: solve_nuclear_norm_cvxpy(v, o, n, n, lam, **kw))
            t_cvx[name].append(t)
            ratios[name].append(t / t_round)
        print(f"  round {r + 1}: torch median {t_round:.3f} s; "
              + "; ".join(f"{t_cvx[name][-1]:.2f} s" for name, _ in baselines))

    # agreement with the interior-point solution (CLARABEL), and with the headline baseline's
    ref_name = baselines[-1][0]
    a, b = sol_t.matrices.cpu(), sols[ref_name].matrices
    both = sol_t.converged.cpu() & sols[ref_name].converged
    rel = ((a - b).flatten(1).norm(dim=1) / b.flatten(1).norm(dim=1).clamp_min(1e-12))[both]
    lt, lc = batch_losses(sol_t.predictions.cpu(), batch), sols[ref_name].losses(batch)
    obj = (nuclear_norm(a) - nuclear_norm(b))[both]
    print(f"\nagreement with CLARABEL on {int(both.sum())} matrices: relative difference of the "
          f"completed matrices mean {rel.mean():.2e}, median {rel.median():.2e}, max {rel.max():.2e}")
    print(f"  L_mask torch {lt['L_mask']:.6g} vs CLARABEL {lc['L_mask']:.6g} (3 significant digits: "
          f"{lt['L_mask']:.3g} vs {lc['L_mask']:.3g}); L {lt['L']:.6g} vs {lc['L']:.6g}; "
          f"L_obs {lt['L_obs']:.3g} vs {lc['L_obs']:.3g}")
    print(f"  ||X||_* torch - CLARABEL: max {obj.max():.1e}, mean {obj.mean():.1e}; failures torch "
          f"{lt['n_failed']}, CLARABEL {lc['n_failed']}")
    head = baselines[0][0]
    lh = sols[head].losses(batch)
    relh = ((a - sols[head].matrices).flatten(1).norm(dim=1)
            / sols[head].matrices.flatten(1).norm(dim=1).clamp_min(1e-12))[sols[head].converged]
    print(f"  vs {default} (default accuracy): relative difference mean {relh.mean():.2e}; "
          f"L_mask {lh['L_mask']:.6g}; failures {lh['n_failed']}")

    tt = statistics.median(t_torch)
    print(f"\ntorch batched ({sol_t.n_iter} Newton iterations): median {tt:.3f} s over "
          f"{len(t_torch)} runs (min {min(t_torch):.3f}, max {max(t_torch):.3f}); "
          f"{1e3 * tt / args.n_problems:.2f} ms per problem")
    for i, (name, _) in enumerate(baselines):
        tc = statistics.median(t_cvx[name])
        label = "HEADLINE " if i == 0 else ""
        print(f"{label}{name}: median {tc:.2f} s ({1e3 * tc / args.n_problems:.1f} ms per problem) -> "
              f"speed-up {tc / tt:.1f}x (per round {min(ratios[name]):.1f}x-{max(ratios[name]):.1f}x)")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
