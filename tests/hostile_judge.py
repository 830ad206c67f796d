"""An OpenAI-compatible judge on loopback that misbehaves as a test tells it: real HTTP over TCP
(asyncio streams, HTTP/1.1 keep-alive), so evora's client meets what a bad server sends.

`reply(content)` gets the judge prompt (the request's user turn, or its prompt) and returns a
`Reply`: what to answer, with which status and headers, sent at once, trickled a byte at a time,
or never (a stall until the client goes away). `/v1/models` answers `models` as given."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Callable

MODELS = json.dumps({"object": "list", "data": [{"id": "judge", "object": "model", "created": 0, "owned_by": "t"}]})


@dataclass(frozen=True)
class Reply:
    text: str = "7"  # the completion's text (a chat reply's content)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None  # sent as it is, in place of a completion holding `text`
    trickle_s: float = 0.0  # > 0: the body a byte at a time, this many seconds apart
    stall: bool = False  # read the request, never answer


def completion_body(text: str, chat: bool) -> bytes:
    choice = {"index": 0, "finish_reason": "stop"}
    choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
    kind = "chat.completion" if chat else "text_completion"
    return json.dumps({"id": "j", "object": kind, "created": 0, "model": "judge", "choices": [choice]}).encode()


class HostileJudge:
    """Serves on 127.0.0.1 from a thread of its own until `close()`; `url` is its base URL."""

    def __init__(self, reply: Callable[[str], Reply], models: str = MODELS):
        self.reply, self.models = reply, models
        self.requests = 0  # scoring requests read
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stops serving; connections still open (a stall, a trickle) are cut."""
        asyncio.run_coroutine_threadsafe(self._shut(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()

    async def _shut(self) -> None:
        self.server.close()
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # one request after another on the connection
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                path = head[0].split(" ")[1]
                headers = dict(line.lower().split(":", 1) for line in head[1:] if ":" in line)
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if path.endswith("/models"):
                    await self._send(writer, Reply(body=self.models.encode()))
                    continue
                request = json.loads(body)
                chat = "messages" in request
                self.requests += 1
                reply = self.reply(request["messages"][0]["content"] if chat else request["prompt"])
                if reply.stall:
                    await reader.read()  # until the client closes the connection
                    return
                await self._send(writer, reply, completion_body(reply.text, chat))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        finally:
            writer.close()

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, reply: Reply, completion: bytes = b"") -> None:
        body = completion if reply.body is None else reply.body
        headers = {"content-type": "application/json", "content-length": str(len(body)), **reply.headers}
        lines = [f"HTTP/1.1 {reply.status} X", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        writer.write("\r\n".join(lines).encode("latin-1"))
        if reply.trickle_s <= 0:
            writer.write(body)
            await writer.drain()
            return
        for index in range(len(body)):
            if writer.is_closing():  # the client gave up
                return
            writer.write(body[index : index + 1])
            await writer.drain()
            await asyncio.sleep(reply.trickle_s)
