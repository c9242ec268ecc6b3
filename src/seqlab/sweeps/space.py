"""A search's space: `hydra.sweeper.params` and the command line's sweeps, read into Optuna distributions.

Two ways to write an entry, both as the Hydra user knows them:
- seqlab's own mapping, `{type: float|int|categorical, low, high, log, step | choices}`, or a list of choices;
- Hydra's sweep grammar, as the official Optuna sweeper (hydra-optuna-sweeper) and the
  lightning-hydra-template's `hparams_search` configs take it, as a string in `hydra.sweeper.params`
  or on the command line: `interval(1e-4, 1e-2)`, `int(interval(8, 64))`, `tag(log, interval(...))`,
  `range(8, 64, step=8)`, `choice(32, 64)`, `shuffle(range(1, 4))`, a comma list `32,64`, or one
  value (every trial takes it). They map to distributions as that sweeper maps them
  (`create_optuna_distribution_from_override`): a range's stop is Optuna's high, included.
Each is turned into the mapping first, so that both get the same checks and the same one-line errors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, IntervalSweep, RangeSweep, Transformer
from hydra.errors import HydraException
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from seqlab.sweeps.study import SearchError

if TYPE_CHECKING:
    import optuna
    from hydra.core.override_parser.types import Override

_FIELDS = {
    "float": {"type", "low", "high", "log", "step"},
    "int": {"type", "low", "high", "log", "step"},
    "categorical": {"type", "choices"},
}
GRAMMAR_EXAMPLES = (
    "tag(log, interval(1e-4, 1e-2)), int(interval(8, 64)), range(8, 64, step=8), choice(32, 64)"
)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _parse(line: str, where: str = "") -> Override:
    """One override line, parsed by Hydra; bad grammar is one line (`where`: the entry's place)."""

    try:
        (override,) = OverridesParser.create().parse_overrides([line])
    except HydraException as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        place = f"{where}: {line.split('=', 1)[1]!r}" if where else line
        raise SearchError(
            f"{place}: not Hydra's sweep grammar ({reason}); write e.g. {GRAMMAR_EXAMPLES}"
        ) from None
    return override


def spec_of_override(override: Override, where: str) -> dict[str, Any]:
    """A parsed override (`key=interval(...)`) -> seqlab's mapping, as the official sweeper maps it."""

    if not override.is_sweep_override():
        return {
            "type": "categorical",
            "choices": [override.value()],
        }  # one value: every trial takes it
    value = override.value()
    if isinstance(value, Glob):
        raise SearchError(
            f"{where}: {override.input_line} is a sweep Optuna cannot sample; write e.g. {GRAMMAR_EXAMPLES}"
        )
    if override.is_choice_sweep() or (isinstance(value, RangeSweep) and value.shuffle):
        return {
            "type": "categorical",
            "choices": list(override.sweep_iterator(transformer=Transformer.encode)),
        }
    if isinstance(value, RangeSweep):
        kind = (
            "float"
            if any(isinstance(v, float) for v in (value.start, value.stop, value.step))
            else "int"
        )
        return {"type": kind, "low": value.start, "high": value.stop, "step": value.step}
    if isinstance(value, IntervalSweep):
        kind = "int" if isinstance(value.start, int) and isinstance(value.end, int) else "float"
        return {"type": kind, "low": value.start, "high": value.end, "log": "log" in value.tags}
    raise SearchError(
        f"{where}: {override.input_line} is a sweep Optuna cannot sample; write e.g. {GRAMMAR_EXAMPLES}"
    )


def split_arguments(arguments: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The command line's overrides -> (those every trial takes as given, {key: sweep} for the search).
    `optimizer.lr=tag(log, interval(1e-4, 1e-2))` or `data.batch_size=32,64` joins the space."""
    fixed, swept = [], {}
    for argument in arguments:
        override = _parse(argument)
        if not override.is_sweep_override():
            fixed.append(argument)
            continue
        key = override.get_key_element()
        if key.startswith(("+", "~")) or override.package:
            raise SearchError(
                f"{argument}: a search samples keys the config has; drop the {key[0] if key[0] in '+~' else '@'}"
            )
        swept[key] = argument.split("=", 1)[1]
    return fixed, swept


def parse_space(
    params: Mapping[str, Any], from_command_line: Collection[str] = ()
) -> dict[str, optuna.distributions.BaseDistribution]:
    """hydra.sweeper.params (flattened, with the command line's sweeps) -> Optuna distributions;
    SearchError names the first bad entry where the user wrote it (`from_command_line`: those keys)."""

    space = {}
    if not params:
        raise SearchError(
            "hydra.sweeper.params is empty: give at least one key to search, e.g. "
            "optimizer.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}, or "
            "'optimizer.lr=tag(log, interval(1e-4, 1e-2))' on the command line"
        )
    for key, spec in params.items():
        where = key if key in from_command_line else f"hydra.sweeper.params.{key}"
        if isinstance(spec, str):
            spec = spec_of_override(_parse(f"{key}={spec}", where), where)
        if isinstance(spec, (list, tuple)):
            spec = {"type": "categorical", "choices": list(spec)}
        if not isinstance(spec, Mapping):
            raise SearchError(
                f"{where}: give {{type: float|int|categorical, ...}}, a list of choices or Hydra's "
                f"sweep grammar ({GRAMMAR_EXAMPLES}), got {spec!r}"
            )
        kind = spec.get("type")
        if kind not in _FIELDS:
            raise SearchError(
                f"{where}: unknown distribution {kind!r}; use type: float, int or categorical"
            )
        extra = sorted(set(spec) - _FIELDS[kind])
        if extra:
            raise SearchError(
                f"{where}: {kind} takes {', '.join(sorted(_FIELDS[kind] - {'type'}))}; not {', '.join(extra)}"
            )
        if kind == "categorical":
            choices = spec.get("choices")
            if not isinstance(choices, (list, tuple)) or not choices:
                raise SearchError(
                    f"{where}: categorical needs a non-empty list of choices, got {choices!r}"
                )
            if not all(c is None or isinstance(c, (bool, int, float, str)) for c in choices):
                raise SearchError(
                    f"{where}: choices must be numbers, strings, booleans or null, got {choices!r}"
                )
            space[key] = CategoricalDistribution(list(choices))
            continue
        low, high, log_scale, step = (
            spec.get("low"),
            spec.get("high"),
            bool(spec.get("log", False)),
            spec.get("step"),
        )
        if not (_number(low) and _number(high)):
            raise SearchError(
                f"{where}: {kind} needs numbers low and high, got low={low!r} high={high!r}"
            )
        if low >= high:
            raise SearchError(f"{where}: empty range: low={low} must be below high={high}")
        if log_scale and low <= 0:
            raise SearchError(
                f"{where}: a log range must stay above 0, got low={low}; raise low, or drop log: true"
            )
        if step is not None and (not _number(step) or step <= 0):
            raise SearchError(f"{where}: step must be a positive number, got {step!r}")
        if log_scale and step is not None:
            raise SearchError(
                f"{where}: log: true and step cannot be combined (Optuna samples one or the other)"
            )
        if kind == "int":
            if not all(
                isinstance(v, int) and not isinstance(v, bool) for v in (low, high, step or 1)
            ):
                raise SearchError(
                    f"{where}: int needs whole numbers, got low={low} high={high} step={step}"
                )
            space[key] = IntDistribution(low, high, log=log_scale, step=step or 1)
        else:
            space[key] = FloatDistribution(float(low), float(high), log=log_scale, step=step)
    return space


def flatten_space(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{optimizer: {lr: {type: ...}}} and {optimizer.lr: {type: ...}} alike -> {'optimizer.lr': {...}}.
    Nested keys let the command line change one field (hydra.sweeper.params.optimizer.lr.high=0.1);
    an entry set to null is left out of the search."""
    flat: dict[str, Any] = {}
    for key, spec in params.items():
        name = f"{prefix}{key}"
        if spec is None:
            continue
        if isinstance(spec, Mapping) and "type" not in spec and spec:
            flat.update(flatten_space(spec, f"{name}."))
        else:
            flat[name] = spec
    return flat
