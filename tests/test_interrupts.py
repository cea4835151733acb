"""Interventions that nothing can leave half-applied (issue 13, finding 6).

A SIGALRM handler raises KeyboardInterrupt around an intervention context (a weight transplant +
positional permutation + uniform ablation + MASK substitution) or a ``model.hooks`` /
``run_with_hooks`` call; afterwards the model must be exactly as before: no hook attached (at
TransformerLens's level and at PyTorch's), the same ``nn.Parameter`` objects holding
bit-identical data, and the signal handlers the test installed.

Where the signal lands is chosen two ways. A trace function (:class:`Injector`) raises it at
chosen points of the interpreter's own schedule, the same in every run: the places where CPython
runs pending signal handlers (a function's start, the instruction after a call, a backward
jump), spread over ``__enter__``, the body and ``__exit__``, so every phase is covered however
fast or busy the machine is. A real timer (``setitimer``) at random delays checks the same with
the interpreter's own delivery; how many of its runs it interrupts depends on the machine's
speed, so it only asserts a floor that a run of milliseconds cannot miss.
"""

from __future__ import annotations

import dis
import random
import signal
import sys
import threading
import time
from collections import Counter

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.interventions import (MaskSubstitution, PositionalPermutation,
                                     UniformAttentionAblation, WeightTransplant, compose)

# The SIGINT handler the test process started with (SIG_IGN in a background job, such as CI's).
SIGINT_AT_START = signal.getsignal(signal.SIGINT)

pytestmark = pytest.mark.skipif(
    not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread(),
    reason="needs SIGALRM / setitimer on the main thread")

CFG = tm.EncoderConfig(n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=16)


class Alarm:
    """SIGALRM raises KeyboardInterrupt once per arming; records the phase it landed in."""

    def __init__(self):
        self.armed = False
        self.phase = "idle"
        self.landed: Counter = Counter()

    def __call__(self, signum, frame):
        if self.armed:
            self.armed = False
            self.landed[self.phase] += 1
            raise KeyboardInterrupt

    def arm(self, delay: float) -> None:
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, max(delay, 1e-6))

    def disarm(self) -> None:
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


@pytest.fixture()
def alarm():
    """The SIGALRM handler; grad mode off for the whole test and restored after it (not with
    ``torch.no_grad()`` inside the interrupted region: an interrupt in its ``__exit__`` would leave
    grad mode off for every later test)."""
    handler = Alarm()
    old, grad = signal.signal(signal.SIGALRM, handler), torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        yield handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        torch.set_grad_enabled(grad)


def state(model):
    """Everything an intervention may touch: parameter objects, their data, hooks."""
    return [(name, p, p.data.data_ptr(), p.detach().clone()) for name, p in model.named_parameters()]


def assert_untouched(model, before, handler):
    now = list(model.named_parameters())
    assert [n for n, _ in now] == [n for n, *_ in before]
    for (name, p), (_, p0, ptr0, data0) in zip(now, before):
        assert p is p0, f"{name}: a different Parameter object"
        assert p.data.data_ptr() == ptr0 and torch.equal(p.detach(), data0), f"{name}: data changed"
        prefix, _, leaf = name.rpartition(".")
        assert model.get_submodule(prefix)._parameters[leaf] is p0, f"{name}: slot substituted"
    assert model.active_hook_count() == 0
    for name, hp in model.hook_dict.items():
        assert not hp._forward_hooks and not hp._backward_hooks, f"{name}: a torch hook left"
    assert model.context_level == 0
    assert signal.getsignal(signal.SIGALRM) is handler
    assert signal.getsignal(signal.SIGINT) is SIGINT_AT_START  # as the test found it
    assert not torch.is_grad_enabled()  # the fixture's setting, untouched


def interrupted_trials(model, alarm, run, delays, check, want_hits=None):
    """Run ``run(alarm)`` once per delay with an alarm armed, ``check()`` after each; stop early
    once ``want_hits`` runs were interrupted. Returns (runs, interrupted runs)."""
    runs = hits = 0
    for delay in delays:
        runs += 1
        try:
            try:
                alarm.phase = "enter"
                alarm.arm(delay)
                run(alarm)
                alarm.phase = "after"
            finally:
                alarm.disarm()
        except KeyboardInterrupt:
            hits += 1
        check()
        if want_hits is not None and hits >= want_hits:
            break
    return runs, hits


def timed(run, alarm, n=5):
    """Median seconds of each phase of ``run`` (no alarm)."""
    marks = {"enter": [], "body": [], "exit": []}
    for _ in range(n):
        t = [time.perf_counter()]
        alarm.phase = "enter"
        run(alarm, clock=t)
        for key, a, b in (("enter", 0, 1), ("body", 1, 2), ("exit", 2, 3)):
            marks[key].append(t[b] - t[a])
    return {k: sorted(v)[len(v) // 2] for k, v in marks.items()}


def delays_for(phases, n, rng):
    """Up to ``n`` (delay, with a body?) pairs: spread over the whole context, in the enter phase,
    around the end of the body and the exit, and over contexts with an empty body (where the exit
    follows the enter at once)."""
    enter, body, exit_ = phases["enter"], phases["body"], phases["exit"]
    total = enter + body + exit_
    for i in range(n):
        kind = i % 4
        if kind == 0:
            yield rng.uniform(0, 1.2 * total), True
        elif kind == 1:
            yield rng.uniform(0, 1.5 * enter), True
        elif kind == 2:
            yield rng.uniform(enter + 0.7 * body, 1.3 * total), True
        else:
            yield rng.uniform(0, 1.3 * (enter + exit_)), False


def composition():
    """A model, a batch of 4x4 rank-1 matrices, and four interventions composed: a weight
    transplant, a positional permutation, a uniform ablation and a MASK substitution."""
    model = tm.HookedEncoder(CFG, seed=0).eval()
    donor = tm.HookedEncoder(CFG, seed=1).eval()
    tokens = tm.MatrixCompletionTask(4, rank=1).sample(
        8, generator=torch.Generator().manual_seed(0)).tokens
    iv = compose(WeightTransplant(donor, "qkv"), PositionalPermutation(seed=0, n_positions=16),
                 UniformAttentionAblation([(0, 1), (1, 2)]), MaskSubstitution(0.44))
    return model, tokens, iv


def test_randomly_interrupted_compositions_leave_nothing_behind(alarm):
    model, tokens, iv = composition()
    want = iv.run(model, tokens)
    before = state(model)
    body = [True]

    def run(alarm, clock=None):
        with iv.applied(model):
            alarm.phase = "body"
            if clock is not None:
                clock.append(time.perf_counter())
            if body[0]:
                model(tokens)
            alarm.phase = "exit"
            if clock is not None:
                clock.append(time.perf_counter())
        if clock is not None:
            clock.append(time.perf_counter())

    def delays():
        for delay, body[0] in delays_for(phases, 3000, random.Random(0)):
            yield delay

    phases = timed(run, alarm)
    runs, hits = interrupted_trials(model, alarm, run, delays(),
                                    lambda: assert_untouched(model, before, alarm), want_hits=600)
    print(f"\n{runs} contexts, {hits} interrupted; landed in: {dict(alarm.landed)}; "
          f"phase medians (ms): { {k: round(v * 1e3, 3) for k, v in phases.items()} }")
    # a quarter of the delays fall inside the measured enter phase (a millisecond or more): even a
    # machine many times faster than the one timed above is interrupted in far more than 50 runs.
    # Which phases the timer reaches depends on the machine; the traced test below covers each.
    assert hits >= 50
    assert torch.equal(iv.run(model, tokens), want)  # later runs are still right


# 3.11+ and 3.10 spellings of a call (3.10 checks for signals before nearly every opcode anyway)
_CALLS = frozenset({"CALL", "CALL_FUNCTION_EX", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_METHOD"})
_after_call: dict = {}


def _offsets_after_a_call(code) -> set[int]:
    got = _after_call.get(code)
    if got is None:
        got, previous = set(), None
        for ins in dis.get_instructions(code):
            if previous in _CALLS:
                got.add(ins.offset)
            previous = ins.opname
        _after_call[code] = got
    return got


class Injector:
    """A trace function that raises SIGALRM at the ``at``-th point where the interpreter would run
    a pending signal handler: a function's start, the instruction after a call (CPython checks
    after ``CALL``, not between ``PRECALL`` and ``CALL``), the target of a backward jump. With
    ``at=None`` it only records ``alarm.phase`` at every such point (``phases``). Tracing stops at
    the raise, so the rest of the run goes at full speed."""

    def __init__(self, alarm: Alarm, at: int | None = None):
        self.alarm, self.at, self.n = alarm, at, 0
        self.last: dict[int, int] = {}  # id(frame) -> offset of its last traced instruction
        self.phases: list[str] = []

    def __call__(self, frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "call":
            point = True
        elif event == "opcode":
            offset = frame.f_lasti
            point = (offset < self.last.get(id(frame), -1)
                     or offset in _offsets_after_a_call(frame.f_code))
            self.last[id(frame)] = offset
        else:
            if event == "return":
                self.last.pop(id(frame), None)
            point = False
        if point:
            if self.at is None:
                self.phases.append(self.alarm.phase)
            elif self.n == self.at:
                sys.settrace(None)
                frame.f_trace = None
                signal.raise_signal(signal.SIGALRM)  # its handler runs here, in this frame's callee
            self.n += 1
        return self


def traced(run, alarm, injector):
    alarm.phase = "enter"
    sys.settrace(injector)
    try:
        run(alarm)
        alarm.phase = "after"
    finally:
        sys.settrace(None)


def traced_trials(run, alarm, picks, check) -> int:
    """Run ``run(alarm)`` once per point in ``picks`` with the signal raised there (see
    :class:`Injector`), ``check()`` after each. Returns how many runs were interrupted."""
    hits = 0
    for at in picks:
        alarm.armed = True
        try:
            traced(run, alarm, Injector(alarm, at))
        except KeyboardInterrupt:
            hits += 1
        finally:
            alarm.disarm()
        check()
    return hits


def spread(indices: list[int], edge: int, middle: int) -> list[int]:
    """The first and last ``edge`` of ``indices`` and ``middle`` evenly spaced between."""
    n = len(indices)
    picked = set(indices[:edge]) | set(indices[-edge:])
    picked |= {indices[round(k * (n - 1) / (middle - 1))] for k in range(middle)}
    return sorted(picked)


# an interrupt raised while Python closes a generator is printed and dropped by Python itself
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.skipif(sys.implementation.name != "cpython",
                    reason="the injection points are CPython's eval-breaker checks")
def test_interrupts_at_traced_points_of_every_phase_leave_nothing_behind(alarm):
    model, tokens, iv = composition()
    want = iv.run(model, tokens)
    before = state(model)

    def run(alarm):
        with iv.applied(model):
            alarm.phase = "body"
            model(tokens)
            alarm.phase = "exit"

    run(alarm)  # first-call work (caches) out of the way: the schedule below is then the same
    schedule = Injector(alarm)
    traced(run, alarm, schedule)
    picks = [i for phase in ("enter", "body", "exit")
             for i in spread([i for i, p in enumerate(schedule.phases) if p == phase], 15, 10)]
    hits = traced_trials(run, alarm, picks, lambda: assert_untouched(model, before, alarm))
    print(f"\n{len(picks)} of {len(schedule.phases)} points; landed in: {dict(alarm.landed)}")
    assert hits >= len(picks) - 5  # the rest landed in a generator's close (see the mark above)
    for phase in ("enter", "body", "exit"):
        assert alarm.landed[phase] >= 25, dict(alarm.landed)
    assert torch.equal(iv.run(model, tokens), want)  # later runs are still right


# an interrupt raised while Python closes a generator is printed and dropped by Python itself
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_randomly_interrupted_hooks_and_run_with_hooks_leave_nothing_behind(alarm):
    model = tm.HookedEncoder(CFG, seed=0).eval()
    donor = tm.HookedEncoder(CFG, seed=1).eval()
    tokens = torch.ones(4, 16, dtype=torch.long)
    iv = compose(WeightTransplant(donor, "all"), UniformAttentionAblation("all"),
                 MaskSubstitution(-0.24))
    hooks = iv.fwd_hooks(model)  # weight edits in hook form: parameter slots substituted
    before = state(model)

    def run(alarm, clock=None):
        if clock is not None:
            clock.append(time.perf_counter())
        model.run_with_hooks(tokens, fwd_hooks=hooks)
        if clock is not None:
            clock += [time.perf_counter()] * 2

    phases = timed(run, alarm)
    rng = random.Random(1)
    # up to 3,000 trials until 100 land inside a run: a busy machine that stretches the run past
    # the measured median only needs more trials, it does not fail the test
    delays = (rng.uniform(0, 1.2 * phases["body"]) for _ in range(3000))
    _, hits = interrupted_trials(model, alarm, run, delays,
                                 lambda: assert_untouched(model, before, alarm), want_hits=100)
    assert hits >= 20  # a floor no machine speed can miss; the traced points below cover the call

    schedule = Injector(alarm)
    traced(run, alarm, schedule)
    picks = spread(list(range(len(schedule.phases))), 15, 20)
    hits = traced_trials(run, alarm, picks, lambda: assert_untouched(model, before, alarm))
    assert hits >= len(picks) - 5


class _SignalledTransplant(WeightTransplant):
    """Raises SIGALRM while its weight edits are being computed (inside ``__enter__``)."""

    def weight_edits(self, model, params=None):
        signal.raise_signal(signal.SIGALRM)
        return super().weight_edits(model, params)


def test_an_interrupt_inside_enter_is_delivered_after_undoing_it(alarm):
    model = tm.HookedEncoder(CFG, seed=0).eval()
    before = state(model)
    iv = UniformAttentionAblation("all") + _SignalledTransplant(tm.HookedEncoder(CFG, seed=1))
    alarm.armed, alarm.phase = True, "enter"
    entered = False
    with pytest.raises(KeyboardInterrupt):
        with iv.applied(model):
            entered = True
    assert not entered and alarm.landed["enter"] == 1
    assert_untouched(model, before, alarm)


def test_an_interrupt_inside_exit_is_delivered_after_the_undo(alarm):
    model = tm.HookedEncoder(CFG, seed=0).eval()
    before = state(model)
    from tfmatcomp.interventions import HookFn

    def release():
        signal.raise_signal(signal.SIGALRM)

    hook = ("blocks.0.hook_resid_pre", HookFn(lambda a, h: None, "read", "test", release))
    with pytest.raises(KeyboardInterrupt):
        with model.hooks(fwd_hooks=[hook]):
            alarm.armed, alarm.phase = True, "exit"
    assert alarm.landed["exit"] == 1
    assert_untouched(model, before, alarm)


def test_a_synchronous_error_half_way_through_enter_undoes_it(alarm):
    model = tm.HookedEncoder(CFG, seed=0).eval()
    before = state(model)
    iv = WeightTransplant(tm.HookedEncoder(CFG, seed=1)) + UniformAttentionAblation("all")
    hooks = iv.fwd_hooks(model) + [("no_such_hook", lambda a, h: None)]
    with pytest.raises(ValueError, match="no_such_hook"):
        model.run_with_hooks(torch.ones(1, 16, dtype=torch.long), fwd_hooks=hooks)
    assert_untouched(model, before, alarm)


def test_an_undo_step_that_raises_does_not_stop_the_others(monkeypatch):
    from tfmatcomp._interrupts import UndoError
    from tfmatcomp.interventions.weights import assigned_parameters

    model = tm.HookedEncoder(CFG, seed=0).eval()
    before = state(model)
    # hooks: TransformerLens's reset fails; every hook point is still cleared one by one
    monkeypatch.setattr(type(model), "reset_hooks", lambda *a, **k: 1 / 0)
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda act, hook: act + 1)]):
        assert model.active_hook_count() == 1
    assert model.active_hook_count() == 0 and model.context_level == 0
    monkeypatch.undo()
    # weights: the restore of one parameter raises; the others are restored, and it is named
    edits = {"blocks.0.attn.W_Q": torch.zeros_like(model.blocks[0].attn.W_Q),
             "blocks.1.attn.W_Q": torch.zeros_like(model.blocks[1].attn.W_Q)}
    swap = assigned_parameters(model, edits)
    swap.__enter__()
    first_param, first_original = swap.saved[0]
    swap.saved[0] = (object(), first_original)  # a slot that cannot be restored
    with pytest.raises(UndoError, match="could not restore a parameter of shape"):
        swap.__exit__(None, None, None)
    first_param.data = first_original
    for (name, p), (_, p0, ptr0, data0) in zip(model.named_parameters(), before):
        assert p is p0 and p.data.data_ptr() == ptr0 and torch.equal(p.detach(), data0), name
