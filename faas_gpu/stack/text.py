"""The text of a stack file before it has a meaning: `${VAR}` substitution and YAML as Go reads it.

faas-cli decodes YAML into Go string fields, so `version: 1.0` stays the text "1.0" and `on`
stays "on": every plain scalar is kept as written, and duplicate keys are errors rather than
last-one-wins. `StackError` lives here, at the bottom, because the first errors a stack file can
have are in its text; the schema raises the same class.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import yaml


class StackError(ValueError):
    """A stack file that cannot be used; the message names the file and the key path."""


# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:=default}, ${VAR=default} and $VAR (drone/envsubst,
# which faas-cli uses for --envsubst)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-=])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def envsubst(text: str, env: Mapping[str, str] | None = None) -> str:
    """Substitute ${VAR}, ${VAR:-default}, ${VAR-default} and $VAR as faas-cli's --envsubst does.

    `:-` (and `:=`) use the default when the variable is unset or empty, `-` (and `=`) only when
    it is unset. An unset variable without a default becomes the empty string.
    """
    env = os.environ if env is None else env

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(4)
        op, default = m.group(2), m.group(3)
        value = env.get(name)
        if op is None:
            return value or ""
        if op.startswith(":"):
            return value if value else default
        return value if value is not None else default

    return _VAR.sub(repl, text)


# -- YAML: every plain scalar stays the text that was written, as Go decodes into string fields --
class _Loader(yaml.SafeLoader):
    pass


_Loader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in resolvers if tag in ("tag:yaml.org,2002:null", "tag:yaml.org,2002:merge")]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, list | dict):
            raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a scalar", key_node.start_mark)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, file: str) -> Any:
    """YAML with plain scalars kept as strings; syntax errors name the file and the line."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "syntax"
        raise StackError(f"{file}: {where}: invalid YAML: {problem}") from None
