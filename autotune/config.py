"""`TrainConfig`: every knob autotune may change, grouped in sections (`data`, `precision`, ...).

Serialised as YAML with dotted keys grouped by section. Building a config checks each field
and every cross-field rule, and reports all the errors at once. Checks that need the
workload or the device (a micro-batch that does not divide the global batch, pinned memory
without CUDA, ...) belong to the loop that applies the config (`autotune.loop`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ConfigError, UserError


# Upper bounds: past them a value is a typo that would fork thousands of processes or
# overflow a C int inside torch, not a setting to measure.
MAX_WORKERS, MAX_PREFETCH, MAX_THREADS, MAX_INT32 = 4096, 1024, 4096, 2**31 - 1
MAX_WORLD, MAX_BUCKET_MB = 65536, 65536


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(_Section):
    num_workers: int = Field(0, ge=0, le=MAX_WORKERS, description="DataLoader worker processes; 0 loads in the training process.")
    prefetch_factor: int | None = Field(None, ge=1, le=MAX_PREFETCH, description="Batches each worker keeps ready; only with workers > 0.")
    pin_memory: bool = Field(False, description="Page-locked host buffers for faster, async copies (CUDA only).")
    persistent_workers: bool = Field(False, description="Keep workers alive between epochs; only with workers > 0.")
    non_blocking: bool = Field(False, description="Asynchronous host-to-device copies.")


class PrecisionConfig(_Section):
    amp: Literal["none", "bf16", "fp16"] = Field("none", description="Autocast dtype; fp16 adds a GradScaler.")
    tf32: bool | None = Field(None, description="TF32 for float32 matmuls and convolutions on CUDA (Ampere or newer); "
                              "null = PyTorch's own setting, left as it is.")


class CompileConfig(_Section):
    mode: Literal["none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = Field(
        "none", description="torch.compile mode; 'none' runs eagerly."
    )


class MemoryConfig(_Section):
    micro_batch_size: int | None = Field(None, ge=1, le=MAX_INT32, description="Gradient accumulation over global/micro steps; null = one pass.")
    activation_checkpointing: bool = Field(False, description="Recompute the hinted blocks' activations in backward.")


class LayoutConfig(_Section):
    channels_last: bool = Field(False, description="Model and 4-D inputs in channels_last memory format.")


class AttentionConfig(_Section):
    backend: Literal["default", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"] = Field(
        "default", description="The scaled_dot_product_attention kernel (a torch.nn.attention.SDPBackend name); "
        "'default' lets PyTorch pick one per call.")


class OptimizerConfig(_Section):
    impl: Literal["default", "foreach", "fused"] = Field("default", description="Optimizer implementation flag.")


class BackendConfig(_Section):
    cudnn_benchmark: bool | None = Field(None, description="cuDNN autotuner for convolutions (CUDA); null = PyTorch's "
                                         "own setting, left as it is.")
    num_threads: int | None = Field(None, ge=1, le=MAX_THREADS, description="Intra-op CPU threads of the training process; null = torch's default.")


class DistributedConfig(_Section):
    """DistributedDataParallel settings. `world_size` comes from the workload (it is recorded
    here, never tuned); 1 means one process and no DDP, and the other keys then keep their
    defaults."""

    world_size: int = Field(1, ge=1, le=MAX_WORLD, description="Processes (ranks) training together; from the workload.")
    bucket_cap_mb: float = Field(25.0, gt=0, le=MAX_BUCKET_MB, description="DDP gradient bucket size in MB: smaller "
                                 "buckets start all-reduce earlier in backward, larger ones send fewer messages.")
    gradient_as_bucket_view: bool = Field(False, description="Gradients are views into DDP's buckets: saves a copy "
                                          "and the memory of one gradient set.")
    static_graph: bool = Field(False, description="The same parameters get gradients every step: lets DDP skip "
                                "per-step bookkeeping.")


def cross_field_errors(nested: dict[str, Any]) -> list[str]:
    """Rules between keys, on raw sections too, so they are reported beside field errors."""
    data = nested.get("data") if isinstance(nested.get("data"), dict) else {}
    dist = nested.get("distributed") if isinstance(nested.get("distributed"), dict) else {}
    errors = []
    if dist.get("world_size", 1) == 1:
        defaults = DistributedConfig.model_fields
        for key in ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph"):
            if key in dist and dist[key] != defaults[key].default:
                errors.append(f"distributed.{key} needs distributed.world_size > 1 (one process runs without DDP: "
                              f"set it to {json.dumps(defaults[key].default)}, or declare the workload's world_size)")
    if data.get("num_workers", 0) == 0:
        if data.get("prefetch_factor") is not None:
            errors.append("data.prefetch_factor needs data.num_workers > 0 (set it to null, or add workers)")
        if data.get("persistent_workers"):
            errors.append("data.persistent_workers needs data.num_workers > 0 (set it to false, or add workers)")
    return errors


class TrainConfig(_Section):
    """Every knob, by section. `TrainConfig()` is what a plain training loop does."""

    data: DataConfig = Field(default_factory=DataConfig)
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig)
    compile: CompileConfig = Field(default_factory=CompileConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    layout: LayoutConfig = Field(default_factory=LayoutConfig)
    attention: AttentionConfig = Field(default_factory=AttentionConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    backend: BackendConfig = Field(default_factory=BackendConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    @model_validator(mode="after")
    def _cross_field(self) -> TrainConfig:
        errors = cross_field_errors(self.model_dump())
        if errors:
            raise ValueError("; ".join(errors))
        return self

    # --- dotted-key access -------------------------------------------------------------
    def flat(self) -> dict[str, Any]:
        """`{"data.num_workers": 0, ...}` for every key."""
        return {f"{s}.{k}": v for s, section in self.model_dump().items() for k, v in section.items()}

    def get(self, key: str) -> Any:
        section, _, name = key.partition(".")
        return getattr(getattr(self, section), name)

    def with_changes(self, changes: dict[str, Any]) -> TrainConfig:
        """A new, validated config with the dotted keys changed."""
        return from_flat({**self.flat(), **changes}, source="changed config")

    def diff(self, other: TrainConfig) -> dict[str, list[Any]]:
        """`{key: [self's value, other's value]}` for the keys that differ."""
        a, b = self.flat(), other.flat()
        return {k: [a[k], b[k]] for k in a if a[k] != b[k]}

    def short(self) -> str:
        """The non-default keys as `key=value`, for tables and logs."""
        changed = TrainConfig().diff(self)
        return ", ".join(f"{k}={v[1]}" for k, v in changed.items()) or "defaults"


KEYS = tuple(TrainConfig().flat())


def _pydantic_errors(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        loc = loc if loc or not err["loc"] else repr(loc)  # a key that is empty text
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown key (known keys: {', '.join(KEYS)})"
        for part in msg.split("; "):
            out.append(f"{loc}: {part}" if loc else part)
    return out


def from_dict(data: dict[str, Any], source: str = "config") -> TrainConfig:
    """Build from nested sections (`{"data": {"num_workers": 2}}`) or dotted keys."""
    if not isinstance(data, dict):
        raise ConfigError([f"expected a mapping of sections (like `data: {{num_workers: 2}}`), got {_kind(data)}"],
                          source)
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise ConfigError([f"key {_short(k)} ({type(k).__name__}) is not a section name or dotted key "
                           f"(known keys: {', '.join(KEYS)})" for k in bad_keys], source)
    if any("." in k for k in data):
        return from_flat(data, source)
    for section, values in data.items():
        if isinstance(values, dict) and any(not isinstance(k, str) for k in values):
            raise ConfigError([f"{section}.{_short(k)}: a key must be text (known keys: {', '.join(KEYS)})"
                               for k in values if not isinstance(k, str)], source)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        errors = _pydantic_errors(exc)
        # Pydantic skips the cross-field validator when a field fails: add its errors here.
        errors += [e for e in cross_field_errors(data) if e not in errors]
        raise ConfigError(errors, source) from None


def from_flat(flat: dict[str, Any], source: str = "config") -> TrainConfig:
    """Build from dotted keys (`{"data.num_workers": 2}`); a whole section may sit beside them
    (`{"data": {...}, "data.num_workers": 2}`) as long as no key is given twice."""
    if not isinstance(flat, dict):
        raise ConfigError([f"expected a mapping of dotted keys, got {_kind(flat)}"], source)
    nested: dict[str, Any] = {}
    errors = []
    dotted = []
    for key, value in flat.items():  # whole sections first, then the dotted keys into them
        if not isinstance(key, str):
            errors.append(f"key {_short(key)} ({type(key).__name__}) is not a dotted key (known keys: {', '.join(KEYS)})")
        elif "." in key:
            dotted.append((key, value))
        elif not key:
            errors.append(f"key '' is empty; give a dotted key like data.num_workers (known keys: {', '.join(KEYS)})")
        else:
            nested[key] = dict(value) if isinstance(value, dict) else value
    for key, value in dotted:
        section, _, name = key.partition(".")
        if not section or not name:
            errors.append(f"key {key!r} is not a dotted key like data.num_workers (known keys: {', '.join(KEYS)})")
            continue
        current = nested.setdefault(section, {})
        if not isinstance(current, dict):
            errors.append(f"{section}: given as {_short(current)} and with the dotted key {key!r}; "
                          f"a section is a mapping of keys, give {section}.* keys only")
        elif name in current:
            errors.append(f"{key}: given twice (as {key} and inside the {section} section); give it once")
        else:
            current[name] = value
    if errors:
        raise ConfigError(errors, source)
    return from_dict(nested, source)


def _kind(value: Any) -> str:
    return {list: "a list", str: "text", int: "a number", float: "a number", bool: "true/false"}.get(
        type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_config(path: str | Path) -> TrainConfig:
    """Read a `tuned.yaml` (or JSON) file into a validated `TrainConfig`."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"config file {str(p)!r} is a folder; give the path of a tuned.yaml written by `autotune tune`.")
    if not p.is_file():
        raise UserError(f"config file {str(p)!r} does not exist: give the path of a tuned.yaml written by `autotune tune`.")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"config file {str(p)!r} is not UTF-8 text (byte {exc.start}: {exc.reason}); "
                        "give a tuned.yaml written by `autotune tune`, or save the file as UTF-8.") from None
    except OSError as exc:
        raise UserError(f"config file {str(p)!r} cannot be read ({exc.strerror}); give a file you can read.") from None
    data = load_yaml(text, f"config file {str(p)!r}")
    return from_dict({} if data is None else data, source=f"config file {str(p)!r}")


def load_yaml(text: str, where: str) -> Any:
    """`yaml.safe_load`, with every way it can fail on bad text (a syntax error, an integer
    of thousands of digits, nesting deeper than Python's stack) as a `UserError` naming `where`."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise UserError(f"{where} is not valid YAML: {detail[:500]}") from None
    except RecursionError:
        raise UserError(f"{where} nests too deeply to be read; give a flat YAML mapping.") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. an int past Python's digit limit
        detail = str(exc).split(";")[0][:200]  # not Python's advice to raise its digit limit
        raise UserError(f"{where} holds a value that cannot be read ({detail}); fix or remove it.") from None


def to_yaml(config: TrainConfig, comments: dict[str, str] | None = None) -> str:
    """YAML by section; `comments[key]` is written after that key's value."""
    comments = comments or {}
    lines = []
    for section, values in config.model_dump().items():
        lines.append(f"{section}:")
        for key, value in values.items():
            text = json.dumps(value) if not isinstance(value, str) else value
            text = "null" if value is None else text
            note = _comment(comments.get(f"{section}.{key}") or "")
            lines.append(f"  {key}: {text}" + (f"  # {note}" if note else ""))
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    """Text that stays one YAML comment: every line break (YAML counts NEL and the Unicode
    line and paragraph separators too) and run of spaces becomes one space, and a character
    YAML does not allow in a file is written as its escape (`\\x1b`)."""
    flat = " ".join(re.split(r"[\s\x85\u2028\u2029]+", str(text))).strip()
    return _NOT_PRINTABLE.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), flat)


# What a YAML stream may hold (YAML 1.1 as PyYAML reads it), surrogates excluded.
_NOT_PRINTABLE = re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]")


def save_config(config: TrainConfig, path: str | Path, comments: dict[str, str] | None = None) -> None:
    from .atomic import write_text

    write_text(Path(path), to_yaml(config, comments))


def json_schema() -> dict[str, Any]:
    return TrainConfig.model_json_schema()
