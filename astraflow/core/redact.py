"""What counts as a secret, by the name of its key and by the shape of its value, and how text
(an error, a log line) is shown without one.

:func:`secret_key` judges a key name (``password``, ``api_key``, ``hf_token``, ... but not
``max_tokens`` or ``key`` alone); :func:`secret_shape` and :data:`SHAPES` find well-known token
formats anywhere in a string; :func:`random_looking` flags a long random-looking config value.
The rules are listed in docs/operations.md."""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Callable

#: what a secret is shown as
REDACTED = "***"

_SECRET_PARTS = frozenset({"password", "passwd", "passphrase", "secret", "secrets",
                           "authorization", "credential", "credentials", "cookie", "apikey"})
_KEY_QUALIFIERS = frozenset({"api", "access", "private", "secret", "signing", "encryption",
                             "client", "auth", "master", "license", "subscription", "account"})
#: a tokenizer's special tokens: ``pad_token: "<pad>"`` is no secret
_SPECIAL_TOKENS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "stop",
                             "start", "end", "special", "think", "image", "tool"})
_EXACT = frozenset({"sasl.oauthbearer.config"})
_FILE_PARTS = re.compile(r"\.key\.pem$|private.?key", re.IGNORECASE)
_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SPLIT = re.compile(r"[^A-Za-z0-9]+")


def name_parts(name: str) -> list[str]:
    """``"openaiApiKey"`` / ``"openai_api-key"`` -> ``["openai", "api", "key"]``."""
    return [p.lower() for p in _SPLIT.split(_HUMP.sub("_", name)) if p]


def secret_key(name: str) -> bool:
    """Is the value under a key of this name a secret (the rules in the module's doc)?"""
    if name.lower() in _EXACT or _FILE_PARTS.search(name):
        return True
    parts = name_parts(name)
    if not parts:
        return False
    if any(p in _SECRET_PARTS for p in parts):
        return True
    if parts[-1] == "token":
        return len(parts) == 1 or parts[-2] not in _SPECIAL_TOKENS
    return any(p == "key" and i > 0 and parts[i - 1] in _KEY_QUALIFIERS
               for i, p in enumerate(parts))


_TOKEN = r"[A-Za-z0-9_\-]"
#: name -> (pattern, replacement): the known shapes of secrets, found anywhere in a string
SHAPES: dict[str, tuple[re.Pattern[str], str]] = {
    "bearer": (re.compile(r"\b(Bearer\s+)[A-Za-z0-9._~+/=\-]{8,}", re.IGNORECASE),
               rf"\g<1>{REDACTED}"),
    "huggingface": (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), REDACTED),
    "openai": (re.compile(rf"\bsk-{_TOKEN}{{20,}}"), REDACTED),
    "github": (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"),
               REDACTED),
    "slack": (re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"), REDACTED),
    "aws": (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    "google": (re.compile(rf"\bAIza{_TOKEN}{{35}}"), REDACTED),
    "jwt": (re.compile(rf"\beyJ{_TOKEN}{{8,}}\.eyJ{_TOKEN}{{8,}}\.{_TOKEN}{{8,}}"), REDACTED),
    # the body runs to the next ``-----`` (its END line, when there is one): linear time,
    # however many BEGIN lines a text repeats
    "private_key": (re.compile(r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----(?:[^-]|-(?!----))*"
                               r"(?:-----END [A-Z ]{0,40}PRIVATE KEY-----)?"), REDACTED),
    "url_password": (re.compile(r"(://[^:/@\s]+:)[^@\s/]+@"), rf"\g<1>{REDACTED}@"),
}
_RANDOM = re.compile(r"[A-Za-z0-9_\-+=]{32,}")
_WORDISH = re.compile(r"[a-z]{7}")


def random_looking(value: str) -> bool:
    """Is ``value`` a long random-looking string (the module's doc says which)?"""
    if not _RANDOM.fullmatch(value) or _WORDISH.search(value):
        return False
    if not (any(c.isupper() for c in value) and any(c.islower() for c in value)
            and any(c.isdigit() for c in value)):
        return False
    n = len(value)
    entropy = -sum(k / n * math.log2(k / n) for k in Counter(value).values())
    return entropy >= 4.0


def redact_shapes(text: str) -> str:
    """``text`` with every secret of a known shape (:data:`SHAPES`) as ``***``."""
    for pattern, replacement in SHAPES.values():
        text = pattern.sub(replacement, text)
    return text


def secret_shape(value: str) -> bool:
    """Does config value ``value`` look like a secret, whatever its key is called?"""
    return redact_shapes(value) != value or random_looking(value)


#: ``name=value``, ``"name": "value"`` and YAML's ``name: value`` (at a line's start or in a
#: ``{...}``) in free text: the value is hidden when the name is a secret's (``--set
#: gateway.token=...``, ``{'hf_token': '...'}`` in a repr, the line a YAML error quotes)
_ASSIGNMENTS = (
    re.compile(r"(?P<name>[A-Za-z0-9_.\-]{1,64})=(?P<value>[^\s'\",;&}\])]+)"),
    re.compile(r"(?P<q>['\"])(?P<name>[A-Za-z0-9_.\- ]{1,64})(?P=q)\s*:\s*['\"]?"
               r"(?P<value>[^'\"\s,}]+)"),
    re.compile(r"(?m)(?:^|[{,])[ \t]*(?P<name>[A-Za-z0-9_.\-]{1,64}):[ \t]+['\"]?"
               r"(?P<value>[^'\"\s,}]+)"),
)


def _hide(m: re.Match[str]) -> str:
    name = m["name"]
    if not (secret_key(name) or any(secret_key(p) for p in name.split("."))):
        return m[0]
    start, end = m.span("value")
    return m[0][:start - m.start()] + REDACTED + m[0][end - m.start():]


def redact_text(text: str) -> str:
    """``text`` (an error message, a log line) with every secret it shows as ``***``: values
    of a known shape, and values given to a secret's name (``token=...``)."""
    text = redact_shapes(text)
    for pattern in _ASSIGNMENTS:
        text = pattern.sub(_hide, text)
    return text


class RedactingFilter(logging.Filter):
    """A handler filter that hides secrets (:func:`redact_text`) in each record's message and
    traceback before any handler writes it."""

    def __init__(self, redact: Callable[[str], str] = redact_text) -> None:
        super().__init__()
        self._redact = redact
        self._formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hidden = self._redact(message)
        if hidden != message:
            record.msg, record.args = hidden, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._redact(self._formatter.formatException(record.exc_info))
        return True


def redact_log_handlers(logger: logging.Logger | None = None) -> None:
    """Add a :class:`RedactingFilter` to every handler of ``logger`` (the root logger: the
    one a command configured) that has none yet. Called by the CLI after it configures
    logging; library code never configures handlers."""
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
