"""The pipeline config's one definition: config.schema.yaml beside this file holds every setting's type, bounds,
default and description. The Snakefile validates with it (defaults filled, one clear line naming a bad field),
and the typed settings (config.py) and the command line's defaults take their defaults from it (`default`)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from jsonschema import Draft202012Validator, validators

from .backends import BUILDS
from .errors import MoeplaceError
from .records import JsonObject

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")


@cache
def schema() -> JsonObject:
    """The schema, read once, with the builds llamacpp.backend takes from the backend registry (core/backends.py:
    adding a backend is its record alone)."""
    loaded: JsonObject = yaml.safe_load(SCHEMA_PATH.read_text())
    loaded["properties"]["llamacpp"]["properties"]["backend"]["enum"] = list(BUILDS)
    return loaded


def default(setting: str) -> Any:
    """The schema's default of a setting named as in the config ("bench.precision", "ubatch"): the one
        definition of it, which the typed settings and the command line take. "*" stands for any key of a mapping
    ("models.*.quant")."""
    node: JsonObject = schema()
    for key in setting.split("."):
        node = node["additionalProperties"] if key == "*" else node["properties"][key]
        if "$ref" in node and "default" not in node:  # "#/definitions/model"
            node = schema()["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return copy.deepcopy(node["default"])


def _with_defaults(cls: type[Draft202012Validator]) -> type[Draft202012Validator]:
    validate_properties = cls.VALIDATORS["properties"]

    def set_defaults(
        validator: Draft202012Validator, properties: JsonObject, instance: object, schema: JsonObject
    ) -> Iterator[jsonschema.ValidationError]:
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    # jsonschema's stubs leave `extend` untyped.
    extended: type[Draft202012Validator] = validators.extend(cls, {"properties": set_defaults})  # type: ignore[no-untyped-call]
    return extended


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
        hint = error.schema.get("description", "") if isinstance(error.schema, Mapping) else ""
        return f"{where}: {error.instance!r} is not valid" + (f"; expected {hint}" if hint else "")
    if error.validator == "dependentRequired":
        required, given = error.validator_value, error.instance
        assert isinstance(required, Mapping) and isinstance(given, Mapping)  # dependentRequired's: both mappings
        needed = next(k for k, v in required.items() if k in given and set(v) - set(given))
        missing = ", ".join(f"{where}.{m}" for m in required[needed] if m not in given)
        return f"{where}.{needed} needs {missing} as well"
    if error.validator == "propertyNames":
        return f"{where}: model name {error.instance!r} may use only letters, digits, '.', '_' and '-'"
    return f"{where}: {error.message}"


_NOT_READ = object()
_JSON_TYPE = {bool: "boolean", int: "integer", float: "number", type(None): "null"}


def _read_string(text: str, types: str | list[str]) -> Any:
    """`text` read as YAML, as config.yaml would be, if that gives one of the JSON `types`; else _NOT_READ."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return _NOT_READ
    wanted = {types} if isinstance(types, str) else set(types)
    kind = _JSON_TYPE.get(type(value))
    return value if kind in wanted or (kind == "integer" and "number" in wanted) else _NOT_READ


def _string_type_errors(errors: Iterable[jsonschema.ValidationError]) -> Iterator[jsonschema.ValidationError]:
    """Every error, also those inside oneOf/anyOf branches, that is a string where another type is wanted."""
    for error in errors:
        if error.validator == "type" and isinstance(error.instance, str):
            yield error
        yield from _string_type_errors(error.context or ())


def _read_strings(config: JsonObject, validator: jsonschema.protocols.Validator) -> None:
    """Snakemake's --config gives what is inside a list or mapping as strings (contexts=[8192,32768] becomes
    ['8192', '32768']): where the schema wants a number, boolean or null, such a string is read as YAML.
    Each round turns strings into other values, so the rounds end."""
    while True:
        values: dict[tuple[str | int, ...], Any] = {}
        for error in _string_type_errors(validator.iter_errors(config)):
            text, types = error.instance, error.validator_value  # a string, and the JSON type or types wanted
            if (
                isinstance(text, str)
                and isinstance(types, (str, list))
                and (value := _read_string(text, types)) is not _NOT_READ
            ):
                values.setdefault(tuple(error.absolute_path), value)
        if not values:
            return
        for (*parents, last), value in values.items():
            container: Any = config
            for key in parents:
                container = container[key]
            container[last] = value


# Settings renamed so that one word means one thing: (section, old name, new name).
RENAMED = (
    ("device", "overhead", "device.margin (bytes kept free, as recommend's --margin)"),
    ("tune", "margin", "tune.safety_layers (whole layers added to the lowest n that ran)"),
)


def validate_config(config: JsonObject, schema_path: str | Path = SCHEMA_PATH) -> JsonObject:
    """Validate in place (filling defaults, reading numbers given as strings) and return the config;
    MoeplaceError names the first bad field."""
    validator = _Validator(
        schema()
        if Path(schema_path).resolve() == SCHEMA_PATH.resolve()
        else yaml.safe_load(Path(schema_path).read_text())
    )
    _read_strings(config, validator)
    for section, old, new in RENAMED:
        if isinstance(config.get(section), dict) and old in config[section]:
            raise MoeplaceError(f"config: {section}.{old} is now {new}; rename it (the same value).")
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.absolute_path), e.path))
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        raise MoeplaceError(f"config: {_message(error)}.")
    return config
