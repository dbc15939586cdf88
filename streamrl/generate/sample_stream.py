"""One generator request's tokens as they stream in from vLLM, with the weights version of each
stretch (workers/generator.py keeps one per sample of a group and stamps the rollout from it).

    s = SampleStream(version=3); s.add(ids, logprobs)   # each delta
    s.switch_at(engine_token_count, 4)                   # at a weight switch, while the engine is paused
    first_version, switches = s.versions()               # Rollout.policy_version, version_switches
"""

from __future__ import annotations


class SampleStream:
    """Tokens of one request as they stream in, with the weights version of each stretch.

    Versions go by token index, not by when a delta arrives: with generator.stream_interval a
    delta consumed after a switch can still hold tokens the old weights made, so each switch marks
    the index the engine had reached when it paused (switch_at)."""

    def __init__(self, version: int) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.text: list[str] = []
        self.marks: list[list[int]] = [[0, version]]
        """[first token index, version] of each stretch, in order; the first starts at 0."""
        self.finish_reason = "length"

    def add(self, token_ids: list[int], logprobs: list[float]) -> None:
        self.token_ids += token_ids
        self.logprobs += logprobs

    def switch_at(self, index: int, version: int) -> None:
        """Tokens from `index` on are made by `version` (a switch paused the engine there)."""
        while self.marks[-1][0] >= index and len(self.marks) > 1:  # no token was made in between
            self.marks.pop()
        if self.marks[-1][0] >= index:
            self.marks[-1][1] = version
        elif self.marks[-1][1] != version:
            self.marks.append([index, version])

    def versions(self) -> tuple[int, list[list[int]]]:
        """(version of the first token, [[index, version] where the weights changed]) over the
        tokens received; marks at or past the last token (a switch after the request's end) drop."""
        n = len(self.token_ids)
        switches = [m for m in self.marks[1:] if m[0] < n]
        return self.marks[0][1], switches
