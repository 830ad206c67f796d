"""task.reward=judge: an LLM judge behind an OpenAI-compatible server (vLLM's, TGI's, a hosted API).

Each completion becomes one request: `task.judge.template` with `{prompt}`, `{answer}` and
`{completion}` filled in (by replacement, so a template may hold JSON braces), sent as the user
turn (`api=chat`) or as the prompt (`api=completions`). The score is the first match of
`task.judge.score_pattern` in the reply; outside `task.judge.score_range` it is invalid.
`task.judge.choices` asks vLLM's structured outputs for one of the given answers.

A unit's requests go out together, at most `task.judge.concurrency` at a time, through the
OpenAI client (its retries, with exponential back-off and jitter, on connection errors, 408,
409, 429 and 5xx; `task.judge.timeout_s` a try). A request that fails after its retries, or
whose reply gives no valid score, fails its cell: counted, and left out of the fitness unless
`task.reward_penalty` is set. A generation whose failed share passes
`task.judge.max_error_rate` stops the run (`distributed/reward_failures.py`).

Determinism: the judge is the run's reward. A judge that samples (temperature > 0), batches
its requests with numerics that depend on the batch, or is changed between sessions, gives
other rewards for the same completions: a resumed run then continues exactly from its
checkpoint but is not bitwise the run that was never interrupted, and 1 and N workers (which
batch the judge's requests differently) may differ.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any, Sequence

import openai

from evora.config.schema import JudgeConfig, TaskConfig
from evora.tasks.base import Example
from evora.tasks.scores import ERROR, INVALID, TIMEOUT, Outcome, Scores

PLACEHOLDERS = ("{prompt}", "{answer}", "{completion}")


def judge_request(template: str, completion: str, example: Example) -> str:
    """The template with the example's prompt and answer and the completion in place."""
    values = {"{prompt}": example.prompt, "{answer}": example.answer, "{completion}": completion}
    return re.sub("|".join(re.escape(p) for p in PLACEHOLDERS), lambda m: values[m.group(0)], template)


def parse_score(judge: JudgeConfig, reply: str) -> Outcome:
    """The judge's reply as a reward, or an invalid outcome saying why."""
    match = re.search(judge.score_pattern, reply)
    if match is None:
        return Outcome(failure=INVALID, message=f"no score in the judge's reply {reply[:80]!r}")
    value = float(match.group(1) if match.groups() else match.group(0))
    low, high = judge.score_range
    if not low <= value <= high:
        return Outcome(failure=INVALID, message=f"the judge's score {value} is outside task.judge.score_range")
    correct_at = high if judge.correct_at is None else judge.correct_at
    return Outcome(value, value >= correct_at)


def api_key(judge: JudgeConfig) -> str:
    return os.environ.get(judge.api_key_env) or "none"  # a local server takes any key


PROBE_TIMEOUT_S = 10.0  # the judge's answer to the plan's one request for its models


def check_judge(judge: JudgeConfig) -> None:
    """Before Ray starts: the judge answers and serves task.judge.model (a wrong name is bad input,
    exit 2; a judge out of reach, a runtime failure, exit 1)."""
    from evora.errors import ConfigError, RunError

    client = openai.OpenAI(
        base_url=judge.url,
        api_key=api_key(judge),
        timeout=PROBE_TIMEOUT_S,
        max_retries=0,
    )
    try:
        served = sorted(model.id for model in client.models.list())
    except openai.APIError as error:
        raise RunError(
            f'task.judge.url="{judge.url}": the judge does not answer ({type(error).__name__}: {error})'
        ) from None
    finally:
        client.close()
    if judge.model not in served:
        raise ConfigError(
            f'task.judge.model="{judge.model}": not served at {judge.url}; it serves: {", ".join(served)}'
        )


class JudgeRewards:
    """Scores completions with the judge, concurrently; one event loop per `score` call."""

    def __init__(self, cfg: TaskConfig):
        self.cfg, self.judge = cfg, cfg.judge

    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> Scores:
        outcomes = asyncio.run(self._all(list(completions), list(examples)))
        return Scores.of(outcomes, self.cfg.reward_penalty)

    async def _all(self, completions: list[str], examples: list[Example]) -> list[Outcome]:
        judge = self.judge
        client = openai.AsyncOpenAI(
            base_url=judge.url, api_key=api_key(judge), timeout=judge.timeout_s, max_retries=judge.retries
        )
        limit = asyncio.Semaphore(judge.concurrency)
        async with client:
            return await asyncio.gather(*(self._one(client, limit, c, e) for c, e in zip(completions, examples)))

    async def _one(self, client: openai.AsyncOpenAI, limit: asyncio.Semaphore, completion: str, ex: Example) -> Outcome:
        request = judge_request(self.judge.template, completion, ex)
        async with limit:
            try:
                reply = await self._ask(client, request)
            except openai.APITimeoutError:
                return Outcome(failure=TIMEOUT, message=f"{self.judge.url}: no answer within {self.judge.timeout_s} s")
            except Exception as error:  # the client's errors, and its transport's own bugs
                # (anyio's AttributeError on a socket the judge closed while connecting) are a failed
                # reward alike: counted, and bounded by task.judge.max_error_rate.
                return Outcome(failure=ERROR, message=f"{self.judge.url}: {type(error).__name__}: {error}"[:300])
        return parse_score(self.judge, reply)

    async def _ask(self, client: openai.AsyncOpenAI, request: str) -> str:
        judge = self.judge
        extra: dict[str, Any] = {"structured_outputs": {"choice": list(judge.choices)}} if judge.choices else {}
        options: dict[str, Any] = {"max_tokens": judge.max_tokens, "temperature": judge.temperature}
        if judge.api == "chat":
            messages: Any = [{"role": "user", "content": request}]
            answer = await client.chat.completions.create(
                model=judge.model or "", messages=messages, extra_body=extra, **options
            )
            return answer.choices[0].message.content or ""
        completion = await client.completions.create(
            model=judge.model or "", prompt=request, extra_body=extra, **options
        )
        return completion.choices[0].text

    def close(self) -> None:
        pass


JUDGE_APIS = ("chat", "completions")
