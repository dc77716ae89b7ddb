"""Config validation against workflow/schemas/config.schema.yaml, with defaults, in one clear line."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from jsonschema import Draft202012Validator, validators

from .errors import MoeplaceError


def _with_defaults(cls: type) -> type:
    validate_properties = cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):  # noqa: ANN001 - jsonschema's signature
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(cls, {"properties": set_defaults})


_Validator = _with_defaults(Draft202012Validator)


def _field(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


def _message(error: jsonschema.ValidationError) -> str:
    where = _field(error)
    if error.validator == "oneOf" and isinstance(error.instance, dict):
        return f"{where}: give exactly one of gguf, twin or constants"
    if error.validator == "additionalProperties":
        return f"{where}: {error.message.replace('Additional properties are not allowed', 'unknown key(s)')}"
    if error.validator == "pattern":
        hint = error.schema.get("description", "")
        return f"{where}: {error.instance!r} is not valid" + (f"; expected {hint}" if hint else "")
    if error.validator == "dependentRequired":
        needed = next(
            k for k, v in error.validator_value.items() if k in error.instance and set(v) - set(error.instance)
        )
        missing = ", ".join(f"{where}.{m}" for m in error.validator_value[needed] if m not in error.instance)
        return f"{where}.{needed} needs {missing} as well"
    if error.validator == "propertyNames":
        return f"{where}: model name {error.instance!r} may use only letters, digits, '.', '_' and '-'"
    return f"{where}: {error.message}"


def validate_config(config: dict[str, Any], schema_path: str | Path) -> dict[str, Any]:
    """Validate in place (filling defaults) and return the config; MoeplaceError names the first bad field."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    errors = sorted(_Validator(schema).iter_errors(config), key=lambda e: (len(e.absolute_path), e.path))
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        raise MoeplaceError(f"config: {_message(error)}.")
    return config
