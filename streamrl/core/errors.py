"""The error hierarchy: every message says what happened and what to do about it."""


class StreamRLError(Exception):
    """Base class for errors raised by streamrl."""


class ConfigError(StreamRLError, ValueError):
    """A configuration value is missing, malformed or inconsistent."""


class DecodeError(StreamRLError, ValueError):
    """A stream entry could not be decoded or validated (it goes to the dead-letter stream)."""


class BrokerError(StreamRLError, RuntimeError):
    """The broker is unreachable or answered in a way streamrl cannot work with."""


class WorkerDied(StreamRLError, RuntimeError):
    """A supervised role exited unexpectedly."""


class FatalError(StreamRLError, RuntimeError):
    """An error a restart would not fix (a broken config or environment found when a role starts, a job
    in which nothing can be trained): the role exits with EXIT_NO_RESTART and `streamrl up` stops the job."""


EXIT_NO_RESTART = 78
"""Exit code of a role process that stopped on a FatalError (sysexits' EX_CONFIG). The supervisor's
restart policy (streamrl/launch/recovery.py) never restarts it: every restart would fail the same way."""

EXIT_ENGINE_START_HUNG = 75
"""Exit code of a role process whose vLLM engine did not start within its start_timeout_s (sysexits'
EX_TEMPFAIL; streamrl/generate/start_watchdog.py). The supervisor restarts it with its engine started
by spawn, never fork (VLLM_WORKER_MULTIPROC_METHOD=spawn), and quotes its ENGINE_HUNG_PREFIX line."""
ENGINE_HUNG_PREFIX = "engine start hung: "
"""How such a process prints, last on stderr, the phase its engine hung in."""

NOT_TRANSIENT = (ImportError, ConfigError, FileNotFoundError)
"""Errors that, raised while a role starts, mean its config or environment is wrong (not a crash)."""
