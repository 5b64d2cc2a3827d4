"""Groups: a session must say which group of samples it belongs to (``require_group``, on by
default in ``astraflow serve``). Every advantage is relative to the group's other rewards, so
a session alone would be trained as nothing: it is refused with a 400 that says what to send,
and nothing is recorded for it."""

from __future__ import annotations

from typing import Any

from gateway_helpers import check_error

from astraflow.gateway.config import GatewayConfig

USER = [{"role": "user", "content": "17+23="}]
GROUP = {"X-Group-Id": "task-1", "X-Group-Size": "2"}


def test_astraflow_serve_requires_a_group_by_default() -> None:
    assert GatewayConfig().require_group is True


def test_a_session_without_a_group_is_refused_with_what_to_send(
        serve: Any, rule_engine: Any, ascii_tokenizer: Any) -> None:
    served = serve(rule_engine(ascii_tokenizer, lambda p: "40"),
                   store_kwargs={"require_group": True})
    path = "/sessions/{}/v1/chat/completions"
    for sid, headers, said in (("alone", {}, "no group id"),
                               ("no-size", {"X-Group-Id": "task-1"}, "no group size"),
                               ("one", {"X-Group-Id": "task-1", "X-Group-Size": "1"},
                                "group size 1")):
        r = served.post(path.format(sid), {"model": "default", "messages": USER},
                        headers=headers)
        err = check_error(r, 400, "missing_group")
        assert said in err["message"] and "X-Group-Id" in err["message"]
        assert "X-Group-Size" in err["message"] and err["param"] == "group_id"
    err = check_error(served.post("/sessions", {"session_id": "posted"}), 400, "missing_group")
    assert "POST /sessions" in err["message"]
    assert served.events() == []  # a refused session leaves nothing behind
    assert served.gw.store.open_count == 0

    # calls without a session are served and not recorded, as before
    assert served.post("/v1/chat/completions", {"model": "default", "messages": USER}
                       ).status_code == 200
    # the samples of one prompt, each with the group's id and size: one group of two
    for i in range(2):
        served.client(f"task-1-s{i}", default_headers={**GROUP, "X-Sample-Index": str(i)}
                      ).chat.completions.create(model="default", messages=USER)
        assert served.post(f"/sessions/task-1-s{i}/end", {"reward": float(i)}).json()["done"]
    made = served.post("/sessions", {"session_id": "posted", "group_id": "task-2",
                                     "group_size": 4})
    assert made.status_code == 201 and made.json()["group_size"] == 4
    assert [(t.group_id, t.sample_index, t.group_size, t.reward)
            for t in served.trajectories()] == [("task-1", 0, 2, 0.0), ("task-1", 1, 2, 1.0)]


def test_without_require_group_a_session_alone_is_a_group_of_one(
        serve: Any, rule_engine: Any, ascii_tokenizer: Any) -> None:
    served = serve(rule_engine(ascii_tokenizer, lambda p: "40"))  # the store's default
    served.client("alone").chat.completions.create(model="default", messages=USER)
    assert served.post("/sessions/alone/end", {"reward": 1.0}).json()["done"] is True
    (t,) = served.trajectories()
    assert (t.group_id, t.group_size) == ("alone", 1)
