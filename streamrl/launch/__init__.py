"""Launching a job: the supervisor, pre-flight checks, run directories, recovery, a role process's composition root."""
