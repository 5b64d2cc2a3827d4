"""The YAML examples in the docstrings of the config modules are valid configs: every key
exists and every value passes its check (the example is read as the experiment config it
shows), so a docstring cannot drift from the fields it describes."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from astraflow.config import ExperimentConfig

ROOT = Path(__file__).resolve().parents[1]
#: modules whose docstring shows a config section
MODULES = ["astraflow/consumers/trainer/config.py", "astraflow/policies/config.py",
           "astraflow/weights/config.py", "astraflow/gateway/agent_workflow.py"]
SECTION = re.compile(r"^    ([a-z_]+):$")


def examples(path: Path) -> list[str]:
    """The indented blocks of the module docstring that start with ``<section>:``."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    lines, out, block = doc.splitlines(), [], []
    for line in [*lines, ""]:
        if block and (line.startswith("      ") or line.startswith("    ") and not
                      SECTION.match(line)):
            block.append(line)
            continue
        if block:
            out.append(textwrap.dedent("\n".join(block)))
            block = []
        if SECTION.match(line):
            block = [line]
    return out


@pytest.mark.parametrize("module", MODULES)
def test_the_docstring_example_is_a_valid_config(module: str) -> None:
    found = examples(ROOT / module)
    assert found, f"{module}: no config example in its docstring"
    for text in found:
        body = yaml.safe_load(text)
        ExperimentConfig.model_validate(body)  # unknown keys and bad values raise


def test_a_wrong_key_in_an_example_is_caught() -> None:
    bad = "trainer:\n  loss:\n    kl: k3\n    kl_cof: 0.001\n"
    with pytest.raises(ValueError, match="kl_cof"):
        ExperimentConfig.model_validate(yaml.safe_load(bad))
