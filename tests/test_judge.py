"""Judge rounds over real HTTP: answers from the mock, scores from a scripted judge server.

The judge server scores by item and round (read from the rendered judge prompt), so the test
states the outcome up front: `a` passes in round 1, `b` in round 2, `c` never.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from jsonlbatch.errors import UsageError
from jsonlbatch.exec import execute
from jsonlbatch.experiment import JudgeConfig, PassRule, run_judge
from jsonlbatch.experiment.rules import coerce
from jsonlbatch.gen import RequestWriter

SCORES = {"a": [8, 9, 9], "b": [3, 7, 9], "c": [2, 1, 2]}


class Judge:
    """A scripted judge: answers {"score": SCORES[item][round - 1]} with a reason."""

    def __init__(self) -> None:
        self.calls = 0
        self.prompts: list[dict] = []
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.runner = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result()

    async def _start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        return runner

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "judge", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.Response:
        self.calls += 1
        body = await request.json()
        asked = orjson.loads(body["messages"][-1]["content"])
        self.prompts.append(asked)
        score = SCORES[asked["item"]][asked["round"] - 1]
        content = f'Too vague. {{"score": {score}}}' if score < 6 else f'{{"score": {score}}}'
        return web.json_response(
            {
                "id": "j",
                "object": "chat.completion",
                "model": "judge",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def judge():
    server = Judge()
    yield server
    server.close()


TEMPLATE = '{"item": {{ group | tojson }}, "round": {{ round }}, "len": {{ answer | length }}}'


def first_round(tmp_path: Path, url: str) -> tuple[str, str]:
    requests, responses = tmp_path / "requests.jsonl", tmp_path / "responses.jsonl"
    with RequestWriter(requests, model="mock", seed=10) as w:
        for item in "abc":
            w.add(item, f"Write about {item}.")
    execute(requests, responses, urls=[url], quiet=True, handle_signals=False)
    return str(requests), str(responses)


def lines(path: Path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()]


def test_items_pass_in_round_one_two_or_never(tmp_path, mock_server, judge):
    from jsonlbatch.mock import BackgroundMock  # noqa: F401 - the fixture's server type

    url = mock_server()
    requests, responses = first_round(tmp_path, url)
    config = JudgeConfig(template=TEMPLATE, model="judge", extract="json:score", rounds=3)
    out = tmp_path / "judge"
    summary = run_judge(
        requests, responses, str(out), config, urls=[url], judge_urls=[judge.url], quiet=True
    )
    assert summary.items == 3 and summary.passed == 2
    assert summary.passed_by_round == [1, 1, 0] and summary.rounds_run == 3
    assert judge.calls == 3 + 2 + 1
    report = {x["custom_id"]: x for x in lines(out / "judge.jsonl")}
    assert (report["a"]["passed"], report["a"]["rounds"], report["a"]["round"]) == (True, 1, 1)
    assert (report["b"]["passed"], report["b"]["rounds"], report["b"]["round"]) == (True, 2, 2)
    assert report["b"]["score"] == 7 and [h["score"] for h in report["b"]["history"]] == [3, 7]
    # never passing: the best score (2, first seen in round 1) is kept, after all 3 rounds
    assert (report["c"]["passed"], report["c"]["rounds"], report["c"]["round"]) == (False, 3, 1)
    assert [h["score"] for h in report["c"]["history"]] == [2, 1, 2]

    # round 2 asked b and c again: a new seed, and the judge's feedback as a new turn
    retried = {x["custom_id"]: x["body"] for x in lines(out / "round-2" / "requests.jsonl")}
    assert set(retried) == {"b", "c"} and retried["b"]["seed"] == 11
    turns = retried["b"]["messages"]
    assert [m["role"] for m in turns] == ["user", "assistant", "user"]
    assert "Too vague" in turns[-1]["content"] and "scored your answer 3" in turns[-1]["content"]
    assert set(x["custom_id"] for x in lines(out / "round-3" / "requests.jsonl")) == {"c"}
    assert lines(out / "round-3" / "requests.jsonl")[0]["body"]["seed"] == 12

    # final.jsonl: the chosen response lines, one per item, readable as any response file
    final = {x["custom_id"]: x for x in lines(out / "final.jsonl")}
    round2 = {x["custom_id"]: x for x in lines(out / "round-2" / "responses.jsonl")}
    first = {x["custom_id"]: x for x in lines(Path(responses))}
    assert final["b"] == round2["b"] and final["a"] == first["a"] and final["c"] == first["c"]
    assert (
        report["b"]["answer"] == round2["b"]["response"]["body"]["choices"][0]["message"]["content"]
    )
    assert report["b"]["answer"] != report["c"]["answer"]

    # the same call again sends nothing: every round's exec finds its results
    before = judge.calls
    again = run_judge(
        requests, responses, str(out), config, urls=[url], judge_urls=[judge.url], quiet=True
    )
    assert judge.calls == before and again.passed == 2
    assert (out / "judge.jsonl").read_bytes() and lines(out / "final.jsonl") == list(final.values())


def test_a_changed_rule_clears_old_rounds(tmp_path, mock_server, judge):
    url = mock_server()
    requests, responses = first_round(tmp_path, url)
    out = tmp_path / "judge"
    strict = JudgeConfig(template=TEMPLATE, model="judge", rule="score >= 9", rounds=2)
    s1 = run_judge(
        requests, responses, str(out), strict, urls=[url], judge_urls=[judge.url], quiet=True
    )
    assert s1.passed_by_round == [0, 1]  # only a reaches 9, in round 2
    lenient = JudgeConfig(template=TEMPLATE, model="judge", rule="score >= 2", rounds=2)
    calls = judge.calls
    s2 = run_judge(
        requests, responses, str(out), lenient, urls=[url], judge_urls=[judge.url], quiet=True
    )
    assert s2.passed_by_round == [3] and judge.calls == calls + 3
    assert not (out / "round-2").exists()


def test_pass_rules_are_parsed_not_evaluated():
    rule = PassRule(
        "score >= 6 and verdict in ['pass', 'ok'] or round > 2", ["score", "verdict", "round"]
    )
    assert rule({"score": 7, "verdict": "pass", "round": 1})
    assert not rule({"score": 7, "verdict": "no", "round": 1})
    assert rule({"score": None, "verdict": None, "round": 3})
    assert not PassRule("score >= 6", ["score"])({"score": None})  # nothing extracted: fails
    assert not PassRule("score >= 6", ["score"])({"score": "7/10"})  # text vs number: fails
    assert PassRule("not score < 6", ["score"])({"score": 6.5})
    for bad in (
        "__import__('os').system('true')",
        "score.real > 1",
        "score[0] == 1",
        "(lambda: 1)()",
        "score is None",
        "other > 1",
        "score >=",
    ):
        with pytest.raises(UsageError):
            PassRule(bad, ["score"])
    assert coerce("7") == 7 and coerce(" 7.5 ") == 7.5 and coerce("true") is True
    assert coerce("7/10") == "7/10" and coerce(None) is None


def test_config_errors_before_anything_is_sent():
    with pytest.raises(UsageError, match="unknown extractor"):
        JudgeConfig(template="x", extract="nope")
    with pytest.raises(UsageError, match="not extracted"):
        JudgeConfig(template="x", extract={"grade": "json:grade"}, rule="score > 1")
    with pytest.raises(UsageError, match="at least 1"):
        JudgeConfig(template="x", rounds=0)
