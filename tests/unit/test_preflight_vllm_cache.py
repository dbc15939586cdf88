"""The pre-flight `import vllm` check remembers a success per install and re-checks any other one."""

from __future__ import annotations

import sys

from streamrl.config.schema import Config
from streamrl.launch.preflight import _vllm_install_key, check_vllm


def test_a_success_is_stamped_and_a_changed_install_is_checked_again(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))  # the install's own folder
    monkeypatch.setenv("STREAMRL_CACHE", str(tmp_path / "cache"))
    cfg = Config()
    assert cfg.generator.count > 0
    assert check_vllm(cfg) is None
    assert not (tmp_path / "cache").exists()  # remembered in the install, not in the job's cache
    stamps = list((tmp_path / "prefix" / ".streamrl-preflight").iterdir())
    assert [p.name for p in stamps] == [f"vllm-import-ok-{_vllm_install_key()}"]

    # A `vllm` that fails to import, first on the path (as PYTHONPATH puts it for the subprocess):
    # another install, so the stamp of the good one does not answer for it.
    shim = tmp_path / "shim"
    (shim / "vllm").mkdir(parents=True)
    (shim / "vllm" / "__init__.py").write_text('raise ImportError("broken vllm (test shim)")\n')
    monkeypatch.setenv("PYTHONPATH", f"{shim}:{sys.path[0]}")
    monkeypatch.syspath_prepend(str(shim))
    assert _vllm_install_key() != stamps[0].name.removeprefix("vllm-import-ok-")
    error = check_vllm(cfg)
    assert error is not None and "broken vllm (test shim)" in error
    assert len(list((tmp_path / "prefix" / ".streamrl-preflight").iterdir())) == 1  # a failure is never stamped


def _fake_install(site, version: str):
    """A vllm package with its dist-info in `site` (only its key is computed: it is never imported)."""
    (site / "vllm").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "__init__.py").write_text("")
    info = site / "vllm-0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")


def test_the_key_follows_the_vllm_install_not_the_repo_or_working_directory(tmp_path, monkeypatch):
    site, repo, cwd = tmp_path / "site", tmp_path / "repo", tmp_path / "cwd"
    for d in (repo, cwd):
        d.mkdir()
    _fake_install(site, "1.0")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(repo))  # PYTHONPATH=repo, as the tests and workers run
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", ["", *sys.path])  # `python -m`: the working directory first
    key = _vllm_install_key()

    # A git checkout, a new run directory, a test's files: the same install, so the stamp still answers.
    (repo / "streamrl_new_module.py").write_text("")
    (cwd / "runs").mkdir()
    monkeypatch.chdir(repo)
    assert _vllm_install_key() == key

    _fake_install(site, "2.0")  # vllm upgraded in place
    upgraded = _vllm_install_key()
    assert upgraded != key
    (site / "some_dependency").mkdir()  # a package installed (or removed) beside it
    assert _vllm_install_key() != upgraded
    moved = tmp_path / "elsewhere"
    site.rename(moved)  # the same vllm found at another location
    monkeypatch.syspath_prepend(str(moved))
    assert _vllm_install_key() not in (key, upgraded)
    plain = _vllm_install_key()
    (repo / "torch").mkdir()  # a copy of torch in the repo would be imported instead of the installed one
    assert _vllm_install_key() != plain
