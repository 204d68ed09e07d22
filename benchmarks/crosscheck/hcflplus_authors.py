#!/usr/bin/env python
"""Cross-check fixture for HCFL+ (the FedRC repository's "FedIAS" with --split).

Runs the AUTHORS' code, imported unmodified, on fixed deterministic inputs and
writes inputs and outputs to tests/data/hcflplus_authors.json.

Source: the git mirror /work/.mirror/LINs-lab+FedRC/repo (github LINs-lab/FedRC),
commit ce792292655688c99206d4b5f126ec63934d1b1a. These files are written out
unmodified with `git show` (benchmarks/crosscheck/_mirror.py) into
/tmp/hcx/ref/ and that folder is put first on sys.path:
    aggregator.py, client.py, learners/learners_ensemble.py, models.py,
    utils/torch_utils.py, utils/optim.py, utils/losses.py
(`learners` and `utils` have no __init__.py in the repository: they import as
namespace packages, as in the authors' own runs.)

What is run (objects are built with object.__new__(cls), their __init__, which
needs data loaders, torch models and loggers, is NOT run; only the attributes the
exercised methods read are set):
  A "distances":  FedIASAggregator.proto_sim_cs(x_i, x_j) (which calls cos_sim) on
     6 numpy float64 message matrices [R=4, F=5], all 36 ordered pairs.
  B "e_step":     FedRC_SW.update_sample_weights() then
     FedRC_SW.update_learners_weights() (which calls FedRC.update_learner_labels_weights)
     on one client (n=7 samples, K=3 clusters, C=4 classes). The client's
     learners_ensemble is a REAL SplitLearnersEnsemble (object.__new__) whose
     learners are fakes; its real gather_losses builds the [K, n] loss table from
     each fake learner's gather_losses_split, which returns row k of the fixed
     losses. update_learner_labels_weights does NOT touch labels_weights: it
     rebuilds labels_learner_weights [K, C] = sum over the client's samples of
     gamma by label (read by run_experiment.py to refresh labels_weights through
     Client.update_labels_weights, which is not run here); it is recorded.
  C "add_remove": Client.add_learner(1) then Client.remove_learner(0) on a FedRC_SW
     client whose ensemble is a REAL SplitLearnersEnsemble (its own add_learner,
     the base LearnersEnsemble.remove_learner; both deepcopy/pop the fake learners).
  D "split":      FedIASAggregator.mix() with 6 FedRC_SW clients (real
     SplitLearnersEnsembles) and a real global SplitLearnersEnsemble of 3 fake
     learners: the real sample_clients (random.Random(0), all 6 sampled), proto_sim_cs,
     the cluster choice, the tol=0.05 test, and the authors' AgglomerativeClustering
     call. With scikit-learn >= 1.4 `AgglomerativeClustering(affinity=...)` raises
     TypeError: that run ("authors_run") is recorded as it fails, with the values
     the method had computed read from its frame's locals (min_sim, the weighted
     matrix, its clients, the chosen index, decide_removes) and its printout. Then,
     clearly labelled separately:
       * "sklearn_metric_precomputed": AgglomerativeClustering(metric="precomputed",
         linkage="complete").fit(that matrix) run by this script;
       * "with_affinity_shim": a fresh mix() on fresh objects where the aggregator
         MODULE's global name AgglomerativeClustering is rebound at run time (the
         file is unchanged) to a callable that passes affinity= as metric=; mix then
         runs to the end: client.add_learner on every client, Aggregator.add_learner,
         removal of the clusters no client picked, and the results are recorded.

Fakes and stubs, and why:
  * torchvision: models.py (imported at top level by learners_ensemble.py) does
    `import torchvision.models as models`; torchvision is not installed in the venv
    (the only local wheel, torchvision 0.28.0, is a CUDA build whose C ops fail to
    register against the CPU torch 2.13.0+cpu: "operator torchvision::nms does not
    exist"). If `import torchvision.models` fails, empty modules `torchvision` and
    `torchvision.models` are put in sys.modules; models.py only uses them inside
    model constructors, none of which runs here.
  * FakeLearner / FakeModel: learners of the SplitLearnersEnsembles; plain
    deepcopy-able objects with a `tag`, `model.in_features`, `model.output_dim`
    (read by Aggregator.add_learner's add_new_learner, which builds an nn.Linear
    from them) and, for B, gather_losses_split returning one row of fixed losses;
    deepcopy of one gives a learner whose tag ends in "#copy", so that the records
    tell a cluster's copy from its original.
  * FakeIterator / FakeDataset: `.dataset` with `targets` (list of int labels,
    read by update_learner_labels_weights) and len() (read by gather_losses).
  * D: each client's `step` is replaced on the instance by a function returning its
    fixed numpy update matrix [3 learners, F=5] (the real step trains); the
    aggregator module's global `average_learners` (from utils.torch_utils) is
    rebound at run time to a recorder (the tags of the learners averaged, the
    target's tag and the weights) instead of averaging torch state_dicts;
    `update_clients` is replaced on the aggregator instance by a no-op recorder
    (it copies torch models); c_round starts at 2 and log_freq is 10**9 so that
    neither write_logs nor save_similarites (logs/ files) is called by mix.
  * test_clients = [] (mix loops over them for add/remove only).

Dtypes: torch.set_default_dtype(torch.float64) and float64 tensors/arrays
throughout (in a real run the authors' torch tensors are float32).

Usage (from the repository root; writes tests/data/hcflplus_authors.json):
    /tmp/fedgwc_x/venv/bin/python benchmarks/crosscheck/hcflplus_authors.py [--out PATH]
Environment: /tmp/fedgwc_x/venv = CPython 3.11 + torch 2.13.0+cpu + numpy 2.4.6 +
scikit-learn 1.9.1 (scipy 1.17.1). Mirror override: HCFLPLUS_MIRROR=/path/to/git/dir.
"""
import argparse
import contextlib
import io
import json
import os
import random
import sys
import traceback
import types

import numpy as np

import _mirror  # (this folder: the script's own)

MIRROR = os.environ.get("HCFLPLUS_MIRROR", "/work/.mirror/LINs-lab+FedRC/repo")
COMMIT = "ce792292655688c99206d4b5f126ec63934d1b1a"
REF = "/tmp/hcx/ref"
FILES = ["aggregator.py", "client.py", "learners/learners_ensemble.py", "models.py",
         "utils/torch_utils.py", "utils/optim.py", "utils/losses.py"]
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_JSON = os.path.join(REPO_ROOT, "tests", "data", "hcflplus_authors.json")
STUBS = []


# ----------------------------------------------------------------------------- fakes
class FakeModel:
    def __init__(self, in_features=5, output_dim=4):
        self.in_features = in_features
        self.output_dim = output_dim


class FakeLearner:
    def __init__(self, tag, loss_row=None):
        self.tag = tag
        self.model = FakeModel()
        self.loss_row = loss_row

    def __deepcopy__(self, memo):  # a copy is told apart from its original by its tag
        c = FakeLearner(self.tag + "#copy", self.loss_row)
        c.model = FakeModel(self.model.in_features, self.model.output_dim)
        return c

    def gather_losses_split(self, base_model, iterator):
        import torch
        return torch.tensor(self.loss_row, dtype=torch.float64)


class FakeDataset:
    def __init__(self, targets):
        self.targets = list(targets)

    def __len__(self):
        return len(self.targets)


class FakeIterator:
    def __init__(self, targets):
        self.dataset = FakeDataset(targets)


def extract_ref():
    _mirror.extract(MIRROR, COMMIT, {f: os.path.join(REF, f) for f in FILES})
    if REF not in sys.path:
        sys.path.insert(0, REF)
    try:
        import torchvision.models  # noqa: F401
    except Exception as e:  # see the docstring
        tv = types.ModuleType("torchvision")
        tv.models = types.ModuleType("torchvision.models")
        sys.modules["torchvision"] = tv
        sys.modules["torchvision.models"] = tv.models
        STUBS.append({"module": "torchvision, torchvision.models", "kind": "empty modules in sys.modules",
                      "why": f"import failed ({type(e).__name__}: {e}); models.py imports it at top "
                             "level and uses it only in model constructors, none run here"})


def T(x):
    import torch
    return torch.tensor(np.asarray(x, dtype=np.float64), dtype=torch.float64)


def L(t):
    if hasattr(t, "detach"):
        t = t.detach().cpu().numpy()
    return np.asarray(t, dtype=np.float64).tolist()


def split_ensemble(tags, weights, loss_rows=None):
    from learners.learners_ensemble import SplitLearnersEnsemble
    ens = object.__new__(SplitLearnersEnsemble)
    ens.learners = [FakeLearner(t, None if loss_rows is None else loss_rows[k]) for k, t in enumerate(tags)]
    ens.learners_weights = T(weights)
    ens.base_learner = FakeLearner("base")
    ens.domain_disc_learner = None
    return ens


def new_client(ens, targets, samples_weights, sample_learner_weights, labels_weights, distances,
               class_number):
    import torch
    from client import FedRC_SW
    c = object.__new__(FedRC_SW)
    K, n = np.asarray(samples_weights).shape
    c.learners_ensemble = ens
    c.n_learners = K
    c.n_train_samples = n
    c.class_number = class_number
    c.train_iterator = FakeIterator(targets)
    c.val_iterator = c.train_iterator
    c.samples_weights = T(samples_weights)
    c.sample_learner_weights = T(sample_learner_weights)
    c.labels_weights = T(labels_weights)
    c.samples_weights_momentum = torch.zeros(K, n)
    c.samples_weights_momentum_1 = torch.zeros(K, n)
    c.distances = T(distances)
    c.labels_learner_weights = torch.ones(K, class_number) / class_number
    return c


def col_norm(a):
    return a / a.sum(0, keepdims=True)


# ----------------------------------------------------------------------------- A
def make_messages():
    x = np.random.default_rng(0).normal(size=(6, 4, 5))
    x[2, 1] = 0.0
    x[3, 0] = [1.0, -1.0, 0.0, 0.0, 0.0]
    return x


def run_distances():
    from aggregator import FedIASAggregator
    agg = object.__new__(FedIASAggregator)
    x = make_messages()
    M = [[float(agg.proto_sim_cs(x[i], x[j])) for j in range(6)] for i in range(6)]
    return {"messages": x.tolist(), "matrix": M,
            "method": "FedIASAggregator.proto_sim_cs(messages[i], messages[j]) -> matrix[i][j]",
            "rng": "np.random.default_rng(0).normal(size=(6,4,5)); messages[2][1]=0; "
                   "messages[3][0]=[1,-1,0,0,0]"}


# ----------------------------------------------------------------------------- B
E_K, E_N, E_C = 3, 7, 4
E_TARGETS = [0, 1, 2, 3, 0, 1, 2]


def e_inputs():
    rng = np.random.default_rng(1)
    losses = rng.uniform(0.1, 3.0, size=(E_K, E_N))
    label_table = rng.dirichlet(np.ones(E_C), size=E_K)  # [K, C], P(y | k)
    labels_weights = label_table[:, E_TARGETS]             # [K, n]
    slw = col_norm(rng.uniform(0.1, 1.0, size=(E_K, E_N)))
    lw = np.array([0.5, 0.3, 0.2])
    return losses, label_table, labels_weights, slw, lw


def run_e_step():
    losses, label_table, labels_weights, slw, lw = e_inputs()
    ens = split_ensemble([f"k{k}" for k in range(E_K)], lw, loss_rows=losses)
    c = new_client(ens, E_TARGETS, np.full((E_K, E_N), 1.0 / E_K), slw, labels_weights,
                   np.zeros(E_K), E_C)
    gathered = ens.gather_losses(c.val_iterator)
    c.update_sample_weights()
    after_sample = {"samples_weights": L(c.samples_weights),
                    "new_samples_weights": L(c.new_samples_weights),
                    "mean_I": float(c.mean_I),
                    "learners_weights_unchanged": L(c.learners_ensemble.learners_weights),
                    "sample_learner_weights_unchanged": L(c.sample_learner_weights)}
    c.update_learners_weights()
    out = {
        "inputs": {"losses": losses.tolist(), "labels_weights": labels_weights.tolist(),
                   "label_table": label_table.tolist(), "targets": E_TARGETS,
                   "sample_learner_weights": slw.tolist(), "learners_weights": lw.tolist(),
                   "K": E_K, "n": E_N, "class_number": E_C,
                   "recipe": "rng=np.random.default_rng(1); losses=rng.uniform(0.1,3,(K,n)); "
                             "label_table=rng.dirichlet(ones(C),K); labels_weights=label_table[:,targets]; "
                             "sample_learner_weights=col_norm(rng.uniform(0.1,1,(K,n)))"},
        "gathered_losses": L(gathered),
        "after_update_sample_weights": after_sample,
        "samples_weights": after_sample["samples_weights"],          # gamma [K, n]
        "new_samples_weights": after_sample["new_samples_weights"],  # gamma-tilde [K, n]
        "learners_weights": L(c.learners_ensemble.learners_weights), # pi [K]
        "sample_learner_weights": L(c.sample_learner_weights),       # omega [K, n]
        "cluster": L(c.cluster),
        "labels_learner_weights": L(c.labels_learner_weights),       # [K, C]
        "labels_weights_after": L(c.labels_weights),
        "mu": 0.4,
    }
    # restatement (checks orientation only; the values above are the authors')
    def softmax0(a):
        a = a - a.max(0, keepdims=True)
        e = np.exp(a)
        return e / e.sum(0, keepdims=True)
    S = -losses - np.log(labels_weights)
    g = softmax0(np.log(slw) + S)
    gt = softmax0(np.log(lw)[:, None] + S)
    pi = gt.mean(1)
    assert np.allclose(g, out["samples_weights"], atol=1e-12)
    assert np.allclose(gt, out["new_samples_weights"], atol=1e-12)
    assert np.allclose(pi, out["learners_weights"], atol=1e-12)
    assert np.allclose(0.4 * g + 0.6 * pi[:, None], out["sample_learner_weights"], atol=1e-12)
    assert np.allclose(out["labels_weights_after"], labels_weights)
    return out


# ----------------------------------------------------------------------------- C
def run_add_remove():
    rng = np.random.default_rng(2)
    K, n, C = 3, 7, 4
    targets = [0, 1, 2, 3, 0, 1, 2]
    sw = col_norm(rng.uniform(0.1, 1.0, size=(K, n)))
    slw = col_norm(rng.uniform(0.1, 1.0, size=(K, n)))
    lab = col_norm(rng.uniform(0.1, 1.0, size=(K, n)))
    lw = np.array([0.5, 0.3, 0.2])
    dist = np.array([0.1, 0.2, 0.3])
    ens = split_ensemble([f"k{k}" for k in range(K)], lw)
    c = new_client(ens, targets, sw, slw, lab, dist, C)

    def snap():
        return {"samples_weights": L(c.samples_weights),
                "sample_learner_weights": L(c.sample_learner_weights),
                "learners_weights": L(c.learners_ensemble.learners_weights),
                "labels_weights": L(c.labels_weights),
                "labels_learner_weights": L(c.labels_learner_weights),
                "distances": L(c.distances),
                "n_learners": c.n_learners,
                "learner_tags": [l.tag for l in c.learners_ensemble.learners],
                "samples_weights_momentum_shape": list(c.samples_weights_momentum.shape)}

    c.add_learner(1)
    after_add = snap()
    c.remove_learner(0)
    after_remove = snap()
    return {
        "inputs": {"samples_weights": sw.tolist(), "sample_learner_weights": slw.tolist(),
                   "labels_weights": lab.tolist(), "learners_weights": lw.tolist(),
                   "distances": dist.tolist(), "targets": targets, "class_number": C,
                   "samples_weights_momentum": "zeros(3, n)",
                   "recipe": "rng=np.random.default_rng(2); samples_weights, sample_learner_weights, "
                             "labels_weights = col_norm(rng.uniform(0.1,1,(3,n))) in that order"},
        "calls": ["client.add_learner(1)", "client.remove_learner(0)"],
        "ensemble": "real SplitLearnersEnsemble (its add_learner; LearnersEnsemble.remove_learner)",
        "after_add_learner_1": after_add,
        "after_remove_learner_0": after_remove,
    }


# ----------------------------------------------------------------------------- D
D_N = [4, 5, 6, 3, 5, 4]
D_LW = [[0.8, 0.1, 0.1], [0.7, 0.2, 0.1], [0.9, 0.05, 0.05],
        [0.45, 0.45, 0.1], [0.2, 0.7, 0.1], [0.1, 0.8, 0.1]]  # client 3: a tie -> cluster 0
D_GROUP = [0, 0, 1, 1, 2, 2]  # direction of each client's update rows
D_TOL = 0.05


def d_inputs():
    rng = np.random.default_rng(3)
    base = rng.normal(size=(3, 3, 5))  # [group, row, F]
    upd = np.stack([base[g] + 0.1 * rng.normal(size=(3, 5)) for g in D_GROUP])  # [6, R=3, F=5]
    sw, slw = [], []
    for n in D_N:
        sw.append(col_norm(rng.uniform(0.1, 1.0, size=(3, n))))
        slw.append(col_norm(rng.uniform(0.1, 1.0, size=(3, n))))
    return upd, sw, slw


def build_d(avg_log, upd_log):
    from aggregator import FedIASAggregator
    import torch
    upd, sw, slw = d_inputs()
    clients = []
    for i, n in enumerate(D_N):
        ens = split_ensemble([f"c{i}/k{k}" for k in range(3)], D_LW[i])
        targets = [j % 4 for j in range(n)]
        c = new_client(ens, targets, sw[i], slw[i], np.full((3, n), 1.0 / 3), np.zeros(3), 4)
        c.step = (lambda u: (lambda *a, **k: u.copy()))(upd[i])
        clients.append(c)
    agg = object.__new__(FedIASAggregator)
    agg.clients = clients
    agg.test_clients = []
    agg.n_clients = len(clients)
    agg.rng = random.Random(0)
    agg.sample_with_replacement = False
    agg.n_clients_per_round = len(clients)
    agg.clients_weights = torch.ones(len(clients)) / len(clients)
    agg.sampled_clients = []
    agg.global_learners_ensemble = split_ensemble([f"g/k{k}" for k in range(3)], np.ones(3) / 3)
    agg.n_learners = 3
    agg.tol = D_TOL
    agg.split = True
    agg.domain_disc = False
    agg.clients_updates = {}
    agg.clients_cluster_indicies = {}
    agg.similarities = np.zeros((len(clients), len(clients)))
    agg.c_round = 2
    agg.log_freq = 10 ** 9
    agg.update_clients = lambda: upd_log.append("update_clients")
    return agg, upd, sw, slw


def make_avg_recorder(log):
    def average_learners(learners, target_learner, weights=None, **kw):
        log.append({"learners": [l.tag for l in learners], "target": target_learner.tag,
                    "weights": None if weights is None else L(weights)})
    return average_learners


def run_split():
    import aggregator as agg_mod
    from sklearn.cluster import AgglomerativeClustering as SkAgglo

    real_avg = agg_mod.average_learners
    real_agglo = agg_mod.AgglomerativeClustering
    res = {}
    # ---- 1. the authors' mix as it is
    avg_log, upd_log = [], []
    agg_mod.average_learners = make_avg_recorder(avg_log)
    agg, upd, sw, slw = build_d(avg_log, upd_log)
    buf = io.StringIO()
    err = None
    loc = None
    try:
        with contextlib.redirect_stdout(buf):
            agg.mix()
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
        tb = e.__traceback__
        while tb is not None:
            f = tb.tb_frame
            if f.f_code.co_name == "mix" and f.f_code.co_filename.endswith("aggregator.py"):
                loc = dict(f.f_locals)
            tb = tb.tb_next
        tb_text = traceback.format_exc().strip().splitlines()[-3:]
    finally:
        agg_mod.average_learners = real_avg
    authors = {"printed": buf.getvalue(), "error": err,
               "sampled_indices": None if loc is None else list(loc["sampled_indicies"]),
               "clients_cluster_indicies": {str(k): v for k, v in sorted(agg.clients_cluster_indicies.items())},
               "similarities": agg.similarities.tolist(),
               "average_learners_calls": avg_log}
    if err is not None:
        authors["traceback_tail"] = tb_text
    if loc is not None and "min_similarities_by_clusters" in loc:
        Msub = np.asarray(loc["min_similarities_by_clusters"], dtype=np.float64)
        members = [idx for (_, idx) in loc["min_clients_by_clusters"]]
        authors.update({
            "chosen_cluster": int(loc["min_sim_cluster_index"]),
            "min_sim": float(loc["min_sim"]),
            "mean": float(np.mean(Msub)),
            "std": float(np.std(Msub)),
            "split": bool(loc["min_sim"] - np.mean(Msub) > loc["alpha"]),
            "reached_AgglomerativeClustering": err is not None and "affinity" in err,
            "members": members,
            "weighted_matrix": Msub.tolist(),
            "decide_removes": list(loc["decide_removes"]),
            "values_source": "locals of the authors' mix frame at the exception (min_sim, "
                             "min_similarities_by_clusters, min_clients_by_clusters, "
                             "min_sim_cluster_index, decide_removes); mean/std = np.mean/np.std of that "
                             "matrix, as the method prints them",
        })
    res["authors_run"] = authors

    # ---- 2. sklearn with metric= on the same matrix (this script's call, not the authors')
    if "weighted_matrix" in authors:
        Msub = np.asarray(authors["weighted_matrix"])
        lab = SkAgglo(metric="precomputed", linkage="complete").fit(Msub).labels_
        p1 = np.argwhere(lab == 0).flatten().tolist()
        p2 = np.argwhere(lab == 1).flatten().tolist()
        res["sklearn_metric_precomputed"] = {
            "call": 'AgglomerativeClustering(metric="precomputed", linkage="complete").fit(weighted_matrix)',
            "labels": [int(v) for v in lab],
            "cluster_1_positions": p1, "cluster_2_positions": p2,
            "cluster_1_clients": [authors["members"][i] for i in p1],
            "cluster_2_clients": [authors["members"][i] for i in p2],
        }

    # ---- 3. a fresh mix with the module-global AgglomerativeClustering rebound (file unchanged)
    def agglo_shim(affinity=None, **kw):
        return SkAgglo(metric=affinity, **kw)
    avg_log, upd_log = [], []
    agg_mod.average_learners = make_avg_recorder(avg_log)
    agg_mod.AgglomerativeClustering = agglo_shim
    try:
        agg, upd, sw, slw = build_d(avg_log, upd_log)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            agg.mix()
    finally:
        agg_mod.average_learners = real_avg
        agg_mod.AgglomerativeClustering = real_agglo
    res["with_affinity_shim"] = {
        "shim": "aggregator.AgglomerativeClustering rebound at run time to "
                "lambda affinity=None, **kw: sklearn AgglomerativeClustering(metric=affinity, **kw)",
        "printed": buf.getvalue(),
        "similarities": agg.similarities.tolist(),
        "n_learners_after": agg.n_learners,
        "global_learner_tags_after": [l.tag for l in agg.global_learners_ensemble.learners],
        "global_learners_weights_after": L(agg.global_learners_ensemble.learners_weights),
        "average_learners_calls": avg_log,
        "update_clients_calls": len(upd_log),
        "clients_after": [{"learners_weights": L(c.learners_ensemble.learners_weights),
                           "samples_weights": L(c.samples_weights),
                           "sample_learner_weights": L(c.sample_learner_weights),
                           "learner_tags": [l.tag for l in c.learners_ensemble.learners],
                           "n_learners": c.n_learners} for c in agg.clients],
        "c_round_after": agg.c_round,
    }
    if "sklearn_metric_precomputed" in res:
        m = res["sklearn_metric_precomputed"]
        line = [l for l in buf.getvalue().splitlines() if l.startswith("[")][0]
        assert line == f"{np.array(m['cluster_1_positions'])} {np.array(m['cluster_2_positions'])}", line
    res["inputs"] = {
        "updates": upd.tolist(), "learners_weights": D_LW, "n_train_samples": D_N,
        "samples_weights": [a.tolist() for a in sw], "sample_learner_weights": [a.tolist() for a in slw],
        "labels_weights": "uniform 1/3", "targets": "j % 4 for sample j", "class_number": 4,
        "update_groups": D_GROUP, "tol": D_TOL, "n_learners": 3, "split": True,
        "global_learners_weights": [1 / 3] * 3, "rng_seed_sample_clients": "random.Random(0)",
        "c_round_before": 2, "log_freq": 10 ** 9,
        "recipe": "rng=np.random.default_rng(3); base=rng.normal(size=(3,3,5)); updates[i]=base[group[i]]"
                  "+0.1*rng.normal(size=(3,5)) for i in order; then per client: samples_weights, "
                  "sample_learner_weights = col_norm(rng.uniform(0.1,1,(3,n_i)))",
    }
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=OUT_JSON)
    args = ap.parse_args()

    extract_ref()
    import sklearn
    import torch
    torch.set_default_dtype(torch.float64)

    out = {"meta": {
        "source": "github LINs-lab/FedRC (FedIAS = HCFL+), files imported unmodified",
        "mirror": MIRROR, "commit": COMMIT, "files": FILES,
        "python": sys.version.split()[0], "torch": torch.__version__,
        "sklearn": sklearn.__version__, "numpy": np.__version__,
        "dtype": "float64 (torch default dtype set to float64)",
        "stubs": STUBS,
        "script": "benchmarks/crosscheck/hcflplus_authors.py"}}
    out["distances"] = run_distances()
    out["e_step"] = run_e_step()
    out["add_remove"] = run_add_remove()
    out["split"] = run_split()

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    print(f"wrote {args.out}")
    s = out["split"]["authors_run"]
    print("authors' mix:", s["error"])
    print({k: s.get(k) for k in ("chosen_cluster", "min_sim", "mean", "split", "members", "decide_removes")})
    print("metric=precomputed:", out["split"].get("sklearn_metric_precomputed", {}).get("cluster_1_clients"),
          out["split"].get("sklearn_metric_precomputed", {}).get("cluster_2_clients"))
    print("shim printout:", out["split"]["with_affinity_shim"]["printed"])


if __name__ == "__main__":
    main()
