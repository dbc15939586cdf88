"""`streamrl scale ROLE=N ...`: change how many processes of a role a running `streamrl up` supervises.

    streamrl scale generator=2 reward=3 --run-dir runs/demo

Writes the desired counts to RUN_DIR/scale.json; the supervisor polls it (about twice a second),
starts the missing processes and sends SIGTERM to the surplus ones (highest index first), which
drain and leave; their pending entries are taken over by the remaining workers. Workers on other
hosts join with `streamrl worker ROLE` instead (they are not supervised by `up`). Once that `up`
has ended (RUN_DIR/up.lock is free), nothing is written and the run's summary is shown instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from streamrl.core.errors import ConfigError, StreamRLError
from streamrl.launch.rundir import describe_finished, finished_summary, is_live

NAME = "scale"
HELP = "change the number of supervised processes of a role in a running `streamrl up`"
DESCRIPTION = (
    "Set ROLE=N for generator, reward, reference, judge or env workers of the `streamrl up` running in --run-dir."
)


def add_arguments(p) -> None:
    p.add_argument(
        "counts", nargs="+", metavar="ROLE=N", help="e.g. generator=2 (roles: generator, reward, reference, judge, env)"
    )
    p.add_argument("--run-dir", required=True, help="run directory of the running `streamrl up`")


def parse_counts(items: list[str]) -> dict[str, int]:
    from streamrl.launch.supervisor import SCALABLE_ROLES

    out = {}
    for item in items:
        role, sep, n = item.partition("=")
        if not sep or role not in SCALABLE_ROLES or not n.isdigit():
            raise ConfigError(
                f"{item!r} is not ROLE=N with ROLE one of {', '.join(SCALABLE_ROLES)} and N >= 0, "
                "e.g. `streamrl scale generator=2`"
            )
        out[role] = int(n)
    return out


def write_counts(run_dir: Path, counts: dict[str, int]) -> dict[str, int]:
    """Merge `counts` into RUN_DIR/scale.json atomically (the supervisor never reads half a file)."""
    from streamrl.launch.supervisor import SCALE_FILE

    path = run_dir / SCALE_FILE
    current = json.loads(path.read_text()) if path.is_file() else {}
    merged = {**current, **counts}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(merged))
    os.replace(tmp, path)
    return merged


def run(args) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(
            f"{run_dir} is not the run directory of a `streamrl up` (no config.yaml); pass the "
            "--run-dir that `streamrl up` printed"
        )
    counts = parse_counts(args.counts)
    if not is_live(run_dir):
        summary = finished_summary(run_dir)
        raise StreamRLError(
            f"nothing scaled: {describe_finished(run_dir, summary)}"
            if summary is not None
            else f"nothing scaled: no `streamrl up` is running in {run_dir} (it was stopped or killed); "
            f"`streamrl up --resume {run_dir}` continues the run"
        )
    merged = write_counts(run_dir, counts)
    print(
        f"desired counts {merged}: the `streamrl up` in {run_dir} applies them within a second "
        f"(its output and logs/ show each worker that starts or leaves)"
    )
    return 0
