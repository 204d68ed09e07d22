#!/usr/bin/env python
"""Cross-check fixture for pFedGraph (Ye et al., ICML 2023).

Runs the AUTHORS' server-side functions `update_graph_matrix_neighbor` and
`aggregation_by_graph` (plus `cal_model_cosine_difference`) from
  * the TensorFlow port   tensorflow/pfedgraph_cosine/utils.py
  * the PyTorch original  pytorch/pfedgraph_cosine/utils.py
of the mirror /work/.mirror/MediaBrain-SJTU+pFedGraph/repo at commit
4f5f17c45d88745be642f834ffc60c1604f019f4, imported unmodified (extracted with
`git show` into /tmp/rules/ref/{tf,torch}/pfedgraph_cosine/utils.py), on one fixed
deterministic input, and compares both with an independent numpy reference
(closed-form simplex projection instead of cvxpy).

Usage (orchestrator, writes /tmp/rules/pfedgraph_fixture.json):
    /tmp/rules/venv/bin/python /tmp/rules/pfedgraph_fixture.py
Worker modes (called by the orchestrator; print JSON on stdout):
    /tmp/rules/venv/bin/python    pfedgraph_fixture.py --framework tf
    /tmp/rules/venv311/bin/python pfedgraph_fixture.py --framework torch
Environments: /tmp/rules/venv = py3.12 + tensorflow-cpu 2.21.0 + cvxpy 1.9.3 (+numpy);
              /tmp/rules/venv311 = py3.11 + torch 2.13.0+cpu + cvxpy 1.9.3.
"""
import json
import os
import subprocess
import sys

import numpy as np

import _mirror  # (this folder: the script's own)

MIRROR = "/work/.mirror/MediaBrain-SJTU+pFedGraph/repo"
COMMIT = "4f5f17c45d88745be642f834ffc60c1604f019f4"
REF = "/tmp/rules/ref"
OUT_JSON = "/tmp/rules/pfedgraph_fixture.json"
TF_PY = "/tmp/rules/venv/bin/python"
TORCH_PY = "/tmp/rules/venv311/bin/python"

N_CLIENTS = 4
SHAPES = [(3, 2), (2,)]
DATA_SIZES = [10, 20, 30, 40]
ALPHA = 0.8
LAM = 0.01
# scenario name -> (clients participating this round, in this order; difference_measure)
SCENARIOS = {
    "A_all_clients_measure_all": ([0, 1, 2, 3], "all"),
    "B_all_clients_measure_fc": ([0, 1, 2, 3], "fc"),
    "C_partial_2_0_3_measure_all": ([2, 0, 3], "all"),
}


# ----------------------------------------------------------------------------- inputs
def make_inputs():
    rs = np.random.RandomState(0)  # numpy seed 0 (legacy global-style generator)
    g = [rs.randn(*s).astype(np.float32) for s in SHAPES]  # "initial_global_parameters"
    upd = [[(0.5 * rs.randn(*s)).astype(np.float32) for s in SHAPES] for _ in range(N_CLIENTS)]
    # make client 1's update nearly parallel to client 0's so that cos > 0.9 (clip branch is hit)
    noise = [(0.05 * rs.randn(*s)).astype(np.float32) for s in SHAPES]
    upd[1] = [(1.02 * u0 + e).astype(np.float32) for u0, e in zip(upd[0], noise)]
    clients = [[(gk + uk).astype(np.float32) for gk, uk in zip(g, u)] for u in upd]
    graph0 = np.ones((N_CLIENTS, N_CLIENTS), np.float32) / (N_CLIENTS - 1)
    np.fill_diagonal(graph0, 0.0)
    return {
        "global": [x.tolist() for x in g],
        "clients": [[x.tolist() for x in c] for c in clients],
        "data_sizes": DATA_SIZES,
        "graph0": graph0.tolist(),
        "alpha": ALPHA,
        "lam": LAM,
        "shapes": [list(s) for s in SHAPES],
    }


def fed_avg_freqs(ids):
    tot = sum(DATA_SIZES[k] for k in ids)
    return {k: DATA_SIZES[k] / tot for k in ids}  # insertion order == participation order


def extract_ref():
    _mirror.extract(MIRROR, COMMIT, {f"{sub}/pfedgraph_cosine/{f}":
                                     os.path.join(REF, fw, "pfedgraph_cosine", f)
                                     for fw, sub in (("tf", "tensorflow"), ("torch", "pytorch"))
                                     for f in ("utils.py", "__init__.py")})


class SolverRecorder:
    """Wraps cvxpy.Problem.solve (without changing its arguments) to record which solver ran."""

    def __init__(self, cp, force=None):
        self.cp, self.force, self.names, self.status = cp, force, [], []
        self.orig = cp.Problem.solve

    def __enter__(self):
        rec = self

        def solve(prob, *a, **kw):
            if rec.force is not None:
                kw["solver"] = rec.force
            r = rec.orig(prob, *a, **kw)
            rec.names.append(prob.solver_stats.solver_name)
            rec.status.append(prob.status)
            return r

        self.cp.Problem.solve = solve
        return self

    def __exit__(self, *exc):
        self.cp.Problem.solve = self.orig


# ----------------------------------------------------------------------------- TF worker
def run_tf(inp):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    sys.path.insert(0, os.path.join(REF, "tf"))
    import cvxpy as cp
    import tensorflow as tf
    from pfedgraph_cosine import utils as U  # the authors' TF-port module, unmodified

    def make_net(ws):
        m = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
        m.set_weights([np.array(w, np.float32) for w in ws])  # trainable_variables = [kernel(3,2), bias(2)]
        return m

    glob = {i: tf.constant(np.array(w, np.float32)) for i, w in enumerate(inp["global"])}
    out = {"framework": "tensorflow " + tf.__version__, "cvxpy": cp.__version__, "scenarios": {}}
    for name, (ids, measure) in SCENARIOS.items():
        res = {}
        for force in (None, "OSQP", "CLARABEL"):
            nets = {k: make_net(inp["clients"][k]) for k in ids}
            dw = [{i: tf.zeros_like(v) for i, v in enumerate(make_net(inp["global"]).trainable_variables)}
                  for _ in range(N_CLIENTS)]
            graph = tf.constant(np.array(inp["graph0"], np.float32))
            freqs = fed_avg_freqs(ids)
            D = U.cal_model_cosine_difference(nets, glob, [dict(x) for x in dw], measure)
            with SolverRecorder(cp, force) as rec:
                G = U.update_graph_matrix_neighbor(graph, nets, glob, dw, freqs, inp["alpha"], measure)
            key = "default_solver" if force is None else "forced_" + force
            if force is not None:
                res[key] = {"graph_matrix": G.numpy().tolist(), "solver": rec.names}
                continue
            cvec = U.aggregation_by_graph({}, G, nets, glob)
            res[key] = {
                "difference_matrix": np.asarray(D).tolist(),
                "graph_matrix": G.numpy().tolist(),
                "solver": rec.names, "solver_status": rec.status,
                "aggregated": {str(k): [v.numpy().tolist() for v in nets[k].trainable_variables] for k in ids},
                "cluster_vectors": {str(k): cvec[k].numpy().tolist() for k in ids},
            }
        out["scenarios"][name] = res

    # local regulariser of the TF main script (tensorflow/pfedgraph_cosine.py L72-92), recomputed:
    # loss2 = lam * <c_i, flat(w)> / ||flat(w)||, at w = aggregated model of client 0, c = cluster vector of client 0
    sA = out["scenarios"]["A_all_clients_measure_all"]["default_solver"]
    w = tf.Variable(np.concatenate([np.ravel(np.array(x, np.float32)) for x in sA["aggregated"]["0"]]))
    c = tf.constant(np.array(sA["cluster_vectors"]["0"], np.float32))
    with tf.GradientTape() as tape:
        reg = inp["lam"] * tf.tensordot(c, w, axes=1) / tf.norm(w)
    out["regulariser_client0"] = {"value": float(reg.numpy()), "grad": tape.gradient(reg, w).numpy().tolist()}
    return out


# ----------------------------------------------------------------------------- torch worker
def run_torch(inp):
    sys.path.insert(0, os.path.join(REF, "torch"))
    import cvxpy as cp
    import torch
    from pfedgraph_cosine import utils as U  # the authors' PyTorch module, unmodified

    class Net(torch.nn.Module):
        def __init__(self, ws):
            super().__init__()
            self.fc = torch.nn.Module()  # names 'fc.weight' (3,2) and 'fc.bias' (2) -> both count as "fc"
            self.fc.weight = torch.nn.Parameter(torch.tensor(np.array(ws[0], np.float32)))
            self.fc.bias = torch.nn.Parameter(torch.tensor(np.array(ws[1], np.float32)))

    glob = Net(inp["global"]).state_dict()
    out = {"framework": "torch " + torch.__version__, "cvxpy": cp.__version__, "scenarios": {}}
    for name, (ids, measure) in SCENARIOS.items():
        res = {}
        for force in (None, "OSQP", "CLARABEL"):
            nets = {k: Net(inp["clients"][k]) for k in ids}
            dw = [{k: torch.zeros_like(v) for k, v in Net(inp["global"]).named_parameters()} for _ in range(N_CLIENTS)]
            graph = torch.tensor(np.array(inp["graph0"], np.float32))
            freqs = fed_avg_freqs(ids)
            D = U.cal_model_cosine_difference(nets, glob, [dict(x) for x in dw], measure)
            with SolverRecorder(cp, force) as rec:
                G = U.update_graph_matrix_neighbor(graph.clone(), nets, glob, dw, freqs, inp["alpha"], measure)
            key = "default_solver" if force is None else "forced_" + force
            if force is not None:
                res[key] = {"graph_matrix": G.numpy().tolist(), "solver": rec.names}
                continue
            with torch.no_grad():
                cvec = U.aggregation_by_graph({}, G, nets, glob)
            res[key] = {
                "difference_matrix": D.numpy().tolist(),
                "graph_matrix": G.numpy().tolist(),
                "solver": rec.names, "solver_status": rec.status,
                "aggregated": {str(k): [v.detach().numpy().tolist() for v in nets[k].state_dict().values()] for k in ids},
                "cluster_vectors": {str(k): cvec[k].detach().numpy().tolist() for k in ids},
            }
        out["scenarios"][name] = res

    # local regulariser of pytorch/pfedgraph_cosine.py L64-70, recomputed with autograd
    sA = out["scenarios"]["A_all_clients_measure_all"]["default_solver"]
    w = torch.tensor(np.concatenate([np.ravel(np.array(x, np.float32)) for x in sA["aggregated"]["0"]]), requires_grad=True)
    c = torch.tensor(np.array(sA["cluster_vectors"]["0"], np.float32))
    reg = inp["lam"] * torch.dot(c, w) / torch.linalg.norm(w)
    reg.backward()
    out["regulariser_client0"] = {"value": float(reg.item()), "grad": w.grad.numpy().tolist()}
    return out


# ----------------------------------------------------------------------------- numpy reference
def proj_simplex(v):
    """Euclidean projection onto {x >= 0, sum x = 1} (sort-based, exact)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    k = np.arange(1, len(v) + 1)
    rho = np.nonzero(u - (css - 1.0) / k > 0)[0][-1]
    theta = (css[rho] - 1.0) / (rho + 1.0)
    return np.maximum(v - theta, 0.0)


def numpy_reference(inp, fc_includes_bias):
    g = [np.array(x, np.float64) for x in inp["global"]]
    cl = [[np.array(x, np.float64) for x in c] for c in inp["clients"]]
    out = {}
    for name, (ids, measure) in SCENARIOS.items():
        def vec(k):  # flattened update dw_k = w_k - w_global (over the selected tensors)
            parts = [(cl[k][t] - g[t]).ravel() for t in range(len(SHAPES))
                     if measure == "all" or (len(SHAPES[t]) == 2 or fc_includes_bias)]
            return np.concatenate(parts)
        n = len(ids)
        D = np.zeros((n, n))
        for a in range(n):
            for b in range(n):
                x, y = vec(ids[a]), vec(ids[b])
                nx, ny = np.linalg.norm(x), np.linalg.norm(y)
                cos = 0.0 if nx == 0 or ny == 0 else x @ y / (nx * ny)
                D[a, b] = -1.0 if -cos < -0.9 else -cos
        p = np.array([fed_avg_freqs(ids)[k] for k in ids])
        G = np.array(inp["graph0"], np.float64)
        for a in range(n):
            row = proj_simplex(p - D[a] / (2 * inp["alpha"]))  # argmin a||x||^2 + (d-2ap)^T x on simplex
            G[ids[a], ids] = row
        flat = {k: np.concatenate([x.ravel() for x in cl[k]]) for k in ids}
        agg = {str(i): [sum(G[i, j] * cl[j][t] for j in ids).tolist() for t in range(len(SHAPES))] for i in ids}
        cvec = {str(i): sum(G[i, j] * flat[j] / np.linalg.norm(flat[j]) for j in ids).tolist() for i in ids}
        out[name] = {"difference_matrix": D.tolist(), "graph_matrix": G.tolist(),
                     "aggregated": agg, "cluster_vectors": cvec}
    sA = out["A_all_clients_measure_all"]
    w = np.concatenate([np.ravel(np.array(x)) for x in sA["aggregated"]["0"]])
    c = np.array(sA["cluster_vectors"]["0"])
    nw = np.linalg.norm(w)
    reg = {"value": LAM * c @ w / nw, "grad": (LAM * (c / nw - (c @ w) * w / nw ** 3)).tolist()}
    return out, reg


def maxdiff(a, b):
    if isinstance(a, dict):
        return max(maxdiff(a[k], b[k]) for k in a)
    if isinstance(a, list) and a and isinstance(a[0], (list, dict)) and not isinstance(a[0], (int, float)):
        try:
            return float(np.max(np.abs(np.array(a, np.float64) - np.array(b, np.float64))))
        except ValueError:
            return max(maxdiff(x, y) for x, y in zip(a, b))
    return float(np.max(np.abs(np.array(a, np.float64) - np.array(b, np.float64))))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--framework":
        inp = make_inputs()
        res = run_tf(inp) if sys.argv[2] == "tf" else run_torch(inp)
        sys.stdout.write("@@JSON@@" + json.dumps(res))
        return
    extract_ref()
    inp = make_inputs()
    me = os.path.abspath(__file__)
    outs = {}
    for fw, py in (("tf", TF_PY), ("torch", TORCH_PY)):
        r = subprocess.run([py, me, "--framework", fw], capture_output=True, text=True,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""))
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            raise SystemExit(f"{fw} worker failed")
        outs[fw] = json.loads(r.stdout.split("@@JSON@@", 1)[1])
    ref_tf, reg_ref = numpy_reference(inp, fc_includes_bias=False)  # TF port: "fc" = rank-2 tensors only
    ref_pt, _ = numpy_reference(inp, fc_includes_bias=True)        # PyTorch: "fc" = every key containing 'fc'
    keys = ("difference_matrix", "graph_matrix", "aggregated", "cluster_vectors")
    cmp = {}
    for name in SCENARIOS:
        t = outs["tf"]["scenarios"][name]["default_solver"]
        p = outs["torch"]["scenarios"][name]["default_solver"]
        cmp[name] = {
            "tf_vs_torch": {k: maxdiff(t[k], p[k]) for k in keys},
            "tf_vs_numpy_ref(fc=rank2)": {k: maxdiff(ref_tf[name][k], t[k]) for k in keys},
            "torch_vs_numpy_ref(fc=all 'fc' keys)": {k: maxdiff(ref_pt[name][k], p[k]) for k in keys},
            "solver_spread_tf(default vs OSQP vs CLARABEL)": max(
                maxdiff(t["graph_matrix"], outs["tf"]["scenarios"][name][f]["graph_matrix"])
                for f in ("forced_OSQP", "forced_CLARABEL")),
            "solver_spread_torch": max(
                maxdiff(p["graph_matrix"], outs["torch"]["scenarios"][name][f]["graph_matrix"])
                for f in ("forced_OSQP", "forced_CLARABEL")),
        }
    cmp["regulariser_client0"] = {
        "tf_vs_torch": maxdiff([outs["tf"]["regulariser_client0"]["value"]] + outs["tf"]["regulariser_client0"]["grad"],
                               [outs["torch"]["regulariser_client0"]["value"]] + outs["torch"]["regulariser_client0"]["grad"]),
        "tf_vs_numpy": maxdiff([outs["tf"]["regulariser_client0"]["value"]] + outs["tf"]["regulariser_client0"]["grad"],
                               [reg_ref["value"]] + reg_ref["grad"]),
    }
    doc = {
        "source": {"repo": "MediaBrain-SJTU/pFedGraph", "commit": COMMIT,
                   "tf_module": "tensorflow/pfedgraph_cosine/utils.py", "torch_module": "pytorch/pfedgraph_cosine/utils.py"},
        "notes": [
            "inputs.clients[k] = local model of client k AFTER local training (list of tensors [kernel(3,2), bias(2)]);",
            "inputs.global = initial_global_parameters (the fixed round-0 init, never updated in the authors' code);",
            "difference_matrix is indexed by position in the participation list (scenario clients order), "
            "graph_matrix by client id (N x N, rows/cols of absent clients keep graph0);",
            "aggregated[k] = personalised model written into client k; cluster_vectors[k] = sum_j A_kj w_j/||w_j|| (flattened);",
            "regulariser_client0 = lam*<c_0, w>/||w|| and its gradient at w = aggregated model of client 0 (scenario A);",
            "scenario B ('fc'): the TF port uses only rank-2 tensors (kernel), PyTorch all keys containing 'fc' "
            "(kernel+bias here), so B legitimately differs between frameworks.",
        ],
        "inputs": inp,
        "scenarios": {name: {"participants": ids, "difference_measure": m} for name, (ids, m) in SCENARIOS.items()},
        "fed_avg_freqs": {name: [fed_avg_freqs(ids)[k] for k in ids] for name, (ids, _) in SCENARIOS.items()},
        "outputs": {"tensorflow_port": outs["tf"], "pytorch_original": outs["torch"],
                    "numpy_reference_fc_rank2": ref_tf, "numpy_reference_fc_all_fc_keys": ref_pt,
                    "numpy_reference_regulariser_client0": reg_ref},
        "comparison_max_abs_diff": cmp,
    }
    with open(OUT_JSON, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(json.dumps(cmp, indent=1))
    print("wrote", OUT_JSON)


if __name__ == "__main__":
    main()
