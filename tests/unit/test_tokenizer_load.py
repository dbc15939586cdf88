"""streamrl.models.tokenizer: for every model type it loads directly, the tokenizer is the one
AutoTokenizer gives (class, vocabulary, special tokens, chat template, encodings, rendered chats);
loading it (and importing the feeder) does not import torch; other folders go through AutoTokenizer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from streamrl.config.model import TinyModelConfig
from streamrl.models.shapes import build_random_model
from streamrl.models.tiny import build_tiny_model
from streamrl.models.tokenizer import GENERIC_MODEL_TYPES, load_tokenizer, loads_directly

TEXTS = ["hello world", "  two  spaces\nand a line", "<s>a b c</s>", "12+30=42 ünïcödé"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, object]:
    """One model folder per directly loaded type: the tiny models (llama; with and without the chat
    template) and a random-weight Qwen3 shape."""
    root = tmp_path_factory.mktemp("models")
    return {
        "llama": build_tiny_model(TinyModelConfig(), root / "tiny", seed=0),
        "llama-chat": build_tiny_model(TinyModelConfig(chat_template=True), root / "tiny-chat", seed=0),
        "qwen3": build_random_model("qwen3-tiny", root / "qwen3", dtype="float32"),
    }


def test_every_directly_loaded_type_is_covered(folders):
    types = {json.loads((p / "config.json").read_text())["model_type"] for p in folders.values()}
    assert types == GENERIC_MODEL_TYPES


@pytest.mark.parametrize("name", ["llama", "llama-chat", "qwen3"])
def test_the_direct_load_is_autotokenizers_tokenizer(folders, name):
    from transformers import AutoTokenizer

    path = folders[name]
    assert loads_directly(path)
    auto, direct = AutoTokenizer.from_pretrained(str(path)), load_tokenizer(path)
    assert type(direct) is type(auto)
    assert direct.get_vocab() == auto.get_vocab()
    assert direct.all_special_tokens == auto.all_special_tokens
    assert (direct.bos_token, direct.eos_token, direct.pad_token) == (auto.bos_token, auto.eos_token, auto.pad_token)
    assert direct.chat_template == auto.chat_template
    for text in TEXTS:
        for special in (True, False):
            assert (
                direct(text, add_special_tokens=special)["input_ids"]
                == auto(text, add_special_tokens=special)["input_ids"]
            )
    if auto.chat_template:
        chat = [{"role": "user", "content": "2+2?"}]
        assert direct.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
            auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        )


def test_other_folders_go_through_autotokenizer(folders, tmp_path):
    named = tmp_path / "named"
    named.mkdir()
    for f in folders["qwen3"].iterdir():
        (named / f.name).write_bytes(f.read_bytes())
    conf = json.loads((named / "tokenizer_config.json").read_text())
    (named / "tokenizer_config.json").write_text(json.dumps({**conf, "tokenizer_class": "Qwen2Tokenizer"}))
    assert not loads_directly(named)  # a specific class: AutoTokenizer's mapping decides
    model = json.loads((folders["llama"] / "config.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    for f in folders["llama"].iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    (other / "config.json").write_text(json.dumps({**model, "model_type": "qwen2"}))
    assert not loads_directly(other)  # qwen2: AutoTokenizer overrides the Hub's class
    assert not loads_directly("Qwen/Qwen3-0.6B")  # a hub id


def test_the_feeder_tokenizes_without_importing_torch(folders):
    code = (
        "import sys, workers.feeder\n"
        "from streamrl.models.tokenizer import load_tokenizer\n"
        f"t = load_tokenizer({str(folders['llama'])!r})\n"
        "assert t('abc', add_special_tokens=False)['input_ids']\n"
        "print('torch' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "False"
