"""Fuzz the HTTP API from its own OpenAPI schema (schemathesis): for a bounded number of
generated requests per operation, no 5xx, and every status, content type and body is one the
schema documents. A scripted engine answers (the HTTP layer is under test, not a model)."""

from __future__ import annotations

from typing import Any

import pytest

EXAMPLES = {"positive": 25, "negative": 10}  # per operation (13 operations)


@pytest.mark.slow
def test_openapi_fuzz(serve: Any, rule_engine: Any, ascii_tokenizer: Any) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode, checks

    served = serve(rule_engine(ascii_tokenizer, lambda p: "ok"), context_length=256,
                   store_kwargs={"max_open_sessions": 100_000})
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    run = [checks.not_a_server_error, checks.status_code_conformance,
           checks.content_type_conformance, checks.response_schema_conformance]
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 13
    for op in operations:
        for mode, n in EXAMPLES.items():  # valid requests, and requests that break the schema
            if mode == "negative" and op.method.upper() != "POST":
                continue  # nothing to break in a GET without a body
            @settings(max_examples=n, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=GenerationMode(mode)))
            def fuzz(case: Any) -> None:
                case.call_and_validate(base_url=served.url, checks=run, timeout=30)

            fuzz()
    # the server still serves
    ok = served.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200
