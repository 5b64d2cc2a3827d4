"""Rollout's registries are :mod:`astraflow.core.registry` (one idiom for every pluggable
part); this module only keeps the old import path working for code written against it.
New code imports ``astraflow.core.registry``."""

from astraflow.core.registry import Registry, RegistryError, load_object

__all__ = ["Registry", "RegistryError", "load_object"]
