"""Errors the gateway answers, in OpenAI's shape: ``{"error": {"message", "type", "param",
"code"}}`` with the HTTP status that goes with it."""

from __future__ import annotations

from typing import Any

from astraflow.core.errors import AstraflowError


class GatewayError(AstraflowError):
    """A request the gateway refuses; :meth:`body` is what the client gets, with ``status``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error",  # noqa: A002
               param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, *, param: str | None = None,
                code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def unsupported(param: str, value: Any, supported: str) -> GatewayError:
    return bad_request(f"{param}={value!r} is not supported by this gateway; {supported}",
                       param=param, code="unsupported_value")


def not_found(message: str, *, param: str | None = None, code: str | None = None
              ) -> GatewayError:
    return GatewayError(404, message, param=param, code=code)


def conflict(message: str, *, code: str) -> GatewayError:
    return GatewayError(409, message, code=code)


def too_many(message: str, retry_after: int) -> GatewayError:
    return GatewayError(429, message, type="rate_limit_exceeded", code="rate_limit_exceeded",
                        headers={"Retry-After": str(retry_after)})
