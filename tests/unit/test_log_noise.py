"""The supervisor drops nanobind's exit-time leak report (triton's bindings) from a dead role's log and
keeps every other line (files only).

    pytest tests/unit/test_log_noise.py -q
"""

from __future__ import annotations

from streamrl.launch.log_noise import strip_leak_report

REPORT = """nanobind: leaked 4 instances!
 - leaked instance 0x7f41e58553e8 of type "triton._C.libtriton.ir.attribute"
nanobind: leaked 64 types!
 - leaked type "triton._C.libtriton.ir.location"
 - leaked type "TMEM_LOAD_REDUCE_MODIFIER"
 - ... skipped remainder
nanobind: leaked 514 functions!
 - leaked function "push_front"
 - ... skipped remainder
nanobind: this is likely caused by a reference counting issue in the binding code.
See https://nanobind.readthedocs.io/en/latest/refleaks.html
"""


def test_the_leak_report_goes_and_the_traceback_stays(tmp_path):
    log = tmp_path / "trainer-0.out"
    body = "2026-12-02 [info] started\nTraceback (most recent call last):\nValueError: real error\n"
    log.write_text(body + REPORT)
    assert strip_leak_report(log) == len(REPORT.splitlines())
    assert log.read_text() == body
    assert strip_leak_report(log) == 0 and log.read_text() == body


def test_a_log_without_a_report_is_untouched(tmp_path):
    log = tmp_path / "feeder-0.out"
    log.write_text("a line mentioning - leaked things\n")
    assert strip_leak_report(log) == 0 and log.read_text() == "a line mentioning - leaked things\n"
    assert strip_leak_report(tmp_path / "missing.out") == 0


def test_a_long_log_is_cut_only_in_its_tail(tmp_path):
    log = tmp_path / "reward-0.out"
    log.write_text("x" * 300_000 + "\n[info] stopped\n" + REPORT)
    strip_leak_report(log)
    assert log.read_text().endswith("[info] stopped\n")
