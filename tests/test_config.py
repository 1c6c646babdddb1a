"""TrainConfig: dotted `section.knob` keys, YAML round trip, every error listed at once."""

from __future__ import annotations

import json

import pytest
import yaml

from autotune import TrainConfig, load_config, save_config
from autotune.config import KEYS, from_dict, from_flat, json_schema, to_yaml
from autotune.errors import ConfigError, UserError

DESIGN_KEYS = {
    "data.num_workers": 0,
    "data.prefetch_factor": None,
    "data.pin_memory": False,
    "data.persistent_workers": False,
    "data.non_blocking": False,
    "precision.amp": "none",
    "precision.tf32": None,
    "compile.mode": "none",
    "memory.micro_batch_size": None,
    "memory.activation_checkpointing": False,
    "layout.channels_last": False,
    "attention.backend": "default",  # beyond the design's keys: the attention recipe's
    "optimizer.impl": "default",
    "backend.cudnn_benchmark": None,
    "backend.num_threads": None,
    "distributed.world_size": 1,
    "distributed.bucket_cap_mb": 25.0,
    "distributed.gradient_as_bucket_view": False,
    "distributed.static_graph": False,
}

NON_DEFAULT = {
    "data.num_workers": 3,
    "data.prefetch_factor": 4,
    "data.pin_memory": True,
    "data.persistent_workers": True,
    "data.non_blocking": True,
    "precision.amp": "bf16",
    "precision.tf32": True,
    "compile.mode": "max-autotune-no-cudagraphs",
    "memory.micro_batch_size": 16,
    "memory.activation_checkpointing": True,
    "layout.channels_last": True,
    "attention.backend": "MATH",
    "optimizer.impl": "fused",
    "backend.cudnn_benchmark": True,
    "backend.num_threads": 1,
    "distributed.world_size": 2,
    "distributed.bucket_cap_mb": 5.0,
    "distributed.gradient_as_bucket_view": True,
    "distributed.static_graph": True,
}


def _errors(data) -> list[str]:
    with pytest.raises(ConfigError) as info:
        from_dict(data)
    return info.value.errors


# --- keys and defaults -------------------------------------------------------------------


def test_flat_has_exactly_the_design_keys_with_plain_defaults():
    flat = TrainConfig().flat()
    assert flat == DESIGN_KEYS
    assert set(KEYS) == set(DESIGN_KEYS)


def test_get_reads_dotted_keys():
    cfg = from_flat(NON_DEFAULT)
    for key, value in NON_DEFAULT.items():
        assert cfg.get(key) == value


def test_every_choice_of_the_enum_keys_is_accepted():
    for amp in ("none", "bf16", "fp16"):
        assert from_flat({"precision.amp": amp}).precision.amp == amp
    for mode in ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        assert from_flat({"compile.mode": mode}).compile.mode == mode
    for impl in ("default", "foreach", "fused"):
        assert from_flat({"optimizer.impl": impl}).optimizer.impl == impl


# --- YAML round trip ---------------------------------------------------------------------


@pytest.mark.parametrize("flat", [{}, NON_DEFAULT, {"compile.mode": "reduce-overhead", "precision.amp": "none"}])
def test_yaml_round_trip(tmp_path, flat):
    cfg = from_flat(flat) if flat else TrainConfig()
    path = tmp_path / "tuned.yaml"
    path.write_text(to_yaml(cfg))
    back = load_config(path)
    assert back == cfg
    assert back.flat() == cfg.flat()


def test_yaml_is_grouped_by_section_with_comments(tmp_path):
    cfg = from_flat({"data.num_workers": 2})
    text = to_yaml(cfg, comments={"data.num_workers": "measured 1.8x"})
    parsed = yaml.safe_load(text)
    assert set(parsed) == {"data", "precision", "compile", "memory", "layout", "attention", "optimizer", "backend",
                           "distributed"}
    assert parsed["data"]["num_workers"] == 2
    assert "# measured 1.8x" in text
    path = tmp_path / "out" / "tuned.yaml"
    path.parent.mkdir()
    save_config(cfg, path, comments={"data.num_workers": "measured 1.8x"})
    assert load_config(path) == cfg


def test_load_config_accepts_dotted_keys_and_json(tmp_path):
    p = tmp_path / "dotted.yaml"
    p.write_text("data.num_workers: 2\nprecision.amp: bf16\n")
    cfg = load_config(p)
    assert cfg.data.num_workers == 2 and cfg.precision.amp == "bf16"
    j = tmp_path / "cfg.json"
    j.write_text(json.dumps({"memory": {"micro_batch_size": 8}}))
    assert load_config(j).memory.micro_batch_size == 8


def test_empty_yaml_is_the_default_config(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("")
    assert load_config(p) == TrainConfig()


def test_load_config_missing_file_and_bad_yaml_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(bad)


# --- errors, all at once -----------------------------------------------------------------


def test_unknown_keys_are_listed_with_the_known_keys():
    errs = _errors({"data": {"num_wokers": 2}, "precison": {"amp": "bf16"}})
    assert len(errs) == 2, errs
    text = "\n".join(errs)
    assert "data.num_wokers" in text and "precison" in text
    assert "unknown key" in text and "data.num_workers" in text


def test_unknown_dotted_key_is_an_error():
    with pytest.raises(ConfigError, match="layout.channel_last"):
        from_flat({"layout.channel_last": True})


def test_bad_values_are_all_listed():
    errs = _errors({
        "data": {"num_workers": -1},
        "precision": {"amp": "fp8"},
        "compile": {"mode": "fast"},
        "memory": {"micro_batch_size": 0},
        "optimizer": {"impl": "apex"},
        "backend": {"num_threads": 0},
    })
    assert len(errs) == 6, errs
    for key in ("data.num_workers", "precision.amp", "compile.mode", "memory.micro_batch_size",
                "optimizer.impl", "backend.num_threads"):
        assert any(e.startswith(key) for e in errs), (key, errs)


def test_cross_field_rules_are_listed_together():
    errs = _errors({"data": {"prefetch_factor": 2, "persistent_workers": True}})
    assert len(errs) == 2, errs
    assert any("prefetch_factor" in e for e in errs)
    assert any("persistent_workers" in e for e in errs)
    # with workers both are fine
    cfg = from_dict({"data": {"num_workers": 1, "prefetch_factor": 2, "persistent_workers": True}})
    assert cfg.data.prefetch_factor == 2


def test_cross_field_and_field_errors_are_listed_at_once():
    """Invalid combinations are rejected with every error listed at once."""
    errs = _errors({
        "data": {"prefetch_factor": 2, "persistent_workers": True},
        "precision": {"amp": "fp8"},
    })
    assert len(errs) == 3, errs
    assert any("prefetch_factor" in e for e in errs)
    assert any("persistent_workers" in e for e in errs)
    assert any("precision.amp" in e for e in errs)


def test_config_error_message_counts_and_lists_every_error():
    with pytest.raises(ConfigError) as info:
        from_dict({"data": {"num_workers": -1}, "backend": {"num_threads": 0}}, source="config file 'x.yaml'")
    msg = str(info.value)
    assert "config file 'x.yaml'" in msg and "2 error(s)" in msg
    assert "data.num_workers" in msg and "backend.num_threads" in msg
    assert isinstance(info.value, UserError)


def test_not_a_mapping_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="mapping"):
        from_dict(["data"])
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError):
        load_config(p)


# --- with_changes / diff / short ---------------------------------------------------------


def test_with_changes_returns_a_new_validated_config():
    base = TrainConfig()
    changed = base.with_changes({"data.num_workers": 2, "data.prefetch_factor": 4, "precision.amp": "bf16"})
    assert changed.data.num_workers == 2 and changed.data.prefetch_factor == 4
    assert changed.precision.amp == "bf16"
    assert base == TrainConfig()  # unchanged
    with pytest.raises(ConfigError) as info:
        base.with_changes({"data.prefetch_factor": 4, "precision.amp": "int8"})
    assert any("precision.amp" in e for e in info.value.errors)


def test_diff_and_short():
    base = TrainConfig()
    other = base.with_changes({"data.num_workers": 2, "layout.channels_last": True})
    assert base.diff(other) == {"data.num_workers": [0, 2], "layout.channels_last": [False, True]}
    assert other.diff(base) == {"data.num_workers": [2, 0], "layout.channels_last": [True, False]}
    assert base.diff(base) == {}
    assert base.short() == "defaults"
    assert other.short() == "data.num_workers=2, layout.channels_last=True"


def test_assignment_is_validated():
    cfg = TrainConfig()
    with pytest.raises(Exception):
        cfg.precision.amp = "fp8"


# --- JSON schema -------------------------------------------------------------------------


def test_json_schema_describes_every_section_and_key():
    schema = json_schema()
    json.dumps(schema)  # serialisable
    assert set(schema["properties"]) == {"data", "precision", "compile", "memory", "layout", "attention", "optimizer",
                                         "backend", "distributed"}
    defs = schema["$defs"]
    by_section = {
        "DataConfig": {"num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "non_blocking"},
        "PrecisionConfig": {"amp", "tf32"},
        "CompileConfig": {"mode"},
        "MemoryConfig": {"micro_batch_size", "activation_checkpointing"},
        "LayoutConfig": {"channels_last"},
        "OptimizerConfig": {"impl"},
        "BackendConfig": {"cudnn_benchmark", "num_threads"},
    }
    for name, keys in by_section.items():
        assert set(defs[name]["properties"]) == keys
        assert defs[name].get("additionalProperties") is False
        for prop in defs[name]["properties"].values():
            assert prop.get("description")
    assert set(defs["PrecisionConfig"]["properties"]["amp"]["enum"]) == {"none", "bf16", "fp16"}
