"""The local learning coefficient (tfmatcomp.analyses.dynamics.llc).

Without devinterp: the settings' validation, the boundary's ValueErrors and the ImportError that
names the extra. With devinterp (the ``llc`` extra), on checkpoints of the bundled tiny run with
small settings: the result records its settings, the same seed gives the same estimate, the
group-restricted estimates sample only their group, the stability flag, and the measure form
under over_checkpoints.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.analyses.dynamics import over_checkpoints
from tfmatcomp.analyses.dynamics.llc import (
    INSTALL_HINT, LLCResult, LLCSettings, default_nbeta, llc, llc_measure,
)
from tfmatcomp.datapath import sample_batch
from tfmatcomp.models.param_groups import group_parameter_names

#: Small settings: a few seconds for the whole file on one thread (not a calibrated estimate).
SMALL = LLCSettings(n_chains=2, n_draws=20, n_burnin=10, batch_size=16, n_matrices=32)


@pytest.fixture(scope="module")
def models():
    return {step: tm.load_pretrained("tiny", step=step) for step in (2000, 10000)}


@pytest.fixture(scope="module")
def pool():
    return sample_batch("tiny", 32, seed=0)


def needs_devinterp():
    return pytest.importorskip("devinterp", reason=f"the llc extra: {INSTALL_HINT}")


# ------------------------------------------------------------------- without devinterp
@pytest.mark.parametrize("kwargs, name", [
    (dict(lr=0.0), "lr"), (dict(lr=float("nan")), "lr"), (dict(lr="1e-4"), "lr"),
    (dict(localization=-1.0), "localization"), (dict(localization=float("inf")), "localization"),
    (dict(nbeta=0.0), "nbeta"), (dict(nbeta=float("inf")), "nbeta"),
    (dict(n_chains=1), "n_chains"), (dict(n_chains=2.0), "n_chains"),
    (dict(n_draws=1), "n_draws"), (dict(n_burnin=-1), "n_burnin"), (dict(n_burnin=True), "n_burnin"),
    (dict(batch_size=0), "batch_size"), (dict(batch_size=300, n_matrices=256), "batch_size"),
    (dict(batch_size=1, n_matrices=4), "batch_size"),   # default nbeta needs batch_size >= 2
    (dict(n_matrices=0), "n_matrices"),
    (dict(max_rel_std=0.0), "max_rel_std"), (dict(max_rel_drift=-0.1), "max_rel_drift"),
])
def test_bad_settings_name_the_setting(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}: "):
        LLCSettings(**kwargs)


def test_settings_round_trip_and_default_nbeta():
    s = LLCSettings(batch_size=1, n_matrices=4, nbeta=3.0)       # explicit nbeta: batch 1 is fine
    assert s.effective_nbeta == 3.0 and LLCSettings(**s.to_dict()) == s
    assert LLCSettings(batch_size=64).effective_nbeta == pytest.approx(64 / math.log(64))
    assert SMALL.n_steps == 30


@pytest.mark.parametrize("kwargs, name", [
    (dict(model="tiny"), "model"),
    (dict(groups="heads"), "groups"), (dict(groups=[]), "groups"), (dict(groups=[1]), "groups"),
    (dict(settings={"lr": 1e-4}), "settings"),
    (dict(seed=-1), "seed"), (dict(seed=1.5), "seed"),
])
def test_bad_arguments_name_the_argument(models, kwargs, name):
    kwargs = {"model": models[10000], "settings": SMALL, **kwargs}
    model = kwargs.pop("model")
    with pytest.raises(ValueError, match=rf"^{name}: "):
        llc(model, "tiny", **kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(groups=["mlp", "mlp"]), "groups"), (dict(groups=["nope"]), "groups"),
    (dict(settings=None), "settings"), (dict(seed=-3), "seed"),
])
def test_bad_measure_arguments_fail_when_the_measure_is_made(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}: "):
        llc_measure(**kwargs)


def test_missing_devinterp_names_the_extra(monkeypatch, models):
    for mod in [m for m in sys.modules if m == "devinterp" or m.startswith("devinterp.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "devinterp", None)      # import devinterp -> ImportError
    with pytest.raises(ImportError, match=r'pip install "tfmatcomp\[llc\]"'):
        llc(models[10000], "tiny", settings=SMALL)
    with pytest.raises(ImportError, match=r'pip install "tfmatcomp\[llc\]"'):
        llc_measure(SMALL)


def test_importing_the_package_does_not_import_devinterp():
    # a fresh interpreter: this session may have imported devinterp already
    code = ("import sys, tfmatcomp, tfmatcomp.analyses.dynamics, tfmatcomp.analyses.dynamics.llc\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'devinterp'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(tm.__file__).parents[1], check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


# ------------------------------------------------------------------- with devinterp
def test_default_nbeta_is_devinterps():
    needs_devinterp()
    from devinterp.utils import default_nbeta as devinterp_default

    for m in (2, 16, 64, 256):
        assert default_nbeta(m) == pytest.approx(devinterp_default(m))


def test_result_records_its_settings_and_leaves_the_model(models, pool):
    needs_devinterp()
    model = models[10000]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    r = llc(model, pool, settings=SMALL, seed=3)
    assert isinstance(r, LLCResult)
    assert r.settings == SMALL and r.seed == 3 and r.groups == ("all",)
    assert r.nbeta == SMALL.effective_nbeta and r.n_matrices == SMALL.n_matrices
    assert tuple(r.trace.shape) == (SMALL.n_chains, SMALL.n_steps)
    assert len(r.llc_per_chain) == SMALL.n_chains
    assert r.llc_mean == pytest.approx(sum(r.llc_per_chain) / SMALL.n_chains)
    # the definition: nbeta * (mean draw loss - init loss), per chain
    draws = r.trace.double()[:, SMALL.n_burnin:].mean(1)
    assert list(r.llc_per_chain) == pytest.approx((r.nbeta * (draws - r.init_loss)).tolist(),
                                                  rel=1e-5)
    d = r.to_dict()
    assert d["settings"] == SMALL.to_dict() and d["seed"] == 3 and "trace" not in d
    assert d["finite"] is True
    # every weight but the MASK row of W_E is sampled
    n_all = sum(p.numel() for p in model.parameters())
    assert r.n_params == n_all - model.cfg.d_model
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert torch.is_grad_enabled()


def test_same_seed_same_estimate(models, pool):
    needs_devinterp()
    a = llc(models[2000], pool, settings=SMALL, seed=0)
    b = llc(models[2000], pool, settings=SMALL, seed=0)
    c = llc(models[2000], pool, settings=SMALL, seed=1)
    assert torch.equal(a.trace, b.trace) and a.llc_mean == b.llc_mean
    assert not torch.equal(a.trace, c.trace)
    # the global RNG is not used: drawing from it between runs changes nothing
    torch.rand(10)
    assert torch.equal(llc(models[2000], pool, settings=SMALL, seed=0).trace, a.trace)
    # a task instead of a batch: the pool is drawn from the seed (the same matrices as `pool`)
    assert torch.equal(llc(models[2000], "tiny", settings=SMALL, seed=0).trace, a.trace)


@pytest.mark.parametrize("group", ["attention", "mlp", "embed", "readout", ["attn", "mlp"]])
def test_group_restricted_estimates(models, pool, group):
    needs_devinterp()
    model = models[10000]
    r = llc(model, pool, groups=group, settings=SMALL)
    names = group_parameter_names(model, group)
    params = dict(model.named_parameters())
    held = model.cfg.d_model if "embed.W_E" in names else 0    # the MASK row stays fixed
    assert r.n_params == sum(params[n].numel() for n in names) - held
    assert r.groups == (("attention", "mlp") if isinstance(group, list) else (group,))
    assert math.isfinite(r.llc_mean)


def test_stability_flag(models, pool):
    needs_devinterp()
    model = models[10000]
    loose = LLCSettings(**{**SMALL.to_dict(), "max_rel_std": 100.0, "max_rel_drift": 100.0})
    r = llc(model, pool, settings=loose)
    assert r.llc_mean > 0 and r.stable and r.problems == ()
    # the same chains judged by thresholds they cannot meet: unstable, and the reasons say why
    strict = LLCSettings(**{**SMALL.to_dict(), "max_rel_std": 1e-9, "max_rel_drift": 1e-9})
    s = llc(model, pool, settings=strict)
    assert s.llc_mean == r.llc_mean and not s.stable
    assert any("chains disagree" in p for p in s.problems)
    assert any("not flat" in p for p in s.problems)
    # a step size far too large: the chains run away to non-finite losses
    wild = LLCSettings(**{**loose.to_dict(), "lr": 1e4})
    w = llc(model, pool, settings=wild)
    assert not w.stable and math.isnan(w.llc_mean)
    assert any("not finite" in p for p in w.problems) and w.to_dict()["finite"] is False


def test_batch_smaller_than_the_pool_is_refused(models, pool):
    needs_devinterp()
    with pytest.raises(ValueError, match=r"^data: .*n_samples >= n_matrices"):
        llc(models[10000], pool[:8], settings=SMALL)


def test_measure_over_checkpoints(pool):
    needs_devinterp()
    df = over_checkpoints("tiny", {"llc": llc_measure(SMALL, ["all", "mlp"])}, n_samples=32,
                          steps=[2000, 10000])
    assert sorted(df["measure"].unique()) == [
        "llc.all", "llc.all.drift", "llc.all.stable", "llc.all.std",
        "llc.mlp", "llc.mlp.drift", "llc.mlp.stable", "llc.mlp.std"]
    assert df["step"].unique().tolist() == [2000, 10000]
    # the measure's value is llc() on the same batch and seed
    row = df[(df["step"] == 10000) & (df["measure"] == "llc.mlp")]["value"].item()
    direct = llc(tm.load_pretrained("tiny", step=10000), pool, groups="mlp", settings=SMALL)
    assert row == direct.llc_mean


def test_estimate_under_no_grad_is_the_same(models, pool):
    """A report computes its sections under torch.no_grad(); the sampler still gets gradients."""
    needs_devinterp()
    plain = llc(models[2000], pool, settings=SMALL)
    with torch.no_grad():
        inside = llc(models[2000], pool, settings=SMALL)
    assert inside.llc_per_chain == plain.llc_per_chain


# ------------------------------------------------------------------- the report's llc section
def test_report_llc_section_is_opt_in_and_measures_the_checkpoints(tmp_path, monkeypatch):
    needs_devinterp()
    from tfmatcomp.report import build_report, sections
    from tfmatcomp.report.sections import dynamics

    monkeypatch.setattr(dynamics, "LLC_SETTINGS", SMALL)
    monkeypatch.setattr(dynamics, "LLC_CHECKPOINTS", 3)
    assert "llc" in sections.SECTIONS and "llc" not in sections.DEFAULT_SECTIONS
    report = build_report("tiny", tmp_path / "r.html", n_samples=32, sections=["llc"],
                          progress=False)
    (s,) = report.sections
    assert s.error is None, s.error
    figure, table = s.items
    steps = table["step"].tolist()
    assert len(steps) == 3 and steps[0] == 2000 and steps[-1] == 10000  # pre-, around, post-shift
    # each value is llc() of that checkpoint on the report's fixed batch (seed 0, n_matrices)
    batch = sample_batch("tiny", SMALL.n_matrices, seed=0)
    direct = llc(tm.load_pretrained("tiny", step=steps[1]), batch, settings=SMALL, seed=0)
    assert table["LLC"].iloc[1] == pytest.approx(round(direct.llc_mean, 4))
    assert table["stable"].dtype == bool
    n_stable = int(table["stable"].sum())
    assert f"{n_stable} of 3 estimates are stable" in s.text
    assert "2 chains of 10 burn-in and 20 draws" in s.text and "Against the loss's onset" in s.text
    assert table.columns.tolist() == ["step", "LLC", "std over chains", "drift", "stable"]
    assert 'id="llc"' in report.path.read_text()


def test_report_llc_section_without_devinterp_names_the_extra(tmp_path, monkeypatch):
    from tfmatcomp.report import build_report

    for mod in [m for m in sys.modules if m == "devinterp" or m.startswith("devinterp.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "devinterp", None)      # import devinterp -> ImportError
    report = build_report("tiny", tmp_path / "r.html", n_samples=32, sections=["llc"],
                          progress=False)
    assert report.failed == ["llc"] and INSTALL_HINT in report.sections[0].error


def test_cli_llc_flag_adds_the_section_after_before_drop(monkeypatch, tmp_path):
    import tfmatcomp.report as report_pkg
    from tfmatcomp import cli

    seen = {}

    def fake_build_report(run, out, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(report_pkg, "build_report", fake_build_report)
    for argv, expected in (
            (["report", "tiny", "--llc", "-o", str(tmp_path / "a.html")], None),
            (["report", "tiny", "--llc", "--sections", "copying,training", "-o",
              str(tmp_path / "b.html")], ["training", "llc", "copying"]),
            (["report", "tiny", "-o", str(tmp_path / "c.html")], "default")):
        seen.clear()
        with pytest.raises(SystemExit):
            cli.main(argv)
        if expected == "default":
            assert seen["sections"] is None
        elif expected is None:
            keys = seen["sections"]
            assert keys[keys.index("before_drop") + 1] == "llc" and "decomposition" in keys
        else:
            assert seen["sections"] == expected
