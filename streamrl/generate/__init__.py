"""The generate stage: the vLLM engine, multi-turn episodes, loop profiling (workers/generator.py runs it); the judge's engine (workers/judge.py)."""
