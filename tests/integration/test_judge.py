"""task.reward=judge against a real judge: vLLM's OpenAI-compatible server (the CPU build) serving the
bundled tiny model on loopback, with a chat template, its answers held to the scores 0 to 10 by
vLLM's structured outputs. The run reaches the judge through a TCP forwarder the test can cut:
the judge "killed" mid-run stops the run in one line naming it, after the last good generation's
checkpoint, and `evora resume` goes on once it answers again. The run's held-out rewards are the
judge's own answers, asked again here. A hostile judge of our own (tests/hostile_judge.py) stalls
under SIGTERM, trickles its replies or answers no score, fails a fifth of its replies, and answers
HTML for its models."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable

import pytest
from hostile_judge import HostileJudge, Reply
from openai import OpenAI

from conftest import SMALL, TINY, cli_environment, evora_cmd, free_port, only_run_dir, run_evora, shared_head, started
from evora.engines.environment import vllm_environment
from evora.engines.vllm_spec import VLLMSpec
from evora.plan.overlay import saved_run_config
from evora.tasks.base import Example
from evora.tasks.judge import judge_request
from evora.tracking.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("judge")]

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}Score:"
SCORES = [str(score) for score in range(11)]
RUN = [
    "+experiment=quickstart/es",
    *SMALL,
    "engine=hf",
    "hardware.num_workers=1",  # the judge is the point, not the pool: one engine process less a run
    "task.selection_size=0",
    # Half SMALL's prompts and held-out rows: every one is a request to the judge on this CPU.
    "task.prompts_per_generation=8",
    "task.eval_size=32",
    "task.reward=judge",
    "task.judge.model=judge",
    f"task.judge.choices=[{','.join(SCORES)}]",
    "task.judge.retries=1",
    "task.judge.timeout_s=20",
]


class Forwarder:
    """TCP from a port of its own to the judge's; at the first request after `dies()` holds, it drops
    every connection and stops listening, as a judge that died would."""

    def __init__(self, target: int, dies: Callable[[], bool] = lambda: False):
        self.target, self.dies = target, dies
        self.lock = threading.Lock()
        self.connections: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # cut
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.connections += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while data := source.recv(65536):
                if counted and b"POST /v1/" in data and self.dies():
                    return self.cut()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                end.close()

    def cut(self) -> None:
        self.listener.close()
        with self.lock:
            for connection in self.connections:
                connection.close()


@pytest.fixture(scope="module")
def judge_port():
    """vLLM's OpenAI-compatible server with the tiny model as `judge`, for the module."""
    folder = Path(tempfile.mkdtemp(prefix="evora-judge-"))
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(TINY)]
    command += ["--served-model-name", "judge", "--dtype", "float32", "--max-model-len", "512", "--seed", "0"]
    command += ["--chat-template", str(folder / "chat_template.jinja"), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--enforce-eager"]  # as evora's CPU engines: no torch.compile (39 s to start here, eager 29 s)
    # The engines' environment: 1 GiB of KV cache on the CPU (vLLM's default takes most of the memory).
    env = {**os.environ, **vllm_environment(VLLMSpec(model=str(TINY)))}
    server = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        log: list[str] = []
        assert started(server, log), "".join(log)[-4000:]
        yield port
    finally:
        server.terminate()
        server.wait(timeout=60)


def generations_in(out: Path) -> set[int]:
    """The generations recorded so far in the run under `out` (a line being written is skipped)."""
    found = set()
    for line in (line for path in out.glob("*/metrics.jsonl") for line in path.read_text().splitlines()):
        try:
            found.add(json.loads(line)["generation"])
        except ValueError:
            pass
    return found


def judged(out: Path, port: int, *overrides: str) -> subprocess.CompletedProcess:
    return judged_at(out, f"http://127.0.0.1:{port}/v1", *overrides)


def judged_at(out: Path, url: str, *overrides: str) -> subprocess.CompletedProcess:
    return run_evora([*RUN, f"task.judge.url={url}", f"tracking.out_dir={out}", *overrides], out)


def test_a_judge_killed_mid_run_stops_it_in_one_line_and_resume_goes_on(judge_port):
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    # Dies in generation 3: at its first request after generation 2's record (written before its checkpoint).
    dying = Forwarder(judge_port, dies=lambda: 2 in generations_in(out))
    stopped = judged(out, dying.port, "generations=4")
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("evora: error:")]
    assert stopped.returncode == 1 and len(errors) == 1, stopped.stderr[-4000:]
    assert f"judge at http://127.0.0.1:{dying.port}/v1" in errors[0] and "generation 3" in errors[0], errors[0]
    assert "task.judge.max_error_rate=0.1" in errors[0] and "Traceback" not in stopped.stderr
    run_dir = only_run_dir(out)
    assert [r["generation"] for r in read_metrics(run_dir)] == [0, 1, 2]  # generation 2's checkpoint stays
    assert all(r["reward_failed"] == 0 for r in read_metrics(run_dir) if r["generation"] > 0)

    back = Forwarder(judge_port)  # the judge answers again, at another address
    resumed = run_evora([f"resume={run_dir}", f"task.judge.url=http://127.0.0.1:{back.port}/v1"], cwd=out)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    records = read_metrics(run_dir)
    assert [r["generation"] for r in records] == [0, 1, 2, 3, 4]
    assert all(r["reward_failed"] == 0 and r["reward_errors"] == 0 for r in records if r["generation"] > 0)

    # The held-out rewards are the judge's answers: every other one (16) asked again, one request each,
    # through the chat API.
    report = json.loads((run_dir / "eval" / "best_vs_base.json").read_text())
    rows = [row for group in report["counts"] for row in report[group]][::2]
    client = OpenAI(base_url=f"http://127.0.0.1:{judge_port}/v1", api_key="none")
    template = saved_run_config(run_dir).task.judge.template
    same = 0
    for row in rows:
        request = judge_request(template, row["adapter"], Example(row["prompt"], row["answer"]))
        answer = client.chat.completions.create(
            model="judge",
            messages=[{"role": "user", "content": request}],
            max_tokens=16,
            temperature=0,
            extra_body={"structured_outputs": {"choice": SCORES}},
        )
        same += float(answer.choices[0].message.content) == row["adapter_reward"]
    # Greedy, but batched otherwise than in the run: a near tie may go the other way on the CPU.
    assert same >= 0.9 * len(rows), (same, len(rows))


def test_a_wrong_judge_is_one_line_before_ray(judge_port):
    """The plan asks the judge for its models: a name it does not serve is bad input (exit 2), a judge
    that does not answer a runtime failure (exit 1); `evora doctor` says the same."""
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    wrong = judged(out, judge_port, "task.judge.model=nope")
    assert wrong.returncode == 2 and 'task.judge.model="nope": not served' in wrong.stderr, wrong.stderr[-2000:]
    assert "it serves: judge" in wrong.stderr and not list(out.iterdir())  # no run folder: it never started
    closed = free_port()  # nothing listens there
    doctor = run_evora(["doctor", *RUN, f"task.judge.url=http://127.0.0.1:{closed}/v1"], cwd=out)
    assert doctor.returncode == 1 and f'task.judge.url="http://127.0.0.1:{closed}/v1": the judge does not answer' in (
        doctor.stdout + doctor.stderr
    )


def graded(content: str) -> Reply:
    """A judge of our own: a score from the response's length, and for a fifth of responses (by
    their hash) no score, an error status or an empty body (deterministic, so a resumed run gets
    the scores an uninterrupted one would)."""
    response = content.split("Response: ", 1)[1].rsplit("\n\nReply with the score only.", 1)[0]
    failing = [Reply("Score: N/A"), Reply(status=500), Reply(body=b"")]
    draw = zlib.crc32(response.encode())
    return failing[draw % 3] if draw % 5 == 0 else Reply(f"Score: {len(response) % 11}")


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"bare {constant}")

    return json.loads(text, parse_constant=refuse)


def test_a_judge_that_stalls_ends_the_run_on_sigterm_in_seconds_and_resume_goes_on():
    """SIGTERM while a generation waits on a judge that stopped answering (a deadline far off):
    the run ends within seconds with the interrupted line, its last checkpoint kept; resumed
    against the judge answering again, it finishes. A fifth of the judge's replies fail
    throughout: they are counted (held-out ones too), and best_vs_base compares only what both
    sides scored, lists the rest as failed, never as regressions, and holds no bare NaN."""
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    stalled = threading.Event()

    def reply(content: str) -> Reply:
        if 1 in generations_in(out):  # from generation 2 on (after generation 1's checkpoint)
            stalled.set()
            return Reply(stall=True)
        return graded(content)

    judge = HostileJudge(reply)
    args = [*RUN, f"task.judge.url={judge.url}", "task.judge.timeout_s=600", f"tracking.out_dir={out}"]
    args += ["task.judge.max_error_rate=0.5"]
    command = evora_cmd("tracking.progress=false", *args, "task.judge.choices=[]", "generations=3")
    env = cli_environment(shared_head().environ)
    process = subprocess.Popen(command, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert stalled.wait(600), process.stderr.read() if process.poll() is not None else "no stall"
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:  # the test failed: nothing of the run is left behind
            process.kill()
        judge.close()
    run_dir = only_run_dir(out)
    assert process.returncode == 143 and took < 30, (took, stderr[-3000:])
    assert re.search(rf"evora: interrupted after generation 1; resume: evora resume={re.escape(str(run_dir))}", stderr)
    assert "Traceback" not in stderr

    back = HostileJudge(graded)
    try:
        resumed = run_evora([f"resume={run_dir}", f"task.judge.url={back.url}"], cwd=out)
    finally:
        back.close()
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    records = read_metrics(run_dir)
    assert [r["generation"] for r in records] == [0, 1, 2, 3]
    assert any(r.get("reward_failed") for r in records) and any(r.get("heldout_reward_failed") for r in records)
    report = strict_json((run_dir / "eval" / "best_vs_base.json").read_text())
    assert report["counts"]["failed"] > 0 and len(report["failed"]) == report["counts"]["failed"]
    compared = [row for group in ("improvements", "regressions", "both_wrong", "both_right") for row in report[group]]
    assert all(row["base_reward"] is not None and row["adapter_reward"] is not None for row in compared)
    assert all(row["base_reward"] is None or row["adapter_reward"] is None for row in report["failed"])
    summary = strict_json((run_dir / "eval" / "summary.json").read_text())
    assert summary["best_vs_base"]["failed"] == report["counts"]["failed"]


def test_a_judge_that_trickles_or_answers_no_score_stops_the_run_by_its_deadline_in_one_line():
    """Half the replies a byte a second (minutes each), half with no score: each trickled request
    ends at task.judge.timeout_s, every failure is counted by kind, and the run stops at its first
    evaluation in one line naming the judge, the kinds and the key for each."""

    def reply(content: str) -> Reply:
        return Reply("Score: 7", trickle_s=1.0) if zlib.crc32(content.encode()) % 2 else Reply("A fine answer!")

    judge = HostileJudge(reply)
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    started_at = time.monotonic()
    try:
        result = judged_at(out, judge.url, "generations=1", "task.judge.choices=[]", "task.judge.timeout_s=3")
    finally:
        judge.close()
    errors = [line for line in result.stderr.splitlines() if line.startswith("evora: error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr[-4000:]
    assert "heldout evaluation after generation 0: all 64 rewards" in errors[0] and judge.url in errors[0], errors[0]
    assert re.search(r"\d+ timeouts, \d+ invalid scores", errors[0]), errors[0]
    assert "task.judge.timeout_s=3 a request" in errors[0] and "task.judge.score_pattern" in errors[0], errors[0]
    assert "Traceback" not in result.stderr and time.monotonic() - started_at < 300


def test_doctor_names_a_judge_that_answers_html_or_garbage_in_one_line():
    """`evora doctor` asks the judge for its models and to score three fixed completions: HTML in
    place of a model list, or replies with no score, are one line each, with no traceback."""
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    html = HostileJudge(lambda _: Reply("7"), models="<html><body>Sign in</body></html>")
    garbage = HostileJudge(lambda _: Reply("What a lovely answer!"))
    try:
        runs = [
            run_evora(["doctor", *RUN, "task.judge.choices=[]", f"task.judge.url={j.url}"], out)
            for j in (html, garbage)
        ]
    finally:
        html.close()
        garbage.close()
    for ran, judge, line in zip(runs, (html, garbage), ("the judge does not answer a model list", "gave none of 3")):
        errors = [e for e in ran.stderr.splitlines() if e.startswith("evora: error:")]
        assert ran.returncode == 1 and len(errors) == 1 and line in errors[0], ran.stdout[-2000:] + ran.stderr[-2000:]
        assert judge.url in errors[0] and "Traceback" not in ran.stderr
