"""structlog setup: JSON lines to RUN_DIR/logs/<role>-<id>.jsonl, readable lines on stderr.

log = setup_logging("generator", "generator-0", run_dir, run="tiny")
log.info("weights_loaded", policy_version=3, seconds=0.02)
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import structlog


def setup_logging(role: str, worker_id: str, run_dir: Path | None, level: str = "info", **context):
    """Configure structlog once per process and return a logger bound to role/worker/run."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handlers: list[logging.Handler] = []
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=structlog.dev.ConsoleRenderer(colors=False), foreign_pre_chain=shared
        )
    )
    handlers.append(console)
    if run_dir is not None:
        log_dir = Path(run_dir) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(log_dir / f"{worker_id}.jsonl")
        fh.setFormatter(
            structlog.stdlib.ProcessorFormatter(processor=structlog.processors.JSONRenderer(), foreign_pre_chain=shared)
        )
        handlers.append(fh)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(lvl)
    structlog.configure(
        processors=shared + [structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        cache_logger_on_first_use=False,
    )
    return structlog.get_logger("streamrl").bind(role=role, worker_id=worker_id, **context)
