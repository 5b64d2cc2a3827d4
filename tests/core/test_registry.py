"""The one registry: names registered in code (eager or as a lazy "module:attr"), entry points
of an installed distribution, and module paths; and `astraflow plugins`, which lists them.

The installed distribution is real as far as importlib.metadata is concerned: a
``<name>.dist-info`` folder (METADATA + entry_points.txt) on sys.path, no pip needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from astraflow.core.errors import ConfigError
from astraflow.core.registry import Registry, RegistryError, entry_points, lazy_exports

PLUGIN = '''
async def echo_flow(ctx, task, **kwargs):
    return None

def half_reward(completion, reference, **kwargs):
    return 0.5

def shout(text):
    return text.upper()

class Fixed:
    def __init__(self, n):
        self.n = n
    def count(self):
        return self.n
    def scale(self, target, current):
        raise NotImplementedError
    def close(self):
        return None

def fixed_actuator(config, *, run, pool, config_path, out):
    return Fixed(7)

def broken():
    raise RuntimeError("never")
'''

ENTRY_POINTS = '''
[astraflow.workflows]
echo_flow = afplug_mod:echo_flow

[astraflow.rewards]
half = afplug_mod:half_reward
exact_match = afplug_mod:half_reward

[astraflow.tools]
shout = afplug_mod:shout

[astraflow.policies]
my_staleness = astraflow.policies.filters:build_staleness

[astraflow.actuators]
fixed = afplug_mod:fixed_actuator
broken = afplug_mod:no_such_attr
'''


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Iterator[Path]:
    """A distribution ``afplug 0.3`` installed in ``tmp_path`` and put on sys.path."""
    (tmp_path / "afplug_mod.py").write_text(PLUGIN)
    info = tmp_path / "afplug-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: afplug\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    sys.path.insert(0, str(tmp_path))
    entry_points.cache_clear()
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("afplug_mod", None)
        entry_points.cache_clear()


def test_registered_lazy_and_path_names_resolve() -> None:
    reg: Registry[object] = Registry("widget")  # type: ignore[type-var]
    reg.add("dumps", json.dumps)
    reg.add("lazy", "textwrap:dedent")  # imported on first use
    assert "lazy" in reg and "dumps" in reg and "textwrap:indent" not in reg
    assert reg.resolve("lazy") is textwrap.dedent
    assert reg["dumps"] is json.dumps
    assert reg.resolve("textwrap:indent") is textwrap.indent
    assert reg.names() == ["dumps", "lazy"] == list(reg)
    with pytest.raises(RegistryError, match=r"unknown widget 'nope'; valid: dumps, lazy, or "
                                            "'module.path:function'"):
        reg.resolve("nope")
    with pytest.raises(RegistryError, match="not a 'module.path:attr' string"):
        reg.add("bad", "textwrap")
    reg.add("missing", "textwrap:no_such")
    with pytest.raises(RegistryError, match="module 'textwrap' has no attribute 'no_such'"):
        reg.resolve("missing")
    with pytest.raises(RegistryError, match="is a str, not a callable") as e:
        reg.resolve("string:ascii_letters")
    assert e.value.reason == "not callable"


def test_lazy_exports_import_on_first_read() -> None:
    getattr_ = lazy_exports("astraflow.core", {"dedent": "no_such_module", "expand": "paths"})
    from astraflow.core.paths import expand

    assert getattr_("expand") is expand
    with pytest.raises(AttributeError, match="'astraflow.core' has no attribute 'other'"):
        getattr_("other")


def test_entry_points_of_an_installed_distribution_resolve(plugin_dir: Path) -> None:
    from astraflow.consumers.rollout.rewards import REWARDS
    from astraflow.consumers.rollout.tools import TOOLS
    from astraflow.consumers.rollout.workflows import WORKFLOWS

    assert "echo_flow" in WORKFLOWS and "echo_flow" in WORKFLOWS.names()
    assert WORKFLOWS.resolve("echo_flow").__module__ == "afplug_mod"
    assert REWARDS.resolve("half")("x", {}) == 0.5
    assert TOOLS.resolve("shout")("hi") == "HI"
    # a built-in wins over an entry point of its name, and the listing says so
    from astraflow.consumers.rollout.rewards.basic import exact_match

    assert REWARDS.resolve("exact_match") is exact_match
    shadowed = [o for o in REWARDS.origins() if o.shadowed]
    assert [(o.name, o.distribution) for o in shadowed] == [("exact_match", "afplug 0.3")]


def test_a_policy_and_an_actuator_from_an_entry_point(plugin_dir: Path) -> None:
    from astraflow.consumers.scaler.actuators import build_actuator
    from astraflow.consumers.scaler.config import ActuatorConfig
    from astraflow.policies.config import DataConfig
    from astraflow.policies.registry import build_chain

    chain = build_chain(DataConfig(post_rollout=["assembler", "my_staleness"]), "post_rollout")
    assert chain.entries == ["assembler", "my_staleness"]
    assert type(chain.policies[1]).__module__ == "astraflow.policies.filters"
    act = build_actuator(ActuatorConfig(type="fixed"), run="r", pool="gpu")
    assert act.count() == 7
    with pytest.raises(ConfigError, match=r"scale.pools.gpu.actuator: actuator type 'broken' "
                                          r"\(entry point 'afplug_mod:no_such_attr' of afplug "
                                          r"0.3, group astraflow.actuators\) cannot be loaded"):
        build_actuator(ActuatorConfig(type="broken"), run="r", pool="gpu")


def test_unknown_plugin_names_are_config_errors_listing_the_installed_ones(
        plugin_dir: Path) -> None:
    from astraflow.consumers.scaler.config import ActuatorConfig
    from astraflow.policies.config import DataConfig

    with pytest.raises(ValueError, match="unknown actuator type 'nope'; valid: local, command, "
                                         "broken, fixed"):
        ActuatorConfig(type="nope")
    with pytest.raises(ValueError, match="unknown policy 'nope'; valid: .*batcher, "
                                         "my_staleness, or a user policy"):
        DataConfig(post_rollout=["assembler", "nope"])


def test_without_the_distribution_its_names_are_unknown() -> None:
    from astraflow.consumers.rollout.workflows import WORKFLOWS

    assert "echo_flow" not in WORKFLOWS
    with pytest.raises(RegistryError, match="unknown workflow 'echo_flow'"):
        WORKFLOWS.resolve("echo_flow")


def _plugins_cli(*args: str, path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(path), *sys.path])}
    return subprocess.run([sys.executable, "-m", "astraflow.cli.app", "plugins", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_astraflow_plugins_lists_built_ins_and_entry_points(plugin_dir: Path) -> None:
    done = _plugins_cli(path=plugin_dir)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for group in ("astraflow.workflows", "astraflow.rewards", "astraflow.tools",
                  "astraflow.policies", "astraflow.actuators"):
        assert any(line.startswith(group) for line in lines), group
    echo = next(line.split() for line in lines if line.split()[:1] == ["echo_flow"])
    assert echo == ["echo_flow", "entry", "point", "of", "afplug", "0.3",
                    "afplug_mod:echo_flow"]
    single = next(line.split() for line in lines if line.split()[:1] == ["single_turn"])
    assert single[1] == "built-in"
    assert any("exact_match" in line and "shadowed" in line for line in lines)
    as_json = json.loads(_plugins_cli("actuators", "--json", path=plugin_dir).stdout)
    assert {o["name"]: o["distribution"] for o in as_json["astraflow.actuators"]} == {
        "command": "", "local": "", "broken": "afplug 0.3", "fixed": "afplug 0.3"}
    bad = _plugins_cli("nope", path=plugin_dir)
    assert bad.returncode == 1 and "valid: workflows, rewards" in bad.stderr
