"""What the training loop tells a person (xlt.progress): in a log file, plain lines with an
ETA that does not count compilation; a resume and an early stop, in words."""

import io

from xlt import loop, progress


def test_log_lines_without_a_terminal_and_an_eta_without_compilation(monkeypatch):
  clock = iter([1000.0, 1000.0, 1001.0, 1001.0, 1002.0, 1002.0])  # the first step compiled for 1000 s
  monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
  out = io.StringIO()  # not a terminal
  p = progress.Progress(100, 0, "finetune", True, stream=out, interval_s=0)
  p.update(1)
  p.set_status(2.3141, 41230.0, 3, 4)
  p.update(2)
  p.note("finetune: a note")
  lines = out.getvalue().splitlines()
  assert "\r" not in out.getvalue()
  assert lines == ["finetune: step 2/100, loss 2.314, 41,230 tok/s, 3 of 4 models training, about 01:38 left",
                   "finetune: a note"]  # 98 steps left at 1 step/s, not at 1000 s per step


def test_disabled_progress_prints_nothing():
  out = io.StringIO()
  p = progress.Progress(10, 0, "x", False, stream=out, interval_s=0)
  p.update(1), p.update(2), p.note("n"), p.close()
  assert out.getvalue() == ""


def test_the_loop_says_when_it_resumes_and_why_a_model_stops(tmp_path, capsys):
  from conftest import small_graph_config
  from test_checkpoint_damage import _members

  c = small_graph_config()
  c.train.patience, c.train.eval_every, c.train.checkpoint_every = 1, 2, 2
  cfg, members = _members(c)
  flat = lambda params, ids: [0.0] * len(ids)  # no gain after the first evaluation: stop at the second
  loop.train_ensemble(c, cfg, members, flat, str(tmp_path), stop_after=2)
  out = loop.train_ensemble(c, cfg, members, flat, str(tmp_path))
  err = capsys.readouterr().err
  assert out["step"] == 4 and out["finished"]
  assert f"{tmp_path.name}: resuming from the checkpoint of step 2 of 12, 2 of 2 models still training" in err
  assert (f"{tmp_path.name}: m0 stops early at step 4 of 12: its validation score has not improved on its best "
          "(0.0000, step 2) for 1 evaluations (train.patience=1)") in err
  assert f"{tmp_path.name}: ends at step 4 of 12: every model stopped early" in err
