"""Every algorithm's options, declared once, and the checked object they make.

Each option is one `HParam` (type, default, valid values, help, per-task
defaults; `tff_cluster.spec.hparams`); an algorithm's tuple of them is its
declaration, which the registry maps to its `--algo` name and the CLI turns
into flags. `Options(declared, values)` fills the defaults, checks every value
and refuses names the algorithm does not declare: a driver reads that one
object and hands its `Definition` the values it needs. This module sits at the
bottom of the layering (no TensorFlow import).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping, Optional, Sequence, Tuple

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.hparams import HParam, HParamError


class Options(Mapping):
  """An algorithm's options: every declared `HParam`, given or defaulted, checked.

  Read them as attributes (`options.num_groups`) or as a mapping; it is frozen
  (`replace(**changes)` makes a checked copy). A default of `None` stays None
  ("derived": the declaration's help says from what). A name the algorithm
  does not declare is refused with one line (`HParamError`).
  """

  def __init__(self, declared: Sequence[HParam], values: Optional[Mapping[str, Any]] = None,
               task: Optional[str] = None, task_defaults: Optional[Mapping[str, Any]] = None,
               algo: str = ""):
    values = dict(values or {})
    names = [d.name for d in declared]
    unknown = sorted(set(values) - set(names))
    if unknown:
      who = f"{algo} " if algo else ""
      raise HParamError(
          f"{who}has no option {', '.join('--' + u for u in unknown)}; valid: "
          f"{', '.join('--' + n for n in names) or 'none'}")
    checked = {}
    for d in declared:
      value = values[d.name] if d.name in values else d.default_for(task, task_defaults or {})
      checked[d.name] = d.check(value)
    object.__setattr__(self, "_declared", tuple(declared))
    object.__setattr__(self, "_values", checked)
    object.__setattr__(self, "_context", (task, task_defaults, algo))

  def __getattr__(self, name: str) -> Any:
    values = self.__dict__.get("_values", {})
    if name in values:
      return values[name]
    raise AttributeError(f"no option {name!r}")

  def __setattr__(self, name, value):
    raise AttributeError("Options are frozen; use replace(**changes)")

  def __getitem__(self, name: str) -> Any:
    return self._values[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._values)

  def __len__(self) -> int:
    return len(self._values)

  def __repr__(self) -> str:
    return "Options(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

  def replace(self, **changes) -> "Options":
    task, task_defaults, algo = self._context
    return Options(self._declared, {**self._values, **changes}, task, task_defaults, algo)


def given(options: Options, name: str) -> Any:
  """`options[name]`, which must be set: a declaration whose default is
  "derived" from the task (e.g. `--mu`) has none outside a task."""
  value = options[name]
  if value is None:
    raise HParamError(f"--{name} has no default outside a task; give it (the CLI and "
                      "the registry take the task's)")
  return value


def options_of(declared: Sequence[HParam], options=None, **values) -> Options:
  """`options` when it is an `Options` already (with `values` applied), else
  the `Options` of `declared` from the mapping `options` and `values`."""
  if isinstance(options, Options):
    return options.replace(**values) if values else options
  return Options(declared, {**dict(options or {}), **values})


def _group(name: str, *declared: HParam) -> Tuple[HParam, ...]:
  """The declarations, listed under `name` in `--help` (shared ones keep theirs)."""
  shared = {hp.MU.name, hp.NUM_GROUPS.name, hp.ENSEMBLE_SIZE.name}
  return tuple(d if d.name in shared else dataclasses.replace(d, group=name)
               for d in declared)


MU_POSITIVE = dataclasses.replace(hp.MU, low=0.0, low_open=True)

FEDGROUP_HPARAMS = _group(
    "fedgroup",
    hp.NUM_GROUPS,
    HParam("measure", str, "edc", "Group cold start measure: edc (cosine to the top-m "
           "singular directions, then K-Means++) or madc (complete linkage on "
           "mean absolute difference of cosines).", choices=("edc", "madc")),
    HParam("pretrain_scale", float, 20.0, "alpha: min(alpha*m, N) clients are "
           "pre-trained for the group cold start.", low=0, low_open=True),
    HParam("pretrain_iters", int, None, "Mini-batch steps of the cold-start pre-training, "
           "cycling through the client's reshuffled data (default 50, both authors' "
           "codes; exclusive with --pretrain_epochs).", low=1,
           limit=hp.MAX_LOCAL_STEPS),
    HParam("pretrain_epochs", int, None, "Local epochs of the cold-start pre-training "
           "instead of --pretrain_iters (no default; the paper's text implies 1).", low=1,
           limit=hp.MAX_LOCAL_EPOCHS),
    HParam("group_agg_lr", float, 0.0, "eta_g: inter-group aggregation rate (0 = off, "
           "as in the paper's Table 3).", low=0),
    HParam("group_agg_rule", str, "alg2", "Inter-group aggregation: alg2 (Algorithm 2 "
           "line 19 as printed) or authors (Eq. (20) normalised, as the authors' codes "
           "run it).", choices=("alg2", "authors")),
    HParam("cold_start", str, "default", "default, rcc (random cluster centres), rac "
           "(clients not pre-trained draw a random group every round they are "
           "sampled) or rac_once (a random group once).",
           choices=("default", "rcc", "rac", "rac_once")),
    HParam("newcomer_rule", str, "paper", "Client cold start: paper (pre-train from the "
           "auxiliary model, compare with the groups' latest updates, Eq. (9)) or "
           "flexcfl (pre-train from w0, compare with the cold-start directions).",
           choices=("paper", "flexcfl")),
    HParam("newcomer_fraction", float, 0.0, "Fraction of clients held out of "
           "pre-training and of the first 10% of rounds.", low=0, high=1,
           high_open=True),
)

INIT_CHOICES = ("random", "good_init", "fedavg_warm", "kmeans_loss")
EVAL_CHOICES = ("assigned", "test_loss", "train_loss")
INIT_CLIENTS = HParam(
    "ifca_init_clients", int, None, "kmeans_loss: the clients trained from one start whose "
    "models are the candidate centres (default --clients_per_round; FedJAX: the clients "
    "it is given).", low=1)

IFCA_HPARAMS = _group(
    "ifca",
    hp.NUM_GROUPS,
    HParam("ifca_init", str, "random", "Cluster models' start: random (K independent "
           "draws), good_init (redraw until every cluster gets a share of a client "
           "sample, the authors' CIFAR code), fedavg_warm (a FedAvg-trained model "
           "with K random last layers, then forced random groups; their FEMNIST code) "
           "or kmeans_loss (k-means++ by loss over clients trained from one start: "
           "HypCluster's, FedJAX).",
           choices=INIT_CHOICES),
    INIT_CLIENTS,
    HParam("ifca_warm_rounds", int, 20, "fedavg_warm: rounds of one-model training "
           "before round 1.", low=0, limit=hp.MAX_ROUNDS),
    HParam("ifca_forced_rounds", int, 20, "fedavg_warm: first rounds whose clients are "
           "put into K random equal groups.", low=0, limit=hp.MAX_ROUNDS),
    HParam("ifca_agg", str, "uniform", "Per-cluster averaging of the chosen clients' "
           "models: uniform (authors' MNIST/CIFAR code), num_examples (examples "
           "processed this round, their FEMNIST code) or samples (training samples, "
           "FedBase).", choices=("uniform", "num_examples", "samples")),
    HParam("ifca_loss_batches", int, 0, "Batches of the round's local schedule the "
           "cluster estimate's loss is taken on (0 = every batch of the schedule: E "
           "passes over the training set with --local_epochs, the steps' batches with "
           "--local_steps; FedBase: 3; the rotated tasks: 1, their whole 100-image "
           "training set in one batch).", low=0,
           limit=hp.MAX_LOCAL_STEPS),
    HParam("ifca_good_init_threshold", float, None, "good_init: the smallest share of "
           "the sample every cluster must get (default 0.35 for K = 2, 0.1 for K = 4, "
           "0.4/K otherwise).", low=0, high=1),
    HParam("ifca_eval", str, "assigned", "Model a client with training data is tested "
           "with: assigned (the cluster its training loss chose when last sampled; a "
           "client never sampled takes the argmin of its training loss over the K "
           "models, untrained: FedBase's protocol), test_loss (the model of lowest "
           "loss on its own test data, IFCA's protocol for its test machines) or "
           "train_loss (every client the argmin of its training loss at evaluation: "
           "FedJAX's HypCluster evaluator). "
           "Test-only clients always choose by test loss.",
           choices=EVAL_CHOICES),
)

WECFL_SHARED = (
    hp.NUM_GROUPS,
    HParam("wecfl_features", str, "last_layer", "Clustering features of a client's "
           "trained model: last_layer (kernel of the last Dense layer, the authors' "
           "code), fc (kernels and biases of every Dense layer, the paper's App. B.1) "
           "or all (every trainable weight: a project variant).",
           choices=("last_layer", "fc", "all")),
    HParam("wecfl_kmeans", str, "refit", "refit (K-Means from scratch every round, "
           "the authors' code) or one_step (one E-step against the current cluster "
           "models, Algorithm 1).", choices=("refit", "one_step")),
    HParam("wecfl_mu", float, 0.0, "Proximal coefficient: each local step adds "
           "(mu/2)||w - w_bar||^2, w_bar the data-weighted mean of the clients' models "
           "(the paper: none, 0; the authors' last driver: 0.95). Separate from --mu, "
           "whose task default is FedProx's.", low=0),
)

WECFL_HPARAMS = _group(
    "wecfl", *WECFL_SHARED,
    HParam("kmeans_weights", str, "data", "K-Means client weights: data (lambda_i "
           "proportional to training samples, WeCFL) or uniform (FeSEM's clustering).",
           choices=("data", "uniform")),
)

FESEM_HPARAMS = _group(
    "fesem", *WECFL_SHARED,
    HParam("fesem_center", str, "uniform", "Cluster models: uniform mean of the members "
           "(the WeCFL paper's eq. (2)) or data-weighted (the authors' code behind its "
           "FeSEM rows).", choices=("uniform", "data")),
)

CFL_HPARAMS = _group(
    "cfl",
    hp.NUM_GROUPS,
    HParam("cfl_eps1", float, 0.4, "A cluster may split when the norm of its mean update "
           "is below eps1.", low=0, low_open=True),
    HParam("cfl_eps2", float, 1.6, "... and its largest update norm is above eps2.",
           low=0),
    HParam("cfl_warmup_rounds", int, 20, "No split in the first rounds.", low=0,
           limit=hp.MAX_ROUNDS),
    HParam("cfl_weighting", str, "uniform", "Mean update and cluster models: uniform "
           "(the authors' code) or data-weighted.", choices=("uniform", "data")),
)

CLIENT_WEIGHTING = HParam(
    "client_weighting", str, "processed", "FedAvg's client weights: the examples "
    "processed in the round (McMahan et al.; with local epochs proportional to the "
    "data) or the client's training samples (FedBase's, whatever --local_steps).",
    choices=("processed", "samples"), group="fedavg")

ENSEMBLE_VOTE = HParam("ensemble_vote", str, "logits", "How the ensemble's models "
                       "vote: mean of their logits (the authors' code) or of their "
                       "probabilities.", choices=("logits", "probs"), group="ensemble")

CFL_MGD_HPARAMS = _group(
    "cfl_mgd",
    hp.NUM_GROUPS,
    HParam("cfl_mgd_option", str, "model", "Option II, model averaging of local momentum "
           "steps started from the cluster's buffer (model), or option I, averaging of "
           "client momentum buffers of one gradient (gradient).",
           choices=("model", "gradient")),
    HParam("cfl_mgd_beta", float, 0.9, "beta: the momentum coefficient.", low=0, high=1,
           high_open=True),
    HParam("cfl_mgd_buffer", str, "client", "Option I: u_i held by the client (the "
           "paper) or started from its cluster's u_p (server).",
           choices=("client", "server")),
    HParam("grad_avg_norm", str, "total", "Option I: the server step's divisor: the total "
           "number of clients (the paper's m) or the cluster's members this round.",
           choices=("total", "members")),
    HParam("cfl_mgd_grad_batches", int, 1, "Option I: batches of the round's schedule "
           "the client's gradient is the mean over (0 = all).", low=0,
           limit=hp.MAX_LOCAL_STEPS),
    # IFCA's cluster estimate, initialisation and evaluation, shared.
    *(d for d in IFCA_HPARAMS if d.name in (
        "ifca_loss_batches", "ifca_init", "ifca_warm_rounds", "ifca_forced_rounds",
        "ifca_good_init_threshold", "ifca_eval", "ifca_init_clients")),
)

MIME_MOMENTUM = HParam("mime_momentum", float, 0.9, "beta of the base optimizer's (SGD "
                       "with momentum) server-held state.", low=0, high=1, high_open=True,
                       group="mime")
MIME_MOMENTUM_FORM = HParam(
    "mime_momentum_form", str, "tff", "The base optimizer: tff (m <- beta m + g, step "
    "eta (beta m + g); TFF's SGDM) or paper ((1 - beta) g + beta m, the exponential "
    "average the Mime paper is cited for).", choices=("tff", "paper"), group="mime")

SERVER_LR = HParam("server_lr", float, 1.0, "eta_s: the server's learning rate "
                   "(SlowMo's slow learning rate alpha).", low=0, low_open=True,
                   group="server momentum")
MIME_HPARAMS = (MIME_MOMENTUM, MIME_MOMENTUM_FORM, SERVER_LR)
SERVER_MOMENTUM = HParam("server_momentum", float, 0.9, "beta: the server's momentum.",
                         low=0, high=1, high_open=True, group="server momentum")
SERVER_MOMENTUM_HPARAMS = (SERVER_LR, SERVER_MOMENTUM, CLIENT_WEIGHTING)

NAG_MOMENTUM = HParam("nag_momentum", float, 0.5, "gamma: the workers' Nesterov "
                      "momentum (the pFedMo paper's Table 2: 0.5).", low=0, high=1,
                      high_open=True, group="pfedmo")
AGG_WEIGHTS = HParam("agg_weights", str, "data", "Aggregation weights a_i: data "
                     "(D_i / D) or uniform (1/N, the pFedMo paper's quantity-skew "
                     "experiment).", choices=("data", "uniform"), group="pfedmo")
PFEDMO_HPARAMS = (
    NAG_MOMENTUM,
    HParam("pfedmo_pi", float, 1.0, "pi: how strongly the representation model is "
           "mixed into each worker's start (0 = FedNAG; Table 2: 1).", low=0, high=1,
           group="pfedmo"),
    AGG_WEIGHTS,
    HParam("pfedmo_model", str, "eq12", "Each worker's model: eq12 (the paper's eq. 12 as "
           "printed, the rule its Theorem 2 bounds; its momentum term y_bar - y_i+ cancels "
           "the mix with x_r to first order) or mix ((1 - pi s_i) x_bar + pi s_i x_r: a "
           "project variant, after the paper's prose; it breaks Theorem 2's O(eta) bound).",
           choices=("eq12", "mix"), group="pfedmo"),
    HParam("score_batch", int, 64, "B: samples of the scoring batch, drawn once from the "
           "pooled test data (the paper gives no size).", low=1,
           limit=hp.MAX_BATCH_SIZE, group="pfedmo"),
    HParam("public_fraction", float, 0.1, "When the task has no public set: the share "
           "of the pooled training data drawn as one (it then overlaps the workers').",
           low=0, low_open=True, high=1, group="pfedmo"),
)

# The algorithms whose options are shared declarations only.
FEDAVG_HPARAMS = (CLIENT_WEIGHTING,)
FEDPROX_HPARAMS = (hp.MU, CLIENT_WEIGHTING)
FEDGROUPROX_HPARAMS = (MU_POSITIVE, *FEDGROUP_HPARAMS)
FEDAVG_PLUS_HPARAMS = (hp.ENSEMBLE_SIZE, ENSEMBLE_VOTE, CLIENT_WEIGHTING)
FEDPROX_PLUS_HPARAMS = (hp.MU, hp.ENSEMBLE_SIZE, ENSEMBLE_VOTE, CLIENT_WEIGHTING)
FEDNAG_HPARAMS = (NAG_MOMENTUM, AGG_WEIGHTS)

HYPCLUSTER_HPARAMS = _group(
    "hypcluster",
    hp.NUM_GROUPS,
    HParam("hypcluster_init", str, "kmeans_loss", "Cluster models' start: kmeans_loss "
           "(FedJAX's k-means++ by loss over clients trained from one start) or random "
           "(K independent draws).", choices=("kmeans_loss", "random")),
    INIT_CLIENTS,
    HParam("hypcluster_eval", str, "train_loss", "Model a client is tested with: "
           "train_loss (the argmin of its training loss over the K models at evaluation, "
           "FedJAX's evaluator) or assigned (the cluster it last trained).",
           choices=("train_loss", "assigned")),
    *(d for d in IFCA_HPARAMS if d.name == "ifca_loss_batches"),
    SERVER_LR,
    HParam("hypcluster_server_momentum", float, 0.0, "beta of each cluster's own server "
           "optimizer (heavy ball, state per cluster; 0: SGD with --server_lr, 1.0 = "
           "FedAvg's mean).", low=0, high=1, high_open=True),
)

FLHC_HPARAMS = _group(
    "flhc",
    hp.NUM_GROUPS,
    HParam("flhc_round", int, 10, "n: the clustering round (FedAvg before it; every client "
           "with training data trains in it). Not read in the paper: 10, the largest n of "
           "a public reproduction's sweep (1, 3, 5, 10).", low=1, limit=hp.MAX_ROUNDS),
    HParam("flhc_threshold", float, None, "P: the distance at which the tree of the "
           "clients' updates is cut (merges at distances <= P); unset: cut into "
           "--num_groups clusters. At most --num_groups clusters either way.", low=0,
           low_open=True),
    HParam("flhc_metric", str, "euclidean", "Distance between two clients' updates.",
           choices=("euclidean", "manhattan", "cosine")),
    HParam("flhc_linkage", str, "ward", "Linkage of the agglomerative clustering (ward "
           "needs the euclidean metric).", choices=("ward", "average", "complete", "single")),
)

PACFL_HPARAMS = _group(
    "pacfl",
    hp.NUM_GROUPS,
    HParam("pacfl_basis", int, 5, "p: left singular vectors kept per label of a client's "
           "training inputs (the authors' default; their CIFAR-10 script: 3).", low=1,
           limit=4096),
    HParam("pacfl_beta", float, 3.5, "beta: clusters merge while their proximity (degrees) "
           "is <= beta (the authors' default; CIFAR-10 script: 4.9). At most --num_groups "
           "clusters.", low=0),
    HParam("pacfl_linkage", str, "average", "Merged proximity: average (mean of the two "
           "rows, the authors'), maximum (complete) or minimum (single).",
           choices=("average", "maximum", "minimum")),
    HParam("pacfl_proximity", str, "code", "code: the smallest angle between any two basis "
           "vectors, min arccos(U_i^T U_j) (the authors' code); principal: the smallest "
           "principal angle between the two subspaces, arccos of the largest singular value "
           "of Q_i^T Q_j (orthonormal bases).", choices=("code", "principal")),
)

FEDEM_HPARAMS = _group(
    "fedem",
    hp.NUM_GROUPS,
    HParam("fedem_agg", str, "all", "Component aggregation: all (every client's n_k/n share, "
           "a client not sampled adding the component unchanged: the authors' code) or "
           "sampled (the n_k-weighted mean over the round's clients).",
           choices=("all", "sampled")),
)

FEDRC_HPARAMS = _group(
    "fedrc",
    hp.NUM_GROUPS,
    HParam("fedrc_predict", str, "soft", "A client's prediction: soft (its omega-weighted "
           "mixture of the components' probabilities) or hard (its largest-omega "
           "component alone; the authors' --hard_cluster).", choices=("soft", "hard")),
)

STOCFL_HPARAMS = (
    HParam("stocfl_tau", float, 0.3, "tau: two sampled clusters merge when the cosine "
           "similarity of their directions is >= tau (the code's default; its CIFAR "
           "command: 0.65).", low=-1, high=1, group="stocfl"),
    HParam("stocfl_mu", float, 0.05, "mu: the cluster models' proximal pull (mu/2)||w - "
           "w_g||^2 toward the global model.", low=0, group="stocfl"),
    HParam("stocfl_obep", int, 10, "Local epochs of a client's one representation "
           "training from the fixed anchor.", low=1, limit=hp.MAX_LOCAL_EPOCHS,
           group="stocfl"),
    HParam("stocfl_obbs", int, None, "Batch size of the representation training (default: "
           "the client's whole training set in one batch, the code's).", low=1,
           group="stocfl"),
    HParam("stocfl_global", str, "chain", "The global model's training: chain (each sampled "
           "client starts from the previous one's trained model; the new global model is "
           "the mean of the chain's models: the authors' code) or parallel (every client "
           "from w_g, the mean: the bi-level reading).", choices=("chain", "parallel"),
           group="stocfl"),
)

FEDSOFT_HPARAMS = _group(
    "fedsoft",
    hp.NUM_GROUPS,
    HParam("fedsoft_tau", int, 1, "tau: the importance weights are re-estimated every tau "
           "rounds, from round 1 (the code's default; its CIFAR-10 run: 2).", low=1,
           limit=hp.MAX_ROUNDS),
    HParam("fedsoft_k", int, None, "K: the clients each cluster selects a round (default "
           "30, the code's, or every client with training data when fewer; its CIFAR-10 "
           "run: 15).", low=1),
    HParam("fedsoft_lambda", float, 0.1, "lambda: the local pull sum_s (lambda/2) u_s ||w - "
           "c_s||^2 (the code's MNIST solver; CIFAR-10: 0.01).", low=0),
    HParam("fedsoft_sigma", float, 1e-4, "sigma: a cluster no sample of a client chooses "
           "gets u = sigma.", low=0, low_open=True, high=1),
    HParam("fedsoft_selection", str, "clusters", "clusters: each cluster draws K clients "
           "with probabilities v_s (the code's default), its model the mean of their "
           "models; all: every client trains every round, c_s = sum_k v_sk w_k.",
           choices=("clusters", "all")),
    HParam("fedsoft_eval", str, "cluster", "Model a client is tested with: cluster (the "
           "cluster model of its largest importance weight) or local (its own "
           "personalised local model).", choices=("cluster", "local")),
)

# The personalized methods (tff_cluster.algorithms.personal): which layers
# form the head, Ditto's pull, FedRep's head epochs, unseen clients.
HEAD_LAYERS = HParam("head_layers", int, 1, "The head: the model's last K layers that "
                     "hold weights (the body: the layers below); refused where the model "
                     "has fewer than K + 1.", low=1, limit=1000, group="personalized")
HEAD_NAMES = HParam("head_names", str, "", "The head by layer names (comma-separated; "
                    "given, it replaces --head_layers). An unknown name is refused with "
                    "the model's layers listed.", group="personalized")
HEAD = (HEAD_LAYERS, HEAD_NAMES)
FEDPER_HPARAMS = (*HEAD, CLIENT_WEIGHTING)
FEDREP_HPARAMS = (*HEAD, HParam(
    "fedrep_head_epochs", int, 10, "Epochs of head-only training before the body's (the "
    "authors' code: E - E_rep = 10 in every setting); the body then trains for the run's "
    "local work.", low=1, limit=hp.MAX_LOCAL_EPOCHS, group="fedrep"), CLIENT_WEIGHTING)
LG_FEDAVG_HPARAMS = (*HEAD, CLIENT_WEIGHTING)
FEDBN_HPARAMS = (CLIENT_WEIGHTING,)
DITTO_HPARAMS = (*_group(
    "ditto",
    HParam("ditto_lambda", float, 1.0, "lambda: the personal model's pull (lambda/2)||v - "
           "w_t||^2 toward the round's global model (the authors' FMNIST script: 1; 0: "
           "independent local models).", low=0),
    HParam("ditto_unseen", str, "initial", "A client never sampled is tested with: initial "
           "(its v_k's start w_0, as the authors' code) or global (the current global "
           "model, as a new client).", choices=("initial", "global"))), CLIENT_WEIGHTING)
LOCAL_ONLY_HPARAMS: tuple = ()
FEDAVG_FT_HPARAMS = (CLIENT_WEIGHTING, *_group(
    "fedavg_ft",
    HParam("ft_epochs", int, 1, "Epochs each client fine-tunes a copy of the global model on its "
           "training data before every evaluation (FedEM's --locally_tune_clients: 1).", low=1,
           limit=hp.MAX_LOCAL_EPOCHS),
    HParam("ft_layers", str, "all", "The layers fine-tuned: all (FedEM's) or head (FedRep's "
           "FedAvg baseline; the head as --head_layers/--head_names choose it).",
           choices=("all", "head")),
    HParam("ft_mu", float, 0.0, "mu: a pull (mu/2)||v - w||^2 toward the global model w while "
           "fine-tuning (Ditto's fine-tuning baseline; 0: none, FedEM's).", low=0)), *HEAD)
APFL_HPARAMS = _group(
    "apfl",
    HParam("apfl_alpha", float, 0.5, "The mixing weight alpha every client starts from (the "
           "authors' code's default 0.5).", low=0, high=1),
    HParam("apfl_adaptive", bool, False, "Adapt each client's alpha by its gradient (the authors' "
           "code: at a round's first step, off by default; params: at every step)."),
    HParam("apfl_mix", str, "outputs", "What the personal model mixes: outputs (the authors' "
           "code, alpha v(x) + (1 - alpha) w(x)) or params (FedJAX's, alpha v + (1 - alpha) w per "
           "weight).", choices=("outputs", "params")),
    HParam("apfl_agg", str, "uniform", "The server's mean of the clients' models: uniform (the "
           "authors' code) or weighted by the examples processed (FedJAX's).",
           choices=("uniform", "examples")))
PERFEDAVG_HPARAMS = _group(
    "perfedavg",
    HParam("perfedavg_variant", str, "fo", "fo: first-order meta-steps over 2 batches; hf: "
           "Hessian-free, a finite-difference Hessian-vector product on a third batch.",
           choices=("fo", "hf")),
    HParam("perfedavg_beta", float, 0.001, "beta: the meta-step's size (FL-bench's default; the "
           "inner step alpha is --client_lr).", low=0, low_open=True),
    HParam("perfedavg_delta", float, 0.001, "delta: the finite difference of the Hessian-free "
           "variant (FL-bench's default).", low=0, low_open=True))
PFEDME_HPARAMS = (CLIENT_WEIGHTING, *_group(
    "pfedme",
    HParam("pfedme_lambda", float, 15.0, "lambda: the personal model's pull toward the local "
           "model in the Moreau envelope (the authors' MNIST README: 15).", low=0, low_open=True),
    HParam("pfedme_personal_lr", float, 0.1, "The personal model's learning rate in the inner "
           "steps (README MNIST: 0.1).", low=0, low_open=True),
    HParam("pfedme_k", int, 5, "K: inner steps on each batch (README: 5).", low=1, limit=1000),
    HParam("pfedme_beta", float, 1.0, "beta: w <- (1 - beta) w + beta mean of the clients' local "
           "models (README's same-parameter runs and FL-bench: 1; tuned MNIST: 2).", low=0,
           low_open=True),
    HParam("pfedme_weight_decay", float, 0.001, "mu: the weight decay the authors' optimizer adds "
           "to the inner steps (0.001, its default; 0: off).", low=0),
    HParam("pfedme_train", str, "all", "Which clients train a round: all (the authors' code: every "
           "client trains, the sampled ones are averaged) or sampled.",
           choices=("all", "sampled"))))
