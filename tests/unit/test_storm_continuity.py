"""The storm's judgement of a resume: the return after it against the return before it."""

from __future__ import annotations

from tests.labtools.storm import continuity

BEFORE = {31: 470.0, 32: 468.0, 33: 480.0, 34: 471.0, 35: 473.0, 36: 472.0}


def test_a_policy_that_starts_over_is_not_continuous() -> None:
    # the curves after a resume that lost the policy: a fresh policy's returns
    returns = {**BEFORE, 37: 18.8, 38: 70.0, 39: 78.0, 40: 144.0, 41: 160.0}
    before, after, continuous = continuity(returns, 36)
    assert before is not None and before > 450
    assert after is not None and after < 100
    assert continuous is False


def test_a_restored_policy_that_dips_for_a_few_iterations_is_continuous() -> None:
    # PPO's own dips: three iterations at 224 on average, then back
    returns = {**BEFORE, 37: 310.0, 38: 150.0, 39: 212.0, 40: 455.0, 41: 490.0}
    assert continuity(returns, 36)[2] is True


def test_iterations_without_an_episode_are_left_out_and_none_at_all_judges_nothing() -> None:
    nan = float("nan")
    assert continuity({**BEFORE, 37: nan, 38: 480.0}, 36)[1:] == (480.0, True)
    assert continuity({**BEFORE, 37: nan}, 36) == (472.8, None, None)
