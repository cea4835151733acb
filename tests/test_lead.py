"""Lead times: when a measure leaves its plateau, against the loss's onset."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tfmatcomp.analyses.dynamics import (departure_step, detect_drop, lead_time_summary,
                                         lead_times, over_checkpoints, row_column_attention_mass)
from tfmatcomp.cli import main as cli_main
from tfmatcomp.training.trainer import read_metrics
from tfmatcomp import pretrained

STEPS = [0, 250, 500, 750, 1000, 1250, 1500, 1750, 2000]


def test_departure_is_where_it_stays_moved():
    rising = [0.1, 0.1, 0.1, 0.1, 0.2, 0.5, 0.9, 1.0, 1.0]
    assert departure_step(STEPS, rising, onset=1500) == 1000
    # a wander away and back on the plateau does not count
    wander = [0.1, 0.1, 0.6, 0.1, 0.2, 0.5, 0.9, 1.0, 1.0]
    assert departure_step(STEPS, wander, onset=1500) == 1000
    # falling measures depart the same way; the order of the rows does not matter
    falling = [1 - v for v in rising]
    assert departure_step(STEPS[::-1], falling[::-1], onset=1500) == 1000
    # the threshold is a fraction of the way
    assert departure_step(STEPS, rising, onset=1500, fraction=0.5) == 1500  # (0.5-0.1)/0.9 < 0.5


def test_no_departure_without_change():
    assert departure_step(STEPS, [3.0] * len(STEPS), onset=1000) is None


@pytest.mark.parametrize("kwargs, match", [
    (dict(steps=[], values=[], onset=1), "non-empty"),
    (dict(steps=[1, 2], values=[1.0], onset=1), "equal"),
    (dict(steps=[1, 2], values=[1.0, 2.0], onset=1, fraction=0), "fraction"),
    (dict(steps=[1, 2], values=[1.0, 2.0], onset=1, fraction=1.5), "fraction"),
])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        departure_step(**kwargs)


def test_lead_times_of_the_bundled_run():
    table = over_checkpoints("tiny", {"attn": row_column_attention_mass}, n_samples=32)
    leads = lead_times(table, "tiny")
    onset = detect_drop(read_metrics(pretrained.run_dir("tiny"))).drop_start
    assert set(leads["onset"]) == {onset}
    row = leads.set_index("measure").loc["attn.max_head"]
    series = table[table["measure"] == "attn.max_head"]
    assert row["departure"] == departure_step(series["step"], series["value"], onset)
    assert row["lead"] == pytest.approx(onset - row["departure"])
    summary = lead_time_summary(leads).set_index("measure")
    assert summary.loc["attn.max_head", "seeds"] == 1
    assert summary.loc["attn.max_head", "median_lead"] == pytest.approx(row["lead"])


def test_lead_times_refuses_another_table():
    with pytest.raises(ValueError, match="over_checkpoints"):
        lead_times(pd.DataFrame({"step": [1]}), "tiny")


def test_summary_over_seeds():
    leads = pd.DataFrame({"seed": [0, 1, 2, 3], "measure": "m",
                          "lead": [-100.0, 200.0, 400.0, np.nan]})
    row = lead_time_summary(leads).iloc[0]
    assert (row["seeds"], row["median_lead"], row["min"], row["max"], row["before"]) == (
        3, 200.0, -100.0, 400.0, 2)


def test_cli_writes_the_leads(tmp_path, capsys):
    out = tmp_path / "tiny.dynamics.csv"
    assert cli_main(["dynamics", "tiny", "--measures", "row_column_attention_mass",
                     "--samples", "16", "--lead", "-o", str(out)]) == 0
    leads = pd.read_csv(tmp_path / "tiny.lead.csv")
    assert list(leads.columns)[:5] == ["seed", "measure", "onset", "departure", "lead"]
    assert "median_lead" in capsys.readouterr().out


def test_report_section_before_the_drop(tmp_path):
    from tfmatcomp.report import build_report

    report = build_report("tiny", tmp_path / "r.html", n_samples=32, sections=["before_drop"],
                          progress=False)
    (s,) = report.sections
    assert s.error is None, s.error
    figure, summary = s.items
    assert "step 4,889" in s.text and "moved before the loss" in s.text
    table = over_checkpoints("tiny", {"row_column_attention_mass": row_column_attention_mass},
                             n_samples=32)
    expected = lead_times(table, "tiny").set_index("measure")["lead"]
    got = summary.set_index("measure")["median_lead"]
    assert got["row_column_attention_mass.max_head"] == pytest.approx(
        round(expected["row_column_attention_mass.max_head"]))
    assert f"by {round(expected['row_column_attention_mass.max_head']):,} steps" in s.text
    assert 'id="before_drop"' in report.path.read_text()


def test_report_section_without_a_drop(tmp_path):
    import tfmatcomp as tm
    from tfmatcomp.report import build_report

    run = tmp_path / "flat"
    tm.train("tiny", n_steps=40, batch_size=8, log_every=10, checkpoint_every=20, out_dir=run,
             progress=False)
    report = build_report(run, tmp_path / "r.html", n_samples=8, sections=["before_drop"],
                          progress=False)
    (s,) = report.sections
    assert s.error is None and "No drop was detected" in s.text


def test_report_section_says_why_with_no_checkpoint_inside_the_drop(tmp_path):
    """paper-4l8h bundles steps 4,000 and 50,000 only: no lead can be timed, and the section says
    so instead of printing leads as long as the run."""
    import shutil

    import tfmatcomp as tm
    from tfmatcomp.report import build_report

    run = tmp_path / "two"
    shutil.copytree(tm.pretrained.run_dir("tiny"), run, ignore=shutil.ignore_patterns("group"))
    for step in (4000, 5000, 6000, 7000):  # keep 2,000 (pre-shift) and 10,000 (post-shift)
        shutil.rmtree(run / "checkpoints" / f"step_{step:07d}")
    report = build_report(run, tmp_path / "r.html", n_samples=8, sections=["before_drop"],
                          progress=False)
    (s,) = report.sections
    assert s.error is None and not s.items
    assert "Not computed" in s.text and "steps 2,000, 10,000 only" in s.text
