"""OpenAI-shaped answers built from a generation's events, shared by :class:`qkv.Llama`
(one session) and :class:`qkv.Engine` (the batch engine).

A generation is a sequence of events: ``("token", id, text, logprob, top)`` for each token,
then ``("done", finish_reason, rest, prompt_tokens, completion_tokens)`` once. A shaper
turns them into the chunks of a streamed answer and the whole answer, and says when a stop
string ends the generation early.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable, Optional


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class StopText:
    """Text let out as it comes, up to the first stop string: what could be the start of a
    stop string is held back until it is known not to be one."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.buf = ""

    def push(self, piece: str) -> tuple[str, bool]:
        if not self.stops:
            return piece, False
        self.buf += piece
        first = -1
        for s in self.stops:
            i = self.buf.find(s)
            if i != -1 and (first == -1 or i < first):
                first = i
        if first != -1:
            out, self.buf = self.buf[:first], ""
            return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.buf)), 0, -1):
                if self.buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        cut = len(self.buf) - hold
        out, self.buf = self.buf[:cut], self.buf[cut:]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


TokenBytes = Callable[[int], bytes]


class _Shaper:
    """What completion and chat answers share: the text so far, stop strings, usage."""

    object_name = ""
    id_prefix = ""

    def __init__(self, model: str, plan: Any, token_bytes: TokenBytes):
        self.model = model
        self.plan = plan
        self.token_bytes = token_bytes
        self.id = new_id(self.id_prefix)
        self.created = int(time.time())
        self.stop = StopText(list(plan.stop))
        self.text = ""
        self.tokens: list[tuple[int, float, list[tuple[int, float]]]] = []
        self.finish_reason: Optional[str] = None
        self.usage: dict[str, int] = {}

    def token_text(self, tid: int) -> str:
        return self.token_bytes(tid).decode("utf-8", errors="replace")

    def _push_text(self, text: str) -> tuple[str, bool]:
        out, hit = self.stop.push(text)
        self.text += out
        return out, hit

    def _usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.object_name == "chat.completion" else self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }


class CompletionShaper(_Shaper):
    """``text_completion`` answers (``/v1/completions``, llama-cpp-python's
    ``create_completion``)."""

    object_name = "text_completion"
    id_prefix = "cmpl"

    def _logprobs(self, entries: list[tuple[int, float, list[tuple[int, float]]]], offset: int) -> Optional[dict[str, Any]]:
        if not self.plan.logprobs:
            return None
        toks, lps, tops, offs = [], [], [], []
        for tid, lp, top in entries:
            t = self.token_text(tid)
            toks.append(t)
            lps.append(lp)
            tops.append({self.token_text(i): l for i, l in top} if top else None)
            offs.append(offset)
            offset += len(t)
        return {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}

    def on_token(self, tid: int, text: str, logprob: float, top: list[tuple[int, float]]) -> tuple[list[dict[str, Any]], bool]:
        start = len(self.text)
        out, hit = self._push_text(text)
        self.tokens.append((tid, logprob, top))
        chunks = []
        if self.plan.stream and (out or self.plan.logprobs):
            chunks.append(
                self._chunk(
                    {
                        "text": out,
                        "index": 0,
                        "logprobs": self._logprobs([(tid, logprob, top)], start),
                        "finish_reason": None,
                    }
                )
            )
        return chunks, hit

    def on_done(self, reason: str, rest: str, prompt_tokens: int, completion_tokens: int, stopped: bool) -> list[dict[str, Any]]:
        out = ""
        if not stopped:
            o, hit = self._push_text(rest)
            out += o
            if hit:
                stopped = True
            else:
                tail = self.stop.flush()
                self.text += tail
                out += tail
        self.finish_reason = "stop" if stopped else reason
        self.usage = self._usage(prompt_tokens, completion_tokens)
        if not self.plan.stream:
            return []
        chunks = [self._chunk({"text": out, "index": 0, "logprobs": None, "finish_reason": self.finish_reason})]
        if self.plan.include_usage:
            last = self._chunk({"text": "", "index": 0, "logprobs": None, "finish_reason": None})
            last["choices"] = []
            last["usage"] = self.usage
            chunks.append(last)
        return chunks

    def result(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "text": self.text,
                    "index": 0,
                    "logprobs": self._logprobs(self.tokens, 0),
                    "finish_reason": self.finish_reason,
                }
            ],
            "usage": self.usage,
        }


class ChatShaper(_Shaper):
    """``chat.completion`` answers, with tool calls and reasoning split out of the reply
    when the request has tools or the template thinks."""

    object_name = "chat.completion"
    id_prefix = "chatcmpl"

    def __init__(self, model: str, plan: Any, token_bytes: TokenBytes):
        super().__init__(model, plan, token_bytes)
        self.parser = plan.reply_parser()
        self.sent_role = False
        self.calls_seen = False

    def _delta(self, delta: dict[str, Any], finish: Optional[str] = None, logprobs: Any = None) -> dict[str, Any]:
        return self._chunk({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})

    def _entry(self, tid: int, lp: float, top: list[tuple[int, float]]) -> dict[str, Any]:
        return {
            "token": self.token_text(tid),
            "logprob": lp,
            "bytes": list(self.token_bytes(tid)),
            "top_logprobs": [{"token": self.token_text(i), "logprob": l, "bytes": list(self.token_bytes(i))} for i, l in top],
        }

    def _pieces_to_deltas(self, pieces: list[tuple[str, Optional[int], str]]) -> list[dict[str, Any]]:
        deltas = []
        for kind, index, text in pieces:
            if kind == "content":
                deltas.append({"content": text})
            elif kind == "reasoning":
                deltas.append({"reasoning_content": text})
            elif kind == "call_start":
                self.calls_seen = True
                deltas.append(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": f"call_{self.id}_{index}",
                                "type": "function",
                                "function": {"name": text, "arguments": ""},
                            }
                        ]
                    }
                )
            elif kind == "call_args":
                deltas.append({"tool_calls": [{"index": index, "function": {"arguments": text}}]})
        return deltas

    def _role_chunk(self) -> list[dict[str, Any]]:
        if self.sent_role:
            return []
        self.sent_role = True
        return [self._delta({"role": "assistant", "content": ""})]

    def on_token(self, tid: int, text: str, logprob: float, top: list[tuple[int, float]]) -> tuple[list[dict[str, Any]], bool]:
        out, hit = self._push_text(text)
        self.tokens.append((tid, logprob, top))
        if not self.plan.stream:
            return [], hit
        chunks = self._role_chunk()
        lp = {"content": [self._entry(tid, logprob, top)]} if self.plan.logprobs else None
        if self.parser is None:
            if out or lp:
                chunks.append(self._delta({"content": out}, logprobs=lp))
        elif out:
            for d in self._pieces_to_deltas(self.parser.update(self.text)):
                chunks.append(self._delta(d, logprobs=lp))
                lp = None
        return chunks, hit

    def on_done(self, reason: str, rest: str, prompt_tokens: int, completion_tokens: int, stopped: bool) -> list[dict[str, Any]]:
        before = len(self.text)
        if not stopped:
            _, hit = self._push_text(rest)
            if hit:
                stopped = True
            else:
                self.text += self.stop.flush()
        tail = self.text[before:]
        self.usage = self._usage(prompt_tokens, completion_tokens)
        finish = "stop" if stopped else reason
        self.reply: Optional[dict[str, Any]] = None
        chunks = self._role_chunk() if self.plan.stream else []
        if self.parser is not None:
            pieces, reply_json = self.parser.finish(self.text, self.id)
            self.reply = json.loads(reply_json)
            if self.reply["tool_calls"]:
                finish = "tool_calls"
            if self.plan.stream:
                chunks += [self._delta(d) for d in self._pieces_to_deltas(pieces)]
        elif self.plan.stream and tail:
            chunks.append(self._delta({"content": tail}))
        self.finish_reason = finish
        if not self.plan.stream:
            return []
        chunks.append(self._delta({}, finish=finish))
        if self.plan.include_usage:
            last = self._delta({})
            last["choices"] = []
            last["usage"] = self.usage
            chunks.append(last)
        return chunks

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant"}
        if self.reply is None:
            msg["content"] = self.text
        else:
            msg["content"] = self.reply["content"] if (self.reply["content"] or not self.reply["tool_calls"]) else None
            if self.reply.get("reasoning"):
                msg["reasoning_content"] = self.reply["reasoning"]
            if self.reply["tool_calls"]:
                msg["tool_calls"] = self.reply["tool_calls"]
        return msg

    def result(self) -> dict[str, Any]:
        logprobs = None
        if self.plan.logprobs:
            logprobs = {"content": [self._entry(t, l, top) for t, l, top in self.tokens]}
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": self.message(), "logprobs": logprobs, "finish_reason": self.finish_reason}],
            "usage": self.usage,
        }
