"""The three sources of a pretrained run, against a stand-in Hub on 127.0.0.1 (tests/hub_stand_in.py).

Every test runs under a guard that refuses any connection outside 127.0.0.1. The package's own
run folders (complete in a clone) are replaced by an empty or wheel-like folder, so that the files
have to come from the user's directory, the cache or the stand-in.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from huggingface_hub import constants

import tfmatcomp as tm
from tfmatcomp.pretrained import commands, sources
from tfmatcomp.pretrained.registry import run_entry
from tfmatcomp.report.run import load_context
from tfmatcomp.runs.layout import list_checkpoints

sys.path.insert(0, str(Path(__file__).parent))
from hub_stand_in import HubStandIn, serve_pretrained  # noqa: E402

REPO_PRETRAINED = Path(tm.__file__).resolve().parent / "pretrained"
STEP_FILE = "checkpoints/step_0002000/model.safetensors"
GUARD = '''
import socket
_connect = socket.socket.connect
def _guarded(self, address, _connect=_connect):
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] != "127.0.0.1":
        raise ConnectionRefusedError(f"test guard: {address!r} is outside 127.0.0.1; refused")
    return _connect(self, address)
socket.socket.connect = _guarded
socket.socket.connect_ex = lambda self, address: _guarded(self, address) or 0
'''


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Nothing in these tests may connect outside 127.0.0.1."""
    namespace: dict = {}
    real = (socket.socket.connect, socket.socket.connect_ex)
    exec(GUARD, namespace)
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex = real


@pytest.fixture()
def env(monkeypatch, tmp_path):
    """An empty package folder, an empty cache, the Hub online, no models directory."""
    package = tmp_path / "package"
    package.mkdir()
    monkeypatch.setattr(sources, "_PACKAGE", package)
    monkeypatch.setenv("TFMATCOMP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TFMATCOMP_MODELS_DIR", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "5")
    return tmp_path


def _use(monkeypatch, hub: HubStandIn) -> HubStandIn:
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    return hub


def test_the_guard_refuses_anything_outside_loopback():
    with pytest.raises(ConnectionRefusedError, match="test guard"):
        socket.create_connection(("192.0.2.1", 80), timeout=1)


def test_a_download_verifies_then_the_cache_answers_with_no_request(env, monkeypatch):
    with _use(monkeypatch, serve_pretrained(REPO_PRETRAINED)) as hub:
        model = tm.load_pretrained("tiny", step=2000)
        assert model.cfg.n_layers == 2
        assert ("GET", f"/tfmatcomp/tiny/resolve/v0.1.0/{STEP_FILE}", None) in hub.requests
        cached = env / "cache" / "tiny" / STEP_FILE
        assert cached.read_bytes() == (REPO_PRETRAINED / "tiny" / STEP_FILE).read_bytes()
        n = len(hub.requests)
        tm.load_pretrained("tiny", step=2000)
        assert len(hub.requests) == n  # a verified cache hit asks nothing


def test_one_flipped_byte_is_refused_and_the_download_removed(env, monkeypatch):
    with _use(monkeypatch, serve_pretrained(REPO_PRETRAINED, flip={STEP_FILE})):
        with pytest.raises(tm.pretrained.PretrainedFileRefused) as e:
            tm.load_pretrained("tiny", step=2000)
    assert STEP_FILE in str(e.value) and "does not match the registry" in str(e.value)
    assert not (env / "cache" / "tiny" / STEP_FILE).exists()


def test_a_file_missing_on_the_hub_is_named(env, monkeypatch, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(REPO_PRETRAINED / "tiny", repo)
    (repo / STEP_FILE).unlink()
    with _use(monkeypatch, HubStandIn({"tfmatcomp/tiny": repo})):
        with pytest.raises(tm.pretrained.PretrainedUnavailable, match=f"has no file '{STEP_FILE}'"):
            tm.load_pretrained("tiny", step=2000)


def test_a_missing_repository_is_named(env, monkeypatch):
    with _use(monkeypatch, HubStandIn({})):
        with pytest.raises(tm.pretrained.PretrainedUnavailable,
                           match="tfmatcomp/tiny@v0.1.0 .* does not exist"):
            tm.load_pretrained("tiny", step=2000)


def test_a_hub_that_never_answers_costs_one_request_and_a_clear_error(env, monkeypatch):
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "1")
    with _use(monkeypatch, serve_pretrained(REPO_PRETRAINED, silent=True)) as hub:
        with pytest.raises(tm.pretrained.PretrainedUnavailable) as e:
            tm.load_pretrained("tiny", step=2000)
        assert len(hub.requests) == 1  # one HEAD, none of huggingface_hub's retries
    text = str(e.value)
    assert "did not answer" in text and "HF_HUB_ETAG_TIMEOUT" in text and "\n" not in text
    assert "tfmatcomp models pull tiny" in text


def test_a_cut_transfer_is_resumed_from_where_it_stopped(env, monkeypatch):
    # huggingface_hub resumes from its last whole chunk (DOWNLOAD_CHUNK_SIZE, 10 MiB by default,
    # more than this file): smaller chunks let a 0.9 MiB file show it.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)
    cut = 300_000
    with _use(monkeypatch, serve_pretrained(REPO_PRETRAINED, cut={STEP_FILE: cut})) as hub:
        tm.load_pretrained("tiny", step=2000)
    gets = [r[2] for r in hub.requests if r[0] == "GET" and r[1].endswith(STEP_FILE)]
    assert len(gets) == 2 and gets[0] is None
    assert gets[1] == f"bytes={(cut >> 16) << 16}-"  # the bytes already written are kept
    assert (env / "cache" / "tiny" / STEP_FILE).read_bytes() == (
        REPO_PRETRAINED / "tiny" / STEP_FILE).read_bytes()


def test_offline_without_a_cache_says_in_one_line_how_to_get_the_run(env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with _use(monkeypatch, serve_pretrained(REPO_PRETRAINED)) as hub:
        with pytest.raises(tm.pretrained.PretrainedUnavailable) as e:
            tm.load_pretrained("paper-4l8h", step="post")
        assert hub.requests == []
    text = str(e.value)
    assert "\n" not in text and "'paper-4l8h'" in text and "HF_HUB_OFFLINE=1" in text
    size = sum(f.size for f in run_entry("paper-4l8h").step_files(50_000)) / (1 << 20)
    assert f"{size:.1f} MiB" in text
    for way in ("tfmatcomp models pull paper-4l8h", "TFMATCOMP_MODELS_DIR",
                str(env / "cache")):
        assert way in text


def test_offline_with_a_cache_loads_and_asks_nothing(env, monkeypatch):
    with _use(monkeypatch, serve_pretrained(REPO_PRETRAINED)) as hub:
        tm.load_pretrained("tiny", step=2000)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        n = len(hub.requests)
        assert tm.load_pretrained("tiny", step=2000).cfg.n_layers == 2
        assert len(hub.requests) == n


def test_a_bad_file_in_the_cache_is_removed_and_fetched_again(env, monkeypatch):
    with _use(monkeypatch, serve_pretrained(REPO_PRETRAINED)) as hub:
        tm.load_pretrained("tiny", step=2000)
        cached = env / "cache" / "tiny" / STEP_FILE
        data = bytearray(cached.read_bytes())
        data[1000] ^= 1
        cached.write_bytes(bytes(data))
        n = len(hub.requests)
        tm.load_pretrained("tiny", step=2000)
        assert len(hub.requests) > n
    assert cached.read_bytes() == (REPO_PRETRAINED / "tiny" / STEP_FILE).read_bytes()


@pytest.mark.parametrize("where", ["directory", "package"])
def test_a_bad_file_in_the_package_or_the_users_directory_is_refused_never_deleted(
        env, monkeypatch, where):
    folder = env / "package" if where == "package" else env / "mine"
    shutil.copytree(REPO_PRETRAINED / "tiny", folder / "tiny")
    data = bytearray((folder / "tiny" / STEP_FILE).read_bytes())
    data[1000] ^= 1
    (folder / "tiny" / STEP_FILE).write_bytes(bytes(data))
    if where == "directory":
        monkeypatch.setenv("TFMATCOMP_MODELS_DIR", str(folder))
    with _use(monkeypatch, serve_pretrained(REPO_PRETRAINED)) as hub:
        with pytest.raises(tm.pretrained.PretrainedFileRefused,
                           match="refused and left in place") as e:
            tm.load_pretrained("tiny", step=2000)
        assert hub.requests == []
    assert str(folder / "tiny" / STEP_FILE) in str(e.value)
    assert (folder / "tiny" / STEP_FILE).read_bytes() == bytes(data)


def test_a_models_directory_serves_the_run_without_the_hub(env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(tm.pretrained.PretrainedUnavailable):
        tm.load_pretrained("tiny", step=2000)
    assert tm.load_pretrained("tiny", step=2000, models_dir=REPO_PRETRAINED).cfg.n_layers == 2
    monkeypatch.setenv("TFMATCOMP_MODELS_DIR", str(REPO_PRETRAINED))  # a clone works as is
    assert tm.pretrained.run_dir("paper-cpu") == REPO_PRETRAINED / "paper-cpu"
    assert tm.pretrained.available()["paper-4l8h"].where == {
        "directory": run_entry("paper-4l8h").size}
    with pytest.raises(ValueError, match="models_dir: .* is not a directory"):
        tm.load_pretrained("tiny", models_dir=env / "nowhere")


def test_a_wheel_like_package_gives_paper_cpu_offline_and_pull_completes_it(env, monkeypatch):
    run = run_entry("paper-cpu")
    for f in run.files.values():  # what the wheel carries of paper-cpu
        if f.bundled:
            (env / "package" / "paper-cpu" / f.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO_PRETRAINED / "paper-cpu" / f.path,
                            env / "package" / "paper-cpu" / f.path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert tm.pretrained.available()["paper-cpu"].local_steps == [4_000, 30_000]
    folder = tm.pretrained.run_dir("paper-cpu")
    assert folder == env / "package" / "paper-cpu" and list(list_checkpoints(folder)) == [4_000, 30_000]
    with pytest.raises(tm.pretrained.PretrainedUnavailable, match="2 file"):
        tm.load_pretrained("paper-cpu", step=9_000)
    note = load_context("paper-cpu", n_samples=8).step_note  # the report says what is missing
    assert ("this copy of paper-cpu has checkpoints 4,000, 30,000 of its 5" in note
            and "`tfmatcomp models pull paper-cpu` fetches the rest" in note)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with _use(monkeypatch, serve_pretrained(REPO_PRETRAINED)) as hub:
        assert commands.pull_run("paper-cpu", steps=[9_000]) == 0
        got = {r[1].rsplit("/", 2)[-2] for r in hub.requests if r[0] == "GET"}
        assert got == {"step_0009000"}  # the bundled files were copied, not downloaded
        tm.pretrained.pull("paper-cpu")
    assert tm.pretrained.run_dir("paper-cpu") == env / "cache" / "paper-cpu"
    assert tm.pretrained.available()["paper-cpu"].where == {"bundled": sum(
        f.size for f in run.files.values() if f.bundled), "cache": sum(
        f.size for f in run.files.values() if not f.bundled)}


def test_an_exported_folder_served_back_pulls_and_verifies(env, monkeypatch, capsys):
    out = env / "export"
    assert commands.export_run("tiny", out, models_dir=REPO_PRETRAINED) == 0
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: tfmatcomp\n") and "step 10,000" in card
    entry = json.loads((out / "registry.json").read_text())["runs"]["tiny"]
    assert entry["files"][STEP_FILE]["sha256"] == run_entry("tiny").files[STEP_FILE].sha256
    with pytest.raises(ValueError, match="DIR: .* not an empty folder"):
        commands.export_run("tiny", out, models_dir=REPO_PRETRAINED)
    with _use(monkeypatch, HubStandIn({"tfmatcomp/tiny": out})):
        assert tm.pretrained.pull("tiny") == env / "cache" / "tiny"
    assert tm.pretrained.available()["tiny"].where == {"cache": run_entry("tiny").size}


def test_models_list_shows_each_run_its_size_and_where(env, monkeypatch, capsys):
    monkeypatch.setenv("TFMATCOMP_MODELS_DIR", str(REPO_PRETRAINED))
    assert commands.list_runs() == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "size", "pre", "post", "where"]
    assert lines[1].split()[:6] == ["paper-4l8h", "114.5", "MiB", "4000", "50000", "directory"]


def test_a_fresh_process_reads_hf_endpoint_and_hf_home_at_import(env, tmp_path):
    script = GUARD + textwrap.dedent(f"""
        import sys
        from pathlib import Path
        import tfmatcomp.pretrained.sources as s
        s._PACKAGE = Path({str(env / 'package')!r})
        import tfmatcomp as tm
        try:
            tm.load_pretrained("tiny", step=2000)
        except OSError as e:
            print("ERROR", e)
            sys.exit(3)
        print("OK")
    """)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("HF_", "TFMATCOMP_"))}
    with serve_pretrained(REPO_PRETRAINED) as hub:  # HF_HUB_OFFLINE: in CI's wheel-only steps
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             env={**base, "HF_ENDPOINT": hub.endpoint,
                                  "HF_HOME": str(tmp_path / "hf")})
        assert run.returncode == 0, run.stdout + run.stderr
        assert hub.requests
    assert (tmp_path / "hf" / "tfmatcomp" / "tiny" / STEP_FILE).is_file()


def test_the_models_command_lists_pulls_and_says_what_is_missing_in_one_line(env, monkeypatch,
                                                                              capsys):
    from tfmatcomp.cli import main

    assert main(["models", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[3].split()[-2:] == ["remote", "(tfmatcomp/tiny@v0.1.0)"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["models", "pull", "tiny", "--steps", "2000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tfmatcomp models: error: pretrained run 'tiny'") and "\n" not in err
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with _use(monkeypatch, serve_pretrained(REPO_PRETRAINED)):
        assert main(["models", "pull", "tiny", "--steps", "2000"]) == 0
    out = capsys.readouterr().out
    assert f"in {env / 'cache' / 'tiny'}" in out and "(was: remote; now: cache 2.0 MiB, remote 4.4 MiB;" in out
    assert main(["models", "export", "tiny", str(env / "x"), "--models-dir",
                 str(REPO_PRETRAINED)]) == 0
    assert (env / "x" / "README.md").is_file()
