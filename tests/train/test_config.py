import pytest

from raystudy.train.config import ConfigError, FinetuneConfig, from_dict, load_config, validate


def test_defaults_are_the_demo_and_valid():
    cfg = validate(load_config("demo"))
    assert cfg.model == "vit_demo" and cfg.dataset == "digits_c"
    assert cfg == validate(FinetuneConfig()).replace(log_every=50)


def test_unknown_key_is_refused_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown config key 'lrr' \(did you mean 'lr'\?\)"):
        from_dict({"lrr": 0.1})


@pytest.mark.parametrize(
    "key,value",
    [("steps", 1.5), ("steps", "ten"), ("lr", "fast"), ("low_data", "yes"), ("betas", [0.9]), ("condition", 3)],
)
def test_mistyped_values_are_refused(key, value):
    with pytest.raises(ConfigError, match=key):
        from_dict({key: value})


def test_numbers_are_coerced_where_safe():
    cfg = from_dict({"lr": 1, "weight_decay": "1e-4", "betas": [0.9, 0.95]})
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.weight_decay == 1e-4
    assert cfg.betas == (0.9, 0.95)


def test_yaml_round_trip(tmp_path):
    import yaml

    cfg = from_dict({"condition": "MHA+FC1", "lr": 0.3, "seed": 42})
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg.to_dict()))
    assert load_config(p) == cfg


@pytest.mark.parametrize(
    "changes,needle",
    [
        ({"model": "vit_nonexistent"}, "unknown model 'vit_nonexistent'"),
        ({"model": "resnet50"}, "not a timm VisionTransformer"),
        ({"dataset": "imagenet9"}, "unknown dataset 'imagenet9'; valid: cifar10"),
        ({"condition": "FC3"}, "unknown component 'FC3'"),
        ({"optimizer": "adam"}, "unknown optimizer 'adam'; valid: sgd, adamw"),
        ({"steps": 0}, "'steps' must be > 0"),
        ({"batch_size": 64, "grad_accum": 5}, "divisible"),
        ({"warmup_steps": 400}, "warmup_steps"),
        ({"weights": "/nonexistent/w.pt"}, "weights file"),
        ({"device": "tpu"}, "unknown device"),
    ],
)
def test_validate_names_the_bad_value(changes, needle):
    with pytest.raises(ConfigError) as e:
        validate(FinetuneConfig().replace(**changes))
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_or_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [0.1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(lst)


def test_config_is_frozen():
    cfg = FinetuneConfig()
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 3.0  # type: ignore[misc]


def test_a_key_added_later_leaves_earlier_trials_their_keys():
    from raystudy.train.config import FinetuneConfig, trial_key

    cfg = FinetuneConfig().to_dict()
    before = {k: v for k, v in cfg.items() if k != "probe_batch_size"}  # a config recorded before the key
    assert trial_key(cfg) == trial_key(before)
    assert trial_key({**cfg, "probe_batch_size": 64}) != trial_key(before)


def test_compile_takes_true_false_or_auto_and_stays_off_by_default():
    from raystudy.train.config import parse_value

    assert FinetuneConfig().compile is False
    assert validate(from_dict({"compile": "auto"})).compile == "auto"
    assert from_dict({"compile": True}).compile is True
    # as a flag (--set compile=...) and as MLflow logs it
    assert parse_value("compile", "auto") == "auto"
    assert parse_value("compile", "true") is True and parse_value("compile", "False") is False
    with pytest.raises(ConfigError, match="unknown compile 'yes'; valid: true, false, auto"):
        validate(from_dict({"compile": "yes"}))
    with pytest.raises(ConfigError, match="'compile' must be true, false or auto"):
        from_dict({"compile": 1.5})
