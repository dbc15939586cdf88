"""model.path resolution: local folders are checked, hub ids pass through, nothing is downloaded."""

from pathlib import Path

import pytest

from streamrl.config.schema import ModelConfig
from streamrl.core.errors import ConfigError
from streamrl.models.tiny import resolve_model_path


def test_hub_id_passes_through_untouched(tmp_path):
    assert resolve_model_path(ModelConfig(path="Qwen/Qwen3-1.7B"), tmp_path, 0) == Path("Qwen/Qwen3-1.7B")
    assert list(tmp_path.iterdir()) == []


def test_missing_local_folder_names_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="not a directory"):
        resolve_model_path(ModelConfig(path=str(tmp_path / "nope")), tmp_path, 0)


def test_folder_without_config_json(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match="config.json"):
        resolve_model_path(ModelConfig(path=str(tmp_path / "m")), tmp_path, 0)
