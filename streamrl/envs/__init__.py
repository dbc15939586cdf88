"""Environments of multi-turn episodes: the Env base, tools, adapters of other libraries, the sandbox (workers/env.py runs them)."""
