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
