"""task.reward=judge: an LLM judge behind an OpenAI-compatible server (vLLM's, TGI's, a hosted API).

Each completion becomes one request: `task.judge.template` with `{prompt}`, `{answer}` and
`{completion}` filled in (by replacement, so a template may hold JSON braces), sent as the user
turn (`api=chat`) or as the prompt (`api=completions`). The score is the last match of
`task.judge.score_pattern` in the reply (its first group, if it has one): by default a line that
is only a number, or `Score: <number>`. It must be a finite number inside
`task.judge.score_range`. `task.judge.choices` asks vLLM's structured outputs for one of the
given answers.

A unit's requests go out together, at most `task.judge.concurrency` at a time, through the
OpenAI client (its retries, with exponential back-off and jitter or the server's Retry-After, on
connection errors, 408, 409, 429 and 5xx). `task.judge.timeout_s` is a deadline on the whole
request: connecting, the reply's last byte, every retry and every wait between them. A reply
larger than REPLY_BYTES_CAP is not read on. `task.judge.call_timeout_s` bounds one scoring
call (a unit's requests, however many): the requests still open then fail as timeouts. Every
way a request can fail (transport, status, timeout, a reply that is not a completion, too large,
no score, not a number, out of range) fails its cell: counted, named, and left out of the fitness
unless `task.reward_penalty` is set. A generation whose failed share passes
`task.judge.max_error_rate` stops the run (`distributed/reward_failures.py`).

Determinism: the judge is the run's reward. A judge that samples (temperature > 0), batches
its requests with numerics that depend on the batch, or is changed between sessions, gives
other rewards for the same completions: a resumed run then continues exactly from its
checkpoint but is not bitwise the run that was never interrupted, and 1 and N workers (which
batch the judge's requests differently) may differ.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from typing import Any, Sequence

import openai

from evora.config.schema import JudgeConfig, TaskConfig
from evora.tasks.base import Example
from evora.tasks.scores import ERROR, INVALID, TIMEOUT, Outcome, Scores

PLACEHOLDERS = ("{prompt}", "{answer}", "{completion}")
REPLY_BYTES_CAP = 1 << 20  # a verdict is a few tokens; a larger reply fails unread (and unparsed)


class BadReply(Exception):
    """A reply that is not a completion the API promised, or is too large."""


def judge_request(template: str, completion: str, example: Example) -> str:
    """The template with the example's prompt and answer and the completion in place."""
    values = {"{prompt}": example.prompt, "{answer}": example.answer, "{completion}": completion}
    return re.sub("|".join(re.escape(p) for p in PLACEHOLDERS), lambda m: values[m.group(0)], template)


def parse_score(judge: JudgeConfig, reply: str) -> Outcome:
    """The judge's reply as a reward, or an invalid outcome saying why; never raises."""
    match = None
    for match in re.finditer(judge.score_pattern, reply):
        pass  # the last one: a judge that reasons first gives its verdict at the end
    if match is None:
        return Outcome(failure=INVALID, message=f"no score in the judge's reply {reply[:80]!r}")
    text = match.group(1) if match.groups() else match.group(0)
    try:
        value = float(text)
    except (TypeError, ValueError):  # an optional group that did not take part, or "N/A"
        return Outcome(failure=INVALID, message=f"the judge's score {text!r} is not a number")
    low, high = judge.score_range
    if not (math.isfinite(value) and low <= value <= high):
        return Outcome(failure=INVALID, message=f"the judge's score {text} is outside task.judge.score_range")
    correct_at = high if judge.correct_at is None else judge.correct_at
    return Outcome(value, value >= correct_at)


def reply_text(api: str, body: bytes) -> str:
    """The completion's text in a chat or completions reply's JSON."""
    try:
        choice = json.loads(body)["choices"][0]
        text = choice["message"]["content"] if api == "chat" else choice["text"]
    except (ValueError, LookupError, TypeError) as error:
        raise BadReply(f"not a {api} completion ({type(error).__name__}: {error}): {body[:80]!r}") from None
    if not isinstance(text, (str, type(None))):
        raise BadReply(f"not a {api} completion (its text is {type(text).__name__}): {body[:80]!r}")
    return text or ""


def api_key(judge: JudgeConfig) -> str:
    return os.environ.get(judge.api_key_env) or "none"  # a local server takes any key


PROBE_TIMEOUT_S = 10.0  # the judge's answer to the plan's one request for its models


def check_judge(judge: JudgeConfig) -> None:
    """Before Ray starts: the judge answers and serves task.judge.model (a wrong name is bad input,
    exit 2; a judge out of reach or answering what is not a model list, a runtime failure, exit 1)."""
    from evora.errors import ConfigError, RunError

    client = openai.OpenAI(
        base_url=judge.url,
        api_key=api_key(judge),
        timeout=PROBE_TIMEOUT_S,
        max_retries=0,
    )
    try:
        served = sorted(str(model.id) for model in client.models.list())
    except Exception as error:  # the client's errors, and a reply that is no model list (HTML, bad JSON)
        cause = f"{type(error).__name__}: {error}".splitlines()[0][:200]
        raise RunError(f'task.judge.url="{judge.url}": the judge does not answer a model list ({cause})') from None
    finally:
        client.close()
    if judge.model not in served:
        raise ConfigError(
            f'task.judge.model="{judge.model}": not served at {judge.url}; it serves: {", ".join(served)}'
        )


# `evora doctor` asks the judge to score these: a right answer, a wrong one, no answer.
PROBES = (
    ("What is 2 + 3?", "5", "2 + 3 = 5. The answer is 5."),
    ("What is 2 + 3?", "5", "2 + 3 = 7. The answer is 7."),
    ("What is 2 + 3?", "5", "I do not know."),
)


def probe_judge(cfg: TaskConfig) -> str:
    """The judge's scores of PROBES, as the run would parse them (doctor's line); raises RunError
    when it gives none a valid score, as the run would then stop at its first generation."""
    from evora.errors import RunError

    examples = [Example(prompt=prompt, answer=answer) for prompt, answer, _ in PROBES]
    scores = JudgeRewards(cfg).score([completion for *_, completion in PROBES], examples)
    parsed = ", ".join("failed" if bad else f"{reward:g}" for reward, bad in zip(scores.rewards, scores.failed))
    if all(scores.failed):
        raise RunError(
            f"task.judge: the judge at {cfg.judge.url} gave none of {len(PROBES)} fixed completions a valid score "
            f"({scores.message}); check task.judge.template and task.judge.score_pattern"
        )
    failed = f"; first failure: {scores.message}" if any(scores.failed) else ""
    return f"judge        {len(PROBES)} fixed completions (right, wrong, none) scored {parsed}{failed}"


class JudgeRewards:
    """Scores completions with the judge, concurrently; one event loop per `score` call."""

    def __init__(self, cfg: TaskConfig):
        self.cfg, self.judge = cfg, cfg.judge

    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> Scores:
        outcomes = asyncio.run(self._all(list(completions), list(examples)))
        return Scores.of(outcomes, self.cfg.reward_penalty)

    async def _all(self, completions: list[str], examples: list[Example]) -> list[Outcome]:
        """Every request's outcome by task.judge.call_timeout_s: those still open then are timeouts."""
        judge = self.judge
        client = openai.AsyncOpenAI(
            base_url=judge.url, api_key=api_key(judge), timeout=judge.timeout_s, max_retries=judge.retries
        )
        limit = asyncio.Semaphore(judge.concurrency)
        async with client:
            tasks = [asyncio.ensure_future(self._one(client, limit, c, e)) for c, e in zip(completions, examples)]
            if not tasks:
                return []
            _, open_ = await asyncio.wait(tasks, timeout=judge.call_timeout_s)
            for task in open_:
                task.cancel()
            await asyncio.gather(*open_, return_exceptions=True)
        late = Outcome(failure=TIMEOUT, message=f"{judge.url}: no answer within task.judge.call_timeout_s")
        return [late if task in open_ else task.result() for task in tasks]

    async def _one(self, client: openai.AsyncOpenAI, limit: asyncio.Semaphore, completion: str, ex: Example) -> Outcome:
        judge = self.judge
        request = judge_request(judge.template, completion, ex)
        async with limit:
            try:  # the whole exchange, the client's retries and their waits included
                reply = await asyncio.wait_for(self._ask(client, request), judge.timeout_s)
            except (TimeoutError, openai.APITimeoutError):
                return Outcome(failure=TIMEOUT, message=f"{judge.url}: no whole answer within {judge.timeout_s} s")
            except BadReply as error:
                return Outcome(failure=INVALID, message=f"{judge.url}: {error}"[:300])
            except Exception as error:  # the client's errors, and its transport's own bugs
                # (anyio's AttributeError on a socket the judge closed while connecting) are a failed
                # reward alike: counted, and bounded by task.judge.max_error_rate.
                return Outcome(failure=ERROR, message=f"{judge.url}: {type(error).__name__}: {error}"[:300])
        return parse_score(judge, reply)

    async def _ask(self, client: openai.AsyncOpenAI, request: str) -> str:
        judge = self.judge
        extra: dict[str, Any] = {"structured_outputs": {"choice": list(judge.choices)}} if judge.choices else {}
        options: dict[str, Any] = {"max_tokens": judge.max_tokens, "temperature": judge.temperature}
        call: Any
        if judge.api == "chat":
            messages: Any = [{"role": "user", "content": request}]
            call = client.chat.completions.with_streaming_response.create(
                model=judge.model or "", messages=messages, extra_body=extra, **options
            )
        else:
            call = client.completions.with_streaming_response.create(
                model=judge.model or "", prompt=request, extra_body=extra, **options
            )
        body = bytearray()
        async with call as response:  # read as it comes, so a reply past the cap is never held whole
            async for chunk in response.iter_bytes():
                body += chunk
                if len(body) > REPLY_BYTES_CAP:
                    raise BadReply(f"a reply over {REPLY_BYTES_CAP} bytes")
        return reply_text(judge.api, bytes(body))

    def close(self) -> None:
        pass


JUDGE_APIS = ("chat", "completions")
