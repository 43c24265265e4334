"""The chief's preemption save (parallax/member/preemption.py): a ``tf.function`` step's job saves its own
checkpoint, and says so for its session only: the next session (a later job of the same process, a TF1 graph)
saves through its hook again."""

from __future__ import annotations

from parallax.member import preemption


def test_a_step_that_saves_itself_leaves_the_hook_of_its_own_session_only():
    preemption.PreemptionHook(None, None)  # a first job's session
    assert not preemption.step_saves()
    preemption.saved_by_the_step()  # its tf.function step saves the step's checkpoint itself
    assert preemption.step_saves()
    preemption.PreemptionHook(None, None, "no ckpt_dir")  # the next job's session: its hook saves again
    assert not preemption.step_saves()


def test_without_a_request_the_hook_lets_the_run_go_on():
    assert not preemption.requested()
    preemption.PreemptionHook(None, None).after_run(None, None)  # returns: nothing asked, nothing saved or ended
