"""What every e2e test shares: one STREAMRL_CACHE per pytest process.

Every `streamrl up` without model.path builds the tiny model into STREAMRL_CACHE on first use (about
3 s idle, more on a loaded 2-core CI machine, on the job's critical path). With a cache per test, each
of the ~25 e2e tests that start a job built it again; one temporary cache per session (per xdist
worker) builds it once. It is still a
temporary dir, never the user's ~/.cache, and the build is atomic (two jobs at once may both build it:
build_tiny_model renames into place). Tests pass os.environ on to their subprocesses, so they inherit it.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def streamrl_cache(tmp_path_factory: pytest.TempPathFactory):
    cache = tmp_path_factory.mktemp("streamrl-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STREAMRL_CACHE", str(cache))
        yield cache
