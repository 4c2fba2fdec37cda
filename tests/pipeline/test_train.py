"""The trained_model gate's checks (qpr.pipeline.train.trained_model_checks)."""

import math

import pytest

from qpr.pipeline.train import PRETRAINED_SLACK, trained_model_checks

UNTRAINED = {"val_auc": 1.0, "val_mrr": 0.9851}


def checks(best, *, pretrained, monitor="val_mrr", loss=0.5, initial=UNTRAINED):
    out = trained_model_checks(
        final_train_loss=loss, initial=initial, best=best, pretrained=pretrained, monitor=monitor
    )
    return {c.name: c for c in out}


def test_pretrained_may_lose_a_saturated_auc_by_less_than_the_slack():
    # Quora, all-MiniLM-L6-v2: AUC 1.00000 → 0.99999 while MRR (the monitor) rose.
    got = checks({"val_auc": 1.0 - 1.2e-5, "val_mrr": 0.9853}, pretrained=True)
    assert got["val_auc_gain_over_untrained"].value == pytest.approx(-1.2e-5)
    assert got["val_auc_gain_over_untrained"].bound == -PRETRAINED_SLACK
    assert all(c.passed for c in got.values())


def test_pretrained_gets_no_slack_on_the_monitored_metric():
    got = checks({"val_auc": 1.0, "val_mrr": 0.9850}, pretrained=True)
    assert not got["val_mrr_gain_over_untrained"].passed
    assert got["val_auc_gain_over_untrained"].passed  # no change: not worse
    got = checks({"val_auc": 0.9995, "val_mrr": 0.99}, pretrained=True, monitor="val_auc")
    assert not got["val_auc_gain_over_untrained"].passed


def test_pretrained_fails_beyond_the_slack():
    got = checks({"val_auc": 1.0 - 2 * PRETRAINED_SLACK, "val_mrr": 0.99}, pretrained=True)
    assert not got["val_auc_gain_over_untrained"].passed
    assert got["val_mrr_gain_over_untrained"].passed


def test_random_init_must_gain_on_both():
    initial = {"val_auc": 0.6, "val_mrr": 0.2}
    got = checks({"val_auc": 0.9, "val_mrr": 0.2}, pretrained=False, initial=initial)
    assert got["val_auc_gain_over_untrained"].value == pytest.approx(0.3)
    assert got["val_auc_gain_over_untrained"].passed
    assert not got["val_mrr_gain_over_untrained"].passed  # equal is no gain


def test_a_non_finite_loss_fails():
    got = checks({"val_auc": 1.0, "val_mrr": 0.99}, pretrained=True, loss=math.nan)
    assert not got["final_train_loss_finite"].passed
