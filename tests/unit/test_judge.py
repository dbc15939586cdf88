"""The judge's pure parts: template rendering, score parsing, its config errors, and how the assembler
weighs and fails on its key (streamrl/annotate/judge.py, streamrl/config/judge.py, join_policy)."""

import numpy as np
import pytest

from streamrl.annotate.judge import JudgeError, parse_score, render
from streamrl.assemble.join_policy import JoinPolicy
from streamrl.config.files import load_config
from streamrl.config.schema import JudgeScore
from streamrl.core.errors import ConfigError
from streamrl.core.messages import Annotation
from streamrl.launch.supervisor import role_counts

JUDGE = "judge={model: {path: policy}, template: 'Q: {prompt} A: {completion}'}"


def test_render_replaces_only_the_placeholders_in_one_pass():
    template = 'Q: {prompt}\nA: {completion}\nRef: {reference}\nReply {"score": N}'
    got = render(template, "2+2?", "it is {reference} {prompt}", {"answer": 4})
    # A placeholder-looking string inside the completion stays as written; the template's JSON brace too.
    assert got == 'Q: 2+2?\nA: it is {reference} {prompt}\nRef: 4\nReply {"score": N}'


def test_render_without_a_reference_answer_is_that_rollouts_error():
    with pytest.raises(JudgeError, match=r"no reference answer.*remove \{reference\}"):
        render("{completion} vs {reference}", "p", "c", {"cls": "digits"})
    assert render("{completion}", "p", "c", {}) == "c"  # a template without {reference} needs none


@pytest.mark.parametrize(
    "regex, output, want",
    [
        (r"(\d+)", "I give it 7 out of 10", 7.0),
        (r"Score: (-?\d+(?:\.\d+)?)", "reasoning... Score: -2.5", -2.5),
        (r"(\w+) (?P<score>\d+)", "grade 8", 8.0),  # a named `score` group wins over group 1
        (r"([0-9])", "3", 3.0),
    ],
)
def test_regex_scores(regex, output, want):
    assert parse_score(JudgeScore(regex=regex), output) == want


@pytest.mark.parametrize(
    "spec, output, why",
    [
        ({"regex": r"Score: (\d+)"}, "no number here", "does not match"),
        ({"regex": r"Score: (\w+)"}, "Score: high", "not a number"),
        ({"regex": r"(\S+)"}, "nan", "is nan"),
        ({"json_field": "score"}, "Score: 7", "no JSON object"),
        ({"json_field": "score"}, '{"grade": 7}', "no field 'score'"),
        ({"json_field": "score"}, '{"score": "great"}', "not a number"),
        ({"json_field": "score"}, '{"score": true}', "not a number"),
        ({"json_field": "v.score"}, '{"v": 3}', "no field 'v.score'"),
    ],
)
def test_unparsable_output_is_a_judge_error_naming_the_output(spec, output, why):
    with pytest.raises(JudgeError, match=why) as err:
        parse_score(JudgeScore(**spec), output)
    assert repr(output[:20])[1:-1] in str(err.value) or output[:20] in str(err.value)


def test_json_field_reads_the_last_object_and_nested_fields():
    out = 'Example: {"score": 0}. My verdict: {"verdict": {"score": "8.5"}, "why": "ok {braces}"}'
    assert parse_score(JudgeScore(json_field="verdict.score"), out) == 8.5
    assert parse_score(JudgeScore(json_field="score"), 'x {"score": 0} y {"score": 3} z') == 3.0


@pytest.mark.parametrize(
    "override, fix",
    [
        ("judge={template: '{completion}'}", "set it to the judge model's folder"),
        ("judge={model: {path: policy}, template: 'Rate this.'}", "put {completion}"),
        ("judge={model: {path: policy}}", "does not contain {completion}"),
        (r"judge={model: {path: policy}, template: '{completion}', score: {regex: '\d+'}}", "wrap the number"),
        (r"judge={model: {path: policy}, template: '{completion}', score: {regex: '(\d'}}", "fix the pattern"),
        (
            "judge={model: {path: policy}, template: '{completion}', score: {regex: '(x)', json_field: s}}",
            "exactly one",
        ),
        ("judge={model: {path: policy}, template: '{completion}', key: reward}", "its own key"),
        ("judge={model: {path: policy}, template: '{completion}', max_tokens: 600}", "raise max_model_len"),
    ],
)
def test_bad_judge_config_fails_before_anything_starts_naming_the_fix(override, fix):
    with pytest.raises(ConfigError, match=fix.replace("{", r"\{").replace("}", r"\}")):
        load_config(None, [override])


def test_a_judge_section_starts_judges_and_makes_its_key_required():
    assert role_counts(load_config(None, []))["judge"] == 0
    cfg = load_config(None, [JUDGE, "judge.count=2", "loss.kl_beta=0"])
    assert role_counts(cfg)["judge"] == 2
    assert cfg.required_annotations() == ["reward", "judge"]
    assert load_config("configs/tiny-judge-cpu.yaml").required_annotations() == ["reward", "judge"]


def test_the_judges_key_is_weighted_into_the_reward_and_its_errors_follow_on_error():
    cfg = load_config(None, [JUDGE, "judge.weight=0.5", "annotations.reward_weight=0.25"])
    join = JoinPolicy(cfg)
    assert join.shape("judge") == "scalar"
    total = join.combine({"reward": np.array([1.0, 0.0], np.float32), "judge": np.array([2.0, 4.0], np.float32)})
    np.testing.assert_allclose(total, [0.25 + 1.0, 2.0])
    assert join.on_error("judge") == "fail"  # default judge.on_error=drop: the group fails
    bad = Annotation(rollout_id="g:0:n", key="judge", value=0.0, producer="judge-0", error="no match")
    scored = JoinPolicy(load_config(None, [JUDGE, "judge.on_error=score", "judge.error_value=-1"]))
    assert scored.on_error("judge") == "default" and scored.value(bad) == -1.0


def test_judges_scale_and_their_group_holds_back_trimming():
    from streamrl.commands.scale import parse_counts
    from streamrl.core.trimming import stream_groups

    assert parse_counts(["judge=2", "generator=1"]) == {"judge": 2, "generator": 1}
    cfg = load_config("configs/tiny-judge-cpu.yaml")
    # rollouts are trimmed only below what the judges consumed too (else a lagging judge loses input)
    assert "judge" in stream_groups(cfg)[f"streamrl:{cfg.run.name}:rollouts"]
    assert "judge" not in stream_groups(load_config(None, []))["streamrl:tiny:rollouts"]


def test_a_judge_model_folder_that_is_not_one_fails_preflight(tmp_path, monkeypatch):
    from streamrl.launch.preflight import check_judge_model

    def check(path: str) -> str | None:
        return check_judge_model(load_config(None, [JUDGE, f"judge.model.path={path}"]))

    assert "is not a directory" in check(str(tmp_path / "nope")) and "judge.model.path=policy" in check(
        str(tmp_path / "nope")
    )
    assert "has no config.json" in check(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert check(str(tmp_path)) is None and check("policy") is None
    # a hub id not in the local cache while offline: refused before start, naming the download
    # (one in the cache passes: tests/integration/launch/test_preflight_user_code.py)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    refused = check("Qwen/Qwen3-1.7B")
    assert "not in the local cache" in refused and "hf download Qwen/Qwen3-1.7B" in refused, refused
