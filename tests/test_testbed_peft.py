"""xlt.experiments.testbed.peft: the LoRA and trained-neuron stages' config checks, before
anything trains (the stages themselves run in test_testbed's end-to-end test)."""

import pytest

from configs import merge as merge_config
from xlt.experiments.testbed import peft as testbed_peft


@pytest.mark.parametrize("field, value, match", [
    ("maet_neurons.key_ratio", 0.0, "maet_neurons.key_ratio"),
    ("maet_neurons.key_ratio", 1.5, "maet_neurons.key_ratio"),
    ("lora.rank", 0, "lora.rank must be positive"),
    ("lora.swaps", ("9,1,0",), "bottom"),
])
def test_config_errors_name_the_field(field, value, match):
  c = merge_config.get_config()
  c.lora.enabled = c.maet_neurons.enabled = True
  testbed_peft.check(c, 6)  # the defaults pass
  section, name = field.split(".")
  c[section][name] = value
  with pytest.raises(ValueError, match=match):
    testbed_peft.check(c, 6)
