"""`streamrl env` / `streamrl reward` flags that set a config field default to that section's value
(one source of truth, streamrl/config/): unset, the section decides; given, the flag does. The same for
the @producer decorator and ProducerSpec.
"""

from __future__ import annotations

from streamrl.cli import build_parser
from streamrl.commands.env import job_config
from streamrl.commands.reward import broker_section
from streamrl.config.schema import BrokerConfig, EnvConfig


def _args(*argv: str):
    parser, _ = build_parser()
    return parser.parse_args(list(argv))


def test_env_command_defaults_are_the_sections():
    cfg = job_config(_args("env", "--fn", "charclass_dialog", "--run", "r"))
    assert cfg.env == EnvConfig(fn="charclass_dialog")
    assert cfg.broker == BrokerConfig()
    assert cfg.run.name == "r"


def test_env_command_flags_override():
    args = _args(
        "env", "--fn", "charclass_dialog", "--run", "r", "--concurrency", "3", "--step-timeout", "2.5",
        "--claim-idle-ms", "500",
    )  # fmt: skip
    cfg = job_config(args)
    assert (cfg.env.concurrency, cfg.env.step_timeout_s, cfg.broker.claim_idle_ms) == (3, 2.5, 500)
    assert cfg.env.max_turns == EnvConfig().max_turns  # what no flag sets stays the section's


def test_reward_command_defaults_are_the_section_and_flags_override():
    assert broker_section(_args("reward", "--fn", "m:f", "--run", "r")) == BrokerConfig()
    given = broker_section(
        _args("reward", "--fn", "m:f", "--run", "r", "--claim-idle-ms", "700", "--connect-retries", "2")
    )
    assert (given.claim_idle_ms, given.connect_retries) == (700, 2)


def test_help_names_the_section_default():
    parser, _ = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["env"]
    text = " ".join(sub.format_help().split())  # argparse wraps lines
    assert f"the env section's concurrency, {EnvConfig().concurrency}" in text
    assert f"the broker section's claim_idle_ms, {BrokerConfig().claim_idle_ms}" in text


def test_producer_decorator_defaults_are_the_specs():
    from streamrl.annotate.sdk import ProducerSpec, producer, spec_of

    @producer(key="judge")
    def judge(rollouts):
        return [0.0] * len(rollouts)

    assert spec_of(judge) == ProducerSpec(key="judge", name="judge")


def test_env_command_takes_the_sections_no_flag_sets_from_the_jobs_config():
    """An external `streamrl env` for a tool job gets the job's tools section (not its defaults)."""
    from streamrl.config.files import load_config

    job = load_config("configs/tiny-tools-cpu.yaml")
    cfg = job_config(
        _args(
            "env",
            "--fn",
            "streamrl.envs.tool_env:ToolEnv",
            "--run",
            "other",
            "--config",
            "configs/tiny-tools-cpu.yaml",
            "--concurrency",
            "3",
            "--claim-idle-ms",
            "500",
        )  # fmt: skip
    )
    assert cfg.tools == job.tools and cfg.tools.names == ["python"]
    assert cfg.env.max_turns == job.env.max_turns and cfg.env.step_timeout_s == job.env.step_timeout_s
    assert (cfg.run.name, cfg.env.concurrency, cfg.broker.claim_idle_ms) == ("other", 3, 500)


def test_env_command_reads_the_run_dirs_config_and_keeps_a_string_fn(tmp_path):
    from streamrl.config.files import dump_config, load_config

    dump_config(load_config("configs/tiny-multiturn-cpu.yaml"), tmp_path / "config.yaml")
    cfg = job_config(_args("env", "--fn", "textarena:Wordle-v0", "--run", "r", "--run-dir", str(tmp_path)))
    assert cfg.env.fn == "textarena:Wordle-v0"
    assert cfg.env.max_turns == 2 and cfg.env.concurrency == 128  # the job's, not EnvConfig()'s
    # Without a config.yaml in RUN_DIR: the sections' defaults, as with no --config.
    bare = job_config(_args("env", "--fn", "charclass_dialog", "--run", "r", "--run-dir", str(tmp_path / "none")))
    assert bare.env == EnvConfig(fn="charclass_dialog")
