"""The recorder's way into a user's launch (issue 37): the bundle's sitecustomize chains to the
image's own, never breaks an interpreter, loads nothing in a process that never imports SGLang,
and the switch turns the recorder off (a value neither on nor off is refused by the CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hicache_diag.engines.sglang.bundle import plugin_bundle
from hicache_diag.engines.sglang.plugin.config import production_config
from hicache_diag.evidence import recording as rec

PROBE = (
    "import json, os, sys; import sglang; "
    "from hicache_diag.engines.sglang.plugin import post_import as p; "
    "print(json.dumps({'mods': sorted(m for m in sys.modules if m.startswith('hicache_diag')), "
    "'patches': sorted(p._pending), 'session': os.environ.get('HICACHE_DIAG_RECORD_SESSION')}))"
)


@pytest.mark.parametrize(
    ("switch", "on"), [(None, True), ("1", True), ("0", False), ("OFF", False), ("false", False)]
)
def test_the_switch(tmp_path, switch, on):
    env = {rec.RECORD_DIR_ENV: str(tmp_path), rec.SESSION_ENV: "s1"}
    if switch is not None:
        env[rec.SWITCH_ENV] = switch
    config = production_config(env)
    assert config is not None and config.record is on and config.production
    assert config.session_dir == str(tmp_path / "s1") and config.faults == ()
    assert config.cpu_shims is False  # not unless asked for
    assert production_config({**env, rec.CPU_SHIMS_ENV: "1"}).cpu_shims is True
    assert production_config({rec.SESSION_ENV: "s1"}) is None  # no record dir: not recording


def test_the_first_process_names_the_session_for_all_it_starts(tmp_path, monkeypatch):
    monkeypatch.setenv(rec.RECORD_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(rec.SESSION_ENV, "")  # so that the name set below is undone after
    monkeypatch.delenv(rec.SESSION_ENV)
    config = production_config(os.environ)
    assert os.environ[rec.SESSION_ENV].endswith(f"-{os.getpid()}")
    assert config.session_dir == str(tmp_path / os.environ[rec.SESSION_ENV])
    assert production_config(os.environ).session_dir == config.session_dir  # a child's


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A bundle, an image's own sitecustomize, and a stand-in `sglang` package."""
    monkeypatch.setenv("HICACHE_DIAG_CACHE", str(tmp_path / "cache"))
    bundle = plugin_bundle()
    image = tmp_path / "image"
    (image / "sglang").mkdir(parents=True)
    (image / "sglang" / "__init__.py").write_text("")
    (image / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITE'] = 'ran'\n")
    return bundle, image


def _python(site, code: str, extra: dict[str, str], tmp_path, pythonpath=None):
    bundle, image = site
    env = {k: v for k, v in os.environ.items() if not k.startswith("HICACHE_DIAG_")}
    env["PYTHONPATH"] = pythonpath or os.pathsep.join([bundle.pythonpath(boot=True), str(image)])
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )


@pytest.mark.process
def test_the_images_own_sitecustomize_still_runs(site, tmp_path):
    code = "import os, sys; print(os.environ.get('IMAGE_SITE'), 'sitecustomize' in sys.modules)"
    done = _python(site, code, {rec.RECORD_DIR_ENV: str(tmp_path / "rec")}, tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["ran", "True"], done.stderr
    assert done.stderr == ""


@pytest.mark.process
def test_a_process_that_never_imports_sglang_loads_nothing_more(site, tmp_path):
    code = "import sys; print(sorted(m for m in sys.modules if m.startswith('hicache_diag')))"
    done = _python(site, code, {rec.RECORD_DIR_ENV: str(tmp_path / "rec")}, tmp_path)
    loaded = eval(done.stdout)  # noqa: S307 - our own print of a list of names
    assert "hicache_diag.engines.sglang.plugin.boot" not in loaded
    assert not [m for m in loaded if m.startswith("hicache_diag.evidence")]
    assert not (tmp_path / "rec").exists()


@pytest.mark.process
def test_sglangs_import_boots_the_recorder_and_the_switch_keeps_it_off(site, tmp_path):
    on = _python(site, PROBE, {rec.RECORD_DIR_ENV: str(tmp_path / "rec")}, tmp_path)
    report = json.loads(on.stdout)
    assert "sglang.srt.managers.scheduler" in report["patches"], on.stderr
    assert report["session"] and report["session"].rsplit("-", 1)[1].isdigit(), on.stderr
    assert not (tmp_path / "rec").exists()  # no scheduler ran: nothing written
    extra = {rec.RECORD_DIR_ENV: str(tmp_path / "rec"), rec.SWITCH_ENV: "off"}
    off = json.loads(_python(site, PROBE, extra, tmp_path).stdout)
    assert "hicache_diag.engines.sglang.plugin.boot" in off["mods"]  # read the switch...
    assert off["patches"] == []  # ...and patched nothing


@pytest.mark.process
def test_a_broken_image_sitecustomize_is_one_line_and_the_interpreter_goes_on(site, tmp_path):
    bundle, image = site
    (image / "sitecustomize.py").write_text("raise RuntimeError('image bug')\n")
    done = _python(site, "print('alive')", {rec.RECORD_DIR_ENV: str(tmp_path)}, tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "alive"
    assert done.stderr.splitlines() == [
        "hicache-diag: the image's own sitecustomize failed: RuntimeError: image bug"
    ]


@pytest.mark.process
def test_a_broken_plugin_never_breaks_an_interpreter(site, tmp_path):
    import shutil

    bundle, image = site
    broken = tmp_path / "broken"
    shutil.copytree(bundle.root, broken)
    start = broken / "lib" / "hicache_diag" / "engines" / "sglang" / "plugin" / "start.py"
    start.write_text("raise ImportError('half a bundle')\n")
    path = os.pathsep.join([str(broken / "site"), str(broken / "lib"), str(image)])
    done = _python(site, "print('alive')", {}, tmp_path, pythonpath=path)
    assert done.returncode == 0 and done.stdout.strip() == "alive"
    said = done.stderr.splitlines()
    assert said == ["hicache-diag: plugin not loaded: ImportError: half a bundle"]
