"""JSON Schemas that callers register (action ``inputs_schema``, ``json_schema`` validations),
checked once and run with every pattern matched by RE2 (``patterns``, ECMA-262 dialect).

The ``jsonschema`` library matches ``pattern`` and ``patternProperties`` (also inside
``additionalProperties`` and ``unevaluatedProperties``) with Python's backtracking ``re`` and
has no way to swap the engine, so the validator classes here replace those four keywords;
everything else is the library's. A pattern RE2 cannot run (a backreference, lookaround) is
refused when the schema is checked, through the metaschema's ``format: regex``.

The library's ``uniqueItems`` compares every pair of items that do not sort (objects, mixed
types) and its ``enum`` compares the instance with every member: a 49 KiB ``plan.use`` took
14 CPU-seconds. Here both look items up by a canonical, hashable form (linear). Every keyword
call also spends one step of a budget per validation (``MAX_STEPS``; the two lookups spend one
per item), so no schema and document make unbounded work, and each step is a
``caller_work.checkpoint``: a validation whose caller left stops at its next step.
"""

from __future__ import annotations

import functools
import reprlib
import threading
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from typing import Any, cast

import attrs
import jsonschema
import referencing.exceptions
from jsonschema import FormatChecker, ValidationError
from jsonschema.protocols import Validator

from cleveragents.acp.facade.domain.bounded import caller_work, patterns

Schema = Mapping[str, Any]
Keyword = Callable[[Any, Any, Any, Schema], Iterator[ValidationError] | None]

# Keyword calls (plus items looked up) one validation may make: about 2 CPU-seconds on an idle
# core, 15 on a 2-core machine loaded five times over; a 100,000-item array under a
# five-keyword item schema is all of it.
MAX_STEPS = 500_000
# What an error message shows of a caller's value (the library's shows all of it).
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlist = _SHORT.maxdict = 6


class WorkLimitError(Exception):
    """The validation reached MAX_STEPS."""


class _Budget:
    __slots__ = ("enums", "left")

    def __init__(self, steps: int) -> None:
        self.left = steps
        # The canonical forms of each ``enum`` list met (by identity: the schema outlives it).
        self.enums: dict[int, frozenset[Any]] = {}


_local = threading.local()


def _spend(units: int) -> _Budget | None:
    """Spend ``units`` steps of this thread's validation (none outside ``errors``/``check``)."""
    budget: _Budget | None = getattr(_local, "budget", None)
    if budget is not None:
        budget.left -= units
        if budget.left < 0:
            raise WorkLimitError
        caller_work.checkpoint()
    return budget


def _canonical(value: Any) -> Any:
    """A hashable form of a JSON value, equal exactly when JSON Schema calls two values equal
    (``1 == 1.0``, ``true != 1``, objects whatever their key order)."""
    if value is True or value is False:
        return ("b", value)
    if isinstance(value, str) or value is None or isinstance(value, int | float):
        return value
    if isinstance(value, Mapping):
        return ("o", frozenset((key, _canonical(item)) for key, item in value.items()))
    return ("a", tuple(_canonical(item) for item in value))


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Schema) -> Iterator[ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    _spend(len(instance))
    seen: dict[Any, int] = {}
    for index, item in enumerate(instance):
        key = _canonical(item)
        first = seen.setdefault(key, index)
        if first != index:
            shown = _SHORT.repr(instance)
            yield ValidationError(f"{shown} has non-unique elements (items {first} and {index})")
            return


def _enum(validator: Any, enums: Any, instance: Any, schema: Schema) -> Iterator[ValidationError]:
    budget: _Budget | None = getattr(_local, "budget", None)
    members = None if budget is None else budget.enums.get(id(enums))
    if members is None:
        _spend(len(enums))
        members = frozenset(_canonical(member) for member in enums)
        if budget is not None:
            budget.enums[id(enums)] = members
    if _canonical(instance) not in members:
        yield ValidationError(f"{_SHORT.repr(instance)} is not one of {_SHORT.repr(enums)}")


def _counted(keyword: Keyword) -> Keyword:
    """``keyword``, spending a step per call."""

    @functools.wraps(keyword)
    def counted(
        validator: Any, value: Any, instance: Any, schema: Schema
    ) -> Iterator[ValidationError] | None:
        _spend(1)
        return keyword(validator, value, instance, schema)

    return counted


class SchemaError(ValueError):
    """The schema cannot be used: ``message`` for the caller, ``where`` its JSON pointer path."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.message = message
        self.where = where


def _matches(pattern: str, text: str) -> bool:
    """Whether RE2 finds ``pattern`` in ``text``; PatternError for a pattern it cannot run
    (only in a schema that ``check`` could not see it in: a draft-4 ``patternProperties`` name)."""
    return patterns.search(pattern, text, patterns.Dialect.ECMA)


def _unusable(pattern: str, exc: patterns.PatternError) -> ValidationError:
    return ValidationError(f"the pattern {pattern!r} cannot be used: {exc}")


def _pattern(validator: Any, pattern: str, instance: Any, schema: Schema) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    try:
        found = _matches(pattern, instance)
    except patterns.PatternError as exc:
        yield _unusable(pattern, exc)
        return
    if not found:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, pattern_properties: Schema, instance: Any, schema: Schema
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        try:
            keys = [key for key in instance if _matches(pattern, key)]
        except patterns.PatternError as exc:
            yield _unusable(pattern, exc)
            continue
        for key in keys:
            yield from validator.descend(instance[key], subschema, path=key, schema_path=pattern)


def _pattern_keys(validator: Any, instance: Mapping[str, Any], schema: Schema) -> set[str]:
    """The keys of ``instance`` that a ``patternProperties`` pattern of ``schema`` matches."""
    found: set[str] = set()
    for pattern in schema.get("patternProperties") or {}:
        found.update(key for key in instance if key not in found and _matches(pattern, key))
    return found


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Schema
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    try:
        matched = _pattern_keys(validator, instance, schema)
    except patterns.PatternError as exc:
        yield ValidationError(f"a patternProperties pattern cannot be used: {exc}")
        return
    properties = schema.get("properties") or {}
    extras = sorted((key for key in instance if key not in properties and key not in matched), key=str)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        listed = ", ".join(repr(extra) for extra in extras)
        if "patternProperties" in schema:
            regexes = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            verb = "does" if len(extras) == 1 else "do"
            yield ValidationError(f"{listed} {verb} not match any of the regexes: {regexes}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({listed} {verb} unexpected)")


def _valid(errors: Iterator[ValidationError]) -> bool:
    return next(errors, None) is None


def _evaluated_keys(validator: Any, instance: Mapping[str, Any], schema: Any) -> set[str]:
    """The keys of ``instance`` that ``schema``'s keywords evaluate (JSON Schema 2019-09 and
    2020-12 ``unevaluatedProperties``), following the library's own reading of it."""
    if not isinstance(schema, Mapping):
        return set()
    keys: set[str] = set()
    for keyword in ("$ref", "$dynamicRef", "$recursiveRef"):
        reference = schema.get(keyword)
        if isinstance(reference, str):
            # The library offers no public resolver; its keyword functions use this one too.
            resolved = validator._resolver.lookup("#" if keyword == "$recursiveRef" else reference)  # noqa: SLF001
            scoped = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            keys |= _evaluated_keys(scoped, instance, resolved.contents)
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        keys.update(key for key in instance if key in properties)
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if keyword in schema:
            subschema = schema[keyword]
            keys.update(key for key, value in instance.items() if _valid(validator.descend(value, subschema)))
    keys |= _pattern_keys(validator, instance, schema)
    for key, subschema in (schema.get("dependentSchemas") or {}).items():
        if key in instance:
            keys |= _evaluated_keys(validator, instance, subschema)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword) or ():
            if _valid(validator.descend(instance, subschema)):
                keys |= _evaluated_keys(validator, instance, subschema)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(validator, instance, schema["if"])
            keys |= _evaluated_keys(validator, instance, schema.get("then"))
        else:
            keys |= _evaluated_keys(validator, instance, schema.get("else"))
    return keys


def _unevaluated_properties(
    validator: Any, unevaluated: Any, instance: Any, schema: Schema
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    try:
        evaluated = _evaluated_keys(validator, instance, schema)
    except patterns.PatternError as exc:
        yield ValidationError(f"a patternProperties pattern cannot be used: {exc}")
        return
    failing = [
        key
        for key in instance
        if key not in evaluated
        and not _valid(validator.descend(instance[key], unevaluated, path=key, schema_path=key))
    ]
    if failing:
        listed = ", ".join(repr(key) for key in sorted(failing, key=str))
        verb = "was" if len(failing) == 1 else "were"
        if unevaluated is False:
            yield ValidationError(f"Unevaluated properties are not allowed ({listed} {verb} unexpected)")
        else:
            yield ValidationError(
                "Unevaluated properties are not valid under the given schema "
                f"({listed} {verb} unevaluated and invalid)"
            )


_KEYWORDS: dict[str, Keyword] = {
    "uniqueItems": _unique_items,
    "enum": _enum,
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "unevaluatedProperties": _unevaluated_properties,
}


@cache  # one entry per dialect the library knows: bounded
def _linear(base: type[Validator]) -> type[Validator]:
    own: Mapping[str, Keyword] = base.VALIDATORS
    keywords = {k: _counted(_KEYWORDS.get(k, v)) for k, v in own.items()}
    extended: Any = jsonschema.validators.extend(base, keywords)  # type: ignore[no-untyped-call]
    extended.evolve = functools.partialmethod(_evolve, base)
    return cast("type[Validator]", extended)


def _evolve(self: Any, base: type[Validator], **changes: Any) -> Validator:
    """The library's ``evolve`` (every ``descend`` makes one), except that a subschema naming
    its own ``$schema`` (each of the metaschema's vocabularies does) gets this module's class
    for that dialect, not the library's: its keywords stay linear and counted."""
    schema = changes.setdefault("schema", self.schema)
    kind: Any = type(self)
    if isinstance(schema, Mapping) and "$schema" in schema:
        kind = _linear(jsonschema.validators.validator_for(schema, default=base))
    for name, alias in _fields(kind):
        if alias not in changes:
            changes[alias] = getattr(self, name)
    evolved: Validator = kind(**changes)
    return evolved


@cache  # one entry per class of _linear: bounded
def _fields(kind: Any) -> tuple[tuple[str, str], ...]:
    return tuple((field.name, field.alias) for field in attrs.fields(kind) if field.init)


def _ecma_regex(instance: object) -> bool:
    if isinstance(instance, str):
        patterns.compiled(instance, patterns.Dialect.ECMA)
    return True


@cache  # one entry per dialect: bounded
def _format_checker(base: type[Validator]) -> FormatChecker:
    """The dialect's format checker, with ``regex`` meaning "RE2 runs it as ECMA-262"."""
    checker = FormatChecker(base.FORMAT_CHECKER.checkers)
    checker.checks("regex", raises=patterns.PatternError)(_ecma_regex)
    return checker


class _Budgeted:
    """This thread's validations spend one budget of MAX_STEPS while inside."""

    def __enter__(self) -> None:
        _local.budget = _Budget(MAX_STEPS)

    def __exit__(self, *_: object) -> None:
        _local.budget = None


def _too_much() -> str:
    return f"checking it takes over {MAX_STEPS} steps of work; send a smaller document or a simpler schema"


def check(schema: Schema) -> type[Validator]:
    """The validator class for ``schema`` (its ``$schema`` dialect, 2020-12 when none), or
    SchemaError when the schema is not valid or holds a pattern that cannot run."""
    base = jsonschema.validators.validator_for(schema)
    # The library's check_schema, with the metaschema's own dialect made linear and bounded.
    meta = _linear(jsonschema.validators.validator_for(base.META_SCHEMA, default=base))
    try:
        with _Budgeted():
            checker = meta(base.META_SCHEMA, format_checker=_format_checker(base))
            first = next(checker.iter_errors(dict(schema)), None)
        if first is not None:
            raise jsonschema.SchemaError.create_from(first)
    except WorkLimitError:
        raise SchemaError(f"the schema cannot be checked: {_too_much()}", "") from None
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        if exc.validator == "format" and exc.cause is not None:
            raise SchemaError(f"the pattern {exc.instance!r} cannot be used: {exc.cause}", where) from None
        raise SchemaError(exc.message, where) from None
    return _linear(base)


def errors(validator_class: type[Validator], schema: Schema, instance: Any) -> list[str]:
    """``<json path>: <message>`` for each way ``instance`` fails ``schema``, in path order;
    a ``$ref`` that leads nowhere (nothing is fetched) is one such way, not a fault."""
    try:
        with _Budgeted():
            found = sorted(validator_class(schema).iter_errors(instance), key=lambda e: list(e.absolute_path))
    except referencing.exceptions.Unresolvable as exc:
        return [f"$: the schema's $ref {exc.ref!r} cannot be resolved"]
    except WorkLimitError:
        return [f"$: {_too_much()}"]
    return [f"{e.json_path}: {e.message}" for e in found]
