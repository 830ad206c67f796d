"""The CLI's failure output: one line on the console, the traceback in the run's cli.log
(and on the console with EVORA_DEBUG=1); exit codes by kind; the pool's console lines."""

from __future__ import annotations

import pytest

from evora import cli, interrupts
from evora.errors import ConfigError, RunError
from evora.tracking.events import WorkerLost, WorkerReplaced
from evora.tracking.progress import pool_line


def raised(error: Exception) -> Exception:
    try:
        raise error
    except Exception as caught:
        return caught


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (ConfigError("hardware.num_workers=64: too many"), 2, "evora: error: hardware.num_workers=64: too many"),
        (RunError("generation 3: the update made 2 adapter tensor(s) non-finite"), 1, "evora: error: generation 3"),
        (ValueError("bad thing\nsecond line"), 1, "evora: error: ValueError: bad thing (traceback: "),
    ],
)
def test_one_line_on_the_console_and_the_traceback_in_cli_log(tmp_path, capsys, monkeypatch, error, code, line):
    monkeypatch.delenv("EVORA_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_:
        cli._fail(raised(error), tmp_path)
    assert exit_.value.code == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(line), err
    assert "Traceback" not in err
    assert "Traceback (most recent call last)" in (tmp_path / "cli.log").read_text()


def test_evora_debug_shows_the_traceback_on_the_console_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EVORA_DEBUG", "1")
    with pytest.raises(SystemExit):
        cli._fail(raised(KeyError("missing")), tmp_path)
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.rstrip().endswith("cli.log)")


def test_a_cluster_error_is_shown_by_its_cause(tmp_path, capsys):
    class TaskError(Exception):  # the shape of Ray's RayTaskError: the remote exception in `.cause`
        def __init__(self, cause: Exception):
            super().__init__(f"ray::Driver.run() (pid=1)\n  File ...\n{cause}")
            self.cause = cause

    with pytest.raises(SystemExit):
        cli._fail(raised(TaskError(RuntimeError("every engine worker has died"))), tmp_path)
    assert capsys.readouterr().err.startswith("evora: error: RuntimeError: every engine worker has died (traceback:")


def test_interrupt_names_the_saved_generation(tmp_path, capsys):
    from evora.tracking.checkpoint import atomic_save, latest_path

    with pytest.raises(SystemExit) as exit_:
        cli._interrupted(KeyboardInterrupt(), tmp_path)
    assert exit_.value.code == 130
    resume = f"resume: evora resume={tmp_path}\n"
    assert capsys.readouterr().err == f"evora: interrupted; {resume}"
    atomic_save({"loop": {"next_generation": 4}}, latest_path(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        cli._interrupted(interrupts.Terminated(), tmp_path)
    assert exit_.value.code == 143
    assert capsys.readouterr().err == f"evora: interrupted after generation 4; {resume}"


def test_pool_lines():
    assert pool_line(WorkerLost(1)) == "engine worker 1 lost; its work is rerun on the others"
    assert pool_line(WorkerLost(2, hung_s=30.0)) == (
        "engine worker 2 gave no result in 30 s (engine.unit_timeout_s): killed; its work is rerun on the others"
    )
    assert pool_line(WorkerReplaced(3, "a" * 56)) == ("engine worker 3 started as a replacement (node aaaaaaaaaaaa)")


def test_an_interrupt_wrapped_by_a_cython_call_is_still_an_interrupt():
    try:
        try:
            raise interrupts.Terminated()
        except interrupts.Terminated as interrupt:
            raise SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set") from interrupt
    except SystemError as wrapped:
        assert isinstance(cli._interrupt_in(wrapped), interrupts.Terminated)
    assert cli._interrupt_in(ValueError("plain")) is None


def test_an_interrupt_swallowed_inside_a_call_is_raised_at_the_next_event(monkeypatch):
    import signal

    monkeypatch.setattr(interrupts, "PENDING", [])
    seen = []
    handle = cli._checked(seen.append)
    handle({"kind": "generation"})
    try:
        interrupts.raise_interrupt(signal.SIGINT, None)
    except KeyboardInterrupt:
        pass  # as if some library had caught and dropped it
    with pytest.raises(KeyboardInterrupt):
        handle({"kind": "generation"})
    assert seen == [{"kind": "generation"}]
    monkeypatch.setattr(interrupts, "PENDING", [])
    with pytest.raises(interrupts.Terminated):
        interrupts.raise_interrupt(signal.SIGTERM, None)


def test_the_cli_takes_sigint_only_where_the_shell_did_not_ignore_it(monkeypatch):
    import signal

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job
        interrupts.install_handlers()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is interrupts.raise_interrupt
        signal.signal(signal.SIGINT, signal.default_int_handler)
        interrupts.install_handlers()
        assert signal.getsignal(signal.SIGINT) is interrupts.raise_interrupt
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
