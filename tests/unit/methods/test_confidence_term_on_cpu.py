"""The HL's confidence term (agent_system/methods/confidence): λ·clip(log-likelihood gain of the reference)."""

import numpy as np

from agent_system.methods.confidence import confidence_bonus


def test_confidence_bonus_is_weighted_and_clipped():
    with_fb = np.array([-0.5, -1.0, -4.0, -1.0])
    without_fb = np.array([-1.0, -4.0, -1.0, -1.0])  # gains 0.5, 3.0, -3.0, 0.0
    np.testing.assert_allclose(confidence_bonus(with_fb, without_fb, weight=2.0, clip=1.0), [1.0, 2.0, -2.0, 0.0])
