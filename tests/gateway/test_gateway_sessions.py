"""Sessions: metadata for the assembler, Idempotency-Key retries recorded once (also while
the first runs), a reward given once, 429 with Retry-After when the gateway is full."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from gateway_helpers import check_error

USER = [{"role": "user", "content": "go"}]


def test_metadata_from_headers_and_post_sessions(serve: Any, rule_engine: Any,
                                                 ascii_tokenizer: Any) -> None:
    served = serve(rule_engine(ascii_tokenizer, lambda p: "ok"))
    # a rollout worker driving an external agent: one session per sample of a task's group
    for i in range(2):
        served.client(default_headers={
            "X-Session-Id": f"task-7-s{i}", "X-Task-Id": "task-7", "X-Group-Id": "task-7#0",
            "X-Sample-Index": str(i), "X-Group-Size": "2", "X-Agent": "solver"},
        ).chat.completions.create(model="default", messages=USER)
        assert served.post(f"/sessions/task-7-s{i}/end", {"reward": float(i)}).status_code == 200
    ts = served.trajectories()
    assert [(t.id, t.task_id, t.group_id, t.sample_index, t.group_size, t.agent, t.reward)
            for t in ts] == [("task-7#0/default/0", "task-7", "task-7#0", 0, 2, "solver", 0.0),
                             ("task-7#0/default/1", "task-7", "task-7#0", 1, 2, "solver", 1.0)]

    body = {"session_id": "made", "task_id": "t", "group_id": "g", "sample_index": 1,
            "group_size": 4, "metadata": {"harness": "x"}}
    made = served.post("/sessions", body)
    assert made.status_code == 201 and made.json()["group_size"] == 4
    assert served.post("/sessions", body).status_code == 201  # the same: answered again
    check_error(served.post("/sessions", {**body, "group_size": 8}), 409, "session_exists")
    fresh = served.post("/sessions").json()
    assert fresh["group_id"] == fresh["id"] and fresh["group_size"] == 1  # a group of one


def test_idempotency_key_retries_are_recorded_once(serve: Any, rule_engine: Any,
                                                   ascii_tokenizer: Any) -> None:
    gate = threading.Event()

    def slow(prompt: str) -> str:
        gate.wait(10)
        return "answer"

    engine = rule_engine(ascii_tokenizer, slow)
    served = serve(engine)
    client = served.client("idem")
    headers = {"Idempotency-Key": "call-1"}
    with ThreadPoolExecutor(2) as pool:  # an SDK retry while the first is still generating
        first = pool.submit(client.chat.completions.create, model="default", messages=USER,
                            extra_headers=headers)
        deadline = time.monotonic() + 10
        while served.gw.inflight == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        second = pool.submit(client.chat.completions.create, model="default", messages=USER,
                             extra_headers=headers)
        time.sleep(0.1)
        gate.set()
        a, b = first.result(), second.result()
    third = client.chat.completions.create(model="default", messages=USER,
                                           extra_headers=headers)
    assert a.id == b.id == third.id and len(engine.calls) == 1
    assert len(served.events("idem", "call")) == 1

    # without a session, retries are answered from memory
    loose = served.client()
    ids = {loose.chat.completions.create(model="default", messages=USER,
                                         extra_headers={"Idempotency-Key": "loose"}).id
           for _ in range(2)}
    assert len(ids) == 1 and len(engine.calls) == 2


def test_reward_once_end_once_and_unknown_sessions(serve: Any, rule_engine: Any,
                                                   ascii_tokenizer: Any) -> None:
    served = serve(rule_engine(ascii_tokenizer, lambda p: "ok"))
    served.client("r1").chat.completions.create(model="default", messages=USER)
    key = {"Idempotency-Key": "reward-1"}
    assert served.post("/sessions/r1/reward", {"reward": 1.0}, headers=key).status_code == 200
    again = served.post("/sessions/r1/reward", {"reward": 1.0}, headers=key)
    assert again.status_code == 200 and again.json()["reward"] == 1.0  # a retry: answered
    check_error(served.post("/sessions/r1/reward", {"reward": 0.0}), 409, "reward_already_set")
    check_error(served.post("/sessions/r1/end", {"reward": 0.0}), 409, "reward_already_set")
    assert len(served.events("r1", "reward")) == 1
    assert served.trajectories() == []  # rewarded, not ended: waiting (no expiry)
    assert served.post("/sessions/r1/end").json()["done"] is True
    (t,) = served.trajectories()
    assert t.reward == 1.0
    check_error(served.post("/sessions/r1/end"), 409, "session_closed")
    check_error(served.post("/sessions/r1/reward", {"reward": 2.0}), 409, "session_closed")
    with pytest.raises(openai.ConflictError):
        served.client("r1").chat.completions.create(model="default", messages=USER)
    # ended, waiting for its reward: no more calls
    served.client("r2").chat.completions.create(model="default", messages=USER)
    assert served.post("/sessions/r2/end").json()["done"] is False
    check_error(served.post("/sessions/r2/end"), 409, "session_ended")
    with pytest.raises(openai.ConflictError) as e:
        served.client("r2").chat.completions.create(model="default", messages=USER)
    assert e.value.body["code"] == "session_ended"
    assert served.post("/sessions/r2/reward", {"reward": 3.0}).json()["done"] is True
    for path in ("/sessions/nope/reward", "/sessions/nope/end"):
        check_error(served.post(path, {"reward": 1.0}), 404, "session_not_found")
    check_error(served.get("/sessions/nope"), 404, "session_not_found")
    assert [t.reward for t in served.trajectories()] == [1.0, 3.0]


def test_full_gateway_answers_429_with_retry_after(serve: Any, rule_engine: Any,
                                                   ascii_tokenizer: Any) -> None:
    served = serve(rule_engine(ascii_tokenizer, lambda p: "ok"), max_inflight=2,
                   store_kwargs={"max_open_sessions": 2, "retry_after_s": 3})
    for sid in ("a", "b"):
        served.client(sid).chat.completions.create(model="default", messages=USER)
    full = served.post("/sessions/c/v1/chat/completions", {"messages": USER})
    check_error(full, 429, "rate_limit_exceeded")
    assert full.headers["Retry-After"] == "3"
    with pytest.raises(openai.RateLimitError):
        served.client("c").chat.completions.create(model="default", messages=USER)
    served.client("a").chat.completions.create(model="default", messages=USER)  # open: served
    assert served.post("/sessions/a/end", {"reward": 0.0}).status_code == 200
    served.client("c").chat.completions.create(model="default", messages=USER)  # room again
    busy = served.post("/v1/chat/completions", {"messages": USER, "n": 3})
    check_error(busy, 429, "rate_limit_exceeded")  # 3 generations > max_inflight 2
    assert served.post("/v1/chat/completions", {"messages": USER, "n": 2}).status_code == 200
