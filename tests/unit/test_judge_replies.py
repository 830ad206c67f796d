"""The judge's scorer against a hostile OpenAI-compatible server on loopback (tests/hostile_judge.py):
every way a reply can fail is one counted failure naming the judge, never an exception; a
request ends by task.judge.timeout_s however the server stalls (a body trickled a byte a second,
a long Retry-After); a scoring call ends by task.judge.call_timeout_s; the default pattern takes
only a score; doctor's checks name the judge in one line."""

from __future__ import annotations

import math
import time

import pytest
from hostile_judge import HostileJudge, Reply

from evora.config.schema import JudgeConfig
from evora.errors import RunError
from evora.tasks import task_config
from evora.tasks.base import Example
from evora.tasks.judge import REPLY_BYTES_CAP, JudgeRewards, check_judge, parse_score, probe_judge
from evora.tasks.scores import INVALID


@pytest.fixture
def serve():
    """serve(reply, **judge keys) -> (the judge's server, its task config); servers close after the test."""
    servers: list[HostileJudge] = []

    def start(reply, models=None, **keys):
        server = HostileJudge(reply) if models is None else HostileJudge(reply, models)
        servers.append(server)
        judge = JudgeConfig(url=server.url, model="judge", **keys)
        return server, task_config("addition", reward="judge", judge=judge)

    yield start
    for server in servers:
        server.close()


def scored(task, completions):
    examples = [Example(prompt=f"q{i}", answer="5") for i in range(len(completions))]
    started = time.monotonic()
    scores = JudgeRewards(task).score(completions, examples)
    return scores, time.monotonic() - started


@pytest.mark.parametrize(
    "reply, score",
    [("7", 7.0), ("Score: 7", 7.0), (" 10 \n", 10.0), ("score: 3.5", 3.5), ("I think 9.\nScore: 2", 2.0)],
)
def test_the_default_pattern_takes_a_score(reply, score):
    assert parse_score(JudgeConfig(), reply).reward == score


@pytest.mark.parametrize(
    "reply", ["1e400", "-5", "0x10", "7/10", "10/10 but 3 is fairer", "Score: N/A", "", "nan", "11", "Score: 12"]
)
def test_the_default_pattern_rejects_what_is_not_a_score_in_range(reply):
    outcome = parse_score(JudgeConfig(), reply)
    assert outcome.failure == INVALID and math.isnan(outcome.reward), outcome


@pytest.mark.parametrize("reply", ["Score: N/A", "Score: inf", "Score: 1e400", "Score: nan", "Score: -1"])
def test_a_pattern_of_ones_own_never_raises_on_what_it_captures(reply):
    outcome = parse_score(JudgeConfig(score_pattern=r"Score:\s*(\S+)"), reply)
    assert outcome.failure == INVALID, outcome
    assert parse_score(JudgeConfig(score_pattern=r"Score:\s*(\S+)?"), "Score: ").failure == INVALID


def test_every_kind_of_bad_reply_is_one_counted_failure(serve):
    replies = {
        "a": Reply("Score: N/A"),
        "b": Reply(body=b"<html>502 Bad Gateway</html>"),
        "c": Reply(body=b'{"choices": []}'),
        "d": Reply(body=b"x" * (REPLY_BYTES_CAP + 1)),
        "e": Reply(status=400),
        "f": Reply("8"),
    }
    _, task = serve(lambda content: replies[content[-len("\n\nReply with the score only.") - 1]], retries=0)
    scores, _ = scored(task, list(replies))
    assert scores.failed == [True] * 5 + [False] and scores.rewards[-1] == 8.0
    assert (scores.invalid, scores.errors, scores.timeouts) == (4, 1, 0)


def test_a_body_trickled_a_byte_a_second_ends_at_the_request_deadline(serve):
    server, task = serve(lambda _: Reply("7", trickle_s=1.0), timeout_s=2.0, retries=1)
    scores, took = scored(task, ["a", "b", "c"])
    assert scores.timeouts == 3 and all(scores.failed), scores
    assert server.url in scores.message and "2.0 s" in scores.message
    assert took < 8, took  # trickled in full, a reply takes minutes


def test_a_long_retry_after_ends_at_the_request_deadline(serve):
    server, task = serve(lambda _: Reply(status=429, headers={"retry-after": "100"}), timeout_s=2.0, retries=2)
    scores, took = scored(task, ["a", "b"])
    assert scores.timeouts == 2 and took < 8, (scores, took)
    assert server.requests == 2  # the first try of each: the client then waits on Retry-After


def test_a_scoring_call_ends_at_its_own_deadline_however_many_requests_wait(serve):
    server, task = serve(lambda _: Reply(stall=True), timeout_s=60.0, concurrency=2, call_timeout_s=2.0)
    scores, took = scored(task, [str(i) for i in range(6)])
    assert scores.timeouts == 6 and took < 8, (scores, took)
    assert "task.judge.call_timeout_s" in scores.message and server.requests == 2  # 4 never left the queue


def test_a_model_list_that_is_html_or_not_json_is_one_line(serve):
    for models in ("<html><body>login</body></html>", '{"data": 3}'):
        server, task = serve(lambda _: Reply("7"), models=models)
        with pytest.raises(RunError) as error:
            check_judge(task.judge)
        assert str(error.value).startswith(f'task.judge.url="{server.url}": the judge does not answer a model list')
        assert "\n" not in str(error.value)


def test_doctors_probe_reports_what_it_parsed_and_refuses_a_judge_of_garbage(serve):
    _, task = serve(lambda content: Reply("10" if "The answer is 5" in content else "0"))
    assert probe_judge(task).endswith("scored 10, 0, 0")
    server, task = serve(lambda _: Reply("Great answer!"))
    with pytest.raises(RunError) as error:
        probe_judge(task)
    assert f"the judge at {server.url} gave none of 3 fixed completions a valid score" in str(error.value)
    assert "task.judge.score_pattern" in str(error.value)
