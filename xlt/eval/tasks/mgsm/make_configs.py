"""Writes the MGSM task configs beside this file from lm-eval's own (lm_eval/tasks/mgsm: the
direct and native-CoT prompts, stop strings and answer filters of each language), with the
papers' protocol: the user's files (data.py, no download), 2-shot from the exemplars in their
order (sampler first_n). Run where lm-eval is installed:

  python xlt/eval/tasks/mgsm/make_configs.py
"""

import os

import yaml

LANGS = ("bn", "de", "en", "es", "fr", "ja", "ru", "sw", "te", "th", "zh")
VARIANTS = {"direct": ("direct", "direct_yaml", "mgsm_direct_{}"),
            "native_cot": ("native_cot", "cot_yaml", "mgsm_native_cot_{}")}
HERE = os.path.dirname(os.path.abspath(__file__))
DROP = ("tag", "dataset_path", "dataset_name", "include", "task")


def main():
  import lm_eval

  source = os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "mgsm")
  for variant, (folder, template, name) in VARIANTS.items():
    with open(os.path.join(source, folder, template)) as f:
      base = {k: v for k, v in yaml.safe_load(f).items() if k not in DROP}
    for lang in LANGS:
      with open(os.path.join(source, folder, name.format(lang) + ".yaml")) as f:
        config = dict(base, **{k: v for k, v in yaml.safe_load(f).items() if k not in DROP})
      config.update(task=f"xlt_mgsm_{variant}_{lang}", tag=f"xlt_mgsm_{variant}", num_fewshot=2,
                    fewshot_split="train", fewshot_config={"sampler": "first_n"}, dataset_kwargs={"lang": lang})
      text = yaml.safe_dump(config, allow_unicode=True, sort_keys=True)
      with open(os.path.join(HERE, f"xlt_mgsm_{variant}_{lang}.yaml"), "w", encoding="utf-8") as f:
        f.write(f"# written by make_configs.py from lm-eval {lm_eval.__version__}'s mgsm/{folder}\n"
                "custom_dataset: !function data.load\n" + text)


if __name__ == "__main__":
  main()
