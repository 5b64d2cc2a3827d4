"""Records: round trip, validation errors that name the field, and the documented wire format
(a plain msgpack map that any msgpack decoder reads)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from astraflow.core.errors import SchemaError
from astraflow.core.records import (
    SCHEMAS,
    Batch,
    ChatMessage,
    Claim,
    DeadLetter,
    GatewayCall,
    GatewayChoice,
    Group,
    GroupStats,
    LoadReport,
    Metric,
    Task,
    TensorEntry,
    Trajectory,
    TrajectoryGroup,
    TrajRef,
    WeightManifest,
    WorkerStatus,
    decode,
    encode,
    pack_f32,
    pack_i32,
    pack_u8,
    schema_header,
    unpack,
)


def trajectory(n: int = 5) -> Trajectory:
    return Trajectory(
        id="tr-1", task_id="t-1", group_id="t-1#0", policy="solver", sample_index=2,
        token_ids=pack_i32(range(n)), loss_mask=pack_u8([0, 0] + [1] * (n - 2)),
        logprobs=pack_f32([0.0, 0.0] + [-0.25] * (n - 2)), versions=pack_i32([-1, -1] + [3] * (n - 2)),
        prompt_len=2, reward=1.0, rewards={"exact": 1.0}, finish_reason="stop", worker_id="w1",
        timings={"generate": 0.5})


EXAMPLES = [
    Task(id="t-1", dataset="arith", prompt=[ChatMessage(role="user", content="2+2=")],
         reference={"answer": "4"}, n_samples=8),
    trajectory(),
    GroupStats(task_id="t-1", group_id="t-1#0", n=8, reward_mean=0.5, reward_std=0.5,
               zero_variance="none", version=3),
    TrajectoryGroup(group_id="t-1#0", task_id="t-1", trajectories=[trajectory()],
                    reward_mean=1.0, reward_std=0.0, version=3),
    Batch(id="b-0", policy="solver", seq=0,
          groups=[Group(group_id="t-1#0", task_id="t-1", trajectories=[trajectory()])]),
    WeightManifest(policy="solver", version=4, base_version=3, kind="delta", codec="sparse-v1",
                   tensors=[TensorEntry(name="w", shape=[2, 3], dtype="bfloat16", uri="v4/w.bin",
                                        length=10, digest="ab", changed=1)],
                   total_bytes=10, full_bytes=12),
    Metric(component="rollout-1", role="rollout", host="h", pid=1, counters={"episodes": 3}),
    LoadReport(run="r", window_start=0, window_end=1, trainer_step=2, wait_ratio=0.2, produced=8,
               consumed=8, current_workers=2, target_workers=3,
               workers=[WorkerStatus(component="rollout-1", host="h", status="running",
                                     episodes_per_s=1.5, last_seen=0.5)]),
    DeadLetter(origin="a[0]@1", topic="a", partition=0, offset=1, key=b"k", value=b"\xc1",
               headers=[("h", b"v")], error="bad", error_type="SchemaError"),
    Claim(uri="claims/Trajectory/ab.msgpack", schema_of="Trajectory", size=3, digest="ab"),
    GatewayCall(session_id="s-1", seq=1, kind="call", policy="solver", route="chat", parent=0,
                prompt_ids=pack_i32([5, 6]), prompt_role="tool", prompt_len=9, n_messages=3,
                choices=[GatewayChoice(token_ids=pack_i32([7, 2]), logprobs=pack_f32([-0.5, -0.1]),
                                       versions=pack_i32([3, 3]), hidden=1)],
                response=b'{"id": "chatcmpl-1"}'),
]


def test_groups_by_reference() -> None:
    ref = TrajRef("tr-1", "af.r.trajectories", 3, 17, 2, 1.0)
    g = TrajectoryGroup(group_id="t-1#0", task_id="t-1", refs=[ref], reward_mean=1.0,
                        reward_std=0.0, version=3)
    assert decode(encode(g), TrajectoryGroup) == g
    assert g.rewards() == [1.0] and g.ids() == ["tr-1"]
    b = Batch(id="b-0", policy="solver", seq=0,
              groups=[Group(group_id="t-1#0", task_id="t-1", refs=[ref])])
    assert decode(encode(b), Batch) == b
    with pytest.raises(SchemaError, match="both refs and trajectories"):
        Group(group_id="g", task_id="t", refs=[ref], trajectories=[trajectory()])
    with pytest.raises(SchemaError, match="both refs and trajectories"):
        decode(encode(TrajectoryGroup(group_id="g", task_id="t", trajectories=[trajectory()],
                                      reward_mean=0, reward_std=0, version=0)).replace(
            b"\xa4refs\x90", b"\xa4refs\x91" + msgspec.msgpack.encode(ref)), TrajectoryGroup)


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: type(r).__name__)
def test_round_trip_typed_and_untyped(record) -> None:
    data = encode(record)
    assert decode(data, type(record)) == record
    assert decode(data) == record


def test_every_schema_has_an_example() -> None:
    assert {type(r).__name__ for r in EXAMPLES} == set(SCHEMAS)


def test_wire_format_is_a_plain_msgpack_map() -> None:
    plain = msgspec.msgpack.decode(encode(trajectory()))  # no schema given: generic decode
    assert plain["schema"] == "Trajectory" and plain["v"] == 1
    assert isinstance(plain["token_ids"], bytes)  # msgpack bin, not a list of ints
    assert np.frombuffer(plain["token_ids"], "<i4").tolist() == [0, 1, 2, 3, 4]
    assert np.frombuffer(plain["logprobs"], "<f4")[-1] == np.float32(-0.25)
    assert schema_header(trajectory()) == ("af-schema", b"Trajectory/1")


def test_packed_arrays_are_compact() -> None:
    tr = trajectory(n=1000)
    # 4 + 1 + 4 + 4 bytes per token plus a small fixed overhead.
    assert len(encode(tr)) < 13 * 1000 + 400
    assert unpack(tr.versions, "<i4")[-1] == 3


def test_wrong_type_names_the_field() -> None:
    bad = msgspec.msgpack.encode({"schema": "Task", "v": 1, "id": 7, "dataset": "d",
                                  "prompt": []})
    with pytest.raises(SchemaError, match=r"\$\.id"):
        decode(bad, Task)


def test_missing_field_names_the_field() -> None:
    bad = msgspec.msgpack.encode({"schema": "Task", "v": 1, "dataset": "d", "prompt": []})
    with pytest.raises(SchemaError, match="missing required field `id`"):
        decode(bad, Task)


def test_unknown_schema_version_is_refused() -> None:
    bad = msgspec.msgpack.encode({"schema": "Task", "v": 2, "id": "x", "dataset": "d",
                                  "prompt": []})
    with pytest.raises(SchemaError, match="unknown schema version 2 for Task"):
        decode(bad, Task)
    with pytest.raises(SchemaError, match="unknown schema version 2"):
        decode(bad)


def test_unknown_schema_and_wrong_type_are_refused() -> None:
    with pytest.raises(SchemaError):
        decode(msgspec.msgpack.encode({"schema": "Nope", "v": 1}))
    with pytest.raises(SchemaError, match="Trajectory"):
        decode(encode(EXAMPLES[0]), Trajectory)
    with pytest.raises(SchemaError, match="not a msgpack record"):
        decode(b"\xc1\xc1", Task)


def test_misaligned_per_token_arrays_are_refused() -> None:
    with pytest.raises(SchemaError, match="loss_mask"):
        Trajectory(id="a", task_id="t", group_id="g", token_ids=pack_i32([1, 2, 3]),
                   loss_mask=pack_u8([1]), logprobs=pack_f32([0, 0, 0]),
                   versions=pack_i32([0, 0, 0]))
    good = msgspec.msgpack.decode(encode(trajectory()))
    good["logprobs"] = good["logprobs"][:-4]
    with pytest.raises(SchemaError, match="logprobs"):
        decode(msgspec.msgpack.encode(good), Trajectory)


def test_enumerated_fields_are_validated() -> None:
    bad = msgspec.msgpack.decode(encode(trajectory()))
    bad["finish_reason"] = "exploded"
    with pytest.raises(SchemaError, match="finish_reason"):
        decode(msgspec.msgpack.encode(bad), Trajectory)


def test_version_vector_round_trips_and_is_absent_in_older_records() -> None:
    import msgspec.structs

    with_vector = msgspec.structs.replace(trajectory(), version_vector={"solver": 3,
                                                                        "verifier": 7})
    assert decode(encode(with_vector), Trajectory).version_vector == {"solver": 3,
                                                                      "verifier": 7}
    assert decode(encode(with_vector)) == with_vector
    # a record from before the field (no key on the wire) reads as "not recorded"
    plain = msgspec.msgpack.decode(encode(trajectory()))
    assert plain.pop("version_vector") == {}
    old = decode(msgspec.msgpack.encode(plain), Trajectory)
    assert old.version_vector == {}
    assert msgspec.structs.replace(old, created_at=0.0) == msgspec.structs.replace(
        trajectory(), created_at=0.0)
    with pytest.raises(SchemaError, match="version_vector"):
        decode(msgspec.msgpack.encode({**plain, "version_vector": {"solver": "3"}}), Trajectory)
