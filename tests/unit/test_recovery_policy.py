"""Restart policy of `streamrl up` (streamrl/launch/recovery.py) and how deaths are described."""

import signal

from streamrl.config.files import load_config
from streamrl.config.schema import SupervisorConfig
from streamrl.launch.recovery import RestartPolicy
from streamrl.launch.supervisor import describe_exit


def test_backoff_doubles_and_caps():
    p = RestartPolicy(SupervisorConfig(backoff_s=0.5, backoff_max_s=3.0))
    assert [p.delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_trainer_restarts_only_when_configured():
    p = RestartPolicy(SupervisorConfig(max_restarts=2))
    assert p.allows("generator", 0) and p.allows("reward", 1) and not p.allows("reward", 2)
    assert not p.allows("trainer", 0) and "supervisor.restart_trainer=true" in p.refusal("trainer", 0)
    assert RestartPolicy(SupervisorConfig(restart_trainer=True)).allows("trainer", 0)
    off = RestartPolicy(SupervisorConfig(restart=False))
    assert not off.allows("feeder", 0) and "supervisor.restart=false" in off.refusal("feeder", 0)
    assert "max_restarts=2" in p.refusal("reward", 2)


def test_exit_descriptions_name_the_signal_and_oom_only_with_evidence():
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"  # kill -9, a runtime, ...: not "out of memory"
    assert describe_exit(-signal.SIGKILL, "killed by the kernel's OOM killer: out of memory (kernel log: ...)") == (
        "killed by SIGKILL — killed by the kernel's OOM killer: out of memory (kernel log: ...)"
    )
    assert describe_exit(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert describe_exit(3) == "exited with code 3"


def test_supervisor_and_checkpoint_settings_load():
    cfg = load_config(None, ["supervisor.backoff_s=0.1", "trainer.checkpoint_every=3"])
    assert cfg.supervisor.backoff_s == 0.1 and cfg.trainer.checkpoint_every == 3 and cfg.supervisor.restart


def test_no_restart_exit_code_is_never_restarted():
    from streamrl.core.errors import EXIT_NO_RESTART

    p = RestartPolicy(SupervisorConfig(restart_trainer=True))
    assert p.allows("reward", 0, code=1) and p.allows("trainer", 0, code=1)
    assert not p.allows("reward", 0, code=EXIT_NO_RESTART) and not p.allows("trainer", 0, code=EXIT_NO_RESTART)
    assert "restart would not fix" in p.refusal("reward", 0, code=EXIT_NO_RESTART)
