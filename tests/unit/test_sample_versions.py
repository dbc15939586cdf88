"""Per-token versions of one generator request (streamrl/generate/sample_stream.py `SampleStream`): by token index,
so a switch marked while tokens were still buffered in vLLM (generator.stream_interval) stamps them right.

    pytest tests/unit/test_sample_versions.py -q
"""

from __future__ import annotations

from streamrl.generate.sample_stream import SampleStream


def _sample(version: int, received: int) -> SampleStream:
    s = SampleStream(version)
    s.add(list(range(received)), [0.0] * received)
    return s


def test_tokens_buffered_at_a_switch_keep_the_old_version():
    s = _sample(2, received=5)
    s.switch_at(12, 3)  # the engine had made 12 tokens; 7 still buffered when it paused
    s.add(list(range(20)), [0.0] * 20)  # they arrive after the resume, with 13 new ones
    assert s.versions() == (2, [[12, 3]])


def test_a_switch_before_the_first_token_is_the_first_version():
    s = _sample(2, received=0)
    s.switch_at(0, 3)
    s.add([1, 2], [0.0, 0.0])
    assert s.versions() == (3, [])


def test_switches_with_no_token_between_keep_the_last():
    s = _sample(1, received=4)
    s.switch_at(6, 2)
    s.switch_at(6, 3)
    s.switch_at(9, 4)
    s.add(list(range(10)), [0.0] * 10)
    assert s.versions() == (1, [[6, 3], [9, 4]])


def test_a_switch_after_the_last_token_is_dropped():
    s = _sample(1, received=8)
    s.switch_at(8, 2)  # finished with all 8 made before the pause
    assert s.versions() == (1, [])


def test_one_output_at_the_end_is_stamped_by_the_counts_at_each_switch():
    # generator.stream_interval 0: nothing arrives before the end; two switches fell at 5 and 9.
    s = _sample(1, received=0)
    s.switch_at(5, 2)
    s.switch_at(9, 3)
    s.add(list(range(12)), [0.0] * 12)
    per_token = [1] * 5 + [2] * 4 + [3] * 3
    version, switches = s.versions()
    assert (version, switches) == (1, [[5, 2], [9, 3]])
    bounds = [(0, version), *map(tuple, switches), (len(per_token), None)]
    rebuilt = [v for (i, v), (j, _) in zip(bounds, bounds[1:]) for _ in range(j - i)]
    assert rebuilt == per_token
