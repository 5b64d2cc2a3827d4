"""Path templates in config values: ``{out}`` is the run directory, other fields (``{policy}``,
``{worker}``) are filled by the code that knows them.

>>> expand("{out}/checkpoints/trainer-{policy}", out="/runs/a", policy="solver")
'/runs/a/checkpoints/trainer-solver'

Every config value that names a place on disk (or an embedded bus URL) goes through
:func:`expand`, so a placeholder means the same thing in every section.
"""

from __future__ import annotations

import re
from pathlib import Path

from astraflow.core.errors import ConfigError

_FIELD = re.compile(r"\{([A-Za-z_]\w*)\}")


def expand(template: str, *, out: str | Path = ".", **fields: str) -> str:
    """``template`` with ``{out}`` replaced by the resolved run directory and each ``{name}``
    by ``fields[name]``. Substitution is one pass, so a value that itself contains braces is
    left alone. A placeholder without a value is a :class:`ConfigError` naming the valid
    ones (a ``{policy}`` in a value that serves every policy, say)."""
    values = {"out": str(Path(out).resolve()), **fields}

    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            valid = ", ".join(f"{{{k}}}" for k in values)
            raise ConfigError(f"unknown placeholder {{{name}}} in {template!r}; valid here: "
                              f"{valid}")
        return values[name]

    return _FIELD.sub(fill, template)
