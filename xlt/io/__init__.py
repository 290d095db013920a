"""The I/O floor: the files xlt reads and writes, below both the merge library and training.

  fileio.py       atomic writes (temp + fsync + rename) and the size check before reading a
                  file a user brought
  tensor_files.py safetensors files read lazily and written one tensor at a time
  hf_dir.py       Hugging Face model directories (config, tokenizer, shards, index, card)
  config_files.py where configs/ is: beside the package in a checkout, inside it in a wheel

It imports nothing of xlt but the parameter-path vocabulary (xlt.param_paths), and no merge or
training module (tests/test_layout.py), so that both sides can stand on it.
"""
