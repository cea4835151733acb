"""The report and demo commands, the bundled run, and the report in a headless browser."""

import os
import re
import shutil
import subprocess

import pytest

import tfmatcomp as tm
from tfmatcomp.analyses.dynamics import detect_drop
from tfmatcomp.report import build_report
from tfmatcomp.report.sections import DEFAULT_SECTIONS, OPT_IN_SECTIONS


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    return build_report("tiny", out, n_samples=32, progress=False)


def test_bundled_run_shows_and_detects_the_drop():
    info = tm.pretrained.run_info("tiny")
    steps = tm.pretrained.available()["tiny"].steps
    assert info["pre_shift_step"] in steps and info["post_shift_step"] == steps[-1]
    drop = detect_drop(tm.read_metrics(tm.pretrained.run_dir("tiny")), column="eval_L_mask")
    assert drop.has_drop
    assert info["pre_shift_step"] < drop.drop_start < drop.drop_end < info["post_shift_step"]
    assert drop.final_level < drop.plateau_level / 2
    pre, post = tm.load_pretrained("tiny", step="pre"), tm.load_pretrained("tiny", step="post")
    assert pre.cfg == post.cfg == tm.get_preset("tiny").model
    with pytest.raises(ValueError, match="step"):
        tm.load_pretrained("tiny", step=123)
    with pytest.raises(ValueError, match="name"):
        tm.load_pretrained("huge")


def test_report_has_every_section_and_no_failure(tiny_report):
    assert tiny_report.failed == []
    text = tiny_report.path.read_text()
    for key in DEFAULT_SECTIONS:
        assert f'id="{key}"' in text
    for key in OPT_IN_SECTIONS:  # computed only when asked for (the llc extra, minutes)
        assert f'id="{key}"' not in text
    n_figures = text.count('class="plotly-graph-div"')
    assert n_figures >= 25
    assert text.count("plotly.js v") == 1 or "Plotly" in text  # plotly.js embedded once
    assert "This section failed" not in text


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_renders_in_a_headless_browser(tiny_report):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium (.ci/run does) to check the report renders")
        pytest.skip("chromium is not installed")
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=30000", "--dump-dom", tiny_report.path.as_uri()],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines()
              if "CONSOLE" in line and re.search(r"Uncaught|Error", line)]
    assert errors == []
    n_figures = tiny_report.path.read_text().count('class="plotly-graph-div"')
    rendered = proc.stdout.count('class="main-svg"')
    assert rendered >= n_figures  # plotly draws at least one main-svg per figure it renders


def test_cli_report_and_bundled_demo(tmp_path):
    from tfmatcomp.cli import main

    out = tmp_path / "r.html"
    assert main(["report", "tiny", "-o", str(out), "--sections", "training", "--no-progress"]) == 0
    assert "Training: plateau and sudden drop" in out.read_text()
    out2 = tmp_path / "demo.html"
    assert main(["demo", "--bundled", "-o", str(out2), "--sections", "training,copying",
                 "--samples", "16", "--no-progress"]) == 0
    assert "Copying check" in out2.read_text()
    with pytest.raises(SystemExit):
        main(["report", "tiny", "--sections", "nope"]) if False else main(["report"])


def test_report_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="run"):
        build_report(tmp_path / "nothing", tmp_path / "x.html", progress=False)
    with pytest.raises(ValueError, match="sections"):
        build_report("tiny", tmp_path / "x.html", sections=["nope"], progress=False)
    with pytest.raises(ValueError, match="pre_step"):
        build_report("tiny", tmp_path / "x.html", pre_step=7, sections=["training"], progress=False)


# ------------------------------------------------------------ honesty and seed groups
def test_choose_steps_takes_pre_shift_from_the_plateau():
    import numpy as np

    from tfmatcomp.report import choose_steps

    ckpts = {s: str(s) for s in range(500, 10_001, 500)}
    t = np.arange(0, 10_000, 50.0)
    dropped = detect_drop(t, 10 ** (-2 + 1 / (1 + np.exp((t - 6_000) / 100))))
    pre, post, note = choose_steps(ckpts, dropped)
    assert post == 10_000 and pre <= 0.5 * dropped.drop_start and pre == 2_500
    assert "plateau" in note
    flat = detect_drop(t, 0.11 + 0 * t)
    pre, _, note = choose_steps(ckpts, flat)
    assert pre == 5_000 and "no drop" in note          # half-way, never the first checkpoint


@pytest.fixture(scope="module")
def undropped_group(tmp_path_factory):
    """Two seeds trained briefly: both still on the plateau."""
    out = tmp_path_factory.mktemp("group")
    tm.train_many("tiny", seeds=[1, 2], n_steps=240, batch_size=16, log_every=10,
                  checkpoint_every=40, out_dir=out, device="cpu", progress=False,
                  model_cfg=tm.EncoderConfig(n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=16))
    return out


def test_report_without_a_drop_says_so_and_what_to_do(undropped_group, tmp_path):
    report = build_report(undropped_group, tmp_path / "r.html", n_samples=16, progress=False,
                          sections=["training"])
    text = report.path.read_text()
    training = report.sections[0].text
    assert "No sudden drop was detected" in training and "--resume" in training
    assert "drop detected" not in text.lower().replace("no sudden drop was detected", "")
    assert "dashed line marks" not in training
    assert "None of the 2 seeds" in training
    assert "seed 1" in text and "seed 2" in text       # every seed's curve is drawn
    assert "pre-shift step 40," not in text            # not the first checkpoint


def test_report_on_a_group_analyses_a_seed_that_dropped(undropped_group, tmp_path):
    """A group whose seed 0 is the bundled run (it dropped) and whose seeds 1, 2 did not."""
    group = tmp_path / "group"
    shutil.copytree(undropped_group, group)
    shutil.copytree(tm.pretrained.run_dir("tiny"), group / "seed-0")
    (group / "seed-0" / "pretrained.json").unlink()
    (group / "seeds.json").write_text('{"seeds": [0, 1, 2]}')
    report = build_report(group, tmp_path / "r.html", n_samples=16, progress=False,
                          sections=["training"])
    training = report.sections[0].text
    assert "1 of 3 seeds dropped" in training and "analyses seed 0" in training
    assert "Sudden drop detected" in report.path.read_text()


def test_demo_trains_and_reports_honestly(tmp_path, capsys):
    """The demo's own path, briefly: far too short to look for a drop, and the report says so."""
    from tfmatcomp.cli import main

    out = tmp_path / "demo.html"
    assert main(["demo", "--run-dir", str(tmp_path / "runs"), "--steps", "60", "--seeds", "0-1",
                 "--device", "cpu", "-o", str(out), "--sections", "training", "--samples", "16",
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "0 of 2 seeds dropped" in printed
    # tiny ships a bundled run: the demo says how to report on it instead of training
    assert "60 steps per seed" in printed and "demo --preset tiny --bundled" in printed
    text = out.read_text()
    assert "long enough to look for a drop" in text and "Sudden drop detected" not in text


def test_report_names_the_typical_seed_only_when_it_analyses_it(tmp_path):
    """The bundled run is seed 0 (the seed the demo trains), not necessarily its group's typical
    seed; the report must not call seed 0 the median seed when another one is."""
    from tfmatcomp.report import SeedGroup

    run = tm.pretrained.run_dir("tiny")
    group = SeedGroup.load(run / "group")
    typical = group.typical_seed()
    report = build_report(run, tmp_path / "r.html", n_samples=16, progress=False,
                          sections=["training"])
    training = report.sections[0].text
    if typical == 0:
        assert "analyses seed 0, the seed whose onset is the median" in training
    else:
        assert "analyses seed 0, the seed whose onset" not in training
        assert f"the seed whose onset is the median of those that dropped is seed {typical}" in training


def test_report_says_which_middle_seed_of_an_even_count(tmp_path):
    """Of an even number of dropped seeds the median onset lies between two seeds; the report
    names the one it takes (the earlier) instead of calling either the median."""
    from tfmatcomp.report import SeedGroup

    run = tm.pretrained.run_dir("paper-cpu")
    group = SeedGroup.load(run / "group")
    report = build_report(run, tmp_path / "r.html", n_samples=16, progress=False,
                          sections=["training"])
    training = report.sections[0].text
    assert f"seed {group.typical_seed()}" in training
    assert (len(group.dropped) % 2 == 0) == ("the earlier of the two middle ones" in training)


def test_the_pages_templates_escape_what_they_are_given_and_ship_in_the_wheel():
    """report/templates/ renders with autoescaping (a title, a section's text and error, and a run
    directory's name are text, never markup), and setup.py's package data ships every template."""
    import fnmatch
    import importlib.util
    from pathlib import Path

    from tfmatcomp.report.render import page
    from tfmatcomp.report.sections import Section

    s = Section("k", "<i>t</i>", text="a < b & 'c'", error="<script>x</script>")
    html = page("<b>title</b>", "<p class='meta'>trusted header</p>", [s])
    assert "<b>title</b>" not in html and "&lt;b&gt;title&lt;/b&gt;" in html
    assert "a &lt; b &amp; &#39;c&#39;" in html and "<script>x</script>" not in html
    assert "<p class='meta'>trusted header</p>" in html and "<i>t</i>" not in html

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("tfmatcomp_setup", root / "setup.py")
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)  # not __main__: setup() does not run
    globs = setup.PACKAGE_DATA
    templates = sorted((root / "tfmatcomp" / "report" / "templates").iterdir())
    assert templates
    for t in templates:
        rel = t.relative_to(root / "tfmatcomp").as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is not package data"
