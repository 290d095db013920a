"""What a training loop shows a person: a progress bar on a terminal, plain lines in a log.

On a terminal it is tqdm's bar. Its time and ETA count from the end of the first step, which
compiles (minutes for a large model, which would otherwise make the first ETA hours long),
and its status says what the numbers are: "loss 2.314, 41,230 tok/s, 3 of 4 models training"
(models that stopped early drop out of the step). When the output is not a terminal (a log
file, a cluster job), a bar would be one long line of carriage returns; instead a plain line
is printed at most every `interval_s` seconds, and at the end.

`note(text)` prints a line above the bar (or in the log): a resume, an early stop.
"""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm


def _clock(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
      f"{seconds // 60:02d}:{seconds % 60:02d}"


class Progress:
  """Progress of a loop of `total` steps that starts at step `initial` (a resumed run)."""

  def __init__(self, total: int, initial: int, desc: str, enabled: bool, *, stream=None, interval_s: float = 30.0):
    self.stream = stream or sys.stderr
    self.enabled, self.desc, self.total, self.step = enabled, desc, total, initial
    self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
    self.interval_s = interval_s
    # smoothing=0: the ETA is the average rate since the timer started (after compilation)
    self.bar = tqdm(total=total, initial=initial, desc=desc, disable=not (enabled and self.tty), dynamic_ncols=True,
                    smoothing=0, file=self.stream)
    self.started = None  # (time, step) at the end of the first step
    self.last_line = -float("inf")
    self.status = ""

  def update(self, step: int):
    """Step `step` has been dispatched and (the first one) finished."""
    self.step = step
    self.bar.update(1)
    if self.started is None:  # the first step compiled: time from here
      self.started = (time.perf_counter(), step)
      if not self.bar.disable:
        self.bar.start_t, self.bar.initial = self.bar._time(), self.bar.n
    elif self.enabled and not self.tty and time.perf_counter() - self.last_line >= self.interval_s:
      self._line()

  def eta_s(self) -> float | None:
    """Seconds left at the rate since the first step (compilation excluded), or None."""
    if self.started is None or self.step <= self.started[1]:
      return None
    rate = (self.step - self.started[1]) / (time.perf_counter() - self.started[0])
    return (self.total - self.step) / rate

  def set_status(self, loss: float, tok_s: float, training: int, members: int):
    self.status = (f"loss {loss:.3f}, {tok_s:,.0f} tok/s" +
                   (f", {training} of {members} models training" if members > 1 else ""))
    self.bar.set_postfix_str(self.status, refresh=False)

  def _line(self):
    self.last_line = time.perf_counter()
    eta = self.eta_s()
    print(f"{self.desc}: step {self.step}/{self.total}" + (f", {self.status}" if self.status else "") +
          (f", about {_clock(eta)} left" if eta is not None else ""), file=self.stream, flush=True)

  def note(self, text: str):
    if not self.enabled:
      return
    if self.tty:
      tqdm.write(text, file=self.stream)
    else:
      print(text, file=self.stream, flush=True)

  def close(self):
    if self.enabled and not self.tty and self.started is not None:
      self._line()
    self.bar.close()
