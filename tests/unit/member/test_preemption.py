"""A rank's side of preemption (parallax/member/preemption.py), in this process: a job's state, the one
registration of the signals (which reaches the job of the moment and keeps a request for a later job), the chief's
hook (save, then raise ``Preempted``), and the doors that turn ``Preempted`` into the preempted exit code: the
session's ``run`` in a program's ``while not sess.should_stop()`` loop, and a ``tf.function`` step's call. The
process's exit is ``os._exit``, replaced here by one that raises :class:`_Exited`."""

from __future__ import annotations

import os
import signal
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.errors import Preempted
from parallax.launch.runner import PREEMPTED_EXIT_CODE
from parallax.member import preemption
from parallax.member.preemption import Preemption, PreemptionHook
from tests.models import build_mlp
from tests.unit.runtime import session_fakes

model = session_fakes.model


class _Exited(BaseException):
    """What the replaced ``os._exit`` raises: the process would have ended with ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@pytest.fixture
def exits(monkeypatch):
    """``os._exit`` raises :class:`_Exited` while the test runs."""

    def exit_(code: int) -> None:
        raise _Exited(code)

    monkeypatch.setattr(os, "_exit", exit_)


@pytest.fixture
def registration(monkeypatch):
    """This process's registration for the test (no handler given to ``signal``: a signal is its ``on_term`` or
    ``on_usr1`` called), telling ``notified`` of each SIGTERM it passes on."""
    notified: list[bool] = []
    signals = preemption._Signals(lambda: notified.append(True))
    signals.notified = notified  # type: ignore[attr-defined]
    monkeypatch.setattr(preemption, "_SIGNALS", signals)
    yield signals
    if signals.timer is not None:
        signals.timer.cancel()


# --------------------------------------------------------------------------- a job's state
def test_a_jobs_state_is_asked_by_request_and_left_to_its_step_by_the_step():
    job = Preemption()
    assert not job.requested and not job.step_saves
    job.request()
    job.leave_to_the_step()
    assert job.requested and job.step_saves
    assert Preemption(requested=True).requested


def test_a_step_that_saves_itself_leaves_the_hook_of_its_own_job_only(registration):
    first = preemption.for_this_job()
    first.leave_to_the_step()  # its tf.function step saves the step's checkpoint itself
    second = preemption.for_this_job()  # the next job of the same process (a TF1 graph): its hook saves again
    assert first.step_saves and not second.step_saves


def test_a_process_that_takes_no_signals_has_no_jobs_state(monkeypatch):
    monkeypatch.setattr(preemption, "_SIGNALS", None)
    assert preemption.for_this_job() is None


# --------------------------------------------------------------------------- the registration
def test_a_signal_reaches_the_job_of_the_moment_and_every_job_begun_after_it(registration):
    first = preemption.for_this_job()
    second = preemption.for_this_job()  # the registration now reaches this job, not the first
    registration.on_usr1(signal.SIGUSR1, None)  # the launcher's request
    assert second.requested and not first.requested
    assert registration.notified == [] and registration.timer is None  # the launcher knows already
    assert preemption.for_this_job().requested  # a job begun after the request: the process is going away


def test_a_sigterm_tells_the_launcher_once_and_bounds_the_wait(registration):
    job = preemption.for_this_job()
    registration.on_term(signal.SIGTERM, None)
    timer = registration.timer
    assert job.requested and registration.notified == [True]
    assert timer is not None and timer.daemon and timer.interval == registration.give_up_after
    registration.on_term(signal.SIGTERM, None)  # asked already: nothing more
    assert registration.notified == [True] and registration.timer is timer


def test_a_sigterm_after_the_launchers_request_tells_the_launcher_nothing(registration):
    registration.on_usr1(signal.SIGUSR1, None)
    registration.on_term(signal.SIGTERM, None)
    assert registration.notified == [] and registration.timer is None


def test_a_process_whose_job_did_not_end_ends_itself(registration, exits, parallax_warnings):
    with pytest.raises(_Exited) as exited:
        registration._give_up()
    assert exited.value.code == PREEMPTED_EXIT_CODE == 143
    assert parallax_warnings == [f"Parallax: asked to end {registration.give_up_after:.0f} s ago (SIGTERM), and the "
                                 "job has not ended: this process ends"]


def test_install_takes_both_signals_once_from_the_main_thread(monkeypatch):
    monkeypatch.setattr(preemption, "_SIGNALS", None)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        elsewhere = threading.Thread(target=preemption.install, args=(lambda: None,))
        elsewhere.start()
        elsewhere.join()
        assert preemption._SIGNALS is None  # a signal handler is the main thread's
        notified: list[bool] = []
        preemption.install(lambda: notified.append(True))
        registration = preemption._SIGNALS
        preemption.install(lambda: pytest.fail("a second registration"))
        assert preemption._SIGNALS is registration
        assert signal.getsignal(signal.SIGTERM) == registration.on_term  # else the SIGTERM below ends pytest
        assert signal.getsignal(signal.SIGUSR1) == registration.on_usr1
        job = preemption.for_this_job()
        signal.raise_signal(signal.SIGTERM)  # handled before raise_signal returns
        assert job.requested and notified == [True]
        registration.timer.cancel()
        signal.raise_signal(signal.SIGUSR1)
        assert notified == [True]
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
        if preemption._SIGNALS is not None and preemption._SIGNALS.timer is not None:
            preemption._SIGNALS.timer.cancel()


# --------------------------------------------------------------------------- the chief's hook
class _Saver:
    """The chief's saver: records each save and names the checkpoint as TensorFlow's does."""

    def __init__(self) -> None:
        self.saves: list[tuple] = []

    def save(self, sess, save_path, global_step=None, write_meta_graph=True):
        self.saves.append((sess, save_path, global_step, write_meta_graph))
        return f"{save_path}-{global_step}"


class _Session:
    """The run context's session: the global step is at ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def run(self, fetches):
        return self.step


def _hook(job: Preemption, saver, ckpt_dir, why_not: str = "") -> PreemptionHook:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.create_global_step()
        hook = PreemptionHook(job, saver, ckpt_dir, why_not)
        hook.begin()
    return hook


def test_without_a_request_the_hook_lets_the_run_go_on():
    saver = _Saver()
    _hook(Preemption(), saver, "/ckpt").after_run(SimpleNamespace(session=_Session(7)), None)
    assert saver.saves == []


def test_once_asked_the_hook_saves_the_step_after_the_run_then_raises():
    saver, session = _Saver(), _Session(7)
    with pytest.raises(Preempted, match=r"^preempted: the chief saved global step 7 to /ckpt/model.ckpt-7$") as e:
        _hook(Preemption(requested=True), saver, "/ckpt").after_run(SimpleNamespace(session=session), None)
    assert e.value.said == "saved global step 7 to /ckpt/model.ckpt-7"
    assert saver.saves == [(session, os.path.join("/ckpt", "model.ckpt"), 7, False)]


def test_a_hook_that_cannot_save_says_why_and_raises():
    hook = _hook(Preemption(requested=True), None, "/ckpt", "the optimizer slots are sharded over the workers")
    with pytest.raises(Preempted) as e:
        hook.after_run(SimpleNamespace(session=_Session(3)), None)
    assert e.value.said == "saved nothing (the optimizer slots are sharded over the workers)"
    with pytest.raises(Preempted) as e:
        _hook(Preemption(requested=True), _Saver(), None).after_run(SimpleNamespace(session=_Session(3)), None)
    assert e.value.said == "saved nothing (no CheckPointConfig.ckpt_dir)"


def test_the_hook_leaves_the_save_to_a_step_that_saves_itself():
    job, saver = Preemption(requested=True), _Saver()
    job.leave_to_the_step()
    _hook(job, saver, "/ckpt").after_run(SimpleNamespace(session=_Session(7)), None)
    assert saver.saves == []


# --------------------------------------------------------------------------- the doors
def test_the_doors_exit_says_what_the_chief_did_and_ends_with_143(exits, parallax_warnings):
    with pytest.raises(_Exited) as exited:
        Preemption().end(Preempted("saved global step 6 to /run/ckpt/model.ckpt-6"))
    assert exited.value.code == PREEMPTED_EXIT_CODE == 143
    assert parallax_warnings == ["Parallax: preempted: the chief saved global step 6 to /run/ckpt/model.ckpt-6; "
                                 "exiting with code 143"]


def test_the_sessions_run_is_the_door(model, monkeypatch, exits, parallax_warnings):
    def preempted_run(*args, **kwargs):  # the chief's hook saved after the run
        raise Preempted("saved global step 1 to /ckpt/model.ckpt-1")

    monkeypatch.setattr(model.fake, "run", preempted_run)
    with pytest.raises(_Exited) as exited:
        model.session(preemption=Preemption()).run(model.ops.total, feed_dict={model.ops.x: session_fakes.X})
    assert exited.value.code == 143
    assert parallax_warnings == ["Parallax: preempted: the chief saved global step 1 to /ckpt/model.ckpt-1; exiting "
                                 "with code 143"]
    with pytest.raises(Preempted):  # a session of no job's preemption state: no door of its own
        model.session().run(model.ops.total, feed_dict={model.ops.x: session_fakes.X})


def test_a_programs_loop_ends_at_the_session_with_the_checkpoint_of_the_step_it_reached(
        tmp_path, registration, exits, parallax_warnings):
    """A TF1 program's ``while not sess.should_stop(): sess.run(train_op)`` on one worker: asked to end after its
    third step, the chief saves global step 4 after the next run, and the process ends in that ``sess.run`` with
    143."""
    trained = build_mlp("gd")
    resources = tmp_path / "resource_info"
    resources.write_text("localhost: cpu:0\n")
    config = parallax.Config(ckpt_config=parallax.CheckPointConfig(ckpt_dir=str(tmp_path / "ckpt"),
                                                                   save_ckpt_steps=1000))
    sess, *_ = parallax.parallel_run(trained.graph, str(resources), parallax_config=config)
    x = np.ones((2, 4), np.float32)
    feeds = {trained.inputs["x"]: [x], trained.inputs["y"]: [x[:, :1]]}
    runs = 0
    try:
        with pytest.raises(_Exited) as exited:
            while not sess.should_stop():
                if runs == 3:
                    registration.on_usr1(signal.SIGUSR1, None)
                sess.run(trained.train_op, feed_dict=feeds)
                runs += 1
        assert (exited.value.code, runs) == (143, 3)
        path = os.path.join(str(tmp_path / "ckpt"), "model.ckpt-4")
        assert parallax_warnings[-1] == f"Parallax: preempted: the chief saved global step 4 to {path}; exiting " \
                                        "with code 143"
        assert tf.train.load_checkpoint(path).get_tensor("global_step") == 4
    finally:
        sess.close()


def test_a_tf_function_steps_call_is_the_door_after_the_steps_own_checkpoint(
        tmp_path, registration, exits, parallax_warnings):
    from tests.tf2.checkpoint_programs import build
    from tests.tf2.programs import batches

    train_step, _, optimizer, checkpoint = build("keras3-adam")
    resources = tmp_path / "resource_info"
    resources.write_text("localhost: cpu:0\n")
    ckpt = tmp_path / "ckpt"
    config = parallax.Config(ckpt_config=parallax.CheckPointConfig(ckpt_dir=str(ckpt), save_ckpt_steps=1000,
                                                                   checkpoint=checkpoint))
    step, *_ = parallax.parallel_run(train_step, str(resources), parallax_config=config)
    data = batches(4)
    try:
        for ids, y in data[:2]:
            step(ids, y)
        registration.on_usr1(signal.SIGUSR1, None)
        with pytest.raises(_Exited) as exited:
            step(*data[2])
        assert exited.value.code == 143
        assert parallax_warnings[-1] == f"Parallax: preempted: the chief saved the step's checkpoint at step 3 in " \
                                        f"{ckpt}; exiting with code 143"
        assert tf.train.latest_checkpoint(str(ckpt)).endswith("ckpt-3")
    finally:
        step.close()
    assert int(optimizer.iterations.numpy()) == 3
