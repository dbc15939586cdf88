"""Multi-turn sample building: token-exact concatenation, loss mask, per-token versions, prefix rule."""

import numpy as np
import pytest

from streamrl.core.errors import DecodeError
from streamrl.core.messages import Observation, Rollout, StepRequest, decode, encode
from streamrl.generate.episode_sample import EpisodeSample, split_extension


def episode() -> EpisodeSample:
    s = EpisodeSample([1, 40])
    s.add_model([5, 6], [-0.5, -0.25], version=3)  # turn 1, weights v3
    s.add_observation([70, 71, 72])  # env answer
    s.add_model([7], [-1.0], version=3)  # turn 2 starts on v3 ...
    s.add_model([8, 9], [-2.0, -3.0], version=4)  # ... and a switch to v4 lands mid-turn
    s.add_observation([73])
    s.add_model([10], [-0.1], version=5)
    return s


def test_tokens_masks_and_logprobs_are_the_exact_concatenation():
    s = episode()
    assert s.context == [1, 40, 5, 6, 70, 71, 72, 7, 8, 9, 73, 10]
    assert s.loss_mask().tolist() == [1, 1, 0, 0, 0, 1, 1, 1, 0, 1]
    assert s.logprobs == [-0.5, -0.25, 0, 0, 0, -1.0, -2.0, -3.0, 0, -0.1]
    assert s.obs_spans == [[2, 5], [8, 9]] and s.env_tokens == 4 and s.model_tokens == 6
    assert len(s) == 12


def test_versions_switch_only_at_model_tokens_and_staleness_counts_the_oldest():
    s = episode()
    assert s.token_versions().tolist() == [3, 3, 3, 3, 3, 3, 4, 4, 4, 5]
    r = Rollout(rollout_id="g0:0", group_id="g0", sample=0, group_size=1, **s.rollout_fields())
    assert r.version == 3 and r.version_switches == [[6, 4], [9, 5]]
    assert r.token_versions().tolist() == s.token_versions().tolist()
    assert r.oldest_version() == 3
    assert r.token_mask().tolist() == s.loss_mask().tolist()


def test_rollout_with_obs_spans_round_trips_and_bad_spans_are_rejected():
    r = Rollout(rollout_id="g0:0", group_id="g0", sample=0, group_size=1, **episode().rollout_fields())
    back = decode(encode(r))
    assert back.obs_spans == [[2, 5], [8, 9]]
    assert back.token_mask().tolist() == r.token_mask().tolist()
    for spans in ([[5, 2]], [[2, 5], [4, 6]], [[0, 11]], [[-1, 2]], [[1.5, 2]], ["ab"]):
        r.obs_spans = spans
        with pytest.raises(DecodeError, match="obs_spans"):
            decode(encode(r))


def test_consecutive_observations_merge_and_an_episode_starts_with_the_model():
    s = EpisodeSample([1])
    with pytest.raises(ValueError, match="start with a model turn"):
        s.add_observation([4])
    s.add_model([5], [-1.0], 0)
    s.add_observation([6])
    s.add_observation([7, 8])
    s.add_observation([])
    assert s.obs_spans == [[1, 4]]
    with pytest.raises(ValueError, match="log-probs"):
        s.add_model([1, 2], [-1.0], 0)


def test_prefix_break_rule():
    history = [1, 5, 6, 7]
    assert split_extension(history, [1, 5, 6, 7, 9, 10]) == [9, 10]
    assert split_extension(history, history) == []
    # A template that re-rendered an earlier turn (6 -> 60), or a merge across the boundary (7 -> 77):
    assert split_extension(history, [1, 5, 60, 7, 9]) is None
    assert split_extension(history, [1, 5, 6, 77]) is None
    assert split_extension(history, [1, 5]) is None


def test_step_request_and_observation_round_trip_and_validate():
    req = StepRequest(
        episode_id="g1:0:ab",
        group_id="g1",
        sample=0,
        turn=1,
        item={"text": "?", "meta": {"cls": "x"}},
        actions=["a", "b"],
        reply_to="generator-0",
    )
    assert decode(encode(req)) == req
    obs = Observation(episode_id="g1:0:ab", turn=1, text="digits:", reward=0.5, done=True, env_worker="env-0")
    assert decode(encode(obs)) == obs
    for bad, why in ((dict(turn=0), "turn must equal"), (dict(actions=["a", 3]), "actions must be strings")):
        fields = {**req.__dict__, **bad}
        with pytest.raises(DecodeError, match=why):
            decode(encode(StepRequest(**fields)))
    for bad, why in (
        (dict(done=1), "done must be a bool"),
        (dict(reward=float("nan")), "NaN"),
        (dict(text=5), "text must be a string"),
        (dict(error_kind="x"), "error_kind"),
    ):
        with pytest.raises(DecodeError, match=why):
            decode(encode(Observation(**{**obs.__dict__, **bad})))


def test_episode_metrics_of_a_batch():
    from streamrl.generate.episode_sample import episode_metrics

    def r(**meta):
        return Rollout(
            rollout_id="g0:0",
            group_id="g0",
            sample=0,
            group_size=1,
            prompt_ids=np.array([1]),
            completion_ids=np.array([5]),
            logprobs=np.array([-1.0]),
            version=0,
            meta=meta,
        )

    m = episode_metrics([r(turns=2, env_step_s=[0.1, 0.3], env_tokens=5), r(turns=1, env_step_s=[0.2], env_tokens=0)])
    assert m["turns_mean"] == 1.5 and m["env_tokens"] == 5
    assert m["env_step_s_p50"] == pytest.approx(0.2) and 0.29 < m["env_step_s_p99"] <= 0.3
    single = r()  # no episode meta at all
    assert episode_metrics([single]) == {}


def test_an_episode_checkpoint_round_trips_and_continues_where_it_stopped():
    from streamrl.core.messages import EpisodeState

    s = episode()
    st = EpisodeState(
        episode_id="g0:0:a",
        group_id="g0",
        sample=0,
        turn=2,
        actions=["a", "b", "c"],
        texts=["a", "x", "b", "y", "c"],
        step_s=[0.1, 0.2],
        env_reward=1.5,
        counts={"tool_calls": 2, "tool_errors": 1},
        **s.rollout_fields(),
    )
    back = decode(encode(st), expect=EpisodeState)
    r = EpisodeSample.restore(
        back.prompt_ids, back.completion_ids, back.logprobs, back.version, back.version_switches, back.obs_spans
    )
    assert r.context == s.context and r.model_tokens == s.model_tokens
    assert np.array_equal(np.float32(r.logprobs), np.float32(s.logprobs))  # float32 on the wire, as in a rollout
    assert r.token_versions().tolist() == s.token_versions().tolist() and r.obs_spans == s.obs_spans
    r.add_observation([74])
    r.add_model([11], [-0.2], version=6)  # a generator on newer weights continues: one more switch
    assert r.switches == [[6, 4], [9, 5], [11, 6]] and r.loss_mask().tolist()[-2:] == [0, 1]
    assert back.actions == ["a", "b", "c"] and back.env_reward == 1.5
    assert back.counts == {"tool_calls": 2, "tool_errors": 1}  # a continued episode keeps its tool counts
    st.counts = {"tool_calls": float("nan")}
    with pytest.raises(DecodeError, match="episode_state.counts must map str to finite numbers"):
        decode(encode(st))
    st.counts = {}
    st.turn = 1
    with pytest.raises(DecodeError, match="turn must equal"):
        decode(encode(st))
