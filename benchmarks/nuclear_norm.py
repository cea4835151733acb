"""Batched torch nuclear-norm solver vs cvxpy one matrix at a time, on the same problems.

Draws N random 7x7 rank-2 matrices (p_mask 0.3, rounded as the task does), solves them with
``solve_nuclear_norm_torch`` (whole batch) and with ``solve_nuclear_norm_cvxpy`` (one problem per
matrix) in the same run, checks that they agree, and prints the times and speed-ups.

cvxpy baselines timed:
  * CLARABEL, one DPP problem compiled once and re-solved per matrix (the library's default path);
  * CLARABEL, a fresh problem per matrix;
  * SCS, a fresh problem per matrix (what the papers' code does), unless --no-scs.

    python benchmarks/nuclear_norm.py                 # 512 problems, constrained (Eq. 1)
    python benchmarks/nuclear_norm.py --lam 1e-3      # the regularized problem (Eq. 2)
    python benchmarks/nuclear_norm.py -n 128 --no-scs --threads 0   # torch's default threads
"""

from __future__ import annotations

import argparse
import time

import torch

import tfmatcomp as tm
from tfmatcomp.baselines import solve_nuclear_norm_cvxpy, solve_nuclear_norm_torch


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--n-problems", type=int, default=512)
    ap.add_argument("--n-rows", type=int, default=7)
    ap.add_argument("--rank", type=int, default=2)
    ap.add_argument("--p-mask", type=float, default=0.3)
    ap.add_argument("--lam", type=float, default=None, help="regularized problem with this lambda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads (default 1: cvxpy's solvers are single-threaded, and "
                         "on a shared CPU more threads can be much slower); 0 keeps torch's default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-scs", action="store_true", help="skip the (slow) SCS baseline")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    task = tm.MatrixCompletionTask(n_rows=args.n_rows, rank=args.rank, p_mask=args.p_mask)
    batch = task.sample(args.n_problems, generator=torch.Generator().manual_seed(args.seed))
    v, o, n = batch.values, batch.observed, args.n_rows
    kind = "constrained (Eq. 1)" if args.lam is None else f"regularized (Eq. 2), lambda={args.lam}"
    print(f"{args.n_problems} problems, {n}x{n} rank {args.rank}, p_mask {args.p_mask}, {kind}; "
          f"torch threads {torch.get_num_threads()}, device {args.device}")

    # warm-up (first-call overheads: LAPACK, cvxpy compilation) on a few problems
    solve_nuclear_norm_torch(v[:8].to(args.device), o[:8].to(args.device), n, n, args.lam)
    solve_nuclear_norm_cvxpy(v[:2], o[:2], n, n, args.lam)

    vt, ot = v.to(args.device), o.to(args.device)

    def run_torch():
        out = solve_nuclear_norm_torch(vt, ot, n, n, args.lam)
        if vt.is_cuda:
            torch.cuda.synchronize()
        return out

    sol_t, t_torch = _timed(run_torch)
    sol_c, t_clar = _timed(lambda: solve_nuclear_norm_cvxpy(v, o, n, n, args.lam, solver="CLARABEL"))
    _, t_clar_fresh = _timed(lambda: solve_nuclear_norm_cvxpy(v, o, n, n, args.lam, solver="CLARABEL",
                                                              reuse=False))
    t_scs = None
    if not args.no_scs:
        _, t_scs = _timed(lambda: solve_nuclear_norm_cvxpy(v, o, n, n, args.lam, solver="SCS",
                                                           reuse=False))

    a, b = sol_t.matrices.cpu(), sol_c.matrices
    both = sol_t.converged.cpu() & sol_c.converged
    rel = ((a - b).flatten(1).norm(dim=1) / b.flatten(1).norm(dim=1).clamp_min(1e-12))[both]
    lt, lc = sol_t.losses(batch.to("cpu")), sol_c.losses(batch)
    print(f"agreement on {int(both.sum())} matrices solved by both: relative difference of the "
          f"completed matrices mean {rel.mean():.2e}, median {rel.median():.2e}, max {rel.max():.2e}")
    print(f"L_mask torch {lt['L_mask']:.6g} vs cvxpy {lc['L_mask']:.6g}; "
          f"L torch {lt['L']:.6g} vs cvxpy {lc['L']:.6g}; L_obs torch {lt['L_obs']:.3g} vs "
          f"cvxpy {lc['L_obs']:.3g}; failures torch {lt['n_failed']}, cvxpy {lc['n_failed']}")
    print(f"torch batched ({sol_t.n_iter} Newton iterations): {t_torch:.3f} s "
          f"({1e3 * t_torch / args.n_problems:.2f} ms per problem)")
    rows = [("cvxpy CLARABEL, compiled once", t_clar), ("cvxpy CLARABEL, fresh problem", t_clar_fresh)]
    if t_scs is not None:
        rows.append(("cvxpy SCS, fresh problem (papers' code)", t_scs))
    for name, t in rows:
        print(f"{name}: {t:.2f} s ({1e3 * t / args.n_problems:.1f} ms per problem) -> "
              f"speed-up of the batched solver {t / t_torch:.1f}x")


if __name__ == "__main__":
    main()
