"""The second claims study's pilots (issue 68): candidate base designs of the merge testbed,
each judged only on the structure criteria preregistered in docs/prereg/claims_study_2.md
(S1-S4, B1, the gates) before these runs; no claim is computed from them.

  python -m xlt.main --config=configs/structure_pilots.py --workdir=runs/structure_pilots
  python -m xlt.pilots --workdir=runs/structure_pilots --prereg=docs/prereg/claims_study_2.md \
      --runs_commit=<commit> --out=results/studies/structure_pilots.json

A grid, one point per design, each a testbed run (configs/merge.py's training, replay and merge
settings) at 8 blocks with 3 bases and only the experts the measures need:
  scripts       A: four languages, each writing operands and answers in its own digits (standard
                0-9, the source and dominant; Devanagari and Arabic-Indic in the middle; Thai, the
                target and smallest), operators, "=" and positions shared; the base also
                translates numbers between the source and each other language
  scripts_dose  A and B together: the scripts base with 400 problems of the task in the source
  clones        C: the target (clone_rev) copies every token and writes its operands least
                significant digit first; translation to and from the source
  dose_400      B: configs/merge.py's two languages (shared operands), the base dosed with 400
                problems of the task in the source (the task expert's own 2,000 are 5x that)
  dose_100      B at a quarter of the dose
Not a table of the papers: no reference numbers. The papers' regime that these designs aim at:
languages whose inputs differ, a base that half-knows the task (Llama 3.1 8B: 56% on English
MGSM before any SFT), a shared middle. Results: results/studies/structure_pilots.json.
"""

from configs import merge
from configs.merge import OTHER_OPS, parts

SOURCE = "standard"
SCRIPTS = ("deva", "arab", "thai")  # the middle languages, then the target
DOSE = ("add_digit", SOURCE)


def translations(language: str, n: int) -> tuple:
  """n numbers from the source into `language` and n back (3-digit numbers: 636 exist outside
  the held-out ones)."""
  return ((f"to_{language}", SOURCE, n), (f"to_{SOURCE}", language, n))


def scripts_base() -> tuple:
  mid = [p for l in SCRIPTS[:2] for p in parts(OTHER_OPS, l, 600, 150) + translations(l, 600)]
  target = parts(OTHER_OPS, SCRIPTS[2], 100, 100) + translations(SCRIPTS[2], 300)
  return parts(OTHER_OPS, SOURCE, 2000, 500) + tuple(mid) + target


def design(name: str, target: str, base: tuple, dose: int = 0) -> dict:
  return {"name": name, "languages.target": target, "data.base": base,
          "data.base_task": ((*DOSE, dose),) if dose else (),
          "data.language": parts(OTHER_OPS, target, 2000, 500)}


DESIGNS = (
    design("scripts", SCRIPTS[2], scripts_base()),
    design("scripts_dose", SCRIPTS[2], scripts_base(), dose=400),
    design("clones", "clone_rev", parts(OTHER_OPS, SOURCE, 2000, 500) + parts(OTHER_OPS, "clone_rev", 100, 100)
           + translations("clone_rev", 600)),
    design("dose_400", merge.TARGET, merge.get_config().data.base, dose=400),
    design("dose_100", merge.TARGET, merge.get_config().data.base, dose=100),
)


def get_config():
  c = merge.get_config()
  c.name = "structure_pilots"
  c.num_seeds = 3  # a few bases per design: the pilots judge structure, not claims
  c.model.num_layers = 8
  c.data.base_task = ()
  # the measures need the base and the two experts; the testbed always trains the
  # source-language expert and data mixing too
  c.partition.presets = ()
  c.simultaneous.presets = ()
  c.grid = [dict(d) for d in DESIGNS]
  return c
