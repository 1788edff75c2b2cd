"""Divergence is seen from step 1 and the spike policy acts on it (`trainer.monitor`): the
detector fed loss curves."""

from __future__ import annotations

import json
import math
import random

import pytest

from trainer.monitor import AnomalyDetector
from validation.spec import AlertsSpec


def _kinds(verdict) -> list[tuple[str, str]]:
    return [(a.level, a.kind) for a in verdict.alerts]


def test_the_blow_up_that_went_unnoticed_is_a_p0_divergence_by_step_6():
    # Measured with lr 0.3 (issue): 7.6 -> 29.2 by step 6, seen by the old detector only as P2 throughput.
    det = AnomalyDetector(AlertsSpec(spike_policy="rollback"), vocab_size=2048)
    seen = []
    for step, loss in enumerate([7.6, 9.0, 12.5, 17.0, 22.0, 29.2, 35.0], start=1):
        verdict = det.observe(step, loss, 3.0)
        seen += [(step, *k, verdict.action) for k in _kinds(verdict)]
    first = seen[0]
    assert first == (6, "P0", "divergence", "rollback"), seen
    assert "above ln(vocab)+1" in det.observe(8, 40.0, 3.0).alerts[0].message


@pytest.mark.parametrize(("policy", "action"), [("alert", "stop"), ("stop", "stop"), ("rollback", "rollback")])
def test_a_non_finite_loss_at_step_1_is_a_p0_divergence(policy, action):
    verdict = AnomalyDetector(AlertsSpec(spike_policy=policy), vocab_size=320).observe(1, float("nan"), 1.0)
    assert _kinds(verdict) == [("P0", "divergence")] and verdict.action == action


def test_a_spike_is_judged_against_a_baseline_that_excludes_it():
    det = AnomalyDetector(AlertsSpec(spike_policy="stop"), vocab_size=320)
    for step in range(1, 8):
        assert det.observe(step, 5.0 - 0.05 * step, 1.0).action == "none"
    spike = det.observe(8, 6.5, 1.0)  # +1.9 (40 %) over a quiet curve: a spike, from step 8
    assert _kinds(spike) == [("P1", "loss_spike")] and spike.action == "stop"
    assert 6.5 not in det.losses
    # Consecutive spiking steps: one alert for the episode, the policy still applies...
    again = det.observe(9, 6.6, 1.0)
    assert again.alerts == [] and again.action == "stop"
    # ...and after a healthy step the next spike is alerted again (one spike does not hide the next).
    assert det.observe(10, 4.6, 1.0).action == "none"
    assert _kinds(det.observe(11, 6.7, 1.0)) == [("P1", "loss_spike")]


def test_a_healthy_noisy_curve_raises_nothing():
    rng = random.Random(7)
    det = AnomalyDetector(AlertsSpec(loss_rise_steps=50), vocab_size=320)
    for step in range(1, 600):
        loss = 3.0 + 2.8 * math.exp(-step / 60) + rng.gauss(0, 0.06)
        grad = 1.0 + abs(rng.gauss(0, 0.3))
        verdict = det.observe(step, loss, grad, tokens_per_s=1000 + rng.gauss(0, 30))
        assert verdict.alerts == [], (step, _kinds(verdict))


def test_no_throughput_drop_while_a_resumed_process_warms_up():
    det = AnomalyDetector(AlertsSpec(throughput_drop=0.5), vocab_size=320)
    for step in range(1, 40):
        det.observe(step, 3.0, 1.0, tokens_per_s=1000.0)
    state = json.loads(json.dumps(det.state()))  # as saved in a checkpoint
    resumed = AnomalyDetector(AlertsSpec(throughput_drop=0.5), vocab_size=320)
    resumed.load_state(state)
    resumed.on_resume(39)
    slow = [resumed.observe(39 + i, 3.0, 1.0, tokens_per_s=200.0).alerts for i in range(1, 5)]
    assert slow == [[], [], [], []]  # the first steps of the new process are not judged
    fast = [resumed.observe(44 + i, 3.0, 1.0, tokens_per_s=1000.0).alerts for i in range(12)]
    assert fast == [[]] * 12
    assert _kinds(resumed.observe(60, 3.0, 1.0, tokens_per_s=300.0)) == [("P2", "throughput_drop")]
