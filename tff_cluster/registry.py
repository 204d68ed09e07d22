"""Algorithm registry: `--algo` name -> its module and options.

Importing this module imports neither TensorFlow nor TFF: the CLI builds its
flags and checks from the declarations here before any heavy import. Each
algorithm lives in its own module (named by `AlgorithmSpec.module`) with

  * a `Definition` subclass: plain TF functions for its server state, what a
    client receives, the client work, what is summed and the server update
    (`tff_cluster.core.definition`);
  * a driver (`make_driver(task, data, config, options)`, `options` the
    algorithm's checked `tff_cluster.spec.options.Options`): the host-side logic
    between rounds (keys, assignments, cold starts, metrics), which hands its
    `Definition` the option values it needs;
  * `make_definition(weights_spec, num_trainable, options, **solver)` where a
    definition needs nothing from the data: what
    `tff_cluster.api.computations` turns into TFF computations.

Both runners (`tff_cluster.runners`) execute the same definition.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Dict, Tuple

from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.options import (
    APFL_HPARAMS, CFL_HPARAMS, CFL_MGD_HPARAMS, DITTO_HPARAMS, FEDAVG_FT_HPARAMS, FEDAVG_HPARAMS,
    FEDAVG_PLUS_HPARAMS,
    FEDBN_HPARAMS, FEDEM_HPARAMS, FEDGROUPROX_HPARAMS, FEDGROUP_HPARAMS, FEDNAG_HPARAMS,
    FEDPER_HPARAMS, FEDPROX_HPARAMS, FEDPROX_PLUS_HPARAMS, FEDRC_HPARAMS, FEDREP_HPARAMS,
    FEDSOFT_HPARAMS, FESEM_HPARAMS, FLHC_HPARAMS, HYPCLUSTER_HPARAMS, IFCA_HPARAMS,
    LG_FEDAVG_HPARAMS, LOCAL_ONLY_HPARAMS, MIME_HPARAMS, PACFL_HPARAMS, PERFEDAVG_HPARAMS,
    PFEDME_HPARAMS,
    PFEDMO_HPARAMS,
    SERVER_MOMENTUM_HPARAMS, STOCFL_HPARAMS, WECFL_HPARAMS, Options)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One `--algo`.

  Attributes:
    name: the `--algo` value.
    description: one line for `--help`.
    module: the module with `make_driver`: a name without a dot is a module
      under `tff_cluster.algorithms`; a dotted name is imported as it is (an
      algorithm of your own package, added with `register`).
    hparams: its own hyper-parameters (beyond `hparams.TRAINING`), declared once;
      shared concepts use the shared declarations of `tff_cluster.spec.hparams`.
    all_clients: every client takes part in every round (cross-silo); the
      CLI's --clients_per_round then defaults to all of them.
    own_momentum: its local solver is its own (its definition's
      `own_momentum`): a task's default --client_momentum does not apply to
      it (a --client_momentum given is refused, naming the solver).
  """
  name: str
  description: str
  module: str
  hparams: Tuple[HParam, ...] = ()
  all_clients: bool = False
  own_momentum: bool = False

  def load(self):
    if "." in self.module:
      return importlib.import_module(self.module)
    return importlib.import_module(f"tff_cluster.algorithms.{self.module}")

  def options(self, **values) -> Options:
    """This algorithm's `Options`: `values` checked, the declarations'
    defaults filled in; a name it does not declare is refused."""
    return Options(self.hparams, values, algo=self.name)

  def make_driver(self, task, data, config, **values):
    """The host-side driver of this algorithm on `config.runner`, with its
    options `values` (checked once, here; the rest take the task's defaults,
    then the declarations')."""
    options = Options(self.hparams, values, task=task.name,
                      task_defaults=dict(task.defaults or {}), algo=self.name)
    return self.load().make_driver(task, data, config, options)


ALGORITHMS: Dict[str, AlgorithmSpec] = {
    spec.name: spec for spec in [
        AlgorithmSpec("fedavg", "FedAvg: weighted averaging of local SGD models",
                      "fedavg", hparams=FEDAVG_HPARAMS),
        AlgorithmSpec("fedprox", "FedProx: FedAvg with proximal term (mu/2)||w - w_t||^2",
                      "fedprox", hparams=FEDPROX_HPARAMS),
        AlgorithmSpec("fedgroup", "FedGroup: EDC/MADC group cold start, group-wise "
                      "FedAvg, newcomer cold start", "fedgroup",
                      hparams=FEDGROUP_HPARAMS),
        AlgorithmSpec("fedgrouprox", "FedGrouProx: FedGroup with proximal term "
                      "(mu/2)||w - w_group||^2", "fedgrouprox",
                      hparams=FEDGROUPROX_HPARAMS),
        AlgorithmSpec("ifca", "IFCA: K cluster models, clients pick the lowest-loss "
                      "one and train it", "ifca", hparams=IFCA_HPARAMS),
        AlgorithmSpec("cfl_mgd", "CFL-MGD: IFCA's cluster estimates with momentum "
                      "(option II: local momentum steps; option I: averaged buffers)",
                      "cfl_mgd", hparams=CFL_MGD_HPARAMS, own_momentum=True),
        AlgorithmSpec("wecfl", "WeCFL: clients train their cluster model; weighted "
                      "K-Means on the trained models; weighted cluster means", "wecfl",
                      hparams=WECFL_HPARAMS),
        AlgorithmSpec("fesem", "FeSEM: WeCFL with uniform K-Means weights", "fesem",
                      hparams=FESEM_HPARAMS),
        AlgorithmSpec("fedavg_plus", "FedAvg+: --ensemble_size independent FedAvg runs, "
                      "combined at test time", "ensemble",
                      hparams=FEDAVG_PLUS_HPARAMS),
        AlgorithmSpec("fedprox_plus", "FedProx+: --ensemble_size independent FedProx "
                      "runs, combined at test time", "ensemble",
                      hparams=FEDPROX_PLUS_HPARAMS),
        AlgorithmSpec("fedavgm", "FedAvgM: FedAvg with heavy-ball server momentum",
                      "fedavgm", hparams=SERVER_MOMENTUM_HPARAMS),
        AlgorithmSpec("fedmom", "FedMom: FedAvg with Nesterov server momentum", "fedmom",
                      hparams=SERVER_MOMENTUM_HPARAMS),
        AlgorithmSpec("slowmo", "SlowMo: slow momentum on the averaged local progress",
                      "slowmo", hparams=SERVER_MOMENTUM_HPARAMS),
        AlgorithmSpec("mime_lite", "MimeLite: local steps with the server's fixed momentum "
                      "(TFF's build_weighted_mime_lite with SGDM)", "mime_lite",
                      hparams=MIME_HPARAMS, own_momentum=True),
        AlgorithmSpec("mime", "Mime: MimeLite's steps with a control variate (an extra "
                      "exchange of full-batch gradients every round)", "mime",
                      hparams=MIME_HPARAMS, own_momentum=True),
        AlgorithmSpec("pfedmo", "pFedMo: local NAG; a representation model trained on "
                      "public data personalises each worker's model and momentum",
                      "pfedmo", hparams=PFEDMO_HPARAMS, all_clients=True, own_momentum=True),
        AlgorithmSpec("fednag", "FedNAG: local NAG, weighted means of models and look-ahead "
                      "points (pFedMo with pi = 0)", "fednag",
                      hparams=FEDNAG_HPARAMS, all_clients=True, own_momentum=True),
        AlgorithmSpec("cfl", "CFL: a cluster tree, bipartitions by the cosine "
                      "similarity of the members' updates (--num_groups: most clusters)",
                      "cfl", hparams=CFL_HPARAMS),
        AlgorithmSpec("hypcluster", "HypCluster: IFCA's loop with a k-means++-by-loss start "
                      "and a server optimizer per cluster (FedJAX's)", "hypcluster",
                      hparams=HYPCLUSTER_HPARAMS),
        AlgorithmSpec("flhc", "FL+HC: FedAvg, then one agglomerative clustering of the "
                      "clients' updates, then FedAvg per cluster", "flhc",
                      hparams=FLHC_HPARAMS),
        AlgorithmSpec("pacfl", "PACFL: one-shot clustering by the angles between the "
                      "clients' data subspaces, then FedAvg per cluster", "pacfl",
                      hparams=PACFL_HPARAMS),
        AlgorithmSpec("fedem", "FedEM: M component models, each client's mixture weights "
                      "and per-example responsibilities (EM), components trained weighted",
                      "fedem", hparams=FEDEM_HPARAMS, own_momentum=True),
        AlgorithmSpec("fedrc", "FedRC: FedEM's mixture with robust weights "
                      "omega exp(-loss) / P_m(y) and a label prior refreshed each round",
                      "fedrc", hparams=FEDRC_HPARAMS, own_momentum=True),
        AlgorithmSpec("stocfl", "StoCFL: clusters merged by the cosine of cached client "
                      "representations; cluster models pulled toward a global model",
                      "stocfl", hparams=STOCFL_HPARAMS, own_momentum=True),
        AlgorithmSpec("fedsoft", "FedSoft: importance weights per client and cluster, "
                      "cluster-wise selection, local models pulled toward every cluster",
                      "fedsoft", hparams=FEDSOFT_HPARAMS, own_momentum=True),
        # Personalized: every client tested with its own model.
        AlgorithmSpec("ditto", "Ditto: FedAvg, and a personal model per client pulled "
                      "toward the round's global model", "ditto", hparams=DITTO_HPARAMS),
        AlgorithmSpec("fedper", "FedPer: a shared body averaged by FedAvg, a personal head "
                      "per client, trained together", "fedper", hparams=FEDPER_HPARAMS),
        AlgorithmSpec("fedrep", "FedRep: a shared body, a personal head; head epochs, then "
                      "body epochs", "fedrep", hparams=FEDREP_HPARAMS),
        AlgorithmSpec("lg_fedavg", "LG-FedAvg: a personal body per client, a shared head "
                      "averaged by FedAvg", "lg_fedavg", hparams=LG_FEDAVG_HPARAMS),
        AlgorithmSpec("fedavg_ft", "FedAvg + fine-tuning: before every evaluation each "
                      "client fine-tunes a copy of the global model", "fedavg_ft",
                      hparams=FEDAVG_FT_HPARAMS),
        AlgorithmSpec("fedbn", "FedBN: FedAvg with every BatchNorm layer kept by its "
                      "client", "fedbn", hparams=FEDBN_HPARAMS),
        AlgorithmSpec("apfl", "APFL: each client deploys a mixture, with weight alpha, of its "
                      "personal model and FedAvg's (outputs or weights mixed)", "apfl",
                      hparams=APFL_HPARAMS, own_momentum=True),
        AlgorithmSpec("perfedavg", "Per-FedAvg: FedAvg over MAML meta-steps (first-order or "
                      "Hessian-free); each client adapts by one step before its test",
                      "perfedavg", hparams=PERFEDAVG_HPARAMS, own_momentum=True),
        AlgorithmSpec("pfedme", "pFedMe: personal models from K Moreau-envelope steps per "
                      "batch; local models pulled toward them, the server mixes by beta",
                      "pfedme", hparams=PFEDME_HPARAMS, own_momentum=True),
        AlgorithmSpec("local_only", "Local-only: each client trains its own model, "
                      "nothing is shared", "local_only", hparams=LOCAL_ONLY_HPARAMS),
    ]
}


def register(name: str, spec: AlgorithmSpec) -> None:
  """Adds an algorithm defined outside `tff_cluster.algorithms` (docs/extending.md).

  `spec.name` must be `name` and `spec.module` a full dotted module path; a
  name already taken, or an option declared by another algorithm with another
  type or choices, is refused with a `ValueError` of one line. Register before
  `run_experiment` is imported for the CLI to know its flags (it reads the
  registry once, at import); `tff_cluster.api.build` sees it at once.
  """
  if name in ALGORITHMS:
    raise ValueError(f"algorithm {name!r} is already registered; choose another name")
  if spec.name != name:
    raise ValueError(f"register({name!r}, spec): spec.name is {spec.name!r}, not {name!r}")
  if "." not in spec.module:
    raise ValueError(f"algorithm {name!r}: module {spec.module!r} must be a full dotted "
                     "path (package.module)")
  ALGORITHMS[name] = spec
  try:
    all_hparams()
  except ValueError:
    del ALGORITHMS[name]
    raise


def get_algorithm(name: str) -> AlgorithmSpec:
  if name not in ALGORITHMS:
    raise KeyError(f"unknown algorithm {name!r}; valid: {', '.join(sorted(ALGORITHMS))}")
  return ALGORITHMS[name]


def all_hparams() -> Dict[str, HParam]:
  """Every declared algorithm hyper-parameter by name (one flag each).

  Two algorithms may declare the same name only with the same type and
  choices (a shared concept, e.g. `num_groups`); the CLI flag takes the first
  declaration's default and help.
  """
  out: Dict[str, HParam] = {}
  for spec in ALGORITHMS.values():
    for decl in spec.hparams:
      first = out.setdefault(decl.name, decl)
      if (first.type, first.choices) != (decl.type, decl.choices):
        raise ValueError(f"--{decl.name} is declared twice with different types")
  return out
