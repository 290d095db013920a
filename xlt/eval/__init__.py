"""Evaluating xlt's models the way the field does, with lm-evaluation-harness (optional: the
`eval` extra): `harness` is lm-eval's model class `xlt` (importing it imports lm-eval),
`requests` answers lm-eval's request kinds with no lm-eval import, `tasks/` holds task configs
over files the user supplies (MGSM), and `python -m xlt.eval` runs tasks on a model directory.
See docs/evaluate.md."""
