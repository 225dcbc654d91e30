"""Reads a DeepSpeed JSON config and checks it (pure Python: no torch); ``zero_ref.config`` is its face.

Keys and defaults are DeepSpeed 0.19.8's, taken from its *code* (``runtime/config.py``,
``runtime/zero/config.py``, ``runtime/precision_config.py``, ...). Its documentation disagrees in
places; ``docs=`` records the documented value, ``defaults_table()`` lists both, and
tests/zero_ref/test_config_vs_deepspeed.py instantiates DeepSpeed's own config classes and compares.

Every problem is a ``ConfigError`` (a ValueError) whose message starts with the key's dotted path
and says how to fix it. zero_ref is stricter than DeepSpeed, on purpose:

- an unknown key inside a section is an error with a "did you mean" (DeepSpeed's pydantic sections
  refuse it too). An unknown *top-level* key is read as DeepSpeed reads it: ignored, but with a
  ``ConfigWarning`` that carries the same "did you mean" (scripts keep their own keys there, and
  DeepSpeed runs them). ``parse(..., unknown_keys="error")``, or
  ``warnings.simplefilter("error", ConfigWarning)`` around ``initialize``, makes it an error;
  ``problems()`` — the linter — lists it with the errors;
- a key DeepSpeed has but zero_ref does not implement is an error that says so, unless it asks
  for nothing (``{"enabled": false}``, the default value);
- a key zero_ref accepts but that changes nothing here is listed in ``Config.notes``, which the
  engine prints: nothing is ignored silently;
- the batch arithmetic (zero_ref.config.batch) is checked as soon as the data-parallel size is known,
  and impossible combinations (fp16 + bf16, offload at stage 0, NVMe without a path, ...) are errors.

``parse(config, strict=False)`` reads a config as DeepSpeed would, for a planner (sim.Plan.from_deepspeed)
that models runs zero_ref does not make: what DeepSpeed refuses stays an error, and what only zero_ref
does not implement (a DeepSpeed-only key, a value other than the one zero_ref runs, another optimizer,
partial offload, NVMe without a path yet, ...) is accepted and listed in ``Config.notes``. ``problems()``
lists unknown top-level keys with the errors: a misspelt key would plan, or train, with the default.

The keys themselves — types, defaults, ranges, meaning — are declared once, in
``zero_ref.config.schema`` (which also prints them as a table); the rules that involve several
keys, and the batch arithmetic, are ``zero_ref.config.rules``; this module reads a config.
"""
from __future__ import annotations

import base64
import binascii
import difflib
import gettext
import json
import math
import os
import warnings
from dataclasses import fields, replace

from zero_ref.config.batch import KEYS as BATCH_KEYS, BatchConfig
from zero_ref.config.rules import ConfigRules
from zero_ref.config.schema import (ADAM_TYPES, DEEPSPEED_OPTIMIZERS, SCHEDULER_PARAMS, AioConfig, Config,
                                    OffloadOptimizerConfig, OffloadParamConfig, OptimizerConfig, SchedulerConfig,
                                    defaults_table, format_defaults, kind_of as _kind, section_types, show as _show)
from zero_ref.memory import offload_placement

__all__ = ["ConfigError", "ConfigWarning", "Config", "parse", "problems", "load", "resolve_batch", "offload_sections",
           "defaults_table", "format_defaults", "model_state_placement"]


class ConfigError(ValueError):
    """One problem in a DeepSpeed config. ``key`` is its dotted path, e.g. ``zero_optimization.stage``."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(message)


class ConfigWarning(UserWarning):
    """A top-level key that neither DeepSpeed nor zero_ref reads: DeepSpeed ignores it (the engine goes on)."""


# ---------------------------------------------------------------- public entry points

def load(config) -> dict:
    """The config as a dict: a dict (copied), a path to a JSON file, or base64-encoded JSON (as DeepSpeed).
    ``steps_per_print`` infinity (what accelerate and HF's Trainer write for "never": DeepSpeed's modulo never
    hits it) reads as None, zero_ref's never."""
    raw = _load(config)
    if raw.get("steps_per_print") == float("inf"):
        raw["steps_per_print"] = None
    return raw


def _load(config) -> dict:
    if isinstance(config, dict):
        return dict(config)
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError("config", f"config must be a dict, a path to a JSON file or base64 JSON, "
                                    f"got {type(config).__name__}")
    path = os.fspath(config)
    if os.path.isfile(path):
        with open(path) as f:
            text, where = f.read(), path
    else:
        try:
            text, where = base64.urlsafe_b64decode(path.encode()).decode(), "the base64 config"
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise ConfigError("config", f"config {path!r} is not an existing file (nor base64-encoded JSON); "
                                        "pass the path of your ds_config.json or a dict") from None
    try:
        raw = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise ConfigError("config", f"config {where} is not valid JSON: {e.msg} at line {e.lineno}, "
                                    f"column {e.colno}") from None
    if not isinstance(raw, dict):
        raise ConfigError("config", f"config {where} must hold a JSON object {{...}}, got {type(raw).__name__}")
    return raw


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:  # json keeps the last silently; DeepSpeed's loader refuses (dict_raise_error_on_duplicate_keys)
            raise json.JSONDecodeError(f"duplicate key {k!r}", "", 0)
        out[k] = v
    return out


def problems(config, dp: int | None = None, *, strict: bool = True,
             unknown_keys: str = "error") -> list[ConfigError]:
    """Every problem in ``config`` (empty if it is valid), in the order the keys are read.

    Unknown top-level keys are listed too (``unknown_keys="warn"`` leaves them out, as ``parse`` reads them)."""
    try:
        raw = load(config)
    except ConfigError as e:
        return [e]
    reader = _Reader(strict, unknown_keys)
    cfg = reader.config(raw)
    if dp is not None and not reader.errors:
        reader.ranks_rules(cfg, dp)
        reader.batch(cfg, dp)  # for its errors
    return reader.errors


def parse(config, dp: int | None = None, *, strict: bool = True, unknown_keys: str = "warn") -> Config:
    """A typed ``Config`` from a dict or a JSON path; raises the first ``ConfigError``.

    With ``dp`` (the data-parallel size) the batch keys are resolved and checked: ``cfg.batch``.
    ``strict=False`` accepts what DeepSpeed accepts and zero_ref does not implement, in ``notes``.
    ``unknown_keys``: "warn" (DeepSpeed ignores an unknown top-level key; a ``ConfigWarning`` says so)
    or "error" (the strict opt-in)."""
    raw = load(config)
    reader = _Reader(strict, unknown_keys)
    cfg = reader.config(raw)
    if dp is not None and not reader.errors:
        reader.ranks_rules(cfg, dp)
        cfg = replace(cfg, batch=reader.batch(cfg, dp))
    for w in reader.warned:
        warnings.warn(ConfigWarning(str(w)), stacklevel=2)
    if reader.errors:
        raise reader.errors[0]
    return replace(cfg, notes=tuple(reader.notes))


def resolve_batch(cfg: Config, dp: int) -> BatchConfig:
    """DeepSpeed's batch arithmetic for a parsed config on ``dp`` data-parallel ranks (ConfigError if it fails)."""
    reader = _Reader()
    batch = reader.batch(cfg, dp)
    if reader.errors:
        raise reader.errors[0]
    return batch


def offload_sections(stage: int, offload_optimizer=None, offload_param=None, aio=None):
    """(OffloadOptimizerConfig, OffloadParamConfig, AioConfig) read and checked for ``stage``: the
    offload rules of a whole config, for callers (zero_ref.offload) that get the sections alone."""
    reader = _Reader()
    opt = reader.section(OffloadOptimizerConfig, offload_optimizer, "zero_optimization.offload_optimizer")
    par = reader.section(OffloadParamConfig, offload_param, "zero_optimization.offload_param")
    io = reader.section(AioConfig, aio, "aio")
    if not reader.errors:
        reader.offload_rules(stage, opt, par, io)
    if reader.errors:
        raise reader.errors[0]
    return opt, par, io


# ---------------------------------------------------------------- reading

class _Reader(ConfigRules):
    """Reads sections against the schema, collecting errors (so ``problems`` can report them all);
    the rules across keys and the batch arithmetic are ``ConfigRules``'."""

    def __init__(self, strict: bool = True, unknown_keys: str = "error"):
        if unknown_keys not in ("warn", "error"):
            raise ValueError(f"unknown_keys must be 'warn' or 'error', got {unknown_keys!r}")
        self.strict, self.unknown_keys = strict, unknown_keys
        self.errors: list[ConfigError] = []
        self.warned: list[ConfigError] = []  # unknown top-level keys, when they only warn
        self.notes: list[str] = []

    def error(self, key: str, rest: str) -> None:
        self.errors.append(ConfigError(key, f"{key}{_joined(rest)}"))

    def limit(self, key: str, rest: str, note: str) -> None:
        """What DeepSpeed accepts and zero_ref does not implement: an error (``rest``) when strict,
        else a note (``note``) — a planner models runs that zero_ref does not make."""
        if self.strict:
            self.error(key, rest)
        else:
            self.notes.append(f"{key}{_joined(note)}")

    # -------------------------------------------------------- one value
    def value(self, f, v, key: str):
        """``v`` checked against field ``f``'s type, range and zero_ref support; None marks an error."""
        meta, (kind, optional) = f.metadata, _kind(f)
        if v is None and optional:
            return v
        checked = _typed(kind, v, meta)
        if isinstance(checked, _Bad):
            want = f"one of {', '.join(map(str, meta['choices']))}" if meta.get("choices") else checked.want
            self.error(key, f"must be {want}, got {_show(v)}")
            return _BAD
        v = checked
        for bound, ok, word in (("ge", lambda a, b: a >= b, ">="), ("gt", lambda a, b: a > b, ">"),
                                ("le", lambda a, b: a <= b, "<=")):
            if meta.get(bound) is not None and not ok(v, meta[bound]):
                whole = kind == "int" and (meta.get("ge") in (0, 1) or meta.get("gt") == 0) and bound != "le"
                if whole:  # "a non-negative integer" says it better than ">= 0"
                    self.error(key, f"must be {_typed(kind, None, meta).want}, got {_show(v)}")
                elif meta.get("le") is not None and meta.get("ge") is not None:
                    self.error(key, f"must be in [{meta['ge']:g}, {meta['le']:g}], got {_show(v)}")
                else:
                    self.error(key, f"must be {word} {meta[bound]:g}, got {_show(v)}")
                return _BAD
        if meta.get("choices") and v not in meta["choices"]:
            self.error(key, f"must be one of {', '.join(map(str, meta['choices']))}, got {_show(v)}")
            return _BAD
        if meta.get("only") is not None and v not in meta["only"]:
            self.limit(key, f"={_show(v)} is not supported by zero_ref ({meta['why']}); "
                            f"use {' or '.join(_show(o) for o in meta['only'])} or remove the key",
                       f"={_show(v)} is not implemented in zero_ref ({meta['why']})")
            if self.strict:
                return _BAD
        if meta.get("noop"):
            self.notes.append(f"{key} has no effect in zero_ref: {meta['noop']}")
        return v

    # -------------------------------------------------------- one section
    def section(self, cls, raw, path: str, *, top: bool = False):
        """An instance of dataclass ``cls`` from the dict ``raw`` (the defaults where a key is absent)."""
        if raw is None:
            return cls()
        if isinstance(raw, cls):
            return raw
        if not isinstance(raw, dict):
            self.error(path or "config", f"must be a dict of DeepSpeed keys, got {_show(raw)}")
            return cls()
        known = {f.name: f for f in fields(cls) if f.init and not f.metadata.get("internal")}
        sections = section_types()
        values = {}
        for k, v in raw.items():
            key = f"{path}.{k}" if path else k
            if k not in known:
                self.unknown(cls, key, k, v, known)
                continue
            f = known[k]
            if isinstance(v, str) and v == "auto" and not (top and k in BATCH_KEYS):
                continue  # DeepSpeed drops "auto": the default applies (HF Trainer fills these in)
            if f.metadata.get("reader"):  # a section with its own reader (optimizer, scheduler)
                values[k] = getattr(self, f.metadata["reader"])(v, key)
            elif _kind(f)[0] in sections:
                values[k] = self.section(sections[_kind(f)[0]], v, key)
            else:
                values[k] = self.value(f, v, key)
        return cls(**{k: v for k, v in values.items() if v is not _BAD})

    def unknown(self, cls, key: str, name: str, v, known: dict) -> None:
        ds_only, removed = getattr(cls, "DEEPSPEED_ONLY", {}), getattr(cls, "REMOVED", {})
        hints = getattr(cls, "HINTS", {})
        if name in removed:
            self.error(key, f"was removed from DeepSpeed ({removed[name]}), which rejects it too: remove the key")
        elif name in ds_only:
            if _asks_nothing(v):
                self.notes.append(f"{key} is not implemented in zero_ref; accepted because it is off")
            else:
                self.limit(key, f"is a DeepSpeed key not supported by zero_ref: {ds_only[name]}. Remove it "
                                "(or turn it off)", f"is not implemented in zero_ref: {ds_only[name]}")
        else:
            close = difflib.get_close_matches(name, [*known, *ds_only], n=1, cutoff=0.6)
            if cls is Config and self.unknown_keys == "warn":
                # DeepSpeedConfig reads the top level key by key and never looks at the rest
                # (runtime/config.py, _initialize_params): the run goes on, so here too — with a warning.
                why = hints.get(name) or (f"did you mean {close[0]!r}?" if close else "")
                self.warned.append(ConfigError(key, f"{key} is not a key DeepSpeed or zero_ref reads; both ignore it"
                                                    + (f" ({why})" if why else "")))
            elif name in hints:
                listing = f"; known keys: {', '.join(known)}" if len(known) <= 8 else ""
                self.error(key, f"is not a known key ({hints[name]}){listing}")
            else:
                if close:  # the message a typo gets, in the reader's language (gettext; course/i18n.py)
                    self.error(key, gettext.dgettext("zero_lab", "is not a known key; did you mean {name!r}?")
                               .format(name=close[0]))
                else:
                    self.error(key, f"is not a known key; known keys: {', '.join(known)}")

    # -------------------------------------------------------- special sections
    def optimizer(self, raw, key: str):
        if raw is None:
            return None
        if not isinstance(raw, dict):
            self.error(key, f"must be a dict like {{\"type\": \"AdamW\", \"params\": {{\"lr\": 1e-3}}}}, got {_show(raw)}")
            return _BAD
        extra = sorted(set(raw) - {"type", "params", "legacy_fusion"})
        for k in extra:
            close = difflib.get_close_matches(k, ["type", "params"], n=1, cutoff=0.6)
            self.error(f"{key}.{k}", "is not a known key" + (f"; did you mean {close[0]!r}?" if close else
                                                           ": the optimizer section holds 'type' and 'params'"))
        if raw.get("legacy_fusion", False) is not False:
            self.limit(f"{key}.legacy_fusion", "=true is not supported by zero_ref (it has one Adam); remove it",
                       "=true is not implemented in zero_ref (it has one Adam)")
        name = raw.get("type")
        if not isinstance(name, str):
            self.error(f"{key}.type", f"must name the optimizer ('Adam' or 'AdamW'), got {_show(name)}")
            return _BAD
        if name.lower() not in ADAM_TYPES:
            if name.lower() in DEEPSPEED_OPTIMIZERS:
                self.limit(f"{key}.type", f"={name!r} is not supported by zero_ref: its stages step with Adam(W) "
                                          "only; use 'Adam' or 'AdamW'",
                           f"={name!r} is not implemented in zero_ref (Adam(W) only): the section is not read")
                if not self.strict:
                    return None
            else:
                close = difflib.get_close_matches(name.lower(), ADAM_TYPES, n=1, cutoff=0.6)
                guess = {"adam": "Adam", "adamw": "AdamW"}[close[0]] if close else None
                self.error(f"{key}.type", f"={name!r} is not an optimizer zero_ref knows; "
                                          + (f"did you mean {guess!r}?" if guess else "use 'Adam' or 'AdamW'"))
            return _BAD
        params = raw.get("params", {})
        if isinstance(params, dict) and "max_grad_norm" in params:
            self.error(f"{key}.params.max_grad_norm", "is not an optimizer parameter in DeepSpeed (it raises too): "
                                                      "set the top-level \"gradient_clipping\" instead")
            params = {k: v for k, v in params.items() if k != "max_grad_norm"}
        p = self.section(OptimizerConfig.params_type(), params, f"{key}.params")
        return OptimizerConfig(type=name, params=p)

    def scheduler(self, raw, key: str):
        if raw is None:
            return None
        if not isinstance(raw, dict):
            self.error(key, f"must be a dict like {{\"type\": \"WarmupLR\", \"params\": {{...}}}}, got {_show(raw)}")
            return _BAD
        for k in sorted(set(raw) - {"type", "params"}):
            self.error(f"{key}.{k}", "is not a known key: the scheduler section holds 'type' and 'params'")
        name = raw.get("type")
        if not isinstance(name, str) or name not in SCHEDULER_PARAMS:
            known = ", ".join(SCHEDULER_PARAMS)
            close = difflib.get_close_matches(str(name), SCHEDULER_PARAMS, n=1, cutoff=0.6)
            self.error(f"{key}.type", f"={_show(name)} is not a schedule zero_ref knows; "
                                      + (f"did you mean {close[0]!r}?" if close else f"use one of {known}"))
            return _BAD
        cls = SCHEDULER_PARAMS[name]
        before = len(self.errors)
        params = self.section(cls, raw.get("params", {}), f"{key}.params")
        for f in fields(cls):
            if f.metadata.get("required") and getattr(params, f.name) is None and len(self.errors) == before:
                self.error(f"{key}.params.{f.name}", f"is required by {name}: set it "
                                                     f"({f.metadata['doc'].split(' (')[0]})")
        return SchedulerConfig(type=name, params=params)

    # -------------------------------------------------------- the whole config
    def config(self, raw: dict) -> Config:
        raw = dict(raw)
        if "bf16" in raw and "bfloat16" in raw:
            self.error("bfloat16", "is DeepSpeed's old name for bf16: give one of them, not both")
            raw.pop("bfloat16")
        elif "bfloat16" in raw:
            raw["bf16"] = raw.pop("bfloat16")
        if isinstance(raw.get("zero_optimization"), bool):  # DeepSpeed's legacy form: true means stage 1
            self.notes.append("zero_optimization=true is DeepSpeed's deprecated form of {\"stage\": 1}")
            raw["zero_optimization"] = {"stage": int(raw["zero_optimization"])}
        if isinstance(raw.get("zero_optimization"), dict):
            raw["zero_optimization"] = self.deprecated_zero_keys(raw["zero_optimization"])
        for k in BATCH_KEYS:
            if raw.get(k) == "auto":
                self.error(k, "='auto' is a placeholder that the HuggingFace Trainer fills in; without it, give a "
                              "number (or leave the key out and let the other batch keys determine it)")
                raw.pop(k)
        cfg = self.section(Config, raw, "", top=True)
        zero = cfg.zero_optimization
        if zero.overlap_comm is None:  # DeepSpeed's validator: on for stage 3 only
            cfg = replace(cfg, zero_optimization=replace(zero, overlap_comm=zero.stage == 3))
        # Rules across keys need the keys they involve: skip them if one of those could not be read
        # (an unsupported or unknown *extra* section does not stop them).
        if not {e.key.split(".")[0] for e in self.errors} & {f.name for f in fields(Config)}:
            self.cross_rules(cfg, raw)
        return cfg

    def deprecated_zero_keys(self, zero: dict) -> dict:
        """DeepSpeed's deprecated zero_optimization keys, rewritten as it does (with a note)."""
        zero = dict(zero)
        renames = {"cpu_offload": ("offload_optimizer", {"device": "cpu"}),
                   "cpu_offload_param": ("offload_param", {"device": "cpu"}),
                   "stage3_gather_fp16_weights_on_model_save": ("stage3_gather_16bit_weights_on_model_save", None)}
        for old, (new, section) in renames.items():
            if old not in zero:
                continue
            value = zero.pop(old)
            if new in zero:
                self.error(f"zero_optimization.{old}", f"is the deprecated form of zero_optimization.{new}; "
                                                       "give one of them, not both")
                continue
            if not isinstance(value, bool):
                self.error(f"zero_optimization.{old}", f"must be a bool (true or false), got {_show(value)}")
                continue
            self.notes.append(f"zero_optimization.{old} is deprecated; read as zero_optimization.{new}")
            if section is None:
                zero[new] = value
            elif value:
                zero[new] = section
        if "cpu_offload_use_pin_memory" in zero:
            zero.pop("cpu_offload_use_pin_memory")
            self.notes.append("zero_optimization.cpu_offload_use_pin_memory is deprecated and has no effect "
                              "(DeepSpeed too): set pin_memory in offload_optimizer / offload_param")
        return zero

def _joined(rest: str) -> str:
    """The text after a key: "=value ..." directly, words after a space."""
    return rest if rest.startswith("=") else f" {rest}"


class _Bad:
    def __init__(self, want: str):
        self.want = want


_BAD = _Bad("")


def _typed(kind: str, v, meta):
    """``v`` as ``kind`` ('bool', 'int', 'float', 'str', 'path', 'betas'), or a _Bad saying what was wanted."""
    if kind == "bool":
        return v if isinstance(v, bool) else _Bad("a bool (true or false)")
    if kind == "int":
        ge = meta.get("ge")
        want = ("a non-negative integer" if ge == 0 else "a positive integer" if (ge == 1 or meta.get("gt") == 0)
                else "an integer")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return _Bad(want)
        if isinstance(v, float):  # JSON writes 5e8 as a float; a whole one is fine (pydantic agrees)
            if not math.isfinite(v) or v != int(v):
                return _Bad(want)
            v = int(v)
        return v
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return _Bad("a finite number")
        return float(v)
    if kind == "str":
        if not isinstance(v, str):
            return _Bad("a string")
        fold = meta.get("fold")
        return v.lower() if fold == "lower" else v.upper() if fold == "upper" else v
    if kind == "path":
        return os.fspath(v) if isinstance(v, (str, os.PathLike)) else _Bad("a path (a string)")
    if kind == "betas":
        ok = (isinstance(v, (list, tuple)) and len(v) == 2
              and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in v))
        return tuple(float(b) for b in v) if ok else _Bad("two numbers in [0, 1), e.g. [0.9, 0.999]")
    raise AssertionError(f"unknown kind {kind!r}")


def _asks_nothing(v) -> bool:
    """A DeepSpeed section or flag that is off: None, false, {}, or {"enabled": false, ...}."""
    return v is None or v is False or v == {} or (isinstance(v, dict) and v.get("enabled") is False)


def model_state_placement(cfg: Config, num_params: int) -> dict:
    """Bytes of model states one rank holds on each tier (gpu / cpu / nvme) under this config, by
    zero_ref.memory's formulas: stage, precision, offload devices and the data-parallel size of
    ``cfg.batch`` (parse with ``dp=``)."""
    if cfg.batch is None:
        raise ConfigError("dp", "dp: parse the config with dp=... first (the data-parallel size divides the states)")
    z = cfg.zero_optimization
    return offload_placement(num_params, zero_stage=z.stage, dp=cfg.batch.dp, precision=cfg.precision,
                             offload_optimizer=(z.offload_optimizer or OffloadOptimizerConfig()).device,
                             offload_param=(z.offload_param or OffloadParamConfig()).device)
