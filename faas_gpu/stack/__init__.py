"""stack.yml, read as faas-cli 0.18 reads it (go-sdk stack/schema.go, stack.go).

Errors raise StackError and name the file and the key path, e.g.
`stack.yml: functions.echo.labels: must be a mapping of strings`.

Where we are stricter than faas-cli (which silently ignores what it does not know):
unknown keys, wrong types, duplicate keys and GPU limits (faas-cli drops them before they
reach the provider; ours ride in the annotation `com.faas-gpu.gpu`) are errors.

By role: `text` (${VAR} substitution, YAML with every plain scalar kept as written, StackError),
`files` (finding the stack file; `resolve_inside`, the one rule for every path it names),
`schema` (the keys, their checks, and the model: `FunctionSpec`, `StackFile`, `load_stack`).
"""

from .files import display_name, find_stack_file, resolve_inside
from .schema import (
    CONFIGURATION_KEYS,
    DEFAULT_GATEWAY,
    FUNCTION_KEYS,
    GPU_ANNOTATION,
    LANG_RE,
    NAME_RE,
    PROVIDER_KEYS,
    PROVIDER_NAME,
    RESOURCE_KEYS,
    TEMPLATE_SOURCE_KEYS,
    TOP_KEYS,
    VALID_VERSIONS,
    FunctionSpec,
    Stack,
    StackFile,
    load_stack,
)
from .text import StackError, envsubst, parse_yaml

__all__ = [
    "CONFIGURATION_KEYS",
    "DEFAULT_GATEWAY",
    "FUNCTION_KEYS",
    "GPU_ANNOTATION",
    "LANG_RE",
    "NAME_RE",
    "PROVIDER_KEYS",
    "PROVIDER_NAME",
    "RESOURCE_KEYS",
    "TEMPLATE_SOURCE_KEYS",
    "TOP_KEYS",
    "VALID_VERSIONS",
    "FunctionSpec",
    "Stack",
    "StackError",
    "StackFile",
    "display_name",
    "envsubst",
    "find_stack_file",
    "load_stack",
    "parse_yaml",
    "resolve_inside",
]
