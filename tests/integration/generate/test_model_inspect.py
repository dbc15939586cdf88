"""vLLM inspects a model class new to the machine in this process, not in a fresh interpreter
(streamrl/generate/model_inspect.py): the real registry, a fresh modelinfo cache, no subprocess."""

from __future__ import annotations

import json

import pytest


def test_a_new_model_class_is_inspected_without_a_subprocess(tmp_path, monkeypatch):
    from vllm.model_executor.models import registry

    from streamrl.generate.model_inspect import models_inspected_here

    monkeypatch.setattr(registry._LazyRegisteredModel, "_get_cache_dir", staticmethod(lambda: tmp_path))

    def no_subprocess(fn):  # vLLM's own path: a fresh interpreter runs fn
        raise AssertionError("vLLM started a subprocess to inspect the model class")

    monkeypatch.setattr(registry, "_run_in_subprocess", no_subprocess)
    model = registry._LazyRegisteredModel(module_name="vllm.model_executor.models.llama", class_name="LlamaForCausalLM")
    with pytest.raises(AssertionError, match="subprocess"):  # outside the block: vLLM's own way
        model.inspect_model_cls()
    with models_inspected_here() as here:
        info = model.inspect_model_cls()
    assert here is True
    assert registry._run_in_subprocess is no_subprocess  # put back after the block
    assert info.is_text_generation_model is True and info.is_pooling_model is False  # read here, in this process
    cached = json.loads((tmp_path / "vllm-model_executor-models-llama-LlamaForCausalLM.json").read_text())
    assert cached["modelinfo"]["is_text_generation_model"] is True  # vLLM cached it as usual: the next start reads it
