#!/usr/bin/env python
"""Cross-check fixture for FedGWC (Licciardi et al., ICML 2025).

Runs the AUTHORS' server-side methods of `ServerFedGWC` from `agents/servers.py`
of the mirror /work/.mirror/davedleo+FedGWC/repo at commit
24d0716b8f68450529be4d9325a8a373645b3308, imported unmodified (extracted at run
time with `git show` into /tmp/fedgwc_x/ref/agents/{__init__,servers}.py and put
on sys.path), on fixed deterministic inputs:

  1. `_get_gaussian_rewards(self)`           -> (OrderedDict client_id -> reward, sum)
     reads self._current_updates {'clients_updates': {cid: {'loss', 'num_samples'}},
     'tot_num_samples'}, self._num_clients_per_round, self._num_local_iters,
     self._loss_sampling_size (set = m, so the synthetic loss sampling is inactive).
  2. `_update_W(self, cluster_id)`           -> None (mutates self._clusters_W,
     self._mse, self._patience; computes the rewards itself from
     self._current_updates, so the losses are fed, not the rewards).
  3. `_compute_P(self, cluster_id)`          -> affinity (reads self._clusters_W, self._gamma).
  4. `_find_best_clusters(self, cluster_id)` -> (n_clusters_best, y_best); reads
     self._clusters_W, self._num_clients_per_round, self._gamma, self._seed. The
     Davies-Bouldin score is NOT returned: it is recomputed here exactly as the
     method does (SpectralEmbedding(n, affinity='precomputed', random_state=seed,
     n_jobs=-1).fit_transform(_compute_P(cid)) + sklearn davies_bouldin_score) and
     checked against the value the method prints (rounded to 4 digits).

The server object is built with object.__new__(ServerFedGWC) (its __init__, which
needs a torch model and client objects, is NOT run); only the attributes listed
above are set. No module is stubbed: servers.py imports only torch, numpy, json,
os, copy, collections and scikit-learn, all installed; agents/__init__.py (empty)
is extracted too so that `agents.servers` imports as a package module.

Dtypes: the authors' reward code is torch. `torch.zeros` buffers (mu, sigma2,
losses_obs) take torch's default dtype (float32 unless changed) and the client
sends its per-step losses as a float32 tensor (agents/clients.py L143), so in the
real code the rewards are float32 values turned into Python floats by `.item()`.
The interaction matrix, mse, affinity and clustering are numpy float64. This
script produces two variants of steps 1-3:
  * "float64" (the main keys): torch.set_default_dtype(torch.float64) and float64
    loss tensors, so the whole pipeline is float64 (the code is not changed);
  * "native_float32": default dtype float32 and float32 loss tensors, as in a real run.
Step 4 involves no torch and is float64 only.

Usage (writes tests/data/fedgwc_authors.json next to this repo's benchmarks/):
    /tmp/fedgwc_x/venv/bin/python benchmarks/crosscheck/fedgwc_authors.py [--out PATH]
Environment: /tmp/fedgwc_x/venv = CPython 3.11.7 + torch 2.13.0+cpu (the local
CPU wheel, cp311 only) + scikit-learn 1.9.1 + numpy 2.4.6 (scipy 1.17.1).
Mirror override: FEDGWC_MIRROR=/path/to/git/dir.
"""
import argparse
import contextlib
import io
import json
import os
import re
import sys
from collections import OrderedDict

import numpy as np

import _mirror  # (this folder: the script's own)

MIRROR = os.environ.get("FEDGWC_MIRROR", "/work/.mirror/davedleo+FedGWC/repo")
COMMIT = "24d0716b8f68450529be4d9325a8a373645b3308"
REF = "/tmp/fedgwc_x/ref"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_JSON = os.path.join(REPO_ROOT, "tests", "data", "fedgwc_authors.json")

# ----------------------------------------------------------------------------- inputs
LOSSES = [[2.0, 1.5, 1.2], [2.2, 1.4, 1.0], [3.0, 2.5, 2.4], [2.1, 1.6, 1.1]]  # (m=4, T=3)
N_SAMPLES = [10, 20, 30, 40]
M_PER_ROUND = 4
T_STEPS = 3
K_CLUSTER = 8
IDX_CALL1 = [5, 1, 6, 2]  # local indices; row k of LOSSES / N_SAMPLES belongs to IDX_CALL1[k]
IDX_CALL2 = [0, 3, 4, 7]  # gets LOSSES[::-1] and N_SAMPLES[::-1]
MSE0 = 1.0
PATIENCE0 = 0
EPS = 1e-5
GAMMAS_P = [0.1, 4.0]
GROUPS_12 = [0] * 7 + [1] * 5
M_RNG_SEED = 2
GAMMA_CLUST = 4.0
SEED_CLUST = 0


def make_M12():
    g = np.array(GROUPS_12)
    M = np.where(g[:, None] == g[None, :], 0.3, 0.01)
    M = M + 0.001 * np.random.default_rng(M_RNG_SEED).uniform(size=(12, 12))
    return M


def extract_ref():
    _mirror.extract(MIRROR, COMMIT, {f"agents/{f}": os.path.join(REF, "agents", f)
                                     for f in ("__init__.py", "servers.py")})
    if REF not in sys.path:
        sys.path.insert(0, REF)


# ----------------------------------------------------------------------------- helpers
def cid(k):
    return str(k)  # client ids are strings in the authors' code (partition JSON keys)


def set_updates(srv, idx, losses, ns, tdtype):
    import torch
    cu = OrderedDict()
    for k, row, n in zip(idx, losses, ns):
        cu[cid(k)] = {"model": None, "loss": torch.tensor(row, dtype=tdtype), "num_samples": int(n)}
    srv._current_updates = {"clients_updates": cu, "tot_num_samples": int(sum(ns))}


def new_server(cls):
    srv = object.__new__(cls)
    srv._num_clients_per_round = M_PER_ROUND
    srv._num_local_iters = T_STEPS
    srv._loss_sampling_size = M_PER_ROUND  # -> num_losses_to_sample = 0 (inactive)
    srv._eps = EPS
    return srv


def np_rewards(L, n):
    L = np.asarray(L, float); n = np.asarray(n, float)
    w = n / n.sum()
    mu = w @ L
    var = w @ (L - mu) ** 2 + 1e-16
    return np.exp(-0.5 * (L - mu) ** 2 / var).mean(1)


def run_steps_1_to_3(cls, tdtype, log):
    import torch
    out = {}
    # 1. rewards
    srv = new_server(cls)
    set_updates(srv, IDX_CALL1, LOSSES, N_SAMPLES, tdtype)
    R, R_sum = srv._get_gaussian_rewards()
    out["rewards"] = [R[cid(k)] for k in IDX_CALL1]
    out["rewards_sum"] = R_sum
    out["reward_keys_order"] = list(R.keys())
    # rewards of the second call's input (for reference)
    set_updates(srv, IDX_CALL2, LOSSES[::-1], N_SAMPLES[::-1], tdtype)
    R2, R2_sum = srv._get_gaussian_rewards()
    out["rewards_call2"] = [R2[cid(k)] for k in IDX_CALL2]
    out["rewards_call2_sum"] = R2_sum

    # 2. interaction-matrix update, cluster '0' of K=8 clients
    srv = new_server(cls)
    c = "0"
    srv._clusters_clients_ids_map = {c: {cid(i): i for i in range(K_CLUSTER)}}
    srv._clusters_W = {c: np.ones((K_CLUSTER, K_CLUSTER)) / (K_CLUSTER ** 2)}
    srv._mse = {c: MSE0}
    srv._patience = {c: {"current": PATIENCE0, "target": round(K_CLUSTER / M_PER_ROUND)}}
    out["W0"] = srv._clusters_W[c].tolist()
    calls = []
    for idx, L, n in ((IDX_CALL1, LOSSES, N_SAMPLES), (IDX_CALL2, LOSSES[::-1], N_SAMPLES[::-1])):
        set_updates(srv, idx, L, n, tdtype)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            srv._update_W(c)
        log.append(buf.getvalue())
        calls.append({
            "indices": idx,
            "W": srv._clusters_W[c].tolist(),
            "mse": float(srv._mse[c]),
            "patience": dict(srv._patience[c]),
        })
    out["update_W_calls"] = calls
    out["W_dtype"] = str(srv._clusters_W[c].dtype)

    # 3. affinity on the matrix after the 2nd call
    out["P"] = {}
    for g in GAMMAS_P:
        srv._gamma = g
        P = srv._compute_P(c)
        out["P"][repr(g)] = P.tolist()
        out["P_dtype"] = str(P.dtype)
    return out


def run_step_4(cls, log):
    from sklearn.cluster import SpectralClustering
    from sklearn.manifold import SpectralEmbedding
    from sklearn.metrics import davies_bouldin_score

    srv = new_server(cls)
    c = "0"
    M = make_M12()
    srv._clusters_W = {c: M.copy()}
    srv._gamma = GAMMA_CLUST
    srv._seed = SEED_CLUST
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        n_best, y_best = srv._find_best_clusters(c)
    printed = buf.getvalue()
    log.append(printed)
    assert np.array_equal(srv._clusters_W[c], M), "method mutated its input"

    P = srv._compute_P(c)
    max_n = min(int(M.shape[0] / M_PER_ROUND) + 1, 5)
    cand = {}
    printed_db = {int(a): float(b) for a, b in re.findall(r"n_clusters = (\d+): davies = ([0-9.eE+-]+)", printed)}
    for n in range(2, max_n):  # same calls as the method (recomputed here; the method does not return them)
        emb = SpectralEmbedding(n_components=n, affinity="precomputed", random_state=SEED_CLUST,
                                n_jobs=-1).fit_transform(P)
        y = SpectralClustering(n_clusters=n, n_components=n, affinity="precomputed",
                               assign_labels="cluster_qr", random_state=SEED_CLUST,
                               n_jobs=-1).fit_predict(P)
        db = float(davies_bouldin_score(emb, y))
        assert round(db, 4) == printed_db[n], (n, db, printed_db)
        cand[str(n)] = {"labels": [int(v) for v in y], "davies_bouldin": db,
                        "davies_bouldin_printed_by_method": printed_db[n]}
    res = {
        "M": M.tolist(),
        "groups": GROUPS_12,
        "M_rng": f"np.random.default_rng({M_RNG_SEED}).uniform(size=(12,12))",
        "gamma": GAMMA_CLUST,
        "seed": SEED_CLUST,
        "m": M_PER_ROUND,
        "candidate_n": list(range(2, max_n)),
        "n_clusters": int(n_best),
        "labels": None if y_best is None else [int(v) for v in y_best],
        "davies_bouldin": None if n_best == 1 else cand[str(n_best)]["davies_bouldin"],
        "davies_bouldin_source": "recomputed (method returns only n, y): SpectralEmbedding(n_components=n, "
                                 "affinity='precomputed', random_state=seed, n_jobs=-1).fit_transform("
                                 "_compute_P(cid)) + davies_bouldin_score; matches the method's printout",
        "candidates": cand,
        "P": P.tolist(),
    }
    if y_best is not None:
        assert res["labels"] == cand[str(n_best)]["labels"]
    return res


# ----------------------------------------------------------------------------- checks
def sanity(o):
    r = np.array(o["rewards"])
    assert np.all(r > 0) and np.all(r <= 1), r
    assert np.allclose(r, np_rewards(LOSSES, N_SAMPLES), rtol=1e-6, atol=1e-7)
    a = M_PER_ROUND / K_CLUSTER
    W = np.array(o["W0"]); mse = MSE0; pat = PATIENCE0
    steps = ((IDX_CALL1, LOSSES, N_SAMPLES), (IDX_CALL2, LOSSES[::-1], N_SAMPLES[::-1]))
    for call, (idx, L, n) in zip(o["update_W_calls"], steps):
        rr = np_rewards(L, n)
        old = W[np.ix_(idx, idx)].copy()
        new = (1 - a) * old + (a * rr / rr.sum())[:, None]
        W[np.ix_(idx, idx)] = new
        mse = (1 - a) * mse + a * ((new - old) ** 2).sum() / M_PER_ROUND ** 2
        pat = pat + 1 if mse < EPS else 0
        assert np.allclose(np.array(call["W"]), W, rtol=1e-6, atol=1e-9)
        assert abs(call["mse"] - mse) < 1e-9 and call["patience"]["current"] == pat
    return float(np.abs(np.array(o["update_W_calls"][-1]["W"]) - W).max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=OUT_JSON)
    args = ap.parse_args()

    extract_ref()
    import sklearn
    import torch
    from agents.servers import ServerFedGWC  # authors' file, unmodified

    log = []
    default0 = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        f64 = run_steps_1_to_3(ServerFedGWC, torch.float64, log)
    finally:
        torch.set_default_dtype(default0)
    f32 = run_steps_1_to_3(ServerFedGWC, torch.float32, log)
    st4 = run_step_4(ServerFedGWC, log)

    err64 = sanity(f64)
    err32 = sanity(f32)

    out = {
        "meta": {
            "source": "github davedleo/FedGWC agents/servers.py (ServerFedGWC), imported unmodified",
            "mirror": MIRROR,
            "commit": COMMIT,
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "sklearn": sklearn.__version__,
            "numpy": np.__version__,
            "stubs": [],
            "script": "benchmarks/crosscheck/fedgwc_authors.py",
        },
        "commit": COMMIT,
        "torch": torch.__version__,
        "sklearn": sklearn.__version__,
        "numpy": np.__version__,
        "dtypes": {
            "rewards": "torch; authors' buffers use torch's default dtype (float32 in a real run) and the client "
                       "sends float32 losses (clients.py L143); main keys here: default dtype float64 + float64 "
                       "losses; 'native_float32' block: float32 as in a real run. Rewards are returned as Python "
                       "floats via .item().",
            "interaction_matrix_W_mse": "numpy float64 (np.ones(...)/N**2; updated with Python-float rewards)",
            "affinity_P": "numpy float64",
            "clustering": "numpy float64 + scikit-learn (arpack, random_state=seed)",
            "native_float32_vs_float64_max_abs_diff": {
                "rewards": float(np.abs(np.array(f64["rewards"]) - np.array(f32["rewards"])).max()),
                "W_final": float(np.abs(np.array(f64["update_W_calls"][-1]["W"])
                                        - np.array(f32["update_W_calls"][-1]["W"])).max()),
                "P": {g: float(np.abs(np.array(f64["P"][g]) - np.array(f32["P"][g])).max()) for g in f64["P"]},
            },
            "numpy_restatement_max_abs_diff_W_final": {"float64": err64, "native_float32": err32},
        },
        "inputs": {
            "losses": LOSSES,
            "n": N_SAMPLES,
            "m": M_PER_ROUND,
            "T": T_STEPS,
            "K": K_CLUSTER,
            "loss_sampling_size": M_PER_ROUND,
            "indices_call1": IDX_CALL1,
            "indices_call2": IDX_CALL2,
            "losses_call2": LOSSES[::-1],
            "n_call2": N_SAMPLES[::-1],
            "W0": "ones((K,K))/K**2",
            "mse0": MSE0,
            "patience0": PATIENCE0,
            "patience_target": round(K_CLUSTER / M_PER_ROUND),
            "eps": EPS,
            "alpha": M_PER_ROUND / K_CLUSTER,
            "gammas_P": GAMMAS_P,
            "M12": st4["M"],
            "M12_groups": GROUPS_12,
            "M12_recipe": "0.3 if same group else 0.01, + 0.001*np.random.default_rng(2).uniform(size=(12,12))",
            "gamma_clusters": GAMMA_CLUST,
            "seed_clusters": SEED_CLUST,
            "client_ids": "str(local index); row k of the losses belongs to indices[k]",
        },
        "rewards": f64["rewards"],
        "rewards_sum": f64["rewards_sum"],
        "rewards_call2": f64["rewards_call2"],
        "update_W": f64["update_W_calls"],
        "P": f64["P"],
        "find_best_clusters": {k: v for k, v in st4.items() if k != "M"},
        "native_float32": {
            "rewards": f32["rewards"],
            "rewards_sum": f32["rewards_sum"],
            "rewards_call2": f32["rewards_call2"],
            "update_W": f32["update_W_calls"],
            "P": f32["P"],
        },
        "authors_stdout": "".join(log),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    print(f"wrote {args.out}")
    print("rewards", f64["rewards"])
    for cl in f64["update_W_calls"]:
        print("mse", cl["mse"], "patience", cl["patience"])
    print("find_best_clusters: n =", st4["n_clusters"], "labels =", st4["labels"], "DB =", st4["davies_bouldin"])
    print({n: round(v["davies_bouldin"], 6) for n, v in st4["candidates"].items()})


if __name__ == "__main__":
    main()
